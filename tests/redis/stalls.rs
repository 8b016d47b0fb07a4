//! `RedisStore` (standalone) stalled at every phase of a request: instance
//! A's connection and subscriber go through a proxy that freezes, instance B
//! shares the keyspace (the same prefix) directly (see
//! tests/common/stalls.rs). The effect is the handler's run, counted in the
//! test.

use std::sync::Arc;
use tower_idempotency::{IdempotencyLayer, RedisStore};
use tower_idempotency_tests::stalls::{run_phase, Mode, Phase, World, LOCK, OPERATION};
use tower_idempotency_tests::support::proxy::Proxy;
use tower_idempotency_tests::support::redis;

/// A behind a proxy of its own, B direct, under one fresh prefix.
async fn world(url: &str) -> World {
    let target = ([127, 0, 0, 1], redis::port(url)).into();
    let proxy = Arc::new(Proxy::start_half_closing(target).await);
    let prefix = redis::unique_prefix("stall");
    let b_builder = RedisStore::builder()
        .with_prefix(prefix.parse().unwrap())
        .with_lock_timeout(LOCK);
    let a_store = b_builder
        .clone()
        .with_operation_timeout(OPERATION)
        .connect(&format!("redis://127.0.0.1:{}", proxy.port))
        .await
        .expect("connect through the proxy");
    let b_store = b_builder.connect(url).await.expect("connect to Redis");
    let a_waiting = {
        let store = a_store.clone();
        Arc::new(move || store.watched_keys() > 0)
    };
    World {
        proxy,
        a: IdempotencyLayer::new(a_store),
        b: IdempotencyLayer::new(b_store),
        a_waiting,
        effect: None,
    }
}

async fn stall_at(test: &str, phase: Phase) {
    let Some(url) = redis::url(test) else {
        return;
    };
    run_phase("redis", Mode::Plain, phase, || world(&url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_claim_runs_once_and_frees_the_key_within_its_lock() {
    stall_at("redis_stalled_claim", Phase::Claim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_heartbeat_up_to_half_the_lock_is_survived_and_fenced_past_it() {
    stall_at("redis_stalled_heartbeat", Phase::Handler).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_completion_up_to_half_the_lock_is_recorded_once_and_fenced_past_it() {
    stall_at("redis_stalled_completion", Phase::Complete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_waiter_replays_or_refuses_and_never_runs() {
    stall_at("redis_stalled_waiter", Phase::Wait).await;
}
