//! The checkout service of the contract: `POST /v1/orders` behind demo bearer
//! auth and the idempotency layer; `GET /v1/orders` and `GET /v1/charges` list
//! what was created. Shared by `main.rs` and the tests, which mount the same
//! router, with the same limits: a body timeout, a cap on order requests
//! taken in at once and one on handlers running (see [`BODY_TIMEOUT`]).
//!
//! The handler first charges the customer (the simulated payment network,
//! or with a [`Processor`] the card processor over HTTP), waits `delay` (the
//! network being slow), then writes the order. Both are effects a retry must
//! never repeat: the layer runs the handler to completion even if the client
//! hangs up, and on PostgreSQL both rows are written inside the layer's
//! transaction, so they commit with the recorded response or not at all.
//!
//! What no record can cover, a process killed after the charge and before
//! the record (in plain mode, and always for a processor outside the
//! database), the downstream keys do: the charge carries the request's
//! `card-processor` key and the order its `order` key, both the same on
//! every run of the handler, so a run after a crash gets the first charge
//! back from the processor and writes no second order.

// `main.rs` and the tests each use part of it.
#[allow(dead_code)]
#[path = "ledger.rs"]
mod ledger;
#[allow(dead_code)]
#[path = "payments.rs"]
mod payments;
#[path = "phased.rs"]
mod phased;

use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
pub use ledger::Ledger;
#[allow(unused_imports)] // the tests count rows with it
pub use ledger::MemoryLedger;
use ledger::Writer;
pub use payments::Processor;
use payments::CARD_PROCESSOR;
use serde_json::{json, Value};
use std::future::{ready, Ready};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower_http::auth::{AsyncAuthorizeRequest, AsyncRequireAuthorizationLayer};
use tower_idempotency::{downstream::DownstreamKeys, store::Store, IdempotencyLayer, Scope};

/// The cents one unit costs.
const UNIT_PRICE: u64 = 1250;

/// How long an order's body may take to arrive whole before it is answered
/// `408`. An order is a few hundred bytes: 10 s is ample for a slow mobile
/// link, and cuts a client that trickles bytes to hold the server's memory
/// (without it, one is waited for as long as it keeps sending).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Order requests taken in at once; more wait for a slot before their body
/// is read. Each may buffer up to the layer's body limit (1 MiB), so bodies
/// hold at most 64 MiB however many connections are open.
pub const MAX_CONCURRENT_ORDERS: usize = 64;

/// Claimed handlers running at once, those whose client hung up included
/// (they run to completion): past it a new order is answered `503 overloaded`
/// with `Retry-After`, and its key is free for the retry.
pub const MAX_IN_FLIGHT: std::num::NonZeroUsize = std::num::NonZeroUsize::new(64).unwrap();

#[derive(Clone)]
struct AppState {
    ledger: Ledger,
    options: Options,
}

/// How the service charges and how slowly.
#[derive(Clone, Default)]
pub struct Options {
    /// Between the charge and the order: a slow payment network.
    pub delay: Duration,
    /// Charges go to this processor over HTTP (else to the ledger's
    /// simulated payment network).
    pub processor: Option<Processor>,
    /// Nonzero: at each checkpoint (`before-charge`, `charged`, `ordered`,
    /// and `answered`, once the layer recorded the answer and before it is
    /// sent), print `checkpoint NAME KEY` and pause this long: the points
    /// where a crash test kills the process.
    pub pause: Duration,
    /// A layer built with `IdempotencyLayer::phased`: serves the checkout in
    /// recovery points too, on `POST /v1/phased-orders` (see `phased.rs`).
    pub phased: Option<IdempotencyLayer>,
}

/// The whole service on the memory store and an in-process ledger.
#[allow(dead_code)]
pub fn router(store: impl Store, ledger: Ledger, delay: Duration) -> Router {
    router_with(IdempotencyLayer::new(store), ledger, delay)
}

/// The whole service: auth outside, idempotency on `POST /v1/orders` only.
pub fn router_with(idempotency: IdempotencyLayer, ledger: Ledger, delay: Duration) -> Router {
    let options = Options {
        delay,
        ..Options::default()
    };
    router_with_options(idempotency, ledger, options)
}

/// [`router_with`], with every option. The demo's limits ([`BODY_TIMEOUT`],
/// [`MAX_CONCURRENT_ORDERS`], [`MAX_IN_FLIGHT`]) are set here, on whatever
/// layer is given, so that the tests mount what `main.rs` serves.
pub fn router_with_options(
    idempotency: IdempotencyLayer,
    ledger: Ledger,
    options: Options,
) -> Router {
    let idempotency = idempotency
        .with_body_timeout(BODY_TIMEOUT)
        .with_max_in_flight(MAX_IN_FLIGHT);
    // Outside the layer, which buffers the body.
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT_ORDERS));
    let concurrency = axum::middleware::from_fn(move |request: Request, next: Next| {
        let slots = slots.clone();
        async move {
            // Held until the answer's head; the semaphore is never closed.
            let _slot = slots.acquire_owned().await;
            next.run(request).await
        }
    });
    let pause = options.pause;
    // Outside the layer: it has recorded the answer by the time it returns.
    let answered = axum::middleware::from_fn(move |request: Request, next: Next| async move {
        let key = key_of(&request);
        let response = next.run(request).await;
        checkpoint(pause, "answered", &key).await;
        response
    });
    let mut router = Router::new();
    if let Some(phased) = options.phased.clone() {
        let phased = phased
            .with_body_timeout(BODY_TIMEOUT)
            .with_max_in_flight(MAX_IN_FLIGHT);
        router = router
            .route(
                "/v1/phased-orders",
                post(phased::create_phased_order)
                    .layer(phased)
                    .layer(concurrency.clone())
                    .layer(answered.clone())
                    .get(phased::list_phased_orders),
            )
            .route("/v1/emails", get(phased::list_emails));
    }
    router
        .route(
            "/v1/orders",
            post(create_order)
                .layer(idempotency)
                .layer(concurrency)
                .layer(answered)
                .get(list_orders),
        )
        .route("/v1/charges", get(list_charges))
        .with_state(AppState { ledger, options })
        .layer(AsyncRequireAuthorizationLayer::new(BearerMerchant))
}

fn key_of(request: &Request) -> String {
    request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

async fn checkpoint(pause: Duration, name: &str, key: &str) {
    if !pause.is_zero() {
        println!("checkpoint {name} {key}");
        tokio::time::sleep(pause).await;
    }
}

/// Demo auth: `Authorization: Bearer <token>`, where a token of 1 to 64
/// characters `[A-Za-z0-9._-]` is the merchant id. The merchant becomes the
/// idempotency [`Scope`], so keys never collide across merchants.
#[derive(Clone, Copy)]
pub struct BearerMerchant;

impl<B: Send + 'static> AsyncAuthorizeRequest<B> for BearerMerchant {
    type RequestBody = B;
    type ResponseBody = Body;
    type Future = Ready<Result<Request<B>, Response<Body>>>;

    fn authorize(&mut self, mut request: Request<B>) -> Self::Future {
        let merchant = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .filter(|token| is_merchant_token(token))
            .map(str::to_owned);
        ready(match merchant {
            Some(merchant) => {
                request.extensions_mut().insert(Scope::new(merchant));
                Ok(request)
            }
            None => Err(error(StatusCode::UNAUTHORIZED, "unauthorized").into_response()),
        })
    }
}

fn is_merchant_token(token: &str) -> bool {
    (1..=64).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn error(status: StatusCode, code: &str) -> (StatusCode, Json<Value>) {
    let message = match code {
        "unauthorized" => "send Authorization: Bearer <merchant token>",
        "ledger_unavailable" => "the order could not be written; nothing was charged",
        "payment_failed" => "the processor did not charge; retry with the same key",
        "recovery_point_unavailable" => {
            "a step could not be recorded; retry with the same key to resume"
        }
        _ => "send {sku: non-empty string, qty: integer 1..99, currency: \"USD\"}",
    };
    (status, Json(json!({ "code": code, "message": message })))
}

async fn create_order(State(state): State<AppState>, request: Request) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let (Some(merchant), Some(keys), Some(writer)) = (
        parts.extensions.get::<Scope>().cloned(),
        parts.extensions.get::<DownstreamKeys>().cloned(),
        Writer::of(&state.ledger, &parts.extensions),
    ) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable").into_response();
    };
    let Ok(body) = axum::body::to_bytes(body, 64 * 1024).await else {
        return error(StatusCode::BAD_REQUEST, "invalid_body").into_response();
    };
    let Some((sku, qty)) = validate(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_body").into_response();
    };
    let (ledger, options) = (&state.ledger, &state.options);
    let merchant = merchant.as_str();
    let key = keys.idempotency_key().as_str();
    checkpoint(options.pause, "before-charge", key).await;
    // The same key on every run of this handler for this request.
    let charge_key = keys.key_for(CARD_PROCESSOR);
    let charge = match &options.processor {
        Some(processor) => {
            let description = format!("{qty} x {sku}");
            let charged = processor
                .charge(&charge_key, merchant, qty * UNIT_PRICE, &description)
                .await;
            match charged {
                Ok(charge) => charge,
                Err(_) => return error(StatusCode::BAD_GATEWAY, "payment_failed").into_response(),
            }
        }
        None => match ledger
            .charge(&writer, charge_key.as_str(), merchant, &sku, qty)
            .await
        {
            Ok(charge) => charge,
            Err(_) => {
                return error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable")
                    .into_response()
            }
        },
    };
    checkpoint(options.pause, "charged", key).await;
    // A slow payment network: the window in which clients hang up and retry.
    if !options.delay.is_zero() {
        tokio::time::sleep(options.delay).await;
    }
    let order_key = keys.key_for("order");
    let ordered = ledger
        .order(&writer, order_key.as_str(), merchant, &charge, &sku, qty)
        .await;
    let Ok(order) = ordered else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable").into_response();
    };
    checkpoint(options.pause, "ordered", key).await;
    let id = order["id"].as_str().unwrap_or_default();
    let location = HeaderValue::try_from(format!("/v1/orders/{id}")).expect("ids are ASCII");
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(order),
    )
        .into_response()
}

/// `{sku: non-empty string, qty: integer 1..99, currency: "USD"}`.
fn validate(body: &[u8]) -> Option<(String, u64)> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let sku = value.get("sku")?.as_str().filter(|s| !s.is_empty())?;
    let qty = value
        .get("qty")?
        .as_u64()
        .filter(|q| (1..=99).contains(q))?;
    (value.get("currency")?.as_str()? == "USD").then(|| (sku.to_owned(), qty))
}

async fn list_orders(
    State(state): State<AppState>,
    Extension(merchant): Extension<Scope>,
) -> axum::response::Response {
    match state.ledger.orders(merchant.as_str()).await {
        Ok(orders) => Json(json!({ "orders": orders })).into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable").into_response(),
    }
}

async fn list_charges(
    State(state): State<AppState>,
    Extension(merchant): Extension<Scope>,
) -> axum::response::Response {
    let charges = match &state.options.processor {
        Some(processor) => processor.charges(merchant.as_str()).await.map_err(|_| ()),
        None => state
            .ledger
            .charges(merchant.as_str())
            .await
            .map_err(|_| ()),
    };
    match charges {
        Ok(charges) => Json(json!({ "charges": charges })).into_response(),
        Err(()) => error(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable").into_response(),
    }
}
