//! The packed encoding of odd responses, and replays independent of the record.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

/// Replays `response` through a claim and completion, and checks it comes
/// back byte for byte, sensitive flags included.
async fn round_trip(store: &MemoryStore, key: &RecordKey, response: StoredResponse) {
    let token = claim(store, key, &fp("x")).await;
    store
        .complete(key, token, Completion::Response(response.clone()))
        .await
        .unwrap();
    for _ in 0..2 {
        let replay = replayed(store, key, &fp("x")).await;
        assert_eq!(replay.status, response.status);
        assert_eq!(replay.headers.len(), response.headers.len());
        for ((n1, v1), (n2, v2)) in replay.headers.iter().zip(&response.headers) {
            assert_eq!(n1, n2);
            assert_eq!(v1.as_bytes(), v2.as_bytes());
            assert_eq!(
                v1.is_sensitive(),
                v2.is_sensitive(),
                "sensitive flag of {n1}"
            );
        }
        assert_eq!(&replay.body[..], &response.body[..]);
        assert_eq!(*replay, response);
    }
}

#[tokio::test]
async fn odd_responses_round_trip_byte_for_byte() {
    let store = MemoryStore::new();
    let pattern = |n: usize| Bytes::from((0..n).map(|i| (i * 7 + 3) as u8).collect::<Vec<_>>());
    // Bodies around the packing threshold, with and without headers.
    for (i, n) in [0usize, 1, 127, 128, 1023, 1024, 1025, 1026, 4096, 70_000]
        .into_iter()
        .enumerate()
    {
        let bare = StoredResponse {
            status: StatusCode::OK,
            headers: Vec::new(),
            body: pattern(n),
        };
        round_trip(&store, &record("bodies", &format!("bare-{i:08}")), bare).await;
        round_trip(
            &store,
            &record("bodies", &format!("hdrs-{i:08}")),
            body_response(pattern(n)),
        )
        .await;
    }

    // Many headers: repeated names in order, obs-text, sensitive flags,
    // empty values, long names and values, standard and custom names.
    let mut headers = Vec::new();
    for i in 0..300u32 {
        let name = match i % 5 {
            0 => HeaderName::from_static("set-cookie"),
            1 => HeaderName::from_static("link"),
            2 => HeaderName::from_bytes(format!("x-h-{i}").as_bytes()).unwrap(),
            3 => HeaderName::from_bytes("x".repeat(200 + i as usize).as_bytes()).unwrap(),
            _ => HeaderName::from_static("content-type"),
        };
        let mut value = match i % 4 {
            0 => HeaderValue::from_bytes(&[0x80, b'a', 0xff, b' ', 0xe9, b'\t', 0x9f]).unwrap(),
            1 => HeaderValue::from_static(""),
            2 => HeaderValue::from_bytes(format!("v{i}-").repeat(i as usize % 70).as_bytes())
                .unwrap(),
            _ => HeaderValue::from_bytes(&(0x80..=0xffu8).collect::<Vec<_>>()).unwrap(),
        };
        value.set_sensitive(i % 3 == 0);
        headers.push((name, value));
    }
    for (i, body) in [pattern(0), pattern(1024), pattern(1025)]
        .into_iter()
        .enumerate()
    {
        round_trip(
            &store,
            &record("headers", &format!("many-{i:08}")),
            StoredResponse {
                status: StatusCode::from_u16(599).unwrap(),
                headers: headers.clone(),
                body,
            },
        )
        .await;
    }

    // Statuses at the edges.
    for (i, status) in [100u16, 101, 204, 304, 999].into_iter().enumerate() {
        round_trip(
            &store,
            &record("status", &format!("status-{i:08}")),
            StoredResponse {
                status: StatusCode::from_u16(status).unwrap(),
                headers: vec![(
                    HeaderName::from_static("etag"),
                    HeaderValue::from_static("\"x\""),
                )],
                body: Bytes::new(),
            },
        )
        .await;
    }

    // Long identities (multi-byte length prefixes) and non-ASCII scopes.
    let long_scope = "ş".repeat(5_000);
    round_trip(
        &store,
        &record(&long_scope, &"k".repeat(128)),
        body_response(pattern(1000)),
    )
    .await;
    round_trip(&store, &record("", "12345678"), body_response(pattern(10))).await;
}

/// A body sliced out of a larger buffer replays exactly its own bytes, and a
/// replay outlives the record it was read from.
#[tokio::test]
async fn replays_are_independent_of_the_record() {
    let store = MemoryStore::new();
    let big = Bytes::from((0..4096u32).map(|i| i as u8).collect::<Vec<_>>());
    for (i, range) in [
        (0usize, 0usize),
        (10, 20),
        (100, 1124),
        (100, 1125),
        (0, 4096),
    ]
    .into_iter()
    .enumerate()
    {
        let key = record("slices", &format!("slice-{i:08}"));
        round_trip(&store, &key, body_response(big.slice(range.0..range.1))).await;
    }
    let key = record("outlive", "outlive-0001");
    let token = claim(&store, &key, &fp("x")).await;
    store
        .complete(
            &key,
            token,
            Completion::Response(body_response(&b"kept after purge"[..])),
        )
        .await
        .unwrap();
    let replay = replayed(&store, &key, &fp("x")).await;
    store.purge_scope(&Scope::new("outlive")).await.unwrap();
    // A new record of the same key does not disturb the earlier replay.
    let token = claim(&store, &key, &fp("x")).await;
    store
        .complete(
            &key,
            token,
            Completion::Response(body_response(&b"another response"[..])),
        )
        .await
        .unwrap();
    drop(store);
    assert_eq!(replay.body, "kept after purge");
    assert_eq!(replay.headers[0].1, "text/plain");
}
