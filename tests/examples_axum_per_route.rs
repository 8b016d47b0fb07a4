//! `examples/axum_per_route.rs`: its router mounted in-process and driven over
//! loopback HTTP, and the example binary itself, whose stdout carries the
//! tracing output (and, with `metrics`, whose `/metrics` carries the counters).

#[allow(dead_code)]
#[path = "../examples/axum_per_route.rs"]
mod example;
mod http;

use example::Ledger;
use http::{serve, HttpClient};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_idempotency::MemoryStore;

const ACME: (&str, &str) = ("authorization", "Bearer acme");

async fn mounted() -> (HttpClient, Arc<Ledger>) {
    let ledger = Arc::new(Ledger::default());
    let addr = serve(example::app(Arc::new(MemoryStore::new()), ledger.clone())).await;
    (HttpClient::new(addr), ledger)
}

#[tokio::test]
async fn every_opt_in_style_replays_and_runs_its_handler_once() {
    let (client, ledger) = mounted().await;
    for (path, key) in [
        ("/v1/orders", "order-0001"),
        ("/v1/refunds", "refund-0001"),
        ("/v1/payouts", "payout-0001"),
    ] {
        let headers = [ACME, ("idempotency-key", key)];
        let first = client.post_json(path, &headers, r#"{"amount":10}"#).await;
        let retry = client
            .post_json(path, &headers, r#"{ "amount": 10 }"#)
            .await;
        assert_eq!(first.status, 201, "{path}");
        assert_eq!(retry.status, 201, "{path}");
        assert!(!first.replayed() && retry.replayed(), "{path}");
        assert_eq!(first.body, retry.body, "{path} replays the same bytes");
        assert_eq!(first.json()["tenant"], "acme");
    }
    assert_eq!(ledger.orders.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.refunds.load(Ordering::SeqCst), 1);
    assert_eq!(ledger.payouts.load(Ordering::SeqCst), 1);

    // One store behind the three layers: a key used on /v1/orders is taken on /v1/payouts too.
    let reused = client
        .post_json(
            "/v1/payouts",
            &[ACME, ("idempotency-key", "order-0001")],
            r#"{"amount":10}"#,
        )
        .await;
    assert_eq!(reused.status, 409);
    assert_eq!(reused.code(), "idempotency_key_reuse");
    // ...but tenants have their own key spaces.
    let globex = client
        .post_json(
            "/v1/orders",
            &[
                ("authorization", "Bearer globex"),
                ("idempotency-key", "order-0001"),
            ],
            r#"{"amount":10}"#,
        )
        .await;
    assert_eq!(globex.status, 201);
    assert!(!globex.replayed());
    assert_eq!(globex.json()["tenant"], "globex");
}

#[tokio::test]
async fn routes_without_the_layer_and_refusals() {
    let (client, ledger) = mounted().await;
    // Auth runs before the layer: no tenant, no decision.
    let anonymous = client
        .post_json("/v1/orders", &[("idempotency-key", "order-0001")], "{}")
        .await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.code(), "unauthorized");
    // A key is required where the layer is, on each style.
    for path in ["/v1/orders", "/v1/refunds", "/v1/payouts"] {
        let missing = client.post_json(path, &[ACME], "{}").await;
        assert_eq!(missing.status, 400, "{path}");
        assert_eq!(missing.code(), "idempotency_key_required");
    }
    assert_eq!(ledger.orders.load(Ordering::SeqCst), 0);
    // GET on the path of a layered POST, and the public routes, are untouched.
    let listed = client.get("/v1/refunds", &[ACME]).await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()["refunds"], 0);
    assert_eq!(client.get("/health", &[]).await.status, 200);
    assert_eq!(client.get("/metrics", &[]).await.status, 200);
    // route_layer only runs on a match: an unknown path is a plain 404.
    let unknown = client
        .post_json(
            "/v1/unknown",
            &[ACME, ("idempotency-key", "order-0001")],
            "{}",
        )
        .await;
    assert_eq!(unknown.status, 404);
}

/// The example process, killed on drop; its stdout lines are collected.
struct Running {
    child: Child,
    addr: std::net::SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(name: &str) -> Self {
        let mut child = Command::new(example_binary(name))
            .env("BIND", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the example");
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let addr = loop {
            let mut line = String::new();
            assert!(reader.read_line(&mut line).unwrap() > 0, "exited early");
            if let Some(url) = line.trim().strip_prefix("listening on http://") {
                break url.parse().expect("an address");
            }
        };
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, addr, lines }
    }

    /// Waits (up to 5 s) for a stdout line containing every one of `parts`.
    async fn line_with(&self, parts: &[&str]) -> String {
        for _ in 0..100 {
            let found = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .cloned();
            if let Some(line) = found {
                return line;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no line with {parts:?} in {:#?}",
            self.lines.lock().unwrap()
        );
    }
}

/// Builds example `name` with this test binary's features (a no-op when
/// fresh, and the same library build) and returns its path.
fn example_binary(name: &str) -> std::path::PathBuf {
    let mut features = Vec::new();
    for (on, feature) in [
        (cfg!(feature = "postgres"), "postgres"),
        (cfg!(feature = "metrics"), "metrics"),
        (cfg!(feature = "client"), "client"),
    ] {
        if on {
            features.push(feature);
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--quiet", "--example", name]);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    assert!(
        build.status().expect("run cargo").success(),
        "{name} builds"
    );
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::path::Path::new(&target)
        .join("debug/examples")
        .join(name)
}

#[tokio::test]
async fn the_binary_traces_each_decision_with_scope_and_key_hash_never_the_key() {
    let running = Running::start("axum_per_route");
    let client = HttpClient::new(running.addr);
    let key = "secret-order-key-42";
    let headers = [ACME, ("idempotency-key", key)];
    let first = client.post_json("/v1/orders", &headers, "{}").await;
    let retry = client.post_json("/v1/orders", &headers, "{}").await;
    assert_eq!((first.status.as_u16(), retry.status.as_u16()), (201, 201));
    assert!(retry.replayed());

    let claimed = running.line_with(&["outcome=\"claimed\"", "DEBUG"]).await;
    let replayed = running.line_with(&["outcome=\"replayed\"", "DEBUG"]).await;
    for line in [&claimed, &replayed] {
        assert!(line.contains("scope=\"acme\""), "{line}");
        assert!(line.contains("key_hash=\""), "{line}");
    }
    running.line_with(&["order created", "n=1"]).await;
    assert!(
        running
            .lines
            .lock()
            .unwrap()
            .iter()
            .all(|l| !l.contains(key)),
        "the key itself is never logged"
    );

    let metrics = client.get("/metrics", &[]).await;
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    if cfg!(feature = "metrics") {
        for series in [
            r#"tower_idempotency_requests_total{layer="idempotency",outcome="claimed"} 1"#,
            r#"tower_idempotency_requests_total{layer="idempotency",outcome="replayed"} 1"#,
            r#"tower_idempotency_request_duration_seconds_count{layer="idempotency",outcome="replayed"} 1"#,
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
    } else {
        assert!(text.contains("--features metrics"), "{text}");
    }
}
