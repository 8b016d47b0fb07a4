//! The [`Store`] conformance suite (feature `test-util`): the guarantees every
//! store must keep, as checks any implementation can run — the crate's own
//! stores run it in their tests, and so can a store written elsewhere.
//!
//! A test file supplies a factory `async fn(Durations) -> Option<S>` (return
//! `None` to skip, say without a database URL) and invokes
//! [`store_conformance_tests!`](self::store_conformance_tests), which writes
//! one `#[tokio::test]` per check (the test crate needs `tokio` with the
//! `macros` and `rt-multi-thread` features):
//!
//! ```
//! use tower_idempotency::store::conformance::Durations;
//! use tower_idempotency::MemoryStore;
//!
//! async fn memory_store(d: Durations) -> Option<MemoryStore> {
//!     Some(
//!         MemoryStore::builder()
//!             .with_lock_timeout(d.lock)
//!             .with_retention(d.retention)
//!             .with_tombstone(d.tombstone)
//!             .build(),
//!     )
//! }
//!
//! tower_idempotency::store_conformance_tests!(memory_store);
//! # fn main() {}
//! ```
//!
//! A store whose backend deletes expired records by itself (Redis key TTLs)
//! passes `expires_by_itself` as a second argument
//! (`store_conformance_tests!(factory, expires_by_itself)`): its
//! `purge_expired` may find nothing left to delete.
//!
//! Each check is also a public `async fn` of this module taking the store, for
//! harnesses of their own; they stay out of the documentation's item lists
//! (the macro's source names every one). Not covered by semver.

// Exported at the crate root, as `#[macro_export]` requires, and documented
// here, beside the checks it runs, rather than at the top of the crate's page.
#[doc(inline)]
pub use crate::store_conformance_tests;

use crate::store::inspect::{Inspect, KeyState, Release};
use crate::store::{Claim, Completion, Maintenance};
use crate::{
    fingerprint::{Fingerprint, RequestFingerprint},
    store::{Begin, FencingToken, RecordKey, Store, StoreError, StoredResponse},
    IdempotencyKey, Scope,
};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Lock and retention durations a store under test is built with.
#[derive(Clone, Copy, Debug)]
pub struct Durations {
    /// The store's lock timeout.
    pub lock: Duration,
    /// The store's retention.
    pub retention: Duration,
    /// The store's tombstone window (`Duration::ZERO`: no tombstones).
    pub tombstone: Duration,
}

/// Long enough that nothing expires during a test.
pub const LONG: Durations = Durations {
    lock: Duration::from_secs(60),
    retention: Duration::from_secs(3600),
    tombstone: Duration::from_secs(3600),
};

/// Short enough to watch locks and records expire; no tombstones, so an
/// expired key is free at once.
pub const SHORT: Durations = Durations {
    lock: Duration::from_millis(400),
    retention: Duration::from_millis(800),
    tombstone: Duration::ZERO,
};

/// A lock long enough to tell a release from the lock running out, for
/// an operator's release of a claim whose owner is dead.
pub const RELEASABLE: Durations = Durations {
    lock: Duration::from_secs(10),
    ..LONG
};

/// [`SHORT`], with tombstones that outlive the retention by 2 s: long
/// enough to check them on a busy machine, short enough to watch them go.
pub const TOMBSTONED: Durations = Durations {
    tombstone: Duration::from_secs(2),
    ..SHORT
};

/// Helper: record.
pub fn record(scope: &str, key: &str) -> RecordKey {
    RecordKey::for_test(scope, key)
}

/// A request whose fingerprint was computed up front (its exact digest is then
/// derived from the fingerprint).
pub fn fingerprint(body: &str) -> RequestFingerprint<'static> {
    let key = IdempotencyKey::parse(b"conformance-key").unwrap();
    Fingerprint::compute(&Method::POST, "/t", &key, "s", None, body.as_bytes()).into()
}

/// Helper: response.
pub fn response(body: &'static [u8]) -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: vec![
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                HeaderName::from_static("link"),
                HeaderValue::from_static("</a>; rel=\"a\""),
            ),
            (
                HeaderName::from_static("link"),
                HeaderValue::from_static("</b>; rel=\"b\""),
            ),
        ],
        body: Bytes::from_static(body),
    }
}

/// `response(body)`, as the completion that records it.
fn recorded(body: &'static [u8]) -> Completion {
    Completion::Response(response(body))
}

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn claim<S: Store>(store: &S, key: &RecordKey, fp: &RequestFingerprint<'_>) -> FencingToken {
    claimed(store, key, fp).await.token
}

async fn claimed<S: Store>(store: &S, key: &RecordKey, fp: &RequestFingerprint<'_>) -> Claim {
    match store.begin(key, fp).await.expect("begin") {
        Begin::Claimed(claim) => claim,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Conformance check: fresh key is claimed then in progress.
#[doc(hidden)]
pub async fn fresh_key_is_claimed_then_in_progress<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-00000001");
    let fp = fingerprint("a");
    claim(&store, &key, &fp).await;
    assert!(matches!(
        store.begin(&key, &fp).await.unwrap(),
        Begin::InProgress
    ));
    assert!(matches!(
        store.begin(&key, &fingerprint("b")).await.unwrap(),
        Begin::KeyReused
    ));
}

/// Conformance check: completed record replays exact bytes status and headers.
#[doc(hidden)]
pub async fn completed_record_replays_exact_bytes_status_and_headers<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-00000002");
    let fp = fingerprint("a");
    let token = claim(&store, &key, &fp).await;
    let body: &'static [u8] = b"\x00\xff binary \r\n body \xc3\xa9";
    store.complete(&key, token, recorded(body)).await.unwrap();
    match store.begin(&key, &fp).await.unwrap() {
        Begin::Replay(stored) => assert_eq!(*stored, response(body)),
        other => panic!("expected a replay, got {other:?}"),
    }
    assert!(matches!(
        store.begin(&key, &fingerprint("b")).await.unwrap(),
        Begin::KeyReused
    ));
}

/// Conformance check: release frees the key for a new claim.
#[doc(hidden)]
pub async fn release_frees_the_key_for_a_new_claim<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-00000003");
    let first = claim(&store, &key, &fingerprint("a")).await;
    store.release(&key, first).await.unwrap();
    // A corrected request with another body may now run.
    let second = claim(&store, &key, &fingerprint("b")).await;
    assert_ne!(first, second);
}

/// Conformance check: only the token holder completes or releases.
#[doc(hidden)]
pub async fn only_the_token_holder_completes_or_releases<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-00000004");
    let fp = fingerprint("a");
    let token = claim(&store, &key, &fp).await;
    let forged = FencingToken(token.0 + 1_000_000);
    assert!(matches!(
        store.complete(&key, forged, recorded(b"forged")).await,
        Err(StoreError::ClaimLost)
    ));
    store.release(&key, forged).await.unwrap();
    assert!(matches!(
        store.begin(&key, &fp).await.unwrap(),
        Begin::InProgress
    ));
    store
        .complete(&key, token, recorded(b"real"))
        .await
        .unwrap();
    // A completed record cannot be completed again, nor released.
    assert!(matches!(
        store.complete(&key, token, recorded(b"again")).await,
        Err(StoreError::ClaimLost)
    ));
    store.release(&key, token).await.unwrap();
    match store.begin(&key, &fp).await.unwrap() {
        Begin::Replay(stored) => assert_eq!(stored.body, Bytes::from_static(b"real")),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// Conformance check: keys are scoped.
#[doc(hidden)]
pub async fn keys_are_scoped<S: Store>(store: S) {
    let (acme, globex) = (unique("acme"), unique("globex"));
    let fp = fingerprint("a");
    let a = record(&acme, "shared-key-1");
    let b = record(&globex, "shared-key-1");
    let token = claim(&store, &a, &fp).await;
    store.complete(&a, token, recorded(b"acme")).await.unwrap();
    // Same key string, other tenant: its own claim, never acme's response.
    claim(&store, &b, &fp).await;
}

/// Conformance check: wait is woken by completion.
#[doc(hidden)]
pub async fn wait_is_woken_by_completion<S: Store>(store: S) {
    let store = Arc::new(store);
    let key = record(&unique("scope"), "key-00000005");
    let fp = fingerprint("a");
    let token = claim(&*store, &key, &fp).await;
    let waiter = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            store.wait(&key, Duration::from_secs(30)).await.unwrap();
            store.begin(&key, &fingerprint("a")).await.unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .complete(&key, token, recorded(b"done"))
        .await
        .unwrap();
    // Woken, not timed out: the 30 s wait would fail this bound by far.
    let decided = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was woken by the completion")
        .unwrap();
    assert!(matches!(decided, Begin::Replay(_)));
}

/// Conformance check: wait is woken by release.
#[doc(hidden)]
pub async fn wait_is_woken_by_release<S: Store>(store: S) {
    let store = Arc::new(store);
    let key = record(&unique("scope"), "key-00000006");
    let token = claim(&*store, &key, &fingerprint("a")).await;
    let waiter = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { store.wait(&key, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.release(&key, token).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was woken by the release")
        .unwrap()
        .unwrap();
}

/// Conformance check: wait gives up at its timeout.
#[doc(hidden)]
pub async fn wait_gives_up_at_its_timeout<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-00000007");
    let fp = fingerprint("a");
    claim(&store, &key, &fp).await;
    store.wait(&key, Duration::from_millis(200)).await.unwrap();
    assert!(matches!(
        store.begin(&key, &fp).await.unwrap(),
        Begin::InProgress
    ));
    // Not in progress at all: returns at once.
    let free = record(&unique("scope"), "key-00000008");
    tokio::time::timeout(
        Duration::from_secs(5),
        store.wait(&free, Duration::from_secs(60)),
    )
    .await
    .expect("no wait for a free key")
    .unwrap();
}

/// Conformance check: concurrent begins claim exactly once.
#[doc(hidden)]
pub async fn concurrent_begins_claim_exactly_once<S: Store>(store: S) {
    let store = Arc::new(store);
    let key = record(&unique("scope"), "key-00000009");
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.begin(&key, &fingerprint("a")).await.unwrap() })
        })
        .collect();
    let mut claims = 0;
    for task in tasks {
        match task.await.unwrap() {
            Begin::Claimed(_) => claims += 1,
            Begin::InProgress => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claims, 1);
}

/// Conformance check: purge scope erases one tenants records only.
#[doc(hidden)]
pub async fn purge_scope_erases_one_tenants_records_only<S: Store + Maintenance>(store: S) {
    let (erased, kept) = (unique("erased"), unique("kept"));
    let fp = fingerprint("a");
    let done = record(&erased, "key-0000000d");
    let token = claim(&store, &done, &fp).await;
    store
        .complete(&done, token, recorded(b"personal data"))
        .await
        .unwrap();
    let running = record(&erased, "key-0000000e");
    let running_token = claim(&store, &running, &fp).await;
    let other = record(&kept, "key-0000000d");
    let other_token = claim(&store, &other, &fp).await;
    store
        .complete(&other, other_token, recorded(b"kept"))
        .await
        .unwrap();

    let purged = store
        .purge_scope(&Scope::new(erased.as_str()))
        .await
        .unwrap();
    assert_eq!(purged, 2);
    // The erased tenant's response is gone: the same request would run anew.
    claim(&store, &done, &fp).await;
    // Its request still running cannot record afterwards: its completion is
    // refused, and the same request finds nothing to replay.
    assert!(matches!(
        store
            .complete(&running, running_token, recorded(b"late"))
            .await,
        Err(StoreError::ClaimLost)
    ));
    claim(&store, &running, &fp).await;
    assert!(matches!(
        store.begin(&other, &fp).await.unwrap(),
        Begin::Replay(_)
    ));
}

/// Needs a store built with [`SHORT`] durations.
#[doc(hidden)]
pub async fn expired_lock_is_taken_over_and_the_old_token_is_fenced<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-0000000a");
    let fp = fingerprint("a");
    let dead = claim(&store, &key, &fp).await;
    assert!(matches!(
        store.begin(&key, &fp).await.unwrap(),
        Begin::InProgress
    ));
    tokio::time::sleep(SHORT.lock + Duration::from_millis(200)).await;
    let fresh = claim(&store, &key, &fp).await;
    assert!(fresh > dead, "a takeover gets a higher fencing token");
    assert!(matches!(
        store.complete(&key, dead, recorded(b"late")).await,
        Err(StoreError::ClaimLost)
    ));
    store.release(&key, dead).await.unwrap();
    store
        .complete(&key, fresh, recorded(b"fresh"))
        .await
        .unwrap();
    match store.begin(&key, &fp).await.unwrap() {
        Begin::Replay(stored) => assert_eq!(stored.body, Bytes::from_static(b"fresh")),
        other => panic!("expected the new owner's response, got {other:?}"),
    }
}

/// Needs a store built with [`SHORT`] durations. A first claim is attempt 1
/// with no previous owner. A claim that takes over one whose lock ran out
/// is attempt 2 and names the dead owner's token and when its claim began
/// (on the store's clock: within a second of this process's, no later than
/// now); the next takeover in a row, by a request with another body too, is
/// attempt 3 and names the second owner. A released key starts again at 1.
#[doc(hidden)]
pub async fn a_takeover_reports_its_attempt_and_the_previous_owner<S: Store>(store: S) {
    const SKEW: Duration = Duration::from_secs(1);
    let key = record(&unique("scope"), "key-attempt01");
    let fp = fingerprint("a");
    let before = SystemTime::now();
    let first = claimed(&store, &key, &fp).await;
    assert_eq!(first.takeover, None, "a fresh key is a first claim");
    assert_eq!(first.attempt(), 1);
    let past_the_lock = SHORT.lock + Duration::from_millis(200);

    tokio::time::sleep(past_the_lock).await;
    let second = claimed(&store, &key, &fp).await;
    let takeover = second
        .takeover
        .expect("a claim past its lock is taken over");
    assert_eq!(second.attempt(), 2);
    assert_eq!(takeover.previous_token, first.token);
    let began = takeover.previous_began;
    assert!(
        began <= SystemTime::now() + SKEW && began + SKEW >= before,
        "the first claim began at {began:?}, not between {before:?} and now"
    );

    tokio::time::sleep(past_the_lock).await;
    let third = claimed(&store, &key, &fingerprint("b")).await;
    let takeover = third.takeover.expect("a second takeover in a row");
    assert_eq!(third.attempt(), 3);
    assert_eq!(takeover.previous_token, second.token);
    let later = takeover.previous_began.duration_since(began);
    assert!(
        later.as_ref().is_ok_and(|later| *later >= SHORT.lock / 2),
        "the second claim began a lock after the first, not {later:?}"
    );

    // Released: not a dead owner, and the count starts again.
    store.release(&key, third.token).await.unwrap();
    let fourth = claimed(&store, &key, &fp).await;
    assert_eq!(fourth.takeover, None, "a released key is claimed afresh");
    assert_eq!(fourth.attempt(), 1);
}

/// Needs a store built with [`SHORT`] durations: its lock timeout is reported,
/// and a claim extended every third of it outlives it several times over.
#[doc(hidden)]
pub async fn an_extended_claim_outlives_its_lock_and_only_its_token_extends<S: Store>(store: S) {
    assert_eq!(store.timings().lock_timeout, SHORT.lock);
    let key = record(&unique("scope"), "key-0000000e");
    let fp = fingerprint("a");
    let token = claim(&store, &key, &fp).await;
    for _ in 0..6 {
        tokio::time::sleep(SHORT.lock / 3).await;
        store.extend(&key, token).await.expect("the owner extends");
    }
    // Twice the lock later, still the owner's.
    assert!(matches!(
        store.begin(&key, &fp).await.unwrap(),
        Begin::InProgress
    ));
    assert!(matches!(
        store.extend(&key, FencingToken(token.0 + 1_000_000)).await,
        Err(StoreError::ClaimLost)
    ));
    store
        .complete(&key, token, recorded(b"slow"))
        .await
        .unwrap();
    // A completed record is nobody's claim to extend.
    assert!(matches!(
        store.extend(&key, token).await,
        Err(StoreError::ClaimLost)
    ));
    // Not extended any more, a claim expires as usual and its token is fenced.
    let other = record(&unique("scope"), "key-0000000f");
    let stale = claim(&store, &other, &fp).await;
    tokio::time::sleep(SHORT.lock + Duration::from_millis(200)).await;
    let fresh = claim(&store, &other, &fp).await;
    assert!(matches!(
        store.extend(&other, stale).await,
        Err(StoreError::ClaimLost)
    ));
    store.extend(&other, fresh).await.unwrap();
}

/// A claim completed without a replayable response: the same request is told
/// so (never claimed again), another is a mismatch, only its token completes
/// it, and after the retention the key is free.
#[doc(hidden)]
pub async fn a_completion_without_a_response_is_never_claimed_again<S: Store>(store: S) {
    let key = record(&unique("scope"), "key-0000000u");
    let (fp, other) = (fingerprint("a"), fingerprint("b"));
    let token = claim(&store, &key, &fp).await;
    assert!(matches!(
        store
            .complete(
                &key,
                FencingToken(token.0 + 1_000_000),
                Completion::Unavailable
            )
            .await,
        Err(StoreError::ClaimLost)
    ));
    store
        .complete(&key, token, Completion::Unavailable)
        .await
        .unwrap();
    for _ in 0..2 {
        assert!(matches!(
            store.begin(&key, &fp).await.unwrap(),
            Begin::ResponseUnavailable
        ));
    }
    assert!(matches!(
        store.begin(&key, &other).await.unwrap(),
        Begin::KeyReused
    ));
    assert!(matches!(
        store.complete(&key, token, recorded(b"late")).await,
        Err(StoreError::ClaimLost)
    ));
    assert!(matches!(
        store.complete(&key, token, Completion::Unavailable).await,
        Err(StoreError::ClaimLost)
    ));
    tokio::time::sleep(SHORT.retention + Duration::from_millis(200)).await;
    claim(&store, &key, &fp).await;
}

/// Needs a store built with [`SHORT`] durations.
#[doc(hidden)]
pub async fn expired_records_are_reusable_and_purged<S: Store + Maintenance>(store: S) {
    expired_records_are_reusable(store, 2).await;
}

/// For a store whose backend deletes expired records by itself (key TTLs):
/// [`expired_records_are_reusable_and_purged`] without a count, as nothing may
/// be left to purge. Needs a store built with [`SHORT`] durations.
#[doc(hidden)]
pub async fn expired_records_are_reusable_and_expire_by_themselves<S: Store + Maintenance>(
    store: S,
) {
    expired_records_are_reusable(store, 0).await;
}

async fn expired_records_are_reusable<S: Store + Maintenance>(store: S, purged_at_least: u64) {
    let key = record(&unique("scope"), "key-0000000b");
    let token = claim(&store, &key, &fingerprint("a")).await;
    store.complete(&key, token, recorded(b"old")).await.unwrap();
    let other = record(&unique("scope"), "key-0000000c");
    let token = claim(&store, &other, &fingerprint("a")).await;
    store
        .complete(&other, token, recorded(b"old"))
        .await
        .unwrap();
    tokio::time::sleep(SHORT.retention + Duration::from_millis(300)).await;
    assert!(store.purge_expired().await.unwrap() >= purged_at_least);
    // An expired key may be used again, even with another body.
    claim(&store, &key, &fingerprint("b")).await;
    claim(&store, &other, &fingerprint("b")).await;
}

/// Needs a store built with [`TOMBSTONED`] durations. A completed record
/// past its retention leaves a tombstone until its window passes: the same
/// request is told it ran and expired (never run again, with a response or
/// without one), another request under the key is a mismatch, a purge keeps
/// the tombstone (and deletes it once expired: at least `purged_at_least`
/// records), and after the window the key is free for a first claim.
async fn tombstones_answer_until_their_window_passes<S: Store + Maintenance>(
    store: S,
    purged_at_least: u64,
) {
    let d = TOMBSTONED;
    let (fp, other) = (fingerprint("a"), fingerprint("b"));
    let (answered, unavailable) = (
        record(&unique("scope"), "key-tomb-0001"),
        record(&unique("scope"), "key-tomb-0002"),
    );
    let token = claim(&store, &answered, &fp).await;
    store
        .complete(&answered, token, recorded(b"charged"))
        .await
        .unwrap();
    let token = claim(&store, &unavailable, &fp).await;
    store
        .complete(&unavailable, token, Completion::Unavailable)
        .await
        .unwrap();
    let completed = tokio::time::Instant::now();
    tokio::time::sleep(d.retention + Duration::from_millis(200)).await;

    for key in [&answered, &unavailable] {
        for _ in 0..2 {
            let begun = store.begin(key, &fp).await.unwrap();
            assert!(matches!(begun, Begin::Expired), "got {begun:?}");
        }
        let begun = store.begin(key, &other).await.unwrap();
        assert!(matches!(begun, Begin::KeyReused), "got {begun:?}");
    }
    // A purge reduces records to tombstones; it never frees their keys.
    store.purge_expired().await.unwrap();
    let begun = store.begin(&answered, &fp).await.unwrap();
    assert!(matches!(begun, Begin::Expired), "got {begun:?}");
    let begun = store.begin(&unavailable, &other).await.unwrap();
    assert!(matches!(begun, Begin::KeyReused), "got {begun:?}");
    assert!(
        completed.elapsed() < d.retention + d.tombstone,
        "the checks ran within the window"
    );

    let window_end = completed + d.retention + d.tombstone + Duration::from_millis(300);
    tokio::time::sleep_until(window_end).await;
    assert!(store.purge_expired().await.unwrap() >= purged_at_least);
    let first = claimed(&store, &answered, &fp).await;
    assert_eq!(first.attempt(), 1);
    claimed(&store, &unavailable, &other).await;
}

/// Needs a store built with [`TOMBSTONED`] durations: see
/// `tombstones_answer_until_their_window_passes`; `purge_expired` deletes
/// both tombstones once their window has passed.
#[doc(hidden)]
pub async fn tombstones_answer_until_their_window_passes_and_are_purged<S: Store + Maintenance>(
    store: S,
) {
    tombstones_answer_until_their_window_passes(store, 2).await;
}

/// For a store whose backend deletes expired tombstones by itself (key TTLs):
/// [`tombstones_answer_until_their_window_passes_and_are_purged`] without a
/// count. Needs a store built with [`TOMBSTONED`] durations.
#[doc(hidden)]
pub async fn tombstones_answer_until_their_window_passes_and_expire_by_themselves<
    S: Store + Maintenance,
>(
    store: S,
) {
    tombstones_answer_until_their_window_passes(store, 0).await;
}

/// Needs a store built with [`SHORT`] durations (no tombstones): the same
/// request, past the retention, is claimed and runs again.
#[doc(hidden)]
pub async fn without_tombstones_an_expired_key_runs_again<S: Store + Maintenance>(store: S) {
    let key = record(&unique("scope"), "key-untomb-01");
    let fp = fingerprint("a");
    let token = claim(&store, &key, &fp).await;
    store
        .complete(&key, token, recorded(b"once"))
        .await
        .unwrap();
    tokio::time::sleep(SHORT.retention + Duration::from_millis(300)).await;
    store.purge_expired().await.unwrap();
    assert_eq!(claimed(&store, &key, &fp).await.attempt(), 1);
}

/// Requests as the layer hands them over: fingerprints computed lazily from the
/// parts. The same bytes, and canonically equal JSON in other bytes, match the
/// record (in progress, then completed); other content never does, whichever
/// comparison a store makes first.
#[doc(hidden)]
pub async fn lazily_fingerprinted_requests_match_by_canonical_json<S: Store>(store: S) {
    let scope = unique("scope");
    let key = record(&scope, "key-lazy-0001");
    let json = HeaderValue::from_static("application/json");
    let request = |body: &'static str| {
        RequestFingerprint::new(
            &Method::POST,
            "/v1/orders",
            key.key(),
            key.scope().as_str(),
            Some(&json),
            body.as_bytes(),
        )
    };
    let first = request(r#"{"sku":"A","qty":1}"#);
    let same_bytes = request(r#"{"sku":"A","qty":1}"#);
    let reordered = request(r#"{ "qty": 1, "sku": "A" }"#);
    let other = request(r#"{"sku":"A","qty":2}"#);
    let token = claim(&store, &key, &first).await;
    for retry in [&same_bytes, &reordered] {
        assert!(matches!(
            store.begin(&key, retry).await.unwrap(),
            Begin::InProgress
        ));
    }
    assert!(matches!(
        store.begin(&key, &other).await.unwrap(),
        Begin::KeyReused
    ));
    store
        .complete(&key, token, recorded(b"created"))
        .await
        .unwrap();
    for retry in [&first, &same_bytes, &reordered] {
        match store.begin(&key, retry).await.unwrap() {
            Begin::Replay(stored) => assert_eq!(stored.body, Bytes::from_static(b"created")),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
    assert!(matches!(
        store.begin(&key, &other).await.unwrap(),
        Begin::KeyReused
    ));
}

/// For a store shared between processes, which compares the SHA-256
/// [`Fingerprint`]: a fingerprint computed elsewhere matches the record of the
/// request it was computed from, and another one does not. (A store whose
/// records never leave the process compares
/// [`RequestFingerprint::local`] instead, which a precomputed fingerprint only
/// shares with precomputed fingerprints.)
#[doc(hidden)]
pub async fn a_precomputed_fingerprint_matches_the_request_it_was_computed_from<
    S: Store + Maintenance,
>(
    store: S,
) {
    let key = record(&unique("scope"), "key-precomputed1");
    let json = HeaderValue::from_static("application/json");
    let request = |body: &'static str| {
        RequestFingerprint::new(
            &Method::POST,
            "/v1/orders",
            key.key(),
            key.scope().as_str(),
            Some(&json),
            body.as_bytes(),
        )
    };
    let first = request(r#"{"sku":"A","qty":1}"#);
    let token = claim(&store, &key, &first).await;
    let same: RequestFingerprint<'static> =
        (*request(r#"{ "qty": 1, "sku": "A" }"#).fingerprint()).into();
    let other: RequestFingerprint<'static> =
        (*request(r#"{"sku":"A","qty":2}"#).fingerprint()).into();
    assert!(matches!(
        store.begin(&key, &same).await.unwrap(),
        Begin::InProgress
    ));
    assert!(matches!(
        store.begin(&key, &other).await.unwrap(),
        Begin::KeyReused
    ));
    store
        .complete(&key, token, recorded(b"created"))
        .await
        .unwrap();
    assert!(matches!(
        store.begin(&key, &same).await.unwrap(),
        Begin::Replay(_)
    ));
    assert!(matches!(
        store.begin(&key, &other).await.unwrap(),
        Begin::KeyReused
    ));
}

/// Generates one `#[tokio::test]` per conformance check for a store factory
/// (see the [module documentation](crate::store::conformance)).
#[doc(hidden)]
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:path) => {
        $crate::store_conformance_tests!(@common $factory);
        $crate::store_conformance_tests!(@shared $factory);
        $crate::store_conformance_tests!(@tests $factory, SHORT:
            expired_records_are_reusable_and_purged,
        );
        $crate::store_conformance_tests!(@tests $factory, TOMBSTONED:
            tombstones_answer_until_their_window_passes_and_are_purged,
        );
    };
    // A store whose backend deletes expired records itself.
    ($factory:path, expires_by_itself) => {
        $crate::store_conformance_tests!(@common $factory);
        $crate::store_conformance_tests!(@shared $factory);
        $crate::store_conformance_tests!(@tests $factory, SHORT:
            expired_records_are_reusable_and_expire_by_themselves,
        );
        $crate::store_conformance_tests!(@tests $factory, TOMBSTONED:
            tombstones_answer_until_their_window_passes_and_expire_by_themselves,
        );
    };
    // A store whose records never leave the process: it may compare
    // `RequestFingerprint::local` rather than the SHA-256 fingerprint.
    ($factory:path, in_process) => {
        $crate::store_conformance_tests!(@common $factory);
        $crate::store_conformance_tests!(@tests $factory, SHORT:
            expired_records_are_reusable_and_purged,
        );
        $crate::store_conformance_tests!(@tests $factory, TOMBSTONED:
            tombstones_answer_until_their_window_passes_and_are_purged,
        );
    };
    // What only a store comparing the SHA-256 fingerprint guarantees.
    (@shared $factory:path) => {
        $crate::store_conformance_tests!(@tests $factory, LONG:
            a_precomputed_fingerprint_matches_the_request_it_was_computed_from,
        );
    };
    (@common $factory:path) => {
        $crate::store_conformance_tests!(@tests $factory, LONG:
            fresh_key_is_claimed_then_in_progress,
            completed_record_replays_exact_bytes_status_and_headers,
            lazily_fingerprinted_requests_match_by_canonical_json,
            release_frees_the_key_for_a_new_claim,
            only_the_token_holder_completes_or_releases,
            keys_are_scoped,
            wait_is_woken_by_completion,
            wait_is_woken_by_release,
            wait_gives_up_at_its_timeout,
            concurrent_begins_claim_exactly_once,
            purge_scope_erases_one_tenants_records_only,
        );
        $crate::store_conformance_tests!(@tests $factory, SHORT:
            expired_lock_is_taken_over_and_the_old_token_is_fenced,
            a_takeover_reports_its_attempt_and_the_previous_owner,
            an_extended_claim_outlives_its_lock_and_only_its_token_extends,
            a_completion_without_a_response_is_never_claimed_again,
            a_late_extend_or_complete_without_a_takeover_succeeds,
            without_tombstones_an_expired_key_runs_again,
        );
    };
    // Operators' inspection and release (`store::inspect::Inspect`), for a
    // store that implements it.
    (inspect: $factory:path) => {
        $crate::store_conformance_tests!(@tests $factory, LONG:
            inspect_shows_every_state_within_its_scope_only,
        );
        $crate::store_conformance_tests!(@tests $factory, RELEASABLE:
            a_released_key_is_claimable_again_and_its_old_owner_fenced,
        );
        $crate::store_conformance_tests!(@tests $factory, SHORT:
            release_stuck_is_fenced_by_the_token_it_was_given,
        );
        $crate::store_conformance_tests!(@tests $factory, TOMBSTONED:
            inspect_shows_a_tombstone_until_its_window_passes,
        );
    };
    (@tests $factory:path, $durations:ident: $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(store) = $factory($crate::store::conformance::$durations).await {
                    $crate::store::conformance::$name(store).await;
                }
            }
        )*
    };
}

// ---- Late extension and completion (no competing claim) -------------------

/// Needs a store built with [`SHORT`] durations. A claim whose lock ran out
/// but which nobody took over is still its owner's: a late `extend` holds it
/// again (duplicates wait), and a late `complete` or `complete_unavailable`
/// records it, which then replays. Only a takeover fences the old token
/// (`expired_lock_is_taken_over_and_the_old_token_is_fenced`).
#[doc(hidden)]
pub async fn a_late_extend_or_complete_without_a_takeover_succeeds<S: Store>(store: S) {
    let late = SHORT.lock + Duration::from_millis(200);
    let fp = fingerprint("a");
    let (extended, completed, unavailable) = (
        record(&unique("scope"), "key-late-ext1"),
        record(&unique("scope"), "key-late-cmp1"),
        record(&unique("scope"), "key-late-una1"),
    );
    let tokens = (
        claim(&store, &extended, &fp).await,
        claim(&store, &completed, &fp).await,
        claim(&store, &unavailable, &fp).await,
    );
    tokio::time::sleep(late).await;

    store
        .extend(&extended, tokens.0)
        .await
        .expect("a late extend without a takeover holds the claim again");
    assert!(matches!(
        store.begin(&extended, &fp).await.unwrap(),
        Begin::InProgress
    ));
    store
        .complete(&extended, tokens.0, recorded(b"extended late"))
        .await
        .unwrap();
    match store.begin(&extended, &fp).await.unwrap() {
        Begin::Replay(stored) => assert_eq!(stored.body, Bytes::from_static(b"extended late")),
        other => panic!("expected a replay, got {other:?}"),
    }

    store
        .complete(&completed, tokens.1, recorded(b"completed late"))
        .await
        .expect("a late complete without a takeover records the response");
    match store.begin(&completed, &fp).await.unwrap() {
        Begin::Replay(stored) => assert_eq!(stored.body, Bytes::from_static(b"completed late")),
        other => panic!("expected a replay, got {other:?}"),
    }

    store
        .complete(&unavailable, tokens.2, Completion::Unavailable)
        .await
        .expect("a late complete_unavailable without a takeover records it");
    assert!(matches!(
        store.begin(&unavailable, &fp).await.unwrap(),
        Begin::ResponseUnavailable
    ));
}

// ---- Inspection and operator release -------------------------------------

/// The claim `inspect` shows for `key`, which must be in progress.
async fn in_progress<S: Inspect>(store: &S, key: &RecordKey) -> crate::store::inspect::InProgress {
    match store.inspect(key).await.expect("inspect") {
        KeyState::InProgress(claim) => claim,
        other => panic!("expected a claim in progress, got {other:?}"),
    }
}

/// Needs a store built with [`LONG`] durations. `inspect` shows a key
/// absent, then in progress (its token, attempt, start and lock expiry),
/// then completed (status, body size, expiry) or unavailable; the same key
/// string in another scope is absent, and so is a released key.
#[doc(hidden)]
pub async fn inspect_shows_every_state_within_its_scope_only<S: Store + Inspect>(store: S) {
    let scope = unique("scope");
    let key = record(&scope, "key-inspect-01");
    let fp = fingerprint("a");
    assert_eq!(store.inspect(&key).await.unwrap(), KeyState::Absent);

    let made = claimed(&store, &key, &fp).await;
    let shown = in_progress(&store, &key).await;
    assert_eq!((shown.token, shown.attempt), (made.token, 1));
    let lock = shown
        .lock_expires
        .duration_since(shown.since)
        .expect("the lock expires after the claim began");
    let slack = Duration::from_secs(2);
    assert!(
        lock + slack >= LONG.lock && lock <= LONG.lock + slack,
        "lock {lock:?}"
    );
    // Another tenant's view of the same key string: nothing.
    let other = record(&unique("other"), "key-inspect-01");
    assert_eq!(store.inspect(&other).await.unwrap(), KeyState::Absent);

    let body: &'static [u8] = b"twelve bytes";
    store
        .complete(&key, made.token, recorded(body))
        .await
        .unwrap();
    match store.inspect(&key).await.unwrap() {
        KeyState::Completed {
            status,
            body_bytes,
            expires,
        } => {
            assert_eq!(
                (status, body_bytes),
                (StatusCode::CREATED, body.len() as u64)
            );
            let kept = expires.duration_since(shown.since).expect("expires later");
            assert!(
                kept + slack >= LONG.retention && kept <= LONG.retention + Duration::from_secs(60)
            );
        }
        other => panic!("expected a completed record, got {other:?}"),
    }
    assert_eq!(store.inspect(&other).await.unwrap(), KeyState::Absent);

    let unavailable = record(&scope, "key-inspect-02");
    let token = claim(&store, &unavailable, &fp).await;
    store
        .complete(&unavailable, token, Completion::Unavailable)
        .await
        .unwrap();
    assert!(matches!(
        store.inspect(&unavailable).await.unwrap(),
        KeyState::Unavailable { .. }
    ));

    let released = record(&scope, "key-inspect-03");
    let token = claim(&store, &released, &fp).await;
    store.release(&released, token).await.unwrap();
    assert_eq!(store.inspect(&released).await.unwrap(), KeyState::Absent);
}

/// Needs a store built with [`TOMBSTONED`] durations. A completed record
/// past its retention is shown as its tombstone, expiring at the window's
/// end (never to another scope), and then as absent.
#[doc(hidden)]
pub async fn inspect_shows_a_tombstone_until_its_window_passes<S: Store + Inspect>(store: S) {
    let d = TOMBSTONED;
    let key = record(&unique("scope"), "key-inspect-tomb");
    let fp = fingerprint("a");
    let token = claim(&store, &key, &fp).await;
    store
        .complete(&key, token, recorded(b"kept"))
        .await
        .unwrap();
    let completed = std::time::SystemTime::now();
    let started = tokio::time::Instant::now();
    tokio::time::sleep(d.retention + Duration::from_millis(200)).await;

    match store.inspect(&key).await.unwrap() {
        KeyState::Tombstone { expires } => {
            let window = expires.duration_since(completed).expect("expires later");
            let slack = Duration::from_secs(1);
            assert!(
                window + slack >= d.retention + d.tombstone
                    && window <= d.retention + d.tombstone + slack,
                "tombstone expires {window:?} after completion"
            );
        }
        other => panic!("expected a tombstone, got {other:?}"),
    }
    let other = record(&unique("other"), "key-inspect-tomb");
    assert_eq!(store.inspect(&other).await.unwrap(), KeyState::Absent);
    assert!(
        started.elapsed() < d.retention + d.tombstone,
        "checked within the window"
    );

    tokio::time::sleep_until(started + d.retention + d.tombstone + Duration::from_millis(300))
        .await;
    assert_eq!(store.inspect(&key).await.unwrap(), KeyState::Absent);
}

/// Needs a store built with [`SHORT`] durations. `release_stuck` frees a
/// claim only for the token that owns it: a forged token, the token of a
/// claim taken over since (whose new owner then completes as usual), and
/// the token of a completed record are refused and change nothing; a key
/// with no record is absent.
#[doc(hidden)]
pub async fn release_stuck_is_fenced_by_the_token_it_was_given<S: Store + Inspect>(store: S) {
    let key = record(&unique("scope"), "key-release-01");
    let fp = fingerprint("a");
    let actor = "conformance";
    assert_eq!(
        store
            .release_stuck(&key, FencingToken(1), actor)
            .await
            .unwrap(),
        Release::Absent
    );
    let first = claim(&store, &key, &fp).await;
    let seen = in_progress(&store, &key).await;
    assert_eq!(seen.token, first);
    let forged = FencingToken(first.0 + 1_000_000);
    assert_eq!(
        store.release_stuck(&key, forged, actor).await.unwrap(),
        Release::NotOwner
    );
    // The owner's token, but its lock is fresh (just claimed, or extended
    // by a keep-alive): the owner is alive and keeps its claim.
    assert_eq!(
        store.release_stuck(&key, first, actor).await.unwrap(),
        Release::OwnerAlive
    );
    assert_eq!(in_progress(&store, &key).await.token, first);

    // The inspected owner's lock runs out and a new request takes the key
    // over: the operator's release with the inspected token must not cut
    // the new, live owner off.
    tokio::time::sleep(SHORT.lock + Duration::from_millis(200)).await;
    let second = claimed(&store, &key, &fp).await;
    assert_eq!(second.takeover.map(|t| t.previous_token), Some(first));
    assert_eq!(
        store.release_stuck(&key, seen.token, actor).await.unwrap(),
        Release::NotOwner
    );
    assert_eq!(in_progress(&store, &key).await.token, second.token);
    store
        .complete(&key, second.token, recorded(b"live owner"))
        .await
        .expect("the live owner was not cut off");

    // A completed record is nobody's to release.
    assert_eq!(
        store
            .release_stuck(&key, second.token, actor)
            .await
            .unwrap(),
        Release::NotOwner
    );
    match store.begin(&key, &fp).await.unwrap() {
        Begin::Replay(stored) => assert_eq!(stored.body, Bytes::from_static(b"live owner")),
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// Needs a store built with [`RELEASABLE`] durations. A claim released by
/// an operator with its token, once nine tenths of its lock ran down
/// unextended (its owner dead), frees the key at once, before the lock runs out: a
/// waiter is woken, the next request (even with another body) claims it,
/// and the dead owner's late completion is refused.
#[doc(hidden)]
pub async fn a_released_key_is_claimable_again_and_its_old_owner_fenced<S: Store + Inspect>(
    store: S,
) {
    let store = Arc::new(store);
    let key = record(&unique("scope"), "key-release-02");
    let stuck = claim(&*store, &key, &fingerprint("a")).await;
    let lock_ends = tokio::time::Instant::now() + RELEASABLE.lock;
    let waiter = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { store.wait(&key, Duration::from_secs(30)).await })
    };
    let token = in_progress(&*store, &key).await.token;
    assert_eq!(
        store
            .release_stuck(&key, token, "conformance")
            .await
            .unwrap(),
        Release::OwnerAlive
    );
    tokio::time::sleep(RELEASABLE.lock - RELEASABLE.lock / 10 + Duration::from_millis(300)).await;
    assert_eq!(
        store
            .release_stuck(&key, token, "conformance")
            .await
            .unwrap(),
        Release::Released
    );
    tokio::time::timeout_at(lock_ends, waiter)
        .await
        .expect("the waiter was woken by the release, before the lock ran out")
        .unwrap()
        .unwrap();
    assert_eq!(store.inspect(&key).await.unwrap(), KeyState::Absent);
    let next = claimed(&*store, &key, &fingerprint("b")).await;
    assert_ne!(next.token, stuck);
    assert!(matches!(
        store.complete(&key, stuck, recorded(b"late")).await,
        Err(StoreError::ClaimLost)
    ));
    assert_eq!(
        store
            .release_stuck(&key, stuck, "conformance")
            .await
            .unwrap(),
        Release::NotOwner
    );
    store
        .complete(&key, next.token, recorded(b"next"))
        .await
        .unwrap();
}
