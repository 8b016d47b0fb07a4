//! The `POST /v1/orders` contract (the decision table of `docs/idempotency.md`)
//! against the checkout demo: its four tests and every row of its status
//! mapping, over a real loopback HTTP server, plus races and disconnects.

// The example's own source (an example is no crate to depend on): what
// users run is what these tests drive.
#[path = "../../examples/checkout/app.rs"]
mod app;
use tower_idempotency_tests::http;

use app::{Ledger, MemoryLedger};
use http::{serve, HttpClient, Reply};
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

const ORDERS: &str = "/v1/orders";
const BODY: &str = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;

struct Checkout {
    client: HttpClient,
    ledger: Arc<MemoryLedger>,
    addr: std::net::SocketAddr,
}

async fn checkout_with(layer: IdempotencyLayer, delay: Duration) -> Checkout {
    let ledger = Arc::new(MemoryLedger::default());
    let addr = serve(app::router_with(
        layer,
        Ledger::Memory(ledger.clone()),
        delay,
    ))
    .await;
    Checkout {
        client: HttpClient::new(addr),
        ledger,
        addr,
    }
}

async fn checkout() -> Checkout {
    checkout_with(IdempotencyLayer::new(MemoryStore::new()), Duration::ZERO).await
}

fn unique_key() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "key-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Checkout {
    async fn order(&self, merchant: &str, key: &str, body: &str) -> Reply {
        let auth = format!("Bearer {merchant}");
        self.client
            .post_json(
                ORDERS,
                &[("authorization", &auth), ("idempotency-key", key)],
                body,
            )
            .await
    }

    async fn listed(&self, merchant: &str) -> usize {
        let auth = format!("Bearer {merchant}");
        let reply = self.client.get(ORDERS, &[("authorization", &auth)]).await;
        reply.json()["orders"].as_array().unwrap().len()
    }
}

// The contract's four tests.

#[tokio::test]
async fn test_missing_key_is_400() {
    let app = checkout().await;
    let auth = [("authorization", "Bearer merchant_a")];
    let res = app.client.post_json(ORDERS, &auth, BODY).await;
    assert_eq!(res.status, 400);
    assert_eq!(res.code(), "idempotency_key_required");
    assert_eq!(app.ledger.orders_total(), 0);
}

#[tokio::test]
async fn test_replay_returns_identical_201() {
    let app = checkout().await;
    let key = unique_key();
    let first = app.order("merchant_a", &key, BODY).await;
    let second = app.order("merchant_a", &key, BODY).await;
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert_eq!(first.body, second.body, "byte-identical replay");
    assert_eq!(first.json()["id"], second.json()["id"]);
    assert_eq!(first.headers["location"], second.headers["location"]);
    assert!(!first.replayed() && second.replayed());
    assert_eq!(app.listed("merchant_a").await, 1);
}

#[tokio::test]
async fn test_same_key_different_body_is_409() {
    let app = checkout().await;
    let key = unique_key();
    let first = app
        .order(
            "merchant_a",
            &key,
            r#"{"sku":"SKU-1","qty":1,"currency":"USD"}"#,
        )
        .await;
    let conflict = app
        .order(
            "merchant_a",
            &key,
            r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.code(), "idempotency_key_reuse");
    assert_eq!(app.ledger.orders_total(), 1);
}

#[tokio::test]
async fn test_key_is_scoped_to_merchant() {
    let app = checkout().await;
    let key = unique_key();
    let first = app.order("merchant_a", &key, BODY).await;
    let second = app.order("merchant_b", &key, BODY).await;
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert_ne!(first.json()["id"], second.json()["id"]);
    assert!(!second.replayed(), "never another merchant's response");
    assert_eq!(
        (
            app.listed("merchant_a").await,
            app.listed("merchant_b").await
        ),
        (1, 1)
    );
}

// Status mapping rows not covered above.

#[tokio::test]
async fn row1_malformed_keys_are_400() {
    let app = checkout().await;
    for key in [
        "short",
        "has space 1234",
        "k\u{e9}y-12345678",
        &"a".repeat(129),
        "",
    ] {
        let res = app.order("merchant_a", key, BODY).await;
        assert_eq!(res.status, 400, "key {key:?}");
        assert_eq!(res.code(), "idempotency_key_required", "key {key:?}");
        assert_eq!(res.json()["reason"], "invalid", "key {key:?}");
    }
    assert_eq!(app.ledger.orders_total(), 0);
}

#[tokio::test]
async fn row2_unknown_merchant_token_is_401() {
    let app = checkout().await;
    let key = unique_key();
    let long = format!("Bearer {}", "m".repeat(65));
    for auth in [
        None,
        Some("Bearer "),
        Some("Basic abc"),
        Some("Bearer two words"),
        Some(long.as_str()),
    ] {
        let mut headers = vec![("idempotency-key", key.as_str())];
        if let Some(auth) = auth {
            headers.push(("authorization", auth));
        }
        let res = app.client.post_json(ORDERS, &headers, BODY).await;
        assert_eq!(res.status, 401, "authorization {auth:?}");
        assert_eq!(res.code(), "unauthorized");
    }
    assert_eq!(app.ledger.orders_total(), 0);
}

#[tokio::test]
async fn row5_in_flight_duplicate_waits_then_replays() {
    let app = checkout_with(
        IdempotencyLayer::new(MemoryStore::new()),
        Duration::from_millis(400),
    )
    .await;
    let key = unique_key();
    let (first, second) = tokio::join!(app.order("merchant_a", &key, BODY), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.order("merchant_a", &key, BODY).await
    });
    assert_eq!((first.status.as_u16(), second.status.as_u16()), (201, 201));
    assert_eq!(first.body, second.body);
    assert!(second.replayed());
    assert_eq!(app.ledger.orders_total(), 1);
}

#[tokio::test]
async fn row5_in_flight_past_the_wait_is_409_in_progress_with_retry_after() {
    let layer =
        IdempotencyLayer::new(MemoryStore::new()).with_wait_timeout(Duration::from_millis(200));
    let app = checkout_with(layer, Duration::from_millis(1500)).await;
    let key = unique_key();
    let (first, second) = tokio::join!(app.order("merchant_a", &key, BODY), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.order("merchant_a", &key, BODY).await
    });
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 409);
    assert_eq!(second.code(), "idempotency_in_progress");
    assert!(second.headers.contains_key("retry-after"));
    // Once the first finished, the retry the client makes gets the replay.
    let retry = app.order("merchant_a", &key, BODY).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(app.ledger.orders_total(), 1);
}

#[tokio::test]
async fn row6_new_key_creates_and_lists_the_order() {
    let app = checkout().await;
    let res = app.order("merchant_a", &unique_key(), BODY).await;
    assert_eq!(res.status, 201);
    let order = res.json();
    assert_eq!(
        (order["sku"].as_str(), order["qty"].as_u64()),
        (Some("SKU-1"), Some(2))
    );
    assert_eq!(
        res.headers["location"],
        format!("/v1/orders/{}", order["id"].as_str().unwrap())
    );
    assert_eq!(app.listed("merchant_a").await, 1);
}

#[tokio::test]
async fn invalid_body_is_400_and_frees_the_key_for_a_corrected_request() {
    let app = checkout().await;
    let key = unique_key();
    for bad in [
        r#"{"sku":"","qty":1,"currency":"USD"}"#,
        r#"{"sku":"A","qty":100,"currency":"USD"}"#,
        r#"{"sku":"A","qty":0,"currency":"USD"}"#,
        r#"{"sku":"A","qty":1,"currency":"EUR"}"#,
        r#"not json"#,
    ] {
        let res = app.order("merchant_a", &key, bad).await;
        assert_eq!(res.status, 400, "{bad}");
        assert_eq!(res.code(), "invalid_body");
    }
    let fixed = app.order("merchant_a", &key, BODY).await;
    assert_eq!(fixed.status, 201);
    assert!(!fixed.replayed());
    assert_eq!(app.ledger.orders_total(), 1);
}

#[tokio::test]
async fn key_order_and_whitespace_do_not_change_the_fingerprint() {
    let app = checkout().await;
    let key = unique_key();
    let first = app.order("merchant_a", &key, BODY).await;
    let reordered = app
        .order(
            "merchant_a",
            &key,
            "{ \"currency\" : \"USD\",\n \"qty\": 2, \"sku\": \"SKU-1\" }",
        )
        .await;
    assert_eq!(reordered.status, 201);
    assert!(reordered.replayed());
    assert_eq!(first.body, reordered.body);
    assert_eq!(app.ledger.orders_total(), 1);
}

// Races.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_identical_requests_create_one_order() {
    let app = checkout_with(
        IdempotencyLayer::new(MemoryStore::new()),
        Duration::from_millis(300),
    )
    .await;
    let key = unique_key();
    let replies: Vec<Reply> = futures_join_all((0..200).map(|_| {
        let (client, key) = (app.client.clone(), key.clone());
        tokio::spawn(async move {
            client
                .post_json(
                    ORDERS,
                    &[
                        ("authorization", "Bearer merchant_a"),
                        ("idempotency-key", &key),
                    ],
                    BODY,
                )
                .await
        })
    }))
    .await;
    assert_eq!(app.ledger.orders_total(), 1, "the handler ran exactly once");
    let created = replies
        .iter()
        .find(|r| r.status == 201 && !r.replayed())
        .expect("one original");
    for reply in &replies {
        match reply.status.as_u16() {
            201 => assert_eq!(reply.body, created.body),
            409 => assert_eq!(reply.code(), "idempotency_in_progress"),
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        replies
            .iter()
            .filter(|r| r.status == 201 && !r.replayed())
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_different_bodies_concurrently_one_201_rest_409() {
    let app = checkout_with(
        IdempotencyLayer::new(MemoryStore::new()),
        Duration::from_millis(100),
    )
    .await;
    let key = unique_key();
    let replies: Vec<Reply> = futures_join_all((1..=50).map(|qty| {
        let (client, key) = (app.client.clone(), key.clone());
        tokio::spawn(async move {
            let body = format!(r#"{{"sku":"SKU-1","qty":{qty},"currency":"USD"}}"#);
            client
                .post_json(
                    ORDERS,
                    &[
                        ("authorization", "Bearer merchant_a"),
                        ("idempotency-key", &key),
                    ],
                    &body,
                )
                .await
        })
    }))
    .await;
    assert_eq!(replies.iter().filter(|r| r.status == 201).count(), 1);
    for reply in replies.iter().filter(|r| r.status != 201) {
        assert_eq!(reply.status, 409);
        assert_eq!(reply.code(), "idempotency_key_reuse");
    }
    assert_eq!(app.ledger.orders_total(), 1);
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_handler_gets_the_first_order_replayed() {
    use tokio::io::AsyncWriteExt;
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let in_flight = layer.in_flight();
    let app = checkout_with(layer, Duration::from_millis(600)).await;
    let key = unique_key();
    let request = format!(
        "POST {ORDERS} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer merchant_a\r\n\
         idempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let mut socket = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(socket); // the client gives up while the payment is still running
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(in_flight.count(), 1, "the handler kept running");
    // The retry waits for the first run and gets its answer: one order.
    let retry = app.order("merchant_a", &key, BODY).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(
        app.ledger.orders_total(),
        1,
        "the hung-up request created the order"
    );
    in_flight.idle().await;
}

// Limits.

#[tokio::test]
async fn a_trickled_body_is_cut_with_408_at_the_demos_body_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = checkout().await;
    let key = unique_key();
    // A JSON body of 1000 bytes declared, sent one byte every 100 ms: it
    // would take 100 s to arrive.
    let body = format!("{BODY:<1000}");
    let head = format!(
        "POST {ORDERS} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer merchant_a\r\n\
         idempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let socket = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let (mut reader, mut writer) = socket.into_split();
    let started = tokio::time::Instant::now();
    writer.write_all(head.as_bytes()).await.unwrap();
    let trickle = tokio::spawn(async move {
        for byte in body.as_bytes() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if writer.write_all(&[*byte]).await.is_err() {
                return; // the server hung up after answering
            }
        }
    });
    // The answer's head, read until it is whole or the server closes; the
    // safety net is far past the timeout.
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match reader.read(&mut buf).await.unwrap() {
                0 => break,
                n => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(app::BODY_TIMEOUT + Duration::from_secs(30), read)
        .await
        .expect("the trickled body is cut");
    let elapsed = started.elapsed();
    trickle.abort();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(
        elapsed >= app::BODY_TIMEOUT,
        "cut after {elapsed:?}, before the timeout"
    );
    assert_eq!(app.ledger.orders_total(), 0);
    // The key was never claimed: the whole request runs.
    let order = app.order("merchant_a", &key, BODY).await;
    assert_eq!(order.status, 201);
    assert!(!order.replayed());
}

// The same contract in-process, through `oneshot`.

#[tokio::test]
async fn oneshot_contract_rows() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let ledger = Arc::new(MemoryLedger::default());
    let router = app::router(
        MemoryStore::new(),
        Ledger::Memory(ledger.clone()),
        Duration::ZERO,
    );
    let call = |merchant: &str, key: Option<&str>, body: &str| {
        let mut req = ::http::Request::post(ORDERS)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {merchant}"));
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let req = req.body(Body::from(body.to_owned())).unwrap();
        let router = router.clone();
        async move {
            let res = router.oneshot(req).await.unwrap();
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            )
        }
    };
    let (status, body) = call("m1", None, BODY).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("idempotency_key_required"))
    );
    let (status, body) = call("bad token", Some("oneshot-key-1"), BODY).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let (s1, first) = call("m1", Some("oneshot-key-1"), BODY).await;
    let (s2, again) = call("m1", Some("oneshot-key-1"), BODY).await;
    assert_eq!((s1, s2), (201, 201));
    assert_eq!(first, again);
    let (status, body) = call(
        "m1",
        Some("oneshot-key-1"),
        r#"{"sku":"X","qty":1,"currency":"USD"}"#,
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("idempotency_key_reuse"))
    );
    let (status, other) = call("m2", Some("oneshot-key-1"), BODY).await;
    assert_eq!(status, 201);
    assert_ne!(other["id"], first["id"]);
    assert_eq!(ledger.orders_total(), 2);
}

async fn futures_join_all<T: Send + 'static>(
    tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for task in tasks.collect::<Vec<_>>() {
        out.push(task.await.unwrap());
    }
    out
}
