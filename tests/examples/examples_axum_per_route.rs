//! `examples/axum_per_route/`: its router mounted in-process and driven over
//! loopback HTTP, and the example binary itself, whose stdout carries the
//! tracing output (and, with `metrics`, whose `/metrics` carries the counters).

// The example's own source (an example is no crate to depend on): what
// users run is what these tests drive.
#[allow(dead_code)]
#[path = "../../examples/axum_per_route/src/main.rs"]
mod example;
use tower_idempotency_tests::http;

use example::Ledger;
use http::{serve, HttpClient};
use std::sync::atomic::Ordering;
use std::sync::Arc;
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

#[tokio::test]
async fn the_binary_traces_each_decision_with_scope_and_key_hash_never_the_key() {
    let running = http::RunningExample::start("axum_per_route", &[]);
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
        running.lines().iter().all(|l| !l.contains(key)),
        "the key itself is never logged"
    );

    let metrics = client.get("/metrics", &[]).await;
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    if cfg!(feature = "metrics") {
        // At least this test's requests: the recorder is the process's, and
        // other tests of this binary count into it too.
        let value = |series: &str| -> f64 {
            text.lines()
                .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{series} in\n{text}"))
        };
        for series in [
            r#"tower_idempotency_requests_total{layer="idempotency",outcome="claimed"}"#,
            r#"tower_idempotency_requests_total{layer="idempotency",outcome="replayed"}"#,
            r#"tower_idempotency_request_duration_seconds_count{layer="idempotency",outcome="replayed"}"#,
        ] {
            assert!(value(series) >= 1.0, "{series} in\n{text}");
        }
        // The gauges, at zero once the requests ended (registered at start:
        // the near cache's too, though this example's store has none).
        for gauge in [
            "tower_idempotency_claims_in_flight",
            "tower_idempotency_waiting_duplicates",
            "tower_idempotency_near_cache_entries",
            "tower_idempotency_near_cache_bytes",
            "tower_idempotency_near_cache_hit_ratio",
        ] {
            assert_eq!(value(gauge), 0.0, "{gauge} in\n{text}");
        }
        for operation in ["begin", "complete"] {
            let series = format!(
                r#"tower_idempotency_store_call_duration_seconds_count{{operation="{operation}"}}"#
            );
            assert!(value(&series) >= 1.0, "{series} in\n{text}");
        }
        // A real histogram: cumulative buckets up to +Inf.
        assert!(
            text.contains(r#"tower_idempotency_request_duration_seconds_bucket{layer="idempotency",outcome="replayed",le="+Inf"}"#),
            "{text}"
        );
    } else {
        assert!(text.contains("--features metrics"), "{text}");
    }
}

/// The served document: every guarded POST has the key parameter with its
/// format, its `201` the replay and retention headers, and a response per
/// refusal status; the GET beside one of them has none of it.
#[cfg(feature = "utoipa")]
#[tokio::test]
async fn the_served_openapi_document_describes_the_layer_on_each_guarded_route() {
    let (client, _) = mounted().await;
    let served = client.get("/openapi.json", &[]).await;
    assert_eq!(served.status, 200);
    let spec = served.json();
    for path in ["/v1/orders", "/v1/refunds", "/v1/payouts"] {
        let post = &spec["paths"][path]["post"];
        let key = &post["parameters"][0];
        assert_eq!(key["name"], "Idempotency-Key", "{path}: {post}");
        assert_eq!(key["in"], "header");
        assert_eq!(key["required"], true);
        let pattern = key["schema"]["pattern"].as_str().unwrap();
        assert_eq!(
            pattern,
            r#"^(?:[A-Za-z0-9._-]{8,128}|"[A-Za-z0-9._-]{8,128}")$"#
        );
        let created = &post["responses"]["201"]["headers"];
        assert_eq!(created["Idempotent-Replayed"]["schema"]["enum"][0], "true");
        // The example's MemoryStore keeps records 24 hours.
        let retention = &created["Idempotency-Key-Retention"]["schema"];
        assert_eq!(retention["type"], "integer");
        assert_eq!(retention["examples"][0], 86400);
        for (status, codes) in [
            ("400", &["body_unreadable"][..]),
            ("409", &["idempotency_key_reuse", "idempotency_in_progress"]),
            (
                "503",
                &[
                    "idempotency_store_unavailable",
                    "idempotency_outcome_unknown",
                    "overloaded",
                ],
            ),
            ("401", &["unauthorized"]),
            (
                "410",
                &[
                    "idempotency_response_unavailable",
                    "idempotency_key_expired",
                ],
            ),
            ("413", &["payload_too_large"]),
            ("408", &["request_timeout"]),
            ("429", &["idempotency_quota_exceeded"]),
            ("500", &["internal_error"]),
        ] {
            let content = &post["responses"][status]["content"]["application/json"];
            for code in codes {
                let example = &content["examples"][*code]["value"];
                assert_eq!(example["code"], *code, "{path} {status}: {content}");
                assert!(example["message"].as_str().is_some_and(|m| !m.is_empty()));
                let schema = &spec["components"]["schemas"][format!("IdempotencyRefusal.{code}")];
                assert_eq!(schema["properties"]["code"]["enum"][0], *code);
            }
        }
        // The three key refusals share the key contract's code; each has
        // its own example and schema, named by its reason.
        let bad_request = &post["responses"]["400"]["content"]["application/json"];
        for reason in ["missing", "invalid", "repeated"] {
            let label = format!("idempotency_key_required ({reason})");
            let example = &bad_request["examples"][&label]["value"];
            assert_eq!(example["code"], "idempotency_key_required", "{label}");
            assert_eq!(example["reason"], reason, "{label}");
            let name = format!("IdempotencyRefusal.idempotency_key_required.{reason}");
            let schema = &spec["components"]["schemas"][name.as_str()];
            assert_eq!(schema["properties"]["reason"]["enum"][0], reason);
        }
        let retry_after = |status: &str| {
            post["responses"][status]["headers"]
                .get("Retry-After")
                .is_some()
        };
        assert!(retry_after("409") && retry_after("503") && !retry_after("400"));
    }
    let list = &spec["paths"]["/v1/refunds"]["get"];
    assert!(list["parameters"].is_null(), "{list}");
    assert!(list["responses"].get("409").is_none(), "{list}");
}
