//! Cancel at every poll on `MemoryStore`: every `Store` method, the layer's
//! claimed path and the engine, each future dropped after every number of
//! polls (tests/common/cancel/driver.rs), with the invariants checked after
//! each cut (tests/common/cancel/store.rs, tests/common/cancel/claimed.rs).
#![cfg(feature = "test-util")]

use bytes::Bytes;
use cases::{Harness, NoProbe};
use claimed::{App, Effects, Operation};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer};
use tower_idempotency::engine::Engine;
use tower_idempotency::{IdempotencyLayer, MemoryStore};
use tower_idempotency_tests::cancel::{claimed, store as cases};
use tower_idempotency_tests::store_cut_tests;

const LOCK: Duration = Duration::from_millis(500);

async fn memory() -> Option<Harness<MemoryStore, NoProbe>> {
    Some(Harness {
        store: MemoryStore::builder().with_lock_timeout(LOCK).build(),
        probe: NoProbe,
        lock: LOCK,
    })
}

store_cut_tests!(memory);

/// Effects counted per key in this process; the handler yields around its
/// effect, so the claimed path has many poll points.
#[derive(Clone, Default)]
struct Counted(Arc<Mutex<HashMap<String, usize>>>);

impl Counted {
    async fn apply(&self, key: String) {
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        *self.0.lock().unwrap().entry(key).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Effects for Counted {
    async fn count(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    async fn violations(&self) -> Vec<String> {
        Vec::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_call_cut_at_every_poll() {
    let effects = Counted::default();
    let layer = IdempotencyLayer::new(MemoryStore::builder().with_lock_timeout(LOCK).build())
        .with_wait_timeout(Duration::ZERO);
    let in_flight = layer.in_flight();
    let handler = {
        let effects = effects.clone();
        service_fn(move |req: Request<Full<Bytes>>| {
            let effects = effects.clone();
            async move {
                let key = req.headers()["idempotency-key"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                effects.apply(key).await;
                let mut response = Response::new(Full::new(Bytes::from_static(b"created")));
                *response.status_mut() = StatusCode::CREATED;
                Ok::<_, Infallible>(response)
            }
        })
    };
    let app: App = BoxCloneService::new(layer.layer(handler));
    claimed::layer("memory layer", app, in_flight, LOCK, effects).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_run_cut_at_every_poll() {
    let effects = Counted::default();
    let engine = Engine::new(MemoryStore::builder().with_lock_timeout(LOCK).build())
        .with_wait_timeout(Duration::ZERO);
    let operation = {
        let effects = effects.clone();
        move |key: String| -> Operation {
            let effects = effects.clone();
            Box::new(move |_| {
                Box::pin(async move {
                    effects.apply(key).await;
                    Ok(Bytes::from_static(b"done"))
                })
            })
        }
    };
    claimed::engine("memory engine", engine, LOCK, operation, effects).await;
}
