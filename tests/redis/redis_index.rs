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
    let store = RedisStore::builder()
        .with_prefix(r::unique_prefix("index").parse().unwrap())
        .with_lock_timeout(Duration::from_millis(300))
        .with_retention(Duration::from_millis(1500))
        .with_tombstone(Duration::from_secs(1))
        .connect(&url)
        .await
        .unwrap();
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
