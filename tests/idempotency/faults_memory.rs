//! Every fault at every poll on `MemoryStore` (tests/common/faults.rs): a
//! panic, then an error, injected at each poll of the claimed path — the
//! handler, the response body (whole, and trickled so that the layer records
//! it in a task of its own) and every store call — of the layer and of the
//! engine, each followed by the promise's checks.
#![cfg(feature = "test-util")]

use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency_tests::faults::{at_every_poll, engine_run, layer_run};

const LOCK: Duration = Duration::from_millis(400);

fn store() -> MemoryStore {
    MemoryStore::builder().with_lock_timeout(LOCK).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_whole_body_every_fault_at_every_poll() {
    at_every_poll("memory layer, whole body", |plan, what| async move {
        layer_run(&what, store(), plan, false, LOCK).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_trickled_body_every_fault_at_every_poll() {
    at_every_poll("memory layer, trickled body", |plan, what| async move {
        layer_run(&what, store(), plan, true, LOCK).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_every_fault_at_every_poll() {
    at_every_poll("memory engine", |plan, what| async move {
        engine_run(&what, store(), plan, LOCK).await
    })
    .await;
}
