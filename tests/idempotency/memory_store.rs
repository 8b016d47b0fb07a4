//! The store conformance suite against `MemoryStore`, plus its own bounds.

use std::num::NonZeroUsize;
use tower_idempotency::store::conformance;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;

use conformance::Durations;
use std::time::Duration;
use tower_idempotency::{
    store::{Begin, Store, StoreError},
    MemoryStore,
};

async fn memory_store(d: Durations) -> Option<MemoryStore> {
    Some(
        MemoryStore::builder()
            .with_lock_timeout(d.lock)
            .with_retention(d.retention)
            .with_tombstone(d.tombstone)
            .build(),
    )
}

// Records never leave the process: compared by their local digests.
tower_idempotency::store_conformance_tests!(memory_store, in_process);
tower_idempotency::store_conformance_tests!(inspect: memory_store);
tower_idempotency::engine_conformance_tests!(memory_store);
tower_idempotency::phase_store_conformance_tests!(memory_store);

#[tokio::test]
async fn capacity_bounds_memory_and_fails_closed_when_full() {
    let store = MemoryStore::builder()
        .with_capacity(NonZeroUsize::new(100).unwrap())
        .build();
    let fp = conformance::fingerprint("a");
    for i in 0..100 {
        let key = conformance::record("s", &format!("key-{i:08}"));
        assert!(matches!(
            store.begin(&key, &fp).await,
            Ok(Begin::Claimed(_))
        ));
    }
    let extra = conformance::record("s", "key-overflow");
    assert!(matches!(
        store.begin(&extra, &fp).await,
        Err(StoreError::Backend(e)) if e.downcast_ref::<tower_idempotency::store::MemoryStoreError>().is_some()
    ));
    // Existing keys still answer.
    let first = conformance::record("s", "key-00000000");
    assert!(matches!(
        store.begin(&first, &fp).await,
        Ok(Begin::InProgress)
    ));
    assert_eq!(store.len(), 100);
}

#[tokio::test(start_paused = true)]
async fn expired_records_are_evicted_in_bounded_steps_without_a_sweep() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_secs(10))
        .with_tombstone(Duration::ZERO)
        .with_capacity(NonZeroUsize::new(1_000).unwrap())
        .build();
    let fp = conformance::fingerprint("a");
    for i in 0..1_000 {
        let key = conformance::record("s", &format!("key-{i:08}"));
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&key, &fp).await else {
            panic!("claim");
        };
        store
            .complete(
                &key,
                token,
                Completion::Response(conformance::response(b"x")),
            )
            .await
            .unwrap();
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    // Full of expired records: a new claim evicts instead of failing.
    let fresh = conformance::record("s", "key-fresh-01");
    assert!(matches!(
        store.begin(&fresh, &fp).await,
        Ok(Begin::Claimed(_))
    ));
    assert!(store.len() < 1_000);
    for i in 0..200 {
        let key = conformance::record("t", &format!("key-{i:08}"));
        store.begin(&key, &fp).await.unwrap();
    }
    assert!(
        store.len() <= 201,
        "old records were evicted: {}",
        store.len()
    );
}

/// Completed records past their retention become tombstones, which count
/// against the capacity like records (a store full of them refuses new keys
/// rather than forgetting that those keys ran), answer their own requests
/// `Expired`, and are evicted in bounded steps once their window passes.
#[tokio::test(start_paused = true)]
async fn tombstones_count_against_the_capacity_and_are_evicted_after_their_window() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_secs(10))
        .with_tombstone(Duration::from_secs(20))
        .with_capacity(NonZeroUsize::new(1_000).unwrap())
        .build();
    let fp = conformance::fingerprint("a");
    let key = |i: usize| conformance::record("s", &format!("key-{i:08}"));
    for i in 0..1_000 {
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&key(i), &fp).await else {
            panic!("claim");
        };
        let response = Completion::Response(conformance::response(b"x"));
        store.complete(&key(i), token, response).await.unwrap();
    }
    tokio::time::advance(Duration::from_secs(11)).await;
    let fresh = conformance::record("s", "key-fresh-01");
    assert!(matches!(
        store.begin(&fresh, &fp).await,
        Err(StoreError::Backend(e)) if e.downcast_ref::<tower_idempotency::store::MemoryStoreError>().is_some()
    ));
    assert_eq!(store.len(), 1_000, "every record left its tombstone");
    for i in [0, 500, 999] {
        assert!(matches!(
            store.begin(&key(i), &fp).await,
            Ok(Begin::Expired)
        ));
        let other = conformance::fingerprint("b");
        assert!(matches!(
            store.begin(&key(i), &other).await,
            Ok(Begin::KeyReused)
        ));
    }
    tokio::time::advance(Duration::from_secs(20)).await;
    assert!(matches!(
        store.begin(&fresh, &fp).await,
        Ok(Begin::Claimed(_))
    ));
    assert!(store.len() < 1_000);
    for i in 0..200 {
        store
            .begin(&conformance::record("t", &format!("key-{i:08}")), &fp)
            .await
            .unwrap();
    }
    assert!(
        store.len() <= 201,
        "tombstones were evicted: {}",
        store.len()
    );
    assert!(matches!(
        store.begin(&key(999), &fp).await,
        Ok(Begin::Claimed(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn abandoned_claims_are_swept_when_the_store_is_full() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_capacity(NonZeroUsize::new(10).unwrap())
        .build();
    let fp = conformance::fingerprint("a");
    for i in 0..10 {
        let key = conformance::record("s", &format!("key-{i:08}"));
        // Claimed and never completed nor released: a crashed handler's claims.
        assert!(matches!(
            store.begin(&key, &fp).await,
            Ok(Begin::Claimed(_))
        ));
    }
    let fresh = conformance::record("s", "key-fresh-01");
    assert!(matches!(
        store.begin(&fresh, &fp).await,
        Err(StoreError::Backend(e)) if e.downcast_ref::<tower_idempotency::store::MemoryStoreError>().is_some()
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(matches!(
        store.begin(&fresh, &fp).await,
        Ok(Begin::Claimed(_))
    ));
    assert_eq!(store.len(), 1, "the expired claims were swept");
}

/// A clone of a builder is a second configuration: each `build` makes a
/// store of its own, with its own options and records; a clone of a store is
/// the same store.
#[tokio::test]
async fn a_cloned_builder_builds_a_store_of_its_own() {
    let builder = MemoryStore::builder().with_capacity(NonZeroUsize::new(1).unwrap());
    let short = builder.clone().with_lock_timeout(Duration::from_secs(1));
    let (a, b) = (builder.build(), short.build());
    assert_eq!(a.timings().lock_timeout, Duration::from_secs(10));
    assert_eq!(b.timings().lock_timeout, Duration::from_secs(1));
    let (key, fp) = (
        conformance::record("s", "key-0000001"),
        conformance::fingerprint("a"),
    );
    assert!(matches!(a.begin(&key, &fp).await, Ok(Begin::Claimed(_))));
    // `b` holds nothing of `a`'s: the same key is free there.
    assert!(matches!(b.begin(&key, &fp).await, Ok(Begin::Claimed(_))));
    assert_eq!((a.len(), b.len()), (1, 1));
    assert!(matches!(
        a.clone().begin(&key, &fp).await,
        Ok(Begin::InProgress)
    ));
}
