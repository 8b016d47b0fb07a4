//! A store that panics: a user's own `Store` with a bug, wrapped around a real
//! one. Armed with a call, it panics in the next such call (once, inside the
//! call's future, as an `async fn` with a bug does), and otherwise forwards
//! every call to the store it wraps.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_idempotency::fingerprint::RequestFingerprint;
use tower_idempotency::store::{
    Begin, Completion, FencingToken, Maintenance, RecordKey, Store, StoreError, Timings,
};
use tower_idempotency::Scope;

/// A `Store` call the wrapper can panic in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Begin,
    Complete,
    Extend,
    Release,
    /// A duplicate's wait for the request in progress.
    Wait,
}

pub const CALLS: [Call; 5] = [
    Call::Begin,
    Call::Complete,
    Call::Extend,
    Call::Release,
    Call::Wait,
];

/// `inner`, panicking once in the call it is armed with.
#[derive(Clone, Debug)]
pub struct PanicStore<S> {
    inner: S,
    armed: Arc<Mutex<Option<Call>>>,
    panicked: Arc<Mutex<Vec<Call>>>,
}

impl<S> PanicStore<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            armed: Arc::default(),
            panicked: Arc::default(),
        }
    }

    /// The next `call` panics.
    pub fn arm(&self, call: Call) {
        *self.armed.lock().unwrap() = Some(call);
    }

    /// The calls that panicked so far.
    pub fn panicked(&self) -> Vec<Call> {
        self.panicked.lock().unwrap().clone()
    }

    fn maybe_panic(&self, call: Call) {
        let fire = {
            let mut armed = self.armed.lock().unwrap();
            let fire = *armed == Some(call);
            if fire {
                *armed = None;
                self.panicked.lock().unwrap().push(call);
            }
            fire
        };
        // No lock is held while unwinding: the store stays usable.
        if fire {
            panic!("the store panicked in {call:?} (injected)");
        }
    }
}

impl<S: Store> Store for PanicStore<S> {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        self.maybe_panic(Call::Begin);
        self.inner.begin(key, request).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        self.maybe_panic(Call::Complete);
        self.inner.complete(key, token, completion).await
    }

    fn timings(&self) -> Timings {
        self.inner.timings()
    }

    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.maybe_panic(Call::Extend);
        self.inner.extend(key, token).await
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.maybe_panic(Call::Release);
        self.inner.release(key, token).await
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        self.maybe_panic(Call::Wait);
        self.inner.wait(key, timeout).await
    }
}

impl<S: Maintenance> Maintenance for PanicStore<S> {
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        self.inner.purge_expired().await
    }

    async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        self.inner.purge_scope(scope).await
    }
}
