//! A running claim on a standalone `RedisStore` survives a stall of the
//! owner's connection of up to nine tenths of its lock, beginning as an
//! extension is sent.

use std::time::Duration;
use tower_idempotency::RedisStore;
use tower_idempotency_tests::keep_alive;
use tower_idempotency_tests::support::proxy::{Proxy, StallState};
use tower_idempotency_tests::support::redis as r;

const LOCK: Duration = Duration::from_secs(2);

/// The owner's store through a proxy that stalls for `fraction` of the lock;
/// the competitor's under the same prefix, direct.
async fn stall(fraction: f64, test: &str) {
    let Some(url) = r::url(test) else {
        return;
    };
    let proxy = Proxy::start(format!("127.0.0.1:{}", r::port(&url)).parse().unwrap()).await;
    let prefix = r::unique_prefix("keep-alive");
    let connect = |url: String| {
        let prefix = prefix.clone();
        async move {
            RedisStore::builder()
                .with_prefix(prefix.parse().unwrap())
                .with_lock_timeout(LOCK)
                .connect(&url)
                .await
                .expect("connect to Redis")
        }
    };
    let owner = connect(format!("redis://127.0.0.1:{}", proxy.port)).await;
    let competitor = connect(url).await;
    keep_alive::a_stall_of_the_owners_store_keeps_its_claim(
        owner,
        competitor,
        fraction,
        |duration| proxy.freeze_at_next_request(duration),
        || proxy.stall_state() == StallState::Ended,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_three_tenths_of_the_lock_keeps_the_claim() {
    stall(0.3, "keep_alive_redis::three_tenths").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_half_the_lock_keeps_the_claim() {
    stall(0.5, "keep_alive_redis::half").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_seven_tenths_of_the_lock_keeps_the_claim() {
    stall(0.7, "keep_alive_redis::seven_tenths").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_nine_tenths_of_the_lock_keeps_the_claim() {
    stall(0.9, "keep_alive_redis::nine_tenths").await;
}
