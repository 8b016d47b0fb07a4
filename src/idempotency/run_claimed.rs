//! The HTTP door's claimed work: the inner service called, its response
//! recorded (plain mode: as it streams to the caller; transactional mode:
//! read whole, then committed), written out as a future.
//!
//! An `async fn` keeps every argument and every value that lives across two
//! awaits in a slot of its own for its whole life; for this one (the request's
//! parts, the inner call's future, the response's parts, the recorder, the
//! body's copy) that came to more than 2 KiB, which the allocator serves from
//! its slow path on every fresh key. Written out, the call is polled in place
//! and only what follows the response (recording it, or releasing the claim)
//! is boxed on its own, both small.

use super::answer::{advertise_retention, mark_not_recorded, recorded_headers, Reply};
use super::config::Config;
use super::record::{self, OneOrMany, Read, RecordCopy, Recording, Rest};
use crate::body::{BoxError, ResponseBody};
use crate::policy::RecordPolicy;
use crate::response::Refusal;
use crate::run::claimed::{Finish, NotRun, Recorded, Work};
use crate::store::StoredResponse;
use crate::telemetry::Outcome;
use crate::warn_once;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower_service::Service;

type Answered<B, Error> = (Result<Reply<B>, Error>, Outcome);
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A claimed request, to run as [`Work`] of the core.
pub(crate) struct Handler<S, ReqBody, E, P> {
    pub(crate) config: Arc<Config<E, P>>,
    pub(crate) inner: S,
    pub(crate) parts: http::request::Parts,
    pub(crate) bytes: Bytes,
    pub(crate) body: PhantomData<fn() -> ReqBody>,
}

impl<S, E, P, ReqBody, ResBody> Work for Handler<S, ReqBody, E, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    E: Send + Sync + 'static,
    P: RecordPolicy,
    ReqBody: From<Bytes> + Send + 'static,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    type Output = Answered<ResBody, S::Error>;

    fn start(self, finish: Finish) -> impl Future<Output = Self::Output> + Send + 'static {
        let Self {
            config,
            inner,
            mut parts,
            bytes,
            ..
        } = self;
        finish.share(&mut parts.extensions);
        RunClaimed::new(config, inner, (parts, bytes), finish)
    }

    fn not_run(self, why: NotRun) -> Self::Output {
        let refusal = match why {
            // The new owner runs it.
            NotRun::TakenOver => Refusal::InProgress,
            NotRun::Failed(_) => Refusal::StoreUnavailable,
        };
        refuse(&self.config, refusal)
    }
}

fn refuse<B, Error, E, P>(config: &Config<E, P>, refusal: Refusal) -> Answered<B, Error> {
    (Ok(config.options.responder.refuse(refusal)), refusal.into())
}

pin_project! {
    /// Runs the inner service for a claimed key and records its response.
    /// Dropped before the response (cancel-on-drop, a runtime shutting
    /// down), its unspent [`Finish`] releases the key; dropped after it, the
    /// claim is kept until its lock expires.
    pub(crate) struct RunClaimed<S, ReqBody, F, Out, E, P> {
        #[pin]
        stage: Stage<S, ReqBody, F, Out>,
        config: Arc<Config<E, P>>,
        // Holds the claim until the response says what becomes of it.
        claim: Option<Finish>,
    }
}

pin_project! {
    #[project = StageProjection]
    enum Stage<S, ReqBody, F, Out> {
        // Called at the first poll, where a panic of the handler (or of
        // building its request) is caught.
        NotCalled {
            inner: S,
            request: Option<(http::request::Parts, Bytes)>,
            body: PhantomData<fn() -> ReqBody>,
        },
        // The request's URI, for the warning about a response not recorded.
        Calling { #[pin] call: F, uri: http::Uri },
        // Recording the response, or releasing the claim.
        Finishing { rest: Boxed<Out> },
        Done,
    }
}

impl<S, ReqBody, ResBody, E, P> RunClaimed<S, ReqBody, S::Future, Answered<ResBody, S::Error>, E, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    pub(crate) fn new(
        config: Arc<Config<E, P>>,
        inner: S,
        request: (http::request::Parts, Bytes),
        claim: Finish,
    ) -> Self {
        Self {
            stage: Stage::NotCalled {
                inner,
                request: Some(request),
                body: PhantomData,
            },
            config,
            claim: Some(claim),
        }
    }
}

impl<S, ReqBody, ResBody, E, P> Future
    for RunClaimed<S, ReqBody, S::Future, Answered<ResBody, S::Error>, E, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Send + 'static,
    E: Send + Sync + 'static,
    P: RecordPolicy,
    ReqBody: From<Bytes>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    type Output = Answered<ResBody, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.stage.as_mut().project() {
                StageProjection::NotCalled { inner, request, .. } => {
                    let (parts, bytes) = request.take().expect("called once");
                    // A reference count, not a copy of the path.
                    let uri = parts.uri.clone();
                    let call = inner.call(Request::from_parts(parts, ReqBody::from(bytes)));
                    this.stage.set(Stage::Calling { call, uri });
                }
                StageProjection::Calling { call, uri } => {
                    let result = ready!(call.poll(cx));
                    let claim = this.claim.take().expect("held until the response");
                    match after_response(this.config, claim, result, uri.path(), cx) {
                        Next::Reply(answer) => {
                            this.stage.set(Stage::Done);
                            return Poll::Ready(answer);
                        }
                        Next::Finish(rest) => this.stage.set(Stage::Finishing { rest }),
                    }
                }
                StageProjection::Finishing { rest } => {
                    let answer = ready!(rest.as_mut().poll(cx));
                    this.stage.set(Stage::Done);
                    return Poll::Ready(answer);
                }
                StageProjection::Done => panic!("`RunClaimed` polled after it completed"),
            }
        }
    }
}

enum Next<T> {
    Reply(T),
    Finish(Boxed<T>),
}

/// What the handler's response leads to: released (an error, a status the
/// policy does not record), recorded whole, or streamed to the caller with
/// the record following (plain mode).
fn after_response<ResBody, Error, E, P>(
    config: &Arc<Config<E, P>>,
    claim: Finish,
    result: Result<Response<ResBody>, Error>,
    path: &str,
    cx: &mut Context<'_>,
) -> Next<Answered<ResBody, Error>>
where
    Error: Send + 'static,
    E: Send + Sync + 'static,
    P: RecordPolicy,
    ResBody: Body + Send + 'static,
    ResBody::Data: Into<Bytes> + Send,
    ResBody::Error: Into<BoxError>,
{
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            return Next::Finish(Box::pin(async move {
                claim.release().await;
                (Err(error), Outcome::Released)
            }))
        }
    };
    let (mut res_parts, res_body) = response.into_parts();
    // The handler answered: its effects happened. A policy that panics
    // decides nothing, so its body is taken as failed: the key is kept as
    // "response unavailable" (plain mode), as releasing it would let a retry
    // run the effects again, or the writes roll back (transactional mode).
    let policy = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        config.policy.should_record(&res_parts)
    }));
    let policy_panicked = policy.is_err();
    if !policy.unwrap_or(true) {
        warn_once::not_recorded(&config.options.warned, res_parts.status, path);
        mark_not_recorded(&mut res_parts);
        let response = Response::from_parts(res_parts, ResponseBody::inner(res_body));
        return Next::Finish(Box::pin(async move {
            claim.release().await;
            (Ok(response), Outcome::Released)
        }));
    }
    let headers = recorded_headers(&config.replayed_headers, &res_parts);
    let body = record::pinned(res_body);
    let recorder = match claim.hand_over() {
        Ok(recorder) => recorder,
        Err(claim) => {
            let config = config.clone();
            let committed =
                read_then_commit(config, claim, res_parts, headers, body, policy_panicked);
            return Next::Finish(committed);
        }
    };
    // The handler's effects have happened: from here on a dropped future keeps
    // the claim until its lock expires rather than letting a retry run them again.
    let recording = Recording {
        recorder,
        status: res_parts.status,
        headers,
    };
    // Added after the record's headers were taken, once the key is known to be kept.
    let retention = config.retention_header.clone();
    // What the body has ready now: most bodies are whole at once and are
    // recorded before the answer, as they are replayed.
    let mut body = body;
    let (mut copy, mut frames) = (RecordCopy::new(config.record_limit), OneOrMany::default());
    let read = match policy_panicked {
        true => Read::Failed("the record policy panicked".into()),
        false => record::read_ready(&mut body, &mut copy, &mut frames, cx),
    };
    match read {
        end @ (Read::Ended | Read::Failed(_)) => {
            let concluded = record::conclude(end, copy, frames, Some(recording));
            Next::Finish(Box::pin(async move {
                let (body, outcome) = concluded.await;
                kept(&mut res_parts, retention.as_ref(), &outcome);
                (Ok(Response::from_parts(res_parts, body)), outcome)
            }))
        }
        // Still streaming, or past the limit: the caller gets it as it is
        // produced, and the record (or "unavailable") follows.
        Read::Over | Read::Continues => {
            let rest = Rest {
                body,
                copy,
                read: frames,
                recorder: Some(recording),
            };
            let handed_over = match config.cancel_on_drop {
                // Cut with the caller's future: read here, as the handler ran.
                true => Err(Box::new(rest)),
                false => record::spawn_rest(rest, config.in_flight.enter()),
            };
            match handed_over {
                Ok(frames) => {
                    // Its head goes now: the recording that follows keeps the key.
                    advertise_retention(&mut res_parts, retention.as_ref());
                    let response = Response::from_parts(res_parts, ResponseBody::streamed(frames));
                    Next::Reply((Ok(response), Outcome::Claimed))
                }
                Err(rest) => Next::Finish(Box::pin(async move {
                    let (body, outcome) = record::finish_here(*rest).await;
                    kept(&mut res_parts, retention.as_ref(), &outcome);
                    (Ok(Response::from_parts(res_parts, body)), outcome)
                })),
            }
        }
    }
}

/// Transactional mode: nothing the handler wrote is visible before the
/// commit, so the body is read whole (up to the record limit) first, then
/// committed with its record, or rolled back if it failed.
fn read_then_commit<B, Error, E, P>(
    config: Arc<Config<E, P>>,
    claim: Finish,
    mut res_parts: http::response::Parts,
    headers: Vec<(http::HeaderName, HeaderValue)>,
    mut body: record::Pinned<B>,
    policy_panicked: bool,
) -> Boxed<Answered<B, Error>>
where
    Error: Send + 'static,
    E: Send + Sync + 'static,
    P: RecordPolicy,
    B: Body + Send + 'static,
    B::Data: Into<Bytes> + Send,
    B::Error: Into<BoxError>,
{
    Box::pin(async move {
        let (mut copy, mut frames) = (RecordCopy::new(config.record_limit), OneOrMany::default());
        let read = match policy_panicked {
            true => Read::Failed("the record policy panicked".into()),
            false => record::read_to_end(&mut body, &mut copy, &mut frames).await,
        };
        let retention = config.retention_header.as_ref();
        match read {
            Read::Failed(error) => {
                claim.release().await;
                let response = Response::from_parts(res_parts, ResponseBody::failed(error));
                (Ok(response), Outcome::Released)
            }
            Read::Ended if !copy.has_trailers() => {
                let body = copy.into_bytes();
                let stored = StoredResponse {
                    status: res_parts.status,
                    headers,
                    body: body.clone(),
                };
                match claim.record(stored).await {
                    Recorded::Yes => {
                        advertise_retention(&mut res_parts, retention);
                        let response = Response::from_parts(res_parts, ResponseBody::full(body));
                        (Ok(response), Outcome::Claimed)
                    }
                    // The handler ran either way: never "not processed".
                    Recorded::Failed | Recorded::Unknown(_) => {
                        refuse(&config, Refusal::OutcomeUnknown)
                    }
                }
            }
            // Too large to record, or ended with trailers (which a record
            // cannot carry): the writes commit, marked as not replayable,
            // and the body goes on to the caller, trailers and all.
            end => {
                let why = match copy.is_over() {
                    true => record::OVER,
                    false => record::TRAILERS,
                };
                if !matches!(claim.unavailable(why).await, Recorded::Yes) {
                    return refuse(&config, Refusal::OutcomeUnknown);
                }
                // The key is kept as long as a recorded one (retries get `410`).
                advertise_retention(&mut res_parts, retention);
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
                (
                    Ok(Response::from_parts(res_parts, body)),
                    Outcome::Unavailable,
                )
            }
        }
    })
}

/// Advertises the retention on an answer whose key was completed (recorded,
/// or kept as "response unavailable"), not on one the store failed to take.
fn kept(parts: &mut http::response::Parts, retention: Option<&HeaderValue>, outcome: &Outcome) {
    if !matches!(outcome, Outcome::StoreError) {
        advertise_retention(parts, retention);
    }
}
