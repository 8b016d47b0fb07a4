//! A user's own store that panics, once, inside one of its calls (`begin`,
//! `complete`, the keep-alive's `extend`, `release`, a duplicate's `wait`),
//! under `IdempotencyLayer` on `MemoryStore`: a store that panics is a
//! failing store (the layer catches the panic where it calls the store and
//! takes it as a backend error), so the request is answered in bounded
//! time, the handler's effect happens at most once across retries, the key is not
//! stuck past its lock (a retry after it runs or replays), and the runtime
//! serves later requests. The wrapper is the fault harness's `Faulty`
//! (tests/common/faults.rs), whose plan here panics at the first poll of one
//! call; with no plan it is a faithful store: it passes the conformance suite.
#![cfg(feature = "test-util")]

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};
use tower_idempotency::store::conformance::Durations;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};
use tower_idempotency_tests::faults::{Fault, Faulty, Plan};

/// A `Store` call that panics, by the name the fault harness gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Begin,
    Complete,
    Extend,
    Release,
    /// A duplicate's wait for the request in progress.
    Wait,
}

impl Call {
    fn site(self) -> &'static str {
        match self {
            Self::Begin => "begin",
            Self::Complete => "complete",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::Wait => "wait",
        }
    }
}

/// The wrapper, armed with nothing: a faithful store.
async fn panic_store(d: Durations) -> Option<Faulty<MemoryStore>> {
    let store = MemoryStore::builder()
        .with_lock_timeout(d.lock)
        .with_retention(d.retention)
        .with_tombstone(d.tombstone)
        .build();
    Some(Faulty {
        inner: store,
        plan: Plan::none(),
    })
}

mod unarmed_conformance {
    use super::*;
    tower_idempotency::store_conformance_tests!(panic_store, in_process);
}

const LOCK: Duration = Duration::from_secs(1);
/// The longest any one request may take to be answered.
const PATIENCE: Duration = Duration::from_secs(10);

fn order(key: &str) -> Request<Body> {
    let mut request = Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"item":"book"}"#))
        .unwrap();
    request.extensions_mut().insert(Scope::new("tenant"));
    request
}

/// How one request ended, as its caller (a server's connection task) sees it.
#[derive(Debug)]
enum Ended {
    Answered(StatusCode, String),
    /// The layer's future panicked: the server drops the connection.
    Panicked,
}

/// What the scenario's handler does, and counts.
#[derive(Clone, Default)]
struct Handler {
    /// Every call of the handler.
    calls: Arc<AtomicUsize>,
    /// Its effects: calls that got as far as doing what the request asks.
    effects: Arc<AtomicUsize>,
    started: Arc<Notify>,
}

impl Handler {
    /// Fails its first call (`503`, not recorded: the layer releases the
    /// key) when `fail_first`, and works `hold` before answering `201`.
    async fn handle(&self, fail_first: bool, hold: Duration) -> Response<Body> {
        let call = self.calls.fetch_add(1, SeqCst);
        self.started.notify_one();
        if fail_first && call == 0 {
            let failed = Response::builder().status(StatusCode::SERVICE_UNAVAILABLE);
            return failed.body(Body::from("not now")).unwrap();
        }
        let effect = self.effects.fetch_add(1, SeqCst);
        tokio::time::sleep(hold).await;
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Body::from(format!("effect {effect}")))
            .unwrap()
    }
}

/// One panic in `call` across a request and its retries; what the
/// request's caller saw first.
async fn panic_once_in(call: Call) -> Ended {
    // Panics at the first poll of `call`, once.
    let plan = Plan::at_first(call.site(), Fault::Panic);
    let store = Faulty {
        inner: MemoryStore::builder().with_lock_timeout(LOCK).build(),
        plan: plan.clone(),
    };
    let handler = Handler::default();
    // The keep-alive extends only a handler that waits: this one outlasts
    // its lock thrice. The duplicate's wait needs a request in progress.
    let hold = match call {
        Call::Extend => LOCK * 3,
        Call::Wait => LOCK / 2,
        _ => Duration::from_millis(10),
    };
    let inner = {
        let handler = handler.clone();
        tower::service_fn(move |_: Request<Body>| {
            let handler = handler.clone();
            async move {
                Ok::<_, std::convert::Infallible>(handler.handle(call == Call::Release, hold).await)
            }
        })
    };
    let service = IdempotencyLayer::new(store.clone())
        .with_wait_timeout(LOCK * 2)
        .layer(inner);
    let send = |key: &str| {
        let request = service.clone().oneshot(order(key));
        // As a server runs it: in a task of its own, whose panic ends only it.
        let task = tokio::spawn(async move {
            let response = request.await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        });
        async move {
            match tokio::time::timeout(PATIENCE, task).await {
                Err(_) => panic!("{call:?}: no answer within {PATIENCE:?}"),
                Ok(Ok((status, body))) => Ended::Answered(status, body),
                Ok(Err(e)) if e.is_panic() => Ended::Panicked,
                Ok(Err(e)) => panic!("{call:?}: the request's task ended: {e}"),
            }
        }
    };

    let first = match call {
        // A duplicate arrives while the first request runs, and waits.
        Call::Wait => {
            let running = tokio::spawn(send("order-key-0001"));
            handler.started.notified().await;
            let duplicate = send("order-key-0001").await;
            let owner = running.await.unwrap();
            assert!(
                matches!(&owner, Ended::Answered(StatusCode::CREATED, _)),
                "{call:?}: the owner was answered {owner:?}"
            );
            duplicate
        }
        // A retry arrives once the claim would have expired unextended,
        // and waits for the owner.
        Call::Extend => {
            let running = tokio::spawn(send("order-key-0001"));
            handler.started.notified().await;
            tokio::time::sleep(LOCK * 3 / 2).await;
            let retry = send("order-key-0001").await;
            assert!(
                matches!(
                    &retry,
                    Ended::Answered(StatusCode::CREATED | StatusCode::CONFLICT, _)
                ),
                "{call:?}: a retry during the run got {retry:?}"
            );
            running.await.unwrap()
        }
        _ => send("order-key-0001").await,
    };
    assert_eq!(
        plan.fired(),
        Some(call.site()),
        "the store panicked once, in {call:?}"
    );
    if let Ended::Answered(status, _) = &first {
        // The handler's own answer when it ran and was recorded, or an error.
        assert!(
            *status == StatusCode::CREATED || status.is_server_error(),
            "{call:?}: answered {status}"
        );
    }

    // Retried until it runs or replays: within a lock of the panic, and it
    // ran at most once.
    let deadline = tokio::time::Instant::now() + LOCK * 3;
    let settled = loop {
        match send("order-key-0001").await {
            Ended::Answered(StatusCode::CREATED, body) => break body,
            other if tokio::time::Instant::now() < deadline => {
                let _ = other;
                tokio::time::sleep(LOCK / 10).await;
            }
            other => panic!("{call:?}: the key is stuck past its lock: {other:?}"),
        }
    };
    assert_eq!(
        handler.effects.load(SeqCst),
        1,
        "{call:?}: the handler's effect happened {} times (settled on {settled:?})",
        handler.effects.load(SeqCst)
    );
    assert_eq!(settled, "effect 0", "{call:?}");
    if let Ended::Answered(StatusCode::CREATED, body) = &first {
        assert_eq!(body, &settled, "{call:?}: two answers of one key");
    }
    // Later requests, of this key and others, are served.
    match send("order-key-0001").await {
        Ended::Answered(StatusCode::CREATED, body) => assert_eq!(body, settled),
        other => panic!("{call:?}: a later retry got {other:?}"),
    }
    match send("order-key-0002").await {
        Ended::Answered(StatusCode::CREATED, body) => assert_eq!(body, "effect 1"),
        other => panic!("{call:?}: another key got {other:?}"),
    }
    first
}

/// `begin` panics before any claim: a store that panics is a failing store,
/// `503 idempotency_store_unavailable` (nothing ran), and the retry claims
/// and runs.
#[tokio::test(start_paused = true)]
async fn a_panic_in_begin_is_a_503_and_the_retry_runs_once() {
    let first = panic_once_in(Call::Begin).await;
    assert!(
        matches!(&first, Ended::Answered(StatusCode::SERVICE_UNAVAILABLE, body)
            if body.contains("idempotency_store_unavailable")),
        "{first:?}"
    );
}

/// `release` (after the handler's unrecorded `503`) panics: a failed
/// release, so the caller gets the handler's own answer, and the claim's
/// lock frees the key for the retry, which runs.
#[tokio::test(start_paused = true)]
async fn a_panic_in_release_answers_the_handlers_response_and_the_lock_frees_the_key() {
    let first = panic_once_in(Call::Release).await;
    assert!(
        matches!(&first, Ended::Answered(StatusCode::SERVICE_UNAVAILABLE, body) if body == "not now"),
        "{first:?}"
    );
}

/// The keep-alive's `extend` panics while the handler runs past its lock:
/// the keep-alive goes on extending (a panic is a failed attempt), so no
/// retry takes the key over, and the caller gets the handler's answer.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_keep_alives_extend_keeps_the_claim_alive() {
    let first = panic_once_in(Call::Extend).await;
    assert!(
        matches!(&first, Ended::Answered(StatusCode::CREATED, body) if body == "effect 0"),
        "{first:?}"
    );
}

/// A duplicate's `wait` panics: the duplicate gets `503
/// idempotency_store_unavailable`, the owner is answered and recorded, and
/// the retry replays.
#[tokio::test(start_paused = true)]
async fn a_panic_in_a_duplicates_wait_is_a_503_for_the_duplicate_only() {
    let first = panic_once_in(Call::Wait).await;
    assert!(
        matches!(&first, Ended::Answered(StatusCode::SERVICE_UNAVAILABLE, body)
            if body.contains("idempotency_store_unavailable")),
        "{first:?}"
    );
}

/// `complete` panics after the handler ran: a failed completion, tried again
/// in the background, so the caller gets the handler's answer and the retry
/// replays it; the handler ran once.
#[tokio::test(start_paused = true)]
async fn a_panic_in_complete_never_runs_the_handler_twice() {
    let first = panic_once_in(Call::Complete).await;
    assert!(
        matches!(&first, Ended::Answered(StatusCode::CREATED, body) if body == "effect 0"),
        "{first:?}"
    );
}
