//! The PostgreSQL job store of `--features postgres` with `DATABASE_URL`:
//! every instance pointed at the same database shares its jobs, leases,
//! cursors and budgets.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::error::Error;
use std::time::Duration;
use tokio_postgres::NoTls;
use tower_idempotency::lease::store::PostgresJobStore;
use tower_idempotency::store::SqlIdentifier;
use tower_idempotency::PostgresStore;

/// Connections per instance: starts, worker calls and each `/events` poll
/// hold one for a round trip or two.
const POOL_SIZE: usize = 16;

/// A migrated [`PostgresJobStore`] on `url` with `lease`, and a description
/// for the start-up banner (never the password).
///
/// Fails fast: 3 s to connect, 5 s to wait for a free connection, so a
/// missing database is an error at start-up and a `503` later, never a hang.
/// TLS is not wired into the demo (`NoTls`): use a local or tunnelled server.
pub async fn job_store(
    url: &str,
    lease: Duration,
) -> Result<(PostgresJobStore, String), Box<dyn Error>> {
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| format!("DATABASE_URL is not a PostgreSQL URL: {e}"))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(3));
    }
    let place = describe(&config);
    let mut builder = PostgresJobStore::builder(pool(config)?).with_lease(lease);
    let mut table = "lease_jobs".to_owned();
    if let Ok(name) = std::env::var("REPORT_JOBS_TABLE") {
        let name: SqlIdentifier = name
            .parse()
            .map_err(|e| format!("REPORT_JOBS_TABLE: {e}"))?;
        table = name.to_string();
        builder = builder.with_table(name);
    }
    let store = builder.build();
    store
        .migrate()
        .await
        .map_err(|e| format!("PostgreSQL job store ({place}): migrate failed: {e}"))?;
    Ok((store, format!("postgres ({place}, table {table})")))
}

/// The idempotency records of `POST /reports`, in the jobs' database.
pub async fn records_store(jobs_url: &str) -> Result<PostgresStore, Box<dyn Error>> {
    let config: tokio_postgres::Config = jobs_url.parse()?;
    let store = PostgresStore::builder(pool(config.clone())?)
        .with_table("report_idempotency_records".parse()?)
        .with_listener(config)
        .build();
    store.migrate().await?;
    Ok(store)
}

/// A pool that fails fast when the database is down.
fn pool(config: tokio_postgres::Config) -> Result<Pool, Box<dyn Error>> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(POOL_SIZE)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(3)))
        .recycle_timeout(Some(Duration::from_secs(3)))
        .build()?)
}

/// `database NAME on HOST:PORT`, without credentials.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(other) => format!("{other:?}"),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("database {database} on {host}:{port}")
}
