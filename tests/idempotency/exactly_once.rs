//! A claimed handler's effects happen once: whatever the caller does (hangs
//! up, times out), however slow the handler is next to the lock timeout, and
//! (in `exactly_once/`) on PostgreSQL, across processes killed mid-request.
//!
//! Every handler here has two effects, A and B, with awaits around and between
//! them; the tests cut the caller at each of those awaits.

#[cfg(all(feature = "postgres", feature = "test-util"))]
mod postgres;
#[cfg(all(feature = "postgres", feature = "test-util"))]
mod postgres_liveness;
#[cfg(feature = "postgres")]
mod processes;
#[cfg(feature = "postgres")]
use std::num::NonZeroUsize;
use tower_idempotency::store::Maintenance;
#[cfg(feature = "postgres")]
use tower_idempotency_tests::support;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, timeout};
use tower::ServiceExt;
use tower_idempotency::{store::Store, IdempotencyLayer, InFlight, MemoryStore, Scope};

/// How long each await of the two-effect handler takes.
const STEP: Duration = Duration::from_millis(120);
const PATIENCE: Duration = Duration::from_secs(30);

/// Counts each effect of the two-effect handler.
#[derive(Clone, Default)]
struct Effects {
    a: Arc<AtomicUsize>,
    b: Arc<AtomicUsize>,
}

impl Effects {
    fn counts(&self) -> (usize, usize) {
        (self.a.load(SeqCst), self.b.load(SeqCst))
    }
}

/// `POST /orders`: await, effect A, await, effect B, await, `201 {"run":n}`.
fn app(layer: IdempotencyLayer, effects: &Effects, step: Duration) -> Router {
    let effects = effects.clone();
    let handler = move || {
        let effects = effects.clone();
        async move {
            sleep(step).await;
            let run = effects.a.fetch_add(1, SeqCst) + 1;
            sleep(step).await;
            effects.b.fetch_add(1, SeqCst);
            sleep(step).await;
            (StatusCode::CREATED, format!(r#"{{"run":{run}}}"#))
        }
    };
    Router::new()
        .route("/orders", post(handler))
        .route_layer(layer)
}

fn order(key: &str) -> Request<Body> {
    let mut req = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(r#"{"sku":"A-1","qty":1}"#))
        .unwrap();
    req.extensions_mut().insert(Scope::new("acme"));
    req
}

/// Status, body and whether it was a replay.
async fn send(app: &Router, key: &str) -> (StatusCode, String, bool) {
    let res = timeout(PATIENCE, app.clone().oneshot(order(key)))
        .await
        .expect("answered in time")
        .unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap(), replayed)
}

/// Sends, and hangs up after `after` (the future is dropped, as a server drops
/// it when the connection closes).
async fn hang_up(app: &Router, key: &str, after: Duration) {
    let cut = timeout(after, app.clone().oneshot(order(key))).await;
    assert!(cut.is_err(), "the caller hung up before the answer");
}

async fn idle(in_flight: &InFlight) {
    timeout(PATIENCE, in_flight.idle())
        .await
        .expect("handlers end");
}

/// Every await of the handler: before A, between A and B, after B.
fn cut_points(step: Duration) -> [Duration; 3] {
    [step / 2, step + step / 2, step * 2 + step / 2]
}

#[tokio::test]
async fn a_caller_hanging_up_at_any_await_never_repeats_an_effect() {
    for (i, cut) in cut_points(STEP).into_iter().enumerate() {
        let effects = Effects::default();
        let layer = IdempotencyLayer::new(MemoryStore::new());
        let in_flight = layer.in_flight();
        let app = app(layer, &effects, STEP);
        let key = format!("order-cut-{i}");
        hang_up(&app, &key, cut).await;
        // The retry comes at once: it waits for the first run and replays it.
        let (status, body, replayed) = send(&app, &key).await;
        assert_eq!(
            (status, body.as_str(), replayed),
            (StatusCode::CREATED, r#"{"run":1}"#, true)
        );
        idle(&in_flight).await;
        assert_eq!(effects.counts(), (1, 1), "cut at {cut:?}");
        // A later retry, after the handler ended, replays too.
        assert!(send(&app, &key).await.2);
    }
}

#[tokio::test]
async fn an_outer_timeout_answers_the_caller_and_the_handler_finishes() {
    use tower_http::timeout::TimeoutLayer;
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let in_flight = layer.in_flight();
    // The recommended order: the timeout outside, bounding the caller's wait.
    let app = app(layer, &effects, STEP).layer(TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        STEP + STEP / 2,
    ));
    let (status, _, _) = send(&app, "order-timeout-1").await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    idle(&in_flight).await;
    assert_eq!(effects.counts(), (1, 1));
    let (status, body, replayed) = send(&app, "order-timeout-1").await;
    assert_eq!(
        (status, body.as_str(), replayed),
        (StatusCode::CREATED, r#"{"run":1}"#, true)
    );
    assert_eq!(effects.counts(), (1, 1));
}

/// The opt-out keeps plain tower semantics: a cut between A and B frees the
/// key, and the retry does A again.
#[tokio::test]
async fn with_cancel_on_drop_a_cut_handler_runs_again() {
    let effects = Effects::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_cancel_on_drop(true);
    let in_flight = layer.in_flight();
    let app = app(layer, &effects, STEP);
    hang_up(&app, "order-cancel-1", STEP + STEP / 2).await;
    assert_eq!(in_flight.count(), 0, "nothing runs on");
    assert_eq!(effects.counts(), (1, 0), "cut between A and B");
    sleep(Duration::from_millis(50)).await; // the release is spawned
    let (status, body, replayed) = send(&app, "order-cancel-1").await;
    assert_eq!(
        (status, body.as_str(), replayed),
        (StatusCode::CREATED, r#"{"run":2}"#, false)
    );
    assert_eq!(effects.counts(), (2, 1));
}

#[tokio::test]
async fn a_panicking_detached_handler_answers_500_and_frees_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let in_flight = layer.in_flight();
    let handler = {
        let runs = runs.clone();
        move || async move {
            if runs.fetch_add(1, SeqCst) == 0 {
                sleep(STEP).await;
                panic!("the payment client panicked");
            }
            (StatusCode::CREATED, "second run")
        }
    };
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer);
    // A duplicate waits on the first run; both learn of the panic.
    let (first, waiter) = tokio::join!(send(&app, "order-panic-1"), async {
        sleep(STEP / 3).await;
        send(&app, "order-panic-1").await
    });
    assert_eq!(first.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(first.1.contains("internal_error"), "{}", first.1);
    // The key was freed: the waiter ran the handler itself (and only it).
    assert_eq!(
        (waiter.0, waiter.1.as_str()),
        (StatusCode::CREATED, "second run")
    );
    idle(&in_flight).await;
    assert_eq!(runs.load(SeqCst), 2);
}

/// The lock timeout bounds only how long a dead owner blocks its key: a live
/// handler three times slower keeps its claim, and a retry waits for it.
#[tokio::test]
async fn a_handler_slower_than_the_lock_timeout_is_never_doubled() {
    let effects = Effects::default();
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(200))
        .build();
    let layer = IdempotencyLayer::new(store.clone());
    let app = app(layer, &effects, Duration::from_millis(200)); // 600 ms in all
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "order-slow-1").await }
    });
    sleep(Duration::from_millis(350)).await; // past the lock timeout
    let retry = send(&app, "order-slow-1").await;
    let first = first.await.unwrap();
    assert_eq!((first.0, first.2), (StatusCode::CREATED, false));
    assert_eq!(
        (retry.0, retry.1.as_str(), retry.2),
        (StatusCode::CREATED, r#"{"run":1}"#, true)
    );
    assert_eq!(effects.counts(), (1, 1));
}

/// A heartbeat that finds its claim gone (here: erased by `purge_scope`) does
/// not record the handler's answer as the key's.
#[tokio::test]
async fn a_claim_lost_while_running_is_not_recorded() {
    let effects = Effects::default();
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(90))
        .build();
    let app = app(IdempotencyLayer::new(store.clone()), &effects, STEP);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "order-lost-1").await }
    });
    sleep(STEP / 2).await;
    assert_eq!(store.purge_scope(&Scope::new("acme")).await.unwrap(), 1);
    let first = first.await.unwrap();
    assert_eq!(
        first.0,
        StatusCode::CREATED,
        "the caller still gets its answer"
    );
    assert!(store.is_empty(), "nothing recorded for a lost claim");
}

/// Extreme durations never become a panic, a failed completion or a re-run:
/// `Duration::MAX` means "forever" (100 years), zero locks are 100 ms.
#[tokio::test]
async fn extreme_durations_neither_panic_nor_run_twice() {
    let effects = Effects::default();
    let store = MemoryStore::builder()
        .with_retention(Duration::MAX)
        .with_lock_timeout(Duration::ZERO)
        .build();
    assert_eq!(store.timings().lock_timeout, Duration::from_millis(100));
    let layer = IdempotencyLayer::new(store)
        .with_wait_timeout(Duration::MAX)
        .with_body_timeout(Duration::MAX)
        .with_retry_after(Duration::MAX);
    let app = app(layer, &effects, STEP);
    // A duplicate waits as long as the first runs (it is kept alive past the
    // 100 ms lock), then replays; nothing ran twice.
    let (first, second) = tokio::join!(send(&app, "order-extreme-1"), async {
        sleep(STEP / 2).await;
        send(&app, "order-extreme-1").await
    });
    assert_eq!((first.0, first.2), (StatusCode::CREATED, false));
    assert_eq!(
        (second.0, &second.1, second.2),
        (StatusCode::CREATED, &first.1, true)
    );
    assert_eq!(effects.counts(), (1, 1));
}

/// Load shedding: with `with_max_in_flight(2)`, a third key claimed while two
/// handlers run is `503 overloaded` with `Retry-After`, its handler never
/// starts and its key is free; replays are served under the cap, and the shed
/// key runs once when retried later.
#[tokio::test]
async fn over_the_in_flight_cap_a_claim_is_shed_before_its_handler_and_its_key_freed() {
    let effects = Effects::default();
    let layer =
        IdempotencyLayer::new(MemoryStore::new()).with_max_in_flight(NonZeroUsize::new(2).unwrap());
    let in_flight = layer.in_flight();
    let app = app(layer, &effects, STEP);
    // A completed request, to replay while the cap is reached.
    assert_eq!(send(&app, "order-shed-done").await.0, StatusCode::CREATED);
    let slow: Vec<_> = ["order-shed-slow-1", "order-shed-slow-2"]
        .into_iter()
        .map(|key| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, key).await })
        })
        .collect();
    while in_flight.count() < 2 {
        sleep(Duration::from_millis(5)).await;
    }
    let res = app
        .clone()
        .oneshot(order("order-shed-third"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "1");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains(r#""code":"overloaded""#));
    let (status, _, replayed) = send(&app, "order-shed-done").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, true));
    for task in slow {
        assert_eq!(task.await.unwrap().0, StatusCode::CREATED);
    }
    assert_eq!(effects.counts(), (3, 3), "the shed handler never started");
    // The shed key was released, not left in progress: it runs now, once.
    let (status, _, replayed) = send(&app, "order-shed-third").await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    assert!(send(&app, "order-shed-third").await.2, "replayed");
    assert_eq!(effects.counts(), (4, 4));
    assert_eq!(in_flight.count(), 0);
}

/// The issue a global capacity alone has: one tenant's fresh keys fill the
/// store. With a per-scope quota that tenant gets `429` and the others `201`.
#[tokio::test]
async fn a_tenant_flooding_fresh_keys_gets_429_and_the_others_keep_working() {
    let effects = Effects::default();
    let store = MemoryStore::builder()
        .with_capacity(NonZeroUsize::new(1_000).unwrap())
        .with_scope_quota(NonZeroUsize::new(100).unwrap())
        .build();
    let app = app(IdempotencyLayer::new(store), &effects, Duration::ZERO);
    let tenant = |key: String, scope: &str| {
        let mut req = order(&key);
        req.extensions_mut().insert(Scope::new(scope));
        req
    };
    let mut refused = 0;
    for i in 0..150 {
        let res = app
            .clone()
            .oneshot(tenant(format!("flood-key-{i:06}"), "noisy"))
            .await
            .unwrap();
        match res.status() {
            StatusCode::CREATED => {}
            StatusCode::TOO_MANY_REQUESTS => {
                let body = res.into_body().collect().await.unwrap().to_bytes();
                assert!(String::from_utf8_lossy(&body).contains("idempotency_quota_exceeded"));
                refused += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(refused, 50);
    assert_eq!(effects.counts(), (100, 100), "refused requests never ran");
    for i in 0..100 {
        let res = app
            .clone()
            .oneshot(tenant(format!("quiet-key-{i:06}"), "quiet"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    // The noisy tenant's own keys still replay.
    let res = app
        .clone()
        .oneshot(tenant("flood-key-000000".into(), "noisy"))
        .await
        .unwrap();
    assert!(res.headers().contains_key("idempotent-replayed"));
}
