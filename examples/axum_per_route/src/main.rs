//! Per-route opt-in with axum, behind a tower-http auth layer that sets the
//! scope, with tracing output, (feature `metrics`) counters and gauges and (feature
//! `utoipa`) its OpenAPI document.
//!
//! Three ways to put `IdempotencyLayer` on some routes only:
//!
//! | route              | how                                                   |
//! |--------------------|-------------------------------------------------------|
//! | `POST /v1/orders`  | `Router::route_layer` on a router of its own          |
//! | `POST /v1/refunds` | `MethodRouter::layer`: `post(h).layer(..).get(list)`  |
//! | `POST /v1/payouts` | a sub-router with its own `Router::layer`, merged in  |
//!
//! `GET /v1/refunds`, `GET /health`, `GET /metrics` and `GET /openapi.json`
//! never see the layer.
//! The three layers share one store, so a tenant's key is one key across them.
//!
//! ```sh
//! cargo run -p tower-idempotency-axum-per-route                      # tracing on stdout
//! cargo run -p tower-idempotency-axum-per-route --features metrics   # + counters on GET /metrics
//! cargo run -p tower-idempotency-axum-per-route --features utoipa    # + the spec on GET /openapi.json
//! # another shell:
//! for i in 1 2; do curl -s -X POST localhost:3002/v1/orders -H 'Authorization: Bearer acme' \
//!   -H 'Idempotency-Key: order-0001' -H 'Content-Type: application/json' -d '{"sku":"A-1"}'; echo; done
//! curl -s localhost:3002/metrics
//! ```
//!
//! Each decision prints one line such as
//! `DEBUG idempotency{method=POST scope="acme" key_hash="dc8fac035907b401" outcome="replayed"}:
//! tower_idempotency::telemetry: decided layer="idempotency" outcome="replayed" micros=117`:
//! the scope and a hash of the key, never the key itself.
//!
//! Env: `BIND` (default `127.0.0.1:3002`).

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{header, Request, Response, StatusCode};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tower_http::validate_request::ValidateRequestHeaderLayer;
use tower_idempotency::store::purge::PurgeTask;
use tower_idempotency::{store::Store, IdempotencyLayer, MemoryStore, Scope};

/// How many times each handler ran (the tests check "once").
#[derive(Default)]
pub struct Ledger {
    pub orders: AtomicU64,
    pub refunds: AtomicU64,
    pub payouts: AtomicU64,
}

/// The service: public `/health` and `/metrics`, the API behind bearer auth.
pub fn app(store: impl Store, ledger: Arc<Ledger>) -> Router {
    // One layer value, cloned onto each route that opts in: one store, one key space.
    let idempotency = IdempotencyLayer::new(store);
    let openapi = openapi_json(&idempotency);

    // 1. `route_layer`: wraps the routes of this router, and runs only when one
    //    of them matched (a 404 or 405 never reaches it).
    let orders = Router::new()
        .route("/v1/orders", post(create_order))
        .route_layer(idempotency.clone());

    // 2. `MethodRouter::layer`: only the POST handler; GET on the same path is untouched.
    let refunds = Router::new().route(
        "/v1/refunds",
        post(create_refund)
            .layer(idempotency.clone())
            .get(list_refunds),
    );

    // 3. A sub-router (say, from another module) with its own `layer`, merged in.
    let payouts = Router::new()
        .route("/v1/payouts", post(create_payout))
        .layer(idempotency);

    let api = Router::new()
        .merge(orders)
        .merge(refunds)
        .merge(payouts)
        .with_state(ledger)
        // Outside the idempotency layers: authentication runs first and sets the `Scope`.
        .layer(bearer_tenant());

    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", openapi)
        .merge(api)
}

/// tower-http's `ValidateRequestHeaderLayer` as the auth layer:
/// `Authorization: Bearer <tenant>` becomes the idempotency [`Scope`].
/// (A real service verifies a token here and uses the tenant it names.)
// The error type is the one tower-http's `ValidateRequest` asks for.
#[allow(clippy::result_large_err)]
fn bearer_tenant(
) -> ValidateRequestHeaderLayer<impl FnMut(&mut Request<Body>) -> Result<(), Response<Body>> + Clone>
{
    ValidateRequestHeaderLayer::custom(|req: &mut Request<Body>| {
        let tenant = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            .map(str::to_owned);
        match tenant {
            Some(tenant) => {
                req.extensions_mut().insert(Scope::new(tenant));
                Ok(())
            }
            None => Err(Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    r#"{"code":"unauthorized","message":"send Authorization: Bearer <tenant>"}"#,
                ))
                .expect("a static response")),
        }
    })
}

fn created(kind: &str, n: u64, tenant: &Scope, body: &Bytes) -> (StatusCode, Json<Value>) {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    (
        StatusCode::CREATED,
        Json(
            json!({ "id": format!("{kind}_{n:04}"), "tenant": tenant.as_str(), "request": request }),
        ),
    )
}

async fn create_order(
    State(ledger): State<Arc<Ledger>>,
    Extension(tenant): Extension<Scope>,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let n = ledger.orders.fetch_add(1, Ordering::SeqCst) + 1;
    tracing::info!(n, "order created");
    created("ord", n, &tenant, &body)
}

async fn create_refund(
    State(ledger): State<Arc<Ledger>>,
    Extension(tenant): Extension<Scope>,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let n = ledger.refunds.fetch_add(1, Ordering::SeqCst) + 1;
    tracing::info!(n, "refund created");
    created("re", n, &tenant, &body)
}

async fn list_refunds(State(ledger): State<Arc<Ledger>>) -> Json<Value> {
    Json(json!({ "refunds": ledger.refunds.load(Ordering::SeqCst) }))
}

async fn create_payout(
    State(ledger): State<Arc<Ledger>>,
    Extension(tenant): Extension<Scope>,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let n = ledger.payouts.fetch_add(1, Ordering::SeqCst) + 1;
    tracing::info!(n, "payout created");
    created("po", n, &tenant, &body)
}

/// Logs to stdout: the layer's decisions at DEBUG, everything else at INFO.
pub fn init_tracing() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = Targets::new()
        .with_target("tower_idempotency", LevelFilter::DEBUG)
        .with_default(LevelFilter::INFO);
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(filter))
        .try_init();
}

async fn metrics_text() -> String {
    #[cfg(feature = "metrics")]
    return prometheus().render();
    #[cfg(not(feature = "metrics"))]
    "metrics are off: run with --features metrics\n".to_owned()
}

/// `GET /openapi.json`: the API's document, with what the idempotency layer
/// adds to each route it guards (the key header, the replay and retention
/// headers, every refusal).
#[cfg(feature = "utoipa")]
fn openapi_json(layer: &IdempotencyLayer) -> MethodRouter {
    let spec = serde_json::to_value(openapi(layer)).expect("a document serialises");
    get(move || {
        let spec = spec.clone();
        async move { Json(spec) }
    })
}

#[cfg(not(feature = "utoipa"))]
fn openapi_json(_: &IdempotencyLayer) -> MethodRouter {
    get(|| async { "the OpenAPI document is off: run with --features utoipa\n" })
}

/// The routes as an application documents them (by hand here; with
/// `#[utoipa::path]` and `utoipa-axum` in a larger one), then the layer's part.
#[cfg(feature = "utoipa")]
pub fn openapi(layer: &IdempotencyLayer) -> utoipa::openapi::OpenApi {
    use tower_idempotency::openapi::IdempotencyDoc;
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem, PathsBuilder};
    use utoipa::openapi::{InfoBuilder, OpenApiBuilder, Response};
    use utoipa::Modify;

    let create = |what: &str| {
        OperationBuilder::new()
            .summary(Some(format!("Create a {what}")))
            .response("201", Response::new(format!("The {what}")))
    };
    let list = OperationBuilder::new().response("200", Response::new("The refunds"));
    let guarded = ["/v1/orders", "/v1/refunds", "/v1/payouts"];
    let mut api = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("axum_per_route")
                .version("1")
                .build(),
        )
        .paths(
            PathsBuilder::new()
                .path(guarded[0], PathItem::new(HttpMethod::Post, create("order")))
                .path(
                    guarded[1],
                    PathItem::builder()
                        .operation(HttpMethod::Post, create("refund"))
                        .operation(HttpMethod::Get, list)
                        .build(),
                )
                .path(
                    guarded[2],
                    PathItem::new(HttpMethod::Post, create("payout")),
                ),
        )
        .build();
    IdempotencyDoc::for_paths(guarded)
        .with_layer(layer)
        .modify(&mut api);
    api
}

/// The process's Prometheus recorder (installed once): the layer's counters
/// and gauges, its latency histogram and the store calls' (buckets from
/// 50 µs to 1 s).
#[cfg(feature = "metrics")]
pub fn prometheus() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use std::sync::OnceLock;

    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let buckets = [
            0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
        ];
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("tower_idempotency_request_duration_seconds".into()),
                &buckets,
            )
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full("tower_idempotency_store_call_duration_seconds".into()),
                    &buckets,
                )
            })
            .expect("the buckets are not empty")
            .install_recorder()
            .expect("no other metrics recorder is installed");
        // The gauges (claims in flight, waiting duplicates, near cache) show
        // at zero before the first request moves them.
        tower_idempotency::telemetry::describe_metrics();
        handle
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    init_tracing();
    #[cfg(feature = "metrics")]
    prometheus();
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3002".into());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    let store = MemoryStore::new();
    // Expired records leave memory in the background, not only when a claim
    // happens by; stopped at shutdown.
    let purge = PurgeTask::new(store.clone()).spawn()?;
    let app = app(store, Arc::default());
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    purge.shutdown().await;
    Ok(())
}
