//! The per-scope quota: one scope at its quota is refused new keys, every
//! other scope keeps claiming, and the count follows every insertion and
//! removal path, under concurrency too.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

fn over_quota(result: Result<Begin, StoreError>) {
    assert!(
        matches!(result, Err(StoreError::QuotaExceeded)),
        "expected ScopeQuotaExceeded, got {result:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn one_scope_at_its_quota_cannot_lock_the_others_out() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_secs(10))
        .with_capacity(NonZeroUsize::new(100).unwrap())
        .with_scope_quota(NonZeroUsize::new(3).unwrap())
        .build();
    let key = |scope: &str, i: usize| record(scope, &format!("{scope}-key-{i:08}"));
    // The noisy scope: two completed records and one claim in progress.
    let mut tokens = Vec::new();
    for i in 0..3 {
        tokens.push(claim(&store, &key("noisy", i), &fp("x")).await);
    }
    for (i, token) in tokens.iter().enumerate().take(2) {
        store
            .complete(
                &key("noisy", i),
                *token,
                Completion::Response(body_response("done")),
            )
            .await
            .unwrap();
    }
    assert_eq!(store.scope_len(&Scope::new("noisy")), 3);
    over_quota(store.begin(&key("noisy", 3), &fp("x")).await);
    // Its existing keys still answer, a mismatch included.
    replayed(&store, &key("noisy", 0), &fp("x")).await;
    in_progress(&store, &key("noisy", 2), &fp("x")).await;
    mismatch(&store, &key("noisy", 1), &fp("y")).await;
    // Every other scope claims as usual, up to its own quota.
    for scope in ["quiet", "other"] {
        for i in 0..3 {
            claim(&store, &key(scope, i), &fp("x")).await;
        }
        over_quota(store.begin(&key(scope, 3), &fp("x")).await);
    }
    assert_eq!(store.len(), 9);
    // A release frees a place...
    store.release(&key("noisy", 2), tokens[2]).await.unwrap();
    assert_eq!(store.scope_len(&Scope::new("noisy")), 2);
    let t = claim(&store, &key("noisy", 3), &fp("x")).await;
    over_quota(store.begin(&key("noisy", 4), &fp("x")).await);
    store
        .complete(
            &key("noisy", 3),
            t,
            Completion::Response(body_response("done")),
        )
        .await
        .unwrap();
    // ...and so does a purge of the scope, and nothing of the others.
    assert_eq!(store.purge_scope(&Scope::new("noisy")).await.unwrap(), 3);
    assert_eq!(store.scope_len(&Scope::new("noisy")), 0);
    assert_eq!(store.scope_len(&Scope::new("quiet")), 3);
    for i in 10..13 {
        claim(&store, &key("noisy", i), &fp("x")).await;
    }
    over_quota(store.begin(&key("noisy", 13), &fp("x")).await);
    // Expired records leave the count when the scope needs the room: the
    // claims above lapse after the 1 s lock.
    tokio::time::advance(Duration::from_millis(1_100)).await;
    for i in 20..23 {
        claim(&store, &key("noisy", i), &fp("x")).await;
    }
    assert_eq!(store.scope_len(&Scope::new("noisy")), 3);
    // The count is what the scope holds: purging finds as many (the lapsed
    // claims evicted when the room was needed are gone).
    assert_eq!(store.purge_scope(&Scope::new("noisy")).await.unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_count_follows_every_removal_path() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_secs(2))
        // After the retention the key is free: what this test is about.
        .with_tombstone(Duration::ZERO)
        .with_scope_quota(NonZeroUsize::new(1_000).unwrap())
        .build();
    let key = |i: usize| record("s", &format!("s-key-{i:08}"));
    let mut tokens = Vec::new();
    for i in 0..20 {
        tokens.push(claim(&store, &key(i), &fp("x")).await);
    }
    let held = || store.scope_len(&Scope::new("s"));
    assert_eq!(held(), 20);
    for (i, token) in tokens.iter().enumerate().take(10) {
        store
            .complete(
                &key(i),
                *token,
                Completion::Response(body_response(vec![b'x'; 100 * i])),
            )
            .await
            .unwrap();
    }
    assert_eq!(held(), 20, "a completion replaces its claim");
    for (i, token) in tokens.iter().enumerate().take(15).skip(10) {
        store.release(&key(i), *token).await.unwrap();
        store.release(&key(i), *token).await.unwrap();
    }
    assert_eq!(held(), 15, "a release counts once");
    // Claims 15..20 lapse at 1 s; a takeover of a lapsed claim is the same key.
    tokio::time::advance(Duration::from_millis(1_100)).await;
    claim(&store, &key(15), &fp("x")).await;
    assert_eq!(held(), 15, "a takeover replaces the record it takes over");
    assert_eq!(store.purge_expired().await.unwrap(), 4);
    assert_eq!(held(), 11);
    // The completed records lapse at 2 s and are evicted as claims go on.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(store.purge_expired().await.unwrap(), 11);
    assert_eq!(held(), 0);
    assert_eq!(store.len(), 0);
}

#[tokio::test]
async fn a_quota_of_one_refuses_a_second_key_and_nothing_else_breaks() {
    let store = MemoryStore::builder()
        .with_scope_quota(NonZeroUsize::MIN)
        .build();
    claim(&store, &record("s", "s-key-00000001"), &fp("x")).await;
    over_quota(store.begin(&record("s", "s-key-00000002"), &fp("x")).await);
    assert_eq!(store.len(), 1);
    // Without a quota, the scan counts.
    let open = MemoryStore::new();
    claim(&open, &record("a", "a-key-00000001"), &fp("x")).await;
    claim(&open, &record("b", "b-key-00000001"), &fp("x")).await;
    assert_eq!(open.scope_len(&Scope::new("a")), 1);
    assert_eq!(open.scope_len(&Scope::new("c")), 0);
}

/// Hundreds of tasks claim, complete and release in four scopes with a quota
/// of 10: no scope ever holds more than 10, and the count ends equal to the
/// records each scope holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quota_is_exact_under_concurrency() {
    let store = MemoryStore::builder()
        .with_scope_quota(NonZeroUsize::new(10).unwrap())
        .build();
    let scopes = ["a", "b", "c", "d"];
    let over = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..200usize {
        let (store, over) = (store.clone(), over.clone());
        let scope = scopes[t % scopes.len()];
        tasks.push(tokio::spawn(async move {
            let mut kept = 0;
            for i in 0..50usize {
                let key = record(scope, &format!("{scope}-key-{t:04}-{i:04}"));
                match store.begin(&key, &fp("x")).await {
                    Ok(Begin::Claimed(Claim { token, .. })) => {
                        assert!(store.scope_len(&Scope::new(scope)) <= 10);
                        if (t + i) % 7 == 0 && kept < 1 {
                            store
                                .complete(&key, token, Completion::Response(body_response("kept")))
                                .await
                                .unwrap();
                            kept += 1;
                        } else {
                            tokio::task::yield_now().await;
                            store.release(&key, token).await.unwrap();
                        }
                    }
                    Err(StoreError::QuotaExceeded) => {
                        over.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(over.load(Ordering::Relaxed) > 0, "the quota was reached");
    for scope in scopes {
        let held = store.scope_len(&Scope::new(scope));
        assert!(held <= 10, "{scope} holds {held}");
        let purged = store.purge_scope(&Scope::new(scope)).await.unwrap() as usize;
        assert_eq!(purged, held, "{scope}: the count matches the records");
        assert_eq!(store.scope_len(&Scope::new(scope)), 0);
    }
    assert_eq!(store.len(), 0);
}
