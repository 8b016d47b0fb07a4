//! The store traits behind `dyn`, for the layer and the engine, which hold a
//! store whatever its type.
//!
//! [`Store`]'s methods return `impl Future`, which a trait object cannot name.
//! These traits mirror them with boxed futures (one box per call) and are
//! implemented for every store, so `Arc<dyn ErasedStore>` is what
//! `Arc<dyn Store>` would be.

use super::{
    Begin, Completion, FencingToken, PhaseRecord, PhaseStore, RecordKey, RecordTransaction,
    RecordedPhases, Store, StoreError, Timings, TransactionalStore,
};
use crate::fingerprint::RequestFingerprint;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A store method's future, boxed.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// `call`, boxed, with a panic inside any of its polls answered as a backend
/// error. Every store call of the layer and the engine passes through here,
/// so a store that panics (a bug in the application's own store, a driver's
/// assertion) is a failing store — refused or retried by the same paths as
/// an outage — never a panic in the middle of a claimed run, where it would
/// leave a kept claim that nothing completes.
fn caught<'a, T: 'a>(
    method: &'static str,
    call: impl Future<Output = Result<T, StoreError>> + Send + 'a,
) -> BoxFuture<'a, Result<T, StoreError>> {
    // One box, as the call alone would take.
    Box::pin(catch(method, call))
}

/// `call` with its panics caught, unboxed (for a call inside another future).
/// With feature `metrics`, its duration is recorded by operation when it ends.
fn catch<F>(method: &'static str, call: F) -> Caught<F> {
    Caught {
        call,
        method,
        done: false,
        started: started(),
    }
}

/// When a call began, for its duration: only read when `metrics` records it.
#[cfg(feature = "metrics")]
type Started = std::time::Instant;
#[cfg(not(feature = "metrics"))]
type Started = ();

fn started() -> Started {
    #[cfg(feature = "metrics")]
    return std::time::Instant::now();
}

pin_project_lite::pin_project! {
    /// A store call whose panics are its errors.
    struct Caught<F> {
        #[pin]
        call: F,
        method: &'static str,
        done: bool,
        started: Started,
    }
}

impl<T, F: Future<Output = Result<T, StoreError>>> Future for Caught<F> {
    type Output = Result<T, StoreError>;

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        if *this.done {
            return std::task::Poll::Ready(Err(panicked(this.method)));
        }
        let call = this.call;
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.poll(cx)));
        let polled = polled.unwrap_or_else(|_| {
            // The call is not polled again: its state is unknown.
            *this.done = true;
            std::task::Poll::Ready(Err(panicked(this.method)))
        });
        #[cfg(feature = "metrics")]
        if polled.is_ready() {
            crate::telemetry::gauges::store_call(this.method, this.started.elapsed());
        }
        polled
    }
}

fn panicked(method: &'static str) -> StoreError {
    tracing::error!(
        method,
        "the idempotency store panicked; answered as a store error"
    );
    StoreError::Backend(format!("the store panicked in {method}").into())
}

/// [`Store`], object safe.
pub(crate) trait ErasedStore: Send + Sync + 'static {
    fn begin<'a>(
        &'a self,
        key: &'a RecordKey,
        request: &'a RequestFingerprint<'_>,
    ) -> BoxFuture<'a, Result<Begin, StoreError>>;

    fn complete<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    fn extend<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    fn release<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    fn wait<'a>(
        &'a self,
        key: &'a RecordKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    fn timings(&self) -> Timings;
}

impl<S: Store> ErasedStore for S {
    fn begin<'a>(
        &'a self,
        key: &'a RecordKey,
        request: &'a RequestFingerprint<'_>,
    ) -> BoxFuture<'a, Result<Begin, StoreError>> {
        caught("begin", Store::begin(self, key, request))
    }

    fn complete<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        caught("complete", Store::complete(self, key, token, completion))
    }

    fn extend<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        caught("extend", Store::extend(self, key, token))
    }

    fn release<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        caught("release", Store::release(self, key, token))
    }

    fn wait<'a>(
        &'a self,
        key: &'a RecordKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let call = Store::wait(self, key, timeout);
        Box::pin(async move {
            // Counted while it waits, however the wait ends (a drop included).
            let _waiting = Waiting::new();
            catch("wait", call).await
        })
    }

    fn timings(&self) -> Timings {
        Store::timings(self)
    }
}

/// A duplicate waiting for a request in progress, counted by the
/// `tower_idempotency_waiting_duplicates` gauge until dropped.
struct Waiting;

impl Waiting {
    fn new() -> Self {
        crate::telemetry::gauges::waiting_duplicates(1.0);
        Self
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        crate::telemetry::gauges::waiting_duplicates(-1.0);
    }
}

/// What `begin_in_transaction` answers: a claim may come with its transaction.
type Begun = (Begin, Option<Box<dyn ErasedTransaction>>);

/// [`TransactionalStore`], object safe: its transactions are boxed too.
pub(crate) trait ErasedTransactionalStore: ErasedStore {
    fn begin_in_transaction<'a>(
        &'a self,
        key: &'a RecordKey,
        request: &'a RequestFingerprint<'_>,
    ) -> BoxFuture<'a, Result<Begun, StoreError>>;

    fn open<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Box<dyn ErasedTransaction>, StoreError>>;
}

impl<S: TransactionalStore> ErasedTransactionalStore for S {
    fn begin_in_transaction<'a>(
        &'a self,
        key: &'a RecordKey,
        request: &'a RequestFingerprint<'_>,
    ) -> BoxFuture<'a, Result<Begun, StoreError>> {
        let call = TransactionalStore::begin_in_transaction(self, key, request);
        Box::pin(async move {
            let (begun, opened) = catch("begin_in_transaction", call).await?;
            Ok((begun, opened.map(erase_transaction)))
        })
    }

    fn open<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<Box<dyn ErasedTransaction>, StoreError>> {
        let call = TransactionalStore::open(self, key, token);
        Box::pin(async move {
            let opened = catch("open", call).await?;
            Ok(erase_transaction(opened))
        })
    }
}

fn erase_transaction(transaction: impl RecordTransaction) -> Box<dyn ErasedTransaction> {
    Box::new(transaction)
}

/// [`RecordTransaction`], object safe.
pub(crate) trait ErasedTransaction: Send {
    fn share(&self, extensions: &mut http::Extensions);

    fn holds_claim(&self) -> bool;

    fn commit(
        self: Box<Self>,
        completion: Completion,
    ) -> BoxFuture<'static, Result<(), StoreError>>;

    fn rollback(self: Box<Self>) -> BoxFuture<'static, ()>;
}

impl<T: RecordTransaction> ErasedTransaction for T {
    fn share(&self, extensions: &mut http::Extensions) {
        RecordTransaction::share(self, extensions)
    }

    fn holds_claim(&self) -> bool {
        RecordTransaction::holds_claim(self)
    }

    fn commit(
        self: Box<Self>,
        completion: Completion,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        // A commit that panicked may have committed: the error it becomes
        // is answered as an unknown outcome, as a commit that failed is.
        caught("commit", RecordTransaction::commit(*self, completion))
    }

    fn rollback(self: Box<Self>) -> BoxFuture<'static, ()> {
        let rollback = RecordTransaction::rollback(*self);
        Box::pin(async move {
            // Nothing to answer: a rollback that panicked ends the
            // transaction as its drop does.
            let _ = catch("rollback", async move {
                rollback.await;
                Ok(())
            })
            .await;
        })
    }
}

/// [`PhaseStore`], object safe.
pub(crate) trait ErasedPhaseStore: Send + Sync + 'static {
    fn phases<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<RecordedPhases, StoreError>>;

    fn record_phase<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
        phase: &'a str,
        output: Bytes,
    ) -> BoxFuture<'a, Result<PhaseRecord, StoreError>>;

    /// The store as `PostgresStore`, whose local phases run in their own
    /// transaction (a store held in an `Arc` included).
    #[cfg(feature = "postgres")]
    fn postgres(&self) -> Option<&super::postgres::PostgresStore>;
}

impl<S: PhaseStore> ErasedPhaseStore for S {
    fn phases<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
    ) -> BoxFuture<'a, Result<RecordedPhases, StoreError>> {
        caught("phases", PhaseStore::phases(self, key, token))
    }

    fn record_phase<'a>(
        &'a self,
        key: &'a RecordKey,
        token: FencingToken,
        phase: &'a str,
        output: Bytes,
    ) -> BoxFuture<'a, Result<PhaseRecord, StoreError>> {
        caught(
            "record_phase",
            PhaseStore::record_phase(self, key, token, phase, output),
        )
    }

    #[cfg(feature = "postgres")]
    fn postgres(&self) -> Option<&super::postgres::PostgresStore> {
        use super::postgres::PostgresStore;
        let any: &dyn std::any::Any = self;
        any.downcast_ref::<PostgresStore>()
            .or_else(|| any.downcast_ref::<Arc<PostgresStore>>().map(|s| &**s))
    }
}

/// The store a layer or an engine runs on: one value, so that the
/// transactional view is the same store by construction.
#[derive(Clone)]
pub(crate) struct SharedStore {
    store: Arc<dyn ErasedStore>,
    /// Set for transactional mode: the same store, able to open transactions.
    transactional: Option<Arc<dyn ErasedTransactionalStore>>,
    /// Set when claimed runs get a `Phases` handle: the same store.
    phases: Option<Arc<dyn ErasedPhaseStore>>,
}

impl SharedStore {
    /// A store whose handlers commit their own writes.
    pub(crate) fn plain(store: impl Store) -> Self {
        Self {
            store: Arc::new(store),
            transactional: None,
            phases: None,
        }
    }

    /// A store whose handlers commit their own writes and record recovery
    /// points of their phases.
    pub(crate) fn phased(store: impl PhaseStore) -> Self {
        let store = Arc::new(store);
        Self {
            store: store.clone(),
            transactional: None,
            phases: Some(store),
        }
    }

    /// A store that runs each claimed handler in a transaction of its own.
    pub(crate) fn transactional(store: impl TransactionalStore) -> Self {
        let store: Arc<dyn ErasedTransactionalStore> = Arc::new(store);
        Self {
            store: store.clone(),
            transactional: Some(store),
            phases: None,
        }
    }

    /// The store, for claims, completions and keep-alives.
    pub(crate) fn store(&self) -> &Arc<dyn ErasedStore> {
        &self.store
    }

    /// The same store when claimed runs record their phases.
    pub(crate) fn phases(&self) -> Option<&Arc<dyn ErasedPhaseStore>> {
        self.phases.as_ref()
    }

    /// The same store when it runs handlers in transactions.
    pub(crate) fn transactions(&self) -> Option<&Arc<dyn ErasedTransactionalStore>> {
        self.transactional.as_ref()
    }
}
