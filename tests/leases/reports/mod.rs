//! The harness of the reports demo tests (`reports_*.rs` beside this
//! folder): the app that `cargo run --example reports` serves, mounted on a
//! real loopback HTTP server over a job store that counts `start` calls, for
//! every store.
//!
//! Scenarios are `async fn name(backend: Backend)`; [`for_each_store!`] turns
//! them into `memory::name` (always) and `postgres::name` (with
//! `--features postgres`: a fresh table per store, skipping loudly without
//! `DATABASE_URL`, failing under `REQUIRE_POSTGRES=1`).
#![allow(dead_code)]

// The example's own source (an example is no crate to depend on): what
// users run is what these tests drive.
#[path = "../../../examples/reports/app.rs"]
pub mod app;
pub(crate) use tower_idempotency_tests::http as client;
pub mod script;
#[cfg(feature = "postgres")]
pub(crate) use tower_idempotency_tests::support;

use app::{Config, Worker};
use bytes::Bytes;
use client::{serve, HttpClient, Reply};
use serde_json::{json, Value};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::lease::store::{AnyJobStore, JobStoreError, MemoryJobStore};
use tower_idempotency::lease::store::{
    Appended, ArtifactLookup, Budget, BudgetPeriod, Chunk, Job, JobMaintenance, JobReader,
    JobStore, LeaseError, LeaseGrant, StartJob, StartOutcome,
};

pub const START: &str = "/reports/start";
/// A correctness bound for anything that waits, never a speed assertion.
pub const PATIENCE: Duration = Duration::from_secs(20);
pub const LONG_LEASE: Duration = Duration::from_secs(30);
/// Short enough to wait out, long enough for a worker's few requests to fit
/// in it even against PostgreSQL on a busy machine.
pub const SHORT_LEASE: Duration = Duration::from_millis(1000);
/// Longer than `SHORT_LEASE`: the lease has expired after this sleep.
pub const PAST_SHORT_LEASE: Duration = Duration::from_millis(1300);

/// Runs each scenario `async fn name(backend: Backend)` against every store:
/// `memory::name`, and `postgres::name` with `--features postgres`. Each
/// scenario is listed with its test attribute(s).
macro_rules! for_each_store {
    ($($(#[$attr:meta])+ $name:ident),+ $(,)?) => {
        mod memory {
            $(
                $(#[$attr])+
                async fn $name() {
                    super::$name($crate::reports::Backend::Memory).await
                }
            )+
        }

        #[cfg(feature = "postgres")]
        mod postgres {
            $(
                $(#[$attr])+
                async fn $name() {
                    let test = concat!("postgres::", stringify!($name));
                    let Some(backend) = $crate::reports::Backend::postgres(test) else {
                        return;
                    };
                    super::$name(backend).await
                }
            )+
        }
    };
}

/// Where a scenario's jobs live.
#[derive(Clone, Debug)]
pub enum Backend {
    /// `MemoryJobStore`.
    Memory,
    /// `PostgresJobStore` on `DATABASE_URL`, a fresh table per store.
    #[cfg(feature = "postgres")]
    Postgres { url: String },
}

impl Backend {
    /// PostgreSQL, or `None` after a loud skip (a panic under `REQUIRE_POSTGRES=1`).
    #[cfg(feature = "postgres")]
    pub fn postgres(test: &str) -> Option<Self> {
        support::pg::database_url(test).map(|url| Self::Postgres { url })
    }

    /// A new, empty job store with `lease`.
    pub async fn store(&self, lease: Duration) -> AnyJobStore {
        match self {
            Self::Memory => AnyJobStore::new(MemoryJobStore::builder().with_lease(lease).build()),
            #[cfg(feature = "postgres")]
            Self::Postgres { url } => {
                use support::pg;
                use tower_idempotency::lease::store::PostgresJobStore;
                let store = PostgresJobStore::builder(pg::pool(pg::pg_config(url), 16))
                    .with_table(pg::unique_table("reports").parse().unwrap())
                    .with_lease(lease)
                    .build();
                store.migrate().await.expect("migrate the job store");
                AnyJobStore::new(store)
            }
        }
    }
}

/// A job store that counts what `start` did, so tests can prove a reader
/// inserted nothing and started nothing. Wraps any store.
pub struct Counting {
    inner: AnyJobStore,
    pub starts: AtomicUsize,
    pub created: AtomicUsize,
}

impl Counting {
    pub fn new(inner: AnyJobStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            starts: AtomicUsize::new(0),
            created: AtomicUsize::new(0),
        })
    }
}

impl JobStore for Counting {
    fn lease_duration(&self) -> Duration {
        self.inner.lease_duration()
    }

    async fn start(&self, request: &StartJob<'_>) -> Result<StartOutcome, JobStoreError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.start(request).await?;
        if let StartOutcome::Created(..) = outcome {
            self.created.fetch_add(1, Ordering::SeqCst);
        }
        Ok(outcome)
    }

    async fn acquire(
        &self,
        job_id: &str,
        owner: &str,
    ) -> Result<Option<LeaseGrant>, JobStoreError> {
        self.inner.acquire(job_id, owner).await
    }

    async fn heartbeat(&self, lease: &LeaseGrant) -> Result<(), LeaseError> {
        self.inner.heartbeat(lease).await
    }

    async fn append(
        &self,
        lease: &LeaseGrant,
        seq: u64,
        chunk: Bytes,
    ) -> Result<Appended, LeaseError> {
        self.inner.append(lease, seq, chunk).await
    }

    async fn finalize(&self, lease: &LeaseGrant, artifact: Bytes) -> Result<String, LeaseError> {
        self.inner.finalize(lease, artifact).await
    }

    async fn fail(&self, lease: &LeaseGrant, code: &str) -> Result<(), LeaseError> {
        self.inner.fail(lease, code).await
    }
}

impl JobReader for Counting {
    async fn job(&self, tenant: &str, job_id: &str) -> Result<Option<Job>, JobStoreError> {
        self.inner.job(tenant, job_id).await
    }

    async fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> Result<Option<Vec<Chunk>>, JobStoreError> {
        self.inner.chunks(tenant, job_id, from_seq).await
    }

    async fn artifact(&self, tenant: &str, job_id: &str) -> Result<ArtifactLookup, JobStoreError> {
        self.inner.artifact(tenant, job_id).await
    }
}

impl JobMaintenance for Counting {
    async fn sweep_stale(&self) -> Result<u64, JobStoreError> {
        self.inner.sweep_stale().await
    }

    async fn reset_budget(&self, tenant: &str, period: BudgetPeriod) -> Result<u64, JobStoreError> {
        self.inner.reset_budget(tenant, period).await
    }

    async fn purge_finished(&self, older_than: Duration) -> Result<u64, JobStoreError> {
        self.inner.purge_finished(older_than).await
    }

    async fn purge_tenant(&self, tenant: &str) -> Result<u64, JobStoreError> {
        self.inner.purge_tenant(tenant).await
    }
}

/// The demo over loopback HTTP, and its store.
pub struct Demo {
    pub client: HttpClient,
    pub store: Arc<Counting>,
}

pub struct Opts {
    pub lease: Duration,
    pub worker: Worker,
    pub budget: Option<Budget>,
    pub token_cap: Option<u64>,
    pub provider_failure: Option<app::ProviderFailure>,
    pub provider_gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            lease: LONG_LEASE,
            worker: Worker::Off,
            budget: None,
            token_cap: None,
            provider_failure: None,
            provider_gate: None,
        }
    }
}

pub fn config(opts: &Opts) -> Config {
    Config {
        worker: opts.worker,
        budget: opts.budget,
        token_cap: opts
            .token_cap
            .map(|cap| NonZeroU64::new(cap).expect("a test's cap is not zero")),
        provider_failure: opts.provider_failure,
        provider_gate: opts.provider_gate.clone(),
        admin_token: "admin".into(),
        owner: Some("reports-api".into()),
    }
}

/// A new, empty counting store of `backend`.
pub async fn counting(backend: &Backend, lease: Duration) -> Arc<Counting> {
    Counting::new(backend.store(lease).await)
}

pub async fn demo_with(backend: &Backend, opts: Opts) -> Demo {
    let store = counting(backend, opts.lease).await;
    let addr = serve(app::router(AnyJobStore::new(store.clone()), config(&opts))).await;
    Demo {
        client: HttpClient::new(addr),
        store,
    }
}

/// External workers only (`REPORT_WORKER=off`), 30 s leases, no budget.
pub async fn demo(backend: &Backend) -> Demo {
    demo_with(backend, Opts::default()).await
}

/// External workers only, [`SHORT_LEASE`].
pub async fn short_lease_demo(backend: &Backend) -> Demo {
    let opts = Opts {
        lease: SHORT_LEASE,
        ..Opts::default()
    };
    demo_with(backend, opts).await
}

pub fn bearer(tenant: &str) -> String {
    format!("Bearer {tenant}")
}

pub fn report(kind: &str, period: &str) -> String {
    json!({ "report_type": kind, "period": period }).to_string()
}

pub fn health(period: &str) -> String {
    report("customer_health", period)
}

/// A start that created or stole its job: the start table's `200` with
/// `created` (or `stolen`) in the body.
pub fn started(reply: &Reply) -> bool {
    let body = reply.json();
    reply.status == 200 && (body["created"] == true || body["stolen"] == true)
}

impl Demo {
    pub async fn start(&self, tenant: &str, body: &str) -> Reply {
        let auth = bearer(tenant);
        self.client
            .post_json(START, &[("authorization", &auth)], body)
            .await
    }

    /// Starts and returns the job id, asserting `expected` status.
    pub async fn start_id(&self, tenant: &str, body: &str, expected: u16) -> String {
        let reply = self.start(tenant, body).await;
        assert_eq!(reply.status, expected, "{}", text(&reply));
        reply.json()["job_id"].as_str().unwrap().to_owned()
    }

    /// All these starts at once, each on its own task and connection.
    pub async fn start_all(&self, tenant: &str, bodies: Vec<String>) -> Vec<Reply> {
        let tasks: Vec<_> = bodies
            .into_iter()
            .map(|body| {
                let client = self.client.clone();
                let auth = bearer(tenant);
                tokio::spawn(async move {
                    client
                        .post_json(START, &[("authorization", &auth)], &body)
                        .await
                })
            })
            .collect();
        let mut replies = Vec::new();
        for task in tasks {
            replies.push(task.await.unwrap());
        }
        replies
    }

    pub async fn get(&self, tenant: &str, path: &str) -> Reply {
        let auth = bearer(tenant);
        self.client.get(path, &[("authorization", &auth)]).await
    }

    pub async fn job(&self, tenant: &str, job: &str) -> Value {
        let reply = self.get(tenant, &format!("/reports/{job}")).await;
        assert_eq!(reply.status, 200, "{}", text(&reply));
        reply.json()
    }

    /// `GET /reports/{job}/cursor{query}`, asserting 200.
    pub async fn cursor(&self, tenant: &str, job: &str, query: &str) -> Value {
        let reply = self
            .get(tenant, &format!("/reports/{job}/cursor{query}"))
            .await;
        assert_eq!(reply.status, 200, "{query}: {}", text(&reply));
        reply.json()
    }

    pub async fn acquire(&self, tenant: &str, job: &str, worker: &str) -> Reply {
        let auth = bearer(tenant);
        let headers = [("authorization", auth.as_str()), ("x-worker-id", worker)];
        let path = format!("/reports/{job}/acquire");
        self.client.post_json(&path, &headers, "").await
    }

    /// Acquires and returns the fencing token.
    pub async fn acquire_token(&self, tenant: &str, job: &str, worker: &str) -> i64 {
        let reply = self.acquire(tenant, job, worker).await;
        assert_eq!(reply.status, 200, "{}", text(&reply));
        assert_eq!(reply.json()["owner"], worker);
        reply.json()["token"].as_i64().unwrap()
    }

    /// `POST /reports/{job}/{op}` as `worker` holding `token`.
    pub async fn worker(
        &self,
        tenant: &str,
        job: &str,
        op: &str,
        worker: &str,
        token: i64,
        body: &str,
    ) -> Reply {
        let auth = bearer(tenant);
        let token = token.to_string();
        let headers = [
            ("authorization", auth.as_str()),
            ("x-worker-id", worker),
            ("x-lease-token", token.as_str()),
        ];
        let path = format!("/reports/{job}/{op}");
        self.client.post_json(&path, &headers, body).await
    }

    pub async fn append(
        &self,
        tenant: &str,
        job: &str,
        worker: &str,
        token: i64,
        seq: u64,
        chunk: &str,
    ) -> Reply {
        let body = json!({ "seq": seq, "chunk": chunk }).to_string();
        self.worker(tenant, job, "append", worker, token, &body)
            .await
    }

    /// Appends, asserting the chunk was added.
    pub async fn append_ok(
        &self,
        tenant: &str,
        job: &str,
        worker: &str,
        token: i64,
        seq: u64,
        chunk: &str,
    ) {
        let reply = self.append(tenant, job, worker, token, seq, chunk).await;
        assert_eq!(reply.status, 200, "append {seq}: {}", text(&reply));
        assert_eq!(
            reply.json()["added"],
            true,
            "append {seq}: {}",
            text(&reply)
        );
    }

    /// The whole event stream of a job (it ends when the job does).
    pub async fn events(&self, tenant: &str, job: &str, last_event_id: Option<&str>) -> Reply {
        let path = format!("/reports/{job}/events");
        self.events_at(tenant, &path, last_event_id).await
    }

    /// The whole event stream at `path` (which may carry a query).
    pub async fn events_at(&self, tenant: &str, path: &str, last_event_id: Option<&str>) -> Reply {
        let auth = bearer(tenant);
        let mut headers = vec![("authorization", auth.as_str())];
        if let Some(id) = last_event_id {
            headers.push(("last-event-id", id));
        }
        let read = self.client.get(path, &headers);
        tokio::time::timeout(PATIENCE, read)
            .await
            .expect("the event stream ends when the job does")
    }

    /// Follows a job's events on a task of its own until the job ends.
    pub fn follow(
        &self,
        tenant: &str,
        job: &str,
        last_event_id: Option<&str>,
    ) -> tokio::task::JoinHandle<Reply> {
        let client = self.client.clone();
        let path = format!("/reports/{job}/events");
        let auth = bearer(tenant);
        let last_event_id = last_event_id.map(str::to_owned);
        tokio::spawn(async move {
            let mut headers = vec![("authorization", auth.as_str())];
            if let Some(id) = &last_event_id {
                headers.push(("last-event-id", id.as_str()));
            }
            tokio::time::timeout(PATIENCE, client.get(&path, &headers))
                .await
                .expect("the stream ends with the job")
        })
    }

    pub async fn wait_for_status(&self, tenant: &str, job: &str, status: &str) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let body = self.job(tenant, job).await;
            if body["status"] == status {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "job never became {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn starts(&self) -> usize {
        self.store.starts.load(Ordering::SeqCst)
    }

    pub fn created(&self) -> usize {
        self.store.created.load(Ordering::SeqCst)
    }
}

pub fn text(reply: &Reply) -> String {
    format!(
        "{} {}",
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned()
    )
}

pub fn location(reply: &Reply) -> String {
    reply
        .headers
        .get("location")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// One server-sent event.
#[derive(Debug)]
pub struct Sse {
    /// `id: {attempt}-{seq}`.
    pub id: Option<(u64, u64)>,
    pub event: String,
    pub data: Value,
}

pub fn parse_sse(body: &[u8]) -> Vec<Sse> {
    let text = std::str::from_utf8(body).expect("UTF-8 event stream");
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .filter(|block| !block.starts_with(':'))
        .map(|block| {
            let mut sse = Sse {
                id: None,
                event: "message".into(),
                data: Value::Null,
            };
            for line in block.lines() {
                let (field, value) = line.split_once(": ").unwrap_or((line, ""));
                match field {
                    "id" => {
                        let (attempt, seq) = value
                            .split_once('-')
                            .unwrap_or_else(|| panic!("id {value:?} is not ATTEMPT-SEQ"));
                        sse.id = Some((attempt.parse().unwrap(), seq.parse().unwrap()));
                    }
                    "event" => sse.event = value.to_owned(),
                    "data" => sse.data = serde_json::from_str(value).unwrap(),
                    other => panic!("unexpected SSE field {other:?} in {block:?}"),
                }
            }
            sse
        })
        .collect()
}

/// The `(attempt, seq)` ids of the chunk events.
pub fn chunk_ids(events: &[Sse]) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter(|e| e.event == "message")
        .map(|e| e.id.unwrap())
        .collect()
}

/// The event names, in order.
pub fn event_names(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

/// The concatenated chunk data of a cursor answer.
pub fn cursor_text(cursor: &Value) -> String {
    cursor["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["data"].as_str().unwrap())
        .collect()
}
