//! A bounded soak: two server processes on one PostgreSQL database, loopback
//! HTTP only, mixing fresh keys, replays, key reuse with another body,
//! concurrent duplicates split across both processes, requests the handler
//! refuses (released, then retried), and handlers that panic (released by the
//! claim's guard, then retried). Then an audit in SQL: every side effect row
//! corresponds to exactly one completed record, and every completed record to
//! exactly one side effect, whose id is in the recorded body.
//!
//! Duration: `SOAK_SECONDS` (default 20) of load. Run it longer with
//! `SOAK_SECONDS=600 ./scripts/test --test soak -- --nocapture`.
//!
//! The test binary re-runs itself as the server (`soak_server`, which returns
//! at once in a normal run), as `postgres_processes.rs` does.
#![cfg(feature = "postgres")]

use tower_idempotency_tests::support;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::child::ChildServer;
use support::pg;
use tokio::time::Instant;
use tower_idempotency::{IdempotencyLayer, PostgresStore};

const SERVER_ENV: &str = "TOWER_IDEMPOTENCY_SOAK_SERVER";
const TENANTS: [&str; 3] = ["tenant_a", "tenant_b", "tenant_c"];

// ---------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------

/// Not a test: the server process. Returns at once in a normal test run.
#[test]
fn soak_server() {
    let Ok(table) = std::env::var(SERVER_ENV) else {
        return;
    };
    let url = std::env::var("DATABASE_URL").expect("the server needs DATABASE_URL");
    // Exit with the parent: it holds our stdin.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    // Panicking handlers are part of the load: keep their messages short.
    std::panic::set_hook(Box::new(|_| {}));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(serve(url, table));
}

#[derive(Clone)]
struct App {
    effects: deadpool_postgres::Pool,
    insert: String,
}

async fn serve(url: String, table: String) {
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 16))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(Duration::from_secs(10))
        .with_listener(pg::pg_config(&url))
        .build();
    store.migrate().await.expect("migrate");
    let app = App {
        effects: pg::pool(pg::pg_config(&url), 8),
        insert: format!(
            "INSERT INTO public.{table}_effects (scope, key, pid) VALUES ($1, $2, $3) RETURNING id"
        ),
    };
    let router = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::new(store).with_wait_timeout(Duration::from_secs(2)))
        .with_state(app);
    support::child::serve(router).await;
}

async fn create_order(State(app): State<App>, headers: HeaderMap) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match header("x-behave").unwrap_or_default() {
        // A validation error: no side effect, not recorded, the key is released.
        "reject" => {
            return Response::builder()
                .status(StatusCode::UNPROCESSABLE_ENTITY)
                .body(axum::body::Body::from(r#"{"error":"invalid"}"#))
                .unwrap()
        }
        "panic" => panic!("handler bug (expected by the soak)"),
        "slow" => tokio::time::sleep(Duration::from_millis(200)).await,
        _ => {}
    }
    let scope = header("x-tenant").unwrap_or_default().to_owned();
    let key = header("idempotency-key").unwrap_or_default().to_owned();
    let pid = std::process::id() as i32;
    let client = app.effects.get().await.expect("effects pool");
    let row = client
        .query_one(&app.insert, &[&scope, &key, &pid])
        .await
        .expect("side effect");
    let id: i64 = row.get(0);
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("location", format!("/orders/{id}"))
        .body(axum::body::Body::from(format!(
            r#"{{"id":{id},"pid":{pid}}}"#
        )))
        .unwrap()
}

// ---------------------------------------------------------------------------
// The parent side
// ---------------------------------------------------------------------------

/// A soak server process on `table`, killed (SIGKILL) when dropped.
fn spawn_server(url: &str, table: &str) -> ChildServer {
    ChildServer::spawn(
        module_path!(),
        "soak_server",
        &[
            (SERVER_ENV, table.to_owned()),
            ("DATABASE_URL", url.to_owned()),
        ],
    )
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

#[derive(Debug, Clone)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    code: String,
    body: Bytes,
}

#[derive(Clone)]
struct Load {
    client: HttpClient,
    servers: [SocketAddr; 2],
    /// The first 201 body per (tenant, key).
    created: Arc<Mutex<HashMap<(String, String), Bytes>>>,
    /// The same keys, in creation order (to pick one cheaply).
    known: Arc<Mutex<Vec<(String, String)>>>,
    next_key: Arc<AtomicUsize>,
    counts: Arc<Mutex<BTreeMap<&'static str, usize>>>,
    requests: Arc<AtomicU64>,
}

impl Load {
    async fn post(
        &self,
        server: usize,
        tenant: &str,
        key: &str,
        body: &str,
        behave: Option<&str>,
    ) -> Option<Answer> {
        self.requests.fetch_add(1, SeqCst);
        let mut request = hyper::Request::post(format!("http://{}/orders", self.servers[server]))
            .header("idempotency-key", key)
            .header("x-tenant", tenant)
            .header("content-type", "application/json");
        if let Some(behave) = behave {
            request = request.header("x-behave", behave);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        // A panicking handler drops the connection: no answer.
        let response = self.client.request(request).await.ok()?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.ok()?.to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Some(Answer {
            status: parts.status,
            replayed: parts.headers.contains_key("idempotent-replayed"),
            code: json["code"].as_str().unwrap_or_default().to_owned(),
            body,
        })
    }

    fn count(&self, what: &'static str) {
        *self.counts.lock().unwrap().entry(what).or_default() += 1;
    }

    fn fresh_key(&self) -> String {
        format!("soak-{:010}", self.next_key.fetch_add(1, SeqCst))
    }

    /// Checks a 201 for `(tenant, key)`: the first one is remembered, every
    /// later one must be its replay.
    fn created(&self, tenant: &str, key: &str, answer: &Answer) {
        assert_eq!(answer.status, StatusCode::CREATED, "{key}: {answer:?}");
        let mut created = self.created.lock().unwrap();
        match created.get(&(tenant.to_owned(), key.to_owned())) {
            Some(first) => {
                assert!(answer.replayed, "{tenant}/{key} ran twice: {answer:?}");
                assert_eq!(&answer.body, first, "{tenant}/{key}: replay differs");
            }
            None => {
                assert!(!answer.replayed, "{tenant}/{key}: replay of nothing");
                created.insert((tenant.to_owned(), key.to_owned()), answer.body.clone());
                drop(created);
                self.known
                    .lock()
                    .unwrap()
                    .push((tenant.to_owned(), key.to_owned()));
            }
        }
    }

    fn known_key(&self, pick: usize) -> Option<(String, String)> {
        let known = self.known.lock().unwrap();
        if known.is_empty() {
            return None;
        }
        Some(known[pick % known.len()].clone())
    }

    /// Sends until the answer is not `idempotency_in_progress` (a duplicate
    /// still running elsewhere) and the handler did not panic.
    async fn settle(&self, server: usize, tenant: &str, key: &str, body: &str) -> Answer {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(answer) = self.post(server, tenant, key, body, None).await {
                if answer.code != "idempotency_in_progress" {
                    return answer;
                }
            }
            assert!(Instant::now() < deadline, "{tenant}/{key} never settled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn one_operation(&self, roll: u64) {
        let server = (roll >> 8) as usize % 2;
        let tenant = TENANTS[(roll >> 16) as usize % TENANTS.len()];
        let order = r#"{"sku":"A-1","qty":2}"#;
        match roll % 100 {
            // A fresh key, sometimes slow.
            0..=34 => {
                let key = self.fresh_key();
                let behave = roll.is_multiple_of(3).then_some("slow");
                let answer = self.post(server, tenant, &key, order, behave).await;
                self.created(tenant, &key, &answer.expect("an answer"));
                self.count("fresh");
            }
            // A replay of a known key, on either process, with another spelling.
            35..=54 => {
                let Some((tenant, key)) = self.known_key((roll >> 24) as usize) else {
                    return;
                };
                let respelled = "{ \"qty\": 2, \"sku\": \"A-1\" }";
                let answer = self.settle(server, &tenant, &key, respelled).await;
                self.created(&tenant, &key, &answer);
                self.count("replay");
            }
            // The same key with another body: refused, the record kept.
            55..=62 => {
                let Some((tenant, key)) = self.known_key((roll >> 24) as usize) else {
                    return;
                };
                let answer = self
                    .post(server, &tenant, &key, r#"{"sku":"B-2","qty":1}"#, None)
                    .await
                    .expect("an answer");
                assert_eq!(answer.status, StatusCode::CONFLICT, "{answer:?}");
                assert_eq!(answer.code, "idempotency_key_reuse");
                self.count("reuse");
            }
            // Four concurrent duplicates, split over both processes.
            63..=82 => {
                let key = self.fresh_key();
                let copies: Vec<_> = (0..4)
                    .map(|i| {
                        let (load, key) = (self.clone(), key.clone());
                        tokio::spawn(async move {
                            load.post(i % 2, tenant, &key, order, Some("slow")).await
                        })
                    })
                    .collect();
                let mut answers = Vec::new();
                for copy in copies {
                    let answer = copy.await.unwrap().expect("an answer");
                    if answer.status == StatusCode::CONFLICT {
                        assert_eq!(answer.code, "idempotency_in_progress", "{answer:?}");
                        continue;
                    }
                    answers.push(answer);
                }
                // The original answer first, then its replays.
                answers.sort_by_key(|a| a.replayed);
                let fresh = answers.iter().filter(|a| !a.replayed).count();
                assert!(fresh <= 1, "{key}: {fresh} copies ran");
                for answer in &answers {
                    self.created(tenant, &key, answer);
                }
                let settled = self.settle(server, tenant, &key, order).await;
                self.created(tenant, &key, &settled);
                self.count("contention");
            }
            // The handler refuses (422): released, so the corrected request runs.
            83..=92 => {
                let key = self.fresh_key();
                let refused = self
                    .post(server, tenant, &key, order, Some("reject"))
                    .await
                    .expect("an answer");
                assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
                let fixed = self.settle(1 - server, tenant, &key, order).await;
                assert!(!fixed.replayed, "{key}: the refusal was not recorded");
                self.created(tenant, &key, &fixed);
                self.count("reject-then-fix");
            }
            // The handler panics: the claim's guard releases the key.
            93..=96 => {
                let key = self.fresh_key();
                let lost = self.post(server, tenant, &key, order, Some("panic")).await;
                assert!(
                    lost.as_ref().is_none_or(|a| a.status.is_server_error()),
                    "{lost:?}"
                );
                let retried = self.settle(1 - server, tenant, &key, order).await;
                self.created(tenant, &key, &retried);
                self.count("panic-then-retry");
            }
            // The same key string in every tenant: one record (and effect) each.
            _ => {
                let key = self.fresh_key();
                for tenant in TENANTS {
                    let answer = self.post(server, tenant, &key, order, None).await;
                    self.created(tenant, &key, &answer.expect("an answer"));
                }
                self.count("same-key-three-tenants");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_two_processes_every_side_effect_is_exactly_one_recorded_key() {
    let Some(url) = pg::database_url("soak_two_processes") else {
        return;
    };
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let table = pg::unique_table("soak");
    pg::store(&url, &table, |s| s).await;
    let sql = pg::connect(&url).await;
    sql.batch_execute(&format!(
        "CREATE TABLE public.{table}_effects (
             id bigserial PRIMARY KEY,
             scope text NOT NULL,
             key text NOT NULL,
             pid integer NOT NULL,
             at timestamptz NOT NULL DEFAULT now()
         )"
    ))
    .await
    .unwrap();
    let servers = [spawn_server(&url, &table), spawn_server(&url, &table)];
    let load = Load {
        client: Client::builder(TokioExecutor::new()).build_http(),
        servers: [servers[0].addr, servers[1].addr],
        created: Arc::default(),
        known: Arc::default(),
        next_key: Arc::default(),
        counts: Arc::default(),
        requests: Arc::default(),
    };

    let until = Instant::now() + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..12u64)
        .map(|worker| {
            let load = load.clone();
            tokio::spawn(async move {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (worker + 1).wrapping_mul(0xff51_afd7);
                while Instant::now() < until {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    load.one_operation(x.wrapping_mul(0x2545_f491_4f6c_dd1d))
                        .await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker assertions");
    }

    // Audit 1: no key has two side effects.
    let doubles = sql
        .query(
            &format!(
                "SELECT scope, key, count(*) FROM public.{table}_effects
                 GROUP BY scope, key HAVING count(*) > 1"
            ),
            &[],
        )
        .await
        .unwrap();
    let doubles: Vec<(String, String, i64)> = doubles
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(doubles.is_empty(), "executed twice: {doubles:?}");

    // Audit 2: effects and completed records match one to one, and each record's
    // body names its effect's id.
    let mismatched = sql
        .query(
            &format!(
                "SELECT e.scope, e.key, r.scope, r.key, r.state
                 FROM public.{table}_effects e
                 FULL OUTER JOIN (SELECT * FROM public.{table} WHERE state = 'completed') r
                   ON r.scope = e.scope AND r.key = e.key
                 WHERE e.id IS NULL OR r.key IS NULL
                    OR convert_from(r.body, 'UTF8')::jsonb ->> 'id' <> e.id::text"
            ),
            &[],
        )
        .await
        .unwrap();
    let mismatched: Vec<_> = mismatched
        .iter()
        .map(|r| {
            (
                r.get::<_, Option<String>>(0),
                r.get::<_, Option<String>>(1),
                r.get::<_, Option<String>>(2),
                r.get::<_, Option<String>>(3),
            )
        })
        .collect();
    assert!(
        mismatched.is_empty(),
        "effects without records or records without effects: {mismatched:?}"
    );

    // Audit 3: nothing is left in progress, and what clients saw is what is stored.
    let in_progress: i64 = sql
        .query_one(
            &format!("SELECT count(*) FROM public.{table} WHERE state = 'in_progress'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(in_progress, 0, "claims left in progress");
    let created = load.created.lock().unwrap().clone();
    let rows = sql
        .query(
            &format!("SELECT scope, key, body FROM public.{table} WHERE state = 'completed'"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        rows.len(),
        created.len(),
        "one record per key clients created"
    );
    for row in rows {
        let id = (row.get::<_, String>(0), row.get::<_, String>(1));
        let body: Vec<u8> = row.get(2);
        assert_eq!(created.get(&id).map(|b| &b[..]), Some(&body[..]), "{id:?}");
    }
    let per_process: Vec<i64> = sql
        .query(
            &format!("SELECT count(*) FROM public.{table}_effects GROUP BY pid"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        per_process.len(),
        2,
        "both processes ran handlers: {per_process:?}"
    );
    let counts = load.counts.lock().unwrap().clone();
    eprintln!(
        "soak {seconds} s: {} requests, {} keys recorded, effects per process {per_process:?}, \
         operations {counts:?}",
        load.requests.load(SeqCst),
        created.len(),
    );
    for what in ["fresh", "replay", "reuse", "contention", "reject-then-fix"] {
        assert!(
            counts.get(what).copied().unwrap_or(0) > 0,
            "no {what} operation ran"
        );
    }
}
