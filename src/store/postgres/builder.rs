//! [`PostgresStoreBuilder`]: a [`PostgresStore`]'s configuration, consumed
//! by [`build`](PostgresStoreBuilder::build).

use super::wait::listener_connect;
use super::{Config, PostgresStore, SqlIdentifier};
use crate::store::near_cache::NearCache;
use crate::store::settings::Settings;
use deadpool_postgres::Pool;
use std::fmt;
use std::time::Duration;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;

/// The configuration of a [`PostgresStore`], from
/// [`PostgresStore::builder`]: every option is set here, and
/// [`build`](Self::build) makes the store.
///
/// A clone of a builder builds a second store of its own: the same pool
/// and table, its own waiters, listener and near cache.
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool, pg: tokio_postgres::Config)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_idempotency::PostgresStore;
///
/// let store = PostgresStore::builder(pool)
///     .with_table("idempotency_records".parse()?)
///     .with_lock_timeout(Duration::from_secs(30))
///     .with_listener(pg)
///     .build();
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build` makes the store"]
#[derive(Clone)]
pub struct PostgresStoreBuilder {
    pool: Pool,
    settings: Settings,
    config: Config,
}

impl fmt::Debug for PostgresStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (c, s) = (&self.config, &self.settings);
        f.debug_struct("PostgresStoreBuilder")
            .field("schema", &c.schema)
            .field("table", &c.table)
            .field("retention", &s.retention())
            .field("lock_timeout", &s.lock_timeout())
            .field("operation_timeout", &s.operation_timeout())
            .field("listener", &c.listener.is_some())
            .field("near_cache", &c.near_cache)
            .finish_non_exhaustive()
    }
}

impl PostgresStoreBuilder {
    pub(super) fn new(pool: Pool) -> Self {
        Self {
            pool,
            settings: Settings::RECORDS,
            config: Config {
                schema: "public".to_owned(),
                table: "idempotency_records".to_owned(),
                listener: None,
                near_cache: NearCache::default(),
            },
        }
    }

    /// The schema holding the table (default `public`);
    /// [`migrate`](PostgresStore::migrate) creates it if missing.
    ///
    /// A [`SqlIdentifier`] is a plain lower-case identifier, so a bad name is
    /// an `Err` where it is parsed: `.with_schema("billing".parse()?)`.
    pub fn with_schema(mut self, schema: SqlIdentifier) -> Self {
        self.config.schema = schema.as_str().to_owned();
        self
    }

    /// The table's name (default `idempotency_records`). The store also uses a
    /// sequence `<table>_token_seq` and an index `<table>_expires_at_idx`.
    ///
    /// A [`SqlIdentifier`] is a plain lower-case identifier, so a bad name is
    /// an `Err` where it is parsed: `.with_table("idempotency_records".parse()?)`.
    pub fn with_table(mut self, table: SqlIdentifier) -> Self {
        self.config.table = table.as_str().to_owned();
        self
    }

    /// How long a completed response is replayed (default 24 h), from its completion
    /// on the database's clock.
    ///
    /// Clamped to between 100 ms and 100 years (`Duration::MAX` means "forever":
    /// 100 years; a longer interval would overflow PostgreSQL's timestamps,
    /// and every completion would fail).
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.settings.set_retention(retention);
        self
    }

    /// How long a claim holds its key unless it is extended (default 10 s), on
    /// the database's clock.
    ///
    /// The layer extends a claim every twentieth of this while its handler runs
    /// (one `UPDATE` each time), so it bounds how long a *dead* owner (a
    /// crashed process, a lost network) blocks its key, not how long a handler
    /// may take. A store stall of up to 9/10 of this, less one round trip, is survived by a
    /// running claim: extensions go out every 1/20 of it, each time-boxed to a
    /// third of the claim's remaining life (counted from the last successful
    /// extension's sending) and retried at once when it fails or times out
    /// (`docs/idempotency.md`, *Locks and retention*, derives the bound).
    ///
    /// Clamped to between 100 ms and 100 years.
    pub fn with_lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.settings.set_lock_timeout(lock_timeout);
        self
    }

    /// The longest one operation may take, pool checkout included (default 5 s);
    /// slower ones fail with [`StoreError::Backend`](crate::store::StoreError::Backend).
    ///
    /// At most 100 years.
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.settings.set_operation_timeout(timeout);
        self
    }

    /// Wakes waiting duplicates by `LISTEN`/`NOTIFY` on one dedicated connection
    /// opened with `config` without TLS (pooled connections cannot receive
    /// notifications). It connects on first use and reconnects with a backoff.
    pub fn with_listener(self, config: tokio_postgres::Config) -> Self {
        self.with_listener_tls(config, tokio_postgres::NoTls)
    }

    /// Like [`with_listener`](Self::with_listener), connecting with `tls`.
    pub fn with_listener_tls<T>(mut self, config: tokio_postgres::Config, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.config.listener = Some(listener_connect(config, tls));
        self
    }

    /// The near cache of completed records (default: 16 MiB, entries trusted
    /// for 10 s; [`NearCache::disabled`] turns it off).
    ///
    /// A retry of a record this instance completed or already read is then
    /// answered from memory, with no round trip. It is used only while the
    /// [listener](Self::with_listener) is connected, because that is how a
    /// [`purge_scope`](crate::store::Maintenance::purge_scope) on another instance reaches this
    /// one: without a listener every `begin` asks the database.
    pub fn with_near_cache(mut self, near_cache: NearCache) -> Self {
        self.config.near_cache = near_cache;
        self
    }

    /// The store, configured. Every call makes a new one: stores built from
    /// clones of a builder share the pool and table, nothing else.
    pub fn build(self) -> PostgresStore {
        PostgresStore::of(self.pool, self.settings, self.config)
    }
}
