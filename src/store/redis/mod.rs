//! A Redis or Valkey [`Store`], on one server or a Cluster.
//!
//! Every operation is one Lua script, atomic on the server: a fresh request
//! costs two round trips (`begin` + `complete`), a replay one, or none from
//! the near cache of completed records this instance read. A claim's lock
//! expiry is a field on the server's clock, which only `begin` judges (a late
//! owner nobody took over still completes); retention is a key TTL; and
//! connecting refuses a server whose `maxmemory-policy` evicts. Fencing
//! tokens grow with the server's clock in microseconds, so they keep growing
//! after a record expired. A record and its scope's index share a hash tag, so every
//! script touches one hash slot and runs unchanged on a Cluster. Waiters are
//! woken by pub/sub messages `complete` and `release` publish, and re-check on
//! a coalesced backoff. `docs/redis.md` in the repository has the layout, the
//! scripts and what each durability mode guarantees.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::{IdempotencyLayer, RedisStore};
//!
//! # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
//! let store = RedisStore::builder()
//!     .with_lock_timeout(Duration::from_secs(30))
//!     .connect("redis://127.0.0.1:6379")
//!     .await?;
//! let layer = IdempotencyLayer::new(store.clone());
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```

mod builder;
mod command;
mod eviction;
#[cfg(feature = "test-util")]
mod instrumentation;
mod listen;
mod operations;
mod phases;
mod prefix;
mod scripts;

pub use self::builder::RedisStoreBuilder;
pub use self::prefix::RedisPrefix;
use self::scripts::Scripts;
use super::near_cache::{Completed, NearCache};
use super::settings::Settings;
use super::shared::{embeds_shared, Shared};
use super::{Begin, RecordKey, StoreError};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A [`Store`](crate::store::Store) in Redis or Valkey, shared by every instance of
/// an application: one server ([`connect`](Self::connect)) or a Cluster
/// ([`connect_cluster`](Self::connect_cluster)).
///
/// - **Atomic, one round trip**: `begin` is one script that claims a free key
///   or reads the live record (replay, mismatch, in progress) without writing;
///   `complete`, `extend` and `release` are scripts fenced by the claim's token.
/// - **Near cache**: a retry of a completed record this instance wrote or
///   read is answered from memory, no round trip, while the subscriber is
///   connected (see [`with_near_cache`](RedisStoreBuilder::with_near_cache)); a
///   `purge_scope` anywhere reaches every instance's cache through it.
/// - **Server clock only**: a claim's lock expiry is a field in server
///   milliseconds and a record's retention a key TTL; tokens are at least the
///   server's clock in microseconds and higher than the key's last one, so
///   they grow across the record's expiry.
/// - **Late owners**: a claim whose lock ran out stays its owner's until a
///   `begin` takes it over (its key is kept for the lock plus the
///   retention), so a late `extend` or `complete` with no takeover in
///   between succeeds, as on the other stores.
/// - **No eviction**: every record has a TTL, so any `maxmemory-policy` but
///   `noeviction` may delete claims and records, and a retry of a deleted
///   one runs again: [`connect`](Self::connect) refuses such a server
///   (see [`RedisStoreBuilder::assume_noeviction`] where `CONFIG` is off).
/// - **Cluster**: a record and its scope's index share a hash tag derived from
///   the scope, so every script is single-slot and a scope's records live on
///   one shard (many scopes spread over all of them; one very busy scope
///   cannot be spread). [`purge_scope`](crate::store::Maintenance::purge_scope) reads the
///   scope's index.
/// - **Waiting**: duplicates waiting for a request in progress are woken by a
///   pub/sub message from `complete`/`release` (one subscribed connection per
///   store), and re-check on a coalesced backoff (at most about four checks a
///   second per key in one process, whatever the number of waiters).
/// - **Outages**: connection errors, a Cluster without a reachable primary for
///   the key's slot, and operations slower than
///   [`with_operation_timeout`](RedisStoreBuilder::with_operation_timeout) are
///   [`StoreError::Backend`]; the layer answers `503` and runs nothing. The
///   connections reconnect by themselves.
/// - **Failover**: replication is asynchronous, so a failover may lose the
///   latest claims and completions, and a retry of a lost one runs again.
///   [`with_replica_acks`](RedisStoreBuilder::with_replica_acks) makes claims and
///   completions wait for replicas to acknowledge them first.
///
/// Clones share the connection, the subscriber and the waiters. A store is
/// configured before it exists, by its [`builder`](Self::builder):
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::RedisStore;
///
/// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
/// let store = RedisStore::builder()
///     .with_retention(Duration::from_secs(48 * 3600))
///     .with_replica_acks(1, Duration::from_millis(500))
///     .connect_cluster(&["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
///     .await?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    /// Where the subscriber connects: the server, or each Cluster node in turn.
    subscribe_to: Vec<redis::Client>,
    /// Settings, waiters, near cache and claims, counters.
    shared: Shared,
    config: Config,
    channel: String,
    scripts: Scripts,
}

embeds_shared!(Inner);

/// What a store is configured with besides its [`Settings`].
#[derive(Clone)]
struct Config {
    prefix: String,
    replica_acks: Option<ReplicaAcks>,
    near_cache: NearCache,
}

/// How many replicas must acknowledge a claim or completion, and for how long
/// to wait for them.
#[derive(Clone, Copy, Debug)]
struct ReplicaAcks {
    replicas: usize,
    timeout: Duration,
}

/// A multiplexed connection to one server, or to a Cluster.
#[derive(Clone)]
enum Connection {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        let mode = match self.inner.connection {
            Connection::Server(_) => "server",
            Connection::Cluster(_) => "cluster",
        };
        let mut d = f.debug_struct("RedisStore");
        d.field("mode", &mode).field("prefix", &c.prefix);
        Shared::timing_fields(&self.inner.settings, &mut d)
            .field("replica_acks", &c.replica_acks)
            .field("near_cache", &c.near_cache)
            .finish_non_exhaustive()
    }
}

/// How long connecting and each command may take at the connection level;
/// the store's own operation timeout bounds whole operations.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// What an operation past its timeout is called in the error.
const OPERATION: &str = "Redis operation";

impl RedisStore {
    /// A store on the server at `url` (`redis://`, or `rediss://` with one of
    /// the `redis` crate's TLS features enabled), with key prefix
    /// `idempotency`, retaining records for 24 hours, locking claims for 10
    /// seconds (extended while their handler runs), failing operations that
    /// take longer than 5 seconds. Fails when the server does not answer.
    ///
    /// Fails too unless the server's `maxmemory-policy` is `noeviction` (read
    /// with `CONFIG GET`): any other policy may delete claims and records,
    /// and the retries of those requests run again. Where `CONFIG` is
    /// disabled, see [`RedisStoreBuilder::assume_noeviction`].
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder().connect(url).await
    }

    /// A store on the Cluster that `nodes` (any of its nodes' URLs) belong to;
    /// defaults as for [`connect`](Self::connect). Redirections (`MOVED`,
    /// `ASK`) and failovers are followed by the client.
    ///
    /// Fails unless every primary that answers has `maxmemory-policy
    /// noeviction`, as [`connect`](Self::connect).
    pub async fn connect_cluster(nodes: &[&str]) -> Result<Self, StoreError> {
        Self::builder().connect_cluster(nodes).await
    }

    /// A [`RedisStoreBuilder`] with the defaults of [`connect`](Self::connect),
    /// to configure the store before it exists, such as
    /// [`assume_noeviction`](RedisStoreBuilder::assume_noeviction):
    /// `RedisStore::builder().assume_noeviction().connect(url)`.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// A connection to the server at `url`, and where its subscriber connects.
    async fn open(url: &str) -> Result<(Connection, Vec<redis::Client>), StoreError> {
        let client = redis::Client::open(url).map_err(backend)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECTION_TIMEOUT))
            .set_response_timeout(Some(CONNECTION_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let manager = tokio::time::timeout(
            CONNECTION_TIMEOUT,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        .map_err(|_| backend("connecting to Redis timed out"))?
        .map_err(backend)?;
        Ok((Connection::Server(manager), vec![client]))
    }

    /// A connection to the Cluster `nodes` belong to, and where its
    /// subscriber connects.
    async fn open_cluster(nodes: &[&str]) -> Result<(Connection, Vec<redis::Client>), StoreError> {
        let cluster = ClusterClientBuilder::new(nodes.to_vec())
            .connection_timeout(CONNECTION_TIMEOUT)
            .response_timeout(CONNECTION_TIMEOUT)
            .retries(3)
            .build()
            .map_err(backend)?;
        let connection = tokio::time::timeout(CONNECTION_TIMEOUT, cluster.get_async_connection())
            .await
            .map_err(|_| backend("connecting to the Redis Cluster timed out"))?
            .map_err(backend)?;
        let subscribe_to = nodes
            .iter()
            .map(|url| redis::Client::open(*url))
            .collect::<Result<_, _>>()
            .map_err(backend)?;
        Ok((Connection::Cluster(connection), subscribe_to))
    }

    fn of(
        connection: Connection,
        subscribe_to: Vec<redis::Client>,
        settings: Settings,
        config: Config,
    ) -> Self {
        let channel = format!("{}:done", config.prefix);
        let scripts = Scripts::new(&scripts::Constants {
            lock: millis(settings.lock_timeout()),
            keep: millis(claim_kept(&settings)),
            indexed: millis(phases_kept(&settings)),
            retention: millis(settings.retention()),
            window: millis(settings.tombstone()),
            channel: &channel,
        });
        Self {
            inner: Arc::new(Inner {
                connection,
                subscribe_to,
                channel,
                shared: Shared::new(settings, config.near_cache),
                config,
                scripts,
            }),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }
}

pub(super) fn backend(error: impl Into<crate::body::BoxError>) -> StoreError {
    StoreError::Backend(error.into())
}

// Names: the hash tag is a digest of the scope alone, so any scope (braces
// included) makes a valid tag and a scope's records share one slot; the key
// follows verbatim (only the first `{...}` of a name is its tag). The scripts
// compare the stored scope and key with the request's, so two identities
// never share a record. See `command::Tag`.

/// The names of a key's recovery points (see `PhaseStore`): its phase
/// hash and its scope's phase index, in the record's slot.
struct PhaseNames {
    record: String,
    phases: String,
    index: String,
}

fn phase_names(prefix: &str, key: &RecordKey) -> PhaseNames {
    let tag = command::Tag::of(prefix, key.scope().as_str());
    let k = key.key().as_str();
    PhaseNames {
        record: tag.record(k).to_string(),
        phases: tag.phases(k).to_string(),
        index: tag.phase_index().to_string(),
    }
}

/// How long a claim's key is kept: past its lock, so that its owner's late
/// `extend` or `complete` still finds it when nobody took it over.
fn claim_kept(s: &Settings) -> Duration {
    s.lock_timeout().saturating_add(s.retention())
}

/// How long a request's phases are kept from its last record: past its
/// claim's key by the tombstone window, so a retry as late as the tombstone
/// answers still resumes. A claim's index entry is kept as long: past its
/// key, so that its completion (within the lock) need not move it.
fn phases_kept(s: &Settings) -> Duration {
    claim_kept(s).saturating_add(s.tombstone())
}

impl Inner {
    fn claim_kept(&self) -> Duration {
        claim_kept(&self.settings)
    }

    /// How long a claim's index entry is kept (see [`phases_kept`]).
    fn index_kept(&self) -> Duration {
        self.phases_kept()
    }

    fn phases_kept(&self) -> Duration {
        phases_kept(&self.settings)
    }

    fn count_round_trip(&self) {
        self.count_round_trips(1);
    }

    /// What `begin` (sent at `sent`) answered is kept near when it is a
    /// completed record: until `sent` + its remaining TTL.
    fn remember_begun(
        &self,
        key: &RecordKey,
        fp: &[u8; 32],
        begun: &Begin,
        remaining: Option<Duration>,
        sent: tokio::time::Instant,
        epoch: u64,
    ) {
        let Some(cache) = self.near() else { return };
        let completed = match begun {
            Begin::Replay(stored) => Completed::Response(stored.clone()),
            Begin::ResponseUnavailable => Completed::Unavailable,
            _ => return,
        };
        if let Some(remaining) = remaining {
            cache.insert(key, *fp, completed, sent + remaining, epoch);
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(scope: &str, key: &str) -> RecordKey {
        RecordKey::for_test(scope, key)
    }

    #[test]
    fn a_record_and_its_index_share_one_hash_tag_whatever_the_scope() {
        for scope in ["acme", "{x}", "}{", "", "tenant:{a}:b"] {
            let key = record(scope, "key-0000001");
            let t = command::Tag::of("idem", key.scope().as_str());
            let (rec, index) = (
                t.record(key.key().as_str()).to_string(),
                t.index().to_string(),
            );
            let tag = |name: &str| {
                let open = name.find('{').unwrap();
                let close = open + name[open..].find('}').unwrap();
                name[open + 1..close].to_owned()
            };
            assert_eq!(tag(&rec), tag(&index));
            assert_eq!(tag(&rec).len(), 32);
            assert!(rec.ends_with(":r:key-0000001"));
        }
        let (a, b) = (
            command::Tag::of("idem", "a")
                .record("key-0000001")
                .to_string(),
            command::Tag::of("idem", "b")
                .record("key-0000001")
                .to_string(),
        );
        assert_ne!(a, b);
    }
}
