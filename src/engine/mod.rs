//! The run-once engine under [`IdempotencyLayer`](crate::IdempotencyLayer),
//! for work that is not an HTTP request: a queue consumer that gets a message
//! twice, a webhook delivered again, a scheduled job that fires again after a
//! restart.
//!
//! [`Engine::run_bytes`] (and [`Engine::run`] for typed values, recorded as
//! JSON) runs an async operation at most once per `(scope, key)`
//! over any [`Store`], and gives every repeat the recorded result: the same
//! claim, keep-alive, run-to-completion, fencing and (with
//! [`Engine::transactional`]) transaction that the layer uses. The request's
//! identity is the caller's bytes or a JSON document compared in its RFC 8785
//! canonical form, so a redelivered message with reordered fields is the same
//! message, and one with other content under the same key is refused.
//!
//! ```
//! use tower_idempotency::engine::{Engine, Identity, Outcome};
//! use tower_idempotency::{IdempotencyKey, MemoryStore, Scope};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let engine = Engine::new(MemoryStore::new());
//! let (scope, key) = (Scope::new("payments"), IdempotencyKey::parse(b"msg-000001").unwrap());
//! let charge = |_| async { Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"charge-17")) };
//!
//! let message = br#"{"order":42,"amount":1000}"#;
//! let first = engine.run_bytes(&scope, &key, Identity::Json(message), charge).await.unwrap();
//! assert_eq!(first, Outcome::Executed(bytes::Bytes::from_static(b"charge-17")));
//!
//! // Redelivered with its fields in another order: the same message, not run again.
//! let again = br#"{ "amount": 1000, "order": 42 }"#;
//! let second = engine.run_bytes(&scope, &key, Identity::Json(again), charge).await.unwrap();
//! assert_eq!(second, Outcome::Replayed(bytes::Bytes::from_static(b"charge-17")));
//!
//! // Another message under the same key is refused.
//! let other = br#"{"order":43,"amount":1000}"#;
//! let third = engine.run_bytes(&scope, &key, Identity::Json(other), charge).await.unwrap();
//! assert_eq!(third, Outcome::KeyReused);
//! # }
//! ```
//!
//! What each call answers, and a queue consumer whose writes commit together
//! with the record on PostgreSQL, are in `docs/beyond-http.md` in the repository
//! (and `examples/consumer.rs`).

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;
mod run;

pub use self::run::RunContext;
pub use crate::run::attempt::Attempt;
pub use crate::run::phases::{PhaseError, Phases};

use crate::downstream::DownstreamSecret;
use crate::run::in_flight::InFlight;
use crate::store::erased::SharedStore;
use crate::store::{PhaseStore, Store, StoreError, TransactionalStore};
use crate::{IdempotencyKey, Scope};
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// Runs operations at most once per `(scope, key)` over a [`Store`]; see the
/// [module documentation](self).
///
/// Clones share the store and the count of running operations.
#[derive(Clone)]
pub struct Engine {
    store: SharedStore,
    wait_timeout: Duration,
    in_flight: InFlight,
    on_failure: OnFailure,
    downstream_secret: Option<DownstreamSecret>,
}

/// What an operation's error does to its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// The key is freed: a repeat runs the operation again (the default, as
    /// the layer does not record a failed request).
    #[default]
    Release,
    /// The key is completed without a result: a repeat gets
    /// [`Outcome::Failed`] and never runs it again.
    Record,
}

/// What became of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The operation ran in this call and returned this value.
    Executed(T),
    /// The operation ran before, in this or another process: its recorded value.
    Replayed(T),
    /// Another call is running it, and it did not finish within the wait.
    InProgress,
    /// The key was used before with another identity (another message).
    KeyReused,
    /// It ran before and failed, and failures are recorded ([`OnFailure::Record`]).
    Failed,
    /// It ran before, and its record has expired: only its tombstone is left
    /// (the store's [`tombstone`](crate::store::Timings::tombstone) window), so
    /// it is not run again and its value is gone.
    Expired,
}

/// Why a call has no [`Outcome`].
#[derive(Debug)]
#[non_exhaustive]
pub enum EngineError<E> {
    /// The store failed or timed out: the operation did not run (or, if it had
    /// run, its result could not be recorded and the key stays in progress
    /// until its lock runs out).
    Store(StoreError),
    /// The operation ran (in transactional mode), then its transaction's
    /// commit failed or its outcome is unknown: its writes and its record
    /// committed together or not at all. A retry under the same key returns
    /// the recorded outcome, or runs the operation once more on a clean slate.
    OutcomeUnknown(StoreError),
    /// The operation ran and failed.
    Operation(E),
    /// The operation panicked; its key was freed.
    Panicked,
    /// The value could not be encoded or a recorded one decoded (typed runs).
    Value(String),
}

impl<E: fmt::Display> fmt::Display for EngineError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Store(e) => write!(f, "idempotency store: {e}"),
            Self::OutcomeUnknown(e) => write!(f, "ran, but its commit's outcome is unknown: {e}"),
            Self::Operation(e) => write!(f, "operation failed: {e}"),
            Self::Panicked => f.write_str("operation panicked"),
            Self::Value(e) => write!(f, "recorded value: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for EngineError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Store(e) | Self::OutcomeUnknown(e) => Some(e),
            Self::Operation(e) => Some(e),
            _ => None,
        }
    }
}

/// Who a call is: the caller's bytes, or a JSON document compared in its
/// RFC 8785 canonical form (JSON that does not parse is compared as bytes).
#[derive(Clone, Copy, Debug)]
pub enum Identity<'a> {
    /// Compared byte for byte.
    Bytes(&'a [u8]),
    /// Compared as canonical JSON: key order and whitespace do not matter.
    Json(&'a [u8]),
}

impl Engine {
    /// An engine over `store`: waits up to 5 s for a run in progress, frees the
    /// key of a failed operation.
    pub fn new(store: impl Store) -> Self {
        Self::with_store(SharedStore::plain(store))
    }

    /// Like [`new`](Self::new), and each operation runs inside a transaction
    /// of `store` that also records its result, so the operation's writes and
    /// the record commit together or not at all (the "inbox" pattern). With
    /// `PostgresStore` the operation finds a `PostgresTransaction` with
    /// [`RunContext::get`].
    pub fn transactional(store: impl TransactionalStore) -> Self {
        Self::with_store(SharedStore::transactional(store))
    }

    /// Like [`new`](Self::new), and each operation gets [`Phases`]
    /// ([`RunContext::phases`]): recovery points, so that a repeat after a
    /// failed, panicked or dead run resumes after its last finished phase.
    pub fn phased(store: impl PhaseStore) -> Self {
        Self::with_store(SharedStore::phased(store))
    }

    fn with_store(store: SharedStore) -> Self {
        Self {
            store,
            wait_timeout: Duration::from_secs(5),
            in_flight: InFlight::new(),
            on_failure: OnFailure::Release,
            downstream_secret: None,
        }
    }

    /// How long a repeat waits for a run in progress before it answers
    /// [`Outcome::InProgress`] (default 5 s; zero answers at once).
    pub fn with_wait_timeout(mut self, wait_timeout: Duration) -> Self {
        self.wait_timeout = wait_timeout;
        self
    }

    /// What an operation's error does to its key (default: frees it).
    pub fn with_on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Counts this engine's running operations in `in_flight` (shared, for
    /// instance, with an [`IdempotencyLayer`](crate::IdempotencyLayer)).
    pub fn with_in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// Derives each operation's [`RunContext::downstream_keys`] with
    /// HMAC-SHA-256 keyed by `secret` (default: SHA-256, no secret), as
    /// [`IdempotencyLayer::with_downstream_secret`](crate::IdempotencyLayer::with_downstream_secret)
    /// does: give both the same secret for their keys to agree.
    pub fn with_downstream_secret(mut self, secret: DownstreamSecret) -> Self {
        self.downstream_secret = Some(secret);
        self
    }

    /// The operations still running: wait for [`InFlight::idle`] before the
    /// process exits, as an operation once claimed runs to completion.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.clone()
    }
}

// Here rather than in `run.rs`, whose own `impl` the documentation would list
// first: users call `new` and its options, then these.
impl Engine {
    /// Runs `operation` unless `(scope, key)` ran already; its value is the
    /// recorded result every repeat gets.
    ///
    /// Once claimed, the operation runs to completion even if this future is
    /// dropped, its claim is kept alive while it runs, and a dead owner's key
    /// is taken over with a higher token after its lock runs out. A store
    /// failure never runs it. An operation that fails frees the key unless
    /// [`OnFailure::Record`] is set.
    pub async fn run_bytes<F, Fut, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        identity: Identity<'_>,
        operation: F,
    ) -> Result<Outcome<Bytes>, EngineError<E>>
    where
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: Send + 'static,
    {
        let encode = |bytes: &Bytes| Ok(bytes.clone());
        let decode = |bytes: &Bytes| Ok(bytes.clone());
        self.run_encoded(scope, key, identity, operation, encode, decode)
            .await
    }

    /// [`run_bytes`](Self::run_bytes) for a typed value, recorded as JSON.
    pub async fn run<T, F, Fut, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        identity: Identity<'_>,
        operation: F,
    ) -> Result<Outcome<T>, EngineError<E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
        F: FnOnce(RunContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: Send + 'static,
    {
        let encode = |value: &T| {
            serde_json::to_vec(value)
                .map(Bytes::from)
                .map_err(|e| e.to_string())
        };
        let decode = |bytes: &Bytes| serde_json::from_slice(bytes).map_err(|e| e.to_string());
        self.run_encoded(scope, key, identity, operation, encode, decode)
            .await
    }
}

impl RunContext {
    /// The run's [`Phases`], under [`Engine::phased`].
    pub fn phases(&self) -> Option<Phases> {
        self.get::<Phases>()
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("transactional", &self.store.transactions().is_some())
            .field("wait_timeout", &self.wait_timeout)
            .field("on_failure", &self.on_failure)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}
