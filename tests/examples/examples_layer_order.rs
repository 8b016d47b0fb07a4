//! `examples/layer_order.rs`: compression outside the layer (stored bytes are
//! identity, every answer is encoded for its own request), the body limit
//! outside (refused before anything is buffered or claimed), the timeout
//! outside (the handler finishes, the retry replays), over loopback HTTP; and the binary.

// The example's own source (an example is no crate to depend on): what
// users run is what these tests drive.
#[allow(dead_code)]
#[path = "../../examples/layer_order.rs"]
mod example;
use tower_idempotency_tests::http;

use example::Limits;
use http::{serve, HttpClient, Reply};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_idempotency::store::{Begin, RecordKey};
use tower_idempotency::{
    fingerprint::RequestFingerprint, store::Store, IdempotencyKey, MemoryStore, Scope,
};

const BODY: &str = r#"{"sku":"A-1","qty":2}"#;

struct Stack {
    client: HttpClient,
    addr: std::net::SocketAddr,
    store: Arc<MemoryStore>,
    orders: Arc<AtomicU64>,
}

async fn stack(limits: Limits) -> Stack {
    let store = Arc::new(MemoryStore::new());
    let orders = Arc::new(AtomicU64::new(0));
    let addr = serve(example::app(store.clone(), limits, orders.clone())).await;
    Stack {
        client: HttpClient::new(addr),
        addr,
        store,
        orders,
    }
}

async fn post(stack: &Stack, path: &str, key: &str, accept: Option<&str>) -> Reply {
    let mut headers = vec![("authorization", "Bearer acme"), ("idempotency-key", key)];
    if let Some(encoding) = accept {
        headers.push(("accept-encoding", encoding));
    }
    stack.client.post_json(path, &headers, BODY).await
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

fn encoding(reply: &Reply) -> Option<&str> {
    reply
        .headers
        .get("content-encoding")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn replays_are_encoded_per_request_and_the_record_is_identity_bytes() {
    let stack = stack(Limits::default()).await;
    let first = post(&stack, "/v1/orders", "order-0001", Some("gzip")).await;
    assert_eq!(first.status, 201);
    assert_eq!(encoding(&first), Some("gzip"));
    let plain = gunzip(&first.body);
    let order: serde_json::Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(order["id"], "ord_0001");

    // A retry that accepts no encoding gets identity bytes: the same JSON.
    let identity = post(&stack, "/v1/orders", "order-0001", None).await;
    assert_eq!(identity.status, 201);
    assert!(identity.replayed());
    assert_eq!(encoding(&identity), None);
    assert_eq!(identity.body, plain);
    // One that accepts gzip again gets gzip again; an unknown coding, identity.
    let gzip_again = post(&stack, "/v1/orders", "order-0001", Some("gzip")).await;
    assert!(gzip_again.replayed());
    assert_eq!(encoding(&gzip_again), Some("gzip"));
    assert_eq!(gunzip(&gzip_again.body), plain);
    let unknown = post(&stack, "/v1/orders", "order-0001", Some("x-unknown")).await;
    assert!(unknown.replayed());
    assert_eq!(encoding(&unknown), None);
    assert_eq!(unknown.body, plain);
    assert_eq!(
        stack.orders.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );

    // The record itself: identity bytes, no Content-Encoding.
    let key = IdempotencyKey::parse(b"order-0001").unwrap();
    let json = ::http::HeaderValue::from_static("application/json");
    // Given by its parts, as the layer gives it (MemoryStore compares an
    // in-process digest of them).
    let method = ::http::Method::POST;
    let fingerprint = RequestFingerprint::new(
        &method,
        "/v1/orders",
        &key,
        "acme",
        Some(&json),
        BODY.as_bytes(),
    );
    let record = RecordKey::new(Scope::new("acme"), key.clone());
    let Begin::Replay(stored) = stack.store.begin(&record, &fingerprint).await.unwrap() else {
        panic!("the request is recorded");
    };
    assert_eq!(stored.status, 201);
    assert_eq!(stored.body, plain);
    assert!(stored
        .headers
        .iter()
        .all(|(name, _)| name != "content-encoding"));
}

/// Sends `body` with `Transfer-Encoding: chunked` (no declared length) and
/// returns the status and body of the answer.
async fn post_chunked(addr: std::net::SocketAddr, key: &str, body: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/orders HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer acme\r\n\
         idempotency-key: {key}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(8 * 1024) {
        let sent = async {
            stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            stream.write_all(chunk).await?;
            stream.write_all(b"\r\n").await
        };
        if sent.await.is_err() {
            break; // the server answered and closed early
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer[9..12].parse().expect("a status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn oversized_bodies_are_refused_before_the_store_is_touched() {
    let limits = Limits {
        body_limit: 4 * 1024,
        ..Limits::default()
    };
    let stack = stack(limits).await;
    let huge = format!(r#"{{"pad":"{}"}}"#, "x".repeat(8 * 1024));
    // Declared over the limit: RequestBodyLimitLayer answers 413 without reading.
    let declared = stack
        .client
        .post_json(
            "/v1/orders",
            &[
                ("authorization", "Bearer acme"),
                ("idempotency-key", "order-0002"),
            ],
            &huge,
        )
        .await;
    assert_eq!(declared.status, 413);
    // Streamed over the limit: the outer limit cuts the stream while the layer
    // buffers it, and the layer recognises the outer limit's error: 413.
    let (status, body) = post_chunked(stack.addr, "order-0003", huge.as_bytes()).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("payload_too_large"), "{body}");
    assert_eq!(stack.orders.load(Ordering::SeqCst), 0);
    assert!(stack.store.is_empty(), "nothing was claimed");
    // Under the limit, streamed or not, all is well.
    let (status, _) = post_chunked(stack.addr, "order-0004", BODY.as_bytes()).await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn a_timeout_answers_504_and_the_retry_replays_the_finished_order() {
    let limits = Limits {
        request_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let stack = stack(limits).await;
    let slow = post(&stack, "/v1/orders?delay_ms=600", "order-0005", None).await;
    assert_eq!(slow.status, 504);
    // The handler went on: by the time the retry comes, the order exists.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let retry = post(&stack, "/v1/orders?delay_ms=600", "order-0005", None).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(stack.orders.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_binary_compresses_the_first_answer_and_replays_identity() {
    let running = http::RunningExample::start("layer_order", &[]);
    let addr = running.addr;
    let client = HttpClient::new(addr);
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "order-0001"),
    ];
    let mut gzip = headers.to_vec();
    gzip.push(("accept-encoding", "gzip"));
    let first = client.post_json("/v1/orders", &gzip, BODY).await;
    let replay = client.post_json("/v1/orders", &headers, BODY).await;
    assert_eq!(encoding(&first), Some("gzip"));
    assert!(replay.replayed());
    assert_eq!(encoding(&replay), None);
    assert_eq!(gunzip(&first.body), replay.body);
}
