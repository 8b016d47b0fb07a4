//! [`PurgeTask`]: the periodic deletion of expired records, ready to spawn;
//! after tower-sessions' `continuously_delete_expired`.
//!
//! ```no_run
//! # async fn run(store: tower_idempotency::MemoryStore) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_idempotency::store::purge::PurgeTask;
//!
//! let purge = PurgeTask::new(store.clone())
//!     .every(Duration::from_secs(300))
//!     .with_jitter(0.2)
//!     .spawn()?;
//! // ... serve until shutdown ...
//! let deleted = purge.shutdown().await; // lets the running batch finish
//! # let _ = deleted; Ok(()) }
//! ```

use super::Maintenance;
use crate::config::ConfigError;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The default period between two passes: five minutes.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(300);
/// The default jitter: each wait is the period ± 10 %.
pub const DEFAULT_JITTER: f64 = 0.1;
/// The default batch: 1 000 records per statement.
pub const DEFAULT_BATCH: NonZeroU32 = match NonZeroU32::new(1000) {
    Some(n) => n,
    None => unreachable!(),
};

/// Deletes a store's expired records periodically, in bounded batches, until
/// it is shut down.
///
/// Each pass calls [`Maintenance::purge_expired_batch`] until a batch comes
/// back short, yielding between batches. Between passes it waits the period,
/// scaled by a random factor in `[1 - jitter, 1 + jitter]`, so that instances
/// started together do not purge in lockstep; the first pass, too, comes
/// after one such wait. A failed batch is logged at `WARN` (the error only,
/// never a key) and the pass ends: the next one retries.
///
/// Every instance may run one: PostgreSQL's batches skip rows another
/// instance's batch holds (`FOR UPDATE SKIP LOCKED`).
#[derive(Debug)]
#[must_use = "a PurgeTask does nothing until it is spawned"]
pub struct PurgeTask<S> {
    store: S,
    period: Duration,
    jitter: f64,
    batch: NonZeroU32,
    seed: Option<u64>,
}

impl<S: Maintenance> PurgeTask<S> {
    /// A task purging `store` (a clone sharing its state, or an `Arc`) every
    /// [`DEFAULT_PERIOD`] ± [`DEFAULT_JITTER`], [`DEFAULT_BATCH`] records at a time.
    pub fn new(store: S) -> Self {
        Self {
            store,
            period: DEFAULT_PERIOD,
            jitter: DEFAULT_JITTER,
            batch: DEFAULT_BATCH,
            seed: None,
        }
    }

    /// The mean wait between two passes; above zero (checked by
    /// [`spawn`](Self::spawn)).
    pub fn every(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// How far each wait may stray from the period, as a fraction of it, from
    /// 0 (none) up to, not including, 1 (checked by [`spawn`](Self::spawn)).
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// The most records one batch deletes, where the store can bound it.
    /// Smaller batches hold their row locks for less time.
    pub fn with_batch_size(mut self, batch: NonZeroU32) -> Self {
        self.batch = batch;
        self
    }

    /// A fixed seed for the jitter, so that a test's waits repeat.
    #[cfg(test)]
    pub(crate) fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the configuration and spawns the task on the current Tokio
    /// runtime (as `tokio::spawn` does, it panics outside one).
    ///
    /// Dropping the handle leaves the task running for the life of the
    /// runtime, as a dropped `JoinHandle` does; [`PurgeHandle::shutdown`]
    /// stops it.
    pub fn spawn(self) -> Result<PurgeHandle, ConfigError> {
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(ConfigError::PurgeJitter);
        }
        let longest = Duration::try_from_secs_f64(self.period.as_secs_f64() * (1.0 + self.jitter));
        if self.period.is_zero() || longest.is_err() {
            return Err(ConfigError::PurgePeriod(self.period));
        }
        let (stop, stopped) = watch::channel(false);
        let deleted = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(self.run(stopped, deleted.clone()));
        Ok(PurgeHandle {
            stop,
            task,
            deleted,
        })
    }

    async fn run(self, mut stopped: watch::Receiver<bool>, deleted: Arc<AtomicU64>) {
        let mut random = XorShift::new(
            self.seed
                .unwrap_or_else(|| u64::from_le_bytes(crate::random::bytes::<8>())),
        );
        loop {
            let wait = jittered(self.period, self.jitter, random.fraction());
            if tokio::time::timeout(wait, stop_requested(&mut stopped))
                .await
                .is_ok()
            {
                return;
            }
            loop {
                // Between batches only: a batch runs to its end, so a stop
                // never leaves one half done.
                if *stopped.borrow() {
                    return;
                }
                match self.store.purge_expired_batch(self.batch).await {
                    Ok(n) => {
                        if n > 0 {
                            deleted.fetch_add(n, Ordering::Relaxed);
                            crate::telemetry::purged(n);
                        }
                        if n < u64::from(self.batch.get()) {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(
                            %error,
                            "purging expired idempotency records failed; the next pass retries"
                        );
                        break;
                    }
                }
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Resolves once a stop is requested; never if the handle was dropped
/// without one (the task then runs for the life of the runtime).
async fn stop_requested(stopped: &mut watch::Receiver<bool>) {
    if stopped.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `period` scaled by `1 - jitter + 2 × jitter × fraction`, `fraction` in `[0, 1)`.
fn jittered(period: Duration, jitter: f64, fraction: f64) -> Duration {
    let factor = 1.0 - jitter + 2.0 * jitter * fraction;
    // In range: `spawn` checked that `period × (1 + jitter)` is a duration.
    Duration::try_from_secs_f64(period.as_secs_f64() * factor).unwrap_or(period)
}

/// The handle of a spawned [`PurgeTask`].
#[derive(Debug)]
pub struct PurgeHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    deleted: Arc<AtomicU64>,
}

impl PurgeHandle {
    /// How many records the task has deleted so far.
    pub fn deleted(&self) -> u64 {
        self.deleted.load(Ordering::Relaxed)
    }

    /// Stops the task: at once while it waits, after the running batch (one
    /// statement, bounded by the store's operation timeout) while it purges.
    /// Returns how many records it deleted in all.
    pub async fn shutdown(self) -> u64 {
        // Errs only when the task has already ended.
        let _ = self.stop.send(true);
        // A panic (of the store's purge) was reported by the panic hook; the
        // count stands either way.
        let _ = self.task.await;
        self.deleted.load(Ordering::Relaxed)
    }

    /// Whether the task has ended (shut down, or its runtime is gone).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// xorshift64*: the jitter needs spread, not secrecy.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        // Zero is its one fixed point.
        Self(seed | 1)
    }

    /// A fraction in `[0, 1)`.
    fn fraction(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::{Fingerprint, RequestFingerprint};
    use crate::store::{Begin, Claim, Completion, RecordKey, Store, StoreError, StoredResponse};
    use crate::{MemoryStore, Scope};
    use bytes::Bytes;
    use http::StatusCode;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    use tokio::sync::Semaphore;
    use tokio::time::{sleep, Instant};

    /// A store whose records expire one second after their completion,
    /// leaving no tombstones: a purge deletes them.
    fn store() -> MemoryStore {
        MemoryStore::builder()
            .with_retention(Duration::from_secs(1))
            .with_tombstone(Duration::ZERO)
            .build()
    }

    async fn record(store: &MemoryStore, key: &str) {
        let fp = RequestFingerprint::from(Fingerprint::from_bytes([7; 32]));
        let key = RecordKey::for_test("s", key);
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&key, &fp).await else {
            panic!("claim");
        };
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from_static(b"done"),
        };
        store
            .complete(&key, token, Completion::Response(response))
            .await
            .unwrap();
    }

    async fn expired_records(store: &MemoryStore, n: usize) {
        for i in 0..n {
            record(store, &format!("key-{i:04}")).await;
        }
        sleep(Duration::from_secs(2)).await;
    }

    /// The gate's permits: one per batch at most, so a test holding them all closes it.
    const GATE: usize = 1 << 20;

    /// Around a store: when each batch began, a gate each batch waits at
    /// (open unless a test closes it), and failures of the first batches.
    #[derive(Clone)]
    struct Watched<S> {
        inner: S,
        calls: Arc<Mutex<Vec<Instant>>>,
        gate: Arc<Semaphore>,
        failures: Arc<AtomicUsize>,
    }

    impl<S> Watched<S> {
        fn new(inner: S) -> Self {
            Self {
                inner,
                calls: Arc::default(),
                gate: Arc::new(Semaphore::new(GATE)),
                failures: Arc::default(),
            }
        }

        fn calls(&self) -> Vec<Instant> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl<S: Maintenance> Maintenance for Watched<S> {
        async fn purge_expired(&self) -> Result<u64, StoreError> {
            self.inner.purge_expired().await
        }

        async fn purge_expired_batch(&self, limit: NonZeroU32) -> Result<u64, StoreError> {
            self.calls.lock().unwrap().push(Instant::now());
            drop(self.gate.acquire().await.unwrap());
            let fail = self
                .failures
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                return Err(StoreError::Backend("the database is down".into()));
            }
            self.inner.purge_expired_batch(limit).await
        }

        async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
            self.inner.purge_scope(scope).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn purges_expired_records_once_a_period_has_passed() {
        let store = store();
        expired_records(&store, 3).await;
        let purge = PurgeTask::new(store.clone())
            .every(Duration::from_secs(60))
            .with_jitter(0.0)
            .spawn()
            .unwrap();
        sleep(Duration::from_secs(59)).await;
        assert_eq!(
            (purge.deleted(), store.len()),
            (0, 3),
            "not before the first wait"
        );
        sleep(Duration::from_secs(2)).await;
        assert_eq!((purge.deleted(), store.len()), (3, 0));
        record(&store, "key-late").await;
        sleep(Duration::from_secs(60)).await;
        assert_eq!(
            (purge.deleted(), store.len()),
            (4, 0),
            "and again each period"
        );
        assert_eq!(purge.shutdown().await, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_stay_within_the_jitter_and_vary() {
        let store = Watched::new(store());
        let (period, jitter) = (Duration::from_secs(100), 0.25);
        let started = Instant::now();
        let purge = PurgeTask::new(store.clone())
            .every(period)
            .with_jitter(jitter)
            .with_seed(0x5eed)
            .spawn()
            .unwrap();
        sleep(period * 60).await;
        purge.shutdown().await;
        let calls = store.calls();
        assert!(calls.len() >= 40, "{} passes", calls.len());
        let mut waits: Vec<Duration> = std::iter::once(calls[0] - started)
            .chain(calls.windows(2).map(|w| w[1] - w[0]))
            .collect();
        // The timer rounds a deadline up to its next millisecond.
        let (low, high) = (period.mul_f64(1.0 - jitter), period.mul_f64(1.0 + jitter));
        for wait in &waits {
            assert!(
                low <= *wait && *wait <= high + Duration::from_millis(1),
                "{wait:?}"
            );
        }
        waits.sort();
        assert!(
            waits[0] < period.mul_f64(0.9) && waits[waits.len() - 1] > period.mul_f64(1.1),
            "spread over the range: {waits:?}"
        );
    }

    #[test]
    fn the_jitter_spans_its_range() {
        let period = Duration::from_secs(10);
        assert_eq!(jittered(period, 0.2, 0.0), Duration::from_secs(8));
        assert_eq!(jittered(period, 0.0, 0.7), period);
        assert!(jittered(period, 0.2, 0.999_999) < Duration::from_secs(12));
        let mut random = XorShift::new(0);
        for _ in 0..10_000 {
            assert!((0.0..1.0).contains(&random.fraction()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_while_waiting_stops_at_once() {
        let purge = PurgeTask::new(store())
            .every(Duration::from_secs(3600))
            .spawn()
            .unwrap();
        sleep(Duration::from_secs(10)).await;
        let asked = Instant::now();
        assert_eq!(purge.shutdown().await, 0);
        assert_eq!(Instant::now(), asked, "without waiting for the next pass");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_during_a_batch_lets_it_finish_and_starts_no_other() {
        let inner = store();
        expired_records(&inner, 5).await;
        let store = Watched::new(inner.clone());
        let held = store.gate.clone().acquire_many_owned(GATE as u32).await;
        // Batches of 2: the default purge deletes all 5 and reports 5, which
        // would call for another batch.
        let purge = PurgeTask::new(store.clone())
            .every(Duration::from_secs(60))
            .with_jitter(0.0)
            .with_batch_size(NonZeroU32::new(2).unwrap())
            .spawn()
            .unwrap();
        sleep(Duration::from_secs(61)).await;
        assert_eq!(store.calls().len(), 1, "a batch is running");
        let stopping = tokio::spawn(purge.shutdown());
        tokio::task::yield_now().await;
        assert!(!stopping.is_finished(), "it waits for the batch");
        drop(held);
        assert_eq!(stopping.await.unwrap(), 5, "the batch finished and counted");
        assert_eq!(
            (store.calls().len(), inner.len()),
            (1, 0),
            "no batch after it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_is_retried_at_the_next() {
        let inner = store();
        expired_records(&inner, 3).await;
        let store = Watched::new(inner.clone());
        store.failures.store(2, Ordering::SeqCst);
        let purge = PurgeTask::new(store.clone())
            .every(Duration::from_secs(60))
            .with_jitter(0.0)
            .spawn()
            .unwrap();
        sleep(Duration::from_secs(121)).await;
        assert_eq!(
            (store.calls().len(), purge.deleted()),
            (2, 0),
            "two failed passes"
        );
        assert!(!purge.is_finished(), "a failure does not end the task");
        sleep(Duration::from_secs(60)).await;
        assert_eq!((purge.deleted(), inner.len()), (3, 0));
        assert_eq!(purge.shutdown().await, 3);
    }

    #[tokio::test]
    async fn a_configuration_that_cannot_run_is_refused() {
        let task = || PurgeTask::new(store());
        let period = |p| task().every(p).spawn().map(drop);
        assert_eq!(
            period(Duration::ZERO),
            Err(ConfigError::PurgePeriod(Duration::ZERO))
        );
        assert_eq!(
            period(Duration::MAX),
            Err(ConfigError::PurgePeriod(Duration::MAX))
        );
        for jitter in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
            assert_eq!(
                task().with_jitter(jitter).spawn().map(drop),
                Err(ConfigError::PurgeJitter),
                "{jitter}"
            );
        }
        let running = task()
            .with_jitter(0.0)
            .every(Duration::from_millis(1))
            .spawn();
        assert_eq!(running.unwrap().shutdown().await, 0);
    }
}
