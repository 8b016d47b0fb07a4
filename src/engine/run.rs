//! One call of the engine: decide, then run a claimed operation to
//! completion under its keep-alive (or inside its transaction), record its
//! result, and answer.

use super::claim::{open_transaction, run_to_completion, ClaimGuard, NotOpened};
use super::decide::{decide, Decision};
use super::{Attempt, Engine, EngineError, Identity, OnFailure, Outcome};
use crate::downstream::DownstreamKeys;
use crate::engine::keep_alive::kept_alive;
use crate::engine::record::Recorder;
use crate::store::erased::{ErasedTransaction, ErasedTransactionalStore};
use crate::store::{Claim, Completion, FencingToken, RecordKey, StoreError, StoredResponse};
use crate::{
    fingerprint::{Fingerprint, RequestFingerprint},
    IdempotencyKey, Scope,
};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode};
use std::future::Future;
use std::panic::AssertUnwindSafe;

/// What a running operation knows about its run.
#[derive(Debug)]
pub struct Context {
    attempt: Attempt,
    extensions: http::Extensions,
    downstream_keys: DownstreamKeys,
}

impl Context {
    /// The claim's fencing token: higher than any earlier owner's, so writes
    /// elsewhere can be fenced with it.
    pub fn token(&self) -> FencingToken {
        self.attempt.token()
    }

    /// Which attempt this run is: whether it took over the claim of an
    /// earlier run that never finished, which may have had effects to
    /// reconcile (see [`Attempt`]).
    pub fn attempt(&self) -> Attempt {
        self.attempt
    }

    /// A handle the store shares with the operation: in transactional mode on
    /// `PostgresStore`, `get::<PostgresTransaction>()`.
    pub fn get<T: Clone + Send + Sync + 'static>(&self) -> Option<T> {
        self.extensions.get::<T>().cloned()
    }

    /// The idempotency keys to send down the chain (a processor's
    /// `Idempotency-Key`): the same on every run of this `(scope, key)`, on
    /// every instance and every store. See [`DownstreamKeys::key_for`].
    pub fn downstream_keys(&self) -> &DownstreamKeys {
        &self.downstream_keys
    }
}

impl Engine {
    fn context(&self, record: &RecordKey, claimed: Claim) -> Context {
        let mut extensions = http::Extensions::new();
        let secret = self.downstream_secret.as_ref();
        super::Phases::share(&self.store, record, claimed.token, secret, &mut extensions);
        Context {
            attempt: claimed.into(),
            extensions,
            downstream_keys: DownstreamKeys::derived(
                record.scope(),
                record.key(),
                self.downstream_secret.as_ref(),
            ),
        }
    }
}

/// An operation's result, encoded for the record and kept for the caller.
type Encoded<V> = (Bytes, V);

/// Why a claimed run has no value.
enum Failure<E> {
    Operation(E),
    Encode(String),
}

/// Identities are hashed as requests of this method to this target, which no
/// HTTP request has (an HTTP path starts with `/`): an operation and a request
/// never share a fingerprint.
fn fingerprint(scope: &Scope, key: &IdempotencyKey, identity: Identity<'_>) -> Fingerprint {
    let method = Method::from_bytes(b"RUN").expect("a valid method");
    let json = HeaderValue::from_static("application/json");
    let (content_type, bytes) = match identity {
        Identity::Bytes(bytes) => (None, bytes),
        Identity::Json(bytes) => (Some(&json), bytes),
    };
    Fingerprint::compute(
        &method,
        "tower-idempotency:operation",
        key,
        scope.as_str(),
        content_type,
        bytes,
    )
}

impl Engine {
    pub(super) async fn run_encoded<V, F, Fut, E>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        identity: Identity<'_>,
        operation: F,
        encode: fn(&V) -> Result<Bytes, String>,
        decode: impl FnOnce(&Bytes) -> Result<V, String>,
    ) -> Result<Outcome<V>, EngineError<E>>
    where
        V: Send + 'static,
        F: FnOnce(Context) -> Fut + Send + 'static,
        Fut: Future<Output = Result<V, E>> + Send + 'static,
        E: Send + 'static,
    {
        // The value, and the bytes it is recorded as.
        let operation = move |context| {
            let run = operation(context);
            async move {
                let value = run.await.map_err(Failure::Operation)?;
                // The operation's effects happened: an encoder that panics (a
                // `Serialize` impl) fails as one that errs, never freeing the key.
                let encoded = std::panic::catch_unwind(AssertUnwindSafe(|| encode(&value)));
                let encoded = encoded.unwrap_or_else(|_| Err("encoding it panicked".to_owned()));
                let bytes = encoded.map_err(Failure::Encode)?;
                Ok((bytes, value))
            }
        };
        let record = RecordKey::new(scope.clone(), key.clone());
        let fingerprint: RequestFingerprint<'static> = fingerprint(scope, key, identity).into();
        let decided = decide(
            self.store.store(),
            self.store.transactions(),
            &record,
            &fingerprint,
            self.wait_timeout,
        )
        .await;
        let (claim, opened) = match decided {
            Decision::Claimed(claim, opened) => (claim, opened),
            Decision::Replay(stored) => {
                return decode(&stored.body)
                    .map(Outcome::Replayed)
                    .map_err(EngineError::Value)
            }
            Decision::Mismatch => return Ok(Outcome::KeyReused),
            Decision::Unavailable => return Ok(Outcome::Failed),
            Decision::InProgress => return Ok(Outcome::InProgress),
            Decision::QuotaExceeded => return Err(EngineError::Store(StoreError::QuotaExceeded)),
            Decision::StoreFailed(error) => return Err(EngineError::Store(error)),
        };
        let running = self.in_flight.enter();
        let claimed = {
            let engine = self.clone();
            async move {
                let answer = match engine.store.transactions() {
                    Some(transactions) => {
                        engine
                            .in_transaction(&**transactions, record, claim, opened, operation)
                            .await
                    }
                    None => {
                        let (store, heartbeat_key) = (engine.store.store().clone(), record.clone());
                        let plain = engine.plain(record, claim, operation);
                        kept_alive(plain, store, heartbeat_key, claim.token).await
                    }
                };
                drop(running);
                answer
            }
        };
        // Run to completion whether or not the caller waits for the answer.
        run_to_completion(Box::pin(claimed))
            .await
            .unwrap_or(Err(EngineError::Panicked))
    }

    async fn plain<V, F, Fut, E>(
        &self,
        record: RecordKey,
        claimed: Claim,
        operation: F,
    ) -> Result<Outcome<V>, EngineError<E>>
    where
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<Encoded<V>, Failure<E>>>,
    {
        let context = self.context(&record, claimed);
        let claim = ClaimGuard::new(self.store.store().clone(), record, claimed.token);
        match operation(context).await {
            Ok((bytes, value)) => {
                let (record, token) = claim.keep();
                let recorder = recorder(self, record, token);
                // A failed recording is logged; the effect happened either way.
                recorder.complete(bytes).await;
                Ok(Outcome::Executed(value))
            }
            Err(failure) => Err(self.failed(claim, failure).await),
        }
    }

    async fn in_transaction<V, F, Fut, E>(
        &self,
        transactions: &dyn ErasedTransactionalStore,
        record: RecordKey,
        claimed: Claim,
        opened: Option<Box<dyn ErasedTransaction>>,
        operation: F,
    ) -> Result<Outcome<V>, EngineError<E>>
    where
        F: FnOnce(Context) -> Fut,
        Fut: Future<Output = Result<Encoded<V>, Failure<E>>>,
    {
        let token = claimed.token;
        let mut context = self.context(&record, claimed);
        let claim = ClaimGuard::new(self.store.store().clone(), record, token);
        let (claim, transaction) = match open_transaction(transactions, claim, token, opened).await
        {
            Ok(opened) => opened,
            // Taken over before the operation ran: the new owner runs it.
            Err(NotOpened::TakenOver) => return Ok(Outcome::InProgress),
            Err(NotOpened::Failed(error)) => return Err(EngineError::Store(error)),
        };
        transaction.share(&mut context.extensions);
        // Until the commit nothing the operation wrote exists for anyone else:
        // a failure, a panic or a dropped future rolls it back and frees the key.
        match operation(context).await {
            Ok((bytes, value)) => {
                let stored = StoredResponse {
                    status: StatusCode::OK,
                    headers: Vec::new(),
                    body: bytes,
                };
                match transaction.commit(Completion::Response(stored)).await {
                    Ok(()) => {
                        let _ = claim.keep();
                        Ok(Outcome::Executed(value))
                    }
                    Err(error) => {
                        claim.release().await;
                        Err(EngineError::OutcomeUnknown(error))
                    }
                }
            }
            Err(failure) => {
                transaction.rollback().await;
                Err(self.failed(claim, failure).await)
            }
        }
    }
}

impl Engine {
    /// Frees the key of a failed operation, or completes it without a value
    /// (failures recorded, or a value that could not be encoded: the
    /// operation ran).
    async fn failed<E>(&self, claim: ClaimGuard, failure: Failure<E>) -> EngineError<E> {
        match (self.on_failure, &failure) {
            (OnFailure::Record, Failure::Operation(_)) | (_, Failure::Encode(_)) => {
                let (record, token) = claim.keep();
                recorder(self, record, token)
                    .unavailable("the operation failed")
                    .await;
            }
            (OnFailure::Release, _) => claim.release().await,
        }
        failure.into()
    }
}

fn recorder(engine: &Engine, record: RecordKey, token: FencingToken) -> Recorder {
    Recorder {
        store: engine.store.store().clone(),
        record,
        token,
        status: StatusCode::OK,
        headers: Vec::new(),
    }
}

impl<E> From<Failure<E>> for EngineError<E> {
    fn from(failure: Failure<E>) -> Self {
        match failure {
            Failure::Operation(e) => EngineError::Operation(e),
            Failure::Encode(e) => EngineError::Value(e),
        }
    }
}
