//! `cargo run --example checkout` as users run it: a separate process on a
//! loopback port, driven with a real client.

mod http;

use http::HttpClient;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds the example with this test's features (a no-op when fresh) and starts
/// it on the memory store.
fn start_checkout() -> (Server, std::net::SocketAddr) {
    start_checkout_with(None).0
}

/// Starts the example, on PostgreSQL when `database_url` is given; returns the
/// store it reported.
fn start_checkout_with(database_url: Option<&str>) -> ((Server, std::net::SocketAddr), String) {
    let exe = http::example_binary("checkout");
    let mut command = Command::new(exe);
    command.env("BIND", "127.0.0.1:0").stdout(Stdio::piped());
    match database_url {
        Some(url) => command.env("DATABASE_URL", url),
        None => command.env_remove("DATABASE_URL"),
    };
    let mut child = command.spawn().expect("start the checkout example");
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    let mut store = String::new();
    let addr = loop {
        let line = lines
            .next()
            .expect("example exited before listening")
            .unwrap();
        if let Some(name) = line.strip_prefix("idempotency store: ") {
            store = name.to_owned();
        }
        if let Some(url) = line.strip_prefix("listening on http://") {
            break url.parse().expect("an address");
        }
    };
    ((server, addr), store)
}

#[tokio::test]
async fn double_post_creates_one_order() {
    let (_server, addr) = start_checkout();
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
        let ((_server, addr), store) = start_checkout_with(Some(&url));
        assert_eq!(store, "postgres");
        let client = HttpClient::new(addr);
        let first = client.post_json("/v1/orders", &headers, body).await;
        let again = client.post_json("/v1/orders", &headers, body).await;
        assert_eq!((first.status.as_u16(), again.status.as_u16()), (201, 201));
        assert!(again.replayed());
        assert_eq!(first.body, again.body);
        first
    }; // the server process is killed here
    let ((_server, addr), _) = start_checkout_with(Some(&url));
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
