//! The checkout service of the contract: `POST /v1/orders` behind demo bearer
//! auth and the idempotency layer; `GET /v1/orders` and `GET /v1/charges` list
//! what was created. Shared by `main.rs` and the tests, which mount the same
//! router.
//!
//! The handler first charges the customer (the simulated payment network),
//! waits `delay` (the network being slow), then writes the order. Both are
//! effects a retry must never repeat: the layer runs the handler to completion
//! even if the client hangs up, and on PostgreSQL both rows are written inside
//! the layer's transaction, so they commit with the recorded response or not
//! at all.

// `main.rs` and the tests each use part of it.
#[allow(dead_code)]
#[path = "ledger.rs"]
mod ledger;

use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
pub use ledger::Ledger;
#[allow(unused_imports)] // the tests count rows with it
pub use ledger::MemoryLedger;
use ledger::Writer;
use serde_json::{json, Value};
use std::future::{ready, Ready};
use std::time::Duration;
use tower_http::auth::{AsyncAuthorizeRequest, AsyncRequireAuthorizationLayer};
use tower_idempotency::{IdempotencyLayer, Scope, Store};

#[derive(Clone)]
struct AppState {
    ledger: Ledger,
    delay: Duration,
}

/// The whole service on the memory store and an in-process ledger.
#[allow(dead_code)]
pub fn router(store: impl Store, ledger: Ledger, delay: Duration) -> Router {
    router_with(IdempotencyLayer::new(store), ledger, delay)
}

/// The whole service: auth outside, idempotency on `POST /v1/orders` only.
pub fn router_with(idempotency: IdempotencyLayer, ledger: Ledger, delay: Duration) -> Router {
    Router::new()
        .route(
            "/v1/orders",
            post(create_order).layer(idempotency).get(list_orders),
        )
        .route("/v1/charges", get(list_charges))
        .with_state(AppState { ledger, delay })
        .layer(AsyncRequireAuthorizationLayer::new(BearerMerchant))
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
        _ => "send {sku: non-empty string, qty: integer 1..99, currency: \"USD\"}",
    };
    (status, Json(json!({ "code": code, "message": message })))
}

async fn create_order(State(state): State<AppState>, request: Request) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let (Some(merchant), Some(writer)) = (
        parts.extensions.get::<Scope>().cloned(),
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
    let ledger = &state.ledger;
    let merchant = merchant.as_str();
    let Ok(charge) = ledger.charge(&writer, merchant, &sku, qty).await else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable").into_response();
    };
    // A slow payment network: the window in which clients hang up and retry.
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    let Ok(order) = ledger.order(&writer, merchant, &charge, &sku, qty).await else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable").into_response();
    };
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
    match state.ledger.charges(merchant.as_str()).await {
        Ok(charges) => Json(json!({ "charges": charges })).into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable").into_response(),
    }
}
