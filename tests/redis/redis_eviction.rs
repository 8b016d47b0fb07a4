//! `maxmemory-policy`: a store connects only to servers that never evict
//! (every record has a TTL, so every other policy may delete claims and
//! records, and their retries run again), on one server and on every primary
//! of a Cluster; `assume_noeviction` skips the check for servers without
//! `CONFIG`, with a warning; and what an evicting server does when the check
//! is skipped. Each test runs servers of its own: the shared ones keep their
//! policy.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower_idempotency::store::conformance::{fingerprint, record, response};
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::{
    store::{Begin, Store, StoreError},
    RedisStore,
};
use tower_idempotency_tests::support::redis as r;

async fn set_config(url: &str, name: &str, value: &str) {
    let mut conn = r::connection(url).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut conn)
        .await
        .unwrap();
}

fn refusal(result: Result<RedisStore, StoreError>) -> String {
    match result {
        Err(StoreError::Backend(error)) => error.to_string(),
        Err(other) => panic!("expected a backend error, got {other:?}"),
        Ok(store) => panic!("connected: {store:?}"),
    }
}

/// A store on `url` serves: a claim, its completion, a replay.
async fn serves(store: &RedisStore) {
    let key = record("tenant", "evict-check-1");
    let Begin::Claimed(Claim { token, .. }) = store.begin(&key, &fingerprint("a")).await.unwrap()
    else {
        panic!("a fresh key is claimed");
    };
    store
        .complete(&key, token, Completion::Response(response(b"ok")))
        .await
        .unwrap();
    assert!(matches!(
        store.begin(&key, &fingerprint("a")).await.unwrap(),
        Begin::Replay(_)
    ));
}

#[tokio::test]
async fn noeviction_is_accepted() {
    if r::url("noeviction").is_none() {
        return;
    }
    let server = r::OwnServer::start();
    set_config(&server.url(), "maxmemory-policy", "noeviction").await;
    let store = RedisStore::connect(&server.url()).await.unwrap();
    serves(&store).await;
}

macro_rules! refused {
    ($($name:ident: $policy:literal,)*) => {$(
        #[tokio::test]
        async fn $name() {
            if r::url($policy).is_none() {
                return;
            }
            let server = r::OwnServer::start();
            set_config(&server.url(), "maxmemory-policy", $policy).await;
            let error = refusal(RedisStore::connect(&server.url()).await);
            assert!(
                error.contains(concat!("maxmemory-policy is ", $policy))
                    && error.contains("noeviction"),
                "{error}"
            );
            // Restored, the same server is accepted.
            set_config(&server.url(), "maxmemory-policy", "noeviction").await;
            RedisStore::connect(&server.url()).await.unwrap();
        }
    )*};
}

refused! {
    volatile_ttl_is_refused: "volatile-ttl",
    volatile_lru_is_refused: "volatile-lru",
    allkeys_lru_is_refused: "allkeys-lru",
    volatile_lfu_is_refused: "volatile-lfu",
    allkeys_lfu_is_refused: "allkeys-lfu",
    allkeys_random_is_refused: "allkeys-random",
    volatile_random_is_refused: "volatile-random",
}

/// What the `tracing` events of the current thread wrote.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// Current-thread runtime: the subscriber set for this thread sees connect's events.
#[tokio::test]
async fn without_config_it_is_refused_unless_assumed_and_then_warned_about() {
    if r::url("CONFIG disabled").is_none() {
        return;
    }
    let server = r::OwnServer::start_with(&["--rename-command", "CONFIG", ""]);
    let error = refusal(RedisStore::connect(&server.url()).await);
    assert!(
        error.contains("cannot read Redis maxmemory-policy") && error.contains("assume_noeviction"),
        "{error}"
    );

    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let store = RedisStore::builder()
        .assume_noeviction()
        .connect(&server.url())
        .await
        .unwrap();
    let written = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert_eq!(written.matches("maxmemory-policy not checked").count(), 1);
    assert!(written.contains("WARN"), "{written}");
    serves(&store).await;
}

/// Two primaries on ports of their own, 8192 slots each, as one Cluster.
async fn own_cluster() -> (r::OwnServer, r::OwnServer, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let node = |name: &str, bus: &str| {
        let conf = dir.0.join(format!("{name}.conf"));
        r::OwnServer::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            bus,
            "--cluster-config-file",
            conf.to_str().unwrap(),
            "--cluster-node-timeout",
            "1000",
        ])
    };
    let b_bus = r::free_port().to_string();
    let (a, b) = (node("a", &r::free_port().to_string()), node("b", &b_bus));
    let cluster = |server: &r::OwnServer, args: &[&str]| {
        let url = server.url();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        async move {
            let mut conn = r::connection(&url).await;
            redis::cmd("CLUSTER")
                .arg(&args)
                .query_async::<redis::Value>(&mut conn)
                .await
                .unwrap()
        }
    };
    cluster(&a, &["ADDSLOTSRANGE", "0", "8191"]).await;
    cluster(&b, &["ADDSLOTSRANGE", "8192", "16383"]).await;
    let b_port = b.port.to_string();
    // The bus port is not the default port + 10000: named.
    cluster(&a, &["MEET", "127.0.0.1", &b_port, &b_bus]).await;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut ready = true;
        for server in [&a, &b] {
            let info = cluster(server, &["INFO"]).await;
            let info: String = redis::from_redis_value(info).unwrap();
            ready &= info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:2");
        }
        if ready {
            return (a, b, dir);
        }
        assert!(Instant::now() < until, "the own Cluster did not form");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);

    impl Dir {
        pub fn new() -> Self {
            let path = std::env::temp_dir().join(
                tower_idempotency_tests::support::redis::unique_prefix("cluster"),
            );
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_refused_when_any_primary_evicts() {
    if r::url("own cluster").is_none() {
        return;
    }
    let (a, b, _dir) = own_cluster().await;
    let nodes = [a.url()];
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    // Only the primary the store was not given evicts.
    set_config(&b.url(), "maxmemory-policy", "allkeys-lru").await;
    let error = refusal(RedisStore::connect_cluster(&nodes).await);
    assert!(
        error.contains("maxmemory-policy is allkeys-lru")
            && error.contains(&format!(":{}", b.port)),
        "{error}"
    );
    set_config(&b.url(), "maxmemory-policy", "noeviction").await;
    let store = RedisStore::connect_cluster(&nodes).await.unwrap();
    serves(&store).await;
}

/// With the check skipped on an evicting server that runs out of memory, a
/// completed record (and its tombstone) is deleted and its retry is claimed
/// again: the handler would run twice. What `docs/redis.md` warns of, shown.
#[tokio::test]
async fn skipped_on_an_evicting_server_a_record_vanishes_and_its_retry_runs_again() {
    if r::url("eviction").is_none() {
        return;
    }
    let server = r::OwnServer::start();
    let url = server.url();
    let store = RedisStore::builder()
        .assume_noeviction()
        .connect(&url)
        .await
        .unwrap();
    let key = record("tenant", "evicted-0001");
    let fp = fingerprint("a");
    let Begin::Claimed(Claim { token, .. }) = store.begin(&key, &fp).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    store
        .complete(&key, token, Completion::Response(response(b"ran")))
        .await
        .unwrap();

    set_config(&url, "maxmemory-policy", "allkeys-lru").await;
    let mut conn = r::connection(&url).await;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    set_config(&url, "maxmemory", &(used + 256 * 1024).to_string()).await;
    let filler = vec![b'x'; 4096];
    let mut evicted = false;
    for i in 0..2000 {
        let () = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&filler[..])
            .query_async(&mut conn)
            .await
            .unwrap();
        // SCAN reads names only: the record's LRU clock is not touched. The
        // record and its tombstone (`x`) must both be gone.
        let (_, left): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(0)
            .arg("MATCH")
            .arg(format!("{}:*:[rx]:*", store.prefix()))
            .arg("COUNT")
            .arg(100_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        if left.is_empty() {
            evicted = true;
            break;
        }
    }
    assert!(evicted, "the record survived 8 MB of writes into 256 kB");
    // The retry of a request that ran is claimed: it would run again (on any
    // instance but the one that completed it, whose near cache may still
    // answer for a few seconds).
    let other = RedisStore::builder()
        .assume_noeviction()
        .connect(&url)
        .await
        .unwrap();
    assert!(matches!(
        other.begin(&key, &fp).await.unwrap(),
        Begin::Claimed(_)
    ));
}
