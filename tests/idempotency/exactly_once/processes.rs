//! Real server processes on one PostgreSQL, killed with SIGKILL at each point
//! between a charge and its record, while the client retries on another
//! instance until it is answered.
//!
//! The test binary re-runs itself as the server (`processes::child_server`,
//! which returns at once in a normal run). Its handler charges, waits, then
//! writes the order, printing a marker at each point so the parent kills it
//! exactly there; an outer middleware marks the moment after the record
//! committed and before the answer leaves.
//!
//! The charge stands for a processor that honours idempotency keys: a row
//! under a unique downstream key (the request's `DownstreamKeys`), which a
//! second charge under the same key returns instead of adding. The order is
//! a plain insert, as a write that carries no such key.

use super::support::child::ChildServer;
use super::support::pg;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use std::time::Duration;
use tokio::time::{sleep, Instant};
use tower_idempotency::{
    downstream::DownstreamKeys, IdempotencyLayer, PostgresStore, PostgresTransaction,
};

const CHILD_ENV: &str = "TOWER_IDEMPOTENCY_EXACTLY_ONCE_CHILD";
/// The lock timeout of both instances: how long a dead owner's key is blocked.
const LOCK: Duration = Duration::from_secs(2);
/// How long the handler pauses at each marked point.
const PAUSE: Duration = Duration::from_millis(600);

// ---------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------

/// Not a test: the server process. Returns at once in a normal test run.
#[test]
fn child_server() {
    let Ok(config) = std::env::var(CHILD_ENV) else {
        return;
    };
    // `MODE TABLE`: `transactional` or `plain`, the records' table (whose
    // `_charges` and `_orders` tables the parent created).
    let (mode, table) = config.split_once(' ').expect("mode and table");
    let (mode, table) = (mode.to_owned(), table.to_owned());
    let url = std::env::var("DATABASE_URL").expect("the server needs DATABASE_URL");
    tower_idempotency_tests::support::child::run_until_parent_exits(serve(url, mode, table));
}

#[derive(Clone)]
struct Shop {
    /// Plain mode only: the handler commits its own writes.
    pool: Option<deadpool_postgres::Pool>,
    table: String,
}

async fn serve(url: String, mode: String, table: String) {
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 16))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(LOCK)
        .with_listener(pg::pg_config(&url))
        .build();
    let (layer, pool) = match mode.as_str() {
        "transactional" => (IdempotencyLayer::transactional(store), None),
        _ => (
            IdempotencyLayer::new(store),
            Some(pg::pool(pg::pg_config(&url), 8)),
        ),
    };
    let router = Router::new()
        .route("/orders", post(charge_then_order))
        .route_layer(layer)
        .with_state(Shop { pool, table })
        .layer(axum::middleware::from_fn(mark_answered));
    super::support::child::serve(router).await;
}

fn mark(point: &str, key: &str) {
    println!("@@ {point} {key}");
}

/// Outside the layer: the record is committed once the inner service answered.
async fn mark_answered(req: Request, next: Next) -> Response {
    let key = idempotency_key(&req);
    let response = next.run(req).await;
    mark("answered", &key);
    sleep(PAUSE).await;
    response
}

fn idempotency_key(req: &Request) -> String {
    req.headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

async fn charge_then_order(State(shop): State<Shop>, req: Request) -> (StatusCode, String) {
    let key = idempotency_key(&req);
    let tx = req.extensions().get::<PostgresTransaction>().cloned();
    let charge_key = req
        .extensions()
        .get::<DownstreamKeys>()
        .expect("the layer gives every claimed request its downstream keys")
        .key_for("card-processor")
        .to_string();
    let query = |sql: String, params: Vec<String>| {
        let (shop, tx) = (shop.clone(), tx.clone());
        async move {
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                params.iter().map(|p| p as _).collect();
            let row = match (&tx, &shop.pool) {
                (Some(tx), _) => tx.client().await.unwrap().query_one(&sql, &params).await,
                (None, Some(pool)) => pool.get().await.unwrap().query_one(&sql, &params).await,
                (None, None) => panic!("transactional mode without a transaction"),
            };
            row.expect("insert").get::<_, String>(0)
        }
    };
    mark("before-charge", &key);
    sleep(PAUSE).await;
    // As a processor does with its idempotency key: the first charge again.
    let charge = query(
        format!(
            "INSERT INTO {}_charges (key, downstream_key) VALUES ($1, $2) \
             ON CONFLICT (downstream_key) DO UPDATE SET key = EXCLUDED.key \
             RETURNING 'ch_' || id",
            shop.table
        ),
        vec![key.clone(), charge_key],
    )
    .await;
    mark("charged", &key);
    sleep(PAUSE).await;
    let order = query(
        format!(
            "INSERT INTO {}_orders (key) VALUES ($1) RETURNING 'ord_' || id",
            shop.table
        ),
        vec![key.clone()],
    )
    .await;
    mark("ordered", &key);
    sleep(PAUSE).await;
    (
        StatusCode::CREATED,
        format!(r#"{{"order":"{order}","charge":"{charge}"}}"#),
    )
}

// ---------------------------------------------------------------------------
// The parent side
// ---------------------------------------------------------------------------

struct Shops {
    url: String,
    table: String,
    mode: &'static str,
}

impl Shops {
    async fn new(url: &str, mode: &'static str) -> Self {
        let table = pg::unique_table("killed");
        let store = PostgresStore::builder(pg::pool(pg::pg_config(url), 2))
            .with_table(table.parse().unwrap())
            .build();
        store.migrate().await.unwrap();
        pg::connect(url)
            .await
            .batch_execute(&format!(
                "CREATE TABLE {table}_charges (id bigserial PRIMARY KEY, key text NOT NULL,
                     downstream_key text NOT NULL UNIQUE);
                 CREATE TABLE {table}_orders (id bigserial PRIMARY KEY, key text NOT NULL);"
            ))
            .await
            .unwrap();
        Self {
            url: url.to_owned(),
            table,
            mode,
        }
    }

    fn spawn(&self) -> ChildServer {
        ChildServer::spawn(
            module_path!(),
            "child_server",
            &[
                (CHILD_ENV, format!("{} {}", self.mode, self.table)),
                ("DATABASE_URL", self.url.clone()),
            ],
        )
    }

    /// The ids of the charges and orders written for `key`.
    async fn rows(&self, key: &str) -> (Vec<String>, Vec<String>) {
        let sql = pg::connect(&self.url).await;
        let mut ids = Vec::new();
        for (table, prefix) in [("charges", "ch_"), ("orders", "ord_")] {
            let rows = sql
                .query(
                    &format!(
                        "SELECT $2 || id FROM {}_{table} WHERE key = $1 ORDER BY id",
                        self.table
                    ),
                    &[&key, &prefix],
                )
                .await
                .unwrap();
            ids.push(rows.iter().map(|r| r.get(0)).collect());
        }
        let orders = ids.pop().unwrap();
        (ids.pop().unwrap(), orders)
    }
}

/// One POST; `None` when the connection failed (the server was killed).
async fn post_order(addr: std::net::SocketAddr, key: &str) -> Option<(StatusCode, String)> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let req = http::Request::post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("x-tenant", "acme")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"sku":"A-1","qty":1}"#,
        )))
        .unwrap();
    let res = client.request(req).await.ok()?;
    let status = res.status();
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .ok()?
        .to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Retries on `addr` until a `201`; every other answer must be "in progress".
async fn retry_until_created(addr: std::net::SocketAddr, key: &str) -> String {
    let start = Instant::now();
    loop {
        let (status, body) = post_order(addr, key).await.expect("the survivor answers");
        if status == StatusCode::CREATED {
            return body;
        }
        assert!(body.contains("idempotency_in_progress"), "{status} {body}");
        assert!(start.elapsed() < Duration::from_secs(30), "never answered");
        sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the first instance at `point` of the first request of `key`, then
/// retries on the second until answered. Returns the answer and, when the
/// retry ran the handler, how long after the kill it started.
async fn kill_at(shops: &Shops, point: &str, key: &str) -> (String, Option<Duration>) {
    let (mut first, second) = (shops.spawn(), shops.spawn());
    let request = tokio::spawn({
        let (addr, key) = (first.addr, key.to_owned());
        async move { post_order(addr, &key).await }
    });
    first
        .printed(&format!("@@ {point} {key}"), Duration::from_secs(20))
        .await;
    first.kill();
    let killed = Instant::now();
    assert!(
        request.await.unwrap().is_none(),
        "the first client got no answer"
    );
    let retry = tokio::spawn({
        let (addr, key) = (second.addr, key.to_owned());
        async move { retry_until_created(addr, &key).await }
    });
    let started = match point {
        "answered" => None,
        _ => {
            let marker = format!("@@ before-charge {key}");
            second.printed(&marker, Duration::from_secs(20)).await;
            Some(killed.elapsed())
        }
    };
    (retry.await.unwrap(), started)
}

fn database() -> Option<String> {
    pg::database_url("processes killed with SIGKILL")
}

/// Transactional mode: killed before the charge, after it or after the order
/// (uncommitted), or after the commit: one charge, one order, the answer
/// names them, and the key is free within the lock timeout of the kill (the
/// killed connection's transaction is rolled back as soon as PostgreSQL sees
/// it close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_killed_anywhere_charges_once() {
    let Some(url) = database() else { return };
    let shops = Shops::new(&url, "transactional").await;
    for point in ["before-charge", "charged", "ordered", "answered"] {
        let key = format!("order-kill-{point}");
        let (body, started) = kill_at(&shops, point, &key).await;
        let (charges, orders) = shops.rows(&key).await;
        assert_eq!((charges.len(), orders.len()), (1, 1), "killed at {point}");
        assert!(
            body.contains(&orders[0]) && body.contains(&charges[0]),
            "{body}"
        );
        // The recovery bound: the key is claimable again at most one lock
        // timeout after its claim (which came before the kill), plus the
        // retry's period. After "answered" the retry replays the commit.
        if let Some(started) = started {
            assert!(
                started < LOCK + Duration::from_secs(1),
                "{point}: {started:?}"
            );
            println!("killed at {point}: the retry's handler ran {started:?} after the kill");
        }
    }
}

/// Plain mode: nothing records that a killed handler ran, so after a kill
/// past the charge the retry (after the lock) runs the handler again. The
/// charge, sent under the request's downstream key, is made once wherever
/// the kill: the run again gets the first charge back. The order, a write
/// of its own without such a key, is written again after a kill between it
/// and the record: every effect outside the store's transaction needs its
/// downstream key (transactional mode covers the writes to its database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_mode_charges_once_under_its_downstream_key_and_an_unkeyed_write_may_repeat() {
    let Some(url) = database() else { return };
    let shops = Shops::new(&url, "plain").await;
    let points = [
        ("before-charge", 1),
        ("charged", 1),
        ("ordered", 2),
        ("answered", 1),
    ];
    for (point, orders_expected) in points {
        let key = format!("order-plain-{point}");
        let (body, _) = kill_at(&shops, point, &key).await;
        let (charges, orders) = shops.rows(&key).await;
        assert_eq!(charges.len(), 1, "killed at {point}");
        assert!(body.contains(&charges[0]), "{body}");
        assert_eq!(orders.len(), orders_expected, "killed at {point}");
        assert!(body.contains(orders.last().unwrap()), "{body}");
    }
}

/// 200 concurrent duplicates split over two instances: one charge, one order,
/// and every answer names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_duplicates_across_two_processes_charge_once() {
    let Some(url) = database() else { return };
    let shops = Shops::new(&url, "transactional").await;
    let (a, b) = (shops.spawn(), shops.spawn());
    let key = "order-dup-200";
    let answers: Vec<_> = (0..200)
        .map(|i| {
            let addr = if i % 2 == 0 { a.addr } else { b.addr };
            tokio::spawn(async move { post_order(addr, key).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for answer in answers {
        let (status, body) = answer.await.unwrap().expect("answered");
        assert_eq!(status, StatusCode::CREATED, "{body}");
        bodies.push(body);
    }
    let (charges, orders) = shops.rows(key).await;
    assert_eq!((charges.len(), orders.len()), (1, 1));
    assert!(bodies.iter().all(|b| b.contains(&orders[0])));
}
