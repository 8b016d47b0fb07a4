//! `len()` accounting and capacity, and identity and `purge_scope` on the id-keyed map.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

/// Counts every insertion and removal path against a model.
#[tokio::test(start_paused = true)]
async fn len_never_drifts_across_every_path() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_secs(1))
        .with_retention(Duration::from_secs(2))
        // After the retention the key is free: what this test is about.
        .with_tombstone(Duration::ZERO)
        .with_capacity(NonZeroUsize::new(20).unwrap())
        .build();
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
            .complete(&a(i), token, Completion::Response(body_response(body)))
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
    claim_lost(
        store
            .complete(&a(5), tokens[5], Completion::Response(body_response("x")))
            .await,
    );
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
    store
        .complete(&a(7), t7, Completion::Response(body_response("7")))
        .await
        .unwrap();
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
            Err(StoreError::Backend(e)) if e.downcast_ref::<tower_idempotency::store::MemoryStoreError>().is_some()
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
    let store = MemoryStore::builder()
        .with_capacity(NonZeroUsize::new(5).unwrap())
        .build();
    let k = |i: usize| record("cap", &format!("cap-key-{i:08}"));
    let mut tokens: Vec<_> = Vec::new();
    for i in 0..5 {
        tokens.push(claim(&store, &k(i), &fp("x")).await);
    }
    let full = |r: Result<Begin, StoreError>| matches!(r, Err(StoreError::Backend(e)) if e.downcast_ref::<tower_idempotency::store::MemoryStoreError>().is_some());
    assert!(full(store.begin(&k(5), &fp("x")).await));
    store.release(&k(4), tokens[4]).await.unwrap();
    tokens[4] = claim(&store, &k(5), &fp("x")).await;
    assert!(full(store.begin(&k(4), &fp("x")).await));
    store
        .complete(
            &k(0),
            tokens[0],
            Completion::Response(body_response("small")),
        )
        .await
        .unwrap();
    store
        .complete(
            &k(1),
            tokens[1],
            Completion::Response(body_response(vec![0u8; 4096])),
        )
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
                        .complete(&rk, token, Completion::Response(body_response(body)))
                        .await
                        .unwrap();
                }
                1 => {
                    let body = format!("{scope}/{key}").repeat(200);
                    store
                        .complete(&rk, token, Completion::Response(body_response(body)))
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
                    claim_lost(
                        store
                            .complete(&rk, token, Completion::Response(body_response("late")))
                            .await,
                    );
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
            .complete(
                &rk,
                token,
                Completion::Response(body_response(format!("tenant-{s}"))),
            )
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
