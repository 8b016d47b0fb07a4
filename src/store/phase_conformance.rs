//! The [`PhaseStore`] conformance suite (feature `test-util`): what every
//! store of recovery points must keep. Invoked as the [`Store`](crate::store::Store) suite is
//! (see [`conformance`](super::conformance)), with the same factory:
//!
//! ```
//! use tower_idempotency::store::conformance::Durations;
//! use tower_idempotency::MemoryStore;
//!
//! async fn memory_store(d: Durations) -> Option<MemoryStore> {
//!     Some(MemoryStore::builder().with_lock_timeout(d.lock).with_retention(d.retention).build())
//! }
//!
//! tower_idempotency::phase_store_conformance_tests!(memory_store);
//! # fn main() {}
//! ```
//!
//! Each check is also a public `async fn` of this module. Not covered by semver.

#[doc(inline)]
pub use crate::phase_store_conformance_tests;

use super::conformance::{fingerprint, record, SHORT};
use super::phases::{
    InvalidPhaseName, PhaseOutputTooLarge, PhasesOfAnotherRequest, MAX_PHASE_OUTPUT,
};
use crate::fingerprint::RequestFingerprint;
use crate::store::{
    Begin, Claim, Completion, FencingToken, Maintenance, PhaseRecord, PhaseStore, RecordKey,
    StoreError,
};
use crate::Scope;
use bytes::Bytes;
use std::time::Duration;

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn claimed<S: PhaseStore>(store: &S, key: &RecordKey, fp: &RequestFingerprint<'_>) -> Claim {
    match store.begin(key, fp).await.expect("begin") {
        Begin::Claimed(claim) => claim,
        other => panic!("expected a claim, got {other:?}"),
    }
}

async fn record_phase<S: PhaseStore>(
    store: &S,
    key: &RecordKey,
    token: FencingToken,
    phase: &str,
    output: &'static [u8],
) -> Result<PhaseRecord, StoreError> {
    store
        .record_phase(key, token, phase, Bytes::from_static(output))
        .await
}

/// Conformance check: a first claim has no phases; each phase is recorded
/// once, and a second record of it never overwrites the first.
#[doc(hidden)]
pub async fn each_phase_is_recorded_once<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-1");
    let fp = fingerprint("{}");
    let claim = claimed(&store, &key, &fp).await;
    assert_eq!(claim.attempt(), 1);
    assert!(store.phases(&key, claim.token).await.unwrap().is_empty());

    let first = record_phase(&store, &key, claim.token, "create_order", b"\"o-1\"").await;
    assert_eq!(first.unwrap(), PhaseRecord::Recorded);
    let again = record_phase(&store, &key, claim.token, "create_order", b"\"o-2\"").await;
    assert_eq!(
        again.unwrap(),
        PhaseRecord::AlreadyRecorded(Bytes::from_static(b"\"o-1\""))
    );
    record_phase(&store, &key, claim.token, "charge", b"\"ch_1\"")
        .await
        .unwrap();

    let phases = store.phases(&key, claim.token).await.unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases.get("create_order").unwrap().as_ref(), b"\"o-1\"");
    assert_eq!(phases.get("charge").unwrap().as_ref(), b"\"ch_1\"");
    assert!(phases.get("mark_paid").is_none());
}

/// Needs a store built with [`SHORT`] durations. A claim taken over after
/// its lock ran out reads the phases its dead owner recorded (the same
/// request), and records the next; the old owner's token neither reads nor
/// records any more.
#[doc(hidden)]
pub async fn a_takeover_resumes_and_the_stale_token_is_refused<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-2");
    let fp = fingerprint("{\"amount\":100}");
    let dead = claimed(&store, &key, &fp).await;
    record_phase(&store, &key, dead.token, "create_order", b"1")
        .await
        .unwrap();
    tokio::time::sleep(SHORT.lock + Duration::from_millis(200)).await;

    let retry = claimed(&store, &key, &fp).await;
    assert_eq!(retry.attempt(), 2, "a takeover");
    let phases = store.phases(&key, retry.token).await.unwrap();
    assert_eq!(phases.get("create_order").unwrap().as_ref(), b"1");

    let stale = record_phase(&store, &key, dead.token, "charge", b"\"stale\"").await;
    assert!(matches!(stale, Err(StoreError::ClaimLost)), "{stale:?}");
    let stale_read = store.phases(&key, dead.token).await;
    assert!(matches!(stale_read, Err(StoreError::ClaimLost)));

    record_phase(&store, &key, retry.token, "charge", b"\"ch_2\"")
        .await
        .unwrap();
    let phases = store.phases(&key, retry.token).await.unwrap();
    assert_eq!(phases.get("charge").unwrap().as_ref(), b"\"ch_2\"");
}

fn is_another_requests(result: &Result<PhaseRecord, StoreError>) -> bool {
    matches!(result, Err(StoreError::Backend(e)) if e.downcast_ref::<PhasesOfAnotherRequest>().is_some())
}

/// Phases outlive a release for the same request only: a claim of another
/// request under the key (after the release) sees none, and may not record
/// any while they are unexpired, so the first request's retry still resumes.
/// A completed claim records no more.
#[doc(hidden)]
pub async fn phases_belong_to_their_request<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-3");
    let (same, other) = (fingerprint("{\"sku\":1}"), fingerprint("{\"sku\":2}"));
    let first = claimed(&store, &key, &same).await;
    record_phase(&store, &key, first.token, "reserve", b"\"r-1\"")
        .await
        .unwrap();
    store.release(&key, first.token).await.unwrap();

    let retry = claimed(&store, &key, &same).await;
    let phases = store.phases(&key, retry.token).await.unwrap();
    assert_eq!(phases.get("reserve").unwrap().as_ref(), b"\"r-1\"");
    store.release(&key, retry.token).await.unwrap();

    let another = claimed(&store, &key, &other).await;
    assert!(store.phases(&key, another.token).await.unwrap().is_empty());
    for name in ["reserve", "charge"] {
        let own = record_phase(&store, &key, another.token, name, b"\"r-2\"").await;
        assert!(is_another_requests(&own), "{name}: {own:?}");
    }
    assert!(store.phases(&key, another.token).await.unwrap().is_empty());
    store.release(&key, another.token).await.unwrap();

    let resumed = claimed(&store, &key, &same).await;
    let phases = store.phases(&key, resumed.token).await.unwrap();
    assert_eq!(phases.len(), 1, "{phases:?}");
    assert_eq!(phases.get("reserve").unwrap().as_ref(), b"\"r-1\"");
    record_phase(&store, &key, resumed.token, "charge", b"\"c-1\"")
        .await
        .unwrap();

    let done = Completion::Unavailable;
    store.complete(&key, resumed.token, done).await.unwrap();
    let late = record_phase(&store, &key, resumed.token, "ship", b"1").await;
    assert!(matches!(late, Err(StoreError::ClaimLost)), "{late:?}");
}

/// Needs a store built with [`SHORT`] durations. Each record renews the
/// request's phases: its first phase outlives its own keep while later ones
/// are recorded. Once they all expire, another request under the key
/// records its own.
#[doc(hidden)]
pub async fn phases_are_kept_from_the_last_record<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-6");
    let (same, other) = (fingerprint("{\"n\":1}"), fingerprint("{\"n\":2}"));
    let keep = SHORT.lock + SHORT.retention + SHORT.tombstone;
    let step = keep * 2 / 3;
    let mut claim = claimed(&store, &key, &same).await;
    record_phase(&store, &key, claim.token, "p1", b"1")
        .await
        .unwrap();
    for (i, name) in ["p2", "p3"].into_iter().enumerate() {
        store.release(&key, claim.token).await.unwrap();
        tokio::time::sleep(step).await;
        claim = claimed(&store, &key, &same).await;
        let phases = store.phases(&key, claim.token).await.unwrap();
        assert_eq!(phases.len(), i + 1, "after {step:?}: {phases:?}");
        assert_eq!(phases.get("p1").unwrap().as_ref(), b"1");
        record_phase(&store, &key, claim.token, name, b"2")
            .await
            .unwrap();
    }
    store.release(&key, claim.token).await.unwrap();

    tokio::time::sleep(keep + Duration::from_millis(300)).await;
    let another = claimed(&store, &key, &other).await;
    let own = record_phase(&store, &key, another.token, "p1", b"3").await;
    assert_eq!(own.unwrap(), PhaseRecord::Recorded);
    let phases = store.phases(&key, another.token).await.unwrap();
    assert_eq!(phases.len(), 1, "{phases:?}");
    assert_eq!(phases.get("p1").unwrap().as_ref(), b"3");
}

/// Needs a store built with [`SHORT`] durations. A completion deletes the
/// request's phases: once the completed record has expired, the next claim
/// of the same request runs from the start (its phases would still be kept).
#[doc(hidden)]
pub async fn a_completion_deletes_its_phases<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-7");
    let fp = fingerprint("{\"done\":1}");
    let claim = claimed(&store, &key, &fp).await;
    record_phase(&store, &key, claim.token, "p", b"1")
        .await
        .unwrap();
    let done = Completion::Unavailable;
    store.complete(&key, claim.token, done).await.unwrap();
    tokio::time::sleep(SHORT.retention + Duration::from_millis(150)).await;

    let again = claimed(&store, &key, &fp).await;
    let phases = store.phases(&key, again.token).await.unwrap();
    assert!(phases.is_empty(), "{phases:?}");
}

/// Needs a store built with [`SHORT`] durations. A claim kept alive by
/// its heartbeats keeps its phases too: an early phase outlives its own keep
/// while the run goes on without recording another.
#[doc(hidden)]
pub async fn a_live_claim_keeps_its_phases<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-8");
    let fp = fingerprint("{\"long\":1}");
    let claim = claimed(&store, &key, &fp).await;
    record_phase(&store, &key, claim.token, "early", b"1")
        .await
        .unwrap();
    let keep = SHORT.lock + SHORT.retention + SHORT.tombstone;
    let started = tokio::time::Instant::now();
    while started.elapsed() < keep + Duration::from_millis(400) {
        tokio::time::sleep(SHORT.lock / 4).await;
        store.extend(&key, claim.token).await.unwrap();
    }
    let phases = store.phases(&key, claim.token).await.unwrap();
    assert_eq!(phases.get("early").map(|o| o.as_ref()), Some(&b"1"[..]));
}

/// An output over the limit and a bad name are errors, never panics, and
/// record nothing; an output of exactly the limit is recorded.
#[doc(hidden)]
pub async fn oversized_outputs_and_bad_names_are_refused<S: PhaseStore>(store: S) {
    let key = record(&unique("phases"), "phase-key-4");
    let claim = claimed(&store, &key, &fingerprint("{}")).await;
    let big = Bytes::from(vec![b'x'; MAX_PHASE_OUTPUT + 1]);
    let refused = store.record_phase(&key, claim.token, "big", big).await;
    match refused {
        Err(StoreError::Backend(e)) => assert!(e.downcast_ref::<PhaseOutputTooLarge>().is_some()),
        other => panic!("expected PhaseOutputTooLarge, got {other:?}"),
    }
    for bad in ["", "a\nb", &"n".repeat(129)] {
        let refused = record_phase(&store, &key, claim.token, bad, b"1").await;
        match refused {
            Err(StoreError::Backend(e)) => assert!(e.downcast_ref::<InvalidPhaseName>().is_some()),
            other => panic!("expected InvalidPhaseName for {bad:?}, got {other:?}"),
        }
    }
    let limit = Bytes::from(vec![b'y'; MAX_PHASE_OUTPUT]);
    let recorded = store.record_phase(&key, claim.token, "limit", limit.clone());
    assert_eq!(recorded.await.unwrap(), PhaseRecord::Recorded);
    let phases = store.phases(&key, claim.token).await.unwrap();
    assert_eq!(phases.len(), 1);
    assert_eq!(phases.get("limit"), Some(&limit));
}

/// `purge_scope` erases the scope's phases with its records, and only its.
#[doc(hidden)]
pub async fn purge_scope_erases_phases<S: PhaseStore + Maintenance>(store: S) {
    let (gone, kept) = (unique("phases-gone"), unique("phases-kept"));
    let fp = fingerprint("{}");
    let (gone_key, kept_key) = (record(&gone, "phase-key-5"), record(&kept, "phase-key-5"));
    let a = claimed(&store, &gone_key, &fp).await;
    let b = claimed(&store, &kept_key, &fp).await;
    record_phase(&store, &gone_key, a.token, "p", b"1")
        .await
        .unwrap();
    // Released: the phases outlive the record, and the purge still finds them.
    store.release(&gone_key, a.token).await.unwrap();
    record_phase(&store, &kept_key, b.token, "p", b"2")
        .await
        .unwrap();

    store.purge_scope(&Scope::new(gone)).await.unwrap();
    let again = claimed(&store, &gone_key, &fp).await;
    assert!(store
        .phases(&gone_key, again.token)
        .await
        .unwrap()
        .is_empty());
    let phases = store.phases(&kept_key, b.token).await.unwrap();
    assert_eq!(phases.get("p").unwrap().as_ref(), b"2");
}

/// Generates one `#[tokio::test]` per phase conformance check for a store
/// factory (see the [module documentation](crate::store::phase_conformance)).
#[doc(hidden)]
#[macro_export]
macro_rules! phase_store_conformance_tests {
    ($factory:path) => {
        $crate::phase_store_conformance_tests!(@tests $factory, LONG:
            each_phase_is_recorded_once,
            phases_belong_to_their_request,
            oversized_outputs_and_bad_names_are_refused,
            purge_scope_erases_phases,
        );
        $crate::phase_store_conformance_tests!(@tests $factory, SHORT:
            a_takeover_resumes_and_the_stale_token_is_refused,
            phases_are_kept_from_the_last_record,
            a_completion_deletes_its_phases,
            a_live_claim_keeps_its_phases,
        );
    };
    (@tests $factory:path, $durations:ident: $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(store) = $factory($crate::store::conformance::$durations).await {
                    $crate::store::phase_conformance::$name(store).await;
                }
            }
        )*
    };
}
