//! A PostgreSQL [`JobStore`]: natural-key jobs shared by every instance.

mod builder;

pub use builder::PostgresJobStoreBuilder;

use crate::body::BoxError;
use crate::lease::store::{
    Appended, ArtifactLookup, BudgetPeriod, BudgetReset, Chunk, Job, JobMaintenance, JobReader,
    JobStatus, JobStore, JobStoreError, LeaseError, LeaseGrant, StartJob, StartOutcome,
};
use crate::store::postgres::sql::derived_name;
use crate::store::settings::{Settings, TimedOut};
use crate::store::FencingToken;
use bytes::Bytes;
use deadpool_postgres::{Object, Pool};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::Row;

/// A [`JobStore`] in PostgreSQL tables, shared by every instance of an application.
///
/// - **One live job per `(tenant, kind, key)`**: a unique index over the three
///   columns (never a string joined from them) of jobs that have not failed,
///   and `start` serialised per job by a
///   transaction-scoped advisory lock (per tenant too when a budget applies, so
///   concurrent starts cannot overshoot it; `acquire` takes the tenant's lock
///   too, so reviving an expired job cannot either).
/// - **Database clock only**: leases expire at `now() + interval`; every liveness
///   check compares with `now()` in SQL.
/// - **Fenced writes**: heartbeat, append, finalize and fail match the job's
///   `(lease_owner, lease_token)`; tokens come from a sequence, so a steal always
///   issues a higher one and the dead owner's writes change nothing.
///
/// Clones share the pool; a store is configured before it exists, by its
/// [`builder`](Self::builder).
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), tower_idempotency::lease::store::JobStoreError> {
/// use std::time::Duration;
/// use tower_idempotency::lease::store::PostgresJobStore;
///
/// let jobs = PostgresJobStore::builder(pool)
///     .with_lease(Duration::from_secs(45))
///     .build();
/// jobs.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresJobStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    settings: Settings,
    schema: String,
    table: String,
    sql: JobSql,
}

/// What an operation past its timeout is called in the error.
const OPERATION: &str = "PostgreSQL job store operation";

impl std::fmt::Debug for PostgresJobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.inner;
        f.debug_struct("PostgresJobStore")
            .field("schema", &c.schema)
            .field("table", &c.table)
            .field("lease", &c.settings.lock_timeout())
            .field("operation_timeout", &c.settings.operation_timeout())
            .finish_non_exhaustive()
    }
}

/// Rows deleted per purge statement.
const PURGE_BATCH: u64 = 1000;

const JOB_COLUMNS: &str = "job_id, tenant, kind, key, status, lease_owner, attempt, \
                           next_seq, cursor_len, artifact_id, error_code, cost";

impl PostgresJobStore {
    /// Jobs in `public.lease_jobs` (chunks in `public.lease_jobs_chunks`), 45 s
    /// leases, operations failing after 5 s.
    pub fn new(pool: Pool) -> Self {
        Self::builder(pool).build()
    }

    /// A [`PostgresJobStoreBuilder`] on `pool` with the defaults of
    /// [`new`](Self::new), to configure the store before it exists.
    pub fn builder(pool: Pool) -> PostgresJobStoreBuilder {
        PostgresJobStoreBuilder::new(pool)
    }

    /// Creates or upgrades the schema, sequence, tables and indexes: the
    /// numbered migrations of the jobs table not yet recorded in
    /// `<schema>.tower_idempotency_migrations` run in order. Idempotent, and
    /// safe to run from many instances at once (and with `PostgresStore::migrate`:
    /// both take the same advisory lock).
    pub async fn migrate(&self) -> Result<(), JobStoreError> {
        let (schema, table) = (&self.inner.schema, &self.inner.table);
        self.inner
            .settings
            .timed(OPERATION, async {
                let mut client = self.client().await?;
                crate::store::postgres::migrate::apply(
                    &mut client,
                    schema,
                    table,
                    &self.inner.sql.migrations,
                )
                .await
                .map_err(backend)?;
                Ok(())
            })
            .await
    }

    async fn client(&self) -> Result<Object, JobStoreError> {
        self.inner.pool.get().await.map_err(backend)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, JobStoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(backend)?;
        client.query(&statement, params).await.map_err(backend)
    }

    /// Runs a bounded `DELETE` until it deletes fewer than a batch, each
    /// batch within the operation timeout; returns the total.
    async fn purge_batches(
        &self,
        sql: &str,
        param: &(dyn tokio_postgres::types::ToSql + Sync),
    ) -> Result<u64, JobStoreError> {
        let mut purged = 0;
        loop {
            let deleted = self
                .inner
                .settings
                .timed(OPERATION, async {
                    let client = self.client().await?;
                    let statement = client.prepare_cached(sql).await.map_err(backend)?;
                    client.execute(&statement, &[param]).await.map_err(backend)
                })
                .await?;
            purged += deleted;
            if deleted < PURGE_BATCH {
                return Ok(purged);
            }
        }
    }

    /// Why a fenced write matched nothing: unknown job, or the lease is not the caller's.
    async fn refusal(&self, lease: &LeaseGrant, not_yours: LeaseError) -> LeaseError {
        match self.query(&self.inner.sql.exists, &[&lease.job_id]).await {
            Ok(rows) if rows.is_empty() => LeaseError::UnknownJob,
            Ok(_) => not_yours,
            Err(e) => LeaseError::Store(e),
        }
    }
}

fn backend(error: impl Into<BoxError>) -> JobStoreError {
    JobStoreError::Backend(error.into())
}

impl TimedOut for JobStoreError {
    fn timed_out(message: String) -> Self {
        backend(message)
    }
}

impl TimedOut for LeaseError {
    fn timed_out(message: String) -> Self {
        LeaseError::Store(backend(message))
    }
}

impl PostgresJobStoreBuilder {
    /// The store, configured: a new one at every call, on the same pool as
    /// the stores built before it.
    pub fn build(self) -> PostgresJobStore {
        let sql = JobSql::new(&self.schema, &self.table, self.settings.lock_timeout());
        PostgresJobStore {
            inner: Arc::new(Inner {
                pool: self.pool,
                settings: self.settings,
                schema: self.schema,
                table: self.table,
                sql,
            }),
        }
    }
}

fn decode_job(row: &Row) -> Result<Job, JobStoreError> {
    let status: String = row.try_get("status").map_err(backend)?;
    Ok(Job {
        id: row.try_get("job_id").map_err(backend)?,
        tenant: row.try_get("tenant").map_err(backend)?,
        kind: row.try_get("kind").map_err(backend)?,
        key: row.try_get("key").map_err(backend)?,
        status: JobStatus::parse(&status)
            .ok_or_else(|| backend(format!("unknown job status {status:?}")))?,
        lease_owner: row.try_get("lease_owner").map_err(backend)?,
        attempt: row.try_get::<_, i64>("attempt").map_err(backend)? as u64,
        next_seq: row.try_get::<_, i64>("next_seq").map_err(backend)? as u64,
        cursor_len: row.try_get::<_, i64>("cursor_len").map_err(backend)? as u64,
        artifact_id: row.try_get("artifact_id").map_err(backend)?,
        error_code: row.try_get("error_code").map_err(backend)?,
        cost: row.try_get::<_, i64>("cost").map_err(backend)?.max(0) as u64,
    })
}

fn decode_grant(row: &Row, job: &Job) -> Result<LeaseGrant, JobStoreError> {
    Ok(LeaseGrant {
        job_id: job.id.clone(),
        owner: job.lease_owner.clone().unwrap_or_default(),
        token: FencingToken::new(row.try_get("lease_token").map_err(backend)?),
    })
}

fn period_unit(period: BudgetPeriod) -> &'static str {
    match period {
        BudgetPeriod::Day => "day",
        BudgetPeriod::Month => "month",
    }
}

impl JobStore for PostgresJobStore {
    fn lease_duration(&self) -> Duration {
        self.inner.settings.lock_timeout()
    }

    async fn start(&self, request: &StartJob<'_>) -> Result<StartOutcome, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let sql = &self.inner.sql;
                let mut client = self.client().await?;
                let tx = client.transaction().await.map_err(backend)?;
                let identity: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&request.tenant, &request.kind, &request.key];
                if request.budget.is_some() {
                    // Serialise a tenant's starts so the count and the insert are one decision.
                    tx.execute(&sql.budget_lock, &[&request.tenant])
                        .await
                        .map_err(backend)?;
                }
                tx.execute(&sql.job_lock, &identity)
                    .await
                    .map_err(backend)?;
                let current = tx
                    .query_opt(&sql.current, &identity)
                    .await
                    .map_err(backend)?;
                if let Some(row) = &current {
                    let job = decode_job(row)?;
                    let live: bool = row.try_get("live").map_err(backend)?;
                    if job.status == JobStatus::Complete {
                        return Ok(StartOutcome::Completed(job));
                    }
                    if live {
                        return Ok(StartOutcome::Joined(job));
                    }
                }
                let cost = i64::try_from(request.cost).unwrap_or(i64::MAX);
                // Kept with the job, for an `acquire` that revives it.
                let allowance = request
                    .budget
                    .map(|b| i64::try_from(b.allowance.get()).unwrap_or(i64::MAX));
                let period = request.budget.map(|b| period_unit(b.period));
                if let Some(budget) = request.budget {
                    // The reservation and the creation are one decision: this
                    // transaction holds the tenant's budget lock until it commits.
                    let unit = period_unit(budget.period);
                    let counted: i64 = tx
                        .query_one(&sql.budget_count, &[&request.tenant, &unit])
                        .await
                        .map_err(backend)?
                        .try_get(0)
                        .map_err(backend)?;
                    let allowance = i64::try_from(budget.allowance.get()).unwrap_or(i64::MAX);
                    if counted.saturating_add(cost) > allowance {
                        let row = tx
                            .query_one(&sql.budget_reset_at, &[&unit])
                            .await
                            .map_err(backend)?;
                        let seconds: i64 = row.try_get(1).map_err(backend)?;
                        return Ok(StartOutcome::BudgetExhausted(BudgetReset {
                            at: row.try_get(0).map_err(backend)?,
                            after: Duration::from_secs(seconds.max(0) as u64),
                        }));
                    }
                }
                let outcome = match current {
                    Some(row) => {
                        let job_id: String = row.try_get("job_id").map_err(backend)?;
                        let stolen = tx
                            .query_one(
                                &sql.steal,
                                &[&job_id, &request.owner, &cost, &allowance, &period],
                            )
                            .await
                            .map_err(backend)?;
                        let job = decode_job(&stolen)?;
                        let grant = decode_grant(&stolen, &job)?;
                        StartOutcome::Stolen(job, grant)
                    }
                    None => {
                        let created = tx
                            .query_one(
                                &sql.create,
                                &[
                                    &request.tenant,
                                    &request.kind,
                                    &request.key,
                                    &request.owner,
                                    &cost,
                                    &allowance,
                                    &period,
                                ],
                            )
                            .await
                            .map_err(backend)?;
                        let job = decode_job(&created)?;
                        let grant = decode_grant(&created, &job)?;
                        StartOutcome::Created(job, grant)
                    }
                };
                tx.commit().await.map_err(backend)?;
                Ok(outcome)
            })
            .await
    }

    async fn acquire(
        &self,
        job_id: &str,
        owner: &str,
    ) -> Result<Option<LeaseGrant>, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let sql = &self.inner.sql;
                let mut client = self.client().await?;
                let tx = client.transaction().await.map_err(backend)?;
                let Some(row) = tx
                    .query_opt(&sql.acquire_tenant, &[&job_id])
                    .await
                    .map_err(backend)?
                else {
                    return Ok(None);
                };
                let tenant: String = row.try_get(0).map_err(backend)?;
                // The tenant's budget lock, as its starts take it: reviving an
                // expired job and admitting another start are one decision.
                tx.execute(&sql.budget_lock, &[&tenant])
                    .await
                    .map_err(backend)?;
                let Some(old) = tx
                    .query_opt(&sql.acquire_lock, &[&job_id])
                    .await
                    .map_err(backend)?
                else {
                    return Ok(None);
                };
                let expired: bool = old.try_get("expired").map_err(backend)?;
                let allowance: Option<i64> = old.try_get("budget_allowance").map_err(backend)?;
                let period: Option<String> = old.try_get("budget_period").map_err(backend)?;
                if let (true, Some(allowance), Some(unit)) = (expired, allowance, period) {
                    // An expired job stopped counting, and other starts may
                    // have taken its place: reviving it is a new reservation,
                    // in this period, as a steal's is.
                    let cost: i64 = old.try_get("cost").map_err(backend)?;
                    let counted: i64 = tx
                        .query_one(&sql.acquire_count, &[&tenant, &unit, &job_id])
                        .await
                        .map_err(backend)?
                        .try_get(0)
                        .map_err(backend)?;
                    if counted.saturating_add(cost) > allowance {
                        return Ok(None);
                    }
                }
                let takeover: bool = old.try_get("takeover").map_err(backend)?;
                let row = tx
                    .query_one(&sql.acquire, &[&job_id, &owner, &takeover, &expired])
                    .await
                    .map_err(backend)?;
                let token = FencingToken::new(row.try_get("lease_token").map_err(backend)?);
                tx.commit().await.map_err(backend)?;
                Ok(Some(LeaseGrant {
                    job_id: job_id.to_owned(),
                    owner: owner.to_owned(),
                    token,
                }))
            })
            .await
    }

    async fn heartbeat(&self, lease: &LeaseGrant) -> Result<(), LeaseError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&lease.job_id, &lease.owner, &lease.token.get()];
                if self
                    .query(&self.inner.sql.heartbeat, &params)
                    .await?
                    .is_empty()
                {
                    return Err(self.refusal(lease, LeaseError::LeaseLost).await);
                }
                Ok(())
            })
            .await
    }

    async fn append(
        &self,
        lease: &LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> Result<Appended, LeaseError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let seq =
                    i64::try_from(seq).map_err(|_| LeaseError::SequenceGap { expected: 0 })?;
                let data: &[u8] = &chunk;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                    [&lease.job_id, &lease.owner, &lease.token.get(), &seq, &data];
                let rows = self.query(&self.inner.sql.append, &params).await?;
                let Some(row) = rows.first() else {
                    return Err(self.refusal(lease, LeaseError::LeaseLost).await);
                };
                let before: i64 = row.try_get("before").map_err(backend)?;
                let after: Option<i64> = row.try_get("after").map_err(backend)?;
                match after {
                    Some(next) => Ok(Appended::Added {
                        next_seq: next as u64,
                    }),
                    None if seq < before => Ok(Appended::Duplicate {
                        next_seq: before as u64,
                    }),
                    None => Err(LeaseError::SequenceGap {
                        expected: before as u64,
                    }),
                }
            })
            .await
    }

    async fn finalize(&self, lease: &LeaseGrant, artifact: Bytes) -> Result<String, LeaseError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let data: &[u8] = &artifact;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&lease.job_id, &lease.owner, &lease.token.get(), &data];
                let rows = self.query(&self.inner.sql.finalize, &params).await?;
                match rows.first() {
                    Some(row) => Ok(row.try_get("artifact_id").map_err(backend)?),
                    None => Err(self.refusal(lease, LeaseError::NotOwner).await),
                }
            })
            .await
    }

    async fn fail(&self, lease: &LeaseGrant, code: &str) -> Result<(), LeaseError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&lease.job_id, &lease.owner, &lease.token.get(), &code];
                if self.query(&self.inner.sql.fail, &params).await?.is_empty() {
                    return Err(self.refusal(lease, LeaseError::NotOwner).await);
                }
                Ok(())
            })
            .await
    }
}

impl JobReader for PostgresJobStore {
    async fn job(&self, tenant: &str, job_id: &str) -> Result<Option<Job>, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let rows = self.query(&self.inner.sql.job, &[&job_id, &tenant]).await?;
                rows.first().map(decode_job).transpose()
            })
            .await
    }

    async fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> Result<Option<Vec<Chunk>>, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                if self.job(tenant, job_id).await?.is_none() {
                    return Ok(None);
                }
                let from = i64::try_from(from_seq).unwrap_or(i64::MAX);
                let rows = self
                    .query(&self.inner.sql.chunks, &[&job_id, &from])
                    .await?;
                rows.iter()
                    .map(|row| {
                        let seq: i64 = row.try_get(0).map_err(backend)?;
                        let data: Vec<u8> = row.try_get(1).map_err(backend)?;
                        let attempt: i64 = row.try_get(2).map_err(backend)?;
                        Ok(Chunk {
                            attempt: attempt as u64,
                            seq: seq as u64,
                            data: Bytes::from(data),
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(Some)
            })
            .await
    }

    async fn artifact(&self, tenant: &str, job_id: &str) -> Result<ArtifactLookup, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let rows = self.query(&self.inner.sql.artifact, &[&job_id]).await?;
                let Some(row) = rows.first() else {
                    return Ok(ArtifactLookup::Unknown);
                };
                let owner: String = row.try_get(0).map_err(backend)?;
                if owner != tenant {
                    return Ok(ArtifactLookup::OtherTenant);
                }
                let artifact: Option<Vec<u8>> = row.try_get(2).map_err(backend)?;
                Ok(match artifact {
                    Some(bytes) => ArtifactLookup::Found(Bytes::from(bytes)),
                    None => {
                        let status: String = row.try_get(1).map_err(backend)?;
                        ArtifactLookup::NotReady(
                            JobStatus::parse(&status).unwrap_or(JobStatus::Queued),
                        )
                    }
                })
            })
            .await
    }
}

impl JobMaintenance for PostgresJobStore {
    async fn sweep_stale(&self) -> Result<u64, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let client = self.client().await?;
                client
                    .execute(&self.inner.sql.sweep_stale, &[])
                    .await
                    .map_err(backend)
            })
            .await
    }

    async fn reset_budget(&self, tenant: &str, period: BudgetPeriod) -> Result<u64, JobStoreError> {
        self.inner
            .settings
            .timed(OPERATION, async {
                let unit = period_unit(period);
                let client = self.client().await?;
                client
                    .execute(&self.inner.sql.reset_budget, &[&tenant, &unit])
                    .await
                    .map_err(backend)
            })
            .await
    }

    async fn purge_finished(&self, older_than: Duration) -> Result<u64, JobStoreError> {
        let millis = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        self.purge_batches(&self.inner.sql.purge_finished, &millis)
            .await
    }

    async fn purge_tenant(&self, tenant: &str) -> Result<u64, JobStoreError> {
        self.purge_batches(&self.inner.sql.purge_tenant, &tenant)
            .await
    }
}

/// Statement texts of one job store, built from its validated names.
struct JobSql {
    migrations: Vec<String>,
    budget_lock: String,
    job_lock: String,
    current: String,
    budget_count: String,
    acquire_count: String,
    budget_reset_at: String,
    create: String,
    steal: String,
    acquire_tenant: String,
    acquire_lock: String,
    acquire: String,
    heartbeat: String,
    append: String,
    finalize: String,
    fail: String,
    exists: String,
    job: String,
    chunks: String,
    artifact: String,
    sweep_stale: String,
    reset_budget: String,
    purge_finished: String,
    purge_tenant: String,
}

impl JobSql {
    fn new(schema: &str, table: &str, lease: Duration) -> Self {
        let t = format!(r#""{schema}"."{table}""#);
        let chunks_table = format!(r#""{schema}"."{}""#, derived_name(table, "chunks"));
        let seq = format!(r#""{schema}"."{}""#, derived_name(table, "token_seq"));
        let old_live_idx = derived_name(table, "live_key_idx");
        let live_idx = derived_name(table, "live_identity_idx");
        let tenant_idx = derived_name(table, "tenant_idx");
        let ended_idx = derived_name(table, "ended_idx");
        let lease_ms = lease.as_millis().min(i64::MAX as u128 / 1000);
        let expires = format!("now() + interval '{lease_ms} milliseconds'");
        let live = "status IN ('queued', 'running') AND lease_expires_at > now()";
        let fenced = "job_id = $1 AND lease_owner = $2 AND lease_token = $3";
        let period_start = "date_trunc($2, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'";
        let budget_count = format!(
            "SELECT coalesce(sum(cost), 0)::bigint FROM {t} WHERE tenant = $1 AND NOT budget_reset \
             AND period_started_at >= {period_start} \
             AND (status = 'complete' OR ({live}))"
        );
        Self {
            migrations: vec![
                // 1: the first release, keyed by one joined string (adopted
                // as it is where it exists).
                format!(
                    r#"CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint;
CREATE TABLE IF NOT EXISTS {t} (
    job_id            text        PRIMARY KEY
                      DEFAULT 'job_' || replace(gen_random_uuid()::text, '-', ''),
    tenant            text        NOT NULL,
    natural_key       text        NOT NULL,
    status            text        NOT NULL
                      CHECK (status IN ('queued', 'running', 'complete', 'failed')),
    lease_owner       text,
    lease_token       bigint      NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    attempt           bigint      NOT NULL DEFAULT 1,
    next_seq          bigint      NOT NULL DEFAULT 0,
    cursor_len        bigint      NOT NULL DEFAULT 0,
    artifact_id       text,
    artifact          bytea,
    error_code        text,
    budget_reset      boolean     NOT NULL DEFAULT false,
    period_started_at timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS "{old_live_idx}" ON {t} (natural_key) WHERE status <> 'failed';
CREATE INDEX IF NOT EXISTS "{tenant_idx}" ON {t} (tenant, period_started_at);
CREATE TABLE IF NOT EXISTS {chunks_table} (
    job_id text   NOT NULL REFERENCES {t} (job_id) ON DELETE CASCADE,
    seq    bigint NOT NULL,
    data   bytea  NOT NULL,
    PRIMARY KEY (job_id, seq)
);"#
                ),
                // 2: a job is (tenant, kind, key), three columns under one
                // unique index. Jobs of the first release get their key back
                // without the tenant prefix and the empty kind, which no layer
                // uses: later starts create new jobs, never join one across
                // the upgrade. Dropping the joined column drops its index.
                format!(
                    r#"ALTER TABLE {t} ADD COLUMN kind text NOT NULL DEFAULT '';
ALTER TABLE {t} ALTER COLUMN kind DROP DEFAULT;
ALTER TABLE {t} ADD COLUMN key text;
UPDATE {t} SET key = CASE WHEN starts_with(natural_key, tenant || ':')
                          THEN substr(natural_key, length(tenant) + 2)
                          ELSE natural_key END;
ALTER TABLE {t} ALTER COLUMN key SET NOT NULL;
ALTER TABLE {t} DROP COLUMN natural_key;
CREATE UNIQUE INDEX "{live_idx}" ON {t} (tenant, kind, key) WHERE status <> 'failed';
CREATE INDEX "{ended_idx}" ON {t} (updated_at) WHERE status IN ('complete', 'failed');"#
                ),
                // 3: weighted budgets. Every job reserves its cost in units
                // (1 for the jobs of before, which counted one each).
                format!(r#"ALTER TABLE {t} ADD COLUMN cost bigint NOT NULL DEFAULT 1;"#),
                // 4: the budget a job was started under, which an `acquire`
                // reviving it checks again (NULL: none, as for the jobs of
                // before, which an `acquire` hands over unchecked).
                format!(
                    r#"ALTER TABLE {t} ADD COLUMN budget_allowance bigint,
    ADD COLUMN budget_period text CHECK (budget_period IN ('day', 'month'));"#
                ),
            ],
            // Lock keys are hashes, chained over the separate fields; a collision
            // only serialises two starts, the job itself is found column by column.
            budget_lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 1))".to_owned(),
            job_lock: "SELECT pg_advisory_xact_lock(hashtextextended($3, \
                       hashtextextended($2, hashtextextended($1, 2))))"
                .to_owned(),
            current: format!(
                "SELECT {JOB_COLUMNS}, lease_token, ({live}) AS live FROM {t} \
                 WHERE tenant = $1 AND kind = $2 AND key = $3 AND status <> 'failed'"
            ),
            // The job an `acquire` revives is not counted, however late
            // its lease ran out after the transaction's start.
            acquire_count: format!("{budget_count} AND job_id <> $3"),
            budget_count,
            // The first instant of the next UTC day or month, on the database clock.
            budget_reset_at: "SELECT to_char(next, 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                 ceil(extract(epoch FROM (next AT TIME ZONE 'UTC') - now()))::bigint \
                 FROM (SELECT date_trunc($1, now() AT TIME ZONE 'UTC') + ('1 ' || $1)::interval \
                 AS next) n"
                .to_owned(),
            create: format!(
                "INSERT INTO {t} (tenant, kind, key, status, lease_owner, lease_token, \
                 lease_expires_at, cost, budget_allowance, budget_period) \
                 VALUES ($1, $2, $3, 'queued', $4, nextval('{seq}'), {expires}, $5, $6, $7) \
                 RETURNING {JOB_COLUMNS}, lease_token"
            ),
            // The dead worker's partial cursor is dropped with its lease.
            steal: format!(
                "WITH gone AS (DELETE FROM {chunks_table} WHERE job_id = $1) \
                 UPDATE {t} SET status = 'queued', lease_owner = $2, \
                 lease_token = nextval('{seq}'), lease_expires_at = {expires}, next_seq = 0, \
                 attempt = attempt + 1, cost = $3, budget_allowance = $4, budget_period = $5, \
                 cursor_len = 0, budget_reset = false, period_started_at = now(), \
                 updated_at = now() \
                 WHERE job_id = $1 AND status IN ('queued', 'running') \
                 AND lease_expires_at <= now() \
                 RETURNING {JOB_COLUMNS}, lease_token"
            ),
            acquire_tenant: format!(
                "SELECT tenant FROM {t} WHERE job_id = $1 AND status IN ('queued', 'running')"
            ),
            // After the budget lock: expiry on the clock of now, not of the
            // transaction's start, since a lease that expired while this
            // waited was not counted by the start that held the lock. Only a
            // running job under an expired lease is a takeover; a queued job
            // is handed over as it is, whatever its starter's lease says.
            acquire_lock: format!(
                "SELECT lease_expires_at <= at AS expired, \
                 status = 'running' AND lease_expires_at <= at AS takeover, \
                 cost, budget_allowance, budget_period \
                 FROM {t} j, (SELECT clock_timestamp() AS at) c \
                 WHERE job_id = $1 AND (status = 'queued' \
                 OR (status = 'running' AND lease_expires_at <= at)) FOR UPDATE OF j"
            ),
            // $3: a takeover, whose dead worker's cursor goes; $4: the lease
            // had expired, so the job is reserved again in this period.
            acquire: format!(
                "WITH gone AS (DELETE FROM {chunks_table} WHERE job_id = $1 AND $3) \
                 UPDATE {t} SET status = 'running', lease_owner = $2, \
                 lease_token = nextval('{seq}'), \
                 lease_expires_at = clock_timestamp() + interval '{lease_ms} milliseconds', \
                 next_seq = CASE WHEN $3 THEN 0 ELSE next_seq END, \
                 attempt = CASE WHEN $3 THEN attempt + 1 ELSE attempt END, \
                 cursor_len = CASE WHEN $3 THEN 0 ELSE cursor_len END, \
                 period_started_at = CASE WHEN $4 THEN now() ELSE period_started_at END, \
                 budget_reset = budget_reset AND NOT $4, \
                 updated_at = now() \
                 WHERE job_id = $1 RETURNING lease_token"
            ),
            heartbeat: format!(
                "UPDATE {t} SET lease_expires_at = {expires}, status = 'running', \
                 updated_at = now() WHERE {fenced} AND {live} RETURNING 1"
            ),
            append: format!(
                "WITH j AS (SELECT next_seq FROM {t} WHERE {fenced} AND {live} FOR UPDATE), \
                 ins AS (INSERT INTO {chunks_table} (job_id, seq, data) \
                 SELECT $1, $4::bigint, $5::bytea FROM j WHERE j.next_seq = $4::bigint RETURNING 1), \
                 upd AS (UPDATE {t} SET next_seq = next_seq + 1, \
                 cursor_len = cursor_len + length($5::bytea), status = 'running', updated_at = now() \
                 WHERE job_id = $1 AND EXISTS (SELECT 1 FROM ins) RETURNING next_seq) \
                 SELECT j.next_seq AS before, (SELECT next_seq FROM upd) AS after FROM j"
            ),
            // A retried finalize by the same owner matches the completed row and
            // returns its artifact id without storing anything.
            finalize: format!(
                "WITH done AS (UPDATE {t} SET status = 'complete', artifact = $4, \
                 artifact_id = 'art_' || substr(job_id, 5), updated_at = now() \
                 WHERE {fenced} AND {live} RETURNING artifact_id) \
                 SELECT artifact_id FROM done \
                 UNION ALL SELECT artifact_id FROM {t} \
                 WHERE {fenced} AND status = 'complete' AND NOT EXISTS (SELECT 1 FROM done)"
            ),
            fail: format!(
                "UPDATE {t} SET status = 'failed', error_code = $4, updated_at = now() \
                 WHERE {fenced} AND status IN ('queued', 'running') RETURNING 1"
            ),
            exists: format!("SELECT 1 FROM {t} WHERE job_id = $1"),
            job: format!("SELECT {JOB_COLUMNS} FROM {t} WHERE job_id = $1 AND tenant = $2"),
            chunks: format!(
                "SELECT c.seq, c.data, j.attempt FROM {chunks_table} c JOIN {t} j USING (job_id) \
                 WHERE c.job_id = $1 AND c.seq >= $2 ORDER BY c.seq"
            ),
            artifact: format!("SELECT tenant, status, artifact FROM {t} WHERE job_id = $1"),
            sweep_stale: format!(
                "UPDATE {t} SET status = 'failed', error_code = 'stale', updated_at = now() \
                 WHERE status IN ('queued', 'running') AND lease_expires_at <= now()"
            ),
            // Chunks go with their job (ON DELETE CASCADE).
            purge_finished: format!(
                "DELETE FROM {t} WHERE job_id IN (SELECT job_id FROM {t} \
                 WHERE status IN ('complete', 'failed') \
                 AND updated_at <= now() - $1::bigint * interval '1 millisecond' \
                 LIMIT {PURGE_BATCH} FOR UPDATE SKIP LOCKED)"
            ),
            purge_tenant: format!(
                "DELETE FROM {t} WHERE job_id IN (SELECT job_id FROM {t} \
                 WHERE tenant = $1 LIMIT {PURGE_BATCH} FOR UPDATE)"
            ),
            reset_budget: format!(
                "UPDATE {t} SET budget_reset = true WHERE tenant = $1 AND NOT budget_reset \
                 AND period_started_at >= {period_start}"
            ),
        }
    }
}
