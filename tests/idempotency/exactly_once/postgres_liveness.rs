//! Transactional mode's proof of life is the transaction's session: a handler
//! that waits longer than the server's idle-in-transaction timeout keeps its
//! claim, and an answer given after the handler ran never says "not processed".

use super::support::pg;
use super::PATIENCE;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::timeout;
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, PostgresStore, PostgresTransaction, Scope};

/// A handler that writes its order, then calls a slow "provider" (held by
/// `gate`), counted in `calls`; `x-kill-session` makes it end its own
/// session before it answers.
#[derive(Clone)]
struct Provider {
    table: String,
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

async fn order_then_provider(State(provider): State<Provider>, req: Request) -> StatusCode {
    let tx = req
        .extensions()
        .get::<PostgresTransaction>()
        .unwrap()
        .clone();
    let kill = req.headers().contains_key("x-kill-session");
    let client = tx.client().await.unwrap();
    client
        .execute(
            &format!("INSERT INTO {} VALUES ('order')", provider.table),
            &[],
        )
        .await
        .unwrap();
    drop(client);
    provider.calls.fetch_add(1, Ordering::SeqCst);
    provider.gate.acquire().await.unwrap().forget();
    if kill {
        // What a server-side timeout or an administrator does to a session.
        let client = tx.client().await.unwrap();
        let _ = client
            .batch_execute("SELECT pg_terminate_backend(pg_backend_pid())")
            .await;
    }
    StatusCode::CREATED
}

fn request(key: &str, kill: bool) -> Request {
    let mut req = http::Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", key);
    if kill {
        req = req.header("x-kill-session", "1");
    }
    let mut req = req.body(Body::from(r#"{"sku":"A-1"}"#)).unwrap();
    req.extensions_mut().insert(Scope::new("acme"));
    req
}

async fn send(app: &Router, req: Request) -> (StatusCode, String) {
    let res = timeout(PATIENCE, app.clone().oneshot(req))
        .await
        .expect("answered in time")
        .unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The app on a pool whose sessions have a 300 ms idle-in-transaction
/// timeout, as an operator may set for the role.
async fn setup(url: &str) -> (Router, Provider) {
    let mut config = pg::pg_config(url);
    config.options("-c idle_in_transaction_session_timeout=300");
    let store = PostgresStore::builder(pg::pool(config, 4))
        .with_table(pg::unique_table("liveness").parse().unwrap())
        .with_lock_timeout(Duration::from_millis(500))
        .with_listener(pg::pg_config(url))
        .build();
    store.migrate().await.unwrap();
    let table = pg::unique_table("liveness_orders");
    pg::connect(url)
        .await
        .batch_execute(&format!("CREATE TABLE {table} (effect text NOT NULL)"))
        .await
        .unwrap();
    let provider = Provider {
        table,
        calls: Arc::new(AtomicUsize::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let app = Router::new()
        .route("/orders", post(order_then_provider))
        .route_layer(
            IdempotencyLayer::transactional(store).with_wait_timeout(Duration::from_millis(100)),
        )
        .with_state(provider.clone());
    (app, provider)
}

async fn orders(url: &str, table: &str) -> i64 {
    pg::connect(url)
        .await
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// The handler waits on its provider for 4x the server's idle timeout and
/// 2.4x the lock: duplicates meanwhile are "in progress", the provider is
/// called once, the commit succeeds and the retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_claim_outlives_the_servers_idle_timeout_and_the_lock() {
    let Some(url) = pg::database_url("transactional_claim_outlives_idle_timeout") else {
        return;
    };
    let (app, provider) = setup(&url).await;
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, request("order-slow-provider", false)).await }
    });
    while provider.calls.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let duplicate = send(&app, request("order-slow-provider", false)).await;
        assert_eq!(duplicate.0, StatusCode::CONFLICT, "{}", duplicate.1);
        assert!(
            duplicate.1.contains("idempotency_in_progress"),
            "{}",
            duplicate.1
        );
    }
    provider.gate.add_permits(1);
    let first = first.await.unwrap();
    assert_eq!(first.0, StatusCode::CREATED, "{}", first.1);
    let retry = send(&app, request("order-slow-provider", false)).await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        1,
        "one provider call"
    );
    assert_eq!(orders(&url, &provider.table).await, 1, "one order");
}

/// The session ends after the handler ran (an operator, a server timeout):
/// the answer says the outcome is unknown (never "not processed"), the
/// writes were rolled back, and the retry runs once on a clean slate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_lost_after_the_handler_ran_answers_outcome_unknown() {
    let Some(url) = pg::database_url("commit_lost_answers_outcome_unknown") else {
        return;
    };
    let (app, provider) = setup(&url).await;
    provider.gate.add_permits(2);
    let cut = send(&app, request("order-session-killed", true)).await;
    assert_eq!(cut.0, StatusCode::SERVICE_UNAVAILABLE, "{}", cut.1);
    assert!(cut.1.contains("idempotency_outcome_unknown"), "{}", cut.1);
    assert!(!cut.1.contains("not processed"), "{}", cut.1);
    assert_eq!(orders(&url, &provider.table).await, 0, "rolled back");
    // The key is free at once: the claim died with the session.
    let retry = send(&app, request("order-session-killed", false)).await;
    assert_eq!(retry.0, StatusCode::CREATED, "{}", retry.1);
    assert_eq!(orders(&url, &provider.table).await, 1);
}
