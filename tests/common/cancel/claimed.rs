//! The layer's and the engine's claimed paths cut at every poll, over any
//! store: once the cut's background work settles, the handler's effect
//! exists at most once, and a retry replays it or runs it, so that it
//! happened exactly once in all, for each binary that has a store to run
//! them on; the caller supplies the service (or operation), how to count
//! a key's effects, and the backend's own invariants.
#![allow(dead_code)]

use super::driver::at_every_poll;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::ServiceExt;
use tower_idempotency::engine::{Engine, Identity, Outcome, RunContext};
use tower_idempotency::{body::ResponseBody, IdempotencyKey, InFlight, Scope};

pub type App =
    BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// An engine operation, as the caller builds it for a key.
pub type Operation = Box<dyn FnOnce(RunContext) -> BoxFuture<Result<Bytes, std::io::Error>> + Send>;

/// What the caller knows about its handler's effects and its backend.
pub trait Effects {
    /// How many times the effect of `key` happened (committed).
    fn count(&self, key: &str) -> impl Future<Output = usize>;
    /// The backend's own invariants broken (see `store::Probe`).
    fn violations(&self) -> impl Future<Output = Vec<String>>;
}

pub fn fresh_key() -> String {
    let scope = super::store::fresh_scope();
    format!("order-{}", scope.trim_start_matches("cut-"))
}

fn request(key: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"sku":"A-1"}"#)))
        .unwrap();
    request.extensions_mut().insert(Scope::new("acme"));
    request
}

/// One request through `app`, its body read whole.
async fn send(app: App, key: String) -> (StatusCode, Bytes) {
    let response = app.oneshot(request(&key)).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await;
    (status, body.map(|b| b.to_bytes()).unwrap_or_default())
}

/// After a cut: the handlers it left running finished, the backend is
/// sound, and the effect happened at most once. What broke, if anything.
async fn settle(in_flight: &InFlight, effects: &impl Effects, key: &str) -> Vec<String> {
    let idle = tokio::time::timeout(Duration::from_secs(10), in_flight.idle()).await;
    let mut broken = effects.violations().await;
    if idle.is_err() {
        broken.push("a claimed handler is still running 10 s after the cut".to_owned());
    }
    let count = effects.count(key).await;
    if count > 1 {
        broken.push(format!("the effect happened {count} times"));
    }
    broken
}

/// Retries until the key is not in progress, within the lock and some slack.
async fn retried<T>(
    lock: Duration,
    mut again: impl FnMut() -> BoxFuture<Option<T>>,
) -> Result<T, String> {
    let slack = Duration::from_secs(2);
    let deadline = tokio::time::Instant::now() + lock + slack;
    loop {
        if let Some(answer) = again().await {
            return Ok(answer);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "a retry is still refused as in progress {slack:?} after the lock ran out"
            ));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Fails with everything in `broken` and the retry's failure.
fn assert_sound<T>(what: &str, mut broken: Vec<String>, retry: Result<T, String>) -> T {
    if let Err(stuck) = &retry {
        broken.push(stuck.clone());
    }
    assert!(
        broken.is_empty(),
        "{what}: after the cut:\n  {}",
        broken.join("\n  ")
    );
    retry.unwrap()
}

/// The layer's service future, cut at every poll. `app`'s handler answers
/// `201` after its effect and must be wrapped with a zero wait timeout.
pub async fn layer(
    what: &str,
    app: App,
    in_flight: InFlight,
    lock: Duration,
    effects: impl Effects,
) {
    let (app, in_flight, effects) = (&app, &in_flight, &effects);
    at_every_poll(
        what,
        |_| async {
            let key = fresh_key();
            (send(app.clone(), key.clone()), key)
        },
        |cut, key| async move {
            let what = format!(
                "{what}, cut after {} polls (dropped: {})",
                cut.polls,
                cut.dropped()
            );
            let broken = settle(in_flight, effects, &key).await;
            if let Some((status, body)) = &cut.output {
                assert_eq!(*status, StatusCode::CREATED, "{what}: {body:?}");
                assert_eq!(
                    effects.count(&key).await,
                    1,
                    "{what}: answered without the effect"
                );
            }
            let retry = retried(lock, || {
                let (app, key) = (app.clone(), key.clone());
                Box::pin(async move {
                    let (status, body) = send(app, key).await;
                    (status != StatusCode::CONFLICT).then_some((status, body))
                })
            })
            .await;
            let (status, body) = assert_sound(&what, broken, retry);
            assert_eq!(
                status,
                StatusCode::CREATED,
                "{what}: the retry got {body:?}"
            );
            in_flight.idle().await;
            assert_eq!(effects.count(&key).await, 1, "{what}: after the retry");
        },
    )
    .await;
}

/// `Engine::run_bytes` cut at every poll; `operation(key)` performs the
/// key's effect and returns `b"done"`. The engine must wait zero for a run
/// in progress.
pub async fn engine(
    what: &str,
    engine: Engine,
    lock: Duration,
    operation: impl Fn(String) -> Operation,
    effects: impl Effects,
) {
    let in_flight = engine.in_flight();
    let (engine, operation, effects, in_flight) = (&engine, &operation, &effects, &in_flight);
    let run = move |key: String| {
        let engine = engine.clone();
        let op = operation(key.clone());
        async move {
            let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
            engine
                .run_bytes(&Scope::new("jobs"), &key, Identity::Bytes(b"m"), op)
                .await
        }
    };
    at_every_poll(
        what,
        |_| async {
            let key = fresh_key();
            (run(key.clone()), key)
        },
        |cut, key| async move {
            let what = format!("{what}, cut after {} polls (dropped: {})", cut.polls, cut.dropped());
            let broken = settle(in_flight, effects, &key).await;
            if let Some(outcome) = &cut.output {
                let done = Bytes::from_static(b"done");
                assert!(matches!(outcome, Ok(Outcome::Executed(b)) if *b == done), "{what}: {outcome:?}");
                assert_eq!(effects.count(&key).await, 1, "{what}: answered without the effect");
            }
            let retry = retried(lock, || {
                let again = run(key.clone());
                Box::pin(async move {
                    match again.await {
                        Ok(Outcome::InProgress) => None,
                        other => Some(other),
                    }
                })
            })
            .await;
            let outcome = assert_sound(&what, broken, retry);
            assert!(
                matches!(&outcome, Ok(Outcome::Executed(b) | Outcome::Replayed(b)) if b.as_ref() == b"done"),
                "{what}: the retry got {outcome:?}"
            );
            in_flight.idle().await;
            assert_eq!(effects.count(&key).await, 1, "{what}: after the retry");
        },
    )
    .await;
}
