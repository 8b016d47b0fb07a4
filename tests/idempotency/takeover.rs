//! Takeover-aware handlers: a handler that runs after a takeover finds an
//! `Attempt` in its request saying so, and naming the owner it replaced, so it
//! can reconcile what that owner may have done before acting.

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::{engine::Attempt, IdempotencyLayer, MemoryStore, Scope};

const LOCK: Duration = Duration::from_millis(300);

fn charge(key: &str) -> Request<Body> {
    let mut request = Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"order":42,"cents":1000}"#))
        .unwrap();
    request.extensions_mut().insert(Scope::new("acme"));
    request
}

/// The first run blocks its thread before it ever waits (so nothing extends
/// its claim: a stalled owner), past its lock; the retry takes the key over,
/// and its handler sees attempt 2 and the first run's token. The first run's
/// late completion is fenced: later retries replay the second run's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_after_a_takeover_sees_attempt_two_and_the_previous_token() {
    let store = MemoryStore::builder().with_lock_timeout(LOCK).build();
    let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let stalled = Arc::new(Notify::new());
    let handler = {
        let (seen, stalled) = (seen.clone(), stalled.clone());
        move |Extension(attempt): Extension<Attempt>| {
            seen.lock().unwrap().push(attempt);
            if !attempt.is_takeover() {
                stalled.notify_one();
                std::thread::sleep(LOCK * 3);
            }
            async move { (StatusCode::CREATED, format!("attempt {}", attempt.number())) }
        }
    };
    let app = Router::new()
        .route("/charges", post(handler))
        .layer(IdempotencyLayer::new(store));

    let before = SystemTime::now();
    let first = tokio::spawn(app.clone().oneshot(charge("charge-00000001")));
    stalled.notified().await;
    tokio::time::sleep(LOCK + Duration::from_millis(200)).await;
    let retry = app
        .clone()
        .oneshot(charge("charge-00000001"))
        .await
        .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "attempt 2");

    let attempts = seen.lock().unwrap().clone();
    let [dead, second] = attempts[..] else {
        panic!("two runs, got {attempts:?}");
    };
    assert_eq!((dead.number(), dead.is_takeover()), (1, false));
    assert_eq!((dead.previous_token(), dead.previous_began()), (None, None));
    assert_eq!(second.number(), 2);
    assert!(second.is_takeover());
    assert_eq!(second.previous_token(), Some(dead.token()));
    assert!(second.token() > dead.token());
    let began = second.previous_began().expect("when the first claim began");
    assert!(before <= began && began <= SystemTime::now(), "{began:?}");

    // The stalled run finishes, but its claim is gone: the new owner's answer stands.
    first.await.unwrap().unwrap();
    let replay = app.oneshot(charge("charge-00000001")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let body = replay.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "attempt 2");
    assert_eq!(seen.lock().unwrap().len(), 2, "no third run");
}

/// A run whose claim was released (a response the policy does not record)
/// was not taken over: the next run of the key is a first attempt again.
#[tokio::test]
async fn a_run_after_a_release_is_a_first_attempt() {
    let seen: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        move |Extension(attempt): Extension<Attempt>| async move {
            let mut seen = seen.lock().unwrap();
            seen.push(attempt);
            match seen.len() {
                1 => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::CREATED,
            }
        }
    };
    let app = Router::new()
        .route("/charges", post(handler))
        .layer(IdempotencyLayer::new(MemoryStore::new()));
    for status in [StatusCode::SERVICE_UNAVAILABLE, StatusCode::CREATED] {
        let answer = app
            .clone()
            .oneshot(charge("charge-00000002"))
            .await
            .unwrap();
        assert_eq!(answer.status(), status);
    }
    let attempts = seen.lock().unwrap().clone();
    assert_eq!(attempts.len(), 2);
    for attempt in attempts {
        assert_eq!((attempt.number(), attempt.previous_token()), (1, None));
    }
}
