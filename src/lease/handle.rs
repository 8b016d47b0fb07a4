use crate::lease::store::erased::ErasedJobStore;
use crate::lease::store::{Appended, JobStore, LeaseError, LeaseGrant};
use crate::run::keep_alive::Schedule;
use crate::store::FencingToken;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The right to work on one job: every write is fenced by its token.
///
/// The [`LeaseLayer`](crate::LeaseLayer) puts a `Lease` into the request
/// extensions of a start it created or stole; the handler hands it to whatever
/// does the work. Heartbeat well within the lease length, and again soon after
/// a heartbeat fails ([`spawn_worker`](Self::spawn_worker) does this for you).
#[derive(Clone)]
pub struct Lease {
    store: Arc<dyn ErasedJobStore>,
    grant: LeaseGrant,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("grant", &self.grant).finish()
    }
}

impl Lease {
    /// A lease from a grant, e.g. one [`JobStore::acquire`] returned to an
    /// external worker, on `store` (a store shared with others as an `Arc` or
    /// an [`AnyJobStore`](crate::lease::store::AnyJobStore)).
    pub fn new(store: impl JobStore, grant: LeaseGrant) -> Self {
        Self::on(Arc::new(store), grant)
    }

    /// A lease on the store the layer already holds.
    pub(crate) fn on(store: Arc<dyn ErasedJobStore>, grant: LeaseGrant) -> Self {
        Self { store, grant }
    }

    /// The job this lease is on.
    pub fn job_id(&self) -> &str {
        &self.grant.job_id
    }

    /// The worker identity the lease belongs to.
    pub fn owner(&self) -> &str {
        &self.grant.owner
    }

    /// The fencing token.
    pub fn token(&self) -> FencingToken {
        self.grant.token
    }

    /// The grant itself (job, owner, token).
    pub fn grant(&self) -> &LeaseGrant {
        &self.grant
    }

    /// Extends the lease on the store's clock; `LeaseLost` means stop working.
    pub async fn heartbeat(&self) -> Result<(), LeaseError> {
        self.store.heartbeat(&self.grant).await
    }

    /// Appends chunk `seq` (from 0) to the job's cursor. Repeating a `seq` is a
    /// no-op; skipping one is refused.
    pub async fn append(&self, seq: u64, chunk: impl Into<Bytes>) -> Result<Appended, LeaseError> {
        self.store.append(&self.grant, seq, chunk.into()).await
    }

    /// Stores the result and completes the job; only the current owner of a live
    /// lease succeeds. Returns the artifact id.
    pub async fn finalize(&self, artifact: impl Into<Bytes>) -> Result<String, LeaseError> {
        self.store.finalize(&self.grant, artifact.into()).await
    }

    /// Ends the job as failed with `code`.
    pub async fn fail(&self, code: &str) -> Result<(), LeaseError> {
        self.store.fail(&self.grant, code).await
    }

    /// Runs `work` in the background under this lease, so the job always reaches
    /// an ending: the lease is heartbeated as a running claim is kept alive
    /// (every twentieth of its length, each heartbeat time-boxed to a third of
    /// the lease left and retried at once when it fails, so a store stall of up
    /// to nine tenths of the lease is survived), `Ok(artifact)` finalizes,
    /// `Err(code)` fails the job with that code, a panic fails it with
    /// `worker_panicked`. The work runs in a task of its own, so work blocking
    /// its thread does not stop the heartbeats on a multi-thread runtime. If
    /// the lease is lost (stolen after a stall), the work is cancelled and
    /// nothing is written. A job that already ended is left alone.
    pub fn spawn_worker<F, Fut>(self, work: F) -> JoinHandle<()>
    where
        F: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Bytes, String>> + Send + 'static,
    {
        tokio::spawn(async move {
            // The first heartbeat marks the job running, or tells us it ended or moved on.
            let sent = Instant::now();
            if self.heartbeat().await.is_err() {
                return;
            }
            let mut schedule = Schedule::new(self.store.lease_duration(), sent);
            let mut task = tokio::spawn(work(self.clone()));
            let outcome = loop {
                if let Ok(joined) = tokio::time::timeout_at(schedule.due(), &mut task).await {
                    break joined;
                }
                let sent = Instant::now();
                if let Some(late) = schedule.late(sent) {
                    tracing::warn!(
                        ?late,
                        "a lease's heartbeat ran late: its runtime thread was blocked"
                    );
                }
                let beat = tokio::time::timeout(schedule.time_box(sent), self.heartbeat());
                match beat.await {
                    Ok(Ok(())) => schedule.succeeded(sent),
                    Ok(Err(LeaseError::LeaseLost | LeaseError::UnknownJob)) => {
                        task.abort();
                        return;
                    }
                    // A store hiccup or a stall: tried again at once.
                    Ok(Err(_)) | Err(_) => schedule.failed(sent, Instant::now()),
                }
            };
            // Writes below are fenced; a refusal means someone else owns the job now.
            let _ = match outcome {
                Ok(Ok(artifact)) => self.finalize(artifact).await.map(drop),
                Ok(Err(code)) => self.fail(&code).await,
                Err(_panicked) => self.fail("worker_panicked").await,
            };
        })
    }
}
