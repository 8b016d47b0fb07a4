//! The key contract's own test module, assertion for assertion, against the
//! checkout demo running as users run it (`cargo run --example checkout`, a
//! separate process, driven by a real HTTP client), in memory and on
//! PostgreSQL (transactional and plain mode); and the contract's status
//! mapping rule 1 for every way a key header can be wrong: `400` with
//! `code: idempotency_key_required`, whatever the problem (its `reason`
//! says which).
//!
//! Bodies are sent as a Python client's `json=` sends them (`", "` and `": "`
//! separators), keys are fresh UUIDs, and the merchant token is the bearer.

use tower_idempotency_tests::http::{HttpClient, Reply, RunningExample};

const ORDERS: &str = "/v1/orders";
const MERCHANT: &str = "merchant_token_a";
const OTHER: &str = "merchant_token_b";

fn body(qty: u8) -> String {
    format!(r#"{{"sku": "SKU-1", "qty": {qty}, "currency": "USD"}}"#)
}

async fn post(client: &HttpClient, token: &str, key: Option<&str>, body: &str) -> Reply {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("authorization", auth.as_str())];
    if let Some(key) = key {
        headers.push(("idempotency-key", key));
    }
    client.post_json(ORDERS, &headers, body).await
}

fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

async fn test_missing_key_is_400(client: &HttpClient) {
    let res = post(client, MERCHANT, None, &body(1)).await;
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["code"], "idempotency_key_required");
}

async fn test_replay_returns_identical_201(client: &HttpClient) {
    let key = new_key();
    let first = post(client, MERCHANT, Some(&key), &body(2)).await;
    let second = post(client, MERCHANT, Some(&key), &body(2)).await;
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert_eq!(first.json(), second.json());
    assert_eq!(first.json()["id"], second.json()["id"]);
}

async fn test_same_key_different_body_is_409(client: &HttpClient) {
    let key = new_key();
    let first = post(client, MERCHANT, Some(&key), &body(1)).await;
    let conflict = post(client, MERCHANT, Some(&key), &body(2)).await;
    assert_eq!(first.status, 201);
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.json()["code"], "idempotency_key_reuse");
}

async fn test_key_is_scoped_to_merchant(client: &HttpClient) {
    let key = new_key();
    let first = post(client, MERCHANT, Some(&key), &body(1)).await;
    let second = post(client, OTHER, Some(&key), &body(1)).await;
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert_ne!(first.json()["id"], second.json()["id"]);
}

/// Rule 1: "missing or malformed" is one code; `reason` tells them apart.
async fn rule_1_every_malformed_key_is_400_idempotency_key_required(client: &HttpClient) {
    let too_long = "k".repeat(129);
    let malformed = [
        ("too short", vec!["short12"]),
        ("too long", vec![too_long.as_str()]),
        ("a space", vec!["has space-1234"]),
        ("a slash", vec!["order/1234-5678"]),
        ("empty", vec![""]),
        ("a quote left open", vec!["\"order-12345678"]),
        ("two headers", vec!["order-12345678", "order-12345679"]),
        ("a list", vec!["order-12345678, order-12345679"]),
    ];
    for (what, keys) in malformed {
        let mut headers = vec![("authorization", "Bearer merchant_token_a")];
        headers.extend(keys.iter().map(|key| ("idempotency-key", *key)));
        let res = client.post_json(ORDERS, &headers, &body(1)).await;
        assert_eq!(res.status, 400, "{what}: {res:?}");
        let json = res.json();
        assert_eq!(json["code"], "idempotency_key_required", "{what}");
        let reason = if keys.len() > 1 || keys[0].contains(',') {
            "repeated"
        } else {
            "invalid"
        };
        assert_eq!(json["reason"], reason, "{what}");
    }
    let missing = post(client, MERCHANT, None, &body(1)).await;
    assert_eq!(missing.json()["reason"], "missing");
}

/// The module's four tests in its order, then rule 1, against one demo.
async fn run_the_module(env: &[(&str, Option<&str>)]) {
    let running = RunningExample::start("checkout", env);
    let client = HttpClient::new(running.addr);
    test_missing_key_is_400(&client).await;
    test_replay_returns_identical_201(&client).await;
    test_same_key_different_body_is_409(&client).await;
    test_key_is_scoped_to_merchant(&client).await;
    rule_1_every_malformed_key_is_400_idempotency_key_required(&client).await;
}

#[tokio::test]
async fn the_key_contracts_module_passes_against_the_demo_in_memory() {
    run_the_module(&[
        ("CHECKOUT_STORE", Some("memory")),
        ("DATABASE_URL", None),
        ("REDIS_URL", None),
    ])
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn the_key_contracts_module_passes_against_the_demo_on_postgres_in_both_modes() {
    use tower_idempotency_tests::support;
    let Some(url) = support::pg::database_url("the key contract's module on PostgreSQL") else {
        return;
    };
    for mode in ["postgres", "postgres-plain"] {
        run_the_module(&[
            ("CHECKOUT_STORE", Some(mode)),
            ("DATABASE_URL", Some(url.as_str())),
            ("REDIS_URL", None),
        ])
        .await;
    }
}
