//! PostgreSQL test helpers: pools from `DATABASE_URL`, a fresh table per test so
//! tests run in parallel, loud skipping without a database (or a panic when
//! `REQUIRE_POSTGRES=1`), and a TCP proxy to simulate outages.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_postgres::config::Host;
use tokio_postgres::NoTls;
use tower_idempotency::PostgresStore;

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
    configure: impl FnOnce(PostgresStore) -> PostgresStore,
) -> PostgresStore {
    let store = PostgresStore::new(pool(pg_config(url), 8))
        .with_table(table)
        .with_listener(pg_config(url));
    let store = configure(store);
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

/// A TCP proxy in front of the database that can be taken down (every
/// connection through it is cut, new ones are closed at once) and brought back,
/// or frozen: connections stay open but no byte passes either way, as with a
/// database server that hangs (SIGSTOP, a stalled disk, a lost network).
pub struct Proxy {
    pub port: u16,
    up: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Copies `from` to `to`, holding every chunk while `frozen` says so.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let Ok(n) = from.read(&mut buf).await else {
            return;
        };
        if n == 0 || frozen.wait_for(|f| !*f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, watch_up) = watch::channel(true);
        let (frozen, watch_frozen) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !*watch_up.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut watch_up = watch_up.clone();
                let mut watch_frozen = watch_frozen.clone();
                tokio::spawn(async move {
                    // A frozen server does not even accept.
                    if watch_frozen.wait_for(|f| !*f).await.is_err() {
                        return;
                    }
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::select! {
                        _ = pump(in_read, out_write, watch_frozen.clone()) => {}
                        _ = pump(out_read, in_write, watch_frozen) => {}
                        _ = watch_up.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Self {
            port,
            up,
            frozen,
            task,
        }
    }

    pub fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }

    /// Holds every byte in both directions (`true`) or lets them pass again.
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.up.send_replace(false);
        self.task.abort();
    }
}
