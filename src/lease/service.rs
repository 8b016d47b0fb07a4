use super::config::LeaseConfig;
use super::future::ResponseFuture;
use super::handle::Lease;
use super::key::JobKeyExtractor;
use super::outcome::JobOutcome;
use crate::body::{BoxError, ResponseBody};
use crate::buffer::buffer_body;
use crate::lease::store::{BudgetPeriod, BudgetReset};
use crate::lease::store::{Job, StartJob, StartOutcome};
use crate::response::{json_response, Refusal, Responder};
use crate::scope::ScopeExtractor;
use crate::telemetry;
use crate::warn_once;
use bytes::Bytes;
use http::header::{HeaderValue, LOCATION};
use http::{Request, Response, StatusCode};
use http_body::Body;
use serde_json::json;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Middleware that starts at most one live job per natural key. Built by
/// [`LeaseLayer`](crate::LeaseLayer).
pub struct LeaseService<S, K, E> {
    inner: S,
    config: Arc<LeaseConfig<K, E>>,
}

impl<S, K, E> LeaseService<S, K, E> {
    pub(crate) fn new(inner: S, config: Arc<LeaseConfig<K, E>>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the wrapped service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, E> Clone for LeaseService<S, K, E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: std::fmt::Debug, K, E> std::fmt::Debug for LeaseService<S, K, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, K, E, ReqBody, ResBody> Service<Request<ReqBody>> for LeaseService<S, K, E>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    K: JobKeyExtractor,
    E: ScopeExtractor,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if !self.config.options.methods.contains(req.method()) {
            return ResponseFuture::passthrough(self.inner.call(req));
        }
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let span = telemetry::request_span(|| {
            tracing::debug_span!(
                "lease",
                scope = tracing::field::Empty,
                key_hash = tracing::field::Empty,
                job_id = tracing::field::Empty,
                outcome = tracing::field::Empty,
            )
        });
        let future = telemetry::observed("lease", start(self.config.clone(), ready, req));
        ResponseFuture::decided(telemetry::boxed_in_span(future, span))
    }
}

type Reply<B> = Response<ResponseBody<B>>;

async fn start<S, K, E, ReqBody, ResBody>(
    config: Arc<LeaseConfig<K, E>>,
    mut inner: S,
    req: Request<ReqBody>,
) -> (Result<Reply<ResBody>, S::Error>, JobOutcome)
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    K: JobKeyExtractor,
    E: ScopeExtractor,
    ReqBody: Body + From<Bytes>,
    ReqBody::Error: Into<BoxError>,
{
    let refuse = |refusal: Refusal| (Ok(config.options.responder.refuse(refusal)), refusal.into());
    let (mut parts, body) = req.into_parts();
    let Some(scope) = config.scope.extract(&parts) else {
        warn_once::no_scope(&config.settings.options.warned, "lease", parts.uri.path());
        return refuse(Refusal::Unauthorized);
    };
    let bytes = match buffer_body(
        body,
        &parts.headers,
        config.options.body_limit,
        config.options.body_timeout,
    )
    .await
    {
        Ok(bytes) => bytes,
        Err(refusal) => return refuse(refusal),
    };
    let key = match config.key.job_key(&scope, &parts, &bytes) {
        Ok(key) => key,
        Err(rejection) => {
            let responder = &config.options.responder;
            let answer = responder.error(rejection.status, &rejection.code, &rejection.message);
            return (Ok(answer), JobOutcome::Rejected);
        }
    };
    // Tenant, kind and key travel as separate fields: tenants never share a job.
    telemetry::identify(scope.as_str(), &key);
    let cost = config
        .cost
        .as_ref()
        .map_or(1, |cost| cost.cost(&scope, &parts, &bytes));
    let request = StartJob {
        tenant: scope.as_str(),
        kind: &config.kind,
        key: &key,
        owner: &config.owner,
        budget: config.budget,
        cost,
    };
    let (job, grant, stolen) = match config.store.start(&request).await {
        Ok(StartOutcome::Created(job, grant)) => (job, grant, false),
        Ok(StartOutcome::Stolen(job, grant)) => (job, grant, true),
        Ok(StartOutcome::Joined(job)) => {
            let body = json!({ "job_id": job.id, "status": job.status.as_str(), "join": true });
            let answer = job_answer(&config, StatusCode::OK, &job, &body);
            return (Ok(answer), JobOutcome::Joined);
        }
        Ok(StartOutcome::Completed(job)) => {
            let body = json!({
                "job_id": job.id,
                "status": job.status.as_str(),
                "artifact_id": job.artifact_id,
            });
            let answer = job_answer(&config, StatusCode::OK, &job, &body);
            return (Ok(answer), JobOutcome::Completed);
        }
        Ok(StartOutcome::BudgetExhausted(reset)) => {
            let period = config.budget.map(|budget| budget.period);
            let answer = budget_exhausted(&config.options.responder, &reset, period);
            return (Ok(answer), JobOutcome::BudgetExhausted);
        }
        Err(_) => return refuse(Refusal::JobStoreUnavailable),
    };

    tracing::Span::current().record("job_id", job.id.as_str());
    let lease = Lease::on(config.store.clone(), grant);
    parts.extensions.insert(lease.clone());
    let guard = FailOnPanic(Some(lease.clone()));
    let result = inner
        .call(Request::from_parts(parts, ReqBody::from(bytes)))
        .await;
    guard.disarm();
    match result {
        Ok(response) if response.status().is_success() => {
            let mut body = json!({ "job_id": job.id, "status": job.status.as_str() });
            body[if stolen { "stolen" } else { "created" }] = true.into();
            let answer = job_answer(&config, config.started_status.into(), &job, &body);
            let outcome = if stolen {
                JobOutcome::Stolen
            } else {
                JobOutcome::Created
            };
            (Ok(answer), outcome)
        }
        Ok(response) => {
            // The handler refused to start the work: end the job so it cannot block.
            let _ = lease.fail("start_rejected").await;
            (
                Ok(response.map(ResponseBody::inner)),
                JobOutcome::StartFailed,
            )
        }
        Err(error) => {
            let _ = lease.fail("start_failed").await;
            (Err(error), JobOutcome::StartFailed)
        }
    }
}

fn job_answer<B, K, E>(
    config: &LeaseConfig<K, E>,
    status: StatusCode,
    job: &Job,
    body: &serde_json::Value,
) -> Response<ResponseBody<B>> {
    let mut response = json_response(status, "application/json", body);
    let location = format!("{}{}", config.location_prefix, job.id);
    if let Ok(location) = HeaderValue::try_from(location) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
}

/// Fails the job if the start handler panics, so it reaches an ending at once.
/// A handler dropped for other reasons (client gone) leaves the job to its
/// lease: the work it started may still be running.
struct FailOnPanic(Option<Lease>);

impl FailOnPanic {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for FailOnPanic {
    fn drop(&mut self) {
        let Some(lease) = self.0.take() else { return };
        if !std::thread::panicking() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = lease.fail("start_panicked").await;
            });
        }
    }
}

/// `429 budget_exhausted`, its `Retry-After` and body saying when the budget
/// resets: exactly (`resets_at`, `retry_after` seconds) and in words a client
/// can show (`retry`: `tomorrow` or `next_month`).
fn budget_exhausted<B>(
    responder: &Responder,
    reset: &BudgetReset,
    period: Option<BudgetPeriod>,
) -> Response<ResponseBody<B>> {
    let seconds = (reset.after.as_secs() + u64::from(reset.after.subsec_nanos() > 0)).max(1);
    let mut extra = serde_json::Map::new();
    if let Some(period) = period {
        let when = match period {
            BudgetPeriod::Day => "tomorrow",
            BudgetPeriod::Month => "next_month",
        };
        extra.insert("retry".into(), when.into());
    }
    extra.insert("resets_at".into(), reset.at.clone().into());
    extra.insert("retry_after".into(), seconds.into());
    responder.refuse_with(
        Refusal::BudgetExhausted,
        Some(std::time::Duration::from_secs(seconds)),
        extra,
    )
}
