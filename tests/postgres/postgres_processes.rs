//! `PostgresStore` across real processes: server processes sharing one database,
//! a restart, and a `kill -9` in the middle of a request.
//!
//! The test binary re-runs itself as the server: `child_server` returns at once
//! unless `TOWER_IDEMPOTENCY_TEST_SERVER` is set, and otherwise serves an axum app
//! with the layer over `PostgresStore`, whose handler inserts a row into a
//! side-effect table (so the parent counts side effects in SQL) and prints
//! `listening on http://ADDR`.
#![cfg(feature = "postgres")]

use tower_idempotency::store::Completion;
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
use std::net::SocketAddr;
use std::time::Duration;
use support::child::ChildServer;
use support::pg;
use tokio::time::Instant;
use tower_idempotency::{
    store::{FencingToken, RecordKey, Store, StoreError, StoredResponse},
    IdempotencyKey, IdempotencyLayer, PostgresStore, Scope,
};

const SERVER_ENV: &str = "TOWER_IDEMPOTENCY_TEST_SERVER";
const LOCK_ENV: &str = "TOWER_IDEMPOTENCY_TEST_LOCK_MS";
const WAIT_ENV: &str = "TOWER_IDEMPOTENCY_TEST_WAIT_MS";

// ---------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------

/// Not a test: the server process. Returns at once in a normal test run.
#[test]
fn child_server() {
    let Ok(table) = std::env::var(SERVER_ENV) else {
        return;
    };
    let url = std::env::var("DATABASE_URL").expect("the server needs DATABASE_URL");
    let millis = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_millis(default), Duration::from_millis)
    };
    let (lock, wait) = (millis(LOCK_ENV, 60_000), millis(WAIT_ENV, 5_000));
    tower_idempotency_tests::support::child::run_until_parent_exits(serve(url, table, lock, wait));
}

#[derive(Clone)]
struct App {
    effects: deadpool_postgres::Pool,
    insert: String,
}

async fn serve(url: String, table: String, lock: Duration, wait: Duration) {
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 16))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(lock)
        .with_listener(pg::pg_config(&url))
        .build();
    store.migrate().await.expect("migrate");
    let app = App {
        effects: pg::pool(pg::pg_config(&url), 8),
        insert: format!(
            "INSERT INTO public.{table}_effects (idempotency_key, pid) VALUES ($1, $2) RETURNING id"
        ),
    };
    let router = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::new(store).with_wait_timeout(wait))
        .with_state(app);
    support::child::serve(router).await;
}

async fn create_order(State(app): State<App>, headers: HeaderMap) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header("x-sleep-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let key = header("idempotency-key").unwrap_or_default().to_owned();
    let pid = std::process::id() as i32;
    let client = app.effects.get().await.expect("effects pool");
    let row = client
        .query_one(&app.insert, &[&key, &pid])
        .await
        .expect("side effect");
    let id: i64 = row.get(0);
    // Two `link` headers: both are recorded and replayed, in order.
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("location", format!("/orders/{id}"))
        .header("etag", format!("\"order-{id}\""))
        .header("link", "</orders>; rel=\"collection\"")
        .header("link", format!("</orders/{id}/items>; rel=\"items\""))
        .body(axum::body::Body::from(format!(
            r#"{{"id":{id},"pid":{pid}}}"#
        )))
        .unwrap()
}

// ---------------------------------------------------------------------------
// The parent side
// ---------------------------------------------------------------------------

/// A server process on `table`, killed (SIGKILL) when dropped.
fn spawn_server(url: &str, table: &str, lock_ms: u64, wait_ms: u64) -> ChildServer {
    ChildServer::spawn(
        module_path!(),
        "child_server",
        &[
            (SERVER_ENV, table.to_owned()),
            ("DATABASE_URL", url.to_owned()),
            (LOCK_ENV, lock_ms.to_string()),
            (WAIT_ENV, wait_ms.to_string()),
        ],
    )
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn code(&self) -> String {
        let json: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        json["code"].as_str().unwrap_or_default().to_owned()
    }

    /// The replayable headers, in order.
    fn replayable_headers(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter(|(name, _)| {
                ["content-type", "location", "etag", "link"].contains(&name.as_str())
            })
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect()
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn post_order(
    client: &HttpClient,
    server: SocketAddr,
    key: &str,
    sleep_ms: Option<u64>,
) -> Result<Answer, hyper_util::client::legacy::Error> {
    let mut request = hyper::Request::post(format!("http://{server}/orders"))
        .header("idempotency-key", key)
        .header("x-tenant", "tenant")
        .header("content-type", "application/json");
    if let Some(ms) = sleep_ms {
        request = request.header("x-sleep-ms", ms.to_string());
    }
    let request = request
        .body(Full::new(Bytes::from_static(br#"{"sku":"A-1","qty":2}"#)))
        .unwrap();
    let response = client.request(request).await?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("response body").to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// A migrated table (and its side-effect table) for one test.
async fn setup(url: &str, prefix: &str) -> (String, tokio_postgres::Client) {
    let table = pg::unique_table(prefix);
    pg::store(url, &table, |s| s).await;
    let sql = pg::connect(url).await;
    sql.batch_execute(&format!(
        "CREATE TABLE public.{table}_effects (
             id bigserial PRIMARY KEY,
             idempotency_key text NOT NULL,
             pid integer NOT NULL,
             at timestamptz NOT NULL DEFAULT now()
         )"
    ))
    .await
    .unwrap();
    (table, sql)
}

async fn side_effects(sql: &tokio_postgres::Client, table: &str, key: &str) -> i64 {
    sql.query_one(
        &format!("SELECT count(*) FROM public.{table}_effects WHERE idempotency_key = $1"),
        &[&key],
    )
    .await
    .unwrap()
    .get(0)
}

fn record_key(key: &str) -> RecordKey {
    RecordKey::new(
        Scope::new("tenant"),
        IdempotencyKey::parse(key.as_bytes()).unwrap(),
    )
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_run_200_concurrent_duplicates_exactly_once() {
    let Some(url) = pg::database_url("two_server_processes_run_200_concurrent_duplicates") else {
        return;
    };
    let (table, sql) = setup(&url, "two_servers").await;
    let servers = [
        spawn_server(&url, &table, 60_000, 5_000),
        spawn_server(&url, &table, 60_000, 5_000),
    ];
    let client = http_client();
    let key = "order-two-servers-1";
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (client, addr) = (client.clone(), servers[i % 2].addr);
            tokio::spawn(async move { post_order(&client, addr, key, Some(300)).await })
        })
        .collect();
    let (mut created, mut in_progress, mut bodies) = (0, 0, Vec::new());
    for task in tasks {
        let answer = task.await.unwrap().expect("HTTP request");
        match answer.status {
            StatusCode::CREATED => {
                created += 1;
                bodies.push(answer.body);
            }
            StatusCode::CONFLICT => {
                assert_eq!(answer.code(), "idempotency_in_progress");
                in_progress += 1;
            }
            other => panic!("unexpected status {other}: {:?}", answer.body),
        }
    }
    assert_eq!(
        side_effects(&sql, &table, key).await,
        1,
        "exactly one side effect"
    );
    assert!(created >= 1);
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every 201 is the same order"
    );
    eprintln!("{created} created or replayed, {in_progress} in progress, over two processes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_survive_a_server_restart_byte_for_byte() {
    let Some(url) = pg::database_url("replays_survive_a_server_restart_byte_for_byte") else {
        return;
    };
    let (table, sql) = setup(&url, "restart").await;
    let client = http_client();
    let key = "order-restart-1";

    let mut first_server = spawn_server(&url, &table, 60_000, 5_000);
    let first = post_order(&client, first_server.addr, key, None)
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    first_server.kill();

    let second_server = spawn_server(&url, &table, 60_000, 5_000);
    let replay = post_order(&client, second_server.addr, key, None)
        .await
        .unwrap();
    assert_eq!(replay.status, first.status);
    assert_eq!(replay.body, first.body, "byte-identical body");
    assert_eq!(replay.replayable_headers(), first.replayable_headers());
    assert_eq!(replay.replayable_headers().len(), 5);
    assert_eq!(replay.headers["idempotent-replayed"], "true");
    assert_eq!(side_effects(&sql, &table, key).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_owner_blocks_until_its_lock_expires_then_runs_once_and_is_fenced() {
    let Some(url) = pg::database_url("killed_owner_blocks_until_its_lock_expires") else {
        return;
    };
    let (table, sql) = setup(&url, "crash").await;
    let client = http_client();
    let key = "order-crash-1";
    // A short lock (3 s); duplicates answer 409 at once instead of waiting.
    let mut doomed = spawn_server(&url, &table, 3_000, 0);
    let survivor = spawn_server(&url, &table, 3_000, 0);

    // The doomed server claims the key and sleeps in its handler.
    let hanging = {
        let (client, addr) = (client.clone(), doomed.addr);
        tokio::spawn(async move { post_order(&client, addr, key, Some(60_000)).await })
    };
    let claim_sql = format!(
        "SELECT token FROM public.{table} WHERE scope = 'tenant' AND key = $1 \
         AND state = 'in_progress'"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead_token: i64 = loop {
        if let Some(row) = sql.query_opt(&claim_sql, &[&key]).await.unwrap() {
            break row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "the doomed server never claimed the key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    doomed.kill();
    assert!(
        hanging.await.unwrap().is_err(),
        "the killed server never answered"
    );

    // Before the lock expires: in progress, the handler does not run.
    let early = post_order(&client, survivor.addr, key, None).await.unwrap();
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(early.code(), "idempotency_in_progress");
    assert!(early.headers.contains_key("retry-after"));
    assert_eq!(side_effects(&sql, &table, key).await, 0);

    // Wait for the expiry on the database's clock.
    let expired_sql = format!(
        "SELECT expires_at <= now() FROM public.{table} WHERE scope = 'tenant' AND key = $1"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sql
        .query_one(&expired_sql, &[&key])
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the lock never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // After it: the retry takes over and runs exactly once; later retries replay.
    let retried = post_order(&client, survivor.addr, key, None).await.unwrap();
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.headers.contains_key("idempotent-replayed"));
    let replayed = post_order(&client, survivor.addr, key, None).await.unwrap();
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    assert_eq!(replayed.body, retried.body);
    assert_eq!(side_effects(&sql, &table, key).await, 1, "ran exactly once");
    let token_sql = format!("SELECT token FROM public.{table} WHERE scope = 'tenant' AND key = $1");
    let new_token: i64 = sql.query_one(&token_sql, &[&key]).await.unwrap().get(0);
    assert!(new_token > dead_token, "the takeover has a higher token");

    // The dead owner's token is fenced: its late completion cannot overwrite.
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 1))
        .with_table(table.parse().unwrap())
        .build();
    let late = StoredResponse {
        status: http::StatusCode::CREATED,
        headers: Vec::new(),
        body: Bytes::from_static(b"late"),
    };
    let record = record_key(key);
    assert!(matches!(
        store
            .complete(
                &record,
                FencingToken::new(dead_token),
                Completion::Response(late)
            )
            .await,
        Err(StoreError::ClaimLost)
    ));
    store
        .release(&record, FencingToken::new(dead_token))
        .await
        .unwrap();
    let after = post_order(&client, survivor.addr, key, None).await.unwrap();
    assert_eq!(after.body, retried.body, "the new owner's response stands");
    assert_eq!(side_effects(&sql, &table, key).await, 1);
}
