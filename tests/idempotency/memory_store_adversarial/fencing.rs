//! Fencing of stale and forged tokens, and stale entries of the expiry queue.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

/// A stale token can neither complete nor release the claim that replaced it,
/// nor touch the record after the new owner completed it.
#[tokio::test(start_paused = true)]
async fn a_stale_token_is_fenced_after_a_takeover() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(100))
        .with_retention(Duration::from_secs(60))
        .build();
    let key = record("acme", "fence-00000001");
    let a = fp("a");
    let dead = claim(&store, &key, &a).await;
    tokio::time::advance(Duration::from_millis(150)).await;
    // The takeover may even carry another body: the old lock is dead.
    let fresh = claim(&store, &key, &fp("b")).await;
    assert!(fresh > dead);
    assert_eq!(store.len(), 1, "a takeover replaces, it does not add");

    claim_lost(
        store
            .complete(&key, dead, Completion::Response(body_response("stale")))
            .await,
    );
    store.release(&key, dead).await.unwrap();
    // The stale release did not free the new claim.
    in_progress(&store, &key, &fp("b")).await;
    mismatch(&store, &key, &a).await;

    store
        .complete(&key, fresh, Completion::Response(body_response("fresh")))
        .await
        .unwrap();
    claim_lost(
        store
            .complete(&key, dead, Completion::Response(body_response("stale")))
            .await,
    );
    claim_lost(
        store
            .complete(&key, fresh, Completion::Response(body_response("again")))
            .await,
    );
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
    claim_lost(
        store
            .complete(&key, first, Completion::Response(body_response("late")))
            .await,
    );
    assert_eq!(store.len(), 0, "a refused completion inserts nothing");
    // The key is free: a fresh claim, not a replay of the refused completion.
    let second = claim(&store, &key, &fp("a")).await;
    claim_lost(
        store
            .complete(&key, first, Completion::Response(body_response("late")))
            .await,
    );
    store.release(&key, first).await.unwrap();
    in_progress(&store, &key, &fp("a")).await;
    store.release(&key, second).await.unwrap();
    assert_eq!(store.len(), 0);
    // A token of another key never works on this one.
    let other = record("acme", "fence-00000003");
    let other_token = claim(&store, &other, &fp("a")).await;
    let third = claim(&store, &key, &fp("a")).await;
    claim_lost(
        store
            .complete(&key, other_token, Completion::Response(body_response("x")))
            .await,
    );
    store.release(&key, other_token).await.unwrap();
    in_progress(&store, &key, &fp("a")).await;
    store
        .complete(&key, third, Completion::Response(body_response("k")))
        .await
        .unwrap();
    store
        .complete(
            &other,
            other_token,
            Completion::Response(body_response("o")),
        )
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
        FencingToken::new(token.get() - 1),
        FencingToken::new(token.get() + 1),
        FencingToken::new(0),
        FencingToken::new(-1),
        FencingToken::new(i64::MIN),
        FencingToken::new(i64::MAX),
    ] {
        claim_lost(
            store
                .complete(&key, forged, Completion::Response(body_response("forged")))
                .await,
        );
        store.release(&key, forged).await.unwrap();
        in_progress(&store, &key, &fp("a")).await;
    }
    store
        .complete(&key, token, Completion::Response(body_response("real")))
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
            .complete(&key, token, Completion::Response(body_response("filler")))
            .await
            .unwrap();
    }
}

/// claim -> complete -> expire -> re-claim, while the old completion's queue
/// entry is still queued behind others: when it comes due it must not evict
/// the newer claim (nor, later, the newer completion).
#[tokio::test(start_paused = true)]
async fn a_stale_queue_entry_never_evicts_a_newer_record() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_millis(100))
        // After the retention the key is free: what this test is about.
        .with_tombstone(Duration::ZERO)
        .build();
    complete_fillers(&store, "fill", 20).await;
    let key = record("acme", "queue-00000001");
    let old = claim(&store, &key, &fp("a")).await;
    store
        .complete(&key, old, Completion::Response(body_response("old")))
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
        .complete(&key, new, Completion::Response(body_response("new")))
        .await
        .unwrap();
    assert_eq!(replayed(&store, &key, &fp("b")).await.body, "new");
    assert_eq!(store.len(), 1);
}

/// The same, with the newer record already completed when the old entry is due.
#[tokio::test(start_paused = true)]
async fn a_stale_queue_entry_never_evicts_a_newer_completion() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_millis(100))
        // After the retention the key is free: what this test is about.
        .with_tombstone(Duration::ZERO)
        .build();
    complete_fillers(&store, "fill", 20).await;
    let key = record("acme", "queue-00000002");
    let old = claim(&store, &key, &fp("a")).await;
    store
        .complete(&key, old, Completion::Response(body_response("old")))
        .await
        .unwrap();

    tokio::time::advance(Duration::from_millis(150)).await;
    let new = claim(&store, &key, &fp("b")).await;
    store
        .complete(&key, new, Completion::Response(body_response("new")))
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

/// claim -> complete -> retention ends (tombstone) -> window ends ->
/// re-claim -> complete, while the tombstone's queue entry is still queued
/// behind others: when it comes due it must not evict the newer completion,
/// which leaves a tombstone of its own once its retention ends.
#[tokio::test(start_paused = true)]
async fn a_stale_tombstone_entry_never_evicts_a_newer_completion() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_millis(100))
        .with_tombstone(Duration::from_millis(100))
        .build();
    complete_fillers(&store, "fill", 20).await;
    let key = record("acme", "queue-00000003");
    let old = claim(&store, &key, &fp("a")).await;
    store
        .complete(&key, old, Completion::Response(body_response("old")))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(150)).await;
    assert!(matches!(
        store.begin(&key, &fp("a")).await,
        Ok(Begin::Expired)
    ));
    mismatch(&store, &key, &fp("b")).await;
    assert_eq!(store.len(), 21, "records became tombstones, none was freed");

    tokio::time::advance(Duration::from_millis(100)).await;
    let new = claim(&store, &key, &fp("b")).await;
    store
        .complete(&key, new, Completion::Response(body_response("new")))
        .await
        .unwrap();
    for i in 0..8 {
        let probe = record("probe", &format!("probe-{i:08}"));
        let token = claim(&store, &probe, &fp("p")).await;
        store.release(&probe, token).await.unwrap();
    }
    assert_eq!(store.len(), 1, "only the new completion is left");
    assert_eq!(replayed(&store, &key, &fp("b")).await.body, "new");
    tokio::time::advance(Duration::from_millis(150)).await;
    assert!(matches!(
        store.begin(&key, &fp("b")).await,
        Ok(Begin::Expired)
    ));
    mismatch(&store, &key, &fp("a")).await;
}

/// A queue entry whose record was removed another way (purge, release of a
/// re-claim) removes nothing and decrements nothing when it comes due.
#[tokio::test(start_paused = true)]
async fn queue_entries_of_removed_records_do_not_decrement_len() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(10))
        .with_retention(Duration::from_millis(100))
        .build();
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
