//! Per-route opt-in with axum: `Router::route_layer`, `MethodRouter::layer`,
//! and a merged sub-router, each behind a tower-http auth layer that sets the scope.

use tower_idempotency_tests::http;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::routing::{get, post};
use axum::Router;
use http::{serve, HttpClient};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tower_http::validate_request::ValidateRequestHeaderLayer;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};

/// Auth from tower-http: `x-api-key: <tenant>` becomes the idempotency scope.
// The refusal is a whole `Response`, as tower-http's validator requires.
#[allow(clippy::result_large_err)]
fn api_key_auth(
) -> ValidateRequestHeaderLayer<impl FnMut(&mut Request<Body>) -> Result<(), Response<Body>> + Clone>
{
    ValidateRequestHeaderLayer::custom(|req: &mut Request<Body>| {
        let tenant = req
            .headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match tenant {
            Some(tenant) => {
                req.extensions_mut().insert(Scope::new(tenant));
                Ok(())
            }
            None => Err(Response::builder().status(401).body(Body::empty()).unwrap()),
        }
    })
}

fn counting(
    runs: &Arc<AtomicUsize>,
) -> impl Fn() -> std::future::Ready<(StatusCode, String)> + Clone {
    let runs = runs.clone();
    move || {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready((StatusCode::CREATED, format!("run {n}")))
    }
}

async fn post_twice(client: &HttpClient, path: &str, key: &str) -> (String, String) {
    let headers = [("x-api-key", "tenant-1"), ("idempotency-key", key)];
    let a = client.post_json(path, &headers, "{}").await;
    let b = client.post_json(path, &headers, "{}").await;
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (201, 201), "{path}");
    (
        String::from_utf8(a.body.to_vec()).unwrap(),
        String::from_utf8(b.body.to_vec()).unwrap(),
    )
}

#[tokio::test]
async fn route_layer_method_router_layer_and_merged_router_all_replay() {
    let store = MemoryStore::new();
    let (a, b, c, plain) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let with_route_layer = Router::new()
        .route("/a", post(counting(&a)))
        .route_layer(IdempotencyLayer::new(store.clone()));
    let with_method_layer = Router::new().route(
        "/b",
        post(counting(&b))
            .layer(IdempotencyLayer::new(store.clone()))
            .get(|| async { "no key needed" }),
    );
    let merged = Router::new()
        .route("/c", post(counting(&c)))
        .layer(IdempotencyLayer::new(store.clone()));
    let app = Router::new()
        .route("/plain", post(counting(&plain)))
        .route("/health", get(|| async { "ok" }))
        .merge(with_route_layer)
        .merge(with_method_layer)
        .nest("/v2", merged)
        .layer(api_key_auth());
    let client = HttpClient::new(serve(app).await);

    for (path, runs) in [("/a", &a), ("/b", &b), ("/v2/c", &c)] {
        let key = format!("route-key{}", path.replace('/', "-"));
        let (first, second) = post_twice(&client, path, &key).await;
        assert_eq!(first, second, "{path} replays");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "{path} ran once");
    }
    // One store, one key space per tenant: a key used on /a is not reusable on /b.
    let reused = client
        .post_json(
            "/b",
            &[
                ("x-api-key", "tenant-1"),
                ("idempotency-key", "route-key-a"),
            ],
            "{}",
        )
        .await;
    assert_eq!(reused.code(), "idempotency_key_reuse");
    // Routes without the layer run every time, key or not.
    let (first, second) = post_twice(&client, "/plain", "route-key-1").await;
    assert_ne!(first, second);
    assert_eq!(plain.load(Ordering::SeqCst), 2);
    // GET on the same path as a layered POST is untouched.
    let get = client.get("/b", &[("x-api-key", "tenant-1")]).await;
    assert_eq!(get.status, 200);
    // The auth layer runs first: no tenant, no idempotency decision.
    let anonymous = client
        .post_json("/a", &[("idempotency-key", "route-key-1")], "{}")
        .await;
    assert_eq!(anonymous.status, 401);
    // A missing key is refused only where the layer applies.
    let missing = client
        .post_json("/a", &[("x-api-key", "tenant-1")], "{}")
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.code(), "idempotency_key_required");
}
