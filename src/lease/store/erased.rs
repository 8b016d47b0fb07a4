//! The job store traits behind `dyn`: what a [`Lease`](crate::Lease) and the
//! lease layer hold whatever the store's type, and [`AnyJobStore`] for
//! applications that pick their store at run time.
//!
//! [`JobStore`]'s methods return `impl Future`, which a trait object cannot
//! name. These traits mirror them with boxed futures (one box per call) and
//! are implemented for every job store.

use super::{
    Appended, ArtifactLookup, BudgetPeriod, Chunk, Job, JobMaintenance, JobReader, JobStore,
    JobStoreError, LeaseError, LeaseGrant, StartJob, StartOutcome,
};
use crate::store::erased::BoxFuture;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// [`JobStore`], object safe.
pub(crate) trait ErasedJobStore: Send + Sync + 'static {
    fn lease_duration(&self) -> Duration;

    fn start<'a>(
        &'a self,
        request: &'a StartJob<'_>,
    ) -> BoxFuture<'a, Result<StartOutcome, JobStoreError>>;

    fn acquire<'a>(
        &'a self,
        job_id: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, JobStoreError>>;

    fn heartbeat<'a>(&'a self, lease: &'a LeaseGrant) -> BoxFuture<'a, Result<(), LeaseError>>;

    fn append<'a>(
        &'a self,
        lease: &'a LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> BoxFuture<'a, Result<Appended, LeaseError>>;

    fn finalize<'a>(
        &'a self,
        lease: &'a LeaseGrant,
        artifact: Bytes,
    ) -> BoxFuture<'a, Result<String, LeaseError>>;

    fn fail<'a>(
        &'a self,
        lease: &'a LeaseGrant,
        code: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;
}

impl<S: JobStore> ErasedJobStore for S {
    fn lease_duration(&self) -> Duration {
        JobStore::lease_duration(self)
    }

    fn start<'a>(
        &'a self,
        request: &'a StartJob<'_>,
    ) -> BoxFuture<'a, Result<StartOutcome, JobStoreError>> {
        Box::pin(JobStore::start(self, request))
    }

    fn acquire<'a>(
        &'a self,
        job_id: &'a str,
        owner: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseGrant>, JobStoreError>> {
        Box::pin(JobStore::acquire(self, job_id, owner))
    }

    fn heartbeat<'a>(&'a self, lease: &'a LeaseGrant) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(JobStore::heartbeat(self, lease))
    }

    fn append<'a>(
        &'a self,
        lease: &'a LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> BoxFuture<'a, Result<Appended, LeaseError>> {
        Box::pin(JobStore::append(self, lease, seq, chunk))
    }

    fn finalize<'a>(
        &'a self,
        lease: &'a LeaseGrant,
        artifact: Bytes,
    ) -> BoxFuture<'a, Result<String, LeaseError>> {
        Box::pin(JobStore::finalize(self, lease, artifact))
    }

    fn fail<'a>(
        &'a self,
        lease: &'a LeaseGrant,
        code: &'a str,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(JobStore::fail(self, lease, code))
    }
}

/// [`JobReader`], object safe.
trait ErasedJobReader: Send + Sync + 'static {
    fn job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Job>, JobStoreError>>;

    fn chunks<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
        from_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<Chunk>>, JobStoreError>>;

    fn artifact<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<ArtifactLookup, JobStoreError>>;
}

impl<S: JobReader> ErasedJobReader for S {
    fn job<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Job>, JobStoreError>> {
        Box::pin(JobReader::job(self, tenant, job_id))
    }

    fn chunks<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
        from_seq: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<Chunk>>, JobStoreError>> {
        Box::pin(JobReader::chunks(self, tenant, job_id, from_seq))
    }

    fn artifact<'a>(
        &'a self,
        tenant: &'a str,
        job_id: &'a str,
    ) -> BoxFuture<'a, Result<ArtifactLookup, JobStoreError>> {
        Box::pin(JobReader::artifact(self, tenant, job_id))
    }
}

/// [`JobMaintenance`], object safe.
trait ErasedJobMaintenance: Send + Sync + 'static {
    fn sweep_stale(&self) -> BoxFuture<'_, Result<u64, JobStoreError>>;

    fn reset_budget<'a>(
        &'a self,
        tenant: &'a str,
        period: BudgetPeriod,
    ) -> BoxFuture<'a, Result<u64, JobStoreError>>;

    fn purge_finished(&self, older_than: Duration) -> BoxFuture<'_, Result<u64, JobStoreError>>;

    fn purge_tenant<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, JobStoreError>>;
}

impl<S: JobMaintenance> ErasedJobMaintenance for S {
    fn sweep_stale(&self) -> BoxFuture<'_, Result<u64, JobStoreError>> {
        Box::pin(JobMaintenance::sweep_stale(self))
    }

    fn reset_budget<'a>(
        &'a self,
        tenant: &'a str,
        period: BudgetPeriod,
    ) -> BoxFuture<'a, Result<u64, JobStoreError>> {
        Box::pin(JobMaintenance::reset_budget(self, tenant, period))
    }

    fn purge_finished(&self, older_than: Duration) -> BoxFuture<'_, Result<u64, JobStoreError>> {
        Box::pin(JobMaintenance::purge_finished(self, older_than))
    }

    fn purge_tenant<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, JobStoreError>> {
        Box::pin(JobMaintenance::purge_tenant(self, tenant))
    }
}

/// All three, as one trait object.
trait ErasedJobs: ErasedJobStore + ErasedJobReader + ErasedJobMaintenance {}

impl<S: ErasedJobStore + ErasedJobReader + ErasedJobMaintenance> ErasedJobs for S {}

/// A job store whose type is chosen at run time (the in-memory store in tests,
/// PostgreSQL in production): any store that implements [`JobStore`],
/// [`JobReader`] and [`JobMaintenance`], behind one type that implements them
/// too. Clones share the store.
///
/// Each call boxes the store's future, as `Box<dyn Trait>` would. A store
/// whose type is known needs none of this: pass it (or an `Arc` of it) as it is.
///
/// ```
/// use tower_idempotency::lease::store::{AnyJobStore, JobReader, MemoryJobStore};
/// use tower_idempotency::{LeaseLayer, lease::JsonJobKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Or a `PostgresJobStore`, chosen at start-up: the rest of the app is the same.
/// let jobs = AnyJobStore::new(MemoryJobStore::new());
/// let _starts = LeaseLayer::new(jobs.clone(), "report".parse()?, JsonJobKey::new(["period"]));
/// assert_eq!(jobs.job("acme", "no-such-job").await?, None);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AnyJobStore(Arc<dyn ErasedJobs>);

impl AnyJobStore {
    /// `store` behind the erased type.
    pub fn new(store: impl JobStore + JobReader + JobMaintenance) -> Self {
        Self(Arc::new(store))
    }
}

impl std::fmt::Debug for AnyJobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyJobStore")
            .field("lease_duration", &self.0.lease_duration())
            .finish_non_exhaustive()
    }
}

impl JobStore for AnyJobStore {
    fn lease_duration(&self) -> Duration {
        ErasedJobStore::lease_duration(&*self.0)
    }

    async fn start(&self, request: &StartJob<'_>) -> Result<StartOutcome, JobStoreError> {
        ErasedJobStore::start(&*self.0, request).await
    }

    async fn acquire(
        &self,
        job_id: &str,
        owner: &str,
    ) -> Result<Option<LeaseGrant>, JobStoreError> {
        ErasedJobStore::acquire(&*self.0, job_id, owner).await
    }

    async fn heartbeat(&self, lease: &LeaseGrant) -> Result<(), LeaseError> {
        ErasedJobStore::heartbeat(&*self.0, lease).await
    }

    async fn append(
        &self,
        lease: &LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> Result<Appended, LeaseError> {
        ErasedJobStore::append(&*self.0, lease, seq, chunk).await
    }

    async fn finalize(&self, lease: &LeaseGrant, artifact: Bytes) -> Result<String, LeaseError> {
        ErasedJobStore::finalize(&*self.0, lease, artifact).await
    }

    async fn fail(&self, lease: &LeaseGrant, code: &str) -> Result<(), LeaseError> {
        ErasedJobStore::fail(&*self.0, lease, code).await
    }
}

impl JobReader for AnyJobStore {
    async fn job(&self, tenant: &str, job_id: &str) -> Result<Option<Job>, JobStoreError> {
        ErasedJobReader::job(&*self.0, tenant, job_id).await
    }

    async fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> Result<Option<Vec<Chunk>>, JobStoreError> {
        ErasedJobReader::chunks(&*self.0, tenant, job_id, from_seq).await
    }

    async fn artifact(&self, tenant: &str, job_id: &str) -> Result<ArtifactLookup, JobStoreError> {
        ErasedJobReader::artifact(&*self.0, tenant, job_id).await
    }
}

impl JobMaintenance for AnyJobStore {
    async fn sweep_stale(&self) -> Result<u64, JobStoreError> {
        ErasedJobMaintenance::sweep_stale(&*self.0).await
    }

    async fn reset_budget(&self, tenant: &str, period: BudgetPeriod) -> Result<u64, JobStoreError> {
        ErasedJobMaintenance::reset_budget(&*self.0, tenant, period).await
    }

    async fn purge_finished(&self, older_than: Duration) -> Result<u64, JobStoreError> {
        ErasedJobMaintenance::purge_finished(&*self.0, older_than).await
    }

    async fn purge_tenant(&self, tenant: &str) -> Result<u64, JobStoreError> {
        ErasedJobMaintenance::purge_tenant(&*self.0, tenant).await
    }
}
