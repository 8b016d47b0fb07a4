//! [`PostgresStoreBuilder`]: a [`PostgresStore`]'s configuration, consumed
//! by [`build`](PostgresStoreBuilder::build).

use super::wait::listener_connect;
use super::{Config, PostgresStore, SqlIdentifier};
use crate::store::near_cache::NearCache;
use crate::store::settings::Settings;
use crate::store::shared::{shared_setters, Shared};
use deadpool_postgres::Pool;
use std::fmt;
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
        let c = &self.config;
        let mut d = f.debug_struct("PostgresStoreBuilder");
        d.field("schema", &c.schema).field("table", &c.table);
        Shared::timing_fields(&self.settings, &mut d)
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
                colliding_key_locks: false,
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

    shared_setters!(
        clock: "the database's",
        operation: "pool checkout included",
        listener: "[listener](Self::with_listener)"
    );

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

    /// Tests only: every key of a scope shares one advisory lock, as if all
    /// their hashes collided (a collision must only make a key wait).
    #[doc(hidden)]
    pub fn with_colliding_key_locks(mut self) -> Self {
        self.config.colliding_key_locks = true;
        self
    }

    /// The store, configured. Every call makes a new one: stores built from
    /// clones of a builder share the pool and table, nothing else.
    pub fn build(self) -> PostgresStore {
        PostgresStore::of(self.pool, self.settings, self.config)
    }
}
