//! Storage for idempotency records.
//!
//! A [`Store`] decides atomically, per `(scope, key)`, whether a request runs,
//! replays, or is refused. Three stores ship with the crate: [`MemoryStore`](crate::MemoryStore) for
//! a single process, `PostgresStore` (feature `postgres`) for many app
//! instances sharing one database, and `RedisStore` (feature `redis`) on Redis
//! or Valkey, one server or a Cluster. All pass the same conformance suite.

#[cfg(feature = "test-util")]
pub mod conformance;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod encoding;
pub(crate) mod erased;
pub mod inspect;
pub(crate) mod memory;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod near_cache;
#[cfg(feature = "test-util")]
pub mod phase_conformance;
pub mod phases;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub mod purge;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod settings;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod shared;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod waiters;

pub use inspect::{Inspect, KeyState, Release};
pub use memory::{MemoryStoreBuilder, MemoryStoreError};
#[cfg(any(feature = "postgres", feature = "redis"))]
pub use near_cache::NearCache;
pub use phases::{PhaseRecord, PhaseStore, RecordedPhases};
#[cfg(feature = "postgres")]
pub use postgres::{
    PostgresRecordTransaction, PostgresStoreBuilder, SqlIdentifier, TransactionClient,
    TransactionQuery, TransactionStatement,
};
#[cfg(feature = "redis")]
pub use redis::{RedisPrefix, RedisStoreBuilder};

use crate::body::BoxError;
use crate::{fingerprint::RequestFingerprint, IdempotencyKey, Scope};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The identity of a record: a key is unique within its scope only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordKey {
    scope: Scope,
    key: IdempotencyKey,
}

impl RecordKey {
    /// The record for `key` within `scope`.
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self { scope, key }
    }

    /// The scope (tenant) part.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The idempotency key part.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// A record key from test strings; panics on a key that does not parse.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn for_test(scope: &str, key: &str) -> Self {
        Self::new(
            Scope::new(scope),
            IdempotencyKey::parse(key.as_bytes()).expect("valid test key"),
        )
    }
}

/// Proof of a claim: only its holder may complete or release the record.
///
/// Tokens increase with every claim of a key, so a claim taken over after its
/// lock expired has a higher token than the one it replaced, and the old
/// owner's late completion is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(i64);

impl FencingToken {
    /// The token of this value (a store's own counter).
    pub const fn new(value: i64) -> Self {
        Self(value)
    }

    /// Its value, to compare with a fenced write's or to store it.
    pub const fn get(self) -> i64 {
        self.0
    }
}

/// A recorded response, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The response status.
    pub status: StatusCode,
    /// Allow-listed response headers, in their original order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The complete response body.
    pub body: Bytes,
}

/// A claim [`Store::begin`] made: its token, and whether it took over an
/// earlier claim of the key whose owner died or stalled.
///
/// A store returns [`Claim::first`] for a key that was free (never claimed,
/// released, or completed and past its retention and tombstone window), and a
/// [`Takeover`] for a
/// key whose last claim was still in progress when its lock ran out.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use tower_idempotency::store::{Claim, FencingToken, Takeover};
///
/// let first = Claim::first(FencingToken::new(7));
/// assert_eq!(first.attempt(), 1);
///
/// let began = SystemTime::now() - Duration::from_secs(30);
/// let second = Claim::takeover(FencingToken::new(9), 2, FencingToken::new(7), began);
/// assert_eq!(second.attempt(), 2);
/// assert_eq!(second.takeover.unwrap().previous_token, FencingToken::new(7));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    /// This claim's token.
    pub token: FencingToken,
    /// The earlier claim it took over, if its owner never completed or
    /// released it.
    pub takeover: Option<Takeover>,
}

/// The claim a [`Claim`] took over: its owner neither completed nor released
/// it before its lock ran out, so its handler may have had effects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The new claim's attempt: 2 after one takeover, one more for every
    /// takeover in a row since the key was last free.
    pub attempt: u32,
    /// The previous owner's fencing token.
    pub previous_token: FencingToken,
    /// When the previous claim was made, on the store's clock.
    pub previous_began: SystemTime,
}

impl Claim {
    /// A claim of a free key: attempt 1.
    pub fn first(token: FencingToken) -> Self {
        Self {
            token,
            takeover: None,
        }
    }

    /// A claim that took over `previous_token`'s claim (made at
    /// `previous_began`) as the key's `attempt`-th attempt in a row.
    pub fn takeover(
        token: FencingToken,
        attempt: u32,
        previous_token: FencingToken,
        previous_began: SystemTime,
    ) -> Self {
        Self {
            token,
            takeover: Some(Takeover {
                attempt,
                previous_token,
                previous_began,
            }),
        }
    }

    /// 1 for a claim of a free key, 2 after one takeover, and so on.
    pub fn attempt(&self) -> u32 {
        self.takeover.map_or(1, |t| t.attempt)
    }
}

/// What [`Store::begin`] decided for a request.
#[derive(Clone, Debug)]
pub enum Begin {
    /// The key was free (or its previous claim's lock expired): the caller now
    /// holds it and runs the request.
    Claimed(Claim),
    /// The same request completed earlier: replay this response.
    Replay(Arc<StoredResponse>),
    /// The key is held or was completed by a request with another fingerprint.
    KeyReused,
    /// The same request is still running under an unexpired lock.
    InProgress,
    /// The same request ran (its effects happened) but its response could not
    /// be recorded: its body failed, or was larger than the record limit. It is
    /// not run again while the record is retained.
    ResponseUnavailable,
    /// The same request completed (or ran without a recordable response)
    /// earlier, and its record has expired: only its tombstone is left (scope,
    /// key and fingerprint, for [`Timings::tombstone`] past the retention). It
    /// is not run again, and there is nothing to replay. Another fingerprint
    /// under the key answers [`KeyReused`](Self::KeyReused).
    Expired,
}

/// A store failure. The layer never runs the request: it answers `503`, or `429`
/// for [`QuotaExceeded`](Self::QuotaExceeded).
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The claim was taken over, released, or (its lock having expired) evicted:
    /// its token no longer owns the record.
    ClaimLost,
    /// The request's scope may not claim another key now (a per-scope quota,
    /// such as `MemoryStore`'s); other scopes are not affected. The layer
    /// answers `429 idempotency_quota_exceeded`.
    QuotaExceeded,
    /// The backend failed (connection, timeout, query error, or a condition of
    /// the store's own, in its own error type: `MemoryStore`'s capacity).
    Backend(BoxError),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ClaimLost => f.write_str("the claim's fencing token no longer owns the record"),
            Self::QuotaExceeded => {
                f.write_str("the scope holds as many idempotency records as its quota allows")
            }
            Self::Backend(e) => write!(f, "idempotency store backend error: {e}"),
        }
    }
}

/// How a claim ended when its request ran: what [`Store::complete`] records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The response to replay to retries of the same request.
    Response(StoredResponse),
    /// The request ran (its effects happened) but its response cannot be
    /// replayed: its body failed, or was larger than the record limit. Until
    /// the retention expires, `begin` answers [`Begin::ResponseUnavailable`]
    /// to the same request and [`Begin::KeyReused`] to another (then
    /// [`Begin::Expired`] and [`Begin::KeyReused`] while its tombstone lasts).
    Unavailable,
}

/// A store's durations, measured on its own clock.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::Timings;
///
/// let timings = Timings::new(Duration::from_secs(10)).with_retention(Duration::from_secs(86_400));
/// assert_eq!(timings.lock_timeout, Duration::from_secs(10));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timings {
    /// How long a claim holds its key unless it is extended: the longest a
    /// dead owner blocks its key. The layer extends live claims every
    /// twentieth of it, and a store stall of up to 9/10 of it does not lose them.
    pub lock_timeout: Duration,
    /// How long a completed record is kept, from its completion: for that long
    /// a retry of the same request replays it. The layer advertises it
    /// (`Idempotency-Key-Retention`) on the answers it records and replays;
    /// `None` (for stores that do not say) advertises nothing.
    pub retention: Option<Duration>,
    /// How long a completed record's tombstone (its scope, key and
    /// fingerprint, without the response) outlives its retention: for that
    /// long a retry of the same request is answered [`Begin::Expired`] (the
    /// layer's `410 idempotency_key_expired`) instead of running again.
    /// `None`: no tombstones (or a store that does not say).
    pub tombstone: Option<Duration>,
}

impl Timings {
    /// Claims held for `lock_timeout`; the retention not said.
    pub fn new(lock_timeout: Duration) -> Self {
        Self {
            lock_timeout,
            retention: None,
            tombstone: None,
        }
    }

    /// Completed records kept for `retention`.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Tombstones kept for `tombstone` past the retention.
    pub fn with_tombstone(mut self, tombstone: Duration) -> Self {
        self.tombstone = Some(tombstone);
        self
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Backend(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Atomic storage of idempotency records.
///
/// Every operation is atomic per [`RecordKey`]; `complete` and `release` are
/// fenced by the token returned from `begin`. Lock and retention durations
/// are properties of the store, measured on the store's own clock.
///
/// Each method returns a `Send` future (so the layer's work may run in a task
/// of its own); implement them as `async fn`s, and the compiler checks that
/// their futures are `Send`. To share one store between layers, or keep a
/// handle for its [`Maintenance`], wrap it in an [`Arc`]: `Arc<S>` is a store
/// whenever `S` is. The trait is not object safe (there is no `dyn Store`):
/// [`IdempotencyLayer`](crate::IdempotencyLayer) and the
/// [`Engine`](crate::engine::Engine) hide the store's type themselves, so a
/// store chosen at run time is handed to `IdempotencyLayer::new` in each branch.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_idempotency::engine::{Engine, Identity};
/// use tower_idempotency::store::{Begin, Completion, FencingToken, RecordKey, Timings};
/// use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, fingerprint::RequestFingerprint};
/// use tower_idempotency::{Scope, store::{Store, StoreError}};
///
/// /// A store that counts the requests it decides.
/// struct Counted {
///     inner: MemoryStore,
///     begins: AtomicU64,
/// }
///
/// impl Store for Counted {
///     async fn begin(
///         &self,
///         key: &RecordKey,
///         request: &RequestFingerprint<'_>,
///     ) -> Result<Begin, StoreError> {
///         self.begins.fetch_add(1, Ordering::Relaxed);
///         self.inner.begin(key, request).await
///     }
///
///     async fn complete(
///         &self,
///         key: &RecordKey,
///         token: FencingToken,
///         completion: Completion,
///     ) -> Result<(), StoreError> {
///         self.inner.complete(key, token, completion).await
///     }
///
///     async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
///         self.inner.extend(key, token).await
///     }
///
///     async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
///         self.inner.release(key, token).await
///     }
///
///     async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
///         self.inner.wait(key, timeout).await
///     }
///
///     fn timings(&self) -> Timings {
///         self.inner.timings()
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let counted = Arc::new(Counted { inner: MemoryStore::new(), begins: AtomicU64::new(0) });
/// // One store under a layer and an engine, and a handle kept for its counter.
/// let _layer = IdempotencyLayer::new(counted.clone());
/// let engine = Engine::new(counted.clone());
/// let (scope, key) = (Scope::new("payments"), IdempotencyKey::parse(b"msg-000001").unwrap());
/// let charge = |_| async { Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"charge-17")) };
/// engine.run_bytes(&scope, &key, Identity::Bytes(b"order 42"), charge).await.unwrap();
/// assert_eq!(counted.begins.load(Ordering::Relaxed), 1);
/// # }
/// ```
pub trait Store: Send + Sync + 'static {
    /// Decides a request in one atomic step: claim a free (or expired) key, or
    /// report a replay, a fingerprint mismatch, or a request still in progress.
    ///
    /// A claim persists [`RequestFingerprint::fingerprint`]; later requests match
    /// when their fingerprint equals it. A store that keeps records in this
    /// process may also keep [`RequestFingerprint::exact`] and compare that first:
    /// equal exact digests are equal fingerprints, and the fingerprint of a
    /// byte-identical retry is then never computed.
    ///
    /// A claim says whether it took over ([`Claim`]): when the key's record
    /// is a claim still in progress whose lock ran out, the new claim is a
    /// [`Takeover`] of it (whatever the new request's fingerprint), with that
    /// claim's token, the time it was made on the store's clock, and an
    /// attempt one more than that claim's. Any other free key (no record, a
    /// released claim, a completed record past its retention) is a
    /// [`Claim::first`]: a release ends the count, as the owner ran to an
    /// answer the application chose not to record. The attempt and the
    /// claim's start time must be kept with the claim for this.
    ///
    /// A completed record past its retention leaves a tombstone for the
    /// store's [`tombstone`](Timings::tombstone) window: the same request is
    /// answered [`Begin::Expired`], another [`Begin::KeyReused`], and the key
    /// is free (a [`Claim::first`]) only once the window has passed too.
    fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;

    /// Records how a claimed request ended, if `token` still owns the claim;
    /// otherwise fails with [`StoreError::ClaimLost`] and changes nothing.
    fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extends a claim's lock to its [`lock_timeout`](Timings::lock_timeout)
    /// from now (on the store's clock), if `token` still owns the claim;
    /// otherwise fails with [`StoreError::ClaimLost`] and changes nothing. The
    /// layer calls it while the handler runs, so a healthy slow handler is
    /// never taken over.
    fn extend(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Frees a claimed key so a later request may run, if `token` still owns it.
    /// Releasing a claim that is already gone is not an error.
    fn release(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Waits until the key is no longer in progress (completed, released, or its
    /// lock expired), or until `timeout` elapses. Returns immediately when the key
    /// is not in progress. The caller calls [`begin`](Store::begin) again afterwards.
    fn wait(
        &self,
        key: &RecordKey,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The store's lock timeout and retention.
    fn timings(&self) -> Timings;
}

/// Deleting records, called by the application (a periodic task, an erasure
/// request) rather than by the layer; after tower-sessions' `ExpiredDeletion`.
/// Implemented with `async fn`s, as [`Store`] is.
pub trait Maintenance: Send + Sync + 'static {
    /// Deletes expired records, and reduces completed ones past their
    /// retention to tombstones (see [`Timings::tombstone`]), which it deletes
    /// once they expire in turn; returns how many it deleted or reduced.
    fn purge_expired(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes one batch of expired records, at most `limit` where the store
    /// can bound it (PostgreSQL: one short statement); returns how many were
    /// deleted. Fewer than `limit` means none were left to delete.
    /// [`PurgeTask`](purge::PurgeTask) calls it until then, so that it can
    /// stop between two batches.
    ///
    /// The default calls [`purge_expired`](Self::purge_expired), which
    /// deletes them all (and may return more than `limit`): right for a store
    /// whose purge is cheap or bounded on its own.
    fn purge_expired_batch(
        &self,
        limit: NonZeroU32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let _ = limit;
        self.purge_expired()
    }

    /// Deletes every record of `scope`, completed or in progress (stored
    /// responses may hold personal data: use it when a tenant or user is
    /// erased). Returns how many were deleted. A request of that scope still
    /// running afterwards cannot complete: its claim is gone.
    fn purge_scope(&self, scope: &Scope) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// A store that can run a claimed request's handler inside a transaction of
/// its own, so that the handler's writes and the recorded response commit
/// together or not at all. Used by [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional).
/// Implemented with `async fn`s, as [`Store`] is.
pub trait TransactionalStore: Store {
    /// The open transaction of one claimed request.
    type Transaction: RecordTransaction;

    /// [`Store::begin`], and for a claim, possibly its transaction already
    /// open (a store that can do both in one round trip). A claim without a
    /// transaction is opened with [`open`](Self::open). The default only begins.
    fn begin_in_transaction(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> impl Future<Output = Result<(Begin, Option<Self::Transaction>), StoreError>> + Send {
        async move { Ok((self.begin(key, request).await?, None)) }
    }

    /// Opens the transaction of a claimed request and locks its record under
    /// `token`. A token that no longer owns the record fails with
    /// [`StoreError::ClaimLost`] before the handler runs.
    fn open(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<Self::Transaction, StoreError>> + Send;
}

/// The open transaction of one claimed request.
///
/// Dropped without [`commit`](Self::commit) or [`rollback`](Self::rollback)
/// (a panic, a cancelled handler), it must end the transaction without
/// committing it.
pub trait RecordTransaction: Send + 'static {
    /// Puts the handle the handler writes through into its request extensions.
    fn share(&self, extensions: &mut http::Extensions);

    /// Whether the claim itself was made in this transaction (by
    /// [`TransactionalStore::begin_in_transaction`]), so that ending it without
    /// a commit frees the key and the layer sends no [`Store::release`].
    fn holds_claim(&self) -> bool {
        false
    }

    /// Records `completion` (fenced by the claim's token) and commits it with
    /// everything the handler wrote. On error nothing of it is committed, unless
    /// the connection was lost during the commit itself, when the outcome is
    /// unknown: either both are committed or neither.
    fn commit(self, completion: Completion) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Discards everything the handler wrote.
    fn rollback(self) -> impl Future<Output = ()> + Send;
}

/// Shares one store between layers (or keeps a handle for its maintenance).
/// Each call hands on the shared store's own future.
impl<T: Store + ?Sized> Store for Arc<T> {
    fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        (**self).begin(key, request)
    }

    fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).complete(key, token, completion)
    }

    fn extend(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).extend(key, token)
    }

    fn release(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(key, token)
    }

    fn wait(
        &self,
        key: &RecordKey,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).wait(key, timeout)
    }

    fn timings(&self) -> Timings {
        (**self).timings()
    }
}

impl<T: Maintenance + ?Sized> Maintenance for Arc<T> {
    fn purge_expired(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).purge_expired()
    }

    fn purge_expired_batch(
        &self,
        limit: NonZeroU32,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).purge_expired_batch(limit)
    }

    fn purge_scope(&self, scope: &Scope) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).purge_scope(scope)
    }
}
