//! Exact digest versus canonical fingerprint.

use super::*;
use tower_idempotency::store::Completion;

/// A request whose fingerprint was computed elsewhere (no exact bytes, and a
/// local digest of the fingerprint rather than of the canonical form).
fn pre(fingerprint: Fingerprint) -> RequestFingerprint<'static> {
    fingerprint.into()
}

/// Builds lazily fingerprinted requests like the layer does.
struct Requests {
    key: RecordKey,
    json: HeaderValue,
    text: HeaderValue,
}

impl Requests {
    fn new(key: RecordKey) -> Self {
        Self {
            key,
            json: HeaderValue::from_static("application/json"),
            text: HeaderValue::from_static("text/plain"),
        }
    }

    fn json<'a>(&'a self, body: &'a str) -> RequestFingerprint<'a> {
        self.with(Some(&self.json), body)
    }

    fn text<'a>(&'a self, body: &'a str) -> RequestFingerprint<'a> {
        self.with(Some(&self.text), body)
    }

    fn with<'a>(&'a self, ct: Option<&'a HeaderValue>, body: &'a str) -> RequestFingerprint<'a> {
        RequestFingerprint::new(
            &Method::POST,
            "/v1/orders",
            self.key.key(),
            self.key.scope().as_str(),
            ct,
            body.as_bytes(),
        )
    }
}

#[tokio::test]
async fn canonically_equal_bytes_match_and_other_content_mismatches() {
    let store = MemoryStore::new();
    let r = Requests::new(record("acme", "exact-00000001"));
    let first = r#"{"sku":"A","qty":1,"tags":["x","y"]}"#;
    let reordered = r#"{ "tags": ["x", "y"], "qty": 1, "sku": "A" }"#;
    let others = [
        r#"{"sku":"A","qty":2,"tags":["x","y"]}"#,
        r#"{"sku":"A","qty":1.0,"tags":["x","y"]}"#,
        r#"{"sku":"A","qty":1,"tags":["y","x"]}"#,
        r#"{"sku":"A","qty":1}"#,
        "",
    ];
    let key = r.key.clone();
    let token = claim(&store, &key, &r.json(first)).await;
    in_progress(&store, &key, &r.json(first)).await;
    in_progress(&store, &key, &r.json(reordered)).await;
    for other in others {
        mismatch(&store, &key, &r.json(other)).await;
    }
    // The same bytes as raw text (no canonicalisation) are another request.
    mismatch(&store, &key, &r.text(first)).await;
    mismatch(&store, &key, &r.with(None, first)).await;
    // A precomputed fingerprint: records never leave the process, so the store
    // compares local digests, and a precomputed fingerprint's is a digest of
    // the fingerprint itself: another request, whatever the fingerprint.
    mismatch(&store, &key, &pre(*r.json(reordered).fingerprint())).await;
    mismatch(&store, &key, &pre(*r.json(others[0]).fingerprint())).await;

    store
        .complete(&key, token, Completion::Response(body_response("created")))
        .await
        .unwrap();
    for same in [r.json(first), r.json(reordered)] {
        assert_eq!(replayed(&store, &key, &same).await.body, "created");
    }
    mismatch(&store, &key, &pre(*r.json(first).fingerprint())).await;
    for other in others {
        mismatch(&store, &key, &r.json(other)).await;
    }
    mismatch(&store, &key, &r.text(first)).await;
    mismatch(&store, &key, &r.text(reordered)).await;
}

/// The first request's bytes are not canonical: later canonical-but-different
/// bytes still match, by fingerprint.
#[tokio::test]
async fn a_claim_from_non_canonical_bytes_matches_canonical_retries() {
    let store = MemoryStore::new();
    let r = Requests::new(record("acme", "exact-00000002"));
    let key = r.key.clone();
    let token = claim(&store, &key, &r.json("{ \"b\" : [1, 2], \"a\" : {} }")).await;
    in_progress(&store, &key, &r.json(r#"{"a":{},"b":[1,2]}"#)).await;
    mismatch(&store, &key, &r.json(r#"{"a":{},"b":[2,1]}"#)).await;
    store
        .complete(
            &key,
            token,
            Completion::Response(body_response(vec![b'z'; 1500])),
        )
        .await
        .unwrap();
    let replay = replayed(&store, &key, &r.json(r#"{"a":{},"b":[1,2]}"#)).await;
    assert_eq!(replay.body.len(), 1500);
    mismatch(&store, &key, &r.json(r#"{"a":{},"b":[2,1]}"#)).await;
}

/// A takeover, or a re-claim after a release, carries the new request's exact
/// digest: the old request's bytes must not match the new record by digest.
#[tokio::test(start_paused = true)]
async fn a_new_claim_does_not_inherit_the_old_exact_digest() {
    let store = MemoryStore::builder()
        .with_lock_timeout(Duration::from_millis(100))
        .with_retention(Duration::from_millis(300))
        // After the retention the key is free: what this test is about.
        .with_tombstone(Duration::ZERO)
        .build();
    let r = Requests::new(record("acme", "exact-00000003"));
    let key = r.key.clone();
    let (old, new) = (r#"{"v":1}"#, r#"{"v":2}"#);

    // After a release.
    let token = claim(&store, &key, &r.json(old)).await;
    store.release(&key, token).await.unwrap();
    let token = claim(&store, &key, &r.json(new)).await;
    mismatch(&store, &key, &r.json(old)).await;
    in_progress(&store, &key, &r.json(new)).await;

    // After a takeover of an expired claim.
    tokio::time::advance(Duration::from_millis(150)).await;
    let dead = token;
    let token = claim(&store, &key, &r.json(old)).await;
    mismatch(&store, &key, &r.json(new)).await;
    claim_lost(
        store
            .complete(&key, dead, Completion::Response(body_response("new")))
            .await,
    );
    store
        .complete(&key, token, Completion::Response(body_response("old")))
        .await
        .unwrap();
    mismatch(&store, &key, &r.json(new)).await;

    // After a takeover of an expired completion.
    tokio::time::advance(Duration::from_millis(400)).await;
    let token = claim(&store, &key, &r.json(new)).await;
    mismatch(&store, &key, &r.json(old)).await;
    store
        .complete(&key, token, Completion::Response(body_response("new")))
        .await
        .unwrap();
    mismatch(&store, &key, &r.json(old)).await;
    assert_eq!(replayed(&store, &key, &r.json(new)).await.body, "new");
}

/// Fingerprints computed elsewhere (as the `Engine` hands them over) are
/// compared among themselves: the same fingerprint matches its claim, in
/// progress and completed, and another one never does.
#[tokio::test]
async fn precomputed_fingerprints_match_each_other_by_fingerprint() {
    let store = MemoryStore::new();
    let r = Requests::new(record("acme", "exact-00000004"));
    let key = r.key.clone();
    let first = *r.json(r#"{"sku":"A","qty":1}"#).fingerprint();
    let reordered = *r.json(r#"{ "qty": 1, "sku": "A" }"#).fingerprint();
    let other = *r.json(r#"{"sku":"A","qty":2}"#).fingerprint();
    let token = claim(&store, &key, &pre(first)).await;
    in_progress(&store, &key, &pre(reordered)).await;
    mismatch(&store, &key, &pre(other)).await;
    // A request given by its parts is compared by its own local digest.
    mismatch(&store, &key, &r.json(r#"{"sku":"A","qty":1}"#)).await;
    store
        .complete(&key, token, Completion::Response(body_response("created")))
        .await
        .unwrap();
    assert_eq!(
        replayed(&store, &key, &pre(reordered)).await.body,
        "created"
    );
    mismatch(&store, &key, &pre(other)).await;
}
