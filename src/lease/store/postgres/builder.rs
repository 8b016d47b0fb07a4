//! [`PostgresJobStoreBuilder`]: a
//! [`PostgresJobStore`](super::PostgresJobStore)'s configuration, consumed by
//! `build` (beside the store it makes).

use crate::store::postgres::SqlIdentifier;
use crate::store::settings::Settings;
use deadpool_postgres::Pool;
use std::time::Duration;

/// The configuration of a [`PostgresJobStore`](super::PostgresJobStore), from
/// [`PostgresJobStore::builder`](super::PostgresJobStore::builder): every
/// option is set here, and [`build`](Self::build) makes the store.
///
/// A clone of a builder builds a second store of its own on the same pool.
///
/// ```no_run
/// # async fn run(pool: deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_idempotency::lease::store::PostgresJobStore;
///
/// let jobs = PostgresJobStore::builder(pool)
///     .with_table("report_jobs".parse()?)
///     .with_lease(Duration::from_secs(45))
///     .build();
/// jobs.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until `build` makes the store"]
#[derive(Clone)]
pub struct PostgresJobStoreBuilder {
    pub(super) pool: Pool,
    pub(super) settings: Settings,
    pub(super) schema: String,
    pub(super) table: String,
}

impl std::fmt::Debug for PostgresJobStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresJobStoreBuilder")
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("lease", &self.settings.lock_timeout())
            .field("operation_timeout", &self.settings.operation_timeout())
            .finish_non_exhaustive()
    }
}

impl PostgresJobStoreBuilder {
    pub(super) fn new(pool: Pool) -> Self {
        Self {
            pool,
            settings: Settings::JOBS,
            schema: "public".to_owned(),
            table: "lease_jobs".to_owned(),
        }
    }

    /// The schema of the tables (default `public`); `migrate` creates it.
    ///
    /// A [`SqlIdentifier`] is a plain lower-case identifier, so a bad name is
    /// an `Err` where it is parsed: `.with_schema("reports".parse()?)`.
    pub fn with_schema(mut self, schema: SqlIdentifier) -> Self {
        self.schema = schema.as_str().to_owned();
        self
    }

    /// The jobs table (default `lease_jobs`); chunks go to `<table>_chunks`.
    ///
    /// A [`SqlIdentifier`] is a plain lower-case identifier, so a bad name is
    /// an `Err` where it is parsed: `.with_table("report_jobs".parse()?)`.
    pub fn with_table(mut self, table: SqlIdentifier) -> Self {
        self.table = table.as_str().to_owned();
        self
    }

    /// How long a lease lives without a heartbeat (default 45 s), on the
    /// database clock. Clamped to between 100 ms and 100 years.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.settings.set_lock_timeout(lease);
        self
    }

    /// The longest one operation may take, pool checkout included (default
    /// 5 s); slower ones fail with
    /// [`JobStoreError::Backend`](crate::lease::store::JobStoreError::Backend),
    /// which the lease layer answers `503 job_store_unavailable`.
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.settings.set_operation_timeout(timeout);
        self
    }
}
