//! PostgreSQL killed (`pg_ctl stop -m immediate`: a crash, no checkpoint) and
//! restarted under load, with `IdempotencyLayer` over `PostgresStore`.
//!
//! It stops the database server that `./scripts/test` started (`TEST_PG_BIN`,
//! `TEST_PGDATA`), so it has a test binary of its own (cargo runs test
//! binaries one after another, so no other test sees the outage) and its
//! tests are serialised on a mutex. A guard restarts the server even if the test fails.
//! Without those variables (a database the test did not start) it skips loudly.
//!
//! What it proves, with 16 clients sending fresh keys and their retries:
//! - while the database is down every request is answered `503
//!   idempotency_store_unavailable` quickly, and no handler starts;
//! - the service recovers by itself once the database is back (no restart);
//! - no request is executed twice (handler runs counted per key in process);
//! - no completed record is lost: every `complete` the store acknowledged
//!   replays the same bytes after the crash. The store's connections use
//!   `synchronous_commit=on` (the PostgreSQL default, which `scripts/test`
//!   turns off for speed): an acknowledged commit survives a server crash;
//! - a request whose record could not be written (the database died after its
//!   handler ran) stays `idempotency_in_progress` until its lock expires, it is
//!   not run again before that.
#![cfg(feature = "postgres")]

use tower_idempotency_tests::support;
mod transactional;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::pg;
use tokio::time::{sleep, Instant};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::store::{Completion, Timings};
use tower_idempotency::{
    fingerprint::RequestFingerprint,
    store::{Begin, FencingToken, RecordKey, Store, StoreError},
    IdempotencyLayer, PostgresStore, Scope,
};

/// Tests in this binary stop the shared server: never two at once.
static SERVER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------
// The cluster scripts/test started
// ---------------------------------------------------------------------------

struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    options: String,
    log: PathBuf,
}

impl Cluster {
    fn from_env() -> Option<Self> {
        let bin = PathBuf::from(std::env::var_os("TEST_PG_BIN")?);
        let data = PathBuf::from(std::env::var_os("TEST_PGDATA")?);
        let port = std::env::var("TEST_PG_PORT").ok()?;
        // The options the server was started with, from postmaster.opts:
        // `/path/postgres "-D" "/data" "-p" "5432" ...`.
        let options = std::fs::read_to_string(data.join("postmaster.opts"))
            .ok()
            .map(|opts| {
                let tokens: Vec<&str> = opts
                    .split('"')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .skip(1)
                    .collect();
                let mut kept = Vec::new();
                let mut i = 0;
                while i < tokens.len() {
                    if tokens[i] == "-D" {
                        i += 2;
                        continue;
                    }
                    kept.push(format!("\"{}\"", tokens[i]));
                    i += 1;
                }
                kept.join(" ")
            })
            .unwrap_or_else(|| format!("-p {port} -c listen_addresses=127.0.0.1"));
        let log = data.parent().unwrap_or(&data).join("server.log");
        Some(Self {
            bin,
            data,
            options,
            log,
        })
    }

    fn pg_ctl(&self, args: &[&str]) -> bool {
        let pg_ctl = self.bin.join("pg_ctl");
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let mut command = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
            c
        } else {
            Command::new(&pg_ctl)
        };
        command
            .arg("-D")
            .arg(&self.data)
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn running(&self) -> bool {
        self.pg_ctl(&["status"])
    }

    /// A crash: every backend is killed, no shutdown checkpoint.
    fn kill(&self) {
        assert!(self.pg_ctl(&["-m", "immediate", "stop"]), "pg_ctl stop");
    }

    fn start(&self) {
        let log = self.log.to_string_lossy().into_owned();
        assert!(
            self.pg_ctl(&["-w", "-t", "60", "-l", &log, "-o", &self.options, "start"]),
            "pg_ctl start"
        );
    }
}

/// Restarts the server if a test left it down.
struct Restart<'a>(&'a Cluster);

impl Drop for Restart<'_> {
    fn drop(&mut self) {
        if !self.0.running() {
            self.0.start();
        }
    }
}

// ---------------------------------------------------------------------------
// A store that remembers which completions it acknowledged
// ---------------------------------------------------------------------------

#[derive(Clone)]
struct Acknowledging {
    inner: PostgresStore,
    completed: Arc<Mutex<HashMap<String, Bytes>>>,
    complete_failures: Arc<AtomicUsize>,
}

impl Store for Acknowledging {
    async fn begin(
        &self,
        key: &RecordKey,
        fp: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        self.inner.begin(key, fp).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        let Completion::Response(response) = completion else {
            return self.inner.complete(key, token, completion).await;
        };
        let body = response.body.clone();
        let result = self
            .inner
            .complete(key, token, Completion::Response(response))
            .await;
        match &result {
            Ok(()) => {
                let previous = self
                    .completed
                    .lock()
                    .unwrap()
                    .insert(key.key().as_str().to_owned(), body);
                assert!(previous.is_none(), "completed twice: {key:?}");
            }
            Err(_) => {
                self.complete_failures.fetch_add(1, SeqCst);
            }
        }
        result
    }

    fn timings(&self) -> Timings {
        self.inner.timings()
    }
    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.inner.extend(key, token).await
    }
    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.inner.release(key, token).await
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        self.inner.wait(key, timeout).await
    }
}

// ---------------------------------------------------------------------------
// The service and its clients
// ---------------------------------------------------------------------------

/// Handler runs per key, and when each run started.
#[derive(Clone, Default)]
struct Effects {
    runs: Arc<Mutex<HashMap<String, usize>>>,
    started: Arc<Mutex<Vec<Instant>>>,
}

fn request(key: &str) -> Request<Full<Bytes>> {
    let mut req = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!(r#"{{"order":"{key}"}}"#))))
        .unwrap();
    req.extensions_mut().insert(Scope::new("tenant"));
    req
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    replayed: bool,
    code: String,
    body: Bytes,
}

async fn send<S>(svc: &S, key: &str) -> Reply
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    let (parts, body) = svc
        .clone()
        .oneshot(request(key))
        .await
        .unwrap()
        .into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    Reply {
        status: parts.status,
        replayed: parts.headers.contains_key("idempotent-replayed"),
        code: json["code"].as_str().unwrap_or_default().to_owned(),
        body,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_and_restarted_database_under_load_no_double_execution_no_lost_record() {
    let _serial = SERVER.lock().await;
    let Some(url) = pg::database_url("killed_and_restarted_database_under_load") else {
        return;
    };
    let Some(cluster) = Cluster::from_env() else {
        eprintln!(
            "\n*** SKIPPED killed_and_restarted_database_under_load: TEST_PG_BIN/TEST_PGDATA \
             are not set (run ./scripts/test, which starts a cluster this test may stop). ***\n"
        );
        return;
    };
    let _restart = Restart(&cluster);
    assert!(cluster.running(), "the test cluster runs");

    let table = pg::unique_table("faults_restart");
    pg::store(&url, &table, |s| s).await; // migrated
    let mut config = pg::pg_config(&url);
    config.options("-c synchronous_commit=on");
    config.connect_timeout(Duration::from_secs(1));
    let store = Acknowledging {
        inner: PostgresStore::builder(pg::pool(config.clone(), 8))
            .with_table(table.parse().unwrap())
            .with_lock_timeout(Duration::from_secs(120))
            .with_operation_timeout(Duration::from_secs(2))
            .with_listener(config)
            .build(),
        completed: Arc::default(),
        complete_failures: Arc::default(),
    };
    let effects = Effects::default();
    let handler = {
        let effects = effects.clone();
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let effects = effects.clone();
            async move {
                let key = req.headers()["idempotency-key"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                effects.started.lock().unwrap().push(Instant::now());
                let run = {
                    let mut runs = effects.runs.lock().unwrap();
                    let n = runs.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                // A little work, so some requests are mid-handler at the crash.
                sleep(Duration::from_millis(20)).await;
                let body = format!(r#"{{"order":"{key}","run":{run}}}"#);
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .unwrap(),
                )
            }
        })
    };
    let svc = IdempotencyLayer::new(store.clone())
        .with_wait_timeout(Duration::ZERO)
        .layer(handler);

    // Clients: a fresh key, retried until it is not 503, then once more (a replay).
    let stop = Arc::new(AtomicBool::new(false));
    let next_key = Arc::new(AtomicUsize::new(0));
    let seen_201: Arc<Mutex<HashMap<String, Bytes>>> = Arc::default();
    let sent: Arc<Mutex<HashSet<String>>> = Arc::default();
    let unavailable = Arc::new(Mutex::new(Vec::<(Instant, Duration)>::new()));
    let mut clients = Vec::new();
    for _ in 0..16 {
        let (svc, stop, next_key) = (svc.clone(), stop.clone(), next_key.clone());
        let (seen_201, sent, unavailable) = (seen_201.clone(), sent.clone(), unavailable.clone());
        clients.push(tokio::spawn(async move {
            while !stop.load(SeqCst) {
                let key = format!("order-{:08}", next_key.fetch_add(1, SeqCst));
                sent.lock().unwrap().insert(key.clone());
                for attempt in 0..2 {
                    loop {
                        let started = Instant::now();
                        let reply = send(&svc, &key).await;
                        match (reply.status, reply.replayed) {
                            (StatusCode::SERVICE_UNAVAILABLE, _) => {
                                assert_eq!(reply.code, "idempotency_store_unavailable");
                                unavailable
                                    .lock()
                                    .unwrap()
                                    .push((started, started.elapsed()));
                                if stop.load(SeqCst) {
                                    return;
                                }
                                sleep(Duration::from_millis(50)).await;
                            }
                            (StatusCode::CREATED, false) => {
                                assert_eq!(attempt, 0, "a retry ran again: {key}");
                                let previous =
                                    seen_201.lock().unwrap().insert(key.clone(), reply.body);
                                assert!(previous.is_none(), "two fresh answers for {key}");
                                break;
                            }
                            (StatusCode::CREATED, true) => {
                                let first = seen_201.lock().unwrap().get(&key).cloned();
                                if let Some(first) = first {
                                    assert_eq!(reply.body, first, "{key}");
                                }
                                break;
                            }
                            (StatusCode::CONFLICT, _) => {
                                // The claim outlived its request (the crash hit
                                // between begin and complete): it is kept until
                                // its lock expires, not run again.
                                assert_eq!(reply.code, "idempotency_in_progress", "{key}");
                                break;
                            }
                            other => panic!("unexpected answer {other:?} for {key}: {reply:?}"),
                        }
                    }
                }
            }
        }));
    }

    sleep(Duration::from_secs(2)).await;
    let before_crash = seen_201.lock().unwrap().len();
    assert!(before_crash > 0, "the load runs");

    let killed_at = Instant::now();
    cluster.kill();
    let down_for = Duration::from_secs(4);
    sleep(down_for).await;
    let restarted_at = Instant::now();
    cluster.start();

    // Recovers by itself: new requests succeed again.
    let recovered_by = Instant::now() + Duration::from_secs(30);
    let at_restart = seen_201.lock().unwrap().len();
    while seen_201.lock().unwrap().len() < at_restart + 50 {
        assert!(
            Instant::now() < recovered_by,
            "the service did not recover within 30 s of the restart"
        );
        sleep(Duration::from_millis(50)).await;
    }
    let recovered_after = restarted_at.elapsed();
    sleep(Duration::from_secs(1)).await;
    stop.store(true, SeqCst);
    for client in clients {
        tokio::time::timeout(Duration::from_secs(30), client)
            .await
            .expect("clients finish")
            .expect("client assertions");
    }

    // While down: 503s, answered fast; no handler started once the crash was
    // visible (a 2 s grace covers requests already past `begin`).
    let down = unavailable
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at >= killed_at && *at < restarted_at)
        .map(|(_, took)| *took)
        .collect::<Vec<_>>();
    assert!(down.len() >= 16, "503 while down: {}", down.len());
    let slowest = down.iter().max().copied().unwrap_or_default();
    assert!(slowest <= Duration::from_secs(4), "503 took {slowest:?}");
    let started_while_down = effects
        .started
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t >= killed_at + Duration::from_secs(2) && **t < restarted_at)
        .count();
    assert_eq!(started_while_down, 0, "no handler started while down");

    // No request executed twice.
    let runs = effects.runs.lock().unwrap().clone();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "executed twice: {twice:?}");

    // Audit every key ever sent, with the database up.
    let acknowledged = store.completed.lock().unwrap().clone();
    let seen_201 = seen_201.lock().unwrap().clone();
    let sent = sent.lock().unwrap().clone();
    let (mut replayed, mut in_progress, mut fresh) = (0, 0, 0);
    for key in &sent {
        let ran_before = runs.get(key).copied().unwrap_or(0);
        let reply = send(&svc, key).await;
        match (reply.status, reply.replayed) {
            (StatusCode::CREATED, true) => {
                replayed += 1;
                assert_eq!(ran_before, 1, "a replay of a request that ran: {key}");
                if let Some(body) = acknowledged.get(key).or(seen_201.get(key)) {
                    assert_eq!(&reply.body, body, "{key}");
                }
            }
            (StatusCode::CONFLICT, false) => {
                in_progress += 1;
                assert_eq!(reply.code, "idempotency_in_progress", "{key}");
                // Never an acknowledged record: that would be a lost completion.
                assert!(!acknowledged.contains_key(key), "lost record {key}");
            }
            (StatusCode::CREATED, false) => {
                fresh += 1;
                assert_eq!(ran_before, 0, "ran a second time after the crash: {key}");
            }
            other => panic!("unexpected audit answer {other:?} for {key}: {reply:?}"),
        }
    }
    for key in acknowledged.keys() {
        assert!(sent.contains(key));
    }
    let after = effects.runs.lock().unwrap().clone();
    assert!(
        after.values().all(|n| *n <= 1),
        "executed twice in the audit"
    );
    eprintln!(
        "restart under load: {} keys, {} recorded before the crash, {} 503s while down \
         (slowest {slowest:?}), recovered {recovered_after:?} after the restart; audit: \
         {replayed} replayed, {in_progress} in progress until their lock expires \
         ({} completions failed), {fresh} never ran and ran once now",
        sent.len(),
        before_crash,
        down.len(),
        store.complete_failures.load(SeqCst),
    );
    assert!(
        replayed >= before_crash,
        "every record made before the crash replays"
    );
}
