//! A running claim on `PostgresStore` survives a stall of the owner's
//! connections of up to nine tenths of its lock, beginning as an extension
//! is sent, and a handler blocking its thread past the lock.

use std::time::Duration;
use tower_idempotency::PostgresStore;
use tower_idempotency_tests::keep_alive;
use tower_idempotency_tests::support::pg;
use tower_idempotency_tests::support::proxy::{Proxy, StallState};

const LOCK: Duration = Duration::from_secs(2);

/// The owner's store through a proxy that stalls for `fraction` of the lock;
/// the competitor's on the same table, direct.
async fn stall(fraction: f64, test: &str) {
    let Some(url) = pg::database_url(test) else {
        return;
    };
    let table = pg::unique_table("keep_alive");
    let competitor = pg::store(&url, &table, |s| s.with_lock_timeout(LOCK)).await;
    let proxy = Proxy::start(pg::server_addr(&url).await).await;
    let owner = PostgresStore::builder(pg::pool(pg::pg_config_at(&url, proxy.port), 2))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(LOCK)
        .build();
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
    stall(0.3, "keep_alive_pg::three_tenths").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_half_the_lock_keeps_the_claim() {
    stall(0.5, "keep_alive_pg::half").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_seven_tenths_of_the_lock_keeps_the_claim() {
    stall(0.7, "keep_alive_pg::seven_tenths").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_nine_tenths_of_the_lock_keeps_the_claim() {
    stall(0.9, "keep_alive_pg::nine_tenths").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_its_thread_past_its_lock_is_not_taken_over() {
    let Some(url) = pg::database_url("keep_alive_pg::blocking") else {
        return;
    };
    let table = pg::unique_table("keep_alive_blocking");
    let store = pg::store(&url, &table, |s| {
        s.with_lock_timeout(Duration::from_secs(1))
    })
    .await;
    keep_alive::a_handler_blocking_its_thread_keeps_its_claim(store).await;
}
