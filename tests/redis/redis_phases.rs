//! Recovery points on Redis: what `purge_scope` leaves of them.

use bytes::Bytes;
use tower_idempotency::store::conformance::{fingerprint, record};
use tower_idempotency::store::{Begin, Store};
use tower_idempotency_tests::support::redis as r;

/// `purge_scope` deletes a record's phase hash with the record: a phase
/// recorded after the pass over the scope's phase index (its entry not seen
/// there, removed here to stand for that) does not outlive the purge and
/// turn up for the next claim of the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_scope_deletes_each_records_phases_with_it() {
    use tower_idempotency::store::{Maintenance, PhaseStore};
    let Some(url) = r::url("purge_scope and phases") else {
        return;
    };
    let store = r::standalone(&url, |s| s).await;
    let key = record("purged-phases", "phase-after-the-pass");
    let fp = fingerprint("{}");
    let Begin::Claimed(claim) = store.begin(&key, &fp).await.unwrap() else {
        panic!("expected a claim");
    };
    store
        .record_phase(&key, claim.token, "p", Bytes::from_static(b"1"))
        .await
        .unwrap();
    let mut redis = r::connection(&url).await;
    let hashes: Vec<String> = redis::cmd("KEYS")
        .arg("*p:phase-after-the-pass")
        .query_async(&mut redis)
        .await
        .unwrap();
    let [hash] = &hashes[..] else {
        panic!("one phase hash expected: {hashes:?}");
    };
    let index = format!("{}pi", hash.strip_suffix("p:phase-after-the-pass").unwrap());
    let _: i64 = redis::cmd("ZREM")
        .arg(&index)
        .arg("phase-after-the-pass")
        .query_async(&mut redis)
        .await
        .unwrap();

    store
        .purge_scope(&tower_idempotency::Scope::new("purged-phases"))
        .await
        .unwrap();
    let Begin::Claimed(again) = store.begin(&key, &fp).await.unwrap() else {
        panic!("expected a claim after the purge");
    };
    let phases = store.phases(&key, again.token).await.unwrap();
    assert!(phases.is_empty(), "{phases:?}");
}

/// A completion deletes the phases an earlier claim of its key recorded: a
/// claim over a released one (the same request's retry, which reads no
/// phase and records none) carries the mark that there are phases, so its
/// completion still deletes the hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_deletes_the_phases_of_the_claim_it_followed() {
    use tower_idempotency::store::{Completion, PhaseStore};
    let Some(url) = r::url("phases of a released claim") else {
        return;
    };
    let store = r::standalone(&url, |s| s).await;
    let key = record("released-phases", "phases-then-released");
    let fp = fingerprint("{}");
    let Begin::Claimed(first) = store.begin(&key, &fp).await.unwrap() else {
        panic!("expected a claim");
    };
    store
        .record_phase(&key, first.token, "p", Bytes::from_static(b"1"))
        .await
        .unwrap();
    store.release(&key, first.token).await.unwrap();
    let Begin::Claimed(retry) = store.begin(&key, &fp).await.unwrap() else {
        panic!("expected a claim after the release");
    };
    let redis = r::connection(&url).await;
    let hashes = |redis: &redis::aio::MultiplexedConnection| {
        let mut redis = redis.clone();
        async move {
            redis::cmd("KEYS")
                .arg("*p:phases-then-released")
                .query_async::<Vec<String>>(&mut redis)
                .await
                .unwrap()
        }
    };
    assert_eq!(hashes(&redis).await.len(), 1);
    store
        .complete(&key, retry.token, Completion::Unavailable)
        .await
        .unwrap();
    assert!(hashes(&redis).await.is_empty());
}
