//! The layer (plain and transactional) and the engine on PostgreSQL, their
//! futures cut at every poll: the handler's row exists at most once per key,
//! a retry replays it or runs it, and the pool is left sound.

use super::claimed::{self, App, Effects, Operation};
use super::{postgres, PgProbe, LOCK};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tower::util::BoxCloneService;
use tower::{service_fn, Layer};
use tower_idempotency::engine::Engine;
use tower_idempotency::{IdempotencyLayer, PostgresTransaction};
use tower_idempotency_tests::support::pg;

/// Sweeps of the transactional paths, whose cut points move with timing.
const ROUNDS: usize = 3;

struct PgEffects<'a>(&'a PgProbe);

impl Effects for PgEffects<'_> {
    async fn count(&self, key: &str) -> usize {
        self.0.effects(key).await
    }

    async fn violations(&self) -> Vec<String> {
        use super::cases::Probe;
        self.0.violations().await
    }
}

/// Writes `key`'s row through the request's transaction, between awaits.
async fn write_in_transaction(
    tx: &PostgresTransaction,
    table: &str,
    key: &str,
) -> Result<(), String> {
    tokio::task::yield_now().await;
    let client = tx.client().await.map_err(|e| e.to_string())?;
    let sql = format!("INSERT INTO {table}_effects (key) VALUES ($1)");
    client
        .execute(&sql, &[&key])
        .await
        .map_err(|e| e.to_string())?;
    client
        .execute("SELECT pg_sleep(0.01)", &[])
        .await
        .map_err(|e| e.to_string())?;
    drop(client);
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

/// Writes `key`'s row on a connection of its own (plain mode), between awaits.
async fn write_plain(client: &tokio_postgres::Client, table: &str, key: &str) {
    tokio::task::yield_now().await;
    let sql = format!("INSERT INTO {table}_effects (key) VALUES ($1)");
    client.execute(&sql, &[&key]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
}

fn created() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"created")));
    *response.status_mut() = StatusCode::CREATED;
    response
}

fn key_of(req: &Request<Full<Bytes>>) -> String {
    req.headers()["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned()
}

async fn transactional_layer(cancel_on_drop: bool) {
    let Some(h) = postgres().await else { return };
    let table = h.probe.table.clone();
    let layer = IdempotencyLayer::transactional(h.store.clone())
        .with_wait_timeout(Duration::ZERO)
        .with_cancel_on_drop(cancel_on_drop);
    let in_flight = layer.in_flight();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let table = table.clone();
        async move {
            let tx = req
                .extensions()
                .get::<PostgresTransaction>()
                .unwrap()
                .clone();
            let response = match write_in_transaction(&tx, &table, &key_of(&req)).await {
                Ok(()) => created(),
                Err(error) => {
                    let mut response = Response::new(Full::new(Bytes::from(error)));
                    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    response
                }
            };
            Ok::<_, Infallible>(response)
        }
    });
    let app: App = BoxCloneService::new(layer.layer(handler));
    // Where each cut lands varies with the I/O's timing: a few sweeps.
    for round in 0..ROUNDS {
        let what = format!("transactional layer (cancel_on_drop {cancel_on_drop}), round {round}");
        let (app, in_flight) = (app.clone(), in_flight.clone());
        claimed::layer(&what, app, in_flight, LOCK, PgEffects(&h.probe)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_layer_call_cut_at_every_poll() {
    transactional_layer(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_layer_with_cancel_on_drop_cut_at_every_poll() {
    transactional_layer(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_layer_call_cut_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let url = pg::database_url("cancel_pg plain layer").unwrap();
    let writer = Arc::new(pg::connect(&url).await);
    let table = h.probe.table.clone();
    let layer = IdempotencyLayer::new(h.store.clone()).with_wait_timeout(Duration::ZERO);
    let in_flight = layer.in_flight();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let (writer, table) = (writer.clone(), table.clone());
        async move {
            write_plain(&writer, &table, &key_of(&req)).await;
            Ok::<_, Infallible>(created())
        }
    });
    let app: App = BoxCloneService::new(layer.layer(handler));
    claimed::layer("plain layer", app, in_flight, LOCK, PgEffects(&h.probe)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_engine_run_cut_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let url = pg::database_url("cancel_pg plain engine").unwrap();
    let writer = Arc::new(pg::connect(&url).await);
    let table = h.probe.table.clone();
    let engine = Engine::new(h.store.clone()).with_wait_timeout(Duration::ZERO);
    let operation = move |key: String| -> Operation {
        let (writer, table) = (writer.clone(), table.clone());
        Box::new(move |_| {
            Box::pin(async move {
                write_plain(&writer, &table, &key).await;
                Ok(Bytes::from_static(b"done"))
            })
        })
    };
    claimed::engine("plain engine", engine, LOCK, operation, PgEffects(&h.probe)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_engine_run_cut_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let table = h.probe.table.clone();
    let engine = Engine::transactional(h.store.clone()).with_wait_timeout(Duration::ZERO);
    let operation = move |key: String| -> Operation {
        let table = table.clone();
        Box::new(move |context| {
            Box::pin(async move {
                let tx: PostgresTransaction = context.get().unwrap();
                write_in_transaction(&tx, &table, &key)
                    .await
                    .map_err(std::io::Error::other)?;
                Ok(Bytes::from_static(b"done"))
            })
        })
    };
    claimed::engine(
        "transactional engine",
        engine,
        LOCK,
        operation,
        PgEffects(&h.probe),
    )
    .await;
}
