use super::{
    Appended, ArtifactLookup, Budget, BudgetPeriod, BudgetReset, Chunk, Job, JobMaintenance,
    JobReader, JobStatus, JobStore, JobStoreError, LeaseError, LeaseGrant, StartJob, StartOutcome,
};
use crate::store::settings::Settings;
use crate::store::FencingToken;
use bytes::Bytes;
use index::{PeriodStarts, TenantJobs};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

mod index;

/// An in-process [`JobStore`]: one mutex over all jobs, so `start` (with its
/// budget count) is atomic. Jobs are rare next to requests; use `PostgresJobStore`
/// when several instances serve the same tenants.
///
/// Each tenant's completed jobs are counted per period as they complete, and
/// its unfinished jobs kept apart, so a budgeted start costs the same whether
/// the store holds ten jobs or ten million. Ended jobs stay until
/// [`purge_finished`](super::JobMaintenance::purge_finished) removes them.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::lease::store::MemoryJobStore;
///
/// let store = MemoryJobStore::builder()
///     .with_lease(Duration::from_secs(45))
///     .build();
/// # let _ = store;
/// ```
///
/// Clones share the same jobs; a store is configured before it exists, by
/// its [`builder`](Self::builder).
#[derive(Clone)]
pub struct MemoryJobStore {
    shared: Arc<Shared>,
}

struct Shared {
    lease: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    jobs: HashMap<String, Entry>,
    /// `(tenant, kind, key)` → the job that is not failed (at most one). The
    /// parts stay separate fields: no joined string can make two tenants meet.
    live_by_key: HashMap<JobIdentity, String>,
    tenants: HashMap<String, TenantJobs>,
    next_token: i64,
}

struct Entry {
    job: Job,
    token: FencingToken,
    lease_expires: Instant,
    period_start: PeriodStarts,
    chunks: Vec<Bytes>,
    artifact: Option<Bytes>,
    budget_reset: bool,
    /// The budget of the start that created or stole the job, which an
    /// `acquire` reviving it checks again.
    budget: Option<Budget>,
    /// When the job completed or failed.
    ended_at: Option<Instant>,
}

/// A job's identity: tenant, kind and natural key, compared field by field.
#[derive(Clone, PartialEq, Eq, Hash)]
struct JobIdentity {
    tenant: String,
    kind: String,
    key: String,
}

impl JobIdentity {
    fn of(job: &Job) -> Self {
        Self {
            tenant: job.tenant.clone(),
            kind: job.kind.clone(),
            key: job.key.clone(),
        }
    }
}

impl Default for MemoryJobStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryJobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryJobStore")
            .field("lease", &self.shared.lease)
            .finish_non_exhaustive()
    }
}

impl MemoryJobStore {
    /// A store with 45 s leases.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A [`MemoryJobStoreBuilder`] with the defaults of [`new`](Self::new),
    /// to configure the store before it exists.
    pub fn builder() -> MemoryJobStoreBuilder {
        MemoryJobStoreBuilder {
            settings: Settings::JOBS,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The configuration of a [`MemoryJobStore`], from
/// [`MemoryJobStore::builder`]: every option is set here, and
/// [`build`](Self::build) makes the store.
///
/// A clone of a builder builds a second store of its own, sharing no jobs
/// with the first.
#[must_use = "a builder does nothing until `build` makes the store"]
#[derive(Clone)]
pub struct MemoryJobStoreBuilder {
    settings: Settings,
}

impl Default for MemoryJobStoreBuilder {
    fn default() -> Self {
        MemoryJobStore::builder()
    }
}

impl std::fmt::Debug for MemoryJobStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryJobStoreBuilder")
            .field("lease", &self.settings.lock_timeout())
            .finish()
    }
}

impl MemoryJobStoreBuilder {
    /// How long a lease lives without a heartbeat (default 45 s). Clamped to
    /// between 100 ms and 100 years.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.settings.set_lock_timeout(lease);
        self
    }

    /// The store, configured: a new one at every call, sharing nothing with
    /// the stores built before it.
    pub fn build(self) -> MemoryJobStore {
        MemoryJobStore {
            shared: Arc::new(Shared {
                lease: self.settings.lock_timeout(),
                state: Mutex::new(State {
                    next_token: 1,
                    ..State::default()
                }),
            }),
        }
    }
}

impl State {
    fn grant(&mut self, entry_id: &str, owner: &str, expires: Instant) -> LeaseGrant {
        let token = FencingToken::new(self.next_token);
        self.next_token += 1;
        let entry = self
            .jobs
            .get_mut(entry_id)
            .expect("granting an existing job");
        entry.token = token;
        entry.lease_expires = expires;
        entry.job.lease_owner = Some(owner.to_owned());
        LeaseGrant {
            job_id: entry_id.to_owned(),
            owner: owner.to_owned(),
            token,
        }
    }

    /// What counts against `budget` for `tenant` now: completed jobs of the
    /// period (counted as they completed), and unfinished ones under a live lease.
    fn counted(&self, tenant: &str, budget: Budget, now: Instant, today: PeriodStarts) -> u64 {
        let Some(index) = self.tenants.get(tenant) else {
            return 0;
        };
        let live = index
            .in_flight
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .filter(|e| !e.budget_reset && e.period_start.same(today, budget.period))
            .filter(|e| e.lease_expires > now)
            .map(|e| e.job.cost)
            .fold(0u64, u64::saturating_add);
        index.complete_in(budget, today).saturating_add(live)
    }

    /// Ends a job as `status`, keeping the tenant's counts and the live key
    /// map in step. The caller checked that it had not ended.
    fn end(&mut self, id: &str, status: JobStatus, error_code: Option<&str>, now: Instant) {
        let Some(entry) = self.jobs.get_mut(id) else {
            return;
        };
        entry.job.status = status;
        entry.job.error_code = error_code.map(str::to_owned);
        entry.ended_at = Some(now);
        let (tenant, period, cost, counts) = (
            entry.job.tenant.clone(),
            entry.period_start,
            entry.job.cost,
            status == JobStatus::Complete && !entry.budget_reset,
        );
        if status == JobStatus::Failed {
            let identity = JobIdentity::of(&entry.job);
            self.live_by_key.remove(&identity);
        }
        let index = self.tenants.entry(tenant).or_default();
        index.in_flight.remove(id);
        if counts {
            index.count_complete(period, cost, true);
        }
    }

    /// Removes a job and everything it holds; a completed one stops counting.
    fn remove(&mut self, id: &str) {
        let Some(entry) = self.jobs.remove(id) else {
            return;
        };
        let identity = JobIdentity::of(&entry.job);
        if self.live_by_key.get(&identity).map(String::as_str) == Some(id) {
            self.live_by_key.remove(&identity);
        }
        if let Some(index) = self.tenants.get_mut(&entry.job.tenant) {
            index.jobs.remove(id);
            index.in_flight.remove(id);
            if entry.job.status == JobStatus::Complete && !entry.budget_reset {
                index.count_complete(entry.period_start, entry.job.cost, false);
            }
            if index.jobs.is_empty() {
                self.tenants.remove(&entry.job.tenant);
            }
        }
    }

    /// The entry a worker's write applies to, if its lease is the current one.
    fn owned(&mut self, lease: &LeaseGrant) -> Result<&mut Entry, LeaseError> {
        let entry = self
            .jobs
            .get_mut(&lease.job_id)
            .ok_or(LeaseError::UnknownJob)?;
        let owns = entry.token == lease.token
            && entry.job.lease_owner.as_deref() == Some(lease.owner.as_str());
        if owns {
            Ok(entry)
        } else {
            Err(LeaseError::NotOwner)
        }
    }

    /// The entry, if its lease is the caller's and still live.
    fn live(&mut self, lease: &LeaseGrant, now: Instant) -> Result<&mut Entry, LeaseError> {
        match self.owned(lease) {
            Ok(entry) if !entry.job.status.is_terminal() && entry.lease_expires > now => Ok(entry),
            Err(LeaseError::UnknownJob) => Err(LeaseError::UnknownJob),
            _ => Err(LeaseError::LeaseLost),
        }
    }
}

/// When `budget`'s period that contains `today` ends, on this process's clock.
fn budget_reset(today: PeriodStarts, budget: Budget) -> BudgetReset {
    let (at, epoch_secs) = today.next(budget.period);
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    BudgetReset {
        at,
        after: Duration::from_secs(epoch_secs).saturating_sub(now),
    }
}

/// An unpredictable id: 128 bits from the operating system (reads are
/// tenant-checked regardless).
fn new_job_id() -> String {
    format!("job_{:032x}", u128::from_le_bytes(crate::random::bytes()))
}

impl JobStore for MemoryJobStore {
    fn lease_duration(&self) -> Duration {
        self.shared.lease
    }

    async fn start(&self, request: &StartJob<'_>) -> Result<StartOutcome, JobStoreError> {
        let now = Instant::now();
        let today = PeriodStarts::of(SystemTime::now());
        let expires = now + self.shared.lease;
        let identity = JobIdentity {
            tenant: request.tenant.to_owned(),
            kind: request.kind.to_owned(),
            key: request.key.to_owned(),
        };
        let mut state = self.state();
        // The reservation and the creation are one decision, under the lock.
        let over_budget = |state: &State| {
            let budget = request.budget?;
            let counted = state.counted(request.tenant, budget, now, today);
            (counted.saturating_add(request.cost) > budget.allowance.get())
                .then(|| StartOutcome::BudgetExhausted(budget_reset(today, budget)))
        };
        if let Some(id) = state.live_by_key.get(&identity).cloned() {
            let entry = &state.jobs[&id];
            match entry.job.status {
                JobStatus::Complete => return Ok(StartOutcome::Completed(entry.job.clone())),
                _ if entry.lease_expires > now => {
                    return Ok(StartOutcome::Joined(entry.job.clone()))
                }
                _ => {}
            }
            // Expired: steal it, unless reviving it would exceed the budget.
            if let Some(exhausted) = over_budget(&state) {
                return Ok(exhausted);
            }
            let grant = state.grant(&id, request.owner, expires);
            let entry = state.jobs.get_mut(&id).expect("present");
            entry.job.status = JobStatus::Queued;
            entry.job.attempt += 1;
            entry.job.next_seq = 0;
            entry.job.cursor_len = 0;
            entry.chunks.clear();
            entry.period_start = today;
            entry.budget_reset = false;
            entry.budget = request.budget;
            entry.job.cost = request.cost;
            return Ok(StartOutcome::Stolen(entry.job.clone(), grant));
        }
        if let Some(exhausted) = over_budget(&state) {
            return Ok(exhausted);
        }
        let id = new_job_id();
        let job = Job {
            id: id.clone(),
            tenant: identity.tenant.clone(),
            kind: identity.kind.clone(),
            key: identity.key.clone(),
            status: JobStatus::Queued,
            lease_owner: None,
            attempt: 1,
            next_seq: 0,
            cursor_len: 0,
            artifact_id: None,
            error_code: None,
            cost: request.cost,
        };
        state.jobs.insert(
            id.clone(),
            Entry {
                job,
                token: FencingToken::new(0),
                lease_expires: expires,
                period_start: today,
                chunks: Vec::new(),
                artifact: None,
                budget_reset: false,
                budget: request.budget,
                ended_at: None,
            },
        );
        let index = state.tenants.entry(identity.tenant.clone()).or_default();
        index.jobs.insert(id.clone());
        index.in_flight.insert(id.clone());
        state.live_by_key.insert(identity, id.clone());
        let grant = state.grant(&id, request.owner, expires);
        Ok(StartOutcome::Created(state.jobs[&id].job.clone(), grant))
    }

    async fn acquire(
        &self,
        job_id: &str,
        owner: &str,
    ) -> Result<Option<LeaseGrant>, JobStoreError> {
        let mut state = self.state();
        // The clock is read under the lock: a lease that expired while this
        // call waited for it was not counted by the start that held it.
        let now = Instant::now();
        let today = PeriodStarts::of(SystemTime::now());
        let Some(entry) = state.jobs.get(job_id) else {
            return Ok(None);
        };
        let expired = entry.lease_expires <= now;
        // Only a running job under an expired lease is a takeover; a queued job
        // is handed over as it is, whatever its starter's lease says.
        let takeover = entry.job.status == JobStatus::Running && expired;
        let available = match entry.job.status {
            JobStatus::Queued => true,
            JobStatus::Running => expired,
            JobStatus::Complete | JobStatus::Failed => false,
        };
        if !available {
            return Ok(None);
        }
        // An expired job stopped counting, and other starts may have taken
        // its place: reviving it is a new reservation, in today's period, as
        // a steal's is.
        if let (true, Some(budget)) = (expired, entry.budget) {
            let counted = state.counted(&entry.job.tenant, budget, now, today);
            if counted.saturating_add(entry.job.cost) > budget.allowance.get() {
                return Ok(None);
            }
        }
        let grant = state.grant(job_id, owner, now + self.shared.lease);
        let entry = state.jobs.get_mut(job_id).expect("present");
        if expired {
            entry.period_start = today;
            entry.budget_reset = false;
        }
        if takeover {
            // A dead worker's partial cursor never becomes part of the result.
            entry.job.attempt += 1;
            entry.chunks.clear();
            entry.job.next_seq = 0;
            entry.job.cursor_len = 0;
        }
        entry.job.status = JobStatus::Running;
        Ok(Some(grant))
    }

    async fn heartbeat(&self, lease: &LeaseGrant) -> Result<(), LeaseError> {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.live(lease, now)?;
        entry.lease_expires = now + self.shared.lease;
        entry.job.status = JobStatus::Running;
        Ok(())
    }

    async fn append(
        &self,
        lease: &LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> Result<Appended, LeaseError> {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.live(lease, now)?;
        let next_seq = entry.job.next_seq;
        if seq < next_seq {
            return Ok(Appended::Duplicate { next_seq });
        }
        if seq > next_seq {
            return Err(LeaseError::SequenceGap { expected: next_seq });
        }
        entry.job.cursor_len += chunk.len() as u64;
        entry.chunks.push(chunk);
        entry.job.next_seq += 1;
        entry.job.status = JobStatus::Running;
        Ok(Appended::Added {
            next_seq: entry.job.next_seq,
        })
    }

    async fn finalize(&self, lease: &LeaseGrant, artifact: Bytes) -> Result<String, LeaseError> {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.owned(lease).map_err(|e| match e {
            LeaseError::UnknownJob => e,
            _ => LeaseError::NotOwner,
        })?;
        match entry.job.status {
            // A retried finalize by the same owner gets the same answer, and stores nothing.
            JobStatus::Complete => {
                return entry.job.artifact_id.clone().ok_or(LeaseError::NotOwner)
            }
            JobStatus::Failed => return Err(LeaseError::NotOwner),
            _ if entry.lease_expires <= now => return Err(LeaseError::NotOwner),
            _ => {}
        }
        let artifact_id = format!("art_{}", entry.job.id.trim_start_matches("job_"));
        entry.artifact = Some(artifact);
        entry.job.artifact_id = Some(artifact_id.clone());
        state.end(&lease.job_id, JobStatus::Complete, None, now);
        Ok(artifact_id)
    }

    async fn fail(&self, lease: &LeaseGrant, code: &str) -> Result<(), LeaseError> {
        let mut state = self.state();
        let entry = state.owned(lease)?;
        if entry.job.status.is_terminal() {
            return Err(LeaseError::NotOwner);
        }
        state.end(&lease.job_id, JobStatus::Failed, Some(code), Instant::now());
        Ok(())
    }
}

impl JobReader for MemoryJobStore {
    async fn job(&self, tenant: &str, job_id: &str) -> Result<Option<Job>, JobStoreError> {
        let state = self.state();
        Ok(state
            .jobs
            .get(job_id)
            .filter(|e| e.job.tenant == tenant)
            .map(|e| e.job.clone()))
    }

    async fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> Result<Option<Vec<Chunk>>, JobStoreError> {
        let state = self.state();
        Ok(state
            .jobs
            .get(job_id)
            .filter(|e| e.job.tenant == tenant)
            .map(|e| {
                e.chunks
                    .iter()
                    .enumerate()
                    .skip(from_seq.min(usize::MAX as u64) as usize)
                    .map(|(seq, data)| Chunk {
                        attempt: e.job.attempt,
                        seq: seq as u64,
                        data: data.clone(),
                    })
                    .collect()
            }))
    }

    async fn artifact(&self, tenant: &str, job_id: &str) -> Result<ArtifactLookup, JobStoreError> {
        let state = self.state();
        Ok(match state.jobs.get(job_id) {
            None => ArtifactLookup::Unknown,
            Some(e) if e.job.tenant != tenant => ArtifactLookup::OtherTenant,
            Some(e) => match &e.artifact {
                Some(artifact) => ArtifactLookup::Found(artifact.clone()),
                None => ArtifactLookup::NotReady(e.job.status),
            },
        })
    }
}

impl JobMaintenance for MemoryJobStore {
    async fn sweep_stale(&self) -> Result<u64, JobStoreError> {
        let now = Instant::now();
        let mut state = self.state();
        let stale: Vec<String> = state
            .tenants
            .values()
            .flat_map(|index| index.in_flight.iter())
            .filter(|id| state.jobs.get(*id).is_some_and(|e| e.lease_expires <= now))
            .cloned()
            .collect();
        for id in &stale {
            state.end(id, JobStatus::Failed, Some("stale"), now);
        }
        Ok(stale.len() as u64)
    }

    async fn reset_budget(&self, tenant: &str, period: BudgetPeriod) -> Result<u64, JobStoreError> {
        let today = PeriodStarts::of(SystemTime::now());
        let mut guard = self.state();
        let state = &mut *guard;
        let Some(index) = state.tenants.get_mut(tenant) else {
            return Ok(0);
        };
        let mut reset = 0;
        let mut uncounted = Vec::new();
        for id in &index.jobs {
            let Some(entry) = state.jobs.get_mut(id) else {
                continue;
            };
            if entry.budget_reset || !entry.period_start.same(today, period) {
                continue;
            }
            entry.budget_reset = true;
            if entry.job.status == JobStatus::Complete {
                uncounted.push((entry.period_start, entry.job.cost));
            }
            reset += 1;
        }
        for (period_start, cost) in uncounted {
            index.count_complete(period_start, cost, false);
        }
        Ok(reset)
    }

    async fn purge_finished(&self, older_than: Duration) -> Result<u64, JobStoreError> {
        let now = Instant::now();
        let mut state = self.state();
        let doomed: Vec<String> = state
            .jobs
            .iter()
            .filter(|(_, e)| {
                e.ended_at
                    .is_some_and(|ended| now.saturating_duration_since(ended) >= older_than)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &doomed {
            state.remove(id);
        }
        Ok(doomed.len() as u64)
    }

    async fn purge_tenant(&self, tenant: &str) -> Result<u64, JobStoreError> {
        let mut state = self.state();
        let doomed: Vec<String> = state
            .tenants
            .get(tenant)
            .map(|index| index.jobs.iter().cloned().collect())
            .unwrap_or_default();
        for id in &doomed {
            state.remove(id);
        }
        Ok(doomed.len() as u64)
    }
}
