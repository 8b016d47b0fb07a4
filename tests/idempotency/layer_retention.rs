//! `Idempotency-Key-Retention`: the store's retention in seconds on every
//! answer whose key is kept (the recorded first answer, its replays, a
//! response too large to record), never on refusals or responses the policy
//! does not record, and never stored in the record itself.

use tower_idempotency_tests::oneshot;

use oneshot::*;

use axum::body::Body;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::Layer;
use tower_idempotency::idempotency::IDEMPOTENCY_KEY_RETENTION;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};

const KEY: &str = "order-7f3a9c2e";
const TWO_HOURS: Duration = Duration::from_secs(2 * 3600);

/// `201 {"order":N}`, or the status named by an `x-status` request header.
async fn order(req: Request<Body>, run: usize) -> Result<Response<Body>, Infallible> {
    let status = req
        .headers()
        .get("x-status")
        .map_or(201, |v| v.to_str().unwrap().parse::<u16>().unwrap());
    Ok(Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(format!(r#"{{"order":{run}}}"#)))
        .unwrap())
}

fn request(method: Method, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri("/v1/orders")
        .header(CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    let mut req = builder.body(Body::from(body.to_owned())).unwrap();
    req.extensions_mut().insert(Scope::new("merchant_1"));
    req
}

fn post(key: &str, body: &str) -> Request<Body> {
    request(Method::POST, Some(key), body)
}

fn retention(reply: &Reply) -> Option<&str> {
    let value = reply.headers.get(IDEMPOTENCY_KEY_RETENTION)?;
    Some(value.to_str().unwrap())
}

#[tokio::test]
async fn the_recorded_answer_and_every_replay_carry_the_stores_retention_in_seconds() {
    let store = Arc::new(MemoryStore::builder().with_retention(TWO_HOURS).build());
    // Even listed among the replayed headers, the value is not recorded: it is
    // added after the record's headers were taken.
    let layer = IdempotencyLayer::new(store.clone())
        .with_replayed_headers([CONTENT_TYPE, IDEMPOTENCY_KEY_RETENTION]);
    let runs = Runs::default();
    let svc = layer.layer(handler(&runs, order));

    let first = send(&svc, post(KEY, "{}")).await;
    first.assert_order(1, false);
    assert_eq!(retention(&first), Some("7200"), "{first:?}");
    for _ in 0..2 {
        let replay = send(&svc, post(KEY, "{}")).await;
        replay.assert_order(1, true);
        assert_eq!(retention(&replay), Some("7200"), "{replay:?}");
    }

    // Another layer over the same store, with the header off, replays the
    // record as it was stored: without it.
    let quiet = IdempotencyLayer::new(store)
        .with_retention_header(false)
        .layer(handler(&runs, order));
    let replay = send(&quiet, post(KEY, "{}")).await;
    replay.assert_order(1, true);
    assert_eq!(retention(&replay), None, "{replay:?}");
    // Nor does it advertise on its own new records.
    let fresh = send(&quiet, post("order-quiet-01", "{}")).await;
    fresh.assert_order(2, false);
    assert_eq!(retention(&fresh), None, "{fresh:?}");
    assert_eq!(runs.get(), 2);
}

#[tokio::test]
async fn refusals_and_responses_not_recorded_carry_no_retention() {
    let layer = IdempotencyLayer::new(MemoryStore::builder().with_retention(TWO_HOURS).build());
    let runs = Runs::default();
    let svc = layer.layer(handler(&runs, order));

    // A status the default policy (201 only) does not record: the key is released.
    let not_recorded = send(&svc, with_header(post(KEY, "{}"), "x-status", "200")).await;
    assert_eq!(not_recorded.status, StatusCode::OK);
    assert_eq!(retention(&not_recorded), None, "{not_recorded:?}");
    // A method the layer does not apply to.
    let passthrough = send(&svc, request(Method::GET, None, "")).await;
    assert_eq!(passthrough.status, StatusCode::CREATED);
    assert_eq!(retention(&passthrough), None, "{passthrough:?}");

    send(&svc, post(KEY, "{}")).await.assert_order(3, false);
    let missing = send(&svc, request(Method::POST, None, "{}")).await;
    missing.assert_refusal(StatusCode::BAD_REQUEST, "idempotency_key_required");
    assert_eq!(retention(&missing), None, "{missing:?}");
    let reused = send(&svc, post(KEY, r#"{"other":1}"#)).await;
    reused.assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    assert_eq!(retention(&reused), None, "{reused:?}");
}

#[tokio::test]
async fn a_response_too_large_to_record_keeps_its_key_and_says_for_how_long() {
    let layer = IdempotencyLayer::new(MemoryStore::builder().with_retention(TWO_HOURS).build())
        .with_record_limit(4);
    let runs = Runs::default();
    let svc = layer.layer(handler(&runs, order));

    let first = send(&svc, post(KEY, "{}")).await;
    first.assert_order(1, false);
    assert_eq!(retention(&first), Some("7200"), "{first:?}");
    let retry = send(&svc, post(KEY, "{}")).await;
    retry.assert_refusal(StatusCode::GONE, "idempotency_response_unavailable");
    assert_eq!(retention(&retry), None, "{retry:?}");
}

/// A body that is not ready at the first poll: its response is streamed to
/// the caller, and recorded as it goes.
struct Late(Option<Bytes>, bool);

impl http_body::Body for Late {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if !self.1 {
            self.1 = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.0.take().map(|data| Ok(Frame::data(data))))
    }
}

#[tokio::test]
async fn a_streamed_recorded_answer_carries_it_in_its_head() {
    let layer = IdempotencyLayer::new(MemoryStore::builder().with_retention(TWO_HOURS).build());
    let runs = Runs::default();
    let svc = layer.layer(handler(
        &runs,
        |_req: Request<Body>, run: usize| async move {
            let body = Late(Some(Bytes::from(format!(r#"{{"order":{run}}}"#))), false);
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Body::new(body))
                    .unwrap(),
            )
        },
    ));

    let first = send(&svc, post(KEY, "{}")).await;
    first.assert_order(1, false);
    assert_eq!(retention(&first), Some("7200"), "{first:?}");
    // Recorded behind the stream: the retry waits for it and replays it.
    let replay = send(&svc, post(KEY, "{}")).await;
    replay.assert_order(1, true);
    assert_eq!(retention(&replay), Some("7200"), "{replay:?}");
    assert_eq!(runs.get(), 1);
}

/// A retry two days late, past the retention (24 h): the record is gone, its
/// tombstone is not, so the same request is refused with `410
/// idempotency_key_expired` (its own problem type) and the handler does not
/// run a second time; another body under the key is key reuse. Once the
/// tombstone window has passed too, the key is free; with tombstones off, the
/// late retry runs again.
#[tokio::test(start_paused = true)]
async fn a_retry_after_the_retention_is_refused_as_expired_and_never_runs_again() {
    let day = Duration::from_secs(24 * 3600);
    let store = MemoryStore::builder()
        .with_retention(day)
        .with_tombstone(7 * day)
        .build();
    let layer =
        IdempotencyLayer::new(store).with_error_format(tower_idempotency::ErrorFormat::Problem);
    let runs = Runs::default();
    let svc = layer.layer(handler(&runs, order));
    send(&svc, post(KEY, r#"{"cents":4200}"#))
        .await
        .assert_order(1, false);

    tokio::time::advance(2 * day).await;
    for _ in 0..2 {
        let late = send(&svc, post(KEY, r#"{"cents":4200}"#)).await;
        assert_eq!(late.status, StatusCode::GONE, "{late:?}");
        let body = late.json();
        assert_eq!(body["code"], "idempotency_key_expired");
        assert_eq!(
            body["type"],
            tower_idempotency::Refusal::KeyExpired.problem_type()
        );
        assert_ne!(
            body["type"],
            tower_idempotency::Refusal::ResponseUnavailable.problem_type()
        );
        assert!(late.headers.get(http::header::RETRY_AFTER).is_none());
    }
    let other = send(&svc, post(KEY, r#"{"cents":9900}"#)).await;
    assert_eq!(other.json()["code"], "idempotency_key_reuse", "{other:?}");
    assert_eq!(runs.get(), 1, "the handler ran once");

    tokio::time::advance(6 * day).await;
    send(&svc, post(KEY, r#"{"cents":4200}"#))
        .await
        .assert_order(2, false);

    // Tombstones off: the same late retry runs again.
    let off = MemoryStore::builder()
        .with_retention(day)
        .with_tombstone(Duration::ZERO)
        .build();
    let runs = Runs::default();
    let svc = IdempotencyLayer::new(off).layer(handler(&runs, order));
    send(&svc, post(KEY, "{}")).await.assert_order(1, false);
    tokio::time::advance(2 * day).await;
    send(&svc, post(KEY, "{}")).await.assert_order(2, false);
}
