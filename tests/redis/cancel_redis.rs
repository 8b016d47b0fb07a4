//! Cancel at every poll on `RedisStore` (standalone server): every `Store`
//! method's future dropped after every number of polls
//! (tests/common/cancel/driver.rs), with the checks of
//! tests/common/cancel/store.rs after each cut: on a multiplexed connection
//! a dropped command must not leave its reply to the next caller, nor its key
//! stuck past the lock.
#![cfg(feature = "test-util")]

use std::time::Duration;
use tower_idempotency::RedisStore;
use tower_idempotency_tests::cancel::store::{Harness, NoProbe};
use tower_idempotency_tests::store_cut_tests;
use tower_idempotency_tests::support::redis;

const LOCK: Duration = Duration::from_millis(500);

async fn standalone() -> Option<Harness<RedisStore, NoProbe>> {
    let url = redis::url("cancel_redis")?;
    let store = redis::standalone(&url, |s| s.with_lock_timeout(LOCK)).await;
    Some(Harness {
        store,
        probe: NoProbe,
        lock: LOCK,
    })
}

store_cut_tests!(standalone);

/// Every fault at every poll (tests/common/faults.rs) on Redis: a panic,
/// then an error, at each poll of the handler, the response body (whole and
/// trickled) and every store call, on the layer and the engine.
mod every_fault {
    use super::{standalone, LOCK};
    use tower_idempotency_tests::faults::{at_every_poll, engine_run, layer_run};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn layer_every_fault_at_every_poll() {
        let Some(h) = standalone().await else { return };
        for trickled in [false, true] {
            let what = format!("redis layer (trickled {trickled})");
            at_every_poll(&what, |plan, what| {
                let store = h.store.clone();
                async move { layer_run(&what, store, plan, trickled, LOCK).await }
            })
            .await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engine_every_fault_at_every_poll() {
        let Some(h) = standalone().await else { return };
        at_every_poll("redis engine", |plan, what| {
            let store = h.store.clone();
            async move { engine_run(&what, store, plan, LOCK).await }
        })
        .await;
    }
}
