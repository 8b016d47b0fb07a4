//! Adversarial checks of `MemoryStore` beyond the conformance suite: fencing
//! after takeovers, stale expiry-queue entries, waiters, `len()` accounting on
//! every insertion and removal path, `purge_scope` on the id-keyed map, the
//! packed encoding of odd responses, exact digest versus canonical fingerprint,
//! and heavy concurrency.
//!
//! Tests that watch records expire run on tokio's paused clock (deterministic,
//! instant); the concurrency tests run on a multi-thread runtime in real time.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::{
    Begin, FencingToken, Fingerprint, IdempotencyKey, MemoryStore, RecordKey, RequestFingerprint,
    Scope, Store, StoreError, StoredResponse,
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
        Ok(Begin::Claimed(token)) => token,
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
        Ok(Begin::Mismatch) => {}
        other => panic!("expected a mismatch on {key:?}, got {other:?}"),
    }
}

fn claim_lost(result: Result<(), StoreError>) {
    assert!(
        matches!(result, Err(StoreError::ClaimLost)),
        "expected ClaimLost, got {result:?}"
    );
}

// ---------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------

/// A stale token can neither complete nor release the claim that replaced it,
/// nor touch the record after the new owner completed it.
#[tokio::test(start_paused = true)]
async fn a_stale_token_is_fenced_after_a_takeover() {
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::from_millis(100))
        .with_retention(Duration::from_secs(60));
    let key = record("acme", "fence-00000001");
    let a = fp("a");
    let dead = claim(&store, &key, &a).await;
    tokio::time::advance(Duration::from_millis(150)).await;
    // The takeover may even carry another body: the old lock is dead.
    let fresh = claim(&store, &key, &fp("b")).await;
    assert!(fresh > dead);
    assert_eq!(store.len(), 1, "a takeover replaces, it does not add");

    claim_lost(store.complete(&key, dead, body_response("stale")).await);
    store.release(&key, dead).await.unwrap();
    // The stale release did not free the new claim.
    in_progress(&store, &key, &fp("b")).await;
    mismatch(&store, &key, &a).await;

    store
        .complete(&key, fresh, body_response("fresh"))
        .await
        .unwrap();
    claim_lost(store.complete(&key, dead, body_response("stale")).await);
    claim_lost(store.complete(&key, fresh, body_response("again")).await);
    store.release(&key, dead).await.unwrap();
    // Releasing a completed record (even by its owner) changes nothing.
    store.release(&key, fresh).await.unwrap();
    assert_eq!(replayed(&store, &key, &fp("b")).await.body, "fresh");
    assert_eq!(store.len(), 1);
}

/// After a release, the released token cannot complete; after a re-claim, it
/// cannot complete or release the new claim either.
#[tokio::test]
async fn complete_after_release_is_claim_lost() {
    let store = MemoryStore::new();
    let key = record("acme", "fence-00000002");
    let first = claim(&store, &key, &fp("a")).await;
    store.release(&key, first).await.unwrap();
    assert_eq!(store.len(), 0);
    claim_lost(store.complete(&key, first, body_response("late")).await);
    assert_eq!(store.len(), 0, "a refused completion inserts nothing");
    // The key is free: a fresh claim, not a replay of the refused completion.
    let second = claim(&store, &key, &fp("a")).await;
    claim_lost(store.complete(&key, first, body_response("late")).await);
    store.release(&key, first).await.unwrap();
    in_progress(&store, &key, &fp("a")).await;
    store.release(&key, second).await.unwrap();
    assert_eq!(store.len(), 0);
    // A token of another key never works on this one.
    let other = record("acme", "fence-00000003");
    let other_token = claim(&store, &other, &fp("a")).await;
    let third = claim(&store, &key, &fp("a")).await;
    claim_lost(store.complete(&key, other_token, body_response("x")).await);
    store.release(&key, other_token).await.unwrap();
    in_progress(&store, &key, &fp("a")).await;
    store
        .complete(&key, third, body_response("k"))
        .await
        .unwrap();
    store
        .complete(&other, other_token, body_response("o"))
        .await
        .unwrap();
    assert_eq!(replayed(&store, &key, &fp("a")).await.body, "k");
    assert_eq!(replayed(&store, &other, &fp("a")).await.body, "o");
}

/// Forged tokens around a live one (neighbours, extremes) are all refused.
#[tokio::test]
async fn forged_tokens_are_refused() {
    let store = MemoryStore::new();
    let key = record("acme", "fence-00000004");
    let token = claim(&store, &key, &fp("a")).await;
    for forged in [
        FencingToken(token.0 - 1),
        FencingToken(token.0 + 1),
        FencingToken(0),
        FencingToken(-1),
        FencingToken(i64::MIN),
        FencingToken(i64::MAX),
    ] {
        claim_lost(store.complete(&key, forged, body_response("forged")).await);
        store.release(&key, forged).await.unwrap();
        in_progress(&store, &key, &fp("a")).await;
    }
    store
        .complete(&key, token, body_response("real"))
        .await
        .unwrap();
    assert_eq!(replayed(&store, &key, &fp("a")).await.body, "real");
}

// ---------------------------------------------------------------------------
// The expiry queue
// ---------------------------------------------------------------------------

/// Completes `n` records of `scope` now (their queue entries precede later ones).
async fn complete_fillers(store: &MemoryStore, scope: &str, n: usize) {
    for i in 0..n {
        let key = record(scope, &format!("filler-{i:08}"));
        let token = claim(store, &key, &fp("f")).await;
        store
            .complete(&key, token, body_response("filler"))
            .await
            .unwrap();
    }
}

/// claim -> complete -> expire -> re-claim, while the old completion's queue
/// entry is still queued behind others: when it comes due it must not evict
/// the newer claim (nor, later, the newer completion).
#[tokio::test(start_paused = true)]
async fn a_stale_queue_entry_never_evicts_a_newer_record() {
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_millis(100));
    complete_fillers(&store, "fill", 20).await;
    let key = record("acme", "queue-00000001");
    let old = claim(&store, &key, &fp("a")).await;
    store
        .complete(&key, old, body_response("old"))
        .await
        .unwrap();
    assert_eq!(store.len(), 21);

    tokio::time::advance(Duration::from_millis(150)).await;
    // This begin evicts 8 fillers; the key's own entry is still queued.
    let new = claim(&store, &key, &fp("b")).await;
    assert_eq!(store.len(), 13, "8 fillers evicted, the key taken over");

    // Drain the queue: every remaining due entry is examined, the key's too.
    for i in 0..4 {
        let probe = record("probe", &format!("probe-{i:08}"));
        let token = claim(&store, &probe, &fp("p")).await;
        store.release(&probe, token).await.unwrap();
    }
    assert_eq!(store.len(), 1, "only the new claim is left");
    in_progress(&store, &key, &fp("b")).await;
    mismatch(&store, &key, &fp("a")).await;
    store
        .complete(&key, new, body_response("new"))
        .await
        .unwrap();
    assert_eq!(replayed(&store, &key, &fp("b")).await.body, "new");
    assert_eq!(store.len(), 1);
}

/// The same, with the newer record already completed when the old entry is due.
#[tokio::test(start_paused = true)]
async fn a_stale_queue_entry_never_evicts_a_newer_completion() {
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_millis(100));
    complete_fillers(&store, "fill", 20).await;
    let key = record("acme", "queue-00000002");
    let old = claim(&store, &key, &fp("a")).await;
    store
        .complete(&key, old, body_response("old"))
        .await
        .unwrap();

    tokio::time::advance(Duration::from_millis(150)).await;
    let new = claim(&store, &key, &fp("b")).await;
    store
        .complete(&key, new, body_response("new"))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(10)).await;
    for i in 0..4 {
        let probe = record("probe", &format!("probe-{i:08}"));
        let token = claim(&store, &probe, &fp("p")).await;
        store.release(&probe, token).await.unwrap();
    }
    assert_eq!(store.len(), 1);
    assert_eq!(replayed(&store, &key, &fp("b")).await.body, "new");
    // Its own entry evicts it once it is due.
    tokio::time::advance(Duration::from_millis(100)).await;
    let probe = record("probe", "probe-final1");
    let token = claim(&store, &probe, &fp("p")).await;
    store.release(&probe, token).await.unwrap();
    assert_eq!(store.len(), 0);
    claim(&store, &key, &fp("c")).await;
}

/// A queue entry whose record was removed another way (purge, release of a
/// re-claim) removes nothing and decrements nothing when it comes due.
#[tokio::test(start_paused = true)]
async fn queue_entries_of_removed_records_do_not_decrement_len() {
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::from_secs(10))
        .with_retention(Duration::from_millis(100));
    complete_fillers(&store, "gone", 30).await;
    assert_eq!(store.purge_scope(&Scope::new("gone")).await.unwrap(), 30);
    assert_eq!(store.len(), 0);
    // Three claims that stay in progress while the 30 stale entries come due.
    let keep: Vec<_> = (0..3)
        .map(|i| record("keep", &format!("keep-{i:08}")))
        .collect();
    for key in &keep {
        claim(&store, key, &fp("k")).await;
    }
    tokio::time::advance(Duration::from_millis(200)).await;
    for i in 0..8 {
        let probe = record("probe", &format!("probe-{i:08}"));
        let token = claim(&store, &probe, &fp("p")).await;
        store.release(&probe, token).await.unwrap();
        assert_eq!(store.len(), 3, "stale entries decremented len");
    }
    for key in &keep {
        in_progress(&store, key, &fp("k")).await;
    }
}

// ---------------------------------------------------------------------------
// Waiters
// ---------------------------------------------------------------------------

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_on_purge_scope() {
    let store = MemoryStore::new();
    let key = record("erased", "wait-00000001");
    let token = claim(&store, &key, &fp("a")).await;
    let waiters: Vec<_> = (0..8)
        .map(|_| spawn_waiter(&store, &key, Duration::from_secs(30)))
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.purge_scope(&Scope::new("erased")).await.unwrap(), 1);
    for waiter in waiters {
        woken(waiter, "purge_scope").await;
    }
    claim_lost(store.complete(&key, token, body_response("late")).await);
    assert_eq!(store.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wake_on_a_large_completion_and_on_release() {
    let store = MemoryStore::new();
    let key = record("acme", "wait-00000002");
    let token = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A body too large to pack takes the other completion path.
    store
        .complete(&key, token, body_response(vec![b'x'; 5000]))
        .await
        .unwrap();
    woken(waiter, "a large completion").await;
    assert_eq!(replayed(&store, &key, &fp("a")).await.body.len(), 5000);
    // Not in progress any more: returns at once.
    woken(
        spawn_waiter(&store, &key, Duration::from_secs(30)),
        "nothing (completed key)",
    )
    .await;

    let key = record("acme", "wait-00000003");
    let token = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // A forged release wakes nobody for good: the claim is still there.
    store
        .release(&key, FencingToken(token.0 + 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "woken by a release that did nothing");
    store.release(&key, token).await.unwrap();
    woken(waiter, "the release").await;
}

/// A waiter on an abandoned claim returns at the lock's expiry, well before
/// its own timeout; the takeover then gets a new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_an_abandoned_claim_returns_at_lock_expiry() {
    let store = MemoryStore::new().with_lock_timeout(Duration::from_millis(200));
    let key = record("acme", "wait-00000004");
    let dead = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::from_secs(30));
    woken(waiter, "the lock expiry").await;
    let fresh = claim(&store, &key, &fp("a")).await;
    assert!(fresh > dead);
    // A waiter on the new claim is woken by its completion, not the old one's.
    let waiter = spawn_waiter(&store, &key, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(20)).await;
    claim_lost(store.complete(&key, dead, body_response("late")).await);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "woken by a refused completion");
    store
        .complete(&key, fresh, body_response("ok"))
        .await
        .unwrap();
    woken(waiter, "the new claim's completion").await;
}

/// `wait` with an unbounded timeout is bounded by the claim's lock, and is
/// woken by the completion: it must not overflow computing its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_with_an_unbounded_timeout_does_not_overflow() {
    let store = MemoryStore::new();
    let key = record("acme", "wait-00000005");
    let token = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::MAX);
    tokio::time::sleep(Duration::from_millis(50)).await;
    store
        .complete(&key, token, body_response("ok"))
        .await
        .unwrap();
    woken(waiter, "the completion").await;

    // Unbounded lock and retention saturate rather than overflow.
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::MAX)
        .with_retention(Duration::MAX);
    let token = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::from_millis(100));
    woken(waiter, "its own timeout").await;
    in_progress(&store, &key, &fp("a")).await;
    store
        .complete(&key, token, body_response("ok"))
        .await
        .unwrap();
    assert_eq!(replayed(&store, &key, &fp("a")).await.body, "ok");
}

// ---------------------------------------------------------------------------
// len() accounting
// ---------------------------------------------------------------------------

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

/// Counts every insertion and removal path against a model.
#[tokio::test(start_paused = true)]
async fn len_never_drifts_across_every_path() {
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_secs(2))
        .with_capacity(20);
    let a = |i: usize| record("a", &format!("a-key-{i:08}"));
    let mut tokens = Vec::new();
    for i in 0..10 {
        tokens.push(claim(&store, &a(i), &fp("x")).await);
    }
    assert_eq!(store.len(), 10);
    // Repeated begins add nothing.
    for i in 0..10 {
        in_progress(&store, &a(i), &fp("x")).await;
        mismatch(&store, &a(i), &fp("y")).await;
    }
    assert_eq!(store.len(), 10);
    for (i, &token) in tokens.iter().enumerate().take(5) {
        let body = if i % 2 == 0 {
            Bytes::from_static(b"small")
        } else {
            Bytes::from(vec![b'L'; 2048])
        };
        store
            .complete(&a(i), token, body_response(body))
            .await
            .unwrap();
    }
    assert_eq!(store.len(), 10, "a completion replaces its claim");
    for (i, &token) in tokens.iter().enumerate().take(7).skip(5) {
        store.release(&a(i), token).await.unwrap();
        store.release(&a(i), token).await.unwrap();
    }
    store.release(&a(0), tokens[0]).await.unwrap();
    assert_eq!(
        store.len(),
        8,
        "two releases; repeated and no-op ones count nothing"
    );
    claim_lost(store.complete(&a(5), tokens[5], body_response("x")).await);
    assert_eq!(store.len(), 8);

    // Claims 7..10 are abandoned; records 0..5 completed. Let the claims expire.
    tokio::time::advance(Duration::from_millis(1500)).await;
    // Taking over an expired claim replaces it.
    let t7 = claim(&store, &a(7), &fp("z")).await;
    assert_eq!(store.len(), 8);
    assert_eq!(store.purge_expired().await.unwrap(), 2, "claims 8 and 9");
    assert_eq!(store.len(), 6);
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert_eq!(store.len(), 6);

    // The completions expire (a7's new claim does not, until 2.5 s); a begin
    // evicts them from the queue (8 per call), its own key's first.
    tokio::time::advance(Duration::from_millis(900)).await;
    let t0 = claim(&store, &a(0), &fp("x")).await;
    assert_eq!(
        store.len(),
        2,
        "5 expired completions evicted; 7 and 0 claimed"
    );
    store.complete(&a(7), t7, body_response("7")).await.unwrap();
    store.release(&a(0), t0).await.unwrap();
    assert_eq!(store.len(), 1);

    // Fill up with claims; a full store refuses new keys and counts nothing.
    let b = |i: usize| record("b", &format!("b-key-{i:08}"));
    for i in 0..19 {
        claim(&store, &b(i), &fp("x")).await;
    }
    assert_eq!(store.len(), 20);
    for i in 100..110 {
        assert!(matches!(
            store.begin(&b(i), &fp("x")).await,
            Err(StoreError::CapacityExceeded)
        ));
    }
    assert_eq!(store.len(), 20);
    in_progress(&store, &b(0), &fp("x")).await;
    assert_eq!(replayed(&store, &a(7), &fp("z")).await.body, "7");
    // The claims expire: the sweep of the full store removes all 19.
    tokio::time::advance(Duration::from_millis(1100)).await;
    claim(&store, &b(100), &fp("x")).await;
    assert_eq!(store.len(), 2, "swept 19 claims, kept a(7), added b(100)");
    drain_and_check(&store, &["a", "b"]).await;
}

/// A full store frees a slot on release and on purge_scope, and existing keys
/// (completed, packed or large) still answer while it is full.
#[tokio::test]
async fn capacity_is_exact_and_freed_by_every_removal() {
    let store = MemoryStore::new().with_capacity(5);
    let k = |i: usize| record("cap", &format!("cap-key-{i:08}"));
    let mut tokens: Vec<_> = Vec::new();
    for i in 0..5 {
        tokens.push(claim(&store, &k(i), &fp("x")).await);
    }
    let full = |r: Result<Begin, StoreError>| matches!(r, Err(StoreError::CapacityExceeded));
    assert!(full(store.begin(&k(5), &fp("x")).await));
    store.release(&k(4), tokens[4]).await.unwrap();
    tokens[4] = claim(&store, &k(5), &fp("x")).await;
    assert!(full(store.begin(&k(4), &fp("x")).await));
    store
        .complete(&k(0), tokens[0], body_response("small"))
        .await
        .unwrap();
    store
        .complete(&k(1), tokens[1], body_response(vec![0u8; 4096]))
        .await
        .unwrap();
    assert!(full(store.begin(&k(6), &fp("x")).await));
    assert_eq!(replayed(&store, &k(0), &fp("x")).await.body, "small");
    assert_eq!(replayed(&store, &k(1), &fp("x")).await.body.len(), 4096);
    in_progress(&store, &k(2), &fp("x")).await;
    mismatch(&store, &k(2), &fp("y")).await;
    assert_eq!(store.len(), 5);
    let other = record("other", "cap-key-00000000");
    assert!(full(store.begin(&other, &fp("x")).await));
    assert_eq!(store.purge_scope(&Scope::new("cap")).await.unwrap(), 5);
    assert_eq!(store.len(), 0);
    claim(&store, &other, &fp("x")).await;
    assert_eq!(store.len(), 1);
}

// ---------------------------------------------------------------------------
// Identity and purge_scope on the id-keyed map
// ---------------------------------------------------------------------------

/// Scopes that are prefixes of each other, an empty scope, and scope/key
/// splits of the same characters are all distinct identities; purge_scope
/// removes exactly one scope's records, in progress and completed.
#[tokio::test]
async fn purge_scope_removes_exactly_one_scope() {
    let store = MemoryStore::new();
    let scopes = ["acme", "acm", "acme2", "", "ACME", "acme\u{0}", "äcme"];
    let keys = [
        "key-00000001",
        "key-00000002",
        "key-00000003",
        "key-00000004",
    ];
    let mut tokens = std::collections::HashMap::new();
    for scope in scopes {
        for (i, key) in keys.iter().enumerate() {
            let rk = record(scope, key);
            let token = claim(&store, &rk, &fp("x")).await;
            match i {
                0 => {
                    let body = format!("{scope}/{key}");
                    store
                        .complete(&rk, token, body_response(body))
                        .await
                        .unwrap();
                }
                1 => {
                    let body = format!("{scope}/{key}").repeat(200);
                    store
                        .complete(&rk, token, body_response(body))
                        .await
                        .unwrap();
                }
                _ => {
                    tokens.insert((scope, *key), token);
                }
            }
        }
    }
    // Split points of the same characters: distinct records.
    let split_a = record("ab", "cdefghijk");
    let split_b = record("abc", "defghijk");
    claim(&store, &split_a, &fp("x")).await;
    claim(&store, &split_b, &fp("x")).await;
    let total = scopes.len() * keys.len() + 2;
    assert_eq!(store.len(), total);

    // Waiters on the erased scope's claims are woken.
    let waiter = spawn_waiter(&store, &record("acme", keys[2]), Duration::from_secs(30));
    tokio::task::yield_now().await;
    assert_eq!(store.purge_scope(&Scope::new("acme")).await.unwrap(), 4);
    assert_eq!(store.len(), total - 4);
    woken(waiter, "purge_scope").await;
    // Purging again, or a scope nobody used, removes nothing.
    assert_eq!(store.purge_scope(&Scope::new("acme")).await.unwrap(), 0);
    assert_eq!(store.purge_scope(&Scope::new("ac")).await.unwrap(), 0);
    assert_eq!(store.purge_scope(&Scope::new("b")).await.unwrap(), 0);

    for scope in scopes {
        for (i, key) in keys.iter().enumerate() {
            let rk = record(scope, key);
            if scope == "acme" {
                if i >= 2 {
                    let token = tokens[&(scope, *key)];
                    claim_lost(store.complete(&rk, token, body_response("late")).await);
                }
                // Gone: the same request runs anew.
                claim(&store, &rk, &fp("x")).await;
                continue;
            }
            match i {
                0 => assert_eq!(
                    replayed(&store, &rk, &fp("x")).await.body,
                    format!("{scope}/{key}")
                ),
                1 => assert_eq!(
                    replayed(&store, &rk, &fp("x")).await.body,
                    format!("{scope}/{key}").repeat(200)
                ),
                _ => in_progress(&store, &rk, &fp("x")).await,
            }
        }
    }
    in_progress(&store, &split_a, &fp("x")).await;
    in_progress(&store, &split_b, &fp("x")).await;
    assert_eq!(store.len(), total);
    // The empty scope is a scope like any other.
    assert_eq!(store.purge_scope(&Scope::new("")).await.unwrap(), 4);
    let mut rest: Vec<&str> = scopes.iter().copied().filter(|s| !s.is_empty()).collect();
    rest.extend(["ab", "abc"]);
    drain_and_check(&store, &rest).await;
}

/// Same key in many scopes: every answer comes from its own scope's record.
#[tokio::test]
async fn the_same_key_in_many_scopes_never_crosses() {
    let store = MemoryStore::new();
    let key = "shared-key-0001";
    for s in 0..200 {
        let rk = record(&format!("tenant-{s}"), key);
        let token = claim(&store, &rk, &fp("x")).await;
        store
            .complete(&rk, token, body_response(format!("tenant-{s}")))
            .await
            .unwrap();
    }
    for s in 0..200 {
        let rk = record(&format!("tenant-{s}"), key);
        assert_eq!(
            replayed(&store, &rk, &fp("x")).await.body,
            format!("tenant-{s}")
        );
    }
    assert_eq!(store.len(), 200);
}

// ---------------------------------------------------------------------------
// Packed responses
// ---------------------------------------------------------------------------

/// Replays `response` through a claim and completion, and checks it comes
/// back byte for byte, sensitive flags included.
async fn round_trip(store: &MemoryStore, key: &RecordKey, response: StoredResponse) {
    let token = claim(store, key, &fp("x")).await;
    store.complete(key, token, response.clone()).await.unwrap();
    for _ in 0..2 {
        let replay = replayed(store, key, &fp("x")).await;
        assert_eq!(replay.status, response.status);
        assert_eq!(replay.headers.len(), response.headers.len());
        for ((n1, v1), (n2, v2)) in replay.headers.iter().zip(&response.headers) {
            assert_eq!(n1, n2);
            assert_eq!(v1.as_bytes(), v2.as_bytes());
            assert_eq!(
                v1.is_sensitive(),
                v2.is_sensitive(),
                "sensitive flag of {n1}"
            );
        }
        assert_eq!(&replay.body[..], &response.body[..]);
        assert_eq!(*replay, response);
    }
}

#[tokio::test]
async fn odd_responses_round_trip_byte_for_byte() {
    let store = MemoryStore::new();
    let pattern = |n: usize| Bytes::from((0..n).map(|i| (i * 7 + 3) as u8).collect::<Vec<_>>());
    // Bodies around the packing threshold, with and without headers.
    for (i, n) in [0usize, 1, 127, 128, 1023, 1024, 1025, 1026, 4096, 70_000]
        .into_iter()
        .enumerate()
    {
        let bare = StoredResponse {
            status: StatusCode::OK,
            headers: Vec::new(),
            body: pattern(n),
        };
        round_trip(&store, &record("bodies", &format!("bare-{i:08}")), bare).await;
        round_trip(
            &store,
            &record("bodies", &format!("hdrs-{i:08}")),
            body_response(pattern(n)),
        )
        .await;
    }

    // Many headers: repeated names in order, obs-text, sensitive flags,
    // empty values, long names and values, standard and custom names.
    let mut headers = Vec::new();
    for i in 0..300u32 {
        let name = match i % 5 {
            0 => HeaderName::from_static("set-cookie"),
            1 => HeaderName::from_static("link"),
            2 => HeaderName::from_bytes(format!("x-h-{i}").as_bytes()).unwrap(),
            3 => HeaderName::from_bytes("x".repeat(200 + i as usize).as_bytes()).unwrap(),
            _ => HeaderName::from_static("content-type"),
        };
        let mut value = match i % 4 {
            0 => HeaderValue::from_bytes(&[0x80, b'a', 0xff, b' ', 0xe9, b'\t', 0x9f]).unwrap(),
            1 => HeaderValue::from_static(""),
            2 => HeaderValue::from_bytes(format!("v{i}-").repeat(i as usize % 70).as_bytes())
                .unwrap(),
            _ => HeaderValue::from_bytes(&(0x80..=0xffu8).collect::<Vec<_>>()).unwrap(),
        };
        value.set_sensitive(i % 3 == 0);
        headers.push((name, value));
    }
    for (i, body) in [pattern(0), pattern(1024), pattern(1025)]
        .into_iter()
        .enumerate()
    {
        round_trip(
            &store,
            &record("headers", &format!("many-{i:08}")),
            StoredResponse {
                status: StatusCode::from_u16(599).unwrap(),
                headers: headers.clone(),
                body,
            },
        )
        .await;
    }

    // Statuses at the edges.
    for (i, status) in [100u16, 101, 204, 304, 999].into_iter().enumerate() {
        round_trip(
            &store,
            &record("status", &format!("status-{i:08}")),
            StoredResponse {
                status: StatusCode::from_u16(status).unwrap(),
                headers: vec![(
                    HeaderName::from_static("etag"),
                    HeaderValue::from_static("\"x\""),
                )],
                body: Bytes::new(),
            },
        )
        .await;
    }

    // Long identities (multi-byte length prefixes) and non-ASCII scopes.
    let long_scope = "ş".repeat(5_000);
    round_trip(
        &store,
        &record(&long_scope, &"k".repeat(128)),
        body_response(pattern(1000)),
    )
    .await;
    round_trip(&store, &record("", "12345678"), body_response(pattern(10))).await;
}

/// A body sliced out of a larger buffer replays exactly its own bytes, and a
/// replay outlives the record it was read from.
#[tokio::test]
async fn replays_are_independent_of_the_record() {
    let store = MemoryStore::new();
    let big = Bytes::from((0..4096u32).map(|i| i as u8).collect::<Vec<_>>());
    for (i, range) in [
        (0usize, 0usize),
        (10, 20),
        (100, 1124),
        (100, 1125),
        (0, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        let key = record("slices", &format!("slice-{i:08}"));
        round_trip(&store, &key, body_response(big.slice(range.0..range.1))).await;
    }
    let key = record("outlive", "outlive-0001");
    let token = claim(&store, &key, &fp("x")).await;
    store
        .complete(&key, token, body_response(&b"kept after purge"[..]))
        .await
        .unwrap();
    let replay = replayed(&store, &key, &fp("x")).await;
    store.purge_scope(&Scope::new("outlive")).await.unwrap();
    // A new record of the same key does not disturb the earlier replay.
    let token = claim(&store, &key, &fp("x")).await;
    store
        .complete(&key, token, body_response(&b"another response"[..]))
        .await
        .unwrap();
    drop(store);
    assert_eq!(replay.body, "kept after purge");
    assert_eq!(replay.headers[0].1, "text/plain");
}

// ---------------------------------------------------------------------------
// Exact digest versus canonical fingerprint
// ---------------------------------------------------------------------------

/// A request whose fingerprint was computed elsewhere (no exact bytes).
fn pre(fingerprint: Fingerprint) -> RequestFingerprint<'static> {
    fingerprint.into()
}

/// Builds lazily fingerprinted requests like the layer does.
struct Requests {
    key: RecordKey,
    json: HeaderValue,
    text: HeaderValue,
}

impl Requests {
    fn new(key: RecordKey) -> Self {
        Self {
            key,
            json: HeaderValue::from_static("application/json"),
            text: HeaderValue::from_static("text/plain"),
        }
    }

    fn json<'a>(&'a self, body: &'a str) -> RequestFingerprint<'a> {
        self.with(Some(&self.json), body)
    }

    fn text<'a>(&'a self, body: &'a str) -> RequestFingerprint<'a> {
        self.with(Some(&self.text), body)
    }

    fn with<'a>(&'a self, ct: Option<&'a HeaderValue>, body: &'a str) -> RequestFingerprint<'a> {
        RequestFingerprint::new(
            &Method::POST,
            "/v1/orders",
            self.key.key(),
            self.key.scope().as_str(),
            ct,
            body.as_bytes(),
        )
    }
}

#[tokio::test]
async fn canonically_equal_bytes_match_and_other_content_mismatches() {
    let store = MemoryStore::new();
    let r = Requests::new(record("acme", "exact-00000001"));
    let first = r#"{"sku":"A","qty":1,"tags":["x","y"]}"#;
    let reordered = r#"{ "tags": ["x", "y"], "qty": 1.0, "sku": "A" }"#;
    let others = [
        r#"{"sku":"A","qty":2,"tags":["x","y"]}"#,
        r#"{"sku":"A","qty":1,"tags":["y","x"]}"#,
        r#"{"sku":"A","qty":1}"#,
        "",
    ];
    let key = r.key.clone();
    let token = claim(&store, &key, &r.json(first)).await;
    in_progress(&store, &key, &r.json(first)).await;
    in_progress(&store, &key, &r.json(reordered)).await;
    for other in others {
        mismatch(&store, &key, &r.json(other)).await;
    }
    // The same bytes as raw text (no canonicalisation) are another request.
    mismatch(&store, &key, &r.text(first)).await;
    mismatch(&store, &key, &r.with(None, first)).await;
    // A precomputed fingerprint: no exact digest in common, same fingerprint.
    in_progress(&store, &key, &pre(*r.json(reordered).fingerprint())).await;
    mismatch(&store, &key, &pre(*r.json(others[0]).fingerprint())).await;

    store
        .complete(&key, token, body_response("created"))
        .await
        .unwrap();
    for same in [
        r.json(first),
        r.json(reordered),
        pre(*r.json(first).fingerprint()),
    ] {
        assert_eq!(replayed(&store, &key, &same).await.body, "created");
    }
    for other in others {
        mismatch(&store, &key, &r.json(other)).await;
    }
    mismatch(&store, &key, &r.text(first)).await;
    mismatch(&store, &key, &r.text(reordered)).await;
}

/// The first request's bytes are not canonical: later canonical-but-different
/// bytes still match, by fingerprint.
#[tokio::test]
async fn a_claim_from_non_canonical_bytes_matches_canonical_retries() {
    let store = MemoryStore::new();
    let r = Requests::new(record("acme", "exact-00000002"));
    let key = r.key.clone();
    let token = claim(&store, &key, &r.json("{ \"b\" : [1, 2.0], \"a\" : {} }")).await;
    in_progress(&store, &key, &r.json(r#"{"a":{},"b":[1,2]}"#)).await;
    mismatch(&store, &key, &r.json(r#"{"a":{},"b":[2,1]}"#)).await;
    store
        .complete(&key, token, body_response(vec![b'z'; 1500]))
        .await
        .unwrap();
    let replay = replayed(&store, &key, &r.json(r#"{"a":{},"b":[1,2]}"#)).await;
    assert_eq!(replay.body.len(), 1500);
    mismatch(&store, &key, &r.json(r#"{"a":{},"b":[2,1]}"#)).await;
}

/// A takeover, or a re-claim after a release, carries the new request's exact
/// digest: the old request's bytes must not match the new record by digest.
#[tokio::test(start_paused = true)]
async fn a_new_claim_does_not_inherit_the_old_exact_digest() {
    let store = MemoryStore::new()
        .with_lock_timeout(Duration::from_millis(100))
        .with_retention(Duration::from_millis(300));
    let r = Requests::new(record("acme", "exact-00000003"));
    let key = r.key.clone();
    let (old, new) = (r#"{"v":1}"#, r#"{"v":2}"#);

    // After a release.
    let token = claim(&store, &key, &r.json(old)).await;
    store.release(&key, token).await.unwrap();
    let token = claim(&store, &key, &r.json(new)).await;
    mismatch(&store, &key, &r.json(old)).await;
    in_progress(&store, &key, &r.json(new)).await;

    // After a takeover of an expired claim.
    tokio::time::advance(Duration::from_millis(150)).await;
    let dead = token;
    let token = claim(&store, &key, &r.json(old)).await;
    mismatch(&store, &key, &r.json(new)).await;
    claim_lost(store.complete(&key, dead, body_response("new")).await);
    store
        .complete(&key, token, body_response("old"))
        .await
        .unwrap();
    mismatch(&store, &key, &r.json(new)).await;

    // After a takeover of an expired completion.
    tokio::time::advance(Duration::from_millis(400)).await;
    let token = claim(&store, &key, &r.json(new)).await;
    mismatch(&store, &key, &r.json(old)).await;
    store
        .complete(&key, token, body_response("new"))
        .await
        .unwrap();
    mismatch(&store, &key, &r.json(old)).await;
    assert_eq!(replayed(&store, &key, &r.json(new)).await.body, "new");
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

/// Hundreds of tasks on a few keys: at most one holder per key at any time,
/// every task ends with a replay or its own claim, and `len()` matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_tasks_one_holder_per_key() {
    const KEYS: usize = 32;
    const TASKS_PER_KEY: usize = 24;
    let store = MemoryStore::new();
    let holders: Arc<Vec<AtomicBool>> =
        Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let claims = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..KEYS * TASKS_PER_KEY {
        let (store, holders, claims) = (store.clone(), holders.clone(), claims.clone());
        tasks.push(tokio::spawn(async move {
            let k = t % KEYS;
            let key = record(&format!("s{}", k % 3), &format!("conc-key-{k:08}"));
            loop {
                match store.begin(&key, &fp("same")).await.unwrap() {
                    Begin::Claimed(token) => {
                        claims.fetch_add(1, Ordering::SeqCst);
                        assert!(
                            !holders[k].swap(true, Ordering::SeqCst),
                            "two holders of key {k}"
                        );
                        tokio::task::yield_now().await;
                        holders[k].store(false, Ordering::SeqCst);
                        // Odd keys are released by their first holders: the
                        // next waiter claims; the last one completes.
                        if k % 2 == 1 && t / KEYS < TASKS_PER_KEY / 2 {
                            store.release(&key, token).await.unwrap();
                        } else {
                            store
                                .complete(&key, token, body_response(format!("k{k}")))
                                .await
                                .unwrap();
                        }
                        return;
                    }
                    Begin::Replay(response) => {
                        assert_eq!(response.body, format!("k{k}"));
                        return;
                    }
                    Begin::InProgress => {
                        store.wait(&key, Duration::from_secs(5)).await.unwrap();
                    }
                    Begin::Mismatch => panic!("mismatch on key {k}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(store.len(), KEYS, "one completed record per key");
    for k in 0..KEYS {
        let key = record(&format!("s{}", k % 3), &format!("conc-key-{k:08}"));
        assert_eq!(
            replayed(&store, &key, &fp("same")).await.body,
            format!("k{k}")
        );
    }
    assert!(claims.load(Ordering::SeqCst) >= KEYS);
    drain_and_check(&store, &["s0", "s1", "s2"]).await;
}

/// Every first begin on a fresh key races hundreds of others: exactly one
/// claim per key, and `len()` is exactly the number of keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn exactly_one_claim_per_key_under_contention() {
    const KEYS: usize = 50;
    const TASKS_PER_KEY: usize = 20;
    let store = MemoryStore::new();
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS * TASKS_PER_KEY));
    let tasks: Vec<_> = (0..KEYS * TASKS_PER_KEY)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                let k = t % KEYS;
                let key = record("race", &format!("race-key-{k:08}"));
                barrier.wait().await;
                (k, store.begin(&key, &fp("same")).await.unwrap())
            })
        })
        .collect();
    let mut claims = vec![0; KEYS];
    for task in tasks {
        match task.await.unwrap() {
            (k, Begin::Claimed(_)) => claims[k] += 1,
            (_, Begin::InProgress) => {}
            (k, other) => panic!("key {k}: unexpected {other:?}"),
        }
    }
    assert!(claims.iter().all(|&c| c == 1), "claims per key: {claims:?}");
    assert_eq!(store.len(), KEYS);
    drain_and_check(&store, &["race"]).await;
}

/// Claims, completions, releases and purges of one scope race claims of
/// another; `len()` never underflows (wraps) mid-way, and at the end it is
/// exactly what the purges find.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn len_stays_consistent_under_concurrent_purges() {
    let store = MemoryStore::new();
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut max = 0;
            while !stop.load(Ordering::Relaxed) {
                max = max.max(store.len());
                tokio::task::yield_now().await;
            }
            max
        })
    };
    let purger = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut purged = 0;
            while !stop.load(Ordering::Relaxed) {
                purged += store.purge_scope(&Scope::new("victim")).await.unwrap();
                tokio::task::yield_now().await;
            }
            purged
        })
    };
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut kept = 0usize;
                for i in 0..300 {
                    let scope = if i % 2 == 0 { "victim" } else { "kept" };
                    let key = record(scope, &format!("w{w}-key-{i:08}"));
                    let Begin::Claimed(token) = store.begin(&key, &fp("x")).await.unwrap() else {
                        panic!("fresh key not claimed");
                    };
                    let result = match i % 3 {
                        0 => store.release(&key, token).await,
                        _ => store.complete(&key, token, body_response("r")).await,
                    };
                    match (scope, result) {
                        ("kept", Ok(())) => kept += usize::from(i % 3 != 0),
                        ("kept", Err(e)) => panic!("kept scope lost its claim: {e}"),
                        // A purge may have removed the victim's claim first.
                        (_, Ok(()) | Err(StoreError::ClaimLost)) => {}
                        (_, Err(e)) => panic!("unexpected {e}"),
                    }
                }
                kept
            })
        })
        .collect();
    let mut kept = 0;
    for worker in workers {
        kept += worker.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let max = observer.await.unwrap();
    purger.await.unwrap();
    assert!(max <= 16 * 300, "len() wrapped around: {max}");
    assert_eq!(
        store.purge_scope(&Scope::new("kept")).await.unwrap() as usize,
        kept
    );
    store.purge_scope(&Scope::new("victim")).await.unwrap();
    assert_eq!(store.len(), 0);
}

/// A purge that removes a claim the instant it is inserted must not subtract
/// it before the claim was counted: `len()` would wrap to ~`usize::MAX` for a
/// moment, and a concurrent `begin` of a new key would find the store "full"
/// (a spurious `CapacityExceeded`, after a whole-map sweep). OS threads and
/// blocking calls maximise preemption between the two steps.
#[test]
fn len_never_wraps_when_a_purge_races_a_new_claim() {
    let store = MemoryStore::new();
    let stop = Arc::new(AtomicBool::new(false));
    let wrapped = Arc::new(AtomicUsize::new(0));
    let full = Arc::new(AtomicUsize::new(0));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let mut threads = Vec::new();
    {
        let (store, stop, wrapped) = (store.clone(), stop.clone(), wrapped.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if store.len() > 1 << 40 {
                    wrapped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for _ in 0..4 {
        let (store, stop) = (store.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let rt = runtime();
            while !stop.load(Ordering::Relaxed) {
                rt.block_on(store.purge_scope(&Scope::new("victim")))
                    .unwrap();
            }
        }));
    }
    for w in 0..6 {
        let (store, stop, full) = (store.clone(), stop.clone(), full.clone());
        threads.push(std::thread::spawn(move || {
            let rt = runtime();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let scope = if w % 3 == 0 { "bystander" } else { "victim" };
                let key = record(scope, &format!("w{w}-key-{i:012}"));
                i += 1;
                match rt.block_on(store.begin(&key, &fp("x"))) {
                    Ok(Begin::Claimed(token)) if scope == "bystander" => {
                        rt.block_on(store.release(&key, token)).unwrap();
                    }
                    Ok(Begin::Claimed(_)) => {}
                    Err(StoreError::CapacityExceeded) => {
                        full.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("fresh key {key:?}: {other:?}"),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    let (wrapped, full) = (
        wrapped.load(Ordering::Relaxed),
        full.load(Ordering::Relaxed),
    );
    assert_eq!(wrapped, 0, "len() wrapped below zero {wrapped} times");
    assert_eq!(
        full, 0,
        "an empty store answered CapacityExceeded {full} times"
    );
    let rt = runtime();
    rt.block_on(store.purge_scope(&Scope::new("victim")))
        .unwrap();
    assert_eq!(store.len(), 0);
}
