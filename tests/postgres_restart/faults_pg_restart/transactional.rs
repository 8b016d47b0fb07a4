//! Transactional mode with the database killed (`pg_ctl stop -m immediate`)
//! while handlers are inside their transactions: each request is answered
//! `503` (or the handler's own error) or with its recorded answer, and after
//! the restart every key has exactly one charge and one order.

use super::support::pg;
use super::{Cluster, Restart, SERVER};
use axum::extract::{Request, State};
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use std::time::Duration;
use tokio::time::{sleep, timeout, Instant};
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, PostgresStore, PostgresTransaction, Scope};

const KEYS: usize = 12;

/// Charge, a pause, order: a failing write answers 503 (and is rolled back).
async fn charge_then_order(State(table): State<String>, req: Request) -> (StatusCode, String) {
    let key = req.headers()["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned();
    let tx = req
        .extensions()
        .get::<PostgresTransaction>()
        .cloned()
        .unwrap();
    for effect in ["charge", "order"] {
        let written = async {
            let client = tx.client().await.map_err(|e| e.to_string())?;
            let sql = format!("INSERT INTO {table} (key, effect) VALUES ($1, $2)");
            client
                .execute(&sql, &[&key, &effect])
                .await
                .map_err(|e| e.to_string())
        };
        if let Err(error) = written.await {
            return (StatusCode::SERVICE_UNAVAILABLE, error);
        }
        sleep(Duration::from_millis(400)).await;
    }
    (StatusCode::CREATED, format!(r#"{{"order":"{key}"}}"#))
}

async fn send(app: &Router, key: &str) -> (StatusCode, String) {
    let mut req = http::Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(axum::body::Body::from(r#"{"sku":"A-1"}"#))
        .unwrap();
    req.extensions_mut().insert(Scope::new("acme"));
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_killed_mid_transaction_never_two_orders() {
    let _serial = SERVER.lock().await;
    let Some(url) = pg::database_url("database_killed_mid_transaction") else {
        return;
    };
    let Some(cluster) = Cluster::from_env() else {
        eprintln!(
            "\n*** SKIPPED database_killed_mid_transaction: TEST_PG_BIN/TEST_PGDATA unset ***\n"
        );
        return;
    };
    let _restart = Restart(&cluster);
    let table = pg::unique_table("tx_restart");
    let effects = format!("{table}_effects");
    pg::connect(&url)
        .await
        .batch_execute(&format!(
            "CREATE TABLE {effects} (key text NOT NULL, effect text NOT NULL)"
        ))
        .await
        .unwrap();
    let mut config = pg::pg_config(&url);
    config.options("-c synchronous_commit=on");
    config.connect_timeout(Duration::from_secs(1));
    let store = PostgresStore::builder(pg::pool(config.clone(), 16))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(Duration::from_secs(2))
        .with_operation_timeout(Duration::from_secs(2))
        .with_listener(config)
        .build();
    store.migrate().await.unwrap();
    let app = Router::new()
        .route("/orders", post(charge_then_order))
        .route_layer(IdempotencyLayer::transactional(store).with_wait_timeout(Duration::ZERO))
        .with_state(effects.clone());

    // Every key's first request is inside its transaction when the server dies.
    let keys: Vec<String> = (0..KEYS).map(|i| format!("order-crash-{i:04}")).collect();
    let firsts: Vec<_> = keys
        .iter()
        .map(|key| {
            let (app, key) = (app.clone(), key.clone());
            tokio::spawn(async move { send(&app, &key).await })
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    cluster.kill();
    for first in firsts {
        let (status, body) = timeout(Duration::from_secs(10), first)
            .await
            .unwrap()
            .unwrap();
        assert!(
            status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::CREATED,
            "{status} {body}"
        );
    }
    cluster.start();

    // Retries until each key is answered 201; none may run twice.
    let deadline = Instant::now() + Duration::from_secs(60);
    for key in &keys {
        loop {
            let (status, body) = send(&app, key).await;
            if status == StatusCode::CREATED {
                assert!(body.contains(key.as_str()), "{body}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} never recovered: {status} {body}"
            );
            sleep(Duration::from_millis(100)).await;
        }
    }
    let sql = pg::connect(&url).await;
    for key in &keys {
        for effect in ["charge", "order"] {
            let n: i64 = sql
                .query_one(
                    &format!("SELECT count(*) FROM {effects} WHERE key = $1 AND effect = $2"),
                    &[key, &effect],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(n, 1, "{key}: {n} {effect}s");
        }
    }
}
