//! Storage for natural-key jobs and their leases, used by [`LeaseLayer`](crate::LeaseLayer).

#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;
pub(crate) mod erased;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;

pub use erased::AnyJobStore;
pub use memory::{MemoryJobStore, MemoryJobStoreBuilder};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PostgresJobStore, PostgresJobStoreBuilder};

use crate::body::BoxError;
use crate::store::FencingToken;
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;
use std::sync::Arc;

/// Where a job is in its life. `Complete` and `Failed` are endings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobStatus {
    /// Created (or stolen) with a lease; no worker has picked it up yet.
    Queued,
    /// A worker holds the lease and is producing the result.
    Running,
    /// Finalized: the artifact is stored.
    Complete,
    /// Ended without a result: a worker error or panic, or a stale lease swept.
    Failed,
}

impl JobStatus {
    /// The status as stored and serialised: `queued`, `running`, `complete`, `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Complete => "complete",
            Self::Failed => "failed",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s output.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "complete" => Self::Complete,
            "failed" => Self::Failed,
            _ => return None,
        })
    }

    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job as a reader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The job's id, stable across joins and steals.
    pub id: String,
    /// The tenant that owns the job.
    pub tenant: String,
    /// The kind of job (one per [`LeaseLayer`](crate::LeaseLayer)), e.g. `health_report`.
    pub kind: String,
    /// The natural key within the tenant and kind, e.g. `2026-08`.
    pub key: String,
    /// Where the job is in its life.
    pub status: JobStatus,
    /// The identity of the worker holding the lease, if any.
    pub lease_owner: Option<String>,
    /// Which run of the job this is: 1 at creation, one more at every takeover
    /// of an expired lease. The cursor belongs to the current attempt: a reader
    /// that sees the attempt change must read the cursor again from 0.
    pub attempt: u64,
    /// Chunks appended so far (the next expected sequence number).
    pub next_seq: u64,
    /// Bytes appended so far.
    pub cursor_len: u64,
    /// The artifact id once complete.
    pub artifact_id: Option<String>,
    /// The units of budget this job reserved when it was accepted (1 unless the
    /// layer estimates a cost): kept once it completes, returned if it fails.
    pub cost: u64,
    /// Why the job failed.
    pub error_code: Option<String>,
}

/// A lease granted to whoever runs the job: only this token may write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The job the lease is on.
    pub job_id: String,
    /// The worker identity the lease was granted to.
    pub owner: String,
    /// Fences every write: a steal issues a higher token.
    pub token: FencingToken,
}

/// A budget: at most `allowance` units per tenant per period, where each job
/// reserves its cost when it is accepted (1 per job unless the layer
/// estimates costs with `LeaseLayer::with_cost`, e.g. model tokens).
///
/// Completed jobs and in-flight jobs under a live lease count; failed jobs,
/// stale in-flight jobs, and jobs an operator reset do not: the allowance
/// counts delivered work.
///
/// A job whose lease expired stops counting at once (other starts may take
/// its place), so whatever revives it reserves its cost again, in the current
/// period, under the same lock as the tenant's starts: a start stealing it
/// checks the start's budget, and [`JobStore::acquire`] the budget the job was
/// started under, refusing the job while the allowance has no room. Admitting
/// and reviving are one decision, so no period ever delivers more than its
/// allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Units allowed per period: never zero, which would refuse every start.
    pub allowance: NonZeroU64,
    /// The period, in UTC on the store's clock.
    pub period: BudgetPeriod,
}

/// The window a [`Budget`] counts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetPeriod {
    /// The current UTC calendar day.
    Day,
    /// The current UTC calendar month.
    Month,
}

impl Budget {
    /// `allowance` units (jobs, at the default cost of 1) per UTC calendar month.
    ///
    /// Never zero (every start refused), so a `NonZeroU64`:
    /// `NonZeroU64::new(100).unwrap()` in a `const`, checked when compiling,
    /// or `NonZeroU64::try_from(n)?` for a number read at startup.
    pub fn per_month(allowance: NonZeroU64) -> Self {
        Self {
            allowance,
            period: BudgetPeriod::Month,
        }
    }

    /// `allowance` units (jobs, at the default cost of 1) per UTC calendar
    /// day; never zero, as for [`per_month`](Self::per_month).
    pub fn per_day(allowance: NonZeroU64) -> Self {
        Self {
            allowance,
            period: BudgetPeriod::Day,
        }
    }
}

/// A request to start (or join) the job for a natural key.
///
/// A job is identified by `(tenant, kind, key)` as three separate fields: every
/// store compares them one by one, never a string joined from them, so no
/// choice of separators in a tenant or a key can make two tenants (or two
/// kinds) meet on one job.
#[derive(Clone, Debug)]
pub struct StartJob<'a> {
    /// The tenant, from authentication.
    pub tenant: &'a str,
    /// The kind of job, fixed per layer (see [`LeaseLayer::new`](crate::LeaseLayer::new)).
    pub kind: &'a str,
    /// The natural key within the tenant and kind.
    pub key: &'a str,
    /// The identity the new lease is granted to.
    pub owner: &'a str,
    /// An optional budget checked, atomically, before a job is created.
    pub budget: Option<Budget>,
    /// The units this start reserves against the budget if it creates (or
    /// revives) a job; reserving and creating are one atomic decision.
    pub cost: u64,
}

/// When an exhausted budget's period ends, on the store's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetReset {
    /// The first instant of the next period, RFC 3339 in UTC
    /// (`2026-09-01T00:00:00Z`).
    pub at: String,
    /// How long until then.
    pub after: std::time::Duration,
}

/// What [`JobStore::start`] decided, atomically.
#[derive(Clone, Debug)]
pub enum StartOutcome {
    /// No live job: a new one was created, leased to the caller.
    Created(Job, LeaseGrant),
    /// The job's lease had expired: it was taken over by compare-and-set with a
    /// higher fencing token, its cursor reset, and leased to the caller.
    Stolen(Job, LeaseGrant),
    /// A live lease exists: join it; nothing new starts.
    Joined(Job),
    /// The job completed earlier: its result stands.
    Completed(Job),
    /// Reserving this start's cost would exceed the tenant's budget; it resets then.
    BudgetExhausted(BudgetReset),
}

/// Result of [`JobStore::append`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appended {
    /// The chunk was added; the cursor now holds `next_seq` chunks.
    Added {
        /// The next sequence number expected.
        next_seq: u64,
    },
    /// The sequence number was already appended: nothing changed.
    Duplicate {
        /// The next sequence number expected.
        next_seq: u64,
    },
}

/// A chunk of a job's cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The job's attempt the chunk belongs to (see [`Job::attempt`]).
    pub attempt: u64,
    /// Its sequence number, from 0 within the attempt.
    pub seq: u64,
    /// Its bytes.
    pub data: Bytes,
}

/// What [`JobReader::artifact`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArtifactLookup {
    /// The artifact of the caller's complete job.
    Found(Bytes),
    /// The caller's job has not completed (yet).
    NotReady(JobStatus),
    /// The job belongs to another tenant (`403 tenant_mismatch`).
    OtherTenant,
    /// No such job.
    Unknown,
}

/// A job store failure. The lease layer answers `503 job_store_unavailable`
/// and starts nothing.
#[derive(Debug)]
#[non_exhaustive]
pub enum JobStoreError {
    /// The backend failed, or did not answer within the store's operation timeout.
    Backend(BoxError),
}

impl JobStoreError {
    /// A backend failure.
    pub fn backend(error: impl Into<BoxError>) -> Self {
        Self::Backend(error.into())
    }
}

impl fmt::Display for JobStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Backend(e) => write!(f, "job store backend error: {e}"),
        }
    }
}

impl std::error::Error for JobStoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Backend(e) => Some(&**e),
        }
    }
}

/// Why a lease operation was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseError {
    /// The lease expired or was stolen: stop working (`409 lease_lost`).
    LeaseLost,
    /// Finalize or fail by someone who does not own the live lease (`409 not_owner`).
    NotOwner,
    /// An append skipped a sequence number (`409 sequence_gap`).
    SequenceGap {
        /// The next sequence number the cursor expects.
        expected: u64,
    },
    /// The job does not exist.
    UnknownJob,
    /// The store failed.
    Store(JobStoreError),
}

impl LeaseError {
    /// The machine-readable code used in HTTP answers.
    pub fn code(&self) -> &'static str {
        match self {
            Self::LeaseLost => "lease_lost",
            Self::NotOwner => "not_owner",
            Self::SequenceGap { .. } => "sequence_gap",
            Self::UnknownJob => "unknown_job",
            Self::Store(_) => "store_unavailable",
        }
    }
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SequenceGap { expected } => write!(f, "sequence_gap: expected seq {expected}"),
            Self::Store(e) => write!(f, "store_unavailable: {e}"),
            other => f.write_str(other.code()),
        }
    }
}

impl std::error::Error for LeaseError {}

impl From<JobStoreError> for LeaseError {
    fn from(e: JobStoreError) -> Self {
        Self::Store(e)
    }
}

/// Starting jobs and the writes of the worker that holds a lease: what
/// [`LeaseLayer`](crate::LeaseLayer) and [`Lease`](crate::Lease) call.
///
/// Every write by a worker is fenced by `(job_id, owner, token)` and a live
/// lease on the store's clock. Lease length is a property of the store. What
/// readers and operators call is split off into [`JobReader`] and
/// [`JobMaintenance`], so each part of an application holds only what it uses.
///
/// Each method returns a `Send` future; implement them as `async fn`s, as for
/// [`Store`](crate::store::Store). Share a job store between layers, workers and
/// readers as an [`Arc`] (`Arc<S>` is a job store whenever `S` is), or, to pick
/// it at run time, as an [`AnyJobStore`]. The trait is not object safe (there
/// is no `dyn JobStore`).
pub trait JobStore: Send + Sync + 'static {
    /// How long a lease lives without a heartbeat.
    fn lease_duration(&self) -> std::time::Duration;

    /// Starts, joins, steals or reports the job for a natural key, in one atomic step.
    fn start(
        &self,
        request: &StartJob<'_>,
    ) -> impl Future<Output = Result<StartOutcome, JobStoreError>> + Send;

    /// Hands a queued job (or one whose lease expired) to `owner`, marking it
    /// running with a new token. `None` when the job has ended, is unknown, or
    /// another worker holds a live lease: the caller does nothing.
    ///
    /// A job whose lease expired no longer counts against its [`Budget`], so
    /// handing it over is a new reservation: checked against the budget it
    /// was started (or last stolen) under, in the current period, as one
    /// decision with the tenant's starts; `None` while that leaves no room
    /// (the job stays as it was, for the stale sweep or a later start). A
    /// queued job whose starter's lease is live keeps its reservation and is
    /// handed over as it is.
    fn acquire(
        &self,
        job_id: &str,
        owner: &str,
    ) -> impl Future<Output = Result<Option<LeaseGrant>, JobStoreError>> + Send;

    /// Extends a live lease; `LeaseLost` once it expired or was stolen.
    fn heartbeat(&self, lease: &LeaseGrant) -> impl Future<Output = Result<(), LeaseError>> + Send;

    /// Appends chunk `seq` under a live lease. A repeated `seq` is a no-op; a
    /// gap is refused.
    fn append(
        &self,
        lease: &LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> impl Future<Output = Result<Appended, LeaseError>> + Send;

    /// Stores the artifact once, for the current owner of a live lease only,
    /// and ends the job as complete. Returns the artifact id.
    fn finalize(
        &self,
        lease: &LeaseGrant,
        artifact: Bytes,
    ) -> impl Future<Output = Result<String, LeaseError>> + Send;

    /// Ends the job as failed with `code`, for the current owner only.
    fn fail(
        &self,
        lease: &LeaseGrant,
        code: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send;
}

/// Reading jobs, always on behalf of a tenant: what status, cursor and
/// artifact endpoints call. Implemented with `async fn`s, as [`JobStore`] is.
pub trait JobReader: Send + Sync + 'static {
    /// The job, if it exists and belongs to `tenant`.
    fn job(
        &self,
        tenant: &str,
        job_id: &str,
    ) -> impl Future<Output = Result<Option<Job>, JobStoreError>> + Send;

    /// The cursor's chunks from `from_seq` on, if the job belongs to `tenant`.
    fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> impl Future<Output = Result<Option<Vec<Chunk>>, JobStoreError>> + Send;

    /// The artifact of a job, checked against `tenant`.
    fn artifact(
        &self,
        tenant: &str,
        job_id: &str,
    ) -> impl Future<Output = Result<ArtifactLookup, JobStoreError>> + Send;
}

/// Upkeep an operator or a scheduled task runs: stale sweeps, budget resets,
/// retention and erasure (as tower-sessions keeps `ExpiredDeletion` apart
/// from its `SessionStore`). Implemented with `async fn`s, as [`JobStore`] is.
pub trait JobMaintenance: Send + Sync + 'static {
    /// Fails in-flight jobs whose lease expired with nobody behind them;
    /// returns how many.
    fn sweep_stale(&self) -> impl Future<Output = Result<u64, JobStoreError>> + Send;

    /// Operator reset: jobs of `tenant` in the current period no longer count
    /// against `period`'s budget. Returns how many were reset.
    fn reset_budget(
        &self,
        tenant: &str,
        period: BudgetPeriod,
    ) -> impl Future<Output = Result<u64, JobStoreError>> + Send;

    /// Retention: deletes jobs that completed or failed at least `older_than`
    /// ago, with their chunks and artifacts; returns how many. A start for a
    /// purged job's key creates a new job, and a purged completed job no
    /// longer counts against its period's budget (keep retention longer than
    /// your budget periods). Jobs still in flight are never purged.
    fn purge_finished(
        &self,
        older_than: std::time::Duration,
    ) -> impl Future<Output = Result<u64, JobStoreError>> + Send;

    /// Erasure: deletes every job of `tenant`, in flight or ended, with its
    /// chunks and artifacts; returns how many. A worker still running one of
    /// them can no longer write (its job is unknown).
    fn purge_tenant(&self, tenant: &str)
        -> impl Future<Output = Result<u64, JobStoreError>> + Send;
}

/// Shares one job store between layers, workers and readers. Each call hands
/// on the shared store's own future.
impl<T: JobStore + ?Sized> JobStore for Arc<T> {
    fn lease_duration(&self) -> std::time::Duration {
        (**self).lease_duration()
    }

    fn start(
        &self,
        request: &StartJob<'_>,
    ) -> impl Future<Output = Result<StartOutcome, JobStoreError>> + Send {
        (**self).start(request)
    }

    fn acquire(
        &self,
        job_id: &str,
        owner: &str,
    ) -> impl Future<Output = Result<Option<LeaseGrant>, JobStoreError>> + Send {
        (**self).acquire(job_id, owner)
    }

    fn heartbeat(&self, lease: &LeaseGrant) -> impl Future<Output = Result<(), LeaseError>> + Send {
        (**self).heartbeat(lease)
    }

    fn append(
        &self,
        lease: &LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> impl Future<Output = Result<Appended, LeaseError>> + Send {
        (**self).append(lease, seq, chunk)
    }

    fn finalize(
        &self,
        lease: &LeaseGrant,
        artifact: Bytes,
    ) -> impl Future<Output = Result<String, LeaseError>> + Send {
        (**self).finalize(lease, artifact)
    }

    fn fail(
        &self,
        lease: &LeaseGrant,
        code: &str,
    ) -> impl Future<Output = Result<(), LeaseError>> + Send {
        (**self).fail(lease, code)
    }
}

impl<T: JobReader + ?Sized> JobReader for Arc<T> {
    fn job(
        &self,
        tenant: &str,
        job_id: &str,
    ) -> impl Future<Output = Result<Option<Job>, JobStoreError>> + Send {
        (**self).job(tenant, job_id)
    }

    fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> impl Future<Output = Result<Option<Vec<Chunk>>, JobStoreError>> + Send {
        (**self).chunks(tenant, job_id, from_seq)
    }

    fn artifact(
        &self,
        tenant: &str,
        job_id: &str,
    ) -> impl Future<Output = Result<ArtifactLookup, JobStoreError>> + Send {
        (**self).artifact(tenant, job_id)
    }
}

impl<T: JobMaintenance + ?Sized> JobMaintenance for Arc<T> {
    fn sweep_stale(&self) -> impl Future<Output = Result<u64, JobStoreError>> + Send {
        (**self).sweep_stale()
    }

    fn reset_budget(
        &self,
        tenant: &str,
        period: BudgetPeriod,
    ) -> impl Future<Output = Result<u64, JobStoreError>> + Send {
        (**self).reset_budget(tenant, period)
    }

    fn purge_finished(
        &self,
        older_than: std::time::Duration,
    ) -> impl Future<Output = Result<u64, JobStoreError>> + Send {
        (**self).purge_finished(older_than)
    }

    fn purge_tenant(
        &self,
        tenant: &str,
    ) -> impl Future<Output = Result<u64, JobStoreError>> + Send {
        (**self).purge_tenant(tenant)
    }
}
