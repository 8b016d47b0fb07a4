//! `cargo run --example checkout` as users run it: a separate process on a
//! loopback port, driven with a real client.

use tower_idempotency_tests::http;

use http::{HttpClient, RunningExample};

/// Starts the example, on PostgreSQL when `database_url` is given; returns the
/// process and the store it reported.
fn start_checkout_with(database_url: Option<&str>) -> (RunningExample, String) {
    start_checkout_on(database_url, None)
}

/// Starts the example on PostgreSQL, Redis or memory.
fn start_checkout_on(
    database_url: Option<&str>,
    redis_url: Option<&str>,
) -> (RunningExample, String) {
    let running = RunningExample::start(
        "checkout",
        &[("DATABASE_URL", database_url), ("REDIS_URL", redis_url)],
    );
    let store = running
        .banner
        .iter()
        .find_map(|line| line.strip_prefix("idempotency store: "))
        .expect("the example names its store")
        .to_owned();
    (running, store)
}

#[tokio::test]
async fn double_post_creates_one_order() {
    let (running, _) = start_checkout_with(None);
    let addr = running.addr;
    let client = HttpClient::new(addr);
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "order-0001"),
    ];
    let body = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;
    let first = client.post_json("/v1/orders", &headers, body).await;
    let second = client.post_json("/v1/orders", &headers, body).await;
    assert_eq!((first.status.as_u16(), second.status.as_u16()), (201, 201));
    assert_eq!(first.body, second.body);
    assert!(second.replayed());
    let listed = client
        .get("/v1/orders", &[("authorization", "Bearer acme")])
        .await;
    assert_eq!(listed.json()["orders"].as_array().unwrap().len(), 1);
}

/// `cargo run --example checkout --features postgres` with `DATABASE_URL`: the
/// same contract from PostgreSQL, and replays survive a restart of the server.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn with_database_url_the_demo_serves_from_postgres_across_restarts() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        assert!(
            std::env::var("REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "REQUIRE_POSTGRES=1 but DATABASE_URL is not set"
        );
        eprintln!("\n*** SKIPPED checkout demo on PostgreSQL: DATABASE_URL is not set ***\n");
        return;
    };
    let key = format!("demo-pg-{}", std::process::id());
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", key.as_str()),
    ];
    let body = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;
    let first = {
        let (running, store) = start_checkout_with(Some(&url));
        let addr = running.addr;
        assert_eq!(store, "postgres");
        let client = HttpClient::new(addr);
        let first = client.post_json("/v1/orders", &headers, body).await;
        let again = client.post_json("/v1/orders", &headers, body).await;
        assert_eq!((first.status.as_u16(), again.status.as_u16()), (201, 201));
        assert!(again.replayed());
        assert_eq!(first.body, again.body);
        first
    }; // the server process is killed here
    let (running, _) = start_checkout_with(Some(&url));
    let addr = running.addr;
    let client = HttpClient::new(addr);
    let replay = client.post_json("/v1/orders", &headers, body).await;
    assert_eq!(replay.status, 201);
    assert!(
        replay.replayed(),
        "the new process replays the record from PostgreSQL"
    );
    assert_eq!(replay.body, first.body, "byte-identical after a restart");
    assert_eq!(replay.headers["location"], first.headers["location"]);
    // Orders and charges live in PostgreSQL too: the new process lists the one
    // the first process created, and the replay created nothing more.
    let merchant = [("authorization", "Bearer acme")];
    let orders = client.get("/v1/orders", &merchant).await.json();
    let charges = client.get("/v1/charges", &merchant).await.json();
    let order = serde_json::from_slice::<serde_json::Value>(&first.body).unwrap();
    let mine = |list: &serde_json::Value, field: &str, id: &serde_json::Value| {
        list[field]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| &row["id"] == id)
            .count()
    };
    assert_eq!(mine(&orders, "orders", &order["id"]), 1);
    assert_eq!(mine(&charges, "charges", &order["charge"]), 1);
}

/// `cargo run --example checkout --features redis` with `REDIS_URL`: two demo
/// instances on one Redis replay each other's answers and refuse each other's
/// key reuse.
#[cfg(feature = "redis")]
#[tokio::test]
async fn with_redis_url_two_demo_instances_share_their_records() {
    let Ok(url) = std::env::var("REDIS_URL") else {
        assert!(
            std::env::var("REQUIRE_REDIS").as_deref() != Ok("1"),
            "REQUIRE_REDIS=1 but REDIS_URL is not set"
        );
        eprintln!("\n*** SKIPPED checkout demo on Redis: REDIS_URL is not set ***\n");
        return;
    };
    let (a, store_a) = start_checkout_on(None, Some(&url));
    let (b, store_b) = start_checkout_on(None, Some(&url));
    assert_eq!((store_a.as_str(), store_b.as_str()), ("redis", "redis"));
    let key = format!("demo-redis-{}", std::process::id());
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", key.as_str()),
    ];
    let body = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;
    let (client_a, client_b) = (HttpClient::new(a.addr), HttpClient::new(b.addr));
    let first = client_a.post_json("/v1/orders", &headers, body).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let replay = client_b.post_json("/v1/orders", &headers, body).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed(), "instance b replays instance a's answer");
    assert_eq!(replay.body, first.body);
    let reuse = client_b
        .post_json(
            "/v1/orders",
            &headers,
            r#"{"sku":"SKU-2","qty":1,"currency":"USD"}"#,
        )
        .await;
    assert_eq!(reuse.status, 409, "key reuse with another body is refused");
    assert_eq!(reuse.json()["code"], "idempotency_key_reuse");
    // Only instance a charged: b created nothing.
    let merchant = [("authorization", "Bearer acme")];
    let orders = client_b.get("/v1/orders", &merchant).await.json();
    assert_eq!(orders["orders"].as_array().unwrap().len(), 0);
}

/// SIGTERM while a handler whose client hung up is still running: the demo
/// stops accepting, waits for the handler, and only then exits.
#[tokio::test]
async fn on_sigterm_the_demo_waits_for_claimed_handlers() {
    use tokio::io::AsyncWriteExt;
    let mut running = RunningExample::start(
        "checkout",
        &[
            ("DATABASE_URL", None),
            ("REDIS_URL", None),
            ("CHECKOUT_DELAY_MS", Some("800")),
        ],
    );
    let body = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;
    let request = format!(
        "POST /v1/orders HTTP/1.1\r\nhost: x\r\nauthorization: Bearer acme\r\n\
         idempotency-key: order-sigterm-1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let sent = std::time::Instant::now();
    let mut socket = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    drop(socket); // the client hangs up mid-handler
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    running.terminate();
    let status = running
        .exited_within(std::time::Duration::from_secs(10))
        .await;
    assert!(status.success(), "{status:?}");
    assert!(
        sent.elapsed() >= std::time::Duration::from_millis(800),
        "exited before the handler finished"
    );
    let lines = running.lines();
    assert!(
        lines
            .iter()
            .any(|l| l == "waiting for 1 claimed handler(s)"),
        "{lines:?}"
    );
    assert_eq!(lines.last().map(String::as_str), Some("stopped"));
}
