//! `examples/hyper_service_fn.rs`: its service served in-process by the
//! example's own hyper accept loop, and the example binary, both driven over
//! loopback HTTP.

// The example's own source (an example is no crate to depend on): what
// users run is what these tests drive.
#[allow(dead_code)]
#[path = "../../examples/hyper_service_fn.rs"]
mod example;
use tower_idempotency_tests::http;

use http::HttpClient;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

async fn mounted() -> (HttpClient, Arc<AtomicU64>) {
    let orders = Arc::new(AtomicU64::new(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = example::service(example::api_keys(), orders.clone());
    tokio::spawn(example::serve(listener, service));
    (HttpClient::new(addr), orders)
}

const ACME: (&str, &str) = ("x-api-key", "key_acme");

#[tokio::test]
async fn a_retry_is_replayed_and_the_handler_runs_once() {
    let (client, orders) = mounted().await;
    let headers = [ACME, ("idempotency-key", "order-0001")];
    let first = client
        .post_json("/v1/orders", &headers, r#"{"sku":"A-1","qty":2}"#)
        .await;
    let retry = client
        .post_json("/v1/orders", &headers, r#"{"qty":2,"sku":"A-1"}"#)
        .await;
    assert_eq!((first.status.as_u16(), retry.status.as_u16()), (201, 201));
    assert!(retry.replayed());
    assert_eq!(first.body, retry.body);
    assert_eq!(first.json()["request"]["sku"], "A-1");
    assert_eq!(orders.load(Ordering::SeqCst), 1);

    // Same key, another body: refused, nothing runs.
    let reuse = client
        .post_json("/v1/orders", &headers, r#"{"sku":"A-1","qty":3}"#)
        .await;
    assert_eq!(reuse.status, 409);
    assert_eq!(reuse.code(), "idempotency_key_reuse");
    // Another tenant (another API key) has its own key space.
    let globex = client
        .post_json(
            "/v1/orders",
            &[
                ("x-api-key", "key_globex"),
                ("idempotency-key", "order-0001"),
            ],
            r#"{"sku":"A-1","qty":3}"#,
        )
        .await;
    assert_eq!(globex.status, 201);
    assert!(!globex.replayed());
    assert_eq!(orders.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_scope_closure_authenticates_and_bodies_are_bounded() {
    let (client, orders) = mounted().await;
    for headers in [
        vec![("idempotency-key", "order-0001")],
        vec![
            ("x-api-key", "key_unknown"),
            ("idempotency-key", "order-0001"),
        ],
    ] {
        let refused = client.post_json("/v1/orders", &headers, "{}").await;
        assert_eq!(refused.status, 401);
        assert_eq!(refused.code(), "unauthorized");
    }
    let no_key = client.post_json("/v1/orders", &[ACME], "{}").await;
    assert_eq!(no_key.status, 400);
    assert_eq!(no_key.code(), "idempotency_key_required");
    let huge = "x".repeat(example::MAX_BODY + 1);
    let too_large = client
        .send(
            ::http::Method::POST,
            "/v1/orders",
            &[ACME, ("idempotency-key", "order-0002")],
            huge,
        )
        .await;
    assert_eq!(too_large.status, 413);
    assert_eq!(too_large.code(), "payload_too_large");
    assert_eq!(orders.load(Ordering::SeqCst), 0);
    // GET passes through the layer: no key, no API key needed.
    let health = client.get("/health", &[]).await;
    assert_eq!(health.status, 200);
}

#[tokio::test]
async fn the_binary_serves_and_replays() {
    let running = http::RunningExample::start("hyper_service_fn", &[]);
    let addr = running.addr;
    let client = HttpClient::new(addr);
    let headers = [ACME, ("idempotency-key", "order-0001")];
    let first = client.post_json("/v1/orders", &headers, "{}").await;
    let retry = client.post_json("/v1/orders", &headers, "{}").await;
    assert_eq!((first.status.as_u16(), retry.status.as_u16()), (201, 201));
    assert!(retry.replayed());
    assert_eq!(first.body, retry.body);
}
