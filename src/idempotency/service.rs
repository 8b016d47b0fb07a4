use super::answer::{replay, Reply};
use super::config::Config;
use super::future::ResponseFuture;
use super::run_claimed::Handler;
use crate::body::{BoxError, ResponseBody};
use crate::buffer::buffer_body;
use crate::downstream::DownstreamKeys;
use crate::policy::RecordPolicy;
use crate::response::Refusal;
use crate::run::claim::run_to_completion;
use crate::run::claimed::Claimed;
use crate::run::decide::{decide, Decision};
use crate::scope::ScopeExtractor;
use crate::store::RecordKey;
use crate::telemetry::{self, Outcome};
use crate::warn_once;
use crate::{fingerprint::RequestFingerprint, IdempotencyKey};
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body::Body;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;

/// Middleware that runs each `(scope, Idempotency-Key)` at most once and replays
/// its recorded response to retries. Built by [`IdempotencyLayer`](crate::IdempotencyLayer).
pub struct IdempotencyService<S, E, P> {
    inner: S,
    config: Arc<Config<E, P>>,
}

impl<S, E, P> IdempotencyService<S, E, P> {
    pub(crate) fn new(inner: S, config: Arc<Config<E, P>>) -> Self {
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

impl<S: Clone, E, P> Clone for IdempotencyService<S, E, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: std::fmt::Debug, E, P> std::fmt::Debug for IdempotencyService<S, E, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, E, P, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S, E, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    E: ScopeExtractor,
    P: RecordPolicy,
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
        // The clone is not ready; keep it and run the instance that was polled ready.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        let span = telemetry::request_span(|| {
            tracing::debug_span!(
                "idempotency",
                method = %req.method(),
                scope = tracing::field::Empty,
                key_hash = tracing::field::Empty,
                outcome = tracing::field::Empty,
            )
        });
        // Taken apart here: a whole request moved into the future would be
        // kept there beside its parts.
        let (parts, body) = req.into_parts();
        let future = telemetry::observed(
            "idempotency",
            handle(self.config.clone(), ready, parts, body),
        );
        ResponseFuture::decided(telemetry::boxed_in_span(future, span))
    }
}

/// Decides a request and answers it. A plain function returning an async
/// block, as the others here: an `async fn` keeps a second copy of each
/// argument in its future, and this one is allocated for every request.
#[allow(clippy::manual_async_fn)]
fn handle<S, E, P, ReqBody, ResBody>(
    config: Arc<Config<E, P>>,
    inner: S,
    mut parts: http::request::Parts,
    body: ReqBody,
) -> impl Future<Output = (Result<Reply<ResBody>, S::Error>, Outcome)>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    E: ScopeExtractor,
    P: RecordPolicy,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    async move {
        let refuse =
            |refusal: Refusal| (Ok(config.options.responder.refuse(refusal)), refusal.into());

        // Authentication comes first, so an anonymous caller learns nothing about keys.
        let Some(scope) = config.scope.extract(&parts) else {
            warn_once::no_scope(&config.options.warned, "idempotency", parts.uri.path());
            return refuse(Refusal::Unauthorized);
        };
        let key = match IdempotencyKey::from_headers(parts.headers.get_all(&config.header)) {
            Ok(key) => key,
            Err(problem) => return refuse(problem.into()),
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
        let record = RecordKey::new(scope, key);
        // The fingerprint lives in this block only, so that the states after
        // the decision do not keep room for it in every request's future.
        let decision = {
            let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
            // Computed by the store only as far as it needs: a replay of the same
            // bytes never canonicalises the body.
            let fingerprint = RequestFingerprint::new(
                &parts.method,
                path_and_query,
                record.key(),
                record.scope().as_str(),
                parts.headers.get(CONTENT_TYPE),
                &bytes,
            );
            telemetry::identify(record.scope().as_str(), record.key().as_str());
            let store = config.store.store();
            decide(
                store,
                config.store.transactions(),
                &record,
                &fingerprint,
                config.wait_timeout,
            )
            .await
        };
        let claimed = match decision {
            Decision::Claimed(claim, opened) => Claimed::new(record, claim, opened),
            Decision::Replay(stored) => {
                let answer = replay(&stored, config.retention_header.as_ref());
                return (Ok(answer), Outcome::Replayed);
            }
            Decision::KeyReused => return refuse(Refusal::KeyReused),
            Decision::Unavailable => return refuse(Refusal::ResponseUnavailable),
            Decision::Expired => return refuse(Refusal::KeyExpired),
            Decision::InProgress => return refuse(Refusal::InProgress),
            Decision::QuotaExceeded => return refuse(Refusal::QuotaExceeded),
            Decision::StoreFailed(_) => return refuse(Refusal::StoreUnavailable),
        };
        let admitted = match config.max_in_flight {
            None => Some(config.in_flight.enter()),
            Some(max) => config.in_flight.try_enter(max.get()),
        };
        let Some(running) = admitted else {
            // Shed before the handler: its claim (and transaction) go back at once.
            claimed.shed(&config.store).await;
            return refuse(Refusal::Overloaded);
        };
        // The same in plain and transactional mode, on every attempt of the key.
        let record = claimed.record();
        parts.extensions.insert(DownstreamKeys::derived(
            record.scope(),
            record.key(),
            config.downstream_secret.as_ref(),
        ));
        // Whether this run took over one that never finished, and whose.
        parts.extensions.insert(claimed.attempt());
        let secret = config.downstream_secret.as_ref();
        claimed.share_phases(&config.store, secret, &mut parts.extensions);
        let handler = Handler {
            config: config.clone(),
            inner,
            parts,
            bytes,
            body: std::marker::PhantomData,
        };
        let claimed = claimed.run(&config.store, running, handler);
        if config.cancel_on_drop {
            return claimed.await;
        }
        // From here the handler's effects may begin: it runs to completion whether
        // or not this caller is still there to hear the answer.
        match run_to_completion(claimed).await {
            Ok(answer) => answer,
            // It panicked (its claim guard released the key while unwinding), or the
            // runtime is shutting down.
            Err(_) => refuse(Refusal::HandlerFailed),
        }
    }
}
