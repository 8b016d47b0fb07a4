use super::answer::{advertise_retention, mark_not_recorded, recorded_headers, replay, Answer};
use super::config::Config;
use super::future::ResponseFuture;
use super::run_claimed::RunClaimed;
use super::warn_once;
use crate::body::{BoxError, ResponseBody};
use crate::buffer::buffer_body;
use crate::downstream::DownstreamKeys;
use crate::engine::claim::{open_transaction, run_to_completion, ClaimGuard, NotOpened};
use crate::engine::decide::{decide, Decision};
use crate::engine::in_flight::Running;
use crate::engine::keep_alive::kept_alive;
use crate::engine::record::{self, OneOrMany, Read, RecordCopy, Rest};
use crate::engine::{Attempt, Phases};
use crate::policy::RecordPolicy;
use crate::response::Refusal;
use crate::scope::ScopeExtractor;
use crate::store::erased::{ErasedTransaction, ErasedTransactionalStore};
use crate::store::{Completion, FencingToken, RecordKey, StoredResponse};
use crate::telemetry::{self, Outcome};
use crate::{fingerprint::RequestFingerprint, IdempotencyKey};
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body::Body;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;
use tracing::Instrument;

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
        let span = tracing::debug_span!(
            "idempotency",
            method = %req.method(),
            scope = tracing::field::Empty,
            key_hash = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // Taken apart here: a whole request moved into the future would be
        // kept there beside its parts.
        let (parts, body) = req.into_parts();
        let future = telemetry::observed(
            "idempotency",
            handle(self.config.clone(), ready, parts, body),
        );
        ResponseFuture::decided(Box::pin(future.instrument(span)))
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
) -> impl Future<Output = (Result<Answer<ResBody>, S::Error>, Outcome)>
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
            warn_once::no_scope(&config.warned, parts.uri.path());
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
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let record = RecordKey::new(scope, key);
        // Computed by the store only as far as it needs: a replay of the same bytes
        // never canonicalises the body.
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

        let (claim, opened) = match decide(
            store,
            config.store.transactions(),
            &record,
            &fingerprint,
            config.wait_timeout,
        )
        .await
        {
            Decision::Claimed(claim, opened) => (claim, opened),
            Decision::Replay(stored) => {
                let answer = replay(&stored, config.retention_header.as_ref());
                return (Ok(answer), Outcome::Replayed);
            }
            Decision::Mismatch => return refuse(Refusal::KeyReuse),
            Decision::Unavailable => return refuse(Refusal::ResponseUnavailable),
            Decision::InProgress => return refuse(Refusal::InProgress),
            Decision::QuotaExceeded => return refuse(Refusal::QuotaExceeded),
            Decision::StoreFailed(_) => return refuse(Refusal::StoreUnavailable),
        };

        drop(fingerprint); // it borrows `parts`
        let token = claim.token;
        let admitted = match config.max_in_flight {
            None => Some(config.in_flight.enter()),
            Some(max) => config.in_flight.try_enter(max.get()),
        };
        let Some(running) = admitted else {
            // Shed before the handler: its claim (and transaction) go back at once.
            if let Some(transaction) = opened {
                transaction.rollback().await;
            }
            ClaimGuard::new(store.clone(), record, token)
                .release()
                .await;
            return refuse(Refusal::Overloaded);
        };
        // The same in plain and transactional mode, on every attempt of the key.
        parts.extensions.insert(DownstreamKeys::derived(
            record.scope(),
            record.key(),
            config.downstream_secret.as_ref(),
        ));
        // Whether this run took over one that never finished, and whose.
        parts.extensions.insert(Attempt::from(claim));
        let secret = config.downstream_secret.as_ref();
        Phases::share(&config.store, &record, token, secret, &mut parts.extensions);
        let claimed = claimed_handler(
            config.clone(),
            inner,
            parts,
            bytes,
            (record, token, opened),
            running,
        );
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

/// The claimed handler, its recording and (plain mode) its heartbeat, on the
/// heap: built by a plain function, so that neither its state nor a copy of
/// it sizes the decision's future, and ready to move into a task. Each mode is
/// its own box, so the plain mode's ([`RunClaimed`]) stays small enough for
/// the allocator's fast path.
#[allow(clippy::type_complexity)]
fn claimed_handler<S, E, P, ReqBody, ResBody>(
    config: Arc<Config<E, P>>,
    inner: S,
    parts: http::request::Parts,
    bytes: Bytes,
    (record, token, opened): (RecordKey, FencingToken, Option<Box<dyn ErasedTransaction>>),
    running: Running,
) -> Pin<Box<dyn Future<Output = (Result<Answer<ResBody>, S::Error>, Outcome)> + Send>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    E: ScopeExtractor,
    P: RecordPolicy,
    ReqBody: From<Bytes> + Send + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    let span = tracing::Span::current();
    match config.store.transactions().cloned() {
        // The transaction's row lock keeps the claim: no heartbeat.
        Some(transactions) => {
            let claim = (record, token, opened);
            let claimed =
                run_in_transaction(config, transactions, inner, parts, bytes, claim, running);
            Box::pin(claimed.instrument(span))
        }
        None => {
            let (store, heartbeat_key) = (config.store.store().clone(), record.clone());
            // The guard holds the record key until the claim is kept or released.
            let claim = ClaimGuard::new(store.clone(), record, token);
            let claimed = RunClaimed::new(config, inner, (parts, bytes), claim, running);
            Box::pin(kept_alive(claimed, store, heartbeat_key, token).instrument(span))
        }
    }
}

/// Runs the inner service for a claimed key inside the store's transaction,
/// and records its response in the same transaction; counted as running
/// until it returns. Not an `async fn`, for the reason given at [`handle`].
#[allow(clippy::manual_async_fn)]
fn run_in_transaction<S, E, P, ReqBody, ResBody>(
    config: Arc<Config<E, P>>,
    transactions: Arc<dyn ErasedTransactionalStore>,
    mut inner: S,
    mut parts: http::request::Parts,
    bytes: Bytes,
    (record, token, opened): (RecordKey, FencingToken, Option<Box<dyn ErasedTransaction>>),
    running: Running,
) -> impl Future<Output = (Result<Answer<ResBody>, S::Error>, Outcome)>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    P: RecordPolicy,
    ReqBody: From<Bytes>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    async move {
        // Moved in, so that it is counted until this future completes.
        let _running = running;
        let refuse =
            |refusal: Refusal| (Ok(config.options.responder.refuse(refusal)), refusal.into());
        let claim = ClaimGuard::new(config.store.store().clone(), record, token);
        let (claim, transaction) =
            match open_transaction(&*transactions, claim, token, opened).await {
                Ok(opened) => opened,
                // Taken over before the handler ran: the new owner runs it.
                Err(NotOpened::TakenOver) => return refuse(Refusal::InProgress),
                Err(NotOpened::Failed(_)) => return refuse(Refusal::StoreUnavailable),
            };
        transaction.share(&mut parts.extensions);
        let uri = parts.uri.clone();
        // Until the commit, nothing the handler wrote exists for anyone else: every
        // path that does not record rolls it back and frees the key, and so does a
        // panic or a dropped future (the transaction and the guard are dropped).
        let response = match inner
            .call(Request::from_parts(parts, ReqBody::from(bytes)))
            .await
        {
            Ok(response) => response,
            Err(error) => {
                transaction.rollback().await;
                claim.release().await;
                return (Err(error), Outcome::Released);
            }
        };
        let (mut res_parts, res_body) = response.into_parts();
        if !config.policy.should_record(&res_parts) {
            warn_once::not_recorded(&config.warned, res_parts.status, uri.path());
            mark_not_recorded(&mut res_parts);
            transaction.rollback().await;
            claim.release().await;
            let response = Response::from_parts(res_parts, ResponseBody::inner(res_body));
            return (Ok(response), Outcome::Released);
        }
        // Read whole before the commit (nothing the handler wrote is visible
        // before it), up to the record limit.
        let mut body = record::pinned(res_body);
        let (mut copy, mut frames) = (RecordCopy::new(config.record_limit), OneOrMany::default());
        match record::read_to_end(&mut body, &mut copy, &mut frames).await {
            Read::Failed(error) => {
                transaction.rollback().await;
                claim.release().await;
                let response = Response::from_parts(res_parts, ResponseBody::failed(error));
                return (Ok(response), Outcome::Released);
            }
            Read::Ended if !copy.has_trailers() => {}
            // Too large to record, or ended with trailers (which a record cannot
            // carry): the writes commit, marked as not replayable, and the body
            // goes on to the caller, trailers and all.
            end => {
                if let Err(error) = transaction.commit(Completion::Unavailable).await {
                    tracing::warn!(%error, "the handler's transaction did not commit");
                    claim.release().await;
                    return refuse(Refusal::OutcomeUnknown);
                }
                let _ = claim.keep();
                // The key is kept as long as a recorded one (retries get `410`).
                advertise_retention(&mut res_parts, config.retention_header.as_ref());
                let rest = Rest {
                    body,
                    copy,
                    read: frames,
                    recorder: None,
                };
                let body = match end {
                    Read::Ended => record::answer(rest.read),
                    _ => match record::spawn_rest(rest, config.in_flight.enter()) {
                        Ok(frames) => ResponseBody::streamed(frames),
                        Err(rest) => record::finish_here(*rest).await.0,
                    },
                };
                return (
                    Ok(Response::from_parts(res_parts, body)),
                    Outcome::Unavailable,
                );
            }
        }
        let body = copy.into_bytes();
        let stored = StoredResponse {
            status: res_parts.status,
            headers: recorded_headers(&config.replayed_headers, &res_parts),
            body: body.clone(),
        };
        match transaction.commit(Completion::Response(stored)).await {
            Ok(()) => {
                let _ = claim.keep();
                advertise_retention(&mut res_parts, config.retention_header.as_ref());
                let response = Response::from_parts(res_parts, ResponseBody::full(body));
                (Ok(response), Outcome::Claimed)
            }
            // Rolled back (or, if the connection died during COMMIT, unknown: then
            // the record committed with the writes, and the release is refused).
            // The handler ran either way: never "not processed".
            Err(error) => {
                tracing::warn!(%error, "the handler's transaction did not commit");
                claim.release().await;
                refuse(Refusal::OutcomeUnknown)
            }
        }
    }
}
