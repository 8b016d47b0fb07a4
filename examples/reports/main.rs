//! The reports demo: one live job per tenant, report type and month, however
//! often the Generate button is pressed.
//!
//! ```sh
//! cargo run --example reports --features leases
//! # another shell: a double click is one job (200 created, then 200 join)
//! for i in 1 2; do curl -s -X POST localhost:3002/reports/start -H 'Authorization: Bearer acme' \
//!   -H 'Content-Type: application/json' -d '{"report_type":"customer_health","period":"2026-08"}'; echo; done
//! # the job both answers name, followed live
//! JOB=$(curl -s -X POST localhost:3002/reports/start -H 'Authorization: Bearer acme' \
//!   -H 'Content-Type: application/json' -d '{"report_type":"customer_health","period":"2026-08"}' \
//!   | sed 's/.*"job_id":"\([^"]*\)".*/\1/')
//! curl -sN localhost:3002/reports/$JOB/events -H 'Authorization: Bearer acme'
//! ```
//!
//! Env: `BIND` (default `127.0.0.1:3002`: the `processor` example takes 3001), `LEASE_SECONDS` (default 45),
//! `REPORT_ALLOWANCE` (jobs per tenant per month; unset = unlimited),
//! `REPORT_TOKEN_CAP` (model tokens per tenant per day, each start reserving
//! its report's estimate: 1200 for `customer_health`, 800 otherwise; a failed
//! job gives its tokens back), `REPORT_PROVIDER_FAIL` (`5xx` or `timeout`:
//! the simulated provider fails every job),
//! `REPORT_WORKER` (`off`: jobs wait for an external worker), `REPORT_CHUNK_MS`
//! (default 200), `ADMIN_TOKEN` (default `admin`), `DATABASE_URL` (PostgreSQL,
//! with `--features postgres`; `REPORT_JOBS_TABLE` picks the table, default
//! `lease_jobs`). See `docs/reports.md`.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!   cargo run --example reports --features leases,postgres
//! # job store: postgres (database postgres on 127.0.0.1:5432, table lease_jobs), lease 45s
//! ```

mod app;
#[cfg(feature = "postgres")]
mod postgres;

use std::error::Error;
use std::num::NonZeroU64;
use std::time::Duration;
use tower_idempotency::lease::store::Budget;
use tower_idempotency::lease::store::{AnyJobStore, JobStore, MemoryJobStore};
use tower_idempotency::store::purge::PurgeTask;
use tower_idempotency::MemoryStore;

/// How often jobs whose lease expired with nobody behind them are failed.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3002".into());
    let config = config_from_env()?;
    let (store, records, store_name) = job_store_from_env().await?;
    let worker = match config.worker {
        app::Worker::Off => "off (external workers acquire jobs over HTTP)".to_owned(),
        app::Worker::BuiltIn { chunk_delay } => {
            format!("built-in, a chunk every {} ms", chunk_delay.as_millis())
        }
    };
    app::spawn_stale_sweep(store.clone(), SWEEP_EVERY);
    // The idempotency records' expired rows (or entries) go in the
    // background, in bounded batches; stopped at shutdown below.
    let (app, purge) = match records {
        Records::Memory(records) => (
            app::router_with_records(store.clone(), records.clone(), config.clone()),
            PurgeTask::new(records).spawn()?,
        ),
        #[cfg(feature = "postgres")]
        Records::Postgres(records) => (
            app::router_with_records(store.clone(), records.clone(), config.clone()),
            PurgeTask::new(records).spawn()?,
        ),
    };
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!(
        "job store: {store_name}, lease {:?}",
        store.lease_duration()
    );
    println!("worker: {worker}");
    match config.budget {
        Some(budget) => println!("budget: {} job(s) per tenant per month", budget.allowance),
        None => println!("budget: unlimited"),
    }
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Lets a batch under way finish: the task never stops mid-statement.
    let deleted = purge.shutdown().await;
    println!("stopped ({deleted} expired record(s) purged)");
    Ok(())
}

/// Where `POST /reports`'s idempotency records live: with the jobs. Each is
/// mounted as it is (a layer hides its store's type).
enum Records {
    Memory(MemoryStore),
    #[cfg(feature = "postgres")]
    Postgres(tower_idempotency::PostgresStore),
}

/// The one place the job store is chosen: PostgreSQL when built with
/// `--features postgres` and `DATABASE_URL` is set (migrated here, so a fresh
/// database works), the in-memory store otherwise. Returns a description of
/// the store for the start-up banner.
async fn job_store_from_env() -> Result<(AnyJobStore, Records, String), Box<dyn Error>> {
    let lease = match std::env::var("LEASE_SECONDS") {
        Ok(v) => {
            let secs: f64 = v
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0)
                .ok_or("LEASE_SECONDS must be a positive number of seconds")?;
            Duration::from_secs_f64(secs)
        }
        Err(_) => Duration::from_secs(45),
    };
    let database_url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty());
    if let Some(url) = database_url {
        #[cfg(feature = "postgres")]
        {
            let (store, description) = postgres::job_store(&url, lease).await?;
            let records = postgres::records_store(&url).await?;
            return Ok((
                AnyJobStore::new(store),
                Records::Postgres(records),
                description,
            ));
        }
        // Refuse rather than silently keep jobs in this process only:
        // instances sharing DATABASE_URL expect to share their jobs.
        #[cfg(not(feature = "postgres"))]
        {
            let _ = url;
            return Err(
                "DATABASE_URL is set, but this build has no PostgreSQL support: \
                 run with `--features postgres`, or unset DATABASE_URL to use the \
                 in-memory store"
                    .into(),
            );
        }
    }
    let store = MemoryJobStore::builder().with_lease(lease).build();
    let records = MemoryStore::new();
    Ok((
        AnyJobStore::new(store),
        Records::Memory(records),
        "memory (this process only)".into(),
    ))
}

fn config_from_env() -> Result<app::Config, Box<dyn Error>> {
    let mut config = app::Config::default();
    if let Ok(v) = std::env::var("REPORT_ALLOWANCE") {
        // `NonZeroU64` refuses 0 too: an allowance of none would refuse every start.
        let allowance: NonZeroU64 = v.parse().map_err(|_| {
            "REPORT_ALLOWANCE must be a positive number of jobs per tenant per month"
        })?;
        config.budget = Some(Budget::per_month(allowance));
    }
    if let Ok(v) = std::env::var("REPORT_TOKEN_CAP") {
        let cap: NonZeroU64 = v.parse().map_err(|_| {
            "REPORT_TOKEN_CAP must be a positive number of tokens per tenant per day"
        })?;
        config.token_cap = Some(cap);
    }
    config.provider_failure = match std::env::var("REPORT_PROVIDER_FAIL").as_deref() {
        Ok("5xx") => Some(app::ProviderFailure::Status5xx),
        Ok("timeout") => Some(app::ProviderFailure::Timeout),
        Ok("") | Err(_) => None,
        Ok(_) => return Err("REPORT_PROVIDER_FAIL must be `5xx` or `timeout`".into()),
    };
    let chunk_ms: u64 = match std::env::var("REPORT_CHUNK_MS") {
        Ok(v) => v
            .parse()
            .map_err(|_| "REPORT_CHUNK_MS must be milliseconds")?,
        Err(_) => 200,
    };
    config.worker = match std::env::var("REPORT_WORKER").as_deref() {
        Ok("off") => app::Worker::Off,
        Ok("" | "on" | "builtin" | "built-in") | Err(_) => app::Worker::BuiltIn {
            chunk_delay: Duration::from_millis(chunk_ms),
        },
        Ok(_) => return Err("REPORT_WORKER must be `off` or `on` (the default)".into()),
    };
    if let Ok(token) = std::env::var("ADMIN_TOKEN") {
        if token.is_empty() {
            return Err("ADMIN_TOKEN must not be empty".into());
        }
        config.admin_token = token.into();
    }
    Ok(config)
}
