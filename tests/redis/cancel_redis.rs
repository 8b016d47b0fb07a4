//! Cancel at every poll on `RedisStore` (standalone server): every `Store`
//! method's future dropped after every number of polls
//! (tests/support/cancel.rs), with the checks of tests/cancel_store.rs after
//! each cut: on a multiplexed connection a dropped command must not leave its
//! reply to the next caller, nor its key stuck past the lock.
#![cfg(feature = "test-util")]

#[path = "support/cancel.rs"]
mod driver;

#[path = "cancel_store.rs"]
mod cases;

use crate::support::redis;
use cases::{store_cut_tests, Harness, NoProbe};
use std::time::Duration;
use tower_idempotency::RedisStore;

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

store_cut_tests!(cases, standalone);
