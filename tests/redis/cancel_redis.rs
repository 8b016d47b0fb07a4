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
