//! [`RedisStoreBuilder`]: a [`RedisStore`]'s configuration, consumed by
//! [`connect`](RedisStoreBuilder::connect) or
//! [`connect_cluster`](RedisStoreBuilder::connect_cluster).

use super::{eviction, Config, RedisPrefix, RedisStore, ReplicaAcks};
use crate::limits;
use crate::store::near_cache::NearCache;
use crate::store::settings::Settings;
use crate::store::shared::{shared_setters, Shared};
use crate::store::StoreError;
use std::fmt;
use std::time::Duration;

/// The configuration of a [`RedisStore`], from [`RedisStore::builder`]:
/// every option is set here, and [`connect`](Self::connect) or
/// [`connect_cluster`](Self::connect_cluster) makes the store.
///
/// A clone of a builder connects a second store of its own: its own
/// connection, subscriber, waiters and near cache (on the same keys, unless
/// its [prefix](Self::with_prefix) differs).
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::RedisStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::builder()
///     .with_prefix("checkout".parse()?)
///     .with_lock_timeout(Duration::from_secs(30))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `connect` or `connect_cluster` makes the store"]
#[derive(Clone)]
pub struct RedisStoreBuilder {
    assume_noeviction: bool,
    settings: Settings,
    config: Config,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        Self {
            assume_noeviction: false,
            settings: Settings::RECORDS,
            config: Config {
                prefix: "idempotency".to_owned(),
                replica_acks: None,
                near_cache: NearCache::default(),
            },
        }
    }
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let mut d = f.debug_struct("RedisStoreBuilder");
        d.field("assume_noeviction", &self.assume_noeviction)
            .field("prefix", &c.prefix);
        Shared::timing_fields(&self.settings, &mut d)
            .field("replica_acks", &c.replica_acks)
            .field("near_cache", &c.near_cache)
            .finish()
    }
}

impl RedisStoreBuilder {
    /// Skips the `maxmemory-policy` check, for servers that refuse `CONFIG`
    /// (most managed services rename or forbid it), and logs a warning at
    /// every connect that nothing was checked.
    ///
    /// The operator must then ensure that every node (replicas included, as
    /// one may be promoted) runs with `maxmemory-policy noeviction`, or
    /// without a `maxmemory` limit it can reach: under any other policy the
    /// server deletes claims and records when memory runs short, and the
    /// retries of those requests run their handlers again.
    pub fn assume_noeviction(mut self) -> Self {
        self.assume_noeviction = true;
        self
    }

    /// The prefix of every key and of the pub/sub channel (default
    /// `idempotency`): stores with different prefixes share nothing.
    ///
    /// A [`RedisPrefix`] is 1 to 64 of `[A-Za-z0-9_.:-]` (braces would change
    /// the hash tag), so a bad prefix is an `Err` where it is parsed:
    /// `.with_prefix("checkout".parse()?)`.
    pub fn with_prefix(mut self, prefix: RedisPrefix) -> Self {
        self.config.prefix = prefix.as_str().to_owned();
        self
    }

    shared_setters!(
        clock: "the server's",
        operation: "replica acknowledgements included",
        listener: "store's subscriber"
    );

    /// Waits, after every claim and completion, until `replicas` replicas of
    /// the key's primary acknowledged it (`WAIT`), for at most `timeout`.
    ///
    /// A claim not acknowledged in time is released and answered as a store
    /// error (`503`, the handler does not run); a completion not acknowledged
    /// fails as a store error, and the request's key stays in progress until
    /// its lock runs out. So once a handler ran, its claim exists on
    /// `replicas` replicas, and a failover that promotes one of them keeps the
    /// key from running again. Costs one more round trip per claim and per
    /// completion, and the replication delay. `docs/redis.md` compares what
    /// each mode guarantees.
    pub fn with_replica_acks(mut self, replicas: usize, timeout: Duration) -> Self {
        let timeout = limits::clamp(timeout, Duration::from_millis(1));
        self.config.replica_acks = Some(ReplicaAcks { replicas, timeout });
        self
    }

    /// [`RedisStore::connect`] with these options.
    pub async fn connect(self, url: &str) -> Result<RedisStore, StoreError> {
        let (connection, subscribe_to) = RedisStore::open(url).await?;
        let store = RedisStore::of(connection, subscribe_to, self.settings, self.config);
        eviction::check(&store, self.assume_noeviction).await?;
        Ok(store)
    }

    /// [`RedisStore::connect_cluster`] with these options.
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<RedisStore, StoreError> {
        let (connection, subscribe_to) = RedisStore::open_cluster(nodes).await?;
        let store = RedisStore::of(connection, subscribe_to, self.settings, self.config);
        eviction::check(&store, self.assume_noeviction).await?;
        Ok(store)
    }
}
