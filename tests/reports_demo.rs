//! The reports demo over a real loopback HTTP server: every row of the seed's
//! decision matrix (`shared/seeds/lease-report-jobs.txt`), its six closing
//! checks, budgets, numbered appends, cursor and SSE resumption, the built-in
//! worker and the stale sweep. The app is the one `cargo run --example reports`
//! serves, mounted in-process over a store that counts `start` calls.

#[path = "../examples/reports/app.rs"]
mod app;
mod http;

use ::http::{Method, Request};
use app::{Config, Worker};
use async_trait::async_trait;
use bytes::Bytes;
use http::{serve, HttpClient, Reply};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::store::jobs::{
    Appended, ArtifactLookup, Budget, BudgetPeriod, Chunk, Job, JobStore, LeaseError, LeaseGrant,
    StartJob, StartOutcome,
};
use tower_idempotency::store::{MemoryJobStore, StoreError};

const START: &str = "/reports/start";
/// A correctness bound for anything that waits, never a speed assertion.
const PATIENCE: Duration = Duration::from_secs(20);
const LONG_LEASE: Duration = Duration::from_secs(30);
const SHORT_LEASE: Duration = Duration::from_millis(300);
/// Longer than `SHORT_LEASE`: the lease has expired after this sleep.
const PAST_SHORT_LEASE: Duration = Duration::from_millis(450);

/// A memory job store that counts what `start` did, so tests can prove a
/// reader inserted nothing and started nothing.
struct Counting {
    inner: MemoryJobStore,
    starts: AtomicUsize,
    created: AtomicUsize,
}

#[async_trait]
impl JobStore for Counting {
    fn lease_duration(&self) -> Duration {
        self.inner.lease_duration()
    }

    async fn start(&self, request: &StartJob<'_>) -> Result<StartOutcome, StoreError> {
        self.starts.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.start(request).await?;
        if let StartOutcome::Created(..) = outcome {
            self.created.fetch_add(1, Ordering::SeqCst);
        }
        Ok(outcome)
    }

    async fn acquire(&self, job_id: &str, owner: &str) -> Result<Option<LeaseGrant>, StoreError> {
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

    async fn job(&self, tenant: &str, job_id: &str) -> Result<Option<Job>, StoreError> {
        self.inner.job(tenant, job_id).await
    }

    async fn chunks(
        &self,
        tenant: &str,
        job_id: &str,
        from_seq: u64,
    ) -> Result<Option<Vec<Chunk>>, StoreError> {
        self.inner.chunks(tenant, job_id, from_seq).await
    }

    async fn artifact(&self, tenant: &str, job_id: &str) -> Result<ArtifactLookup, StoreError> {
        self.inner.artifact(tenant, job_id).await
    }

    async fn sweep_stale(&self) -> Result<u64, StoreError> {
        self.inner.sweep_stale().await
    }

    async fn reset_budget(&self, tenant: &str, period: BudgetPeriod) -> Result<u64, StoreError> {
        self.inner.reset_budget(tenant, period).await
    }
}

struct Demo {
    client: HttpClient,
    store: Arc<Counting>,
}

struct Opts {
    lease: Duration,
    worker: Worker,
    budget: Option<Budget>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            lease: LONG_LEASE,
            worker: Worker::Off,
            budget: None,
        }
    }
}

fn config(opts: &Opts) -> Config {
    Config {
        worker: opts.worker,
        budget: opts.budget,
        admin_token: "admin".into(),
        owner: Some("reports-api".into()),
    }
}

fn counting(lease: Duration) -> Arc<Counting> {
    Arc::new(Counting {
        inner: MemoryJobStore::new().with_lease(lease),
        starts: AtomicUsize::new(0),
        created: AtomicUsize::new(0),
    })
}

async fn demo_with(opts: Opts) -> Demo {
    let store = counting(opts.lease);
    let addr = serve(app::router(store.clone(), config(&opts))).await;
    Demo {
        client: HttpClient::new(addr),
        store,
    }
}

/// External workers only (`REPORT_WORKER=off`), 30 s leases, no budget.
async fn demo() -> Demo {
    demo_with(Opts::default()).await
}

fn bearer(tenant: &str) -> String {
    format!("Bearer {tenant}")
}

fn report(kind: &str, period: &str) -> String {
    json!({ "report_type": kind, "period": period }).to_string()
}

fn health(period: &str) -> String {
    report("customer_health", period)
}

impl Demo {
    async fn start(&self, tenant: &str, body: &str) -> Reply {
        let auth = bearer(tenant);
        self.client
            .post_json(START, &[("authorization", &auth)], body)
            .await
    }

    /// Starts and returns the job id, asserting `expected` status.
    async fn start_id(&self, tenant: &str, body: &str, expected: u16) -> String {
        let reply = self.start(tenant, body).await;
        assert_eq!(reply.status, expected, "{}", text(&reply));
        reply.json()["job_id"].as_str().unwrap().to_owned()
    }

    /// All these starts at once, each on its own task and connection.
    async fn start_all(&self, tenant: &str, bodies: Vec<String>) -> Vec<Reply> {
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

    async fn get(&self, tenant: &str, path: &str) -> Reply {
        let auth = bearer(tenant);
        self.client.get(path, &[("authorization", &auth)]).await
    }

    async fn job(&self, tenant: &str, job: &str) -> Value {
        let reply = self.get(tenant, &format!("/reports/{job}")).await;
        assert_eq!(reply.status, 200, "{}", text(&reply));
        reply.json()
    }

    async fn acquire(&self, tenant: &str, job: &str, worker: &str) -> Reply {
        let auth = bearer(tenant);
        let headers = [("authorization", auth.as_str()), ("x-worker-id", worker)];
        let path = format!("/reports/{job}/acquire");
        self.client.post_json(&path, &headers, "").await
    }

    /// Acquires and returns the fencing token.
    async fn acquire_token(&self, tenant: &str, job: &str, worker: &str) -> i64 {
        let reply = self.acquire(tenant, job, worker).await;
        assert_eq!(reply.status, 200, "{}", text(&reply));
        assert_eq!(reply.json()["owner"], worker);
        reply.json()["token"].as_i64().unwrap()
    }

    /// `POST /reports/{job}/{op}` as `worker` holding `token`.
    async fn worker(
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

    async fn append(
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

    async fn events(&self, tenant: &str, job: &str, last_event_id: Option<&str>) -> Reply {
        let auth = bearer(tenant);
        let mut headers = vec![("authorization", auth.as_str())];
        if let Some(id) = last_event_id {
            headers.push(("last-event-id", id));
        }
        let path = format!("/reports/{job}/events");
        let read = self.client.get(&path, &headers);
        tokio::time::timeout(PATIENCE, read)
            .await
            .expect("the event stream ends when the job does")
    }

    async fn wait_for_status(&self, tenant: &str, job: &str, status: &str) -> Value {
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

    fn starts(&self) -> usize {
        self.store.starts.load(Ordering::SeqCst)
    }

    fn created(&self) -> usize {
        self.store.created.load(Ordering::SeqCst)
    }
}

fn text(reply: &Reply) -> String {
    format!(
        "{} {}",
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned()
    )
}

fn location(reply: &Reply) -> String {
    reply
        .headers
        .get("location")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// One server-sent event.
#[derive(Debug)]
struct Sse {
    id: Option<u64>,
    event: String,
    data: Value,
}

fn parse_sse(body: &[u8]) -> Vec<Sse> {
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
                    "id" => sse.id = Some(value.parse().unwrap()),
                    "event" => sse.event = value.to_owned(),
                    "data" => sse.data = serde_json::from_str(value).unwrap(),
                    other => panic!("unexpected SSE field {other:?} in {block:?}"),
                }
            }
            sse
        })
        .collect()
}

fn chunk_ids(events: &[Sse]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e.event == "message")
        .map(|e| e.id.unwrap())
        .collect()
}

// The decision matrix, row by row.

#[tokio::test]
async fn matrix_no_row_creates_the_job_202_with_location() {
    let app = demo().await;
    let reply = app.start("acme", &health("2026-08")).await;
    assert_eq!(reply.status, 202, "{}", text(&reply));
    let body = reply.json();
    assert_eq!(body["created"], true);
    assert_eq!(body["status"], "queued");
    let job = body["job_id"].as_str().unwrap();
    assert_eq!(location(&reply), format!("/reports/{job}"));
    // The Location is where the job is read.
    let read = app.get("acme", &location(&reply)).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["job_id"], job);
    assert_eq!(read.json()["next_seq"], 0);
    assert_eq!(read.json()["cursor_len"], 0);
    assert_eq!(app.created(), 1);
}

#[tokio::test]
async fn matrix_live_lease_joins_the_same_job() {
    let app = demo().await;
    let first = app.start_id("acme", &health("2026-08"), 202).await;
    let again = app.start("acme", &health("2026-08")).await;
    assert_eq!(again.status, 200, "{}", text(&again));
    assert_eq!(again.json()["join"], true);
    assert_eq!(again.json()["job_id"], first.as_str());
    assert_eq!(location(&again), format!("/reports/{first}"));
    // A worker holding the lease: still a join, and the status says running.
    app.acquire_token("acme", &first, "w1").await;
    let third = app.start("acme", &health("2026-08")).await;
    assert_eq!(third.status, 200);
    assert_eq!(third.json()["join"], true);
    assert_eq!(third.json()["status"], "running");
    assert_eq!(third.json()["job_id"], first.as_str());
    assert_eq!(app.created(), 1);
}

#[tokio::test]
async fn matrix_complete_job_answers_its_artifact_id() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    app.append("acme", &job, "w1", token, 0, "# Report\n").await;
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let artifact_id = done.json()["artifact_id"].as_str().unwrap().to_owned();

    let again = app.start("acme", &health("2026-08")).await;
    assert_eq!(again.status, 200, "{}", text(&again));
    assert_eq!(again.json()["status"], "complete");
    assert_eq!(again.json()["job_id"], job.as_str());
    assert_eq!(again.json()["artifact_id"], artifact_id.as_str());
    assert_eq!(app.created(), 1);
}

#[tokio::test]
async fn matrix_expired_lease_is_stolen_same_job() {
    let app = demo_with(Opts {
        lease: SHORT_LEASE,
        ..Opts::default()
    })
    .await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let stolen = app.start("acme", &health("2026-08")).await;
    assert_eq!(stolen.status, 202, "{}", text(&stolen));
    assert_eq!(stolen.json()["stolen"], true);
    assert_eq!(stolen.json()["job_id"], job.as_str());
    assert_eq!(location(&stolen), format!("/reports/{job}"));
    assert_eq!(app.created(), 1);
}

#[tokio::test]
async fn matrix_body_naming_another_tenant_is_403_tenant_mismatch() {
    let app = demo().await;
    let body = json!({
        "report_type": "customer_health",
        "period": "2026-08",
        "claimed_tenant_id": "acme",
    });
    let reply = app.start("globex", &body.to_string()).await;
    assert_eq!(reply.status, 403, "{}", text(&reply));
    assert_eq!(reply.code(), "tenant_mismatch");
    assert_eq!(app.starts(), 0, "refused before the store is touched");
    // Claiming yourself is fine: evidence, never authority.
    let body = json!({
        "report_type": "customer_health",
        "period": "2026-08",
        "claimed_tenant_id": "globex",
    });
    assert_eq!(app.start("globex", &body.to_string()).await.status, 202);
}

#[tokio::test]
async fn matrix_heartbeat_from_another_worker_is_409_lease_lost() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    let foreign = app.worker("acme", &job, "heartbeat", "w2", token, "").await;
    assert_eq!(foreign.status, 409, "{}", text(&foreign));
    assert_eq!(foreign.code(), "lease_lost");
    let stale_token = app
        .worker("acme", &job, "heartbeat", "w1", token - 1, "")
        .await;
    assert_eq!(stale_token.status, 409);
    assert_eq!(stale_token.code(), "lease_lost");
    // The owner's heartbeat still works: the foreign one changed nothing.
    let own = app.worker("acme", &job, "heartbeat", "w1", token, "").await;
    assert_eq!(own.status, 200, "{}", text(&own));
    assert_eq!(own.json()["status"], "running");
    // Another worker cannot acquire a live lease either.
    let taken = app.acquire("acme", &job, "w2").await;
    assert_eq!(taken.status, 409);
    assert_eq!(taken.code(), "not_available");
}

#[tokio::test]
async fn matrix_append_after_expiry_is_409_lease_lost() {
    let app = demo_with(Opts {
        lease: SHORT_LEASE,
        ..Opts::default()
    })
    .await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let late = app.append("acme", &job, "w1", token, 0, "too late").await;
    assert_eq!(late.status, 409, "{}", text(&late));
    assert_eq!(late.code(), "lease_lost");
    let beat = app.worker("acme", &job, "heartbeat", "w1", token, "").await;
    assert_eq!(beat.status, 409);
    assert_eq!(beat.code(), "lease_lost");
    assert_eq!(app.job("acme", &job).await["cursor_len"], 0);
}

#[tokio::test]
async fn matrix_finalize_from_a_dead_owner_is_409_not_owner() {
    let app = demo_with(Opts {
        lease: SHORT_LEASE,
        ..Opts::default()
    })
    .await;
    // Taken over by another worker's acquire.
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let dead = app.acquire_token("acme", &job, "w1").await;
    let partial = app.append("acme", &job, "w1", dead, 0, "w1's draft").await;
    assert_eq!(partial.status, 200);
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let alive = app.acquire_token("acme", &job, "w2").await;
    assert!(alive > dead, "a takeover issues a higher token");
    let corpse = app.worker("acme", &job, "finalize", "w1", dead, "").await;
    assert_eq!(corpse.status, 409, "{}", text(&corpse));
    assert_eq!(corpse.code(), "not_owner");
    let corpse_fail = app
        .worker("acme", &job, "fail", "w1", dead, r#"{"code":"oops"}"#)
        .await;
    assert_eq!(corpse_fail.status, 409);
    assert_eq!(corpse_fail.code(), "not_owner");
    // The dead owner's partial cursor is gone; the live owner's result stands.
    assert_eq!(app.job("acme", &job).await["cursor_len"], 0);
    let own = app
        .append("acme", &job, "w2", alive, 0, "w2's report")
        .await;
    assert_eq!(own.status, 200, "{}", text(&own));
    let done = app.worker("acme", &job, "finalize", "w2", alive, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"w2's report");

    // Taken over by a start that stole the expired lease.
    let job = app.start_id("acme", &health("2026-09"), 202).await;
    let dead = app.acquire_token("acme", &job, "w1").await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let stolen = app.start("acme", &health("2026-09")).await;
    assert_eq!(stolen.json()["stolen"], true, "{}", text(&stolen));
    let corpse = app.worker("acme", &job, "finalize", "w1", dead, "").await;
    assert_eq!(corpse.status, 409);
    assert_eq!(corpse.code(), "not_owner");
}

#[tokio::test]
async fn matrix_other_tenants_artifact_is_403_tenant_mismatch() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let artifact = format!("/reports/{job}/artifact");
    let not_ready = app.get("acme", &artifact).await;
    assert_eq!(not_ready.status, 409, "{}", text(&not_ready));
    assert_eq!(not_ready.code(), "not_ready");
    let token = app.acquire_token("acme", &job, "w1").await;
    let done = app
        .worker("acme", &job, "finalize", "w1", token, "the report")
        .await;
    assert_eq!(done.status, 200, "{}", text(&done));

    let theirs = app.get("globex", &artifact).await;
    assert_eq!(theirs.status, 403, "{}", text(&theirs));
    assert_eq!(theirs.code(), "tenant_mismatch");
    let ours = app.get("acme", &artifact).await;
    assert_eq!(ours.status, 200);
    assert_eq!(&ours.body[..], b"the report");
    let unknown = app.get("acme", "/reports/job_nope/artifact").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.code(), "unknown_job");
}

// The six closing checks.

#[tokio::test]
async fn check_1_two_starts_with_one_key_return_one_job() {
    let app = demo().await;
    let aug = health("2026-08");
    let (a, b) = tokio::join!(app.start("acme", &aug), app.start("acme", &aug));
    assert_eq!(a.json()["job_id"], b.json()["job_id"]);
    let mut statuses = [a.status.as_u16(), b.status.as_u16()];
    statuses.sort();
    assert_eq!(statuses, [200, 202], "one creates, one joins");
    assert_eq!(app.created(), 1);
}

#[tokio::test]
async fn check_2_a_live_lease_rejects_a_foreign_finalize_with_409() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    // The layer's own lease (token 1, owner reports-api), before any worker.
    let foreign = app
        .worker("acme", &job, "finalize", "w2", 1, "forged")
        .await;
    assert_eq!(foreign.status, 409, "{}", text(&foreign));
    assert_eq!(foreign.code(), "not_owner");
    // A worker's live lease.
    let token = app.acquire_token("acme", &job, "w1").await;
    for (worker, token) in [("w2", token), ("w2", token + 1), ("w1", token + 1)] {
        let forged = app
            .worker("acme", &job, "finalize", worker, token, "forged")
            .await;
        assert_eq!(forged.status, 409, "{worker}/{token}: {}", text(&forged));
        assert_eq!(forged.code(), "not_owner");
    }
    let body = app.job("acme", &job).await;
    assert_eq!(body["status"], "running");
    assert!(body.get("artifact_id").is_none());
    let ok = app
        .worker("acme", &job, "finalize", "w1", token, "real")
        .await;
    assert_eq!(ok.status, 200, "{}", text(&ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_3_an_expired_lease_is_stolen_once_by_50_concurrent_starts() {
    // The stolen lease must outlive the 50 requests, so they can join it.
    let lease = Duration::from_secs(4);
    let app = demo_with(Opts {
        lease,
        ..Opts::default()
    })
    .await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;

    let replies = app.start_all("acme", vec![health("2026-08"); 50]).await;
    let stolen = replies
        .iter()
        .filter(|r| r.status == 202 && r.json()["stolen"] == true)
        .count();
    let joined = replies
        .iter()
        .filter(|r| r.status == 200 && r.json()["join"] == true)
        .count();
    assert_eq!(stolen, 1, "stolen exactly once");
    assert_eq!(joined, 49, "the rest join the thief's lease");
    for reply in &replies {
        assert_eq!(reply.json()["job_id"], job.as_str());
    }
    assert_eq!(app.created(), 1);
    assert_eq!(app.starts(), 51);
}

#[tokio::test]
async fn check_4_a_reconnect_reads_the_cursor_and_inserts_nothing() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    for (seq, chunk) in ["alpha ", "beta ", "gamma ", "delta "].iter().enumerate() {
        let reply = app
            .append("acme", &job, "w1", token, seq as u64, chunk)
            .await;
        assert_eq!(reply.status, 200, "{}", text(&reply));
    }
    let (starts, created) = (app.starts(), app.created());

    // By sequence number.
    let cursor = app
        .get("acme", &format!("/reports/{job}/cursor?from_seq=2"))
        .await;
    assert_eq!(cursor.status, 200, "{}", text(&cursor));
    let body = cursor.json();
    assert_eq!(
        body["chunks"],
        json!([{"seq": 2, "data": "gamma "}, {"seq": 3, "data": "delta "}])
    );
    assert_eq!(body["next_seq"], 4);
    assert_eq!(body["status"], "running");
    // By byte offset: "alpha beta " is 11 bytes; 13 is inside "gamma ".
    let cursor = app
        .get("acme", &format!("/reports/{job}/cursor?offset=13"))
        .await;
    let body = cursor.json();
    assert_eq!(
        body["chunks"],
        json!([
            {"seq": 2, "offset": 13, "data": "mma "},
            {"seq": 3, "offset": 17, "data": "delta "},
        ])
    );
    assert_eq!(body["next_offset"], 23);
    assert_eq!(body["next_seq"], 4);
    let both = app
        .get(
            "acme",
            &format!("/reports/{job}/cursor?offset=1&from_seq=1"),
        )
        .await;
    assert_eq!(both.status, 400);
    assert_eq!(both.code(), "invalid_query");

    // As server-sent events, resuming after seq 1 while the job is still running.
    let stream = {
        let client = app.client.clone();
        let path = format!("/reports/{job}/events");
        tokio::spawn(async move {
            let headers = [("authorization", "Bearer acme"), ("last-event-id", "1")];
            tokio::time::timeout(PATIENCE, client.get(&path, &headers))
                .await
                .expect("the stream ends with the job")
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.append("acme", &job, "w1", token, 4, "epsilon").await;
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let reply = stream.await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers.get("content-type").unwrap(),
        "text/event-stream"
    );
    let events = parse_sse(&reply.body);
    assert_eq!(chunk_ids(&events), [2, 3, 4]);
    assert_eq!(events[2].data, json!({"seq": 4, "data": "epsilon"}));
    let last = events.last().unwrap();
    assert_eq!(last.event, "done");
    assert_eq!(last.data["artifact_id"], done.json()["artifact_id"]);

    assert_eq!(app.starts(), starts, "reading never calls start");
    assert_eq!(app.created(), created, "reading never inserts a job");
}

#[tokio::test]
async fn check_5_download_checks_the_session_tenant() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    app.append("acme", &job, "w1", token, 0, "secret").await;
    app.worker("acme", &job, "finalize", "w1", token, "").await;

    assert_eq!(
        app.get("acme", &format!("/reports/{job}/artifact"))
            .await
            .status,
        200
    );
    let download = app.get("globex", &format!("/reports/{job}/artifact")).await;
    assert_eq!(download.status, 403);
    assert_eq!(download.code(), "tenant_mismatch");
    assert!(!String::from_utf8_lossy(&download.body).contains("secret"));
    // Every other reader of another tenant's job: 404, as if it did not exist.
    for path in ["", "/cursor", "/events"] {
        let reply = app.get("globex", &format!("/reports/{job}{path}")).await;
        assert_eq!(reply.status, 404, "{path}: {}", text(&reply));
        assert_eq!(reply.code(), "unknown_job");
    }
    // And the worker side: another tenant's session cannot touch the job.
    let acquire = app.acquire("globex", &job, "w9").await;
    assert_eq!(acquire.status, 404);
    let finalize = app
        .worker("globex", &job, "finalize", "w1", token, "x")
        .await;
    assert_eq!(finalize.status, 404);
    // Without a session: 401.
    let anonymous = app
        .client
        .get(&format!("/reports/{job}/artifact"), &[])
        .await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.code(), "unauthorized");
}

/// One request of a scripted sequence; `{job}` and `{token}` are filled in
/// from earlier answers.
struct Step {
    method: Method,
    path: &'static str,
    tenant: &'static str,
    worker: Option<&'static str>,
    body: String,
}

fn step(method: Method, path: &'static str, tenant: &'static str, body: String) -> Step {
    Step {
        method,
        path,
        tenant,
        worker: None,
        body,
    }
}

fn as_worker(worker: &'static str, mut step: Step) -> Step {
    step.worker = Some(worker);
    step
}

/// The start → join → refusals → worker → complete sequence.
fn script() -> Vec<Step> {
    let aug = health("2026-08");
    let claims_acme =
        json!({"report_type": "customer_health", "period": "2026-08", "claimed_tenant_id": "acme"});
    vec![
        step(Method::POST, START, "acme", aug.clone()),
        step(Method::POST, START, "acme", aug.clone()),
        step(Method::POST, START, "globex", claims_acme.to_string()),
        step(Method::POST, START, "acme", report("weather", "2026-08")),
        step(Method::POST, START, "acme", health("2026-8")),
        step(Method::GET, "/reports/{job}", "globex", String::new()),
        step(
            Method::GET,
            "/reports/{job}/artifact",
            "acme",
            String::new(),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/acquire",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w2",
            step(
                Method::POST,
                "/reports/{job}/acquire",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w2",
            step(
                Method::POST,
                "/reports/{job}/heartbeat",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":0,"chunk":"one "}"#.into(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":0,"chunk":"one "}"#.into(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":2,"chunk":"three"}"#.into(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/append",
                "acme",
                r#"{"seq":1,"chunk":"two"}"#.into(),
            ),
        ),
        as_worker(
            "w2",
            step(
                Method::POST,
                "/reports/{job}/finalize",
                "acme",
                String::new(),
            ),
        ),
        as_worker(
            "w1",
            step(
                Method::POST,
                "/reports/{job}/finalize",
                "acme",
                String::new(),
            ),
        ),
        step(Method::POST, START, "acme", aug),
        step(Method::GET, "/reports/{job}", "acme", String::new()),
        step(
            Method::GET,
            "/reports/{job}/cursor?from_seq=1",
            "acme",
            String::new(),
        ),
        step(
            Method::GET,
            "/reports/{job}/artifact",
            "globex",
            String::new(),
        ),
        step(
            Method::GET,
            "/reports/{job}/artifact",
            "acme",
            String::new(),
        ),
    ]
}

enum Transport {
    Http(HttpClient),
    InProcess(axum::Router),
}

impl Transport {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Reply {
        match self {
            Self::Http(client) => client.send(method, path, headers, body).await,
            Self::InProcess(router) => {
                let mut request = Request::builder().method(method).uri(path);
                for (name, value) in headers {
                    request = request.header(*name, *value);
                }
                let request = request.body(axum::body::Body::from(body)).unwrap();
                let response = router.clone().oneshot(request).await.unwrap();
                let (parts, body) = response.into_parts();
                Reply {
                    status: parts.status,
                    headers: parts.headers,
                    body: body.collect().await.unwrap().to_bytes(),
                }
            }
        }
    }
}

/// Runs the script; answers with job and artifact ids replaced by placeholders
/// (they are random), everything else as sent.
async fn run_script(transport: &Transport) -> Vec<(u16, String, String)> {
    let mut job = String::new();
    let mut token = String::new();
    let mut answers = Vec::new();
    for step in script() {
        let path = step.path.replace("{job}", &job);
        let auth = bearer(step.tenant);
        let mut headers = vec![
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ];
        if let Some(worker) = step.worker {
            headers.push(("x-worker-id", worker));
            headers.push(("x-lease-token", token.as_str()));
        }
        let reply = transport
            .send(step.method, &path, &headers, step.body)
            .await;
        if job.is_empty() {
            job = reply.json()["job_id"].as_str().unwrap().to_owned();
        }
        if path.ends_with("/acquire") && reply.status == 200 {
            token = reply.json()["token"].to_string();
        }
        let artifact = format!("art_{}", job.trim_start_matches("job_"));
        let normalise = |s: &str| s.replace(&artifact, "ART").replace(&job, "JOB");
        let body = normalise(&String::from_utf8_lossy(&reply.body));
        answers.push((reply.status.as_u16(), body, normalise(&location(&reply))));
    }
    answers
}

#[tokio::test]
async fn check_6_the_http_path_behaves_as_the_in_process_one() {
    let opts = Opts::default();
    let over_http = demo_with(Opts::default()).await;
    let in_process = app::router(counting(opts.lease), config(&opts));

    let http_answers = run_script(&Transport::Http(over_http.client.clone())).await;
    let local_answers = run_script(&Transport::InProcess(in_process)).await;
    assert_eq!(http_answers.len(), local_answers.len());
    for (i, (http, local)) in http_answers.iter().zip(&local_answers).enumerate() {
        assert_eq!(http, local, "step {i}: HTTP and in-process answers differ");
    }

    // And both agree with the job store called directly for the same sequence.
    let store = MemoryJobStore::new().with_lease(LONG_LEASE);
    let start = StartJob {
        tenant: "acme",
        natural_key: "acme:customer_health:2026-08",
        owner: "reports-api",
        budget: None,
    };
    let codes: Vec<u16> = http_answers.iter().map(|(status, ..)| *status).collect();
    let code_of = |i: usize| -> String {
        serde_json::from_str::<Value>(&http_answers[i].1).unwrap()["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let Ok(StartOutcome::Created(job, _)) = store.start(&start).await else {
        panic!("created")
    };
    assert_eq!(codes[0], 202);
    assert!(matches!(
        store.start(&start).await,
        Ok(StartOutcome::Joined(_))
    ));
    assert_eq!(codes[1], 200);
    assert_eq!(store.job("globex", &job.id).await.unwrap(), None);
    assert_eq!(codes[5], 404);
    assert!(matches!(
        store.artifact("acme", &job.id).await.unwrap(),
        ArtifactLookup::NotReady(_)
    ));
    assert_eq!((codes[6], code_of(6).as_str()), (409, "not_ready"));
    let w1 = store
        .acquire(&job.id, "w1")
        .await
        .unwrap()
        .expect("acquired");
    assert_eq!(codes[7], 200);
    assert!(store.acquire(&job.id, "w2").await.unwrap().is_none());
    assert_eq!((codes[8], code_of(8).as_str()), (409, "not_available"));
    let foreign = LeaseGrant {
        owner: "w2".into(),
        ..w1.clone()
    };
    let e = store.heartbeat(&foreign).await.unwrap_err();
    assert_eq!((codes[9], code_of(9).as_str()), (409, e.code()));
    assert_eq!(
        store.append(&w1, 0, Bytes::from("one ")).await.unwrap(),
        Appended::Added { next_seq: 1 }
    );
    assert_eq!(
        store.append(&w1, 0, Bytes::from("one ")).await.unwrap(),
        Appended::Duplicate { next_seq: 1 }
    );
    assert_eq!(codes[10..12], [200, 200]);
    let gap = store
        .append(&w1, 2, Bytes::from("three"))
        .await
        .unwrap_err();
    assert!(matches!(gap, LeaseError::SequenceGap { expected: 1 }));
    assert_eq!((codes[12], code_of(12).as_str()), (409, gap.code()));
    store.append(&w1, 1, Bytes::from("two")).await.unwrap();
    let e = store
        .finalize(&foreign, Bytes::from("x"))
        .await
        .unwrap_err();
    assert_eq!((codes[14], code_of(14).as_str()), (409, e.code()));
    store.finalize(&w1, Bytes::from("one two")).await.unwrap();
    assert_eq!(codes[15], 200);
    assert!(matches!(
        store.start(&start).await,
        Ok(StartOutcome::Completed(_))
    ));
    assert_eq!(codes[16], 200);
    assert_eq!(
        store.artifact("globex", &job.id).await.unwrap(),
        ArtifactLookup::OtherTenant
    );
    assert_eq!((codes[19], code_of(19).as_str()), (403, "tenant_mismatch"));
    assert_eq!(
        store.artifact("acme", &job.id).await.unwrap(),
        ArtifactLookup::Found(Bytes::from("one two"))
    );
    assert_eq!(http_answers[20], (200, "one two".into(), String::new()));
}

// Keys: what is one job and what is two.

#[tokio::test]
async fn unknown_report_type_and_malformed_period_are_400() {
    let app = demo().await;
    let reply = app.start("acme", &report("weather", "2026-08")).await;
    assert_eq!(reply.status, 400, "{}", text(&reply));
    assert_eq!(reply.code(), "unknown_report_type");
    for period in [
        "2026-8",
        "2026-13",
        "2026-00",
        "26-08",
        "2026/08",
        "2026-08-01",
    ] {
        let reply = app.start("acme", &health(period)).await;
        assert_eq!(reply.status, 400, "{period}: {}", text(&reply));
        assert_eq!(reply.code(), "invalid_period", "{period}");
    }
    let missing = app
        .start("acme", r#"{"report_type":"customer_health"}"#)
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.code(), "invalid_job_key");
    let not_json = app.start("acme", "report please").await;
    assert_eq!(not_json.status, 400);
    assert_eq!(app.starts(), 0, "refused before the store is touched");
    // The other known type works.
    assert_eq!(
        app.start("acme", &report("usage_summary", "2026-08"))
            .await
            .status,
        202
    );
    // No session: 401 before anything else.
    let anonymous = app.client.post_json(START, &[], &health("2026-08")).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.code(), "unauthorized");
    let bad_token = app
        .client
        .post_json(
            START,
            &[("authorization", "Bearer a b")],
            &health("2026-08"),
        )
        .await;
    assert_eq!(bad_token.status, 401);
}

#[tokio::test]
async fn august_and_september_are_two_jobs() {
    let app = demo().await;
    let august = app.start_id("acme", &health("2026-08"), 202).await;
    let september = app.start_id("acme", &health("2026-09"), 202).await;
    assert_ne!(august, september);
    let usage = app
        .start_id("acme", &report("usage_summary", "2026-08"), 202)
        .await;
    assert_ne!(usage, august, "another report type is another job");
    assert_eq!(app.created(), 3);
}

#[tokio::test]
async fn two_tenants_with_the_same_report_and_period_are_two_jobs() {
    let app = demo().await;
    let acme = app.start_id("acme", &health("2026-08"), 202).await;
    let globex = app.start_id("globex", &health("2026-08"), 202).await;
    assert_ne!(acme, globex);
    assert_eq!(app.job("acme", &acme).await["job_id"], acme.as_str());
    assert_eq!(
        app.get("acme", &format!("/reports/{globex}")).await.status,
        404
    );
}

// Budgets.

#[tokio::test]
async fn budget_counts_live_and_complete_jobs_not_failed_ones_and_reset_makes_room() {
    let app = demo_with(Opts {
        budget: Some(Budget::per_month(2)),
        ..Opts::default()
    })
    .await;
    let jan = app.start_id("acme", &health("2026-01"), 202).await;
    let feb = app.start_id("acme", &health("2026-02"), 202).await;
    let over = app.start("acme", &health("2026-03")).await;
    assert_eq!(over.status, 429, "{}", text(&over));
    assert_eq!(over.code(), "budget_exhausted");
    // Joining is free.
    let join = app.start("acme", &health("2026-02")).await;
    assert_eq!(join.status, 200);
    assert_eq!(join.json()["join"], true);
    // Budgets are per tenant.
    app.start_id("globex", &health("2026-03"), 202).await;

    // A failed job gives its place back.
    let token = app.acquire_token("acme", &jan, "w1").await;
    let failed = app
        .worker(
            "acme",
            &jan,
            "fail",
            "w1",
            token,
            r#"{"code":"model_error"}"#,
        )
        .await;
    assert_eq!(failed.status, 200, "{}", text(&failed));
    assert_eq!(failed.json()["status"], "failed");
    let job = app.job("acme", &jan).await;
    assert_eq!(job["error_code"], "model_error");
    let mar = app.start_id("acme", &health("2026-03"), 202).await;
    assert_eq!(app.start("acme", &health("2026-04")).await.status, 429);

    // A completed job keeps counting.
    let token = app.acquire_token("acme", &feb, "w1").await;
    let done = app
        .worker("acme", &feb, "finalize", "w1", token, "feb")
        .await;
    assert_eq!(done.status, 200);
    assert_eq!(app.start("acme", &health("2026-04")).await.status, 429);
    // Asking for the completed report again is free.
    assert_eq!(app.start("acme", &health("2026-02")).await.status, 200);

    // The operator reset: admin token only.
    let reset = json!({ "tenant": "acme" }).to_string();
    let anonymous = app
        .client
        .post_json("/admin/budget/reset", &[], &reset)
        .await;
    assert_eq!(anonymous.status, 401);
    let tenant = app
        .client
        .post_json(
            "/admin/budget/reset",
            &[("authorization", "Bearer acme")],
            &reset,
        )
        .await;
    assert_eq!(tenant.status, 403);
    assert_eq!(tenant.code(), "forbidden");
    let admin = app
        .client
        .post_json(
            "/admin/budget/reset",
            &[("authorization", "Bearer admin")],
            &reset,
        )
        .await;
    assert_eq!(admin.status, 200, "{}", text(&admin));
    assert_eq!(admin.json()["tenant"], "acme");
    assert_eq!(
        admin.json()["reset"],
        3,
        "january (failed), february, march"
    );
    app.start_id("acme", &health("2026-04"), 202).await;
    app.start_id("acme", &health("2026-05"), 202).await;
    assert_eq!(app.start("acme", &health("2026-06")).await.status, 429);
    // Nothing was deleted: the reset jobs still read and join as before.
    assert_eq!(app.job("acme", &mar).await["status"], "queued");
    assert_eq!(
        app.start("acme", &health("2026-03")).await.json()["join"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_cannot_overshoot_the_allowance() {
    let app = demo_with(Opts {
        budget: Some(Budget::per_month(2)),
        ..Opts::default()
    })
    .await;
    let bodies = (1..=12).map(|m| health(&format!("2025-{m:02}"))).collect();
    let replies = app.start_all("acme", bodies).await;
    let accepted = replies.iter().filter(|r| r.status == 202).count();
    let refused = replies
        .iter()
        .filter(|r| r.status == 429 && r.code() == "budget_exhausted")
        .count();
    assert_eq!((accepted, refused), (2, 10));
}

// The worker side.

#[tokio::test]
async fn appends_are_numbered_a_repeat_is_a_no_op_and_a_gap_is_409() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    let first = app.append("acme", &job, "w1", token, 0, "one ").await;
    assert_eq!(first.status, 200, "{}", text(&first));
    assert_eq!(first.json()["added"], true);
    assert_eq!(first.json()["next_seq"], 1);
    let repeat = app.append("acme", &job, "w1", token, 0, "one ").await;
    assert_eq!(repeat.status, 200);
    assert_eq!(repeat.json()["added"], false);
    assert_eq!(repeat.json()["duplicate"], true);
    assert_eq!(repeat.json()["next_seq"], 1);
    let gap = app.append("acme", &job, "w1", token, 2, "three").await;
    assert_eq!(gap.status, 409, "{}", text(&gap));
    assert_eq!(gap.code(), "sequence_gap");
    assert_eq!(gap.json()["expected"], 1);
    let second = app.append("acme", &job, "w1", token, 1, "two").await;
    assert_eq!(second.json()["next_seq"], 2);
    let cursor = app.get("acme", &format!("/reports/{job}/cursor")).await;
    assert_eq!(
        cursor.json()["chunks"],
        json!([{"seq": 0, "data": "one "}, {"seq": 1, "data": "two"}])
    );
    assert_eq!(app.job("acme", &job).await["cursor_len"], 7);

    // Malformed worker requests.
    let path = format!("/reports/{job}/append");
    let no_worker = app
        .client
        .post_json(
            &path,
            &[("authorization", "Bearer acme"), ("x-lease-token", "1")],
            "{}",
        )
        .await;
    assert_eq!(no_worker.code(), "worker_id_required");
    let no_token = app
        .client
        .post_json(
            &path,
            &[("authorization", "Bearer acme"), ("x-worker-id", "w1")],
            "{}",
        )
        .await;
    assert_eq!(no_token.status, 400);
    assert_eq!(no_token.code(), "lease_token_required");
    let bad_body = app
        .worker("acme", &job, "append", "w1", token, r#"{"seq":-1}"#)
        .await;
    assert_eq!(bad_body.status, 400);
    assert_eq!(bad_body.code(), "invalid_body");
    let unknown = app.append("acme", "job_nope", "w1", token, 0, "x").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.code(), "unknown_job");

    // Finalize with an empty body: the artifact is the cursor.
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200);
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"one two");
    // After the ending nothing more is written, and nobody can acquire it.
    let late = app.append("acme", &job, "w1", token, 2, "three").await;
    assert_eq!(late.code(), "lease_lost");
    let acquire = app.acquire("acme", &job, "w2").await;
    assert_eq!(acquire.status, 409);
    assert_eq!(acquire.json()["status"], "complete");
}

// Server-sent events.

#[tokio::test]
async fn events_resume_after_last_event_id_and_end_with_done_or_failed() {
    let app = demo().await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    for (seq, chunk) in ["a\n", "b\r\n", "c \"quoted\"", "d"].iter().enumerate() {
        app.append("acme", &job, "w1", token, seq as u64, chunk)
            .await;
    }
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    let artifact_id = done.json()["artifact_id"].clone();

    let all = parse_sse(&app.events("acme", &job, None).await.body);
    assert_eq!(chunk_ids(&all), [0, 1, 2, 3]);
    let text: String = all
        .iter()
        .filter(|e| e.event == "message")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();
    assert_eq!(
        text, "a\nb\r\nc \"quoted\"d",
        "chunks survive the event framing"
    );

    let resumed = parse_sse(&app.events("acme", &job, Some("1")).await.body);
    assert_eq!(chunk_ids(&resumed), [2, 3]);
    let last = resumed.last().unwrap();
    assert_eq!(last.event, "done");
    assert_eq!(last.id, None, "the ending does not move Last-Event-ID");
    assert_eq!(last.data["status"], "complete");
    assert_eq!(last.data["artifact_id"], artifact_id);

    let at_end = parse_sse(&app.events("acme", &job, Some("3")).await.body);
    assert_eq!(chunk_ids(&at_end), Vec::<u64>::new());
    assert_eq!(at_end.len(), 1);

    let query = app
        .get("acme", &format!("/reports/{job}/events?from_seq=3"))
        .await;
    assert_eq!(chunk_ids(&parse_sse(&query.body)), [3]);
    let bad = app.events("acme", &job, Some("nope")).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.code(), "invalid_last_event_id");

    // A failed job ends its stream with `failed`.
    let other = app.start_id("acme", &health("2026-09"), 202).await;
    let token = app.acquire_token("acme", &other, "w1").await;
    app.append("acme", &other, "w1", token, 0, "partial").await;
    app.worker(
        "acme",
        &other,
        "fail",
        "w1",
        token,
        r#"{"code":"model_error"}"#,
    )
    .await;
    let failed = parse_sse(&app.events("acme", &other, None).await.body);
    assert_eq!(chunk_ids(&failed), [0]);
    let last = failed.last().unwrap();
    assert_eq!(last.event, "failed");
    assert_eq!(last.data["error_code"], "model_error");
}

#[tokio::test]
async fn after_a_takeover_readers_learn_the_cursor_restarted() {
    let app = demo_with(Opts {
        lease: SHORT_LEASE,
        ..Opts::default()
    })
    .await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let dead = app.acquire_token("acme", &job, "w1").await;
    app.append("acme", &job, "w1", dead, 0, "old zero ").await;
    app.append("acme", &job, "w1", dead, 1, "old one").await;
    let stream = {
        let client = app.client.clone();
        let path = format!("/reports/{job}/events");
        tokio::spawn(async move {
            let headers = [("authorization", "Bearer acme")];
            tokio::time::timeout(PATIENCE, client.get(&path, &headers))
                .await
                .expect("the stream ends with the job")
        })
    };
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let alive = app.acquire_token("acme", &job, "w2").await;
    // A poller that had read two chunks sees the cursor is now shorter.
    let cursor = app
        .get("acme", &format!("/reports/{job}/cursor?from_seq=2"))
        .await;
    assert_eq!(cursor.json()["next_seq"], 0, "below from_seq: start over");
    app.append("acme", &job, "w2", alive, 0, "new").await;
    let done = app.worker("acme", &job, "finalize", "w2", alive, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));

    let events = parse_sse(&stream.await.unwrap().body);
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names, ["message", "message", "reset", "message", "done"]);
    assert_eq!(chunk_ids(&events), [0, 1, 0]);
    assert_eq!(events[3].data["data"], "new");
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"new");
}

// The built-in worker.

#[tokio::test]
async fn built_in_worker_completes_the_job_and_the_artifact_is_the_cursor() {
    let app = demo_with(Opts {
        worker: Worker::BuiltIn {
            chunk_delay: Duration::from_millis(20),
        },
        ..Opts::default()
    })
    .await;
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    // Follow it live from the start, as the chat panel would.
    let events = parse_sse(&app.events("acme", &job, None).await.body);
    assert_eq!(chunk_ids(&events), [0, 1, 2, 3, 4]);
    assert_eq!(events.last().unwrap().event, "done");
    let streamed: String = events
        .iter()
        .filter(|e| e.event == "message")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();

    let body = app.wait_for_status("acme", &job, "complete").await;
    assert_eq!(body["next_seq"], 5);
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(artifact.status, 200);
    let cursor = app.get("acme", &format!("/reports/{job}/cursor")).await;
    let concatenated: String = cursor.json()["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["data"].as_str().unwrap())
        .collect();
    assert_eq!(String::from_utf8_lossy(&artifact.body), concatenated);
    assert_eq!(streamed, concatenated);
    assert!(concatenated.starts_with("# customer health report: acme / 2026-08"));
    assert_eq!(body["cursor_len"], concatenated.len());

    let again = app.start("acme", &health("2026-08")).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["artifact_id"], body["artifact_id"]);
    assert_eq!(app.created(), 1);
}

// Every job reaches an ending.

#[tokio::test]
async fn the_stale_sweep_fails_an_abandoned_job_and_the_next_start_creates_anew() {
    let app = demo_with(Opts {
        lease: SHORT_LEASE,
        ..Opts::default()
    })
    .await;
    let sweeper = app::spawn_stale_sweep(app.store.clone(), Duration::from_millis(100));
    let job = app.start_id("acme", &health("2026-08"), 202).await;
    let body = app.wait_for_status("acme", &job, "failed").await;
    assert_eq!(body["error_code"], "stale");
    let acquire = app.acquire("acme", &job, "w1").await;
    assert_eq!(acquire.status, 409, "an ended job is left alone");
    let next = app.start_id("acme", &health("2026-08"), 202).await;
    assert_ne!(next, job, "a failed job is not revived: a new one starts");
    sweeper.abort();
}
