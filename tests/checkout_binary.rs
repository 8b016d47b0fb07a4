//! `cargo run --example checkout` as users run it: a separate process on a
//! loopback port, driven with a real client.

mod http;

use http::{HttpClient, RunningExample};

/// Starts the example, on PostgreSQL when `database_url` is given; returns the
/// process and the store it reported.
fn start_checkout_with(database_url: Option<&str>) -> (RunningExample, String) {
    let running = RunningExample::start("checkout", &[("DATABASE_URL", database_url)]);
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
    let listed = client
        .get("/v1/orders", &[("authorization", "Bearer acme")])
        .await;
    assert_eq!(
        listed.json()["orders"].as_array().unwrap().len(),
        0,
        "the new process created no order: the handler did not run"
    );
}
