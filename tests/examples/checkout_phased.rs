//! The checkout in recovery points (`POST /v1/phased-orders`, see
//! `examples/checkout/phased.rs`) as processes, charging the card processor
//! (`examples/processor.rs`): the demo is killed with SIGKILL between its
//! phases and inside each (after a phase's write or call, before its
//! recovery point), and the client retries on another instance. Every time
//! the merchant ends with one order, paid, one charge at the processor
//! (under the charge phase's downstream key) and one receipt email, and the
//! retry's answer is an uninterrupted run's (ids aside) and what later
//! retries replay. The retry resumes: a phase recorded before the kill is
//! never run again.

use serde_json::Value;
use tower_idempotency::{downstream::DownstreamKeys, IdempotencyKey, Scope};
use tower_idempotency_tests::http::{HttpClient, RunningExample};
#[cfg(feature = "postgres")]
use {
    bytes::Bytes,
    http_body_util::{BodyExt, Full},
    std::net::SocketAddr,
    std::time::{Duration, Instant},
};

const BODY: &str = r#"{"sku":"SKU-1","qty":2,"currency":"USD"}"#;
const ORDERS: &str = "/v1/phased-orders";

/// The checkpoints, in order; `*-written` and `charge-sent` are inside a
/// phase (its effect done, its recovery point not yet recorded), the others
/// between phases, and `answered` after the layer recorded the answer.
#[cfg(feature = "postgres")]
const STEPS: [&str; 8] = [
    "before-order",
    "order-written",
    "ordered",
    "charge-sent",
    "charged",
    "paid-written",
    "paid",
    "answered",
];

/// Each phase: its checkpoint inside, and the one once it is recorded.
#[cfg(feature = "postgres")]
const PHASES: [(&str, &str); 3] = [
    ("order-written", "ordered"),
    ("charge-sent", "charged"),
    ("paid-written", "paid"),
];

/// The charge phase's downstream key, as the demo sends it to the processor.
fn charge_key(merchant: &str, key: &str) -> String {
    let key = IdempotencyKey::parse(key.as_bytes()).expect("a valid key");
    DownstreamKeys::new(Scope::new(merchant), key)
        .key_for("phase:charge")
        .to_string()
}

/// One POST of the order; `None` when the connection failed (killed).
#[cfg(feature = "postgres")]
async fn try_order(addr: SocketAddr, merchant: &str, key: &str) -> Option<(u16, Value, bool)> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("http://{addr}{ORDERS}"))
        .header("authorization", format!("Bearer {merchant}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
        .unwrap();
    let response = client.request(request).await.ok()?;
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await.ok()?.to_bytes();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Some((status, body, replayed))
}

/// Retries on `addr` until a `201`; anything else must be "in progress"
/// (the killed owner's lock has not run out yet).
#[cfg(feature = "postgres")]
async fn retry_until_created(addr: SocketAddr, merchant: &str, key: &str) -> Value {
    let start = Instant::now();
    loop {
        let (status, body, _) = try_order(addr, merchant, key)
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

async fn listed(client: &HttpClient, path: &str, merchant: &str, field: &str) -> Vec<Value> {
    let auth = format!("Bearer {merchant}");
    let reply = client.get(path, &[("authorization", auth.as_str())]).await;
    reply.json()[field].as_array().unwrap().clone()
}

/// The answer with its ids blanked: what every run of the request answers.
fn shape(answer: &Value) -> Value {
    let mut shape = answer.clone();
    for id in ["id", "charge", "receipt"] {
        assert!(shape[id].is_string(), "{answer}");
        shape[id] = Value::Null;
    }
    shape
}

/// For each step, two demo instances with `env`: the first killed at the
/// step of the first request, the retry answered by the second; then the
/// merchant's orders, charges and emails are counted.
#[cfg(feature = "postgres")]
async fn killed_at_every_step_finishes_once(store: &str, env: &[(&str, Option<&str>)]) {
    let processor = RunningExample::start("processor", &[("PROCESSOR_LEDGER", None)]);
    let processor_url = format!("http://{}", processor.addr);
    let processor = HttpClient::new(processor.addr);
    let mut env = env.to_vec();
    env.extend([
        ("CHECKOUT_STORE", Some(store)),
        ("PROCESSOR_URL", Some(processor_url.as_str())),
        ("CHECKOUT_PAUSE_MS", Some("300")),
    ]);
    let run = format!("{store}-{}", std::process::id());
    let uninterrupted = {
        let demo = RunningExample::start("checkout", &env);
        let merchant = format!("clean-{run}");
        retry_until_created(demo.addr, &merchant, "order-clean").await
    };
    for step in STEPS {
        let (merchant, key) = (format!("{step}-{run}"), format!("order-{step}"));
        let (mut first, second) = (
            RunningExample::start("checkout", &env),
            RunningExample::start("checkout", &env),
        );
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
            "the killed instance answered"
        );
        let answer = retry_until_created(second.addr, &merchant, &key).await;
        let context = format!("{store}, killed at {step}");
        assert_eq!(shape(&answer), shape(&uninterrupted), "{context}");

        // The retry resumed: phases recorded before the kill did not run again.
        let ran = |checkpoint: &str| {
            let line = format!("checkpoint {checkpoint} {key}");
            second.lines().iter().any(|l| l.contains(&line))
        };
        let killed_at = STEPS.iter().position(|s| *s == step).unwrap();
        for (inside, recorded) in PHASES {
            let done = STEPS.iter().position(|s| *s == recorded).unwrap() <= killed_at;
            assert_eq!(ran(inside), !done, "{context}: {inside} ran again?");
        }

        let charges = listed(
            &processor,
            &format!("/v1/charges?merchant={merchant}"),
            &merchant,
            "charges",
        )
        .await;
        assert_eq!(charges.len(), 1, "{context}: {charges:?}");
        assert_eq!(
            charges[0]["idempotency_key"],
            charge_key(&merchant, &key),
            "{context}"
        );
        assert_eq!(answer["charge"], charges[0]["id"], "{context}");
        let survivor = HttpClient::new(second.addr);
        let orders = listed(&survivor, ORDERS, &merchant, "orders").await;
        assert_eq!(orders.len(), 1, "{context}: {orders:?}");
        assert_eq!(orders[0]["id"], answer["id"], "{context}");
        assert_eq!(orders[0]["status"], "paid", "{context}");
        assert_eq!(orders[0]["charge"], answer["charge"], "{context}");
        let emails = listed(&survivor, "/v1/emails", &merchant, "emails").await;
        assert_eq!(emails.len(), 1, "{context}: {emails:?}");
        assert_eq!(emails[0]["id"], answer["receipt"], "{context}");
        assert_eq!(emails[0]["order"], answer["id"], "{context}");

        // Later retries replay the answer.
        let (status, again, replayed) = try_order(second.addr, &merchant, &key).await.unwrap();
        assert_eq!(
            (status, &again, replayed),
            (201, &answer, true),
            "{context}"
        );
    }
}

#[cfg(feature = "postgres")]
use tower_idempotency_tests::support::pg::database_url;

/// The PostgreSQL store: the order and the paid mark with its email are
/// local phases, their writes committed with their recovery points.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phased_checkout_on_postgres_killed_at_every_step_finishes_once() {
    let Some(url) = database_url("phased checkout killed, PostgreSQL") else {
        return;
    };
    let env = [("DATABASE_URL", Some(url.as_str())), ("REDIS_URL", None)];
    killed_at_every_step_finishes_once("postgres", &env).await;
}

/// Records and recovery points in Redis, rows in PostgreSQL: a phase's
/// writes commit before its recovery point, keyed by the phase's downstream
/// key, so a phase run again after a kill inside it writes nothing new.
#[cfg(all(feature = "postgres", feature = "redis"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phased_checkout_on_redis_killed_at_every_step_finishes_once() {
    let Some(url) = database_url("phased checkout killed, Redis") else {
        return;
    };
    let Some(redis) = tower_idempotency_tests::support::redis::url("phased checkout killed, Redis")
    else {
        return;
    };
    let env = [
        ("DATABASE_URL", Some(url.as_str())),
        ("REDIS_URL", Some(redis.as_str())),
    ];
    killed_at_every_step_finishes_once("redis", &env).await;
}

/// On the memory store (one process: a crash loses everything), the phased
/// route answers like the other route and a retry replays.
#[tokio::test]
async fn the_phased_route_answers_and_replays_on_the_memory_store() {
    let demo = RunningExample::start(
        "checkout",
        &[
            ("DATABASE_URL", None),
            ("REDIS_URL", None),
            ("CHECKOUT_STORE", None),
        ],
    );
    let client = HttpClient::new(demo.addr);
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "order-0001"),
    ];
    let first = client.post_json(ORDERS, &headers, BODY).await;
    let again = client.post_json(ORDERS, &headers, BODY).await;
    assert_eq!((first.status.as_u16(), again.status.as_u16()), (201, 201));
    assert!(again.replayed());
    assert_eq!(first.body, again.body);
    let answer = first.json();
    assert_eq!(answer["status"], "paid");
    let orders = listed(&client, ORDERS, "acme", "orders").await;
    let emails = listed(&client, "/v1/emails", "acme", "emails").await;
    assert_eq!((orders.len(), emails.len()), (1, 1));
    assert_eq!(orders[0]["charge"], answer["charge"]);
    assert_eq!(emails[0]["order"], answer["id"]);
}
