//! The checkout demo: the contract's `POST /v1/orders`, safe to retry.
//!
//! ```sh
//! cargo run --example checkout
//! # another shell: the same POST twice creates one order
//! for i in 1 2; do curl -s -X POST localhost:3000/v1/orders -H 'Authorization: Bearer acme' \
//!   -H 'Idempotency-Key: order-0001' -H 'Content-Type: application/json' \
//!   -d '{"sku":"SKU-1","qty":2,"currency":"USD"}'; echo; done
//! curl -s localhost:3000/v1/orders -H 'Authorization: Bearer acme'
//! ```
//!
//! Env: `BIND` (default `127.0.0.1:3000`), `CHECKOUT_DELAY_MS` (default 0: a
//! slow payment network between the charge and the order), `DATABASE_URL`
//! with `--features postgres` to keep records, charges and orders in
//! PostgreSQL (the handler writes them inside the layer's transaction), or
//! else `REDIS_URL` with `--features redis` to keep the idempotency records in
//! Redis (a Cluster when it lists several node URLs, comma-separated), so that
//! several instances replay each other's answers.
//!
//! On ctrl-c or SIGTERM the server stops accepting connections, then waits
//! for claimed handlers still running (a client may have hung up on them)
//! before it exits.

mod app;

use app::Ledger;
use std::time::Duration;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let delay_ms: u64 = match std::env::var("CHECKOUT_DELAY_MS") {
        Ok(v) => v
            .parse()
            .map_err(|_| "CHECKOUT_DELAY_MS must be milliseconds")?,
        Err(_) => 0,
    };
    let (layer, ledger, store_name) = from_env().await?;
    let in_flight = layer.in_flight();
    let app = app::router_with(layer, ledger, Duration::from_millis(delay_ms));
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("idempotency store: {store_name}");
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Connections are closed; handlers whose clients hung up may still run.
    println!("waiting for {} claimed handler(s)", in_flight.count());
    in_flight.idle().await;
    println!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// PostgreSQL when built with `--features postgres` and `DATABASE_URL` is set
/// (records, charges and orders in one transaction); else Redis when built
/// with `--features redis` and `REDIS_URL` is set (records only); memory
/// otherwise.
async fn from_env() -> Result<(IdempotencyLayer, Ledger, &'static str), Box<dyn std::error::Error>>
{
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let (store, pool) = postgres_store(&url).await?;
        Ledger::migrate(&pool).await?;
        let layer = IdempotencyLayer::transactional(store);
        return Ok((layer, Ledger::Postgres(pool), "postgres"));
    }
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        let nodes: Vec<&str> = url.split(',').collect();
        let store = match nodes.len() {
            1 => tower_idempotency::RedisStore::connect(&url).await?,
            _ => tower_idempotency::RedisStore::connect_cluster(&nodes).await?,
        };
        return Ok((IdempotencyLayer::new(store), Ledger::memory(), "redis"));
    }
    let layer = IdempotencyLayer::new(MemoryStore::new());
    Ok((layer, Ledger::memory(), "memory"))
}

/// A migrated PostgreSQL store whose pool fails fast when the database is down.
#[cfg(feature = "postgres")]
async fn postgres_store(
    url: &str,
) -> Result<(tower_idempotency::PostgresStore, deadpool_postgres::Pool), Box<dyn std::error::Error>>
{
    use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
    let mut config: tokio_postgres::Config = url.parse()?;
    config.connect_timeout(Duration::from_secs(3));
    let manager = Manager::from_config(
        config.clone(),
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(16)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(2)))
        .create_timeout(Some(Duration::from_secs(3)))
        .build()?;
    // In transactional mode the row lock keeps a live handler's claim, so the
    // lock timeout only decides how soon a crashed instance's key is free.
    let store = tower_idempotency::PostgresStore::new(pool.clone())
        .with_lock_timeout(Duration::from_secs(2))
        .with_listener(config);
    store.migrate().await?;
    Ok((store, pool))
}
