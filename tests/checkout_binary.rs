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

/// Builds the example with this test's features (a no-op when fresh) and starts it.
fn start_checkout() -> (Server, std::net::SocketAddr) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(&cargo);
    build.args(["build", "--quiet", "--example", "checkout"]);
    if cfg!(feature = "postgres") {
        build.args(["--features", "postgres"]);
    }
    assert!(
        build.status().expect("run cargo").success(),
        "example builds"
    );
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let exe = std::path::Path::new(&target).join("debug/examples/checkout");
    let mut child = Command::new(exe)
        .env("BIND", "127.0.0.1:0")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the checkout example");
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("example exited before listening")
            .unwrap();
        if let Some(url) = line.strip_prefix("listening on http://") {
            break url.parse().expect("an address");
        }
    };
    (server, addr)
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
