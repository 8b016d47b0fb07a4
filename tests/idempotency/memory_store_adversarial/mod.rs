//! Adversarial checks of `MemoryStore` beyond the conformance suite: fencing
//! after takeovers, stale expiry-queue entries, waiters, `len()` accounting on
//! every insertion and removal path, `purge_scope` on the id-keyed map, the
//! packed encoding of odd responses, the per-scope quota, exact digest versus canonical fingerprint,
//! and heavy concurrency.
//!
//! Tests that watch records expire run on tokio's paused clock (deterministic,
//! instant); the concurrency tests run on a multi-thread runtime in real time.

mod accounting;
mod concurrency;
mod digest;
mod fencing;
mod packed;
mod quota;
mod waiters;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Maintenance;
use tower_idempotency::{
    fingerprint::{Fingerprint, RequestFingerprint},
    store::{Begin, FencingToken, RecordKey, Store, StoreError, StoredResponse},
    IdempotencyKey, MemoryStore, Scope,
};

fn record(scope: &str, key: &str) -> RecordKey {
    RecordKey::new(
        Scope::new(scope),
        IdempotencyKey::parse(key.as_bytes()).expect("valid test key"),
    )
}

/// A request whose fingerprint is computed up front.
fn fp(body: &str) -> RequestFingerprint<'static> {
    let key = IdempotencyKey::parse(b"adversarial-key").unwrap();
    Fingerprint::compute(&Method::POST, "/t", &key, "s", None, body.as_bytes()).into()
}

fn body_response(body: impl Into<Bytes>) -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: vec![(
            HeaderName::from_static("content-type"),
            HeaderValue::from_static("text/plain"),
        )],
        body: body.into(),
    }
}

async fn claim(
    store: &MemoryStore,
    key: &RecordKey,
    request: &RequestFingerprint<'_>,
) -> FencingToken {
    match store.begin(key, request).await {
        Ok(Begin::Claimed(Claim { token, .. })) => token,
        other => panic!("expected a claim of {key:?}, got {other:?}"),
    }
}

async fn replayed(
    store: &MemoryStore,
    key: &RecordKey,
    request: &RequestFingerprint<'_>,
) -> Arc<StoredResponse> {
    match store.begin(key, request).await {
        Ok(Begin::Replay(response)) => response,
        other => panic!("expected a replay of {key:?}, got {other:?}"),
    }
}

async fn in_progress(store: &MemoryStore, key: &RecordKey, request: &RequestFingerprint<'_>) {
    match store.begin(key, request).await {
        Ok(Begin::InProgress) => {}
        other => panic!("expected {key:?} in progress, got {other:?}"),
    }
}

async fn mismatch(store: &MemoryStore, key: &RecordKey, request: &RequestFingerprint<'_>) {
    match store.begin(key, request).await {
        Ok(Begin::KeyReused) => {}
        other => panic!("expected a mismatch on {key:?}, got {other:?}"),
    }
}

fn claim_lost(result: Result<(), StoreError>) {
    assert!(
        matches!(result, Err(StoreError::ClaimLost)),
        "expected ClaimLost, got {result:?}"
    );
}

/// Spawns a waiter with a long timeout and reports how long it waited.
fn spawn_waiter(
    store: &MemoryStore,
    key: &RecordKey,
    timeout: Duration,
) -> tokio::task::JoinHandle<Duration> {
    let (store, key) = (store.clone(), key.clone());
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        store.wait(&key, timeout).await.unwrap();
        start.elapsed()
    })
}

async fn woken(waiter: tokio::task::JoinHandle<Duration>, what: &str) {
    let waited = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not woken by {what}"))
        .unwrap();
    assert!(
        waited < Duration::from_secs(5),
        "woken late by {what}: {waited:?}"
    );
}

/// Removes everything left and checks `len()` matched what was removed.
async fn drain_and_check(store: &MemoryStore, scopes: &[&str]) {
    let before = store.len();
    let mut removed = 0;
    for scope in scopes {
        removed += store.purge_scope(&Scope::new(*scope)).await.unwrap() as usize;
    }
    assert_eq!(removed, before, "len() drifted from the records held");
    assert_eq!(store.len(), 0);
    assert!(store.is_empty());
}
