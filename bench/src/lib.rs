//! Shared fixtures of the benchmarks: one trivial handler, the same request
//! bodies, and the apps that put each idempotency layer (ours and the peers')
//! in front of that handler. Nothing here is published.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, COOKIE, SET_COOKIE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::{store::Store, IdempotencyLayer, MemoryStore, Scope};

pub mod mounted;
pub mod realistic;
pub mod results;

/// The route every app serves.
pub const ORDERS: &str = "/v1/orders";
/// The tenant every request is authenticated as.
pub const TENANT: &str = "acme";

/// The trivial handler's state: how often it ran, and how long it sleeps.
#[derive(Debug, Default)]
pub struct Handler {
    runs: AtomicU64,
    delay: Duration,
    /// Bytes of the response body (at least the JSON frame).
    body_len: usize,
}

impl Handler {
    /// A handler answering at once with a small JSON body.
    pub fn new() -> Arc<Self> {
        Self::with(Duration::ZERO, 0)
    }

    /// A handler that sleeps `delay` and answers with a body of about `body_len` bytes.
    pub fn with(delay: Duration, body_len: usize) -> Arc<Self> {
        Arc::new(Self {
            runs: AtomicU64::new(0),
            delay,
            body_len,
        })
    }

    /// How many times the handler ran.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Counts one run (for handlers other than [`create_order`]); returns its number.
    pub fn count_run(&self) -> u64 {
        self.runs.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The handler: reads the whole request body (as a real one would), counts the
/// run, and answers `201` with a freshly allocated JSON body.
pub async fn create_order(State(h): State<Arc<Handler>>, body: Bytes) -> impl IntoResponse {
    let n = h.runs.fetch_add(1, Ordering::Relaxed) + 1;
    if !h.delay.is_zero() {
        tokio::time::sleep(h.delay).await;
    }
    let mut json = format!(r#"{{"id":"ord_{n:08}","received":{},"pad":""#, body.len());
    while json.len() + 2 < h.body_len {
        json.push('x');
    }
    json.push_str("\"}");
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        json,
    )
}

/// A JSON order of about `target` bytes (never less than ~60), deterministic.
pub fn json_body(target: usize) -> Bytes {
    let mut out = String::from(r#"{"currency":"USD","customer":"cus_8f2a1c","items":["#);
    let mut i = 0;
    loop {
        let item = format!(
            r#"{}{{"sku":"SKU-{i:06}","qty":{},"price":{}.5,"note":"gift wrap"}}"#,
            if i == 0 { "" } else { "," },
            i % 7 + 1,
            i * 3 + 10,
        );
        if out.len() + item.len() + 2 > target && i > 0 {
            break;
        }
        out.push_str(&item);
        i += 1;
        if out.len() + 2 >= target {
            break;
        }
    }
    out.push_str("]}");
    Bytes::from(out)
}

/// The handler without any idempotency layer.
pub fn plain_app(h: Arc<Handler>) -> Router {
    Router::new()
        .route(ORDERS, post(create_order))
        .with_state(h)
}

/// Our layer over `store`, scope from the `Scope` extension (as an auth layer sets it).
pub fn ours_app(h: Arc<Handler>, store: impl Store) -> Router {
    ours_app_with(h, IdempotencyLayer::new(store))
}

/// The handler behind a configured layer of ours.
pub fn ours_app_with(h: Arc<Handler>, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route(ORDERS, post(create_order))
        .route_layer(layer)
        .with_state(h)
}

/// Our layer over a `MemoryStore` large enough never to fill during a benchmark.
pub fn ours_memory_app(h: Arc<Handler>) -> Router {
    ours_app(
        h,
        MemoryStore::builder()
            .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
            .build(),
    )
}

/// `idempotent` 2.0: its tower `IdempotencyLayer` over its in-memory store,
/// scoped by the same tenant. Must be called inside a Tokio runtime (the store
/// is an actor task).
pub fn idempotent_app(h: Arc<Handler>) -> Router {
    let store = idempotent::memory::MemoryStore::builder()
        .try_build()
        .expect("idempotent memory store");
    idempotent_route(h, store)
}

/// The handler behind `idempotent`'s tower layer over `store`, scoped by the
/// tenant as ours is.
fn idempotent_route<S: idempotent::IdempotencyStore + Clone>(h: Arc<Handler>, store: S) -> Router {
    let layer = idempotent::middleware::IdempotencyLayer::new(store).scope(|parts| {
        parts
            .extensions
            .get::<Scope>()
            .map(|s| s.as_str().to_owned())
    });
    Router::new()
        .route(ORDERS, post(create_order))
        .route_layer(layer)
        .with_state(h)
}

/// `idempotent` 2.0 over its Valkey/Redis store on `url`, scoped by the same
/// tenant, keys under a fresh prefix.
pub async fn idempotent_valkey_app(h: Arc<Handler>, url: &str, prefix: &str) -> Router {
    let store = idempotent::valkey::ValkeyStore::with_url(url)
        .prefix(prefix)
        .try_build()
        .await
        .expect("idempotent Valkey store");
    idempotent_route(h, store)
}

/// The session stack `axum-idempotent` needs (cookies, a `ruts` session in a
/// moka store holding up to `capacity` sessions) around `router`, with the
/// `POST /session` route that opens one.
pub fn with_session_stack(router: Router, capacity: u64) -> Router {
    use ruts::store::moka::MokaStore;
    use ruts::{CookieOptions, Session, SessionLayer};
    let store = Arc::new(MokaStore::builder().max_capacity(capacity).build());
    let sessions = SessionLayer::new(store).with_cookie_options(
        CookieOptions::build()
            .name("session")
            .max_age(24 * 3600)
            .path("/"),
    );
    let session_route = post(|session: Session<MokaStore>| async move {
        let ttl = ruts::store::Ttl::new(24 * 3600).expect("ttl");
        session
            .set("user", &String::from("alice"), ttl, None)
            .await
            .expect("session set");
        "session"
    });
    router
        .route("/session", session_route)
        .layer(sessions)
        .layer(tower_cookies::CookieManagerLayer::new())
}

/// `axum-idempotent`'s layer in direct-key mode, over its moka session store.
pub fn axum_idempotent_layer() -> axum_idempotent::IdempotentLayer<ruts::store::moka::MokaStore> {
    let options = axum_idempotent::IdempotentOptions::default()
        .use_idempotency_key_header(Some("Idempotency-Key"), true)
        .expire_after(24 * 3600);
    axum_idempotent::IdempotentLayer::new(options)
}

/// The handler behind the session stack, with or without axum-idempotent's
/// layer on its route.
pub fn axum_idempotent_app(h: Arc<Handler>, with_layer: bool) -> Router {
    // Mounted with `route_layer`, as ours and `idempotent`'s are.
    let route = Router::new().route(ORDERS, post(create_order));
    let route = if with_layer {
        route.route_layer(axum_idempotent_layer())
    } else {
        route
    };
    with_session_stack(route.with_state(h), 100_000)
}

/// Opens a session on an [`axum_idempotent_app`]; returns its `Cookie` header value.
pub async fn establish_session(app: &Router) -> HeaderValue {
    let response = app
        .clone()
        .oneshot(
            Request::post("/session")
                // The layer is configured to require a key on every request.
                .header("idempotency-key", "session-open-0001")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("infallible");
    let cookie = response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .find_map(|c| {
            let s = c.to_str().ok()?;
            s.starts_with("session=")
                .then(|| s.split(';').next().unwrap_or(s).to_owned())
        })
        .unwrap_or_else(|| panic!("no session cookie: {response:?}"));
    HeaderValue::from_str(&cookie).expect("cookie header")
}

/// What each request carries besides its key and body.
#[derive(Clone, Debug)]
pub struct RequestTemplate {
    /// The authenticated tenant, as an auth layer would insert it.
    pub scope: Scope,
    /// The session cookie (for `axum-idempotent` only).
    pub cookie: Option<HeaderValue>,
    /// The JSON body.
    pub body: Bytes,
}

impl RequestTemplate {
    /// Requests of `body` for tenant [`TENANT`] without a session.
    pub fn new(body: Bytes) -> Self {
        Self {
            scope: Scope::new(TENANT),
            cookie: None,
            body,
        }
    }

    /// `POST /v1/orders` with `key` (none if empty).
    pub fn request(&self, key: &str) -> Request {
        self.request_with_body(key, self.body.clone())
    }

    /// `POST /v1/orders` with `key` and another body.
    pub fn request_with_body(&self, key: &str, body: Bytes) -> Request {
        let mut builder = Request::post(ORDERS)
            .header(CONTENT_TYPE, "application/json")
            .header("content-length", body.len());
        if !key.is_empty() {
            builder = builder.header("idempotency-key", key);
        }
        if let Some(cookie) = &self.cookie {
            builder = builder.header(COOKIE, cookie.clone());
        }
        let mut req = builder.body(Body::from(body)).expect("request");
        req.extensions_mut().insert(self.scope.clone());
        req
    }
}

/// Sends `req` through `app` and reads the whole response body; returns the
/// status and whether it was a replay (either header spelling).
pub async fn send(app: &Router, req: Request) -> (StatusCode, bool) {
    let response = app.clone().oneshot(req).await.expect("infallible");
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed")
        || response.headers().contains_key("idempotency-replayed");
    let body = response.into_body().collect().await.expect("body");
    std::hint::black_box(body.to_bytes());
    (status, replayed)
}

/// Key `i` of a run: unique per run and index, 8 to 128 key characters.
pub fn key(prefix: &str, i: u64) -> String {
    format!("{prefix}-{i:012}")
}

/// Resident set size of this process in bytes (Linux), or 0.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// CPU time (user + system) this process used so far, from `/proc/self/stat`
/// (10 ms resolution).
pub fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Time the calling thread has spent on a CPU, in nanoseconds (Linux
/// `/proc/thread-self/schedstat`), or 0. Unlike wall time it does not count
/// time the thread waited for a CPU, so it stays meaningful on a shared machine.
pub fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The `q` quantile (0..=1) of sorted nanoseconds, in microseconds.
pub fn quantile_us(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let i = ((sorted_ns.len() - 1) as f64 * q).round() as usize;
    sorted_ns[i] as f64 / 1000.0
}

/// One line about the machine and the moment: load average and rustc.
pub fn machine_line() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "cpus={} loadavg={load}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
}

/// What `n` concurrent duplicates of one request saw.
pub struct Duplicates {
    /// Each answer's status and whether it was a replay.
    pub answers: Vec<(StatusCode, bool)>,
    /// Each answer's delay after the answer of the request that ran the handler
    /// (the earliest `201` that is not a replay; answers before it count as 0),
    /// sorted, in nanoseconds.
    pub after_executed_ns: Vec<u64>,
    /// CPU the whole process used while the duplicates waited, and over how long.
    pub wait_cpu: Duration,
    pub wait_window: Duration,
}

/// Sends `n` copies of the request for `key` at once to an app whose handler
/// sleeps `delay`; the waiting CPU is measured from 20% to 90% of `delay`.
pub async fn concurrent_duplicates(
    app: &Router,
    template: &RequestTemplate,
    key: &str,
    n: usize,
    delay: Duration,
) -> Duplicates {
    let start = std::time::Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            let req = template.request(key);
            tokio::spawn(async move {
                let answer = send(&app, req).await;
                (answer, std::time::Instant::now())
            })
        })
        .collect();
    tokio::time::sleep_until((start + delay / 5).into()).await;
    let cpu0 = cpu_time();
    let w0 = std::time::Instant::now();
    tokio::time::sleep_until((start + delay * 9 / 10).into()).await;
    let wait_cpu = cpu_time().saturating_sub(cpu0);
    let wait_window = w0.elapsed();
    let mut results = Vec::with_capacity(n);
    for t in tasks {
        results.push(t.await.expect("task"));
    }
    let executed = results
        .iter()
        .filter(|((status, replayed), _)| *status == StatusCode::CREATED && !replayed)
        .map(|(_, at)| *at)
        .min()
        .expect("one executed answer");
    let mut after_executed_ns: Vec<u64> = results
        .iter()
        .map(|(_, at)| at.saturating_duration_since(executed).as_nanos() as u64)
        .collect();
    after_executed_ns.sort_unstable();
    Duplicates {
        answers: results.into_iter().map(|(answer, _)| answer).collect(),
        after_executed_ns,
        wait_cpu,
        wait_window,
    }
}

/// CPU time (ns) of this process's threads whose name starts with `prefix`
/// (Linux `/proc/self/task/*/schedstat`): the server's work per request,
/// whatever else the machine runs.
pub fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.trim_end().starts_with(prefix))
        })
        .filter_map(|t| {
            std::fs::read_to_string(t.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// One keep-alive HTTP/1 connection to `addr` (no Nagle delay), its
/// connection task spawned on the current runtime.
pub async fn connect_http1(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    sender
}
