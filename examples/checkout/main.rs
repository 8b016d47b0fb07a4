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
//! slow payment network inside the handler), `DATABASE_URL` with
//! `--features postgres` to share records in PostgreSQL.

mod app;

use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::{MemoryStore, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let delay_ms: u64 = match std::env::var("CHECKOUT_DELAY_MS") {
        Ok(v) => v
            .parse()
            .map_err(|_| "CHECKOUT_DELAY_MS must be milliseconds")?,
        Err(_) => 0,
    };
    let (store, store_name) = store_from_env().await?;
    let app = app::router(
        store,
        Arc::new(app::Orders::default()),
        Duration::from_millis(delay_ms),
    );
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("idempotency store: {store_name}");
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

/// PostgreSQL when built with `--features postgres` and `DATABASE_URL` is set;
/// the in-memory store otherwise.
async fn store_from_env() -> Result<(Arc<dyn Store>, &'static str), Box<dyn std::error::Error>> {
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return Ok((Arc::new(postgres_store(&url).await?), "postgres"));
    }
    Ok((Arc::new(MemoryStore::new()), "memory"))
}

/// A migrated PostgreSQL store whose pool fails fast when the database is down.
#[cfg(feature = "postgres")]
async fn postgres_store(
    url: &str,
) -> Result<tower_idempotency::PostgresStore, Box<dyn std::error::Error>> {
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
    let store = tower_idempotency::PostgresStore::new(pool).with_listener(config);
    store.migrate().await?;
    Ok(store)
}
