//! Redis test helpers: the servers `scripts/test` starts (`REDIS_URL`, and the
//! Clusters' node URLs), loud skipping without them (or a panic when
//! `REQUIRE_REDIS=1`), a fresh key prefix per test so tests run in parallel,
//! and servers of a test's own for restarts.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower_idempotency::{store::RedisStoreBuilder, RedisStore};

fn required(test: &str, what: &str) -> Option<String> {
    match std::env::var(what) {
        Ok(value) if !value.is_empty() => Some(value),
        _ => {
            if std::env::var("REQUIRE_REDIS").as_deref() == Ok("1") {
                panic!("REQUIRE_REDIS=1 but {what} is not set: cannot run {test}");
            }
            eprintln!(
                "\n*** SKIPPED {test}: {what} is not set. \
                 Run ./scripts/test to test against real Redis servers. ***\n"
            );
            None
        }
    }
}

/// The standalone server's URL.
pub fn url(test: &str) -> Option<String> {
    required(test, "REDIS_URL")
}

/// The node URLs of the Cluster the tests share.
pub fn cluster(test: &str) -> Option<Vec<String>> {
    required(test, "REDIS_CLUSTER_URLS").map(|urls| urls.split(',').map(str::to_owned).collect())
}

/// The node URLs of the Cluster the failover test may break.
pub fn failover_cluster(test: &str) -> Option<Vec<String>> {
    required(test, "REDIS_FAILOVER_CLUSTER_URLS")
        .map(|urls| urls.split(',').map(str::to_owned).collect())
}

/// A key prefix no other test (or earlier run) uses.
pub fn unique_prefix(name: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "t-{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A store on the standalone server under a fresh prefix, configured by `f`.
pub async fn standalone(
    url: &str,
    f: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
) -> RedisStore {
    f(RedisStore::builder().with_prefix(unique_prefix("s").parse().unwrap()))
        .connect(url)
        .await
        .expect("connect to Redis")
}

/// A store on a Cluster under a fresh prefix, configured by `f`.
pub async fn on_cluster(
    nodes: &[String],
    f: impl FnOnce(RedisStoreBuilder) -> RedisStoreBuilder,
) -> RedisStore {
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    f(RedisStore::builder().with_prefix(unique_prefix("c").parse().unwrap()))
        .connect_cluster(&nodes)
        .await
        .expect("connect to the Redis Cluster")
}

/// A plain connection for the test's own commands.
pub async fn connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

/// The port of a `redis://127.0.0.1:PORT` URL.
pub fn port(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// A free loopback port (free when asked: a server started on it may race).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server of the test's own on a free loopback port, without
/// persistence; killed when dropped.
pub struct OwnServer {
    pub port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl OwnServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Started with `args` given to redis-server too (at every restart).
    pub fn start_with(args: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            child: None,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL): every record it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        self.child = Some(child);
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server did not start on port {}", self.port);
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
    }
}
