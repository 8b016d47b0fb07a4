//! The checkout demo charging the card processor (`examples/processor.rs`)
//! over HTTP, both as processes. The demo is killed with SIGKILL at each step
//! of a charge (before it, after it, after the order, after the record) and
//! the client retries on another instance: the processor's ledger shows one
//! charge for the key every time, and one order was written, on PostgreSQL in
//! transactional and in plain mode and on Redis.
//!
//! The retry after a kill past the charge runs the handler again in plain
//! mode and on Redis (nothing recorded that the charge happened), and in
//! transactional mode too (the processor's charge is not in the rolled-back
//! transaction): what makes it one charge is that every run sends the
//! processor the request's downstream key, and the processor replays.

use serde_json::Value;
use tower_idempotency::{downstream::DownstreamKeys, IdempotencyKey, Scope};
use tower_idempotency_tests::http::{HttpClient, RunningExample};
// The kill tests' (they need PostgreSQL).
#[cfg(feature = "postgres")]
use {
    bytes::Bytes,
    http_body_util::{BodyExt, Full},
    std::net::SocketAddr,
    std::time::{Duration, Instant},
};

const BODY: &str = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;

/// The downstream key the demo sends the processor for `key` of `merchant`.
fn charge_key(merchant: &str, key: &str) -> String {
    let key = IdempotencyKey::parse(key.as_bytes()).expect("a valid key");
    DownstreamKeys::new(Scope::new(merchant), key)
        .key_for("card-processor")
        .to_string()
}

fn start_processor(ledger: Option<&str>) -> RunningExample {
    RunningExample::start("processor", &[("PROCESSOR_LEDGER", ledger)])
}

/// One POST of the order; `None` when the connection failed (killed).
#[cfg(feature = "postgres")]
async fn try_order(addr: SocketAddr, merchant: &str, key: &str) -> Option<(u16, Value)> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("http://{addr}/v1/orders"))
        .header("authorization", format!("Bearer {merchant}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap();
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// Retries on `addr` until a `201`; anything else must be "in progress".
#[cfg(feature = "postgres")]
async fn retry_until_created(addr: SocketAddr, merchant: &str, key: &str) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = try_order(addr, merchant, key)
            .await
            .expect("the survivor answers");
        if status == 201 {
            return body;
        }
        assert_eq!(body["code"], "idempotency_in_progress", "{status} {body}");
        assert!(start.elapsed() < Duration::from_secs(30), "never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn processor_charges(processor: &HttpClient, query: &str) -> Vec<Value> {
    let listed = processor.get(&format!("/v1/charges?{query}"), &[]).await;
    listed.json()["charges"].as_array().unwrap().clone()
}

/// For each step, two demo instances with `env`: the first killed at the
/// step of the first request, the retry answered by the second. After each,
/// the processor holds exactly one charge under the key's downstream key and
/// no other for the merchant, and the merchant has one order, paid by it.
#[cfg(feature = "postgres")]
async fn killed_at_every_step_charges_once(store: &str, env: &[(&str, Option<&str>)]) {
    let processor = start_processor(None);
    let processor_url = format!("http://{}", processor.addr);
    let processor = HttpClient::new(processor.addr);
    let merchant = format!("kill-{store}-{}", std::process::id());
    let mut env = env.to_vec();
    env.extend([
        ("CHECKOUT_STORE", Some(store)),
        ("PROCESSOR_URL", Some(processor_url.as_str())),
        ("CHECKOUT_PAUSE_MS", Some("400")),
    ]);
    let steps = ["before-charge", "charged", "ordered", "answered"];
    for (done, step) in steps.into_iter().enumerate() {
        let key = format!("order-{step}-{}", std::process::id());
        let (mut first, second) = (
            RunningExample::start("checkout", &env),
            RunningExample::start("checkout", &env),
        );
        assert!(first
            .banner
            .contains(&format!("idempotency store: {store}")));
        let request = tokio::spawn({
            let (addr, merchant, key) = (first.addr, merchant.clone(), key.clone());
            async move { try_order(addr, &merchant, &key).await }
        });
        first
            .line_with(&[&format!("checkpoint {step} {key}")])
            .await;
        first.kill();
        assert!(
            request.await.unwrap().is_none(),
            "no answer from the killed instance"
        );
        let answer = retry_until_created(second.addr, &merchant, &key).await;
        if step != "answered" {
            // Nothing recorded: the retry ran the handler, and charged, again.
            second
                .line_with(&[&format!("checkpoint charged {key}")])
                .await;
        }

        // One charge per step so far, under whatever key.
        let all = processor_charges(&processor, &format!("merchant={merchant}")).await;
        assert_eq!(all.len(), done + 1, "{store}, killed at {step}: {all:?}");
        // And that one under the key's downstream key.
        let query = format!("idempotency_key={}", charge_key(&merchant, &key));
        let mine = processor_charges(&processor, &query).await;
        assert_eq!(mine.len(), 1, "{store}, killed at {step}: {mine:?}");
        assert_eq!(answer["charge"], mine[0]["id"], "{store}, killed at {step}");
        let auth = format!("Bearer {merchant}");
        let orders = HttpClient::new(second.addr)
            .get("/v1/orders", &[("authorization", auth.as_str())])
            .await
            .json();
        let orders = orders["orders"].as_array().unwrap();
        let paid: Vec<_> = orders
            .iter()
            .filter(|o| o["charge"] == mine[0]["id"])
            .collect();
        assert_eq!(paid.len(), 1, "{store}, killed at {step}: {orders:?}");
        assert_eq!(paid[0]["id"], answer["id"]);
        assert_eq!(
            orders.len(),
            done + 1,
            "{store}, killed at {step}: {orders:?}"
        );
    }
}

#[cfg(feature = "postgres")]
use tower_idempotency_tests::support::pg::database_url;

/// Transactional mode: a kill before the commit rolls the order back and
/// frees the key at once; the run after it charges again under the same
/// downstream key, and the processor replays the first charge.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_postgres_killed_at_every_step_charges_the_processor_once() {
    let Some(url) = database_url("checkout killed, transactional") else {
        return;
    };
    let env = [("DATABASE_URL", Some(url.as_str())), ("REDIS_URL", None)];
    killed_at_every_step_charges_once("postgres", &env).await;
}

/// Plain mode: the order row commits before the record; the run after the
/// lock timeout writes it under its downstream key, which returns the first.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_postgres_killed_at_every_step_charges_the_processor_once() {
    let Some(url) = database_url("checkout killed, plain mode") else {
        return;
    };
    let env = [("DATABASE_URL", Some(url.as_str())), ("REDIS_URL", None)];
    killed_at_every_step_charges_once("postgres-plain", &env).await;
}

/// Records in Redis, orders in PostgreSQL: as plain mode.
#[cfg(all(feature = "postgres", feature = "redis"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_at_every_step_charges_the_processor_once() {
    let Some(url) = database_url("checkout killed, Redis") else {
        return;
    };
    let Some(redis) = tower_idempotency_tests::support::redis::url("checkout killed, Redis") else {
        return;
    };
    let env = [
        ("DATABASE_URL", Some(url.as_str())),
        ("REDIS_URL", Some(redis.as_str())),
    ];
    killed_at_every_step_charges_once("redis", &env).await;
}

/// The memory store with a processor: the charge goes there under the
/// request's downstream key, `GET /v1/charges` lists the processor's, and a
/// replay sends nothing.
#[tokio::test]
async fn the_demo_charges_the_processor_under_the_downstream_key() {
    let processor = start_processor(None);
    let url = format!("http://{}", processor.addr);
    let demo = RunningExample::start(
        "checkout",
        &[
            ("DATABASE_URL", None),
            ("REDIS_URL", None),
            ("CHECKOUT_STORE", None),
            ("PROCESSOR_URL", Some(url.as_str())),
        ],
    );
    assert!(demo
        .banner
        .contains(&format!("charges: processor at {url}")));
    let client = HttpClient::new(demo.addr);
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "order-0001"),
    ];
    let first = client.post_json("/v1/orders", &headers, BODY).await;
    let again = client.post_json("/v1/orders", &headers, BODY).await;
    assert_eq!((first.status.as_u16(), again.status.as_u16()), (201, 201));
    assert!(again.replayed());
    let charges = processor_charges(&HttpClient::new(processor.addr), "").await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(
        charges[0]["idempotency_key"],
        charge_key("acme", "order-0001")
    );
    assert_eq!(charges[0]["amount"], 2 * 1250);
    assert_eq!(first.json()["charge"], charges[0]["id"]);
    let listed = client
        .get("/v1/charges", &[("authorization", "Bearer acme")])
        .await;
    assert_eq!(listed.json()["charges"], Value::Array(charges));
}

/// The processor's own idempotency keys, as Stripe's: the same key and
/// parameters replay the charge, other parameters are `422` and charge
/// nothing, no key is a new charge every time; with a ledger file a
/// restarted processor still knows its keys.
#[tokio::test]
async fn the_processor_replays_its_keys_refuses_their_reuse_and_keeps_them_across_restarts() {
    let dir = std::env::temp_dir().join(format!("processor-ledger-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let path = dir.to_str().unwrap().to_owned();
    let charge = |amount: u64| {
        format!(
            r#"{{"amount":{amount},"currency":"USD","merchant":"acme","description":"2 x SKU-1"}}"#
        )
    };
    let first = {
        let processor = start_processor(Some(&path));
        let client = HttpClient::new(processor.addr);
        let keyed = [("idempotency-key", "dk1-test-0001")];
        let first = client.post_json("/v1/charges", &keyed, &charge(2500)).await;
        assert_eq!(first.status, 201);
        // Same key, same parameters in another order: the stored charge.
        let reordered =
            r#"{"merchant":"acme","description":"2 x SKU-1","currency":"USD","amount":2500}"#;
        let again = client.post_json("/v1/charges", &keyed, reordered).await;
        assert_eq!(
            (again.status, again.body.clone()),
            (first.status, first.body.clone())
        );
        assert!(again.replayed());
        let reuse = client.post_json("/v1/charges", &keyed, &charge(9900)).await;
        assert_eq!(
            (reuse.status.as_u16(), reuse.code()),
            (422, "idempotency_key_reuse".into())
        );
        for _ in 0..2 {
            let unkeyed = client.post_json("/v1/charges", &[], &charge(2500)).await;
            assert_eq!(unkeyed.status, 201);
        }
        assert_eq!(processor_charges(&client, "").await.len(), 3);
        first
    }; // killed
    let processor = start_processor(Some(&path));
    assert!(processor
        .banner
        .contains(&"charges on record: 3".to_owned()));
    let client = HttpClient::new(processor.addr);
    let keyed = [("idempotency-key", "dk1-test-0001")];
    let replay = client.post_json("/v1/charges", &keyed, &charge(2500)).await;
    assert_eq!(replay.body, first.body);
    assert!(replay.replayed());
    let found = processor_charges(&client, "idempotency_key=dk1-test-0001").await;
    assert_eq!(found.len(), 1);
    assert_eq!(processor_charges(&client, "").await.len(), 3);
    let _ = std::fs::remove_file(&dir);
}
