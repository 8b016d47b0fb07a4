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
//! `CHECKOUT_STORE` chooses instead of those defaults: `memory`, `postgres`
//! (transactional mode), `postgres-plain` (plain mode: each row commits on its
//! own, before the record) or `redis` (with `DATABASE_URL` too, charges and
//! orders in PostgreSQL, each committed on its own).
//!
//! `PROCESSOR_URL` (say `http://127.0.0.1:3001`, where `cargo run --example
//! processor` listens) sends each charge to that card processor over HTTP,
//! with the request's downstream key as the processor's `Idempotency-Key`;
//! without it the charge is a row of the demo's own ledger.
//!
//! `CHECKOUT_PAUSE_MS` (default 0): at each step of the handler (before the
//! charge, after it, after the order, and once the answer is recorded),
//! print `checkpoint STEP KEY` and pause: where a crash test kills the
//! process.
//!
//! `POST /v1/phased-orders` takes the same orders in recovery points (the
//! order, the charge, then paid with its receipt email, each recorded when
//! it finishes, so a retry after a crash resumes after the last one); `GET
//! /v1/phased-orders` and `GET /v1/emails` list what it wrote. See
//! `phased.rs`.
//!
//! Limits, as `docs/security.md` advises (see `app.rs`): an order's body
//! must arrive whole within 10 s (`BODY_TIMEOUT`, else `408`); at most 64
//! order requests are taken in at once (`MAX_CONCURRENT_ORDERS`, others wait
//! for a slot before their body is read), so bodies hold at most 64 MiB; at
//! most 64 claimed handlers run at once (`MAX_IN_FLIGHT`, else `503
//! overloaded`), those whose client hung up included.
//!
//! On ctrl-c or SIGTERM the server stops accepting connections, then waits
//! for claimed handlers still running (a client may have hung up on them)
//! before it exits.

mod app;

use app::{Ledger, Options, Processor};
use std::time::Duration;
use tower_idempotency::store::purge::{PurgeHandle, PurgeTask};
use tower_idempotency::store::Maintenance;
use tower_idempotency::{IdempotencyLayer, MemoryStore};

/// Deletes `store`'s expired records every five minutes (± 10 %), in bounded
/// batches, until shut down.
fn purge_task(store: impl Maintenance) -> Result<PurgeHandle, Box<dyn std::error::Error>> {
    Ok(PurgeTask::new(store).spawn()?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let millis = |name: &str| -> Result<Duration, String> {
        match std::env::var(name) {
            Ok(v) => v
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| format!("{name} must be milliseconds")),
            Err(_) => Ok(Duration::ZERO),
        }
    };
    let (layer, phased, ledger, store_name, purge) = from_env().await?;
    let in_flight = layer.in_flight();
    let options = Options {
        delay: millis("CHECKOUT_DELAY_MS")?,
        pause: millis("CHECKOUT_PAUSE_MS")?,
        processor: std::env::var("PROCESSOR_URL")
            .ok()
            .map(|url| Processor::new(&url)),
        // Waited for at shutdown with the other route's handlers.
        phased: Some(phased.with_in_flight(in_flight.clone())),
    };
    println!("idempotency store: {store_name}");
    match &options.processor {
        Some(processor) => println!("charges: processor at {}", processor.url()),
        None => println!("charges: the demo's ledger"),
    }
    let app = app::router_with_options(layer, ledger, options);
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Connections are closed; handlers whose clients hung up may still run.
    println!("waiting for {} claimed handler(s)", in_flight.count());
    in_flight.idle().await;
    // Stopped last: the handlers above may still have completed records.
    if let Some(purge) = purge {
        let deleted = purge.shutdown().await;
        println!("purge task stopped ({deleted} expired record(s) deleted)");
    }
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

/// The layer of `POST /v1/orders`, the phased one of `POST
/// /v1/phased-orders` (on the same store), the ledger, the store's name and
/// its purge task.
type FromEnv = (
    IdempotencyLayer,
    IdempotencyLayer,
    Ledger,
    &'static str,
    Option<PurgeHandle>,
);

/// PostgreSQL when built with `--features postgres` and `DATABASE_URL` is set
/// (records, charges and orders in one transaction); else Redis when built
/// with `--features redis` and `REDIS_URL` is set (records only); memory
/// otherwise. `CHECKOUT_STORE` chooses instead. Memory and PostgreSQL come
/// with their purge task running (Redis expires records by itself).
async fn from_env() -> Result<FromEnv, Box<dyn std::error::Error>> {
    let set = |name: &str| std::env::var(name).is_ok();
    let choice = match std::env::var("CHECKOUT_STORE") {
        Ok(choice) => choice,
        Err(_) if cfg!(feature = "postgres") && set("DATABASE_URL") => "postgres".into(),
        Err(_) if cfg!(feature = "redis") && set("REDIS_URL") => "redis".into(),
        Err(_) => "memory".into(),
    };
    let needs = |what: &str| format!("CHECKOUT_STORE={choice} needs {what}");
    match choice.as_str() {
        "memory" => {
            let store = MemoryStore::new();
            let purge = purge_task(store.clone())?;
            Ok((
                IdempotencyLayer::new(store.clone()),
                IdempotencyLayer::phased(store),
                Ledger::memory(),
                "memory",
                Some(purge),
            ))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgres-plain" => {
            let url = std::env::var("DATABASE_URL").map_err(|_| needs("DATABASE_URL"))?;
            let (store, pool) = postgres_store(&url).await?;
            Ledger::migrate(&pool).await?;
            let purge = Some(purge_task(store.clone())?);
            let phased = IdempotencyLayer::phased(store.clone());
            Ok(match choice.as_str() {
                "postgres" => (
                    IdempotencyLayer::transactional(store),
                    phased,
                    Ledger::Postgres(pool),
                    "postgres",
                    purge,
                ),
                _ => (
                    IdempotencyLayer::new(store),
                    phased,
                    Ledger::PostgresOwnCommits(pool),
                    "postgres-plain",
                    purge,
                ),
            })
        }
        #[cfg(feature = "redis")]
        "redis" => {
            let url = std::env::var("REDIS_URL").map_err(|_| needs("REDIS_URL"))?;
            let nodes: Vec<&str> = url.split(',').collect();
            // As on PostgreSQL: how soon a crashed instance's key is free.
            let builder =
                tower_idempotency::RedisStore::builder().with_lock_timeout(Duration::from_secs(2));
            let store = match nodes.len() {
                1 => builder.connect(&url).await?,
                _ => builder.connect_cluster(&nodes).await?,
            };
            let layer = IdempotencyLayer::new(store.clone());
            let phased = IdempotencyLayer::phased(store);
            Ok((layer, phased, redis_ledger().await?, "redis", None))
        }
        _ => Err(needs("one of memory, postgres, postgres-plain, redis (with its feature)").into()),
    }
}

/// With Redis keeping the records, charges and orders are in PostgreSQL when
/// it is there too (each row committed on its own), in memory otherwise.
#[cfg(feature = "redis")]
async fn redis_ledger() -> Result<Ledger, Box<dyn std::error::Error>> {
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let (pool, _) = postgres_pool(&url)?;
        Ledger::migrate(&pool).await?;
        return Ok(Ledger::PostgresOwnCommits(pool));
    }
    Ok(Ledger::memory())
}

/// A migrated PostgreSQL store and its pool.
#[cfg(feature = "postgres")]
async fn postgres_store(
    url: &str,
) -> Result<(tower_idempotency::PostgresStore, deadpool_postgres::Pool), Box<dyn std::error::Error>>
{
    let (pool, config) = postgres_pool(url)?;
    // In transactional mode the row lock keeps a live handler's claim, so the
    // lock timeout only decides how soon a crashed instance's key is free.
    let store = tower_idempotency::PostgresStore::builder(pool.clone())
        .with_lock_timeout(Duration::from_secs(2))
        .with_listener(config)
        .build();
    store.migrate().await?;
    Ok((store, pool))
}

/// A pool that fails fast when the database is down, and its configuration.
#[cfg(feature = "postgres")]
fn postgres_pool(
    url: &str,
) -> Result<(deadpool_postgres::Pool, tokio_postgres::Config), Box<dyn std::error::Error>> {
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
    Ok((pool, config))
}
