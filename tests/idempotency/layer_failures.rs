//! `IdempotencyLayer` in process when things go wrong or race: release paths
//! (inner error, panic, a future dropped with `with_cancel_on_drop`, failing response body), request body
//! limits and timeouts, hostile JSON, concurrent duplicates and waiters.
//!
//! Test names state the rule they defend (docs/security.md lists them by threat).
//! Time is only an upper bound for correctness here, never a speed assertion.

use tower_idempotency_tests::oneshot;

use oneshot::*;

use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::sync::{Barrier, Notify};
use tokio::time::{sleep, timeout, Instant};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::{body::BoxError, IdempotencyLayer, MemoryStore, Refusal, Refused, Scope};

const KEY: &str = "order-7f3a9c2e";
const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;
/// Generous upper bound for anything that must happen "soon".
const PATIENCE: Duration = Duration::from_secs(30);

/// `201 {"order":run}`.
fn created(run: usize) -> Response<Body> {
    Response::builder()
        .status(StatusCode::CREATED)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(format!(r#"{{"order":{run}}}"#)))
        .unwrap()
}

/// A JSON POST by `merchant_1` (its auth layer inserted the `Scope`).
fn post(key: &str, body: impl Into<Body>) -> Request<Body> {
    let mut req = Request::post("/v1/orders")
        .header(CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(body.into())
        .unwrap();
    req.extensions_mut().insert(Scope::new("merchant_1"));
    req
}

/// One step of a [`Scripted`] body.
#[derive(Clone)]
pub(crate) enum Step {
    Data(Bytes),
    Pause(Duration),
    Fail(&'static str),
}

pub(crate) fn data(bytes: &'static [u8]) -> Step {
    Step::Data(Bytes::from_static(bytes))
}

/// A streamed body (no length): yields chunks, pauses and errors in order.
struct Scripted {
    steps: VecDeque<Step>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

pub(crate) fn scripted(steps: impl IntoIterator<Item = Step>) -> Body {
    Body::new(Scripted {
        steps: steps.into_iter().collect(),
        pause: None,
    })
}

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(pause) = self.pause.as_mut() {
                ready!(pause.as_mut().poll(cx));
                self.pause = None;
            }
            match self.steps.pop_front() {
                None => return Poll::Ready(None),
                Some(Step::Data(bytes)) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Some(Step::Fail(why)) => return Poll::Ready(Some(Err(why.into()))),
                Some(Step::Pause(d)) => self.pause = Some(Box::pin(sleep(d))),
            }
        }
    }
}

/// Waits, within [`PATIENCE`], until the store holds `records` records.
async fn until_released(store: &MemoryStore, records: usize) {
    let poll = async {
        while store.len() != records {
            sleep(Duration::from_millis(5)).await;
        }
    };
    timeout(PATIENCE, poll)
        .await
        .expect("the claim was never released: the key is stuck in progress");
}

// Release paths: everything that is not a recorded response frees the key.

#[tokio::test]
async fn inner_error_frees_the_key_so_a_retry_runs() {
    let (store, runs) = (MemoryStore::new(), Runs::default());
    let svc = IdempotencyLayer::new(store.clone()).layer(handler(&runs, |_req, run| async move {
        if run == 1 {
            return Err("database unavailable");
        }
        Ok(created(run))
    }));
    let error = svc.clone().oneshot(post(KEY, ORDER)).await.unwrap_err();
    assert_eq!(
        error, "database unavailable",
        "the inner error type is unchanged"
    );
    assert!(store.is_empty(), "released before the error was returned");
    send(&svc, post(KEY, ORDER)).await.assert_order(2, false);
    send(&svc, post(KEY, ORDER)).await.assert_order(2, true);
    assert_eq!(runs.get(), 2);
}

#[tokio::test]
async fn handler_panic_frees_the_key_claims_never_stuck_in_progress() {
    for cancel_on_drop in [false, true] {
        let (store, runs) = (MemoryStore::new(), Runs::default());
        let layer = IdempotencyLayer::new(store.clone()).with_cancel_on_drop(cancel_on_drop);
        let svc = layer.layer(handler(&runs, |_req, run| async move {
            if run == 1 {
                panic!("handler bug (expected by this test)");
            }
            Ok::<_, Infallible>(created(run))
        }));
        let joined = tokio::spawn(svc.clone().oneshot(post(KEY, ORDER))).await;
        if cancel_on_drop {
            // Run in the caller's task, the panic reaches the caller.
            assert!(joined.unwrap_err().is_panic());
        } else {
            // Run in a task of its own, the caller is answered 500.
            let res = joined.unwrap().unwrap();
            assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
        // The store's lock timeout is far longer: only the release empties it in time.
        until_released(&store, 0).await;
        send(&svc, post(KEY, ORDER)).await.assert_order(2, false);
        assert_eq!(runs.get(), 2);
    }
}

/// A request body type whose rebuilding from the buffered bytes panics on
/// the body `boom`.
struct Fragile(http_body_util::Full<Bytes>);

impl http_body::Body for Fragile {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }
}

impl From<Bytes> for Fragile {
    fn from(bytes: Bytes) -> Self {
        assert_ne!(
            &bytes[..],
            b"boom",
            "the body type failed (expected by this test)"
        );
        Self(http_body_util::Full::new(bytes))
    }
}

/// Rebuilding the request for the handler happens once the key is claimed:
/// a panic there is the handler's, answered `500`, and frees the key.
#[tokio::test]
async fn a_panic_rebuilding_the_request_body_answers_500_and_frees_the_key() {
    let (store, runs) = (MemoryStore::new(), Runs::default());
    let counter = runs.0.clone();
    let svc = IdempotencyLayer::new(store.clone()).layer(tower::service_fn(
        move |_req: Request<Fragile>| {
            let run = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            async move { Ok::<_, Infallible>(created(run)) }
        },
    ));
    let request = |body: &'static [u8]| {
        let mut req = Request::post("/v1/orders")
            .header("idempotency-key", KEY)
            .body(Fragile(http_body_util::Full::new(Bytes::from_static(body))))
            .unwrap();
        req.extensions_mut().insert(Scope::new("merchant_1"));
        req
    };
    let res = svc.clone().oneshot(request(b"boom")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.get(), 0, "the handler never ran");
    until_released(&store, 0).await;
    let other = svc.clone().oneshot(request(b"{}")).await.unwrap();
    assert_eq!(other.status(), StatusCode::CREATED, "the key is free again");
    assert_eq!(runs.get(), 1);
}

/// A handler that, for requests carrying `x-hang`, signals `started` and never answers.
fn hanging(
    runs: &Runs,
    started: Arc<Notify>,
) -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone
       + Send
       + 'static {
    handler(runs, move |req: Request<Body>, run| {
        let started = started.clone();
        async move {
            if req.headers().contains_key("x-hang") {
                started.notify_one();
                sleep(Duration::from_secs(3600)).await;
            }
            Ok(created(run))
        }
    })
}

/// The opt-out: with `with_cancel_on_drop(true)` a dropped future cuts the
/// handler and frees the key, so the retry runs it again.
#[tokio::test]
async fn with_cancel_on_drop_a_dropped_request_future_frees_the_key() {
    let (store, runs, started) = (MemoryStore::new(), Runs::default(), Arc::new(Notify::new()));
    let svc = IdempotencyLayer::new(store.clone())
        .with_cancel_on_drop(true)
        .layer(hanging(&runs, started.clone()));
    let hang = |key| with_header(post(key, ORDER), "x-hang", "1");

    // The task serving the request is aborted mid-handler.
    let task = tokio::spawn(svc.clone().oneshot(hang(KEY)));
    timeout(PATIENCE, started.notified()).await.unwrap();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    until_released(&store, 0).await;
    send(&svc, post(KEY, ORDER)).await.assert_order(2, false);
    assert_eq!(store.len(), 1, "the retry's 201 is recorded");

    // The request future is dropped in place, as a server does on disconnect.
    let other = "order-dropped-1";
    let mut pending = Box::pin(svc.clone().oneshot(hang(other)));
    tokio::select! {
        _ = &mut pending => panic!("the hanging handler answered"),
        _ = started.notified() => {}
    }
    drop(pending);
    until_released(&store, 1).await;
    send(&svc, post(other, ORDER)).await.assert_order(4, false);
    assert_eq!(runs.get(), 4);
}

/// The handler answered (its effects happened), then its body failed: the
/// key is completed as "response unavailable", never released, so no retry
/// runs the handler again; a retry is told `410`.
#[tokio::test]
async fn response_body_failing_mid_stream_never_runs_the_handler_again() {
    let (store, runs) = (MemoryStore::new(), Runs::default());
    let svc = IdempotencyLayer::new(store.clone()).layer(handler(&runs, |req, run| async move {
        if !req.headers().contains_key("x-fail") {
            return Ok::<_, Infallible>(created(run));
        }
        let body = scripted([data(b"{\"order\":"), Step::Fail("upstream reset")]);
        Ok(Response::builder().status(201).body(body).unwrap())
    }));
    let first = svc
        .clone()
        .oneshot(with_header(post(KEY, ORDER), "x-fail", "1"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let error = first.into_body().collect().await.unwrap_err();
    assert!(error.to_string().contains("upstream reset"), "{error}");
    for _ in 0..2 {
        let retry = svc.clone().oneshot(post(KEY, ORDER)).await.unwrap();
        assert_eq!(retry.status(), StatusCode::GONE);
        let body = retry.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&body).contains("idempotency_response_unavailable"),
            "{body:?}"
        );
    }
    assert_eq!(runs.get(), 1, "never run again");
    // Another request under the key is still a reuse.
    let other = svc
        .clone()
        .oneshot(post(KEY, r#"{"sku":"B-2","qty":1}"#))
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::CONFLICT);
}

/// Where a [`PanickingBody`] panics.
#[derive(Clone, Copy, Debug)]
enum PanicAt {
    /// On its first poll.
    FirstPoll,
    /// On the poll after its first frame, with no wait in between.
    SecondPoll,
    /// After its first frame and a wait: the rest is read after the answer.
    AfterAWait,
}

/// A response body that panics, as a bug in the code producing it would.
struct PanickingBody {
    at: PanicAt,
    polls: usize,
}

impl http_body::Body for PanickingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.polls += 1;
        match (self.at, self.polls) {
            (PanicAt::SecondPoll | PanicAt::AfterAWait, 1) => {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"charge\":")))))
            }
            (PanicAt::AfterAWait, 2) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            _ => panic!("response body bug (expected by this test)"),
        }
    }
}

/// The handler charged and answered `201`, then its body panicked: that is a
/// failing body. The key is completed as "response unavailable" (retries,
/// even long after the claim's lock, get `410`, never a second charge), and
/// the first caller sees an error, never a truncated body that ends cleanly.
async fn a_panicking_body_is_a_failed_body(at: PanicAt) {
    let lock = Duration::from_secs(1);
    for cancel_on_drop in [false, true] {
        let case = format!("{at:?}, cancel on drop: {cancel_on_drop}");
        let (store, runs) = (
            MemoryStore::builder().with_lock_timeout(lock).build(),
            Runs::default(),
        );
        let layer = IdempotencyLayer::new(store.clone()).with_cancel_on_drop(cancel_on_drop);
        let svc = layer.layer(handler(&runs, move |_req, run| async move {
            if run > 1 {
                return Ok(created(run));
            }
            let body = Body::new(PanickingBody { at, polls: 0 });
            Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
        }));
        let first = tokio::spawn(svc.clone().oneshot(post(KEY, ORDER)))
            .await
            .unwrap_or_else(|e| panic!("{case}: the panic reached the caller: {e}"))
            .unwrap();
        if !first.status().is_server_error() {
            let read = timeout(PATIENCE, first.into_body().collect()).await;
            let read = read.unwrap_or_else(|_| panic!("{case}: the body never ended"));
            assert!(
                read.is_err(),
                "{case}: a truncated body ended cleanly: {:?}",
                read.map(|body| body.to_bytes())
            );
        }
        // Well past the claim's lock: a claim left in progress would be taken over.
        sleep(lock * 3).await;
        for _ in 0..2 {
            let retry = send(&svc, post(KEY, ORDER)).await;
            retry.assert_refusal(StatusCode::GONE, "idempotency_response_unavailable");
        }
        assert_eq!(runs.get(), 1, "{case}: the handler ran again");
    }
}

#[tokio::test(start_paused = true)]
async fn a_response_body_panicking_on_its_first_poll_never_charges_twice() {
    a_panicking_body_is_a_failed_body(PanicAt::FirstPoll).await;
}

#[tokio::test(start_paused = true)]
async fn a_response_body_panicking_after_its_first_frame_never_charges_twice() {
    a_panicking_body_is_a_failed_body(PanicAt::SecondPoll).await;
}

/// The panic comes once the caller has the head and the first frame: it
/// still sees an error, not a body cut short that ends cleanly.
#[tokio::test(start_paused = true)]
async fn a_streamed_response_body_panicking_mid_stream_never_charges_twice() {
    a_panicking_body_is_a_failed_body(PanicAt::AfterAWait).await;
}

/// A record policy that panics decides after the handler answered, its
/// effects done: the key is kept as "response unavailable" (the caller reads
/// an error), never released for a retry to run the handler again.
#[tokio::test(start_paused = true)]
async fn a_record_policy_that_panics_never_charges_twice() {
    let lock = Duration::from_secs(1);
    let (store, runs) = (
        MemoryStore::builder().with_lock_timeout(lock).build(),
        Runs::default(),
    );
    let layer =
        IdempotencyLayer::new(store).with_record_policy(|parts: &http::response::Parts| -> bool {
            if parts.status == StatusCode::CREATED {
                panic!("a bug in the record policy");
            }
            false
        });
    let svc = layer.layer(handler(&runs, |_req, run| async move {
        Ok::<_, Infallible>(created(run))
    }));
    let first = tokio::spawn(svc.clone().oneshot(post(KEY, ORDER)))
        .await
        .unwrap_or_else(|e| panic!("the panic reached the caller: {e}"))
        .unwrap();
    if !first.status().is_server_error() {
        let read = timeout(PATIENCE, first.into_body().collect())
            .await
            .unwrap();
        assert!(
            read.is_err(),
            "the caller read an answer that was never recorded"
        );
    }
    sleep(lock * 3).await;
    for _ in 0..2 {
        let retry = send(&svc, post(KEY, ORDER)).await;
        retry.assert_refusal(StatusCode::GONE, "idempotency_response_unavailable");
    }
    assert_eq!(runs.get(), 1, "the handler ran again");
}

// Request body: limits, timeouts, exact bytes.

#[tokio::test]
async fn declared_content_length_over_the_limit_is_413_before_reading_the_body() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_body_limit(64);
    let svc = layer.layer(handler(&runs, |_req, run| async move {
        Ok::<_, Infallible>(created(run))
    }));
    // A body that never arrives: only the Content-Length can answer in time.
    let never = scripted([Step::Pause(Duration::from_secs(3600))]);
    let req = with_header(post(KEY, never), "content-length", "65");
    let reply = timeout(PATIENCE, send(&svc, req)).await.unwrap();
    reply.assert_refusal(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    // The message names the limit: the client cannot know it otherwise.
    let message = reply.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("limit of 64 bytes"), "{message}");
    assert_eq!(runs.get(), 0);
    // Exactly at the limit is accepted.
    let at_limit = with_header(post(KEY, "x".repeat(64)), "content-length", "64");
    send(&svc, at_limit).await.assert_order(1, false);
}

#[tokio::test]
async fn the_413_message_names_the_default_limit_and_reaches_the_refusal_hook() {
    let runs = Runs::default();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook_seen = seen.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_refusal_response(
        move |refused: &Refused, default: Response<Bytes>| {
            hook_seen.lock().unwrap().push(refused.refusal);
            default
        },
    );
    let svc = layer.layer(handler(&runs, |_req, run| async move {
        Ok::<_, Infallible>(created(run))
    }));
    let never = scripted([Step::Pause(Duration::from_secs(3600))]);
    let req = with_header(post(KEY, never), "content-length", "1048577");
    let reply = timeout(PATIENCE, send(&svc, req)).await.unwrap();
    reply.assert_refusal(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    let message = reply.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("limit of 1048576 bytes"), "{message}");
    assert_eq!(*seen.lock().unwrap(), [Refusal::PayloadTooLarge]);
    assert_eq!(runs.get(), 0);
}

#[tokio::test]
async fn streamed_body_over_the_limit_is_413_without_content_length() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_body_limit(64);
    let svc = layer.layer(handler(&runs, |_req, run| async move {
        Ok::<_, Infallible>(created(run))
    }));
    let chunks = |n| scripted((0..n).map(|_| data(b"12345678")));
    let req = post(KEY, chunks(9));
    assert!(req.headers().get(CONTENT_LENGTH).is_none());
    send(&svc, req)
        .await
        .assert_refusal(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(runs.get(), 0);
    send(&svc, post(KEY, chunks(8)))
        .await
        .assert_order(1, false);
}

#[tokio::test(start_paused = true)]
async fn body_trickling_past_the_body_timeout_is_408() {
    let runs = Runs::default();
    let inner = handler(&runs, |req: Request<Body>, run| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "[1,2,3,4,5]");
        Ok::<_, Infallible>(created(run))
    });
    let trickle = || {
        let mut steps = vec![data(b"[1")];
        for chunk in [b",2", b",3", b",4", b",5"] {
            steps.extend([Step::Pause(Duration::from_secs(2)), data(chunk)]);
        }
        steps.push(data(b"]"));
        post(KEY, scripted(steps))
    };
    let strict =
        IdempotencyLayer::new(MemoryStore::new()).with_body_timeout(Duration::from_secs(5));
    send(&strict.layer(inner.clone()), trickle())
        .await
        .assert_refusal(StatusCode::REQUEST_TIMEOUT, "request_timeout");
    assert_eq!(runs.get(), 0);
    // The same trickle within a longer timeout arrives whole.
    let patient = IdempotencyLayer::new(MemoryStore::new()).with_body_timeout(PATIENCE);
    send(&patient.layer(inner), trickle())
        .await
        .assert_order(1, false);
}

#[tokio::test]
async fn request_body_error_is_400_body_unreadable() {
    let runs = Runs::default();
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .layer(handler(&runs, |_req, run| async move {
            Ok::<_, Infallible>(created(run))
        }));
    let broken = scripted([data(b"{\"sku\":"), Step::Fail("client reset")]);
    send(&svc, post(KEY, broken))
        .await
        .assert_refusal(StatusCode::BAD_REQUEST, "body_unreadable");
    assert_eq!(runs.get(), 0);
}

#[tokio::test]
async fn the_handler_receives_exactly_the_bytes_sent_not_the_canonical_form() {
    let (runs, seen) = (Runs::default(), Arc::new(Mutex::new(Vec::new())));
    let inner = handler(&runs, {
        let seen = seen.clone();
        move |req: Request<Body>, run| {
            let seen = seen.clone();
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                seen.lock().unwrap().push(body);
                Ok::<_, Infallible>(created(run))
            }
        }
    });
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(inner);
    let spaced = "{ \"qty\": 2.0,\n  \"sku\": \"A-1\" }";
    let binary: &'static [u8] = b"\x00\xff\xfe{\"not\":json}\x80";
    send(&svc, post("order-bytes-01", spaced))
        .await
        .assert_order(1, false);
    let octets = with_header(
        post("order-bytes-02", binary),
        "content-type",
        "application/octet-stream",
    );
    send(&svc, octets).await.assert_order(2, false);
    let pieces = scripted([data(b"{\"sku\""), data(b":"), data(b"\"A-1\"}")]);
    send(&svc, post("order-bytes-03", pieces))
        .await
        .assert_order(3, false);
    let expected = [spaced.as_bytes(), binary, br#"{"sku":"A-1"}"#];
    assert_eq!(*seen.lock().unwrap(), expected);
}

#[tokio::test]
async fn json_nested_100000_deep_does_not_overflow_the_stack_and_replays() {
    let depth = 100_000;
    let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let runs = Runs::default();
    let expected = Bytes::from(deep.clone());
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(handler(
        &runs,
        move |req: Request<Body>, run| {
            let expected = expected.clone();
            async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                assert!(body == expected, "the handler got other bytes");
                Ok::<_, Infallible>(created(run))
            }
        },
    ));
    send(&svc, post(KEY, deep.clone()))
        .await
        .assert_order(1, false);
    send(&svc, post(KEY, deep)).await.assert_order(1, true);
    let shallower = format!("{}{}", "[".repeat(depth - 1), "]".repeat(depth - 1));
    send(&svc, post(KEY, shallower))
        .await
        .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    assert_eq!(runs.get(), 1);
}

// Concurrency.

/// A handler that takes `delay` (real time) before answering `201 {"order":run}`.
fn slow(
    runs: &Runs,
    delay: Duration,
) -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone
       + Send
       + 'static {
    handler(runs, move |_req, run| async move {
        sleep(delay).await;
        Ok(created(run))
    })
}

/// Sends all `requests` at once from spawned tasks; replies in request order.
async fn all_at_once<S>(svc: &S, requests: Vec<Request<Body>>) -> Vec<Reply>
where
    S: Service<Request<Body>, Response = Answer, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    let barrier = Arc::new(Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|req| {
            let (svc, barrier) = (svc.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                send(&svc, req).await
            })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(timeout(PATIENCE, task).await.unwrap().unwrap());
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_duplicates_run_once_the_claim_is_one_atomic_insert() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_wait_timeout(PATIENCE);
    let svc = layer.layer(slow(&runs, Duration::from_millis(200)));
    let replies = all_at_once(&svc, (0..200).map(|_| post(KEY, ORDER)).collect()).await;
    assert_eq!(runs.get(), 1, "the handler ran exactly once");
    for reply in &replies {
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        assert_eq!(reply.text(), r#"{"order":1}"#);
    }
    let originals = replies.iter().filter(|r| !r.replayed()).count();
    assert_eq!(originals, 1, "one original answer, 199 replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_different_bodies_concurrently_one_runs_every_path_compares_fingerprints() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_wait_timeout(PATIENCE);
    let svc = layer.layer(slow(&runs, Duration::from_millis(100)));
    let bodies = (0..50).map(|qty| post(KEY, format!(r#"{{"sku":"A-1","qty":{qty}}}"#)));
    let replies = all_at_once(&svc, bodies.collect()).await;
    assert_eq!(runs.get(), 1);
    let (won, lost): (Vec<_>, Vec<_>) = replies
        .iter()
        .partition(|r| r.status == StatusCode::CREATED);
    assert_eq!(won.len(), 1, "{replies:?}");
    won[0].assert_order(1, false);
    for reply in lost {
        reply.assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
        assert!(
            reply.headers.get(RETRY_AFTER).is_none(),
            "a conflict is not 'in progress'"
        );
    }
}

/// A handler that signals `started`, then answers once `gate` is notified.
fn gated(
    runs: &Runs,
    started: Arc<Notify>,
    gate: Arc<Notify>,
) -> impl Service<
    Request<Body>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone
       + Send
       + 'static {
    handler(runs, move |_req, run| {
        let (started, gate) = (started.clone(), gate.clone());
        async move {
            started.notify_one();
            gate.notified().await;
            Ok(created(run))
        }
    })
}

#[tokio::test]
async fn in_progress_is_409_with_retry_after_distinct_from_key_reuse() {
    let (store, runs) = (MemoryStore::new(), Runs::default());
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let inner = gated(&runs, started.clone(), gate.clone());
    let first = IdempotencyLayer::new(store.clone()).layer(inner.clone());
    let impatient = IdempotencyLayer::new(store.clone())
        .with_wait_timeout(Duration::ZERO)
        .with_retry_after(Duration::from_millis(2500))
        .layer(inner.clone());
    let short_wait = IdempotencyLayer::new(store.clone())
        .with_wait_timeout(Duration::from_millis(50))
        .layer(inner);

    let holder = tokio::spawn({
        let first = first.clone();
        async move { send(&first, post(KEY, ORDER)).await }
    });
    timeout(PATIENCE, started.notified()).await.unwrap();
    for _ in 0..10 {
        let reply = send(&impatient, post(KEY, ORDER)).await;
        reply.assert_refusal(StatusCode::CONFLICT, "idempotency_in_progress");
        assert_eq!(reply.headers[RETRY_AFTER], "3");
    }
    let reply = send(&short_wait, post(KEY, ORDER)).await;
    reply.assert_refusal(StatusCode::CONFLICT, "idempotency_in_progress");
    assert_eq!(reply.headers[RETRY_AFTER], "1");
    // Another request under the held key is a conflict, not "in progress".
    let reply = send(&impatient, post(KEY, r#"{"sku":"B-2"}"#)).await;
    reply.assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    assert!(reply.headers.get(RETRY_AFTER).is_none());

    gate.notify_one();
    timeout(PATIENCE, holder)
        .await
        .unwrap()
        .unwrap()
        .assert_order(1, false);
    send(&impatient, post(KEY, ORDER))
        .await
        .assert_order(1, true);
    assert_eq!(runs.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn waiting_duplicates_are_woken_by_completion_not_by_their_wait_timeout() {
    let runs = Runs::default();
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_wait_timeout(PATIENCE);
    let svc = layer.layer(gated(&runs, started.clone(), gate.clone()));
    let spawn_send = || {
        let svc = svc.clone();
        tokio::spawn(async move { send(&svc, post(KEY, ORDER)).await })
    };
    let holder = spawn_send();
    started.notified().await;
    let waiters: Vec<_> = (0..3).map(|_| spawn_send()).collect();
    // Paused clock: 10 virtual seconds pass, the waiters are parked in `wait`.
    sleep(Duration::from_secs(10)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "they wait, not refuse"
    );

    let opened = Instant::now();
    gate.notify_one();
    holder.await.unwrap().assert_order(1, false);
    for waiter in waiters {
        waiter.await.unwrap().assert_order(1, true);
    }
    // Woken by the completion: no virtual time passed, far from the 30 s timeout.
    assert!(
        opened.elapsed() < Duration::from_secs(1),
        "{:?}",
        opened.elapsed()
    );
    assert_eq!(runs.get(), 1);
}
