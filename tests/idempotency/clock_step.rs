//! The store's clock steps forward past a running claim's lock while its
//! keep-alive is between two extensions. `MemoryStore` reads tokio's clock;
//! blocking the runtime's only thread for longer than the lock moves that
//! clock forward while nothing else runs, which is such a step as every
//! task sees it. The claim is then expired, and what follows is a race
//! between its keep-alive's next extension and the next `begin` of its key:
//! whichever the store sees first decides.

use axum::body::Body;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};
use tower_idempotency::body::ResponseBody;
use tower_idempotency::{engine::Attempt, IdempotencyLayer, MemoryStore, Scope};

const LOCK: Duration = Duration::from_millis(300);
const STEP: Duration = Duration::from_millis(900);

fn order() -> Request<Body> {
    let mut request = Request::post("/orders")
        .header("idempotency-key", "order-key-0001")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"item":"book"}"#))
        .unwrap();
    request.extensions_mut().insert(Scope::new("tenant"));
    request
}

async fn read(response: Response<ResponseBody<Body>>) -> (StatusCode, bool, String) {
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The first run waits on a gate, so its keep-alive runs; later runs answer
/// at once. Each run's attempt is kept.
struct World {
    service: BoxCloneService<Request<Body>, Response<ResponseBody<Body>>, Infallible>,
    runs: Arc<Mutex<Vec<Attempt>>>,
    started: Arc<Notify>,
    gate: watch::Sender<bool>,
}

fn world() -> World {
    let store = MemoryStore::builder().with_lock_timeout(LOCK).build();
    let runs: Arc<Mutex<Vec<Attempt>>> = Arc::default();
    let started = Arc::new(Notify::new());
    let (gate, opened) = watch::channel(false);
    let inner = {
        let (runs, started) = (runs.clone(), started.clone());
        tower::service_fn(move |req: Request<Body>| {
            let attempt = *req.extensions().get::<Attempt>().expect("claimed");
            let n = {
                let mut runs = runs.lock().unwrap();
                runs.push(attempt);
                runs.len() - 1
            };
            let (started, mut opened) = (started.clone(), opened.clone());
            async move {
                if n == 0 {
                    started.notify_one();
                    opened.wait_for(|open| *open).await.unwrap();
                }
                let body = Body::from(format!("effect {n}"));
                Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
            }
        })
    };
    let service = IdempotencyLayer::new(store)
        .with_wait_timeout(Duration::from_millis(20))
        .layer(inner);
    World {
        service: BoxCloneService::new(service),
        runs,
        started,
        gate,
    }
}

/// Starts the first run, and returns once its keep-alive is running.
async fn first_run(world: &World) -> tokio::task::JoinHandle<(StatusCode, bool, String)> {
    let owner = {
        let request = world.service.clone().oneshot(order());
        tokio::spawn(async move { read(request.await.unwrap()).await })
    };
    world.started.notified().await;
    // A healthy beat or two: the keep-alive is a task of its own by now.
    tokio::time::sleep(LOCK / 4).await;
    owner
}

/// The keep-alive runs first after the step: its extension lands (the
/// claim's token still holds the key, though its lock ran out), and the
/// retry finds the key in progress. One run; every answer is its own.
#[tokio::test]
async fn a_step_past_the_lock_with_the_keep_alive_first_keeps_the_claim() {
    let world = world();
    let owner = first_run(&world).await;
    std::thread::sleep(STEP);
    // Yielding: the overdue extension is sent before anything else.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, _, body) = read(world.service.clone().oneshot(order()).await.unwrap()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    world.gate.send_replace(true);
    assert_eq!(
        owner.await.unwrap(),
        (StatusCode::CREATED, false, "effect 0".into())
    );
    let retry = read(world.service.clone().oneshot(order()).await.unwrap()).await;
    assert_eq!(retry, (StatusCode::CREATED, true, "effect 0".into()));
    assert_eq!(world.runs.lock().unwrap().len(), 1);
}

/// A retry's `begin` reaches the store first after the step: it takes the
/// claim over (its handler is told, with the owner's token) and its answer
/// is the record. The owner's keep-alive and completion are fenced, so its
/// run never replaces that record; its caller still gets its own run's
/// answer, which retries will not see again.
#[tokio::test]
async fn a_step_past_the_lock_with_a_retry_first_is_a_fenced_takeover() {
    let world = world();
    let owner = first_run(&world).await;
    std::thread::sleep(STEP);
    // Polled here, before the runtime runs anything else: its `begin` is
    // the first thing the store sees after the step.
    let mut retry = Box::pin(world.service.clone().oneshot(order()));
    let first_poll = std::future::poll_fn(|cx| Poll::Ready(retry.as_mut().poll(cx))).await;
    let answered = match first_poll {
        Poll::Ready(answered) => answered,
        Poll::Pending => retry.await,
    };
    let retry = read(answered.unwrap()).await;
    assert_eq!(retry, (StatusCode::CREATED, false, "effect 1".into()));
    let runs = world.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 2);
    assert!(runs[1].is_takeover(), "{runs:?}");
    assert_eq!(runs[1].previous_token(), Some(runs[0].token()));
    // The owner's keep-alive finds its claim gone; then its run ends.
    tokio::time::sleep(LOCK / 4).await;
    world.gate.send_replace(true);
    let owner = owner.await.unwrap();
    assert_eq!(owner, (StatusCode::CREATED, false, "effect 0".into()));
    // The record is the takeover's: the owner's late completion was refused.
    for _ in 0..3 {
        let again = read(world.service.clone().oneshot(order()).await.unwrap()).await;
        assert_eq!(again, (StatusCode::CREATED, true, "effect 1".into()));
    }
}
