//! Where `IdempotencyLayer` goes among tower-http's `TraceLayer`,
//! `RequestBodyLimitLayer`, `CompressionLayer` and `TimeoutLayer`.
//!
//! ```text
//!  request ──► TraceLayer ──► RequestBodyLimitLayer ──► CompressionLayer ──►
//!              (outermost)    (refuse before buffering)  (encode per client)
//!
//!          ──► TimeoutLayer ──► IdempotencyLayer ──► handler
//!              (the caller's     (route_layer: stores identity
//!               wait budget)      bytes, runs a claimed handler
//!                                 to completion)
//! ```
//!
//! 1. **`TraceLayer` outermost**, so its span and latency cover everything,
//!    refusals included (`413` from the body limit, `409`s and `503`s from the
//!    idempotency layer), and the layer's own `idempotency` span nests inside
//!    the request's span.
//! 2. **`RequestBodyLimitLayer` outside the idempotency layer**, so an
//!    oversized request is refused before anything is buffered or claimed:
//!    with a `Content-Length` over the limit, `413` at once, no store access.
//!    A streamed (chunked) body is cut by the outer limit as it crosses it;
//!    the layer, still buffering, recognises the limit's error and answers
//!    `413 payload_too_large` — nothing claimed. Give the
//!    layer the same limit (`with_body_limit`; its default is 1 MiB) so
//!    neither accepts what the other refuses.
//! 3. **`CompressionLayer` outside the idempotency layer.** The layer records
//!    the handler's identity bytes and replays them; compression then encodes
//!    every answer — first or replay — for the `Accept-Encoding` of the
//!    request at hand. Inside, the *compressed* bytes would be stored for
//!    whichever encoding the first client accepted, and a retry that accepts
//!    another (or none) would get bytes it cannot read (`Content-Encoding` is
//!    not a replayed header, nor should it be). Same for any layer that
//!    rewrites bodies per request (ETag, range requests).
//! 4. **`TimeoutLayer` outside the idempotency layer.** It bounds how long
//!    the caller waits, not the handler: when it fires, the caller gets its
//!    `504`, while a handler that already claimed its key runs to completion
//!    in a task of its own and its `201` is recorded. The retry then waits for
//!    it (or finds it done) and gets that `201` replayed: one order, one
//!    charge. A duplicate that is still waiting when the timeout fires gets
//!    the `504` too and retries like the first caller.
//!
//!    Not inside, around the handler: a timeout there cuts the handler
//!    wherever it is awaiting. If it had already charged a card, its `504` is
//!    not recorded, the key is released, and the retry charges again. Bound
//!    a handler that might hang by its own calls instead (the payment
//!    client's request timeout), so it always ends with an answer; its claim
//!    is kept alive while it runs, so a slow handler is never taken over.
//!
//! ```sh
//! cargo run --example layer_order
//! curl -si --compressed -X POST localhost:3005/v1/orders -H 'Authorization: Bearer acme' \
//!   -H 'Idempotency-Key: order-0001' -H 'Content-Type: application/json' -d '{"sku":"A-1"}'
//! curl -si -X POST localhost:3005/v1/orders -H 'Authorization: Bearer acme' \
//!   -H 'Idempotency-Key: order-0001' -H 'Content-Type: application/json' -d '{"sku":"A-1"}'
//! # the first answer is gzip, the replay identity: the same JSON either way
//! ```
//!
//! Env: `BIND` (default `127.0.0.1:3005`).

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Query, State};
use axum::http::{header, Request, Response, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceBuilder;
use tower_http::compression::CompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_http::validate_request::ValidateRequestHeaderLayer;
use tower_idempotency::store::purge::PurgeTask;
use tower_idempotency::{store::Store, IdempotencyLayer, MemoryStore, Scope};

/// The knobs whose relations matter.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body, outer limit and the layer's (default 64 KiB).
    pub body_limit: usize,
    /// How long a caller waits for its answer (default 10 s).
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body_limit: 64 * 1024,
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// The stack; `orders` counts handler runs.
pub fn app(store: impl Store, limits: Limits, orders: Arc<AtomicU64>) -> Router {
    Router::new()
        .route("/v1/orders", post(create_order))
        // The same limit as the outer one (the layer's default is 1 MiB).
        .route_layer(IdempotencyLayer::new(store).with_body_limit(limits.body_limit))
        .with_state(orders)
        // Auth, just outside the routes: it sets the `Scope` the layer reads.
        .layer(bearer_tenant())
        .layer(
            // `ServiceBuilder` lists layers outermost first.
            ServiceBuilder::new()
                .layer(TraceLayer::new_for_http())
                .layer(RequestBodyLimitLayer::new(limits.body_limit))
                .layer(CompressionLayer::new())
                // The caller's budget; a claimed handler finishes regardless.
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::GATEWAY_TIMEOUT,
                    limits.request_timeout,
                )),
        )
}

/// `Authorization: Bearer <tenant>` becomes the scope.
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
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        match tenant {
            Some(tenant) => {
                req.extensions_mut().insert(Scope::new(tenant));
                Ok(())
            }
            None => Err(Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .body(Body::empty())
                .expect("a static response")),
        }
    })
}

/// `POST /v1/orders[?delay_ms=N]`: N ms of "payment network", then `201`
/// with a body long enough to be worth compressing.
async fn create_order(
    State(orders): State<Arc<AtomicU64>>,
    Extension(tenant): Extension<Scope>,
    Query(query): Query<HashMap<String, u64>>,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    if let Some(ms) = query.get("delay_ms") {
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
    let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let order = json!({
        "id": format!("ord_{n:04}"),
        "tenant": tenant.as_str(),
        "request": request,
        "status": "created",
        "note": "this body is stored uncompressed and compressed per request on the way out",
    });
    (StatusCode::CREATED, Json(order))
}

/// Logs requests (tower-http) and decisions (this crate) to stdout.
fn init_tracing() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = Targets::new()
        .with_target("tower_http", LevelFilter::DEBUG)
        .with_target("tower_idempotency", LevelFilter::DEBUG)
        .with_default(LevelFilter::INFO);
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(filter))
        .try_init();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    init_tracing();
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3005".into());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    let store = MemoryStore::new();
    // Expired records leave memory in the background, not only when a claim
    // happens by; stopped at shutdown.
    let purge = PurgeTask::new(store.clone()).spawn()?;
    let app = app(store, Limits::default(), Arc::default());
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    purge.shutdown().await;
    Ok(())
}
