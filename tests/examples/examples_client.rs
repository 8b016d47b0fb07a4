//! The client side (`tower_idempotency::client`, feature `client`) against a
//! real server over loopback: a hyper client behind `IdempotencyKeyLayer` and
//! `RetryLayer<IdempotentRetry>`.

use tower_idempotency::store::Completion;
use tower_idempotency_tests::http;

use axum::extract::{Request, State};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tower::retry::RetryLayer;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::client::{IdempotencyKeyLayer, IdempotentRetry};
use tower_idempotency::store::{Begin, FencingToken, RecordKey, Timings};
use tower_idempotency::{
    fingerprint::RequestFingerprint,
    store::{Store, StoreError},
    IdempotencyLayer, MemoryStore, Scope,
};

/// A store whose `begin` fails while `failures` is above zero (decremented
/// per failure; `usize::MAX` fails for good).
#[derive(Clone)]
struct Flaky {
    inner: MemoryStore,
    failures: Arc<AtomicUsize>,
}

impl Store for Flaky {
    async fn begin(
        &self,
        key: &RecordKey,
        fp: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                0 => None,
                usize::MAX => Some(n),
                n => Some(n - 1),
            })
            .is_ok();
        if failing {
            return Err(StoreError::Backend("the database is down".into()));
        }
        self.inner.begin(key, fp).await
    }
    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        self.inner.complete(key, token, completion).await
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

/// The server: every request's `idempotency-key` is logged on arrival, then
/// `x-tenant` auth, then the layer (no waiting: a duplicate in progress gets
/// `409` at once, `Retry-After: 1`), then a handler that counts its runs.
struct Server {
    addr: SocketAddr,
    failures: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<Option<String>>>>,
    runs: Arc<AtomicU64>,
}

impl Server {
    async fn start() -> Self {
        let failures = Arc::new(AtomicUsize::new(0));
        let keys = Arc::new(Mutex::new(Vec::new()));
        let runs = Arc::new(AtomicU64::new(0));
        let store = Flaky {
            inner: MemoryStore::new(),
            failures: failures.clone(),
        };
        let app = Router::new()
            .route("/v1/orders", post(create_order))
            .route_layer(IdempotencyLayer::new(store).with_wait_timeout(Duration::ZERO))
            .with_state(runs.clone())
            .layer(from_fn(tenant_header))
            .layer(from_fn_with_state(keys.clone(), log_key));
        Self {
            addr: http::serve(app).await,
            failures,
            keys,
            runs,
        }
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.keys.lock().unwrap().clone()
    }
}

async fn log_key(
    State(keys): State<Arc<Mutex<Vec<Option<String>>>>>,
    req: Request,
    next: Next,
) -> Response {
    let key = req
        .headers()
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    keys.lock().unwrap().push(key);
    next.run(req).await
}

async fn tenant_header(mut req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(Scope::new);
    match tenant {
        Some(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        None => ::http::StatusCode::UNAUTHORIZED.into_response(),
    }
}

async fn create_order(
    State(runs): State<Arc<AtomicU64>>,
    uri: ::http::Uri,
) -> (::http::StatusCode, String) {
    if uri.query() == Some("slow") {
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    (::http::StatusCode::CREATED, format!(r#"{{"order":{n}}}"#))
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The client stack under test: a key per call, then bounded retries.
fn retrying(
    policy: IdempotentRetry,
) -> impl Service<
    ::http::Request<Full<Bytes>>,
    Response = ::http::Response<hyper::body::Incoming>,
    Error = hyper_util::client::legacy::Error,
> + Clone {
    ServiceBuilder::new()
        .layer(IdempotencyKeyLayer::new())
        .layer(RetryLayer::new(policy))
        .service(http_client())
}

fn fast_policy(max_attempts: u32) -> IdempotentRetry {
    IdempotentRetry::new(max_attempts)
        .with_backoff(Duration::from_millis(10), Duration::from_millis(40))
        .with_max_retry_after(Duration::from_millis(50))
}

fn order_request(addr: SocketAddr, path: &str, body: &'static str) -> ::http::Request<Full<Bytes>> {
    ::http::Request::post(format!("http://{addr}{path}"))
        .header("x-tenant", "acme")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn read(response: ::http::Response<hyper::body::Incoming>) -> (u16, bool, String) {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn every_attempt_of_one_call_carries_the_same_generated_key() {
    let server = Server::start().await;
    server.failures.store(2, Ordering::SeqCst); // two 503s, then the store is back
    let client = retrying(fast_policy(5));
    let response = client
        .clone()
        .oneshot(order_request(server.addr, "/v1/orders", "{}"))
        .await
        .unwrap();
    assert_eq!(read(response).await, (201, false, r#"{"order":1}"#.into()));
    let keys = server.keys();
    assert_eq!(keys.len(), 3, "two 503s and the success: {keys:?}");
    let key = keys[0].clone().expect("the layer set a key");
    assert_eq!(key.len(), 36);
    assert!(
        uuid::Uuid::parse_str(&key).is_ok_and(|u| u.get_version_num() == 4),
        "{key}"
    );
    assert!(keys.iter().all(|k| k.as_deref() == Some(key.as_str())));

    // The next call is another operation: another key.
    let response = client
        .oneshot(order_request(server.addr, "/v1/orders", "{}"))
        .await
        .unwrap();
    assert_eq!(read(response).await.0, 201);
    let next = server.keys().last().cloned().flatten().unwrap();
    assert_ne!(next, key);
    assert_eq!(server.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_retry_after_in_progress_waits_retry_after_and_gets_the_replay() {
    let server = Server::start().await;
    // Another attempt of the same operation is already running (600 ms).
    let first = tokio::spawn(
        http_client().request(
            ::http::Request::post(format!("http://{}/v1/orders?slow", server.addr))
                .header("x-tenant", "acme")
                .header("idempotency-key", "checkout-42")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap(),
        ),
    );
    tokio::time::sleep(Duration::from_millis(150)).await;

    let started = Instant::now();
    let mut request = order_request(server.addr, "/v1/orders?slow", "{}");
    request
        .headers_mut()
        .insert("idempotency-key", "checkout-42".parse().unwrap());
    // Default Retry-After cap (10 s): the server's `Retry-After: 1` is honoured.
    let response = retrying(IdempotentRetry::new(3))
        .oneshot(request)
        .await
        .unwrap();
    let waited = started.elapsed();
    let (status, replayed, body) = read(response).await;
    assert_eq!((status, replayed), (201, true), "{body}");
    assert_eq!(body, r#"{"order":1}"#);
    assert!(
        waited >= Duration::from_secs(1),
        "waited {waited:?}, less than Retry-After"
    );
    assert_eq!(read(first.await.unwrap().unwrap()).await.2, body);
    assert_eq!(
        server.runs.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    // The caller's own key was kept (not replaced) on both attempts.
    assert_eq!(server.keys(), vec![Some("checkout-42".to_owned()); 3]);
}

#[tokio::test]
async fn attempts_are_bounded() {
    let server = Server::start().await;
    server.failures.store(usize::MAX, Ordering::SeqCst);
    let response = retrying(fast_policy(4))
        .oneshot(order_request(server.addr, "/v1/orders", "{}"))
        .await
        .unwrap();
    let (status, _, body) = read(response).await;
    assert_eq!(status, 503, "the last answer is returned: {body}");
    assert!(body.contains("idempotency_store_unavailable"));
    assert_eq!(server.keys().len(), 4);
    assert_eq!(server.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn key_reuse_and_other_4xx_are_never_retried() {
    let server = Server::start().await;
    let client = retrying(fast_policy(5));
    let with_key = |body: &'static str| {
        let mut request = order_request(server.addr, "/v1/orders", body);
        request
            .headers_mut()
            .insert("idempotency-key", "order-7f3a9c2e".parse().unwrap());
        request
    };
    let created = client
        .clone()
        .oneshot(with_key(r#"{"qty":1}"#))
        .await
        .unwrap();
    assert_eq!(read(created).await.0, 201);
    // The same key with another body: 409 idempotency_key_reuse, one attempt.
    let reuse = client
        .clone()
        .oneshot(with_key(r#"{"qty":2}"#))
        .await
        .unwrap();
    let (status, _, body) = read(reuse).await;
    assert_eq!(status, 409);
    assert!(body.contains("idempotency_key_reuse"), "{body}");
    assert_eq!(server.keys().len(), 2);
    // 401: one attempt.
    let mut anonymous = order_request(server.addr, "/v1/orders", "{}");
    anonymous.headers_mut().remove("x-tenant");
    let refused = client.oneshot(anonymous).await.unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(server.keys().len(), 3);
    assert_eq!(server.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_post_without_a_key_is_never_retried() {
    let server = Server::start().await;
    server.failures.store(usize::MAX, Ordering::SeqCst);
    // The retry layer without the key layer outside it: nothing to make a
    // retry safe, so the policy does not retry.
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new(fast_policy(5)))
        .service(http_client());
    let response = client
        .oneshot(order_request(server.addr, "/v1/orders", "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), 400, "idempotency_key_required");
    assert_eq!(server.keys(), vec![None]);
}

/// A TCP proxy to `upstream` that, on its first connection, forwards the
/// request, waits for the answer to start, and hangs up on the client without
/// passing it on: the request ran, the client saw a transport error. Later
/// connections are forwarded both ways.
async fn answer_losing_proxy(upstream: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut inbound, _)) = listener.accept().await {
            let mut outbound = TcpStream::connect(upstream).await.unwrap();
            if std::mem::take(&mut first) {
                tokio::spawn(async move {
                    let (mut client_read, _client_write) = inbound.into_split();
                    let (mut server_read, mut server_write) = outbound.into_split();
                    let pump = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    });
                    let mut byte = [0u8; 1];
                    let _ = server_read.read(&mut byte).await; // the answer started
                    pump.abort(); // drops every half: both connections close
                });
            } else {
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        }
    });
    addr
}

#[tokio::test]
async fn a_lost_answer_is_retried_and_replayed_not_run_again() {
    let server = Server::start().await;
    let proxy = answer_losing_proxy(server.addr).await;
    let response = retrying(fast_policy(3))
        .oneshot(order_request(proxy, "/v1/orders", r#"{"qty":1}"#))
        .await
        .expect("the retry succeeds");
    let (status, replayed, body) = read(response).await;
    assert_eq!((status, replayed), (201, true), "{body}");
    assert_eq!(body, r#"{"order":1}"#);
    assert_eq!(
        server.runs.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
}
