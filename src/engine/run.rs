//! One call of the engine: decide, then hand the core the operation to run
//! once claimed, and answer.

use super::{Attempt, Engine, EngineError, Identity, OnFailure, Outcome};
use crate::downstream::DownstreamKeys;
use crate::run::claim::run_to_completion;
use crate::run::claimed::{Claimed, Finish, NotRun, Recorded, Work};
use crate::run::decide::{decide, Decision};
use crate::store::{FencingToken, RecordKey, StoreError, StoredResponse};
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
pub struct RunContext {
    attempt: Attempt,
    extensions: http::Extensions,
    downstream_keys: DownstreamKeys,
}

impl RunContext {
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
    fn context(&self, claimed: &Claimed) -> RunContext {
        let record = claimed.record();
        let mut extensions = http::Extensions::new();
        let secret = self.downstream_secret.as_ref();
        claimed.share_phases(&self.store, secret, &mut extensions);
        RunContext {
            attempt: claimed.attempt(),
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
        F: FnOnce(RunContext) -> Fut + Send + 'static,
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
        let claimed = match decided {
            Decision::Claimed(claim, opened) => Claimed::new(record, claim, opened),
            Decision::Replay(stored) => {
                return decode(&stored.body)
                    .map(Outcome::Replayed)
                    .map_err(EngineError::Value)
            }
            Decision::KeyReused => return Ok(Outcome::KeyReused),
            Decision::Unavailable => return Ok(Outcome::Failed),
            Decision::Expired => return Ok(Outcome::Expired),
            Decision::InProgress => return Ok(Outcome::InProgress),
            Decision::QuotaExceeded => return Err(EngineError::Store(StoreError::QuotaExceeded)),
            Decision::StoreFailed(error) => return Err(EngineError::Store(error)),
        };
        let work = Operation {
            context: self.context(&claimed),
            on_failure: self.on_failure,
            operation,
        };
        let claimed = claimed.run(&self.store, self.in_flight.enter(), work);
        // Run to completion whether or not the caller waits for the answer.
        run_to_completion(claimed)
            .await
            .unwrap_or(Err(EngineError::Panicked))
    }
}

/// A claimed operation, to run as [`Work`] of the core.
struct Operation<F> {
    context: RunContext,
    on_failure: OnFailure,
    operation: F,
}

impl<V, F, Fut, E> Work for Operation<F>
where
    V: Send + 'static,
    F: FnOnce(RunContext) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Encoded<V>, Failure<E>>> + Send + 'static,
    E: Send + 'static,
{
    type Output = Result<Outcome<V>, EngineError<E>>;

    fn start(self, finish: Finish) -> impl Future<Output = Self::Output> + Send + 'static {
        let Self {
            mut context,
            on_failure,
            operation,
        } = self;
        finish.share(&mut context.extensions);
        async move {
            match operation(context).await {
                Ok((body, value)) => {
                    let stored = StoredResponse {
                        status: StatusCode::OK,
                        headers: Vec::new(),
                        body,
                    };
                    match finish.record(stored).await {
                        // A failed recording (plain mode) is logged; the
                        // effect happened either way.
                        Recorded::Yes | Recorded::Failed => Ok(Outcome::Executed(value)),
                        Recorded::Unknown(error) => Err(EngineError::OutcomeUnknown(error)),
                    }
                }
                Err(failure) => {
                    // Failures recorded, or a value that could not be
                    // encoded (the operation ran): the key is kept.
                    let keep = matches!(
                        (on_failure, &failure),
                        (OnFailure::Record, _) | (_, Failure::Encode(_))
                    );
                    finish.failed(keep, "the operation failed").await;
                    Err(failure.into())
                }
            }
        }
    }

    fn not_run(self, why: NotRun) -> Self::Output {
        match why {
            // The new owner runs it.
            NotRun::TakenOver => Ok(Outcome::InProgress),
            NotRun::Failed(error) => Err(EngineError::Store(error)),
        }
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
