//! Recovery points through both doors: a handler (and an engine operation)
//! of three phases whose first run stops after phase 2 — an error, a panic,
//! a stall past its lock — is finished by the retry, which runs phase 3
//! only, and answers what an uninterrupted run answers.

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_idempotency::engine::{Engine, EngineError, Identity, Outcome, PhaseError, Phases};
use tower_idempotency::store::StoreError;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, Scope};

const LOCK: Duration = Duration::from_millis(300);

/// How the first run stops after phase 2.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    Never,
    Error,
    Panic,
    /// Blocks its thread past the lock: nothing extends its claim. On
    /// `MemoryStore` every phase before it is ready at its first poll, so
    /// the handler never waited and its heartbeat never started.
    Stall,
}

/// How many times each phase's body ran, and how the next run stops.
#[derive(Default)]
struct Checkout {
    runs: [AtomicUsize; 3],
    stop_next: std::sync::Mutex<Option<Stop>>,
    stalled: Notify,
}

impl Checkout {
    fn stopping(stop: Stop) -> Arc<Self> {
        let checkout = Arc::new(Checkout::default());
        *checkout.stop_next.lock().unwrap() = Some(stop);
        checkout
    }

    fn runs(&self) -> [usize; 3] {
        [0, 1, 2].map(|i| self.runs[i].load(Ordering::SeqCst))
    }

    /// Each phase's output names how often its body ran: a phase run again
    /// would change the answer.
    fn ran(&self, phase: usize) -> usize {
        self.runs[phase].fetch_add(1, Ordering::SeqCst) + 1
    }

    async fn run(self: Arc<Self>, phases: Phases) -> Result<String, PhaseError<String>> {
        let this = &*self;
        let stop = this.stop_next.lock().unwrap().take().unwrap_or(Stop::Never);
        let order: String = phases
            .run("create_order", || async {
                Ok::<_, String>(format!("order-{}", this.ran(0)))
            })
            .await?;
        let charge: String = phases
            .foreign("charge", |key| async move {
                Ok::<_, String>(format!("charge-{}-{}", this.ran(1), &key.as_str()[..12]))
            })
            .await?;
        match stop {
            Stop::Never => {}
            Stop::Error => return Err(PhaseError::Phase("stopped after phase 2".into())),
            Stop::Panic => panic!("stopped after phase 2"),
            Stop::Stall => {
                this.stalled.notify_one();
                std::thread::sleep(LOCK * 4);
            }
        }
        let receipt: String = phases
            .run("send_receipt", || async {
                Ok::<_, String>(format!("receipt-{}", this.ran(2)))
            })
            .await?;
        Ok(format!("{order} {charge} {receipt}"))
    }
}

fn checkout_request(key: &str) -> Request<Body> {
    let mut request = Request::post("/checkout")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"cart":7}"#))
        .unwrap();
    request.extensions_mut().insert(Scope::new("shop"));
    request
}

fn app(checkout: Arc<Checkout>, store: MemoryStore) -> Router {
    let handler = move |Extension(phases): Extension<Phases>| {
        let checkout = checkout.clone();
        async move {
            match checkout.run(phases).await {
                Ok(answer) => (StatusCode::CREATED, answer),
                Err(PhaseError::Store(StoreError::ClaimLost)) => {
                    (StatusCode::CONFLICT, "claim lost".to_owned())
                }
                // Not recorded: the key is released for the retry.
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            }
        }
    };
    Router::new()
        .route("/checkout", post(handler))
        .layer(IdempotencyLayer::phased(store))
}

async fn send(app: &Router, key: &str) -> (StatusCode, String) {
    let response = app.clone().oneshot(checkout_request(key)).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

const KEY: &str = "checkout-000001";

/// What a run that nothing interrupts answers.
async fn uninterrupted() -> String {
    let checkout = Arc::new(Checkout::default());
    let (status, body) = send(&app(checkout.clone(), MemoryStore::new()), KEY).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(checkout.runs(), [1, 1, 1]);
    body
}

async fn a_retry_finishes_the_run(stop: Stop) {
    let checkout = Checkout::stopping(stop);
    let app = app(checkout.clone(), MemoryStore::new());
    let (status, _) = send(&app, KEY).await;
    assert_ne!(
        status,
        StatusCode::CREATED,
        "{stop:?}: the first run stopped"
    );
    assert_eq!(checkout.runs(), [1, 1, 0]);

    let (status, body) = send(&app, KEY).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(checkout.runs(), [1, 1, 1], "phases 1 and 2 not run again");
    assert_eq!(body, uninterrupted().await);

    // Recorded now: replayed, nothing runs.
    assert_eq!(send(&app, KEY).await, (StatusCode::CREATED, body));
    assert_eq!(checkout.runs(), [1, 1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_failed_handler_resumes_after_phase_two() {
    a_retry_finishes_the_run(Stop::Error).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_panicked_handler_resumes_after_phase_two() {
    a_retry_finishes_the_run(Stop::Panic).await;
}

/// The first run stalls past its lock after phase 2; the retry takes the
/// claim over, runs phase 3 only and answers. The stalled run then wakes
/// and tries phase 3: its record is refused (its token lost the claim),
/// and the retry's answer stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_resumes_after_phase_two_and_the_stale_owner_is_refused() {
    let checkout = Checkout::stopping(Stop::Stall);
    let app = app(
        checkout.clone(),
        MemoryStore::builder().with_lock_timeout(LOCK).build(),
    );
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, KEY).await }
    });
    checkout.stalled.notified().await;
    tokio::time::sleep(LOCK + Duration::from_millis(200)).await;

    let (status, body) = send(&app, KEY).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(checkout.runs(), [1, 1, 1], "phases 1 and 2 not run again");
    assert_eq!(body, uninterrupted().await);

    let (stale_status, stale_body) = first.await.unwrap();
    assert_eq!(
        (stale_status, stale_body.as_str()),
        (StatusCode::CONFLICT, "claim lost")
    );
    assert_eq!(send(&app, KEY).await, (StatusCode::CREATED, body));
}

/// A layer built with `new` gives handlers no `Phases`: the extractor
/// refuses (axum answers 500), and nothing runs.
#[tokio::test]
async fn only_a_phased_layer_gives_handlers_phases() {
    let app = Router::new()
        .route(
            "/checkout",
            post(|Extension(_): Extension<Phases>| async { StatusCode::CREATED }),
        )
        .layer(IdempotencyLayer::new(MemoryStore::new()));
    let response = app.oneshot(checkout_request(KEY)).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

// ---- The engine ------------------------------------------------------------

async fn operation(
    engine: &Engine,
    checkout: &Arc<Checkout>,
) -> Result<Outcome<String>, EngineError<String>> {
    let (scope, key) = (
        Scope::new("shop"),
        IdempotencyKey::parse(KEY.as_bytes()).unwrap(),
    );
    let checkout = checkout.clone();
    let run = move |context: tower_idempotency::engine::RunContext| async move {
        let phases = context.phases().expect("a phased engine");
        checkout.run(phases).await.map_err(|e| e.to_string())
    };
    engine
        .run(&scope, &key, Identity::Bytes(b"cart 7"), run)
        .await
}

async fn an_engine_retry_finishes_the_run(stop: Stop) {
    let uninterrupted = {
        let checkout = Arc::new(Checkout::default());
        let engine = Engine::phased(MemoryStore::new());
        match operation(&engine, &checkout).await.unwrap() {
            Outcome::Executed(answer) => answer,
            other => panic!("{other:?}"),
        }
    };
    let checkout = Checkout::stopping(stop);
    let engine = Engine::phased(MemoryStore::new());
    let first = operation(&engine, &checkout).await;
    assert!(first.is_err(), "{stop:?}: {first:?}");
    assert_eq!(checkout.runs(), [1, 1, 0]);

    let retry = operation(&engine, &checkout).await.unwrap();
    assert_eq!(retry, Outcome::Executed(uninterrupted.clone()));
    assert_eq!(checkout.runs(), [1, 1, 1], "phases 1 and 2 not run again");
    let replay = operation(&engine, &checkout).await.unwrap();
    assert_eq!(replay, Outcome::Replayed(uninterrupted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_retry_after_a_failed_operation_resumes_after_phase_two() {
    an_engine_retry_finishes_the_run(Stop::Error).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_retry_after_a_panicked_operation_resumes_after_phase_two() {
    an_engine_retry_finishes_the_run(Stop::Panic).await;
}

/// The memory store's capacity bounds its requests with recovery points:
/// requests that record a phase and are released (nobody retries them)
/// fill it, a new request's first phase is refused as the store is full,
/// and the phases of a request already recorded are still served.
#[tokio::test]
async fn memory_phases_are_bounded_by_the_store_capacity() {
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::{
        Begin, MemoryStoreError, PhaseRecord, PhaseStore, RecordKey, Store,
    };

    let store = MemoryStore::builder()
        .with_capacity(std::num::NonZeroUsize::new(2).unwrap())
        .build();
    let fp = Fingerprint::from_bytes([4; 32]).into();
    let key = |n: u32| {
        RecordKey::new(
            Scope::new("acme"),
            IdempotencyKey::parse(format!("order-{n:04}").as_bytes()).unwrap(),
        )
    };
    for n in 0..3 {
        let Ok(Begin::Claimed(claim)) = store.begin(&key(n), &fp).await else {
            panic!("a fresh key is claimed");
        };
        let recorded = store
            .record_phase(
                &key(n),
                claim.token,
                "charge",
                bytes::Bytes::from_static(b"1"),
            )
            .await;
        match n {
            0 | 1 => assert_eq!(recorded.unwrap(), PhaseRecord::Recorded),
            _ => assert!(
                matches!(&recorded, Err(StoreError::Backend(e))
                    if matches!(e.downcast_ref(), Some(MemoryStoreError::Full))),
                "{recorded:?}"
            ),
        }
        store.release(&key(n), claim.token).await.unwrap();
    }
    // The first request's retry still finds its phase.
    let Ok(Begin::Claimed(retry)) = store.begin(&key(0), &fp).await else {
        panic!("the released key is claimed again");
    };
    assert_eq!(
        store
            .phases(&key(0), retry.token)
            .await
            .unwrap()
            .get("charge"),
        Some(&bytes::Bytes::from_static(b"1"))
    );
}
