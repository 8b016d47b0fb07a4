//! One run's phases: a phase runs once even when clones of the run's
//! `Phases` run it at once, and a record whose reply was lost is not run
//! again by the handler's retry within the run.

use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::engine::{Engine, Identity, Outcome, PhaseError, RunContext};
use tower_idempotency::fingerprint::RequestFingerprint;
use tower_idempotency::store::{
    Begin, Completion, FencingToken, PhaseRecord, PhaseStore, RecordKey, RecordedPhases, Store,
    StoreError, Timings,
};
use tower_idempotency::{IdempotencyKey, MemoryStore, Scope};

fn key() -> (Scope, IdempotencyKey) {
    (
        Scope::new("shop"),
        IdempotencyKey::parse(b"order-within-a-run").unwrap(),
    )
}

/// Counts each run of the charge; returns its id.
async fn charge(charges: &AtomicUsize) -> Result<String, String> {
    let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(format!("ch_{n}"))
}

/// Two clones of the run's handle run phase `charge` at once: it runs
/// once, and both get its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_running_one_phase_at_once_run_it_once() {
    let engine = Engine::phased(MemoryStore::new());
    let charges = Arc::new(AtomicUsize::new(0));
    let (scope, key) = key();
    let counted = charges.clone();
    let run = move |context: RunContext| async move {
        let phases = context.phases().expect("a phased engine");
        let other = phases.clone();
        let (a, b) = tokio::join!(
            phases.run("charge", || charge(&counted)),
            other.run("charge", || charge(&counted)),
        );
        let (a, b): (String, String) =
            (a.map_err(|e| e.to_string())?, b.map_err(|e| e.to_string())?);
        Ok::<_, String>(format!("{a} {b}"))
    };
    let outcome = engine
        .run(&scope, &key, Identity::Bytes(b"cart"), run)
        .await;
    assert_eq!(outcome.unwrap(), Outcome::Executed("ch_1 ch_1".into()));
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

/// A `MemoryStore` whose first phase record commits and then answers an
/// error, as a record whose reply timed out.
#[derive(Clone)]
struct LostReply {
    store: MemoryStore,
    lose: Arc<AtomicBool>,
}

impl Store for LostReply {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        self.store.begin(key, request).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        self.store.complete(key, token, completion).await
    }

    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.store.extend(key, token).await
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.store.release(key, token).await
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        self.store.wait(key, timeout).await
    }

    fn timings(&self) -> Timings {
        self.store.timings()
    }
}

impl PhaseStore for LostReply {
    async fn phases(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<RecordedPhases, StoreError> {
        self.store.phases(key, token).await
    }

    async fn record_phase(
        &self,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        output: Bytes,
    ) -> Result<PhaseRecord, StoreError> {
        let recorded = self.store.record_phase(key, token, phase, output).await?;
        match self.lose.swap(false, Ordering::SeqCst) {
            true => Err(StoreError::Backend("the reply timed out".into())),
            false => Ok(recorded),
        }
    }
}

/// The charge's record commits but its reply is lost: the handler retries
/// the phase within the run, which reads the store again and gets the
/// recorded charge instead of charging again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_reply_was_lost_is_not_run_again_within_the_run() {
    let store = LostReply {
        store: MemoryStore::new(),
        lose: Arc::new(AtomicBool::new(true)),
    };
    let engine = Engine::phased(store);
    let charges = Arc::new(AtomicUsize::new(0));
    let (scope, key) = key();
    let counted = charges.clone();
    let run = move |context: RunContext| async move {
        let phases = context.phases().expect("a phased engine");
        // Read before the charge: the cache holds "not recorded".
        phases.recorded().await.map_err(|e| e.to_string())?;
        let lost: Result<String, _> = phases.run("charge", || charge(&counted)).await;
        assert!(matches!(lost, Err(PhaseError::Store(_))), "{lost:?}");
        let again: String = phases
            .run("charge", || charge(&counted))
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(again)
    };
    let outcome = engine
        .run(&scope, &key, Identity::Bytes(b"cart"), run)
        .await;
    assert_eq!(outcome.unwrap(), Outcome::Executed("ch_1".into()));
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}
