//! The claimed handler of plain mode, written out as a future.
//!
//! An `async fn` keeps every argument and every value that lives across two
//! awaits in a slot of its own for its whole life; for this one (the request's
//! parts, the inner call's future, the response's parts, the recorder, the
//! body's copy) that came to more than 2 KiB, which the allocator serves from
//! its slow path on every fresh key. Written out, the call is polled in place
//! and only what follows the response (recording it, or releasing the claim)
//! is boxed on its own, both small.

use super::answer::{advertise_retention, mark_not_recorded, recorded_headers, Answer};
use super::config::Config;
use super::warn_once;
use crate::body::{BoxError, ResponseBody};
use crate::engine::claim::ClaimGuard;
use crate::engine::in_flight::Running;
use crate::engine::record::{self, OneOrMany, Read, RecordCopy, Recorder, Rest};
use crate::policy::RecordPolicy;
use crate::telemetry::Outcome;
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

type Answered<B, Error> = (Result<Answer<B>, Error>, Outcome);
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// Runs the inner service for a claimed key and records its response,
    /// counted as running until it completes. Dropped before the response
    /// (cancel-on-drop, a runtime shutting down), its claim guard releases
    /// the key; dropped after it, the claim is kept until its lock expires.
    pub(crate) struct RunClaimed<S, ReqBody, F, Out, E, P> {
        #[pin]
        stage: Stage<S, ReqBody, F, Out>,
        config: Arc<Config<E, P>>,
        // Holds the record key until the response says whether to keep it.
        claim: Option<ClaimGuard>,
        _running: Running,
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
        claim: ClaimGuard,
        running: Running,
    ) -> Self {
        Self {
            stage: Stage::NotCalled {
                inner,
                request: Some(request),
                body: PhantomData,
            },
            config,
            claim: Some(claim),
            _running: running,
        }
    }
}

impl<S, ReqBody, ResBody, E, P> Future
    for RunClaimed<S, ReqBody, S::Future, Answered<ResBody, S::Error>, E, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Send + 'static,
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
                        Next::Answer(answer) => {
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
    Answer(T),
    Finish(Boxed<T>),
}

/// What the handler's response leads to: released (an error, a status the
/// policy does not record), recorded whole, or streamed to the caller with
/// the record following.
fn after_response<ResBody, Error, E, P>(
    config: &Config<E, P>,
    claim: ClaimGuard,
    result: Result<Response<ResBody>, Error>,
    path: &str,
    cx: &mut Context<'_>,
) -> Next<Answered<ResBody, Error>>
where
    Error: Send + 'static,
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
    // decides nothing, so the key is kept as "response unavailable", as for
    // a body that fails; releasing it would let a retry run them again.
    let policy = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        config.policy.should_record(&res_parts)
    }));
    let policy_panicked = policy.is_err();
    if !policy.unwrap_or(true) {
        warn_once::not_recorded(&config.warned, res_parts.status, path);
        mark_not_recorded(&mut res_parts);
        let response = Response::from_parts(res_parts, ResponseBody::inner(res_body));
        return Next::Finish(Box::pin(async move {
            claim.release().await;
            (Ok(response), Outcome::Released)
        }));
    }
    // The handler's effects have happened: from here on a dropped future keeps
    // the claim until its lock expires rather than letting a retry run them again.
    let (record, token) = claim.keep();
    let recorder = Recorder {
        store: config.store.store().clone(),
        record,
        token,
        status: res_parts.status,
        headers: recorded_headers(&config.replayed_headers, &res_parts),
    };
    // Added after the record's headers were taken, once the key is known to be kept.
    let retention = config.retention_header.clone();
    // What the body has ready now: most bodies are whole at once and are
    // recorded before the answer, as they are replayed.
    let mut body = record::pinned(res_body);
    let (mut copy, mut frames) = (RecordCopy::new(config.record_limit), OneOrMany::default());
    let read = match policy_panicked {
        true => Read::Failed("the record policy panicked".into()),
        false => record::read_ready(&mut body, &mut copy, &mut frames, cx),
    };
    match read {
        end @ (Read::Ended | Read::Failed(_)) => {
            let concluded = record::conclude(end, copy, frames, Some(recorder));
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
                recorder: Some(recorder),
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
                    Next::Answer((Ok(response), Outcome::Claimed))
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

/// Advertises the retention on an answer whose key was completed (recorded,
/// or kept as "response unavailable"), not on one the store failed to take.
fn kept(parts: &mut http::response::Parts, retention: Option<&HeaderValue>, outcome: &Outcome) {
    if !matches!(outcome, Outcome::StoreError) {
        advertise_retention(parts, retention);
    }
}
