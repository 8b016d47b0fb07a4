//! PostgreSQL test helpers: pools from `DATABASE_URL`, a fresh table per test so
//! tests run in parallel, loud skipping without a database (or a panic when
//! `REQUIRE_POSTGRES=1`), and a TCP proxy to simulate outages.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_postgres::config::Host;
use tokio_postgres::NoTls;
use tower_idempotency::{store::PostgresStoreBuilder, PostgresStore};

/// `DATABASE_URL`, or `None` after a loud skip message; panics when
/// `REQUIRE_POSTGRES=1` (CI and `scripts/test`) and it is missing.
pub fn database_url(test: &str) -> Option<String> {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("REQUIRE_POSTGRES").as_deref() == Ok("1") {
                panic!("REQUIRE_POSTGRES=1 but DATABASE_URL is not set: cannot run {test}");
            }
            eprintln!(
                "\n*** SKIPPED {test}: DATABASE_URL is not set. \
                 Run ./scripts/test to test against a real PostgreSQL. ***\n"
            );
            None
        }
    }
}

/// The connection config of `url`, failing fast when the server is unreachable.
pub fn pg_config(url: &str) -> tokio_postgres::Config {
    let mut config: tokio_postgres::Config = url.parse().expect("DATABASE_URL parses");
    config.connect_timeout(Duration::from_secs(3));
    config
}

/// `url`'s credentials and database, reached at `127.0.0.1:port` instead.
pub fn pg_config_at(url: &str, port: u16) -> tokio_postgres::Config {
    let original = pg_config(url);
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .connect_timeout(Duration::from_secs(3));
    if let Some(user) = original.get_user() {
        config.user(user);
    }
    if let Some(password) = original.get_password() {
        config.password(password);
    }
    if let Some(dbname) = original.get_dbname() {
        config.dbname(dbname);
    }
    config
}

/// A pool that fails fast (3 s to connect, 5 s to wait for a connection).
pub fn pool(config: tokio_postgres::Config, max_size: usize) -> Pool {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(5)))
        .create_timeout(Some(Duration::from_secs(3)))
        .recycle_timeout(Some(Duration::from_secs(3)))
        .build()
        .expect("pool builds")
}

/// A table name no other test (or test process) uses.
pub fn unique_table(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A migrated store on its own table (in schema `public`), with a listener.
pub async fn store(
    url: &str,
    table: &str,
    configure: impl FnOnce(PostgresStoreBuilder) -> PostgresStoreBuilder,
) -> PostgresStore {
    let builder = PostgresStore::builder(pool(pg_config(url), 8))
        .with_table(table.parse().unwrap())
        .with_listener(pg_config(url));
    let store = configure(builder).build();
    store.migrate().await.expect("migrate");
    store
}

/// One plain connection, for assertions in SQL.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = pg_config(url).connect(NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The TCP address of the database in `url`.
pub async fn server_addr(url: &str) -> SocketAddr {
    let config = pg_config(url);
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let mut addrs = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolve database host");
    addrs.next().expect("database host has an address")
}
