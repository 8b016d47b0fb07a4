//! Faults with `IdempotencyLayer` over `PostgresStore`, none of which stops the
//! shared database server (that is `faults_pg_restart.rs`):
//!
//! - a slow database (a table lock held by another transaction, so statements
//!   block) and an exhausted pool: every request is answered `503` within the
//!   operation timeout, concurrently, instead of queueing without bound; the
//!   service recovers when the lock goes, and a claim left behind by a
//!   timed-out statement frees the key at its lock expiry, never later;
//! - handler errors, panics, futures dropped mid-handler, response bodies that
//!   fail while streaming: the key is released (no row left), never recorded;
//! - a future dropped while its response is being recorded, a release or a
//!   completion that fails because the database went away: the claim is kept
//!   until its lock expires (so nothing runs twice meanwhile), then a retry
//!   takes it over.
//!
//! `layer_failures.rs` proves the release paths with `MemoryStore`; these prove
//! them against the real database, reading the rows in SQL.
#![cfg(feature = "postgres")]

use tower_idempotency::store::Maintenance;
use tower_idempotency_tests::support;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use support::pg;
use tokio::time::{sleep, Instant};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::{
    body::{BoxError, ResponseBody},
    store::PostgresStoreBuilder,
    IdempotencyLayer, PostgresStore, Scope,
};

const LOCK: Duration = Duration::from_secs(2);
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A handler whose behaviour each request chooses (`x-mode`)
// ---------------------------------------------------------------------------

/// The handler's response body: whole, failing mid-stream, never ending, or
/// panicking (at its first poll, or after a first frame and, if `wait`, a wait).
enum TestBody {
    Whole(Option<Bytes>),
    Failing(u8),
    Endless,
    Panicking {
        polls: u8,
        first_frame: bool,
        wait: bool,
    },
    /// A data frame, then trailers (`grpc-status: 0`, as native gRPC ends).
    Trailed(u8),
}

impl http_body::Body for TestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            TestBody::Whole(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            TestBody::Failing(step) => {
                *step += 1;
                match step {
                    1 => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"order\":"))))),
                    _ => Poll::Ready(Some(Err("upstream reset mid-body".into()))),
                }
            }
            TestBody::Endless => Poll::Pending,
            TestBody::Trailed(step) => {
                *step += 1;
                Poll::Ready(match step {
                    1 => Some(Ok(Frame::data(Bytes::from_static(b"{\"order\":1}")))),
                    2 => {
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        Some(Ok(Frame::trailers(trailers)))
                    }
                    _ => None,
                })
            }
            TestBody::Panicking {
                polls,
                first_frame,
                wait,
            } => {
                *polls += 1;
                match (*polls, *first_frame, *wait) {
                    (1, true, _) => {
                        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"charge\":")))))
                    }
                    (2, true, true) => {
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    _ => panic!("response body bug (expected by this test)"),
                }
            }
        }
    }
}

#[derive(Clone, Default)]
struct Handler {
    runs: Arc<Mutex<HashMap<String, usize>>>,
    /// Taken down by the `down-then-*` modes, after the handler's work.
    proxy: Option<Arc<tower_idempotency_tests::support::proxy::Proxy>>,
}

impl Handler {
    fn runs(&self, key: &str) -> usize {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<Full<Bytes>>,
        Response = Response<TestBody>,
        Error = BoxError,
        Future = impl std::future::Future<Output = Result<Response<TestBody>, BoxError>> + Send,
    > + Clone
           + Send
           + 'static {
        let this = self.clone();
        tower::service_fn(move |req: Request<Full<Bytes>>| {
            let this = this.clone();
            async move {
                let key = req.headers()["idempotency-key"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                let mode = req
                    .headers()
                    .get("x-mode")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                let run = {
                    let mut runs = this.runs.lock().unwrap();
                    let n = runs.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                let created = |body| {
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .header("content-type", "application/json")
                        .body(body)
                        .unwrap()
                };
                match mode.as_str() {
                    "error" => Err("handler failed".into()),
                    "panic" => panic!("handler bug (expected by this test)"),
                    "hang" => {
                        sleep(Duration::from_secs(3600)).await;
                        unreachable!()
                    }
                    "fail-body" => Ok(created(TestBody::Failing(0))),
                    "endless-body" => Ok(created(TestBody::Endless)),
                    "trailers-body" => Ok(created(TestBody::Trailed(0))),
                    "panic-body-first" => Ok(created(TestBody::Panicking {
                        polls: 0,
                        first_frame: false,
                        wait: false,
                    })),
                    "panic-body-next" => Ok(created(TestBody::Panicking {
                        polls: 0,
                        first_frame: true,
                        wait: false,
                    })),
                    "panic-body-later" => Ok(created(TestBody::Panicking {
                        polls: 0,
                        first_frame: true,
                        wait: true,
                    })),
                    "down-then-error" => {
                        this.proxy.as_ref().unwrap().set_up(false);
                        // Let the proxy cut its connections before the layer goes on.
                        sleep(Duration::from_millis(200)).await;
                        Err("handler failed while the database went away".into())
                    }
                    "down-then-201" => {
                        this.proxy.as_ref().unwrap().set_up(false);
                        sleep(Duration::from_millis(200)).await;
                        let body = format!(r#"{{"order":"{key}","run":{run}}}"#);
                        Ok(created(TestBody::Whole(Some(body.into()))))
                    }
                    _ => {
                        let body = format!(r#"{{"order":"{key}","run":{run}}}"#);
                        Ok(created(TestBody::Whole(Some(body.into()))))
                    }
                }
            }
        })
    }
}

fn request(key: &str, mode: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json");
    if let Some(mode) = mode {
        builder = builder.header("x-mode", mode);
    }
    let mut req = builder
        .body(Full::new(Bytes::from_static(br#"{"sku":"A-1"}"#)))
        .unwrap();
    req.extensions_mut().insert(Scope::new("tenant"));
    req
}

type Answer = Response<ResponseBody<TestBody>>;

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    replayed: bool,
    code: String,
    body: Bytes,
}

async fn send<S>(svc: &S, key: &str, mode: Option<&str>) -> Reply
where
    S: Service<Request<Full<Bytes>>, Response = Answer, Error = BoxError> + Clone,
{
    let (parts, body) = svc
        .clone()
        .oneshot(request(key, mode))
        .await
        .expect("the handler succeeded")
        .into_parts();
    let body = body.collect().await.expect("a whole body").to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    Reply {
        status: parts.status,
        replayed: parts.headers.contains_key("idempotent-replayed"),
        code: json["code"].as_str().unwrap_or_default().to_owned(),
        body,
    }
}

/// The record's state in SQL: `None` (no row), `in_progress` or `completed`.
async fn state(sql: &tokio_postgres::Client, table: &str, key: &str) -> Option<String> {
    sql.query_opt(
        &format!("SELECT state FROM public.{table} WHERE scope = 'tenant' AND key = $1"),
        &[&key],
    )
    .await
    .unwrap()
    .map(|row| row.get(0))
}

async fn until_state(sql: &tokio_postgres::Client, table: &str, key: &str, want: Option<&str>) {
    let deadline = Instant::now() + PATIENCE;
    while state(sql, table, key).await.as_deref() != want {
        assert!(
            Instant::now() < deadline,
            "{key}: never reached {want:?}, stuck at {:?}",
            state(sql, table, key).await
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A migrated table; the store on it; a plain SQL connection.
async fn setup(
    url: &str,
    prefix: &str,
    configure: impl FnOnce(PostgresStoreBuilder) -> PostgresStoreBuilder,
) -> (String, PostgresStore, tokio_postgres::Client) {
    let table = pg::unique_table(prefix);
    let store = pg::store(url, &table, |s| configure(s.with_lock_timeout(LOCK))).await;
    (table, store, pg::connect(url).await)
}

/// A store whose connections go through a proxy the test can take down,
/// with the lock of `setup` and a 2 s operation timeout; the table is migrated
/// directly. Returns the table, the store, the proxy and a direct SQL client.
async fn setup_behind_proxy(
    url: &str,
    prefix: &str,
) -> (
    String,
    PostgresStore,
    Arc<tower_idempotency_tests::support::proxy::Proxy>,
    tokio_postgres::Client,
) {
    let table = pg::unique_table(prefix);
    pg::store(url, &table, |s| s).await;
    let sql = pg::connect(url).await;
    let proxy = Arc::new(
        tower_idempotency_tests::support::proxy::Proxy::start(pg::server_addr(url).await).await,
    );
    let store = PostgresStore::builder(pg::pool(pg::pg_config_at(url, proxy.port), 4))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(LOCK)
        .with_operation_timeout(Duration::from_secs(2))
        .build();
    (table, store, proxy, sql)
}

/// Retries `key` until it runs (`201`): until then every answer must be
/// `idempotency_in_progress`, and never later than the lock after `since`.
async fn retry_until_created<S>(svc: &S, key: &str, since: Instant) -> Reply
where
    S: Service<Request<Full<Bytes>>, Response = Answer, Error = BoxError> + Clone,
{
    loop {
        let reply = send(svc, key, None).await;
        if reply.status == StatusCode::CREATED {
            return reply;
        }
        assert_eq!(reply.code, "idempotency_in_progress", "{reply:?}");
        assert!(
            since.elapsed() < LOCK + Duration::from_secs(3),
            "stuck beyond its lock"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------
// Slow database, exhausted pool
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_database_answers_503_within_the_operation_timeout_then_recovers() {
    let Some(url) = pg::database_url("slow_database_answers_503_within_the_operation_timeout")
    else {
        return;
    };
    let op = Duration::from_millis(500);
    let (table, store, sql) = setup(&url, "faults_slow", |s| s.with_operation_timeout(op)).await;
    let handler = Handler::default();
    let svc = IdempotencyLayer::new(store)
        .with_wait_timeout(Duration::from_secs(5))
        .layer(handler.service());
    send(&svc, "order-warm-0001", None).await; // connections open, statements prepared

    // Another transaction holds the table: every statement on it blocks.
    let mut locker = pg::connect(&url).await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "LOCK TABLE public.{table} IN ACCESS EXCLUSIVE MODE"
    ))
    .await
    .unwrap();

    let started = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let began = Instant::now();
                let reply = send(&svc, &format!("order-slow-{i:04}"), None).await;
                (reply, began.elapsed())
            })
        })
        .collect();
    for task in tasks {
        let (reply, took) = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(reply.code, "idempotency_store_unavailable");
        assert!(
            took < op + Duration::from_millis(1500),
            "answered in {took:?}"
        );
    }
    let all = started.elapsed();
    assert!(
        all < Duration::from_secs(5),
        "64 concurrent requests answered in {all:?}: bounded, not queued one after another"
    );
    assert!((0..64).all(|i| handler.runs(&format!("order-slow-{i:04}")) == 0));

    // The lock goes: the service recovers without a restart.
    tx.commit().await.unwrap();
    let fresh = send(&svc, "order-after-0001", None).await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{fresh:?}");

    // The timed-out statements ran once the lock was released, so some of those
    // keys may hold a claim nobody owns. It frees at its lock expiry: a retry
    // (waiting up to 5 s) gets its answer, and each request runs exactly once.
    let orphans: i64 = sql
        .query_one(
            &format!("SELECT count(*) FROM public.{table} WHERE state = 'in_progress'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let retried = Instant::now();
    for i in 0..64 {
        let key = format!("order-slow-{i:04}");
        let reply = send(&svc, &key, None).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{key}: {reply:?}");
        assert_eq!(handler.runs(&key), 1, "{key}");
    }
    assert!(
        retried.elapsed() < LOCK + Duration::from_secs(5),
        "orphaned claims held no key beyond its lock: {:?}",
        retried.elapsed()
    );
    eprintln!("slow database: 64 x 503 in {all:?}; {orphans} orphaned claims freed by their lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_answers_503_within_the_operation_timeout_then_recovers() {
    let Some(url) = pg::database_url("exhausted_pool_answers_503") else {
        return;
    };
    let table = pg::unique_table("faults_pool");
    pg::store(&url, &table, |s| s).await;
    // deadpool waits up to 5 s for a connection; the store gives up at 300 ms.
    let pool = pg::pool(pg::pg_config(&url), 2);
    let op = Duration::from_millis(300);
    let store = PostgresStore::builder(pool.clone())
        .with_table(table.parse().unwrap())
        .with_operation_timeout(op)
        .build();
    let handler = Handler::default();
    let svc = IdempotencyLayer::new(store).layer(handler.service());
    assert_eq!(
        send(&svc, "order-pool-warm1", None).await.status,
        StatusCode::CREATED
    );

    // Something else (a leak, a long report) holds every connection.
    let held = [pool.get().await.unwrap(), pool.get().await.unwrap()];
    let started = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let began = Instant::now();
                (
                    send(&svc, &format!("order-pool-{i:04}"), None).await,
                    began.elapsed(),
                )
            })
        })
        .collect();
    for task in tasks {
        let (reply, took) = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(reply.code, "idempotency_store_unavailable");
        assert!(
            took < op + Duration::from_millis(1500),
            "answered in {took:?}"
        );
    }
    let all = started.elapsed();
    // One after another they would take 30 s.
    assert!(all < Duration::from_secs(5), "100 requests took {all:?}");
    assert!((0..100).all(|i| handler.runs(&format!("order-pool-{i:04}")) == 0));

    drop(held);
    for i in 0..100 {
        let key = format!("order-pool-{i:04}");
        assert_eq!(send(&svc, &key, None).await.status, StatusCode::CREATED);
        assert_eq!(handler.runs(&key), 1);
    }
}

// ---------------------------------------------------------------------------
// Release paths
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_error_panic_and_dropped_future_release_the_row() {
    let Some(url) = pg::database_url("handler_error_panic_and_dropped_future_release_the_row")
    else {
        return;
    };
    let (table, store, sql) = setup(&url, "faults_release", |s| s).await;
    let handler = Handler::default();
    // With the opt-out, a dropped future cuts the handler (run to completion,
    // the default, is in `exactly_once`).
    let svc = IdempotencyLayer::new(store)
        .with_cancel_on_drop(true)
        .layer(handler.service());

    // An error: released before the error is returned.
    let error = svc
        .clone()
        .oneshot(request("order-error-01", Some("error")))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "handler failed");
    assert_eq!(state(&sql, &table, "order-error-01").await, None);

    // A panic: released by the claim's guard, in a spawned task.
    let joined = tokio::spawn(
        svc.clone()
            .oneshot(request("order-panic-01", Some("panic"))),
    )
    .await;
    assert!(joined.unwrap_err().is_panic());
    until_state(&sql, &table, "order-panic-01", None).await;

    // The client goes away mid-handler: the future is dropped, the row released.
    let hanging = tokio::spawn(
        svc.clone()
            .oneshot(request("order-hang-0001", Some("hang"))),
    );
    until_state(&sql, &table, "order-hang-0001", Some("in_progress")).await;
    hanging.abort();
    assert!(hanging.await.unwrap_err().is_cancelled());
    until_state(&sql, &table, "order-hang-0001", None).await;

    // Each key is free: the corrected request runs once, then replays.
    for key in ["order-error-01", "order-panic-01", "order-hang-0001"] {
        let first = send(&svc, key, None).await;
        assert_eq!((first.status, first.replayed), (StatusCode::CREATED, false));
        let again = send(&svc, key, None).await;
        assert!(
            again.replayed && again.body == first.body,
            "{key}: {again:?}"
        );
        assert_eq!(handler.runs(key), 2, "{key}: the failed run and the retry");
        assert_eq!(state(&sql, &table, key).await.as_deref(), Some("completed"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_body_failing_mid_stream_is_never_recorded() {
    let Some(url) = pg::database_url("response_body_failing_mid_stream_is_never_recorded") else {
        return;
    };
    let (table, store, sql) = setup(&url, "faults_body", |s| s).await;
    let handler = Handler::default();
    let svc = IdempotencyLayer::new(store).layer(handler.service());
    let key = "order-body-0001";
    let answer = svc
        .clone()
        .oneshot(request(key, Some("fail-body")))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let error = answer.into_body().collect().await.unwrap_err();
    assert!(error.to_string().contains("upstream reset"), "{error}");
    assert_eq!(
        state(&sql, &table, key).await.as_deref(),
        Some("unavailable"),
        "completed without a response, never released"
    );
    let retry = send(&svc, key, None).await;
    assert_eq!(
        (retry.status, retry.code.as_str()),
        (StatusCode::GONE, "idempotency_response_unavailable")
    );
    assert_eq!(handler.runs(key), 1, "never run again");
}

/// The first answer to a request whose response body panicked: a `5xx`, or
/// a body that fails; never one cut short that ends cleanly.
async fn assert_failed_answer<S>(svc: &S, key: &str, mode: &str)
where
    S: Service<Request<Full<Bytes>>, Response = Answer, Error = BoxError> + Clone,
{
    let answer = svc
        .clone()
        .oneshot(request(key, Some(mode)))
        .await
        .expect("an answer");
    if !answer.status().is_server_error() {
        let read = tokio::time::timeout(PATIENCE, answer.into_body().collect()).await;
        let read = read.unwrap_or_else(|_| panic!("{mode}: the body never ended"));
        assert!(
            read.is_err(),
            "{mode}: a truncated body ended cleanly: {:?}",
            read.map(|body| body.to_bytes())
        );
    }
}

/// The handler answered `201` (its effects happened), then its body
/// panicked: a failed body. The row is completed as "response unavailable",
/// and retries, even past the claim's lock, get `410`, never a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_body_that_panics_completes_the_key_and_never_runs_again() {
    let Some(url) = pg::database_url("a_response_body_that_panics_completes_the_key") else {
        return;
    };
    let (table, store, sql) = setup(&url, "faults_panic_body", |s| s).await;
    let handler = Handler::default();
    let svc = IdempotencyLayer::new(store).layer(handler.service());
    let cases = [
        ("order-panic-first", "panic-body-first"),
        ("order-panic-next", "panic-body-next"),
        ("order-panic-later", "panic-body-later"),
    ];
    for (key, mode) in cases {
        assert_failed_answer(&svc, key, mode).await;
        until_state(&sql, &table, key, Some("unavailable")).await;
    }
    // Past the claim's lock: a claim left in progress would be taken over now.
    sleep(LOCK + Duration::from_millis(500)).await;
    for (key, _) in cases {
        for _ in 0..2 {
            let retry = send(&svc, key, None).await;
            assert_eq!(
                (retry.status, retry.code.as_str()),
                (StatusCode::GONE, "idempotency_response_unavailable"),
                "{key}: {retry:?}"
            );
        }
        assert_eq!(handler.runs(key), 1, "{key}: never run again");
    }
}

/// Transactional mode: a body over the record limit commits the writes
/// marked unavailable and streams on; a panic after the commit reaches the
/// caller as an error, never as a clean end, and no retry runs it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_a_body_panicking_after_the_commit_fails_for_its_caller() {
    let Some(url) = pg::database_url("transactional_a_body_panicking_after_the_commit") else {
        return;
    };
    let (table, store, sql) = setup(&url, "faults_panic_tx", |s| s).await;
    let handler = Handler::default();
    // The first frame alone is over the limit: the commit comes before the panic.
    let svc = IdempotencyLayer::transactional(store)
        .with_record_limit(4)
        .layer(handler.service());
    let key = "order-panic-tx01";
    assert_failed_answer(&svc, key, "panic-body-next").await;
    assert_eq!(
        state(&sql, &table, key).await.as_deref(),
        Some("unavailable")
    );
    for _ in 0..2 {
        let retry = send(&svc, key, None).await;
        assert_eq!(
            (retry.status, retry.code.as_str()),
            (StatusCode::GONE, "idempotency_response_unavailable"),
            "{retry:?}"
        );
    }
    assert_eq!(handler.runs(key), 1, "never run again");
}

/// A response that ends with trailers (native gRPC's `grpc-status`) reaches
/// its caller with them, plain and transactional; a record cannot carry
/// them, so the row is completed as "response unavailable" and retries get
/// `410`, never the response without its trailers, never a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_trailers_keeps_them_and_is_never_replayed_without() {
    let Some(url) = pg::database_url("a_response_with_trailers_keeps_them") else {
        return;
    };
    for transactional in [false, true] {
        let (table, store, sql) = setup(&url, "faults_trailers", |s| s).await;
        let handler = Handler::default();
        let layer = match transactional {
            true => IdempotencyLayer::transactional(store),
            false => IdempotencyLayer::new(store),
        };
        let svc = layer.layer(handler.service());
        let key = "order-trailers-1";
        let answer = svc
            .clone()
            .oneshot(request(key, Some("trailers-body")))
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        let answer = answer.into_body().collect().await.unwrap();
        let trailers = answer.trailers().cloned().unwrap_or_default();
        assert_eq!(answer.to_bytes(), &b"{\"order\":1}"[..]);
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"0"[..]),
            "transactional: {transactional}: the trailers were dropped"
        );
        until_state(&sql, &table, key, Some("unavailable")).await;
        let retry = send(&svc, key, None).await;
        assert_eq!(
            (retry.status, retry.code.as_str()),
            (StatusCode::GONE, "idempotency_response_unavailable"),
            "transactional: {transactional}: {retry:?}"
        );
        assert_eq!(handler.runs(key), 1, "never run again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_while_recording_keeps_the_claim_until_its_lock_expires_never_longer() {
    let Some(url) = pg::database_url("dropped_while_recording_keeps_the_claim") else {
        return;
    };
    let (table, store, sql) = setup(&url, "faults_recording", |s| s).await;
    let handler = Handler::default();
    // With the opt-out, the dropped future stops buffering (and extending).
    let svc = IdempotencyLayer::new(store)
        .with_cancel_on_drop(true)
        .with_wait_timeout(Duration::ZERO)
        .layer(handler.service());
    let key = "order-record-01";

    // The handler answered 201 (its effects happened); the body never ends, and
    // the client goes away while the layer buffers it.
    let recording = tokio::spawn(svc.clone().oneshot(request(key, Some("endless-body"))));
    until_state(&sql, &table, key, Some("in_progress")).await;
    sleep(Duration::from_millis(100)).await;
    recording.abort();
    let _ = recording.await;
    let dropped_at = Instant::now();
    assert_eq!(handler.runs(key), 1);

    // Kept: a retry before the lock expires does not run the handler again.
    let early = send(&svc, key, None).await;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(early.code, "idempotency_in_progress");
    assert_eq!(handler.runs(key), 1);
    assert_eq!(
        state(&sql, &table, key).await.as_deref(),
        Some("in_progress")
    );

    // Never longer than the lock: then a retry takes the key over.
    let retry = retry_until_created(&svc, key, dropped_at).await;
    assert!(!retry.replayed);
    assert_eq!(handler.runs(key), 2);
    assert_eq!(state(&sql, &table, key).await.as_deref(), Some("completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_failing_with_the_database_gone_frees_the_key_at_its_lock_expiry() {
    let Some(url) = pg::database_url("release_failing_with_the_database_gone") else {
        return;
    };
    let (table, store, proxy, sql) = setup_behind_proxy(&url, "faults_release_down").await;
    let handler = Handler {
        proxy: Some(proxy.clone()),
        ..Handler::default()
    };
    let svc = IdempotencyLayer::new(store)
        .with_wait_timeout(Duration::ZERO)
        .layer(handler.service());
    let key = "order-reldown-1";

    // The handler fails and the database goes away before the release.
    let error = svc
        .clone()
        .oneshot(request(key, Some("down-then-error")))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("handler failed"));
    assert_eq!(
        state(&sql, &table, key).await.as_deref(),
        Some("in_progress"),
        "the release could not reach the database"
    );
    proxy.set_up(true);
    let failed_at = Instant::now();

    // Held until the lock expires, then free for the corrected request.
    let retry = retry_until_created(&svc, key, failed_at).await;
    assert!(!retry.replayed);
    assert_eq!(handler.runs(key), 2, "the failed run and the retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_failing_after_the_handler_ran_is_recorded_once_the_database_returns() {
    let Some(url) = pg::database_url("completion_failing_after_the_handler_ran") else {
        return;
    };
    let (table, store, proxy, sql) = setup_behind_proxy(&url, "faults_complete_down").await;
    let handler = Handler {
        proxy: Some(proxy.clone()),
        ..Handler::default()
    };
    let svc = IdempotencyLayer::new(store)
        .with_wait_timeout(Duration::ZERO)
        .layer(handler.service());
    let key = "order-compdown1";

    // The handler ran (201) and the database went away before `complete`: the
    // client still gets the handler's answer at once.
    let first = send(&svc, key, Some("down-then-201")).await;
    assert_eq!((first.status, first.replayed), (StatusCode::CREATED, false));
    assert_eq!(
        state(&sql, &table, key).await.as_deref(),
        Some("in_progress")
    );
    // Still down: a retry is answered 503 and never runs.
    let early = send(&svc, key, None).await;
    assert_eq!(early.code, "idempotency_store_unavailable", "{early:?}");
    assert_eq!(handler.runs(key), 1);

    // Back within the lock: the completion tried again in the background
    // records the response, and retries replay it.
    proxy.set_up(true);
    until_state(&sql, &table, key, Some("completed")).await;
    let retry = send(&svc, key, None).await;
    assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, true));
    assert_eq!(retry.body, first.body);
    assert_eq!(handler.runs(key), 1, "never run again");
}

// ---------------------------------------------------------------------------
// What is stored, and erasing it
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_hold_the_response_never_the_request_and_purge_scope_erases_them() {
    let Some(url) = pg::database_url("rows_hold_the_response_never_the_request") else {
        return;
    };
    let (table, store, sql) = setup(&url, "faults_personal", |s| s).await;
    let handler = Handler::default();
    let svc = IdempotencyLayer::new(store.clone()).layer(handler.service());
    let secret = "4111-1111-1111-1111 Jane Doe";
    let mut req = request("order-pii-00001", None);
    *req.body_mut() = Full::new(Bytes::from(format!(r#"{{"card":"{secret}"}}"#)));
    let answer = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let _ = answer.into_body().collect().await.unwrap();
    send(&svc, "order-pii-00002", None).await;

    // Every column of every row, as text: the request body is not there (only
    // its SHA-256 inside the fingerprint); the response body is.
    let dump: String = sql
        .query_one(
            &format!(
                "SELECT string_agg(concat_ws('|', scope, key, encode(fingerprint, 'hex'), \
                 token, state, status, convert_from(headers, 'UTF8'), \
                 convert_from(body, 'UTF8')), E'\\n') FROM public.{table}"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!dump.contains("4111") && !dump.contains("Jane"), "{dump}");
    assert!(
        dump.contains(r#"{"order":"order-pii-00001","run":1}"#),
        "{dump}"
    );

    // Erasing the tenant deletes its rows (completed or not).
    let purged = store.purge_scope(&Scope::new("tenant")).await.unwrap();
    assert_eq!(purged, 2);
    let left: i64 = sql
        .query_one(&format!("SELECT count(*) FROM public.{table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    // A retry after the erasure is a new request.
    let again = send(&svc, "order-pii-00002", None).await;
    assert_eq!((again.status, again.replayed), (StatusCode::CREATED, false));
    assert_eq!(handler.runs("order-pii-00002"), 2);
}
