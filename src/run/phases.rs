//! Recovery points: a claimed run split into phases, each recorded when it
//! finishes, so that a retry of the same request resumes after the last
//! finished phase instead of running the whole handler again.
//!
//! After Brandur Leach's "Implementing Stripe-like Idempotency Keys in
//! Postgres": each phase is an atomic step that also advances the key's
//! recovery point, and a call to another system (the charge) sits in a
//! phase of its own under its own idempotency key. See "Recovery points
//! (phases)" in `docs/idempotency.md`.

use crate::downstream::{DownstreamKey, DownstreamKeys, DownstreamSecret};
use crate::store::erased::{ErasedPhaseStore, SharedStore};
use crate::store::phases::check_name;
use crate::store::{FencingToken, PhaseRecord, RecordKey, RecordedPhases, StoreError};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::OwnedMutexGuard;

/// The phases of one claimed run: each runs once per request, its output
/// recorded as the request's recovery point, and a retry (after the run
/// failed, panicked, or died and its claim was taken over) gets the
/// recorded output of every finished phase without running it again.
///
/// [`IdempotencyLayer::phased`](crate::IdempotencyLayer::phased) puts one
/// in the request extensions of every claimed request (`Extension<Phases>`
/// in axum); an [`Engine::phased`](crate::engine::Engine::phased) operation finds it
/// with [`RunContext::phases`](crate::engine::RunContext::phases). Clones share the run's phases:
/// clones running one phase at once run it once (the others wait for its
/// output), and after a record that failed (its reply may be lost after it
/// committed) the next phase reads the store again rather than trust what
/// this run knew.
///
/// - [`run`](Self::run): a local step, run then recorded. A crash between
///   the two runs it again on the retry, so its writes should be idempotent
///   of themselves (or use `local` on PostgreSQL, feature `postgres`).
/// - [`foreign`](Self::foreign): a call to another system, given a
///   downstream key of its own that is the same on every attempt, so the
///   other system deduplicates a repeat of the call.
/// - `local` (PostgreSQL, feature `postgres`): the step's writes and its recovery
///   point in one transaction: both commit or neither.
///
/// The recorded phases are read from the store on first use (one round
/// trip), never for a run that uses none. A phase's error is returned and
/// records nothing: the retry runs that phase again.
///
/// ```
/// use tower_idempotency::engine::{Engine, Identity, Outcome};
/// use tower_idempotency::{IdempotencyKey, MemoryStore, Scope};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let engine = Engine::phased(MemoryStore::new());
/// let (scope, key) = (Scope::new("shop"), IdempotencyKey::parse(b"order-000042").unwrap());
/// let checkout = |context: tower_idempotency::engine::RunContext| async move {
///     let phases = context.phases().expect("a phased engine");
///     let order: u64 = phases.run("create_order", || async { Ok::<_, String>(42) }).await
///         .map_err(|e| e.to_string())?;
///     let charge: String = phases
///         .foreign("charge", |key| async move { Ok::<_, String>(format!("ch_{}", &key.as_str()[..8])) })
///         .await
///         .map_err(|e| e.to_string())?;
///     Ok::<_, String>(format!("order {order}, {charge}"))
/// };
/// let first = engine.run(&scope, &key, Identity::Bytes(b"cart 7"), checkout).await.unwrap();
/// assert!(matches!(first, Outcome::Executed(ref s) if s.starts_with("order 42, ch_dk1-")));
/// # }
/// ```
#[derive(Clone)]
pub struct Phases {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ErasedPhaseStore>,
    record: RecordKey,
    token: FencingToken,
    keys: DownstreamKeys,
    /// Read from the store on first use, then kept up to date here; dropped
    /// when a record's outcome is unknown (its reply lost), so the next
    /// use reads it again.
    recorded: tokio::sync::Mutex<Option<RecordedPhases>>,
    /// One lock per phase name, held from its check through its run to its
    /// record: clones running the same phase at once run it once.
    running: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl fmt::Debug for Phases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Phases")
            .field("record", &self.inner.record)
            .field("token", &self.inner.token)
            .finish_non_exhaustive()
    }
}

/// Why a phase has no output.
#[derive(Debug)]
#[non_exhaustive]
pub enum PhaseError<E> {
    /// The phase ran and failed: nothing was recorded (and a local phase's
    /// writes were rolled back).
    Phase(E),
    /// The recorded phases could not be read, or the phase's output could
    /// not be recorded (after it ran: the retry runs it again). With
    /// [`StoreError::ClaimLost`] the run lost its claim to a takeover: stop,
    /// its new owner carries on.
    Store(StoreError),
    /// The output could not be encoded, or a recorded one decoded (JSON).
    Value(String),
    /// A local phase on a store that cannot run one in a transaction of its
    /// own: use [`Phases::run`] there.
    Unsupported,
}

impl<E: fmt::Display> fmt::Display for PhaseError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Phase(e) => write!(f, "phase failed: {e}"),
            Self::Store(e) => write!(f, "recovery point: {e}"),
            Self::Value(e) => write!(f, "phase output: {e}"),
            Self::Unsupported => f.write_str("this store runs no local phases in a transaction"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for PhaseError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Phase(e) => Some(e),
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl Phases {
    /// Puts the claim's handle into `extensions` when `store` records
    /// phases; does nothing (and allocates nothing) otherwise.
    pub(crate) fn share(
        store: &SharedStore,
        record: &RecordKey,
        token: FencingToken,
        secret: Option<&DownstreamSecret>,
        extensions: &mut http::Extensions,
    ) {
        let Some(phases) = store.phases() else { return };
        extensions.insert(Phases {
            inner: Arc::new(Inner {
                store: phases.clone(),
                record: record.clone(),
                token,
                keys: DownstreamKeys::derived(record.scope(), record.key(), secret),
                recorded: tokio::sync::Mutex::new(None),
                running: std::sync::Mutex::default(),
            }),
        });
    }

    /// The claim's fencing token: every phase is recorded under it.
    pub fn token(&self) -> FencingToken {
        self.inner.token
    }

    /// The phases the request has recorded so far (read from the store on
    /// first use).
    pub async fn recorded(&self) -> Result<RecordedPhases, StoreError> {
        let mut recorded = self.inner.recorded.lock().await;
        if let Some(known) = &*recorded {
            return Ok(known.clone());
        }
        let inner = &self.inner;
        let read = inner.store.phases(&inner.record, inner.token).await?;
        *recorded = Some(read.clone());
        Ok(read)
    }

    /// The downstream key of foreign phase `name`: what
    /// [`foreign`](Self::foreign) gives it, the same on every attempt
    /// (`DownstreamKeys::key_for("phase:" + name)`).
    pub fn downstream_key(&self, name: &str) -> DownstreamKey {
        self.inner.keys.key_for(&format!("phase:{name}"))
    }

    /// Runs phase `name` once per request: its recorded output if it
    /// finished before, else `phase`'s, recorded before it is returned.
    pub async fn run<T, E, F, Fut>(&self, name: &str, phase: F) -> Result<T, PhaseError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let _running = self.hold(name).await?;
        if let Some(output) = self.done(name).await? {
            return decode(&output);
        }
        let value = phase().await.map_err(PhaseError::Phase)?;
        self.record(name, value).await
    }

    /// [`run`](Self::run) for a call to another system: `phase` gets the
    /// phase's [`downstream_key`](Self::downstream_key) to send as that
    /// call's idempotency key, so a repeat of this phase (its output was not
    /// recorded: a crash right after the call) is a replay there.
    pub async fn foreign<T, E, F, Fut>(&self, name: &str, phase: F) -> Result<T, PhaseError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(DownstreamKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let _running = self.hold(name).await?;
        if let Some(output) = self.done(name).await? {
            return decode(&output);
        }
        let value = phase(self.downstream_key(name))
            .await
            .map_err(PhaseError::Phase)?;
        self.record(name, value).await
    }

    /// Runs phase `name` in a PostgreSQL transaction of its own that also
    /// records its output, fenced by the claim's token: its writes through
    /// the [`TransactionClient`](crate::store::TransactionClient) and its
    /// recovery point commit together or not at all, and a run that lost its
    /// claim (or whose phase was recorded meanwhile) commits none of them.
    /// [`PhaseError::Unsupported`] on other stores.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn local<T, E, F, Fut>(&self, name: &str, phase: F) -> Result<T, PhaseError<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(crate::store::TransactionClient) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let inner = &self.inner;
        let Some(postgres) = inner.store.postgres() else {
            return Err(PhaseError::Unsupported);
        };
        let _running = self.hold(name).await?;
        if let Some(output) = self.done(name).await? {
            return decode(&output);
        }
        let run = |client| async move {
            let value = phase(client).await.map_err(PhaseError::Phase)?;
            encode(&value)
        };
        let local = postgres.local_phase(&inner.record, inner.token, name, run);
        let (_, output) = match local.await {
            Ok(ran) => ran?,
            Err(error) => return Err(self.unknown(error).await),
        };
        self.remember(name, output.clone()).await;
        decode(&output)
    }

    /// Holds phase `name`'s lock (after checking the name) until dropped.
    async fn hold<E>(&self, name: &str) -> Result<OwnedMutexGuard<()>, PhaseError<E>> {
        check_name(name).map_err(PhaseError::Store)?;
        let lock = {
            let mut running = match self.inner.running.lock() {
                Ok(running) => running,
                Err(poisoned) => poisoned.into_inner(),
            };
            running.entry(name.to_owned()).or_default().clone()
        };
        Ok(lock.lock_owned().await)
    }

    /// A record that failed may have committed (its reply lost): the cache
    /// is dropped, so the next phase reads what the store holds.
    async fn unknown<E>(&self, error: StoreError) -> PhaseError<E> {
        *self.inner.recorded.lock().await = None;
        PhaseError::Store(error)
    }

    /// The recorded output of `name`, after checking the name.
    async fn done<E>(&self, name: &str) -> Result<Option<Bytes>, PhaseError<E>> {
        check_name(name).map_err(PhaseError::Store)?;
        let recorded = self.recorded().await.map_err(PhaseError::Store)?;
        Ok(recorded.get(name).cloned())
    }

    async fn record<T, E>(&self, name: &str, value: T) -> Result<T, PhaseError<E>>
    where
        T: Serialize + DeserializeOwned,
    {
        let output = encode(&value)?;
        let inner = &self.inner;
        let recorded = inner
            .store
            .record_phase(&inner.record, inner.token, name, output.clone())
            .await;
        let recorded = match recorded {
            Ok(recorded) => recorded,
            Err(error) => return Err(self.unknown(error).await),
        };
        match recorded {
            PhaseRecord::Recorded => {
                self.remember(name, output).await;
                Ok(value)
            }
            // Recorded meanwhile (a clone of this handle): the first stands.
            PhaseRecord::AlreadyRecorded(first) => {
                self.remember(name, first.clone()).await;
                decode(&first)
            }
        }
    }

    async fn remember(&self, name: &str, output: Bytes) {
        if let Some(recorded) = &mut *self.inner.recorded.lock().await {
            recorded.insert(name, output);
        }
    }
}

fn encode<T: Serialize, E>(value: &T) -> Result<Bytes, PhaseError<E>> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| PhaseError::Value(e.to_string()))
}

fn decode<T: DeserializeOwned, E>(output: &Bytes) -> Result<T, PhaseError<E>> {
    serde_json::from_slice(output).map_err(|e| PhaseError::Value(e.to_string()))
}
