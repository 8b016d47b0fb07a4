//! The scope index `purge_scope` reads: a claim scores its entry past its
//! key's expiry by the tombstone window, so a completion within the lock
//! leaves the entry as it is; a completion after the lock ran out (a late
//! owner nobody took over) must move it, or the index would let go of the
//! key before its tombstone expires.

use std::time::Duration;
use tower_idempotency::store::conformance::{fingerprint, record, response};
use tower_idempotency::store::{Begin, Claim, Completion, Maintenance, Store};
use tower_idempotency::{RedisStore, Scope};
use tower_idempotency_tests::support::redis as r;

/// A store under `prefix` with a lock of 0.3 s, a retention of 1.5 s and a
/// tombstone window of 1 s.
async fn short_lived(url: &str, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .with_prefix(prefix.parse().unwrap())
        .with_lock_timeout(Duration::from_millis(300))
        .with_retention(Duration::from_millis(1500))
        .with_tombstone(Duration::from_secs(1))
        .connect(url)
        .await
        .unwrap()
}

/// A lock of 0.3 s, a retention of 1.5 s (the claim's key is kept 1.8 s), a
/// window of 1 s: claimed at 0, completed a second late at 1.3 s, the record
/// gone at 2.8 s and its tombstone at 3.8 s; the claim's entry alone would be
/// scored 2.8 s. At 3.1 s, once the index is trimmed, `purge_scope` must
/// still find the key and erase its tombstone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_completion_keeps_its_tombstone_in_the_index_for_purge_scope() {
    let Some(url) = r::url("late completion index") else {
        return;
    };
    let store = short_lived(&url, &r::unique_prefix("index")).await;
    let scope = Scope::new("tenant-index");
    let key = record("tenant-index", "key-late-0001");
    let fp = fingerprint("late");
    let Begin::Claimed(Claim { token, .. }) = store.begin(&key, &fp).await.unwrap() else {
        panic!("fresh key");
    };
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Nobody took it over: the late owner still completes.
    store
        .complete(&key, token, Completion::Response(response(b"late")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    store.purge_expired().await.unwrap();
    assert!(matches!(store.begin(&key, &fp).await, Ok(Begin::Expired)));
    assert_eq!(store.purge_scope(&scope).await.unwrap(), 1);
    assert!(matches!(
        store.begin(&key, &fp).await,
        Ok(Begin::Claimed(_))
    ));
}

/// Claims check the index's TTL once per bucket of time (a sixteenth of how
/// long an entry is kept) through two marker entries: whatever the claim,
/// the index expires no earlier than the highest entry a claim scored, and
/// it always expires. `purge_scope` erases every key beside the markers, and
/// a claim after it is covered too. A lock of 0.3 s, a retention of 1.5 s
/// and a window of 1 s score entries 2.8 s ahead: buckets of 175 ms, so 40
/// claims 25 ms apart cross several.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_outlives_every_entry_its_claims_score() {
    let Some(url) = r::url("index expiry") else {
        return;
    };
    let prefix = r::unique_prefix("index-ttl");
    let store = short_lived(&url, &prefix).await;
    let scope = Scope::new("tenant-index-ttl");
    let fp = fingerprint("ttl");
    let conn = r::connection(&url).await;
    // The index's expiry and its entries other than the markers.
    let read = || {
        let mut conn = conn.clone();
        let pattern = format!("{prefix}:*:i");
        async move {
            let names: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut conn)
                .await
                .unwrap();
            let [index] = &names[..] else {
                panic!("one index: {names:?}");
            };
            let expiry: i64 = redis::cmd("PEXPIRETIME")
                .arg(index)
                .query_async(&mut conn)
                .await
                .unwrap();
            let entries: Vec<(String, f64)> = redis::cmd("ZRANGE")
                .arg(index)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await
                .unwrap();
            let markers = entries.iter().filter(|(m, _)| m.len() < 8).count();
            assert_eq!(markers, 2, "{entries:?}");
            let keys: Vec<f64> = entries
                .into_iter()
                .filter(|(m, _)| m.len() >= 8)
                .map(|(_, score)| score)
                .collect();
            (expiry, keys)
        }
    };
    for i in 0..40 {
        let key = record("tenant-index-ttl", &format!("key-ttl-{i:04}"));
        let Begin::Claimed(_) = store.begin(&key, &fp).await.unwrap() else {
            panic!("fresh key");
        };
        let (expiry, scores) = read().await;
        assert_eq!(scores.len(), i + 1);
        let highest = scores.iter().copied().fold(0.0, f64::max);
        assert!(expiry > 0, "the index expires (claim {i})");
        assert!(
            expiry as f64 >= highest,
            "claim {i}: the index expires at {expiry}, an entry is scored {highest}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(store.purge_scope(&scope).await.unwrap(), 40);
    let (expiry, scores) = read().await;
    assert!(scores.is_empty() && expiry > 0, "{scores:?}, {expiry}");
    let key = record("tenant-index-ttl", "key-ttl-after");
    let Begin::Claimed(_) = store.begin(&key, &fp).await.unwrap() else {
        panic!("a key purged is free");
    };
    let (expiry, scores) = read().await;
    assert!(expiry as f64 >= scores[0], "{expiry}, {scores:?}");
}
