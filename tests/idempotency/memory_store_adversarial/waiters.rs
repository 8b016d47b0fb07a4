//! Waiters: woken by purges, completions and releases, and bounded by the lock.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

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
    claim_lost(
        store
            .complete(&key, token, Completion::Response(body_response("late")))
            .await,
    );
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
        .complete(
            &key,
            token,
            Completion::Response(body_response(vec![b'x'; 5000])),
        )
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
        .release(&key, FencingToken::new(token.get() + 1))
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
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(200))
        .build();
    let key = record("acme", "wait-00000004");
    let dead = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::from_secs(30));
    woken(waiter, "the lock expiry").await;
    let fresh = claim(&store, &key, &fp("a")).await;
    assert!(fresh > dead);
    // A waiter on the new claim is woken by its completion, not the old one's.
    let waiter = spawn_waiter(&store, &key, Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(20)).await;
    claim_lost(
        store
            .complete(&key, dead, Completion::Response(body_response("late")))
            .await,
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "woken by a refused completion");
    store
        .complete(&key, fresh, Completion::Response(body_response("ok")))
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
        .complete(&key, token, Completion::Response(body_response("ok")))
        .await
        .unwrap();
    woken(waiter, "the completion").await;

    // Unbounded lock and retention saturate rather than overflow.
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::MAX)
        .with_retention(Duration::MAX)
        .build();
    let token = claim(&store, &key, &fp("a")).await;
    let waiter = spawn_waiter(&store, &key, Duration::from_millis(100));
    woken(waiter, "its own timeout").await;
    in_progress(&store, &key, &fp("a")).await;
    store
        .complete(&key, token, Completion::Response(body_response("ok")))
        .await
        .unwrap();
    assert_eq!(replayed(&store, &key, &fp("a")).await.body, "ok");
}
