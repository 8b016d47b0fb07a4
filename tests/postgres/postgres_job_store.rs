//! `PostgresJobStore` against a real PostgreSQL: the job store conformance
//! suite, plus starts and a killed worker across separate processes.
//!
//! Without `DATABASE_URL` the tests skip loudly; with `REQUIRE_POSTGRES=1`
//! (CI, `./scripts/test`) they fail instead.
#![cfg(feature = "postgres")]

use std::num::NonZeroU64;
use tower_idempotency::lease::store::conformance as job_conformance;
use tower_idempotency::store::Completion;
use tower_idempotency_tests::support;

use bytes::Bytes;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::pg;
use tower_idempotency::lease::store::PostgresJobStore;
use tower_idempotency::lease::store::{
    JobReader, JobStatus, JobStore, LeaseError, StartJob, StartOutcome,
};
use tower_idempotency::Lease;

async fn job_store(url: &str, table: &str, lease: Duration) -> PostgresJobStore {
    let store = PostgresJobStore::builder(pg::pool(pg::pg_config(url), 8))
        .with_table(table.parse().unwrap())
        .with_lease(lease)
        .build();
    store.migrate().await.expect("migrate");
    store
}

async fn postgres_job_store(lease: Duration) -> Option<PostgresJobStore> {
    let url = pg::database_url("postgres job store conformance")?;
    Some(job_store(&url, &pg::unique_table("jobs"), lease).await)
}

tower_idempotency::job_store_conformance_tests!(postgres_job_store);

#[tokio::test]
async fn migrate_is_idempotent_and_concurrent() {
    let Some(url) = pg::database_url("migrate_is_idempotent_and_concurrent") else {
        return;
    };
    let table = pg::unique_table("jobs_migrate");
    let store = PostgresJobStore::builder(pg::pool(pg::pg_config(&url), 8))
        .with_table(table.parse().unwrap())
        .build();
    let runs: Vec<_> = (0..6)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for run in runs {
        run.await.unwrap().expect("concurrent migrate");
    }
    store.migrate().await.expect("again");
}

/// The jobs table as the first release created it: one joined `natural_key`.
const FIRST_RELEASE_SCHEMA: &str = r#"
CREATE SEQUENCE "public"."{t}_token_seq" AS bigint;
CREATE TABLE "public"."{t}" (
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
CREATE UNIQUE INDEX "{t}_live_key_idx" ON "public"."{t}" (natural_key) WHERE status <> 'failed';
CREATE INDEX "{t}_tenant_idx" ON "public"."{t}" (tenant, period_started_at);
CREATE TABLE "public"."{t}_chunks" (
    job_id text   NOT NULL REFERENCES "public"."{t}" (job_id) ON DELETE CASCADE,
    seq    bigint NOT NULL,
    data   bytea  NOT NULL,
    PRIMARY KEY (job_id, seq)
);
INSERT INTO "public"."{t}" (job_id, tenant, natural_key, status, lease_owner, lease_token,
                            lease_expires_at, artifact_id, artifact)
VALUES ('job_done', 'org:acme', 'org:acme:2026-08', 'complete', 'w', 1, now(), 'art_done', 'old report'),
       ('job_live', 'org', 'org:acme:2026-09', 'running', 'w', 2, now() + interval '1 hour', NULL, NULL);
"#;

#[tokio::test]
async fn migrate_upgrades_a_table_keyed_by_a_joined_string() {
    let Some(url) = pg::database_url("migrate_upgrades_a_table_keyed_by_a_joined_string") else {
        return;
    };
    let table = pg::unique_table("jobs_upgrade");
    let client = pg::connect(&url).await;
    client
        .batch_execute(&FIRST_RELEASE_SCHEMA.replace("{t}", &table))
        .await
        .expect("first release schema");
    let store = PostgresJobStore::builder(pg::pool(pg::pg_config(&url), 4))
        .with_table(table.parse().unwrap())
        .build();
    store.migrate().await.expect("upgrade");
    store.migrate().await.expect("upgrade is idempotent");

    // Old jobs keep their tenant and get their key back without the tenant prefix.
    let done = store.job("org:acme", "job_done").await.unwrap().unwrap();
    assert_eq!((done.kind.as_str(), done.key.as_str()), ("", "2026-08"));
    let live = store.job("org", "job_live").await.unwrap().unwrap();
    assert_eq!(
        (live.kind.as_str(), live.key.as_str()),
        ("", "acme:2026-09")
    );
    assert_eq!(
        store.artifact("org:acme", "job_done").await.unwrap(),
        tower_idempotency::lease::store::ArtifactLookup::Found(Bytes::from_static(b"old report"))
    );
    assert_eq!(store.job("org", "job_done").await.unwrap(), None);
    // The joined column and its index are gone; the new start creates its own job.
    let columns: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_name = $1 AND column_name = 'natural_key'",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(columns, 0);
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM public.tower_idempotency_migrations WHERE table_name = $1 \
             ORDER BY version",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        versions,
        [1, 2, 3, 4],
        "adopted as version 1, upgraded by 2, 3 and 4"
    );
    assert_eq!(done.cost, 1, "jobs of before cost one unit each");
    let start = StartJob {
        tenant: "org",
        kind: "report",
        key: "acme:2026-09",
        owner: "w2",
        budget: None,
        cost: 1,
    };
    match store.start(&start).await.unwrap() {
        StartOutcome::Created(job, _) => assert_ne!(job.id, "job_live"),
        other => panic!("expected a new job after the upgrade, got {other:?}"),
    }
}

#[test]
fn table_names_are_validated() {
    use tower_idempotency::{store::SqlIdentifier, ConfigError};
    let refused = SqlIdentifier::try_from("jobs; drop table x");
    assert_eq!(
        refused,
        Err(ConfigError::SqlIdentifier("jobs; drop table x".into()))
    );
}

// ---------------------------------------------------------------------------
// Several processes on one database (the test binary re-runs itself as a child)
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "TOWER_IDEMPOTENCY_JOB_CHILD";
/// Prefixes the child's reports: libtest prints its own text on the same lines.
const MARK: &str = "@@child@@ ";

struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(role: &str, table: &str, extra: &[(&str, String)]) -> ChildProcess {
    // The child test's name within this binary: this module's path without
    // the crate's name.
    let test = match module_path!().split_once("::") {
        Some((_crate, path)) => format!("{path}::job_child_process"),
        None => "job_child_process".to_owned(),
    };
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", &test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env("CHILD_TABLE", table)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in extra {
        command.env(k, v);
    }
    ChildProcess(command.spawn().expect("spawn child"))
}

/// The child side: does nothing unless started by a test below.
#[test]
fn job_child_process() {
    let Ok(role) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let url = std::env::var("DATABASE_URL").unwrap();
        let table = std::env::var("CHILD_TABLE").unwrap();
        let lease =
            Duration::from_millis(std::env::var("CHILD_LEASE_MS").unwrap().parse().unwrap());
        let store = job_store(&url, &table, lease).await;
        match role.as_str() {
            "starts" => child_starts(store).await,
            "worker" => child_worker(store).await,
            other => panic!("unknown role {other}"),
        }
    });
}

/// Fires 25 concurrent starts at the instant the parent named, prints each outcome.
async fn child_starts(store: PostgresJobStore) {
    let at_ms: u64 = std::env::var("CHILD_START_AT_MS").unwrap().parse().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(now_ms))).await;
    let tasks: Vec<_> = (0..25)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let owner = format!("proc-{}-{i}", std::process::id());
                store
                    .start(&StartJob {
                        tenant: "acme",
                        kind: "report",
                        key: "customer_health:2026-08",
                        owner: &owner,
                        budget: None,
                        cost: 1,
                    })
                    .await
                    .expect("start")
            })
        })
        .collect();
    for task in tasks {
        let line = match task.await.unwrap() {
            StartOutcome::Stolen(job, _) => format!("stolen {}", job.id),
            StartOutcome::Joined(job) => format!("joined {}", job.id),
            StartOutcome::Created(job, _) => format!("created {}", job.id),
            other => format!("other {other:?}"),
        };
        println!("{MARK}{line}");
    }
}

/// Starts a job and works on it forever (heartbeating, appending), until killed.
async fn child_worker(store: PostgresJobStore) {
    let StartOutcome::Created(job, grant) = store
        .start(&StartJob {
            tenant: "acme",
            kind: "report",
            key: "customer_health:2026-09",
            owner: "doomed-worker",
            budget: None,
            cost: 1,
        })
        .await
        .expect("start")
    else {
        panic!("expected a new job");
    };
    println!("{MARK}job {} token {}", job.id, grant.token.get());
    let lease = Lease::new(std::sync::Arc::new(store), grant);
    let worker = lease.spawn_worker(|lease| async move {
        for seq in 0.. {
            lease
                .append(seq, format!("chunk {seq} "))
                .await
                .map_err(|e| e.to_string())?;
            if seq == 2 {
                println!("{MARK}appending");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        unreachable!()
    });
    let _ = worker.await;
}

fn read_lines(child: &mut ChildProcess) -> impl Iterator<Item = String> {
    BufReader::new(child.0.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .filter_map(|l| l.split_once(MARK).map(|(_, report)| report.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_stolen_once_by_50_concurrent_starts_across_two_processes() {
    let Some(url) = pg::database_url("stolen once across two processes") else {
        return;
    };
    let table = pg::unique_table("jobs_steal");
    let lease = Duration::from_millis(500);
    let store = job_store(&url, &table, lease).await;
    let StartOutcome::Created(job, dead) = store
        .start(&StartJob {
            tenant: "acme",
            kind: "report",
            key: "customer_health:2026-08",
            owner: "dead-worker",
            budget: None,
            cost: 1,
        })
        .await
        .unwrap()
    else {
        panic!("created");
    };
    // Both children fire at the same instant, after the lease has expired.
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 2_500;
    let env = [
        ("CHILD_LEASE_MS", lease.as_millis().to_string()),
        ("CHILD_START_AT_MS", at.to_string()),
    ];
    let mut a = spawn_child("starts", &table, &env);
    let mut b = spawn_child("starts", &table, &env);
    let lines: Vec<String> = read_lines(&mut a).chain(read_lines(&mut b)).collect();
    assert_eq!(lines.len(), 50, "{lines:?}");
    let stolen = lines.iter().filter(|l| l.starts_with("stolen ")).count();
    assert_eq!(stolen, 1, "stolen once, never twice: {lines:?}");
    for line in &lines {
        assert!(
            line.ends_with(&job.id),
            "every start names the same job: {line}"
        );
        assert!(
            line.starts_with("stolen ") || line.starts_with("joined "),
            "{line}"
        );
    }
    assert!(matches!(
        store.finalize(&dead, Bytes::from_static(b"stale")).await,
        Err(LeaseError::NotOwner)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_process_job_is_stolen_after_expiry_and_finished_once() {
    let Some(url) = pg::database_url("killed worker process") else {
        return;
    };
    let table = pg::unique_table("jobs_kill");
    let lease = Duration::from_millis(1500);
    let store = job_store(&url, &table, lease).await;
    let mut child = spawn_child(
        "worker",
        &table,
        &[("CHILD_LEASE_MS", lease.as_millis().to_string())],
    );
    let mut lines = read_lines(&mut child);
    let first = lines.next().expect("the child reports its job");
    let mut words = first.split(' ');
    let (job_id, dead_token) = (
        words.nth(1).unwrap().to_owned(),
        words.nth(1).unwrap().parse::<i64>().unwrap(),
    );
    assert_eq!(lines.next().as_deref(), Some("appending"));
    // kill -9: no hook runs, the lease is left behind.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let natural = StartJob {
        tenant: "acme",
        kind: "report",
        key: "customer_health:2026-09",
        owner: "rescuer",
        budget: None,
        cost: 1,
    };
    // Before expiry: the dead worker's lease is still live, a start joins.
    assert!(
        matches!(store.start(&natural).await.unwrap(), StartOutcome::Joined(ref j) if j.id == job_id)
    );
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let StartOutcome::Stolen(stolen, grant) = store.start(&natural).await.unwrap() else {
        panic!("expected a steal after expiry");
    };
    assert_eq!(stolen.id, job_id);
    assert!(grant.token.get() > dead_token);
    let dead = tower_idempotency::lease::store::LeaseGrant {
        job_id: job_id.clone(),
        owner: "doomed-worker".into(),
        token: tower_idempotency::store::FencingToken::new(dead_token),
    };
    assert!(matches!(
        store.append(&dead, 99, Bytes::from_static(b"x")).await,
        Err(LeaseError::LeaseLost)
    ));
    let rescuer = Lease::new(std::sync::Arc::new(store.clone()), grant);
    rescuer.append(0, "fresh ").await.unwrap();
    let artifact_id = rescuer.finalize("fresh report").await.unwrap();
    assert!(matches!(
        store
            .finalize(&dead, Bytes::from_static(b"stale report"))
            .await,
        Err(LeaseError::NotOwner)
    ));
    let job = store.job("acme", &job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.artifact_id.as_deref()),
        (JobStatus::Complete, Some(artifact_id.as_str()))
    );
    assert_eq!(
        store.artifact("acme", &job_id).await.unwrap(),
        tower_idempotency::lease::store::ArtifactLookup::Found(Bytes::from_static(b"fresh report"))
    );
    // The cursor holds only the rescuer's chunk: the dead worker's partial output is gone.
    let chunks = store.chunks("acme", &job_id, 0).await.unwrap().unwrap();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].data, Bytes::from_static(b"fresh "));
}

// ---------------------------------------------------------------------------
// A hung database: 503 in bounded time, never a hang
// ---------------------------------------------------------------------------

fn start_period(period: &str) -> http::Request<axum::body::Body> {
    let mut req = http::Request::post("/exports")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(format!(
            r#"{{"period":"{period}"}}"#
        )))
        .unwrap();
    req.extensions_mut()
        .insert(tower_idempotency::Scope::new("acme"));
    req
}

/// Starts through a `LeaseLayer` over `store`: the status, the code and how long it took.
async fn start_through_layer(store: &PostgresJobStore, period: &str) -> (u16, String, Duration) {
    use tower::{Layer, ServiceExt};
    let layer = tower_idempotency::LeaseLayer::new(
        store.clone(),
        "export".parse().unwrap(),
        tower_idempotency::lease::JsonJobKey::new(["period"]),
    );
    let svc = layer.layer(tower::service_fn(
        |_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        },
    ));
    let started = std::time::Instant::now();
    let res = svc.oneshot(start_period(period)).await.unwrap();
    let status = res.status().as_u16();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let code = json["code"].as_str().unwrap_or_default().to_owned();
    (status, code, started.elapsed())
}

const OPERATION: Duration = Duration::from_secs(1);
/// The operation timeout plus room for a loaded machine.
const BOUND: Duration = Duration::from_millis(2500);

async fn assert_unavailable_in_time(store: &PostgresJobStore, period: &str) {
    let (status, code, took) = start_through_layer(store, period).await;
    assert_eq!((status, code.as_str()), (503, "job_store_unavailable"));
    assert!(took < BOUND, "start answered after {took:?}");
    let started = std::time::Instant::now();
    let error = store.job("acme", "job_any").await.unwrap_err();
    assert!(
        started.elapsed() < BOUND,
        "a read answered after {:?}",
        started.elapsed()
    );
    assert!(
        error.to_string().starts_with("job store backend error"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_answers_503_within_the_operation_timeout_then_recovers() {
    let Some(url) = pg::database_url("a_frozen_database_answers_503") else {
        return;
    };
    let table = pg::unique_table("jobs_frozen");
    job_store(&url, &table, job_conformance::LONG).await; // migrated directly
    let proxy =
        tower_idempotency_tests::support::proxy::Proxy::start(pg::server_addr(&url).await).await;
    let store = PostgresJobStore::builder(pg::pool(pg::pg_config_at(&url, proxy.port), 4))
        .with_table(table.parse().unwrap())
        .with_operation_timeout(OPERATION)
        .build();
    assert_eq!(start_through_layer(&store, "2026-01").await.0, 202);
    proxy.set_frozen(true);
    assert_unavailable_in_time(&store, "2026-02").await;
    proxy.set_frozen(false);
    let recovered = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if start_through_layer(&store, "2026-03").await.0 == 202 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        recovered.is_ok(),
        "no recovery once the database answers again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_locked_elsewhere_answers_503_within_the_operation_timeout() {
    let Some(url) = pg::database_url("a_table_locked_elsewhere_answers_503") else {
        return;
    };
    let table = pg::unique_table("jobs_locked");
    job_store(&url, &table, job_conformance::LONG).await; // migrated directly
    let store = PostgresJobStore::builder(pg::pool(pg::pg_config(&url), 8))
        .with_table(table.parse().unwrap())
        .with_lease(job_conformance::LONG)
        .with_operation_timeout(OPERATION)
        .build();
    let mut locker = pg::connect(&url).await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "LOCK TABLE public.{table} IN ACCESS EXCLUSIVE MODE"
    ))
    .await
    .unwrap();
    assert_unavailable_in_time(&store, "2026-04").await;
    tx.commit().await.unwrap();
    assert_eq!(start_through_layer(&store, "2026-05").await.0, 202);
}

/// Both stores' first migration into one fresh schema, several instances of
/// each at once: one lock, so none fails on `CREATE SCHEMA` or `CREATE TABLE`;
/// each table's versions are recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_stores_migrate_a_fresh_schema_concurrently() {
    let Some(url) = pg::database_url("both_stores_migrate_a_fresh_schema_concurrently") else {
        return;
    };
    let schema = pg::unique_table("fresh_schema");
    let pool = pg::pool(pg::pg_config(&url), 12);
    let records = tower_idempotency::PostgresStore::builder(pool.clone())
        .with_schema(schema.parse().unwrap())
        .with_table("records".parse().unwrap())
        .build();
    let jobs = PostgresJobStore::builder(pool)
        .with_schema(schema.parse().unwrap())
        .with_table("jobs".parse().unwrap())
        .build();
    let mut runs = Vec::new();
    for _ in 0..4 {
        let (records, jobs) = (records.clone(), jobs.clone());
        runs.push(tokio::spawn(async move {
            records.migrate().await.map_err(|e| e.to_string())
        }));
        runs.push(tokio::spawn(async move {
            jobs.migrate().await.map_err(|e| e.to_string())
        }));
    }
    for run in runs {
        run.await.unwrap().expect("concurrent first migration");
    }
    let versions = pg::connect(&url)
        .await
        .query(
            &format!(
                "SELECT table_name, version FROM \"{schema}\".tower_idempotency_migrations \
                 ORDER BY table_name, version"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, i32>(1)))
        .collect::<Vec<_>>();
    assert_eq!(
        versions,
        [
            ("jobs".into(), 1),
            ("jobs".into(), 2),
            ("jobs".into(), 3),
            ("jobs".into(), 4),
            ("records".into(), 1),
            ("records".into(), 2),
            ("records".into(), 3),
            ("records".into(), 4),
            ("records".into(), 5),
            ("records".into(), 6)
        ]
    );
    // Both work in the new schema.
    assert!(matches!(
        jobs.start(&StartJob {
            tenant: "acme",
            kind: "report",
            key: "2026-08",
            owner: "w",
            budget: None,
            cost: 1,
        })
        .await
        .unwrap(),
        StartOutcome::Created(..)
    ));
}

/// Weighted starts from two instances (two stores, two pools) on one table:
/// the budget lock in the database makes each reservation one decision, so
/// together they never reserve past the allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_starts_from_two_instances_never_overshoot() {
    let Some(url) = pg::database_url("weighted_starts_from_two_instances") else {
        return;
    };
    let table = pg::unique_table("jobs_weighted");
    let first = job_store(&url, &table, job_conformance::LONG).await;
    let second = PostgresJobStore::builder(pg::pool(pg::pg_config(&url), 8))
        .with_table(table.parse().unwrap())
        .build();
    let budget = Some(tower_idempotency::lease::store::Budget::per_day(
        NonZeroU64::new(10_000).unwrap(),
    ));
    let starts: Vec<_> = (0..40)
        .map(|i| {
            let store = if i % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            tokio::spawn(async move {
                let key = format!("2026-{i:02}");
                store
                    .start(&StartJob {
                        tenant: "acme",
                        kind: "report",
                        key: &key,
                        owner: "w",
                        budget,
                        cost: 700,
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut accepted = 0;
    for start in starts {
        match start.await.unwrap() {
            StartOutcome::Created(..) => accepted += 1,
            StartOutcome::BudgetExhausted(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // 14 × 700 = 9800 fits in 10 000; a 15th would not.
    assert_eq!(accepted, 14);
}

/// A clone of a builder is a second configuration: each `build` makes a
/// store of its own on the same pool, with its own table and timings.
#[test]
fn a_cloned_postgres_builder_builds_a_store_of_its_own() {
    use tower_idempotency::store::Store;
    let pool = pg::pool(pg::pg_config("postgres://x@127.0.0.1:1/x"), 1);
    let builder = tower_idempotency::PostgresStore::builder(pool);
    let other = builder
        .clone()
        .with_table("other_records".parse().unwrap())
        .with_retention(Duration::from_secs(60));
    let (a, b) = (builder.build(), other.build());
    assert_eq!(a.table(), "public.idempotency_records");
    assert_eq!(b.table(), "public.other_records");
    assert_eq!(a.timings().retention, Some(Duration::from_secs(24 * 3600)));
    assert_eq!(b.timings().retention, Some(Duration::from_secs(60)));
}

/// Jobs in the tables of the store that started them: two stores built from
/// one builder's clones, on two tables, share nothing but the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloned_postgres_job_builder_builds_a_store_of_its_own() {
    use tower_idempotency::lease::store::{JobReader, JobStore};
    let Some(url) = pg::database_url("a_cloned_postgres_job_builder_builds_a_store_of_its_own")
    else {
        return;
    };
    let builder = PostgresJobStore::builder(pg::pool(pg::pg_config(&url), 4))
        .with_table(pg::unique_table("jobs_a").parse().unwrap());
    let other = builder
        .clone()
        .with_table(pg::unique_table("jobs_b").parse().unwrap())
        .with_lease(Duration::from_secs(1));
    let (a, b) = (builder.build(), other.build());
    a.migrate().await.unwrap();
    b.migrate().await.unwrap();
    assert_eq!(a.lease_duration(), Duration::from_secs(45));
    assert_eq!(b.lease_duration(), Duration::from_secs(1));
    let StartOutcome::Created(job, _) =
        job_conformance::start(&a, "acme", "2026-01", "w1", None).await
    else {
        panic!("a new job");
    };
    assert!(b.job("acme", &job.id).await.unwrap().is_none());
    assert!(matches!(
        job_conformance::start(&b, "acme", "2026-01", "w2", None).await,
        StartOutcome::Created(..)
    ));
}

/// `Duration::MAX` for retention and lease means 100 years: completions and
/// starts still work (an interval past PostgreSQL's timestamps would not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_of_max_mean_forever_on_postgres() {
    use tower_idempotency::store::Claim;
    use tower_idempotency::{
        fingerprint::RequestFingerprint,
        store::{Begin, RecordKey, Store},
        IdempotencyKey, Scope,
    };
    let Some(url) = pg::database_url("durations_of_max_mean_forever_on_postgres") else {
        return;
    };
    let records = pg::store(&url, &pg::unique_table("forever"), |s| {
        s.with_retention(Duration::MAX)
            .with_lock_timeout(Duration::MAX)
            .with_operation_timeout(Duration::MAX)
    })
    .await;
    let key = IdempotencyKey::parse(b"order-forever-1").unwrap();
    let record = RecordKey::new(Scope::new("acme"), key.clone());
    let request = || RequestFingerprint::new(&http::Method::POST, "/o", &key, "acme", None, b"{}");
    let Begin::Claimed(Claim { token, .. }) = records.begin(&record, &request()).await.unwrap()
    else {
        panic!("claim")
    };
    records.extend(&record, token).await.unwrap();
    let response = tower_idempotency::store::StoredResponse {
        status: http::StatusCode::CREATED,
        headers: Vec::new(),
        body: Bytes::from_static(b"done"),
    };
    records
        .complete(&record, token, Completion::Response(response))
        .await
        .expect("a completion, not an overflow");
    assert!(matches!(
        records.begin(&record, &request()).await.unwrap(),
        Begin::Replay(_)
    ));
    // The job store's `Duration::MAX` lease is the conformance suite's `FOREVER` check.
}
