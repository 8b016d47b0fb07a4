//! A PostgreSQL [`Store`] shared by every instance of an application.
//!
//! Each operation is one prepared statement (one round trip once the
//! connection's statement cache is warm): a fresh request costs two round trips
//! (`begin` + `complete`), a replay one (`begin`, a plain read). Every timestamp
//! is the database's `now()`; claims are fenced by tokens drawn from a sequence;
//! waiters are woken by `LISTEN`/`NOTIFY` on a dedicated connection and re-check
//! on a coalesced backoff. `docs/postgres.md` in the repository has the schema and
//! the SQL of every operation.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_idempotency::{IdempotencyLayer, PostgresStore};
//! use tokio_postgres::NoTls;
//! use deadpool_postgres::{Manager, Pool, Runtime};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pg: tokio_postgres::Config = "postgres://app@db/app".parse()?;
//! let pool = Pool::builder(Manager::new(pg.clone(), NoTls))
//!     .max_size(16)
//!     .runtime(Runtime::Tokio1)
//!     .wait_timeout(Some(Duration::from_secs(2)))
//!     .create_timeout(Some(Duration::from_secs(2)))
//!     .build()?;
//! let store = PostgresStore::builder(pool)
//!     .with_table("idempotency_records".parse()?)
//!     .with_lock_timeout(Duration::from_secs(30))
//!     .with_listener(pg)
//!     .build();
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store.clone());
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```

mod builder;
mod control;
mod identifier;
#[cfg(feature = "test-util")]
mod instrumentation;
pub(crate) mod migrate;
mod operations;
mod phases;
mod single_flight;
pub(crate) mod sql;
mod transaction;
mod wait;

pub use builder::PostgresStoreBuilder;
pub use identifier::SqlIdentifier;
pub use transaction::{
    PostgresRecordTransaction, PostgresTransaction, TransactionClient, TransactionQuery,
    TransactionStatement,
};

use self::single_flight::{Flights, Leader};
use self::sql::Sql;
use self::wait::ListenerConnect;
use super::encoding::decode_headers;
use super::near_cache::{Completed, NearCache};
use super::settings::Settings;
use super::shared::{embeds_shared, Shared};
use super::{Begin, Claim, FencingToken, RecordKey, StoreError, StoredResponse};
use crate::body::BoxError;
use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use http::StatusCode;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

/// How often `begin` re-runs its statement when a concurrent transaction keeps
/// committing a live row after the statement's snapshot was taken.
pub(super) const BEGIN_ATTEMPTS: usize = 8;

/// What an operation past its timeout is called in the error.
const OPERATION: &str = "PostgreSQL operation";

/// A [`Store`](crate::store::Store) in a PostgreSQL table, shared by every instance of an application.
///
/// - **Atomic, one round trip**: `begin` is a single statement that claims a free
///   or expired key (upsert), or reads the live record (replay, mismatch, in
///   progress) without writing anything. `complete` and `release` are single
///   statements fenced by `(scope, key, token)`.
/// - **Database clock only**: lock and retention expiries are `now() + interval`
///   in SQL; the application's clock is never compared with the database's.
/// - **Crash safe**: a claim whose process died stays in progress until its lock
///   expires; a retry then takes it over with a higher token from a sequence, and
///   the dead owner's late `complete` fails with [`StoreError::ClaimLost`].
/// - **Waiting**: with [`with_listener`](PostgresStoreBuilder::with_listener), duplicates waiting
///   for a request in progress are woken by `NOTIFY` from `complete`/`release`;
///   they also re-check the record on a coalesced backoff (at most about four
///   queries a second per key in one process, whatever the number of waiters),
///   and never wait past the lock's expiry. Concurrent identical `begin` calls in
///   one process (the waiters a completion wakes, a burst of duplicates) share one
///   query; a claim is never shared.
/// - **Outages**: pool and database errors, and operations slower than
///   [`with_operation_timeout`](PostgresStoreBuilder::with_operation_timeout), are
///   [`StoreError::Backend`]; the layer answers `503` and runs nothing. The pool
///   reconnects by itself when the database returns. Give the pool wait and
///   create timeouts (and `connect_timeout` in its config) so a dead database
///   fails fast.
///
/// Call [`migrate`](Self::migrate) once at startup (any number of instances may
/// run it at once), and [`purge_expired`](crate::store::Maintenance::purge_expired) periodically.
///
/// Clones share the pool, the listener and the waiters. A store is
/// configured before it exists, by its [`builder`](Self::builder):
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool, pg: tokio_postgres::Config)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_idempotency::store::Maintenance;
/// use tower_idempotency::PostgresStore;
///
/// let store = PostgresStore::builder(pool)
///     .with_schema("billing".parse()?)
///     .with_retention(Duration::from_secs(48 * 3600))
///     .with_listener(pg)
///     .build();
/// store.migrate().await?;
/// let purged = store.purge_expired().await?;
/// # let _ = purged;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// Settings, waiters, near cache and claims, counters (plain-mode claims
    /// only: a transactional one keeps its fingerprint itself).
    shared: Shared,
    config: Config,
    sql: Sql,
    flights: Flights,
    stats: Stats,
    /// The listener's session, where this instance's waiters register.
    session: wait::Session,
}

embeds_shared!(Inner);

/// What a store is configured with besides its [`Settings`].
#[derive(Clone)]
struct Config {
    schema: String,
    table: String,
    listener: Option<ListenerConnect>,
    near_cache: NearCache,
    /// Tests only: every key of a scope shares one advisory lock.
    colliding_key_locks: bool,
}

/// The counters of PostgreSQL's own steps (the shared ones are in [`Shared`]).
#[derive(Default)]
struct Stats {
    begin_retries: AtomicU64,
    /// A transactional claim found its transaction not READ COMMITTED: its
    /// claims are rows written in the transaction from then on.
    row_claims: std::sync::atomic::AtomicBool,
    begins_followed: AtomicU64,
    begins_shared: AtomicU64,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.inner.config;
        let mut d = f.debug_struct("PostgresStore");
        d.field("schema", &c.schema).field("table", &c.table);
        Shared::timing_fields(&self.inner.settings, &mut d)
            .field("listener", &c.listener.is_some())
            .finish_non_exhaustive()
    }
}

/// The pool [`PostgresStore::connect`] opens: its size, and how long
/// connecting, waiting for a connection, creating and recycling one may each
/// take, so that a database that is down fails a request fast (`503`).
const POOL_SIZE: usize = 16;
const POOL_TIMEOUT: Duration = Duration::from_secs(2);

impl PostgresStore {
    /// A store on the database at `url` (`postgres://user:password@host/db`,
    /// or `host=... user=...`), connecting without TLS, with the defaults of
    /// [`new`](Self::new) and a listener on the same database: the one-line
    /// start. Fails when the database does not answer within the operation
    /// timeout. The pool holds up to 16 connections and gives up connecting,
    /// waiting for, creating and recycling a connection after 2 s each (a
    /// `connect_timeout` in `url` is kept).
    ///
    /// Still call [`migrate`](Self::migrate) at startup. For other options use
    /// [`builder_from_url`](Self::builder_from_url); for TLS or a pool of your
    /// own, [`builder`](Self::builder).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tower_idempotency::store::StoreError> {
    /// use tower_idempotency::{IdempotencyLayer, PostgresStore};
    ///
    /// let store = PostgresStore::connect("postgres://app@localhost/app").await?;
    /// store.migrate().await?;
    /// let layer = IdempotencyLayer::transactional(store);
    /// # let _ = layer;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::builder_from_url(url)?.build();
        let inner = &store.inner;
        inner
            .settings
            .timed(OPERATION, async { inner.client().await.map(drop) })
            .await?;
        Ok(store)
    }

    /// A [`PostgresStoreBuilder`] on the pool and listener
    /// [`connect`](Self::connect) opens for `url`, to set other options
    /// before the store exists. Connects nothing: the pool connects on first
    /// use. Fails only when `url` does not parse.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_idempotency::PostgresStore;
    ///
    /// let store = PostgresStore::builder_from_url("postgres://app@localhost/app")?
    ///     .with_schema("billing".parse()?)
    ///     .with_retention(Duration::from_secs(48 * 3600))
    ///     .build();
    /// store.migrate().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder_from_url(url: &str) -> Result<PostgresStoreBuilder, StoreError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(backend)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_TIMEOUT);
        }
        let manager = deadpool_postgres::Manager::new(config.clone(), tokio_postgres::NoTls);
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(POOL_TIMEOUT))
            .recycle_timeout(Some(POOL_TIMEOUT))
            .build()
            .map_err(backend)?;
        Ok(Self::builder(pool).with_listener(config))
    }

    /// A store on `pool` in table `public.idempotency_records`, retaining records
    /// for 24 hours, locking claims for 10 seconds (extended while their handler runs), failing operations that take
    /// longer than 5 seconds, without a listener (waiters re-check on a backoff).
    pub fn new(pool: Pool) -> Self {
        Self::builder(pool).build()
    }

    /// A [`PostgresStoreBuilder`] on `pool` with the defaults of
    /// [`new`](Self::new), to configure the store before it exists.
    pub fn builder(pool: Pool) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(pool)
    }

    fn of(pool: Pool, settings: Settings, config: Config) -> Self {
        let channel = format!(
            "tower_idempotency_{}",
            &hex_sha256(format!("{}.{}", config.schema, config.table).as_bytes())[..16]
        );
        let sql = Sql::new(
            &config.schema,
            &config.table,
            &channel,
            settings.lock_timeout(),
            settings.retention(),
            config.colliding_key_locks,
            settings.tombstone(),
        );
        Self {
            inner: Arc::new(Inner {
                pool,
                shared: Shared::new(settings, config.near_cache),
                config,
                sql,
                flights: Flights::default(),
                stats: Stats::default(),
                session: wait::Session::default(),
            }),
        }
    }

    /// Creates or upgrades the schema, sequence, table and index: the numbered
    /// migrations of the table not yet recorded in
    /// `<schema>.tower_idempotency_migrations` run in order.
    ///
    /// Idempotent, and safe to run from many instances at once (and with
    /// `PostgresJobStore::migrate`): it runs in one transaction under the
    /// advisory lock all the crate's stores share.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        let (schema, table) = (&inner.config.schema, &inner.config.table);
        inner
            .settings
            .timed(OPERATION, async {
                let mut client = inner.client().await?;
                migrate::apply(&mut client, schema, table, &inner.sql.migrations)
                    .await
                    .map_err(backend)?;
                Ok(())
            })
            .await
    }

    /// The `schema.table` the store uses.
    pub fn table(&self) -> String {
        format!("{}.{}", self.inner.config.schema, self.inner.config.table)
    }
}

pub(super) fn backend(error: impl Into<BoxError>) -> StoreError {
    StoreError::Backend(error.into())
}

pub(super) fn hex_sha256(bytes: &[u8]) -> String {
    super::encoding::hex(&Sha256::digest(bytes))
}

/// The completed record a `begin` row answered with, for the near cache:
/// its answer and how long the database said it has left.
fn completed_of(begun: &Begin, row: &Row) -> Option<(Completed, Duration)> {
    let completed = match begun {
        Begin::Replay(stored) => Completed::Response(stored.clone()),
        Begin::ResponseUnavailable => Completed::Unavailable,
        _ => return None,
    };
    let remaining: Option<i64> = row.try_get(5).ok()?;
    Some((completed, Duration::from_millis(remaining?.max(0) as u64)))
}

fn decode_begin(row: &Row) -> Result<Begin, StoreError> {
    let outcome: &str = row.try_get(0).map_err(backend)?;
    Ok(match outcome {
        "claimed" => {
            let token = FencingToken(row.try_get(1).map_err(backend)?);
            let previous: Option<i64> = row.try_get(7).map_err(backend)?;
            Begin::Claimed(match previous {
                None => Claim::first(token),
                Some(previous) => {
                    let attempt: i32 = row.try_get(6).map_err(backend)?;
                    Claim::takeover(
                        token,
                        u32::try_from(attempt).map_err(backend)?,
                        FencingToken(previous),
                        row.try_get(8).map_err(backend)?,
                    )
                }
            })
        }
        "replay" => {
            let status: i16 = row.try_get(2).map_err(backend)?;
            let status = u16::try_from(status)
                .ok()
                .and_then(|s| StatusCode::from_u16(s).ok())
                .ok_or_else(|| backend("stored response status is invalid"))?;
            let headers = decode_headers(row.try_get(3).map_err(backend)?)?;
            let body: Vec<u8> = row.try_get(4).map_err(backend)?;
            Begin::Replay(Arc::new(StoredResponse {
                status,
                headers,
                body: Bytes::from(body),
            }))
        }
        "mismatch" => Begin::KeyReused,
        "in_progress" => Begin::InProgress,
        "unavailable" => Begin::ResponseUnavailable,
        "expired" => Begin::Expired,
        other => return Err(backend(format!("unexpected begin outcome {other:?}"))),
    })
}

impl Inner {
    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(backend)
    }

    /// Prepares through the connection's cache, counting a round trip on a miss.
    async fn prepare(&self, client: &Object, sql: &str) -> Result<Statement, StoreError> {
        let cached = client.statement_cache.size();
        let statement = client.prepare_cached(sql).await;
        if statement.is_err() || client.statement_cache.size() != cached {
            self.count_round_trips(1);
        }
        statement.map_err(backend)
    }

    async fn query(
        &self,
        client: &Object,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepare(client, sql).await?;
        self.count_round_trips(1);
        client.query(&statement, params).await.map_err(backend)
    }

    /// Runs `sql` and, pipelined in the same round trip, wakes the waiters of
    /// the key whose id is `id` (after `sql` committed: see `Sql::notify`).
    async fn query_then_notify(
        &self,
        client: &Object,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        id: &str,
    ) -> Result<Vec<Row>, StoreError> {
        let statement = self.prepare(client, sql).await?;
        let notify = self.prepare(client, &self.sql.notify).await?;
        self.count_round_trips(1);
        let (rows, notified) = pipelined(
            client.query(&statement, params),
            client.execute(&notify, &[&id]),
        )
        .await;
        // A wake-up that failed only delays waiters (they re-check): it never
        // makes a write that happened look failed.
        if let Err(error) = notified {
            tracing::debug!(%error, "a wake-up notification failed");
        }
        rows.map_err(backend)
    }

    async fn execute(
        &self,
        client: &Object,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let statement = self.prepare(client, sql).await?;
        self.count_round_trips(1);
        client.execute(&statement, params).await.map_err(backend)
    }

    /// Runs a purge batch: the records it changed, the phases it deleted.
    async fn purged(
        &self,
        client: &Object,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(u64, u64), StoreError> {
        let rows = self.query(client, sql, params).await?;
        let row = rows.first().ok_or_else(|| backend("no answer"))?;
        let records: i64 = row.try_get(0).map_err(backend)?;
        let phases: i64 = row.try_get(1).map_err(backend)?;
        Ok((records.max(0) as u64, phases.max(0) as u64))
    }

    /// Runs `begin`'s statement; a flight's `leader` stops taking followers just
    /// before it is sent.
    async fn begin_query(
        &self,
        key: &RecordKey,
        fp: &[u8],
        leader: Option<&mut Leader<'_>>,
    ) -> Result<Begin, StoreError> {
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        let client = self.client().await?;
        if let Some(leader) = leader {
            leader.close();
        }
        for _ in 0..BEGIN_ATTEMPTS {
            let (sent, epoch) = (tokio::time::Instant::now(), self.near_epoch());
            let rows = self
                .query(&client, &self.sql.begin, &[&scope, &k, &fp])
                .await?;
            if let Some(row) = rows.first() {
                let begun = decode_begin(row)?;
                if let Ok(fp) = <[u8; 32]>::try_from(fp) {
                    self.remember_read(key, &fp, &begun, row, sent, epoch);
                }
                return Ok(begun);
            }
            // A concurrent claim committed after this statement's snapshot.
            self.stats.begin_retries.fetch_add(1, Ordering::Relaxed);
        }
        Err(backend(format!(
            "begin saw the record change under it {BEGIN_ATTEMPTS} times in a row"
        )))
    }

    /// A completed record a `begin` statement read (sent at `sent`) is kept near.
    fn remember_read(
        &self,
        key: &RecordKey,
        fp: &[u8; 32],
        begun: &Begin,
        row: &Row,
        sent: tokio::time::Instant,
        epoch: u64,
    ) {
        if let (Some(cache), Some((completed, remaining))) = (self.near(), completed_of(begun, row))
        {
            cache.insert(key, *fp, completed, sent + remaining, epoch);
        }
    }

    /// The lock's remaining time on the database's clock, if `key` is in progress.
    async fn lock_remaining(&self, key: &RecordKey) -> Result<Option<Duration>, StoreError> {
        let (scope, k) = (key.scope().as_str(), key.key().as_str());
        self.settings
            .timed(OPERATION, async {
                let client = self.client().await?;
                let rows = self
                    .query(&client, &self.sql.lock_remaining, &[&scope, &k])
                    .await?;
                match rows.first() {
                    None => Ok(None),
                    Some(row) => {
                        let ms: i64 = row.try_get(0).map_err(backend)?;
                        Ok(Some(Duration::from_millis(ms.max(0) as u64)))
                    }
                }
            })
            .await
    }
}

/// Polls both futures together, so that two statements on one connection are
/// pipelined in one round trip (tokio-postgres sends a request when polled).
pub(super) async fn pipelined<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
    let (mut a, mut b) = (pin!(a), pin!(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        match (ra.take(), rb.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (ra, rb) = (a, b);
                Poll::Pending
            }
        }
    })
    .await
}
