//! The checkout service of the contract: `POST /v1/orders` behind demo bearer
//! auth and the idempotency layer, `GET /v1/orders` to count what was created.
//! Shared by `main.rs` and the tests, which mount the same router.

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::{ready, Ready};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_http::auth::{AsyncAuthorizeRequest, AsyncRequireAuthorizationLayer};
use tower_idempotency::{IdempotencyLayer, Scope, Store};

/// Orders created, per merchant.
#[derive(Default)]
pub struct Orders {
    next_id: AtomicU64,
    by_merchant: Mutex<HashMap<String, Vec<Value>>>,
}

impl Orders {
    /// Every order created so far, across merchants (the tests count with it).
    #[allow(dead_code)]
    pub fn total(&self) -> usize {
        self.by_merchant
            .lock()
            .unwrap()
            .values()
            .map(Vec::len)
            .sum()
    }
}

#[derive(Clone)]
struct AppState {
    orders: Arc<Orders>,
    delay: Duration,
}

/// The whole service: auth outside, idempotency on `POST /v1/orders` only.
pub fn router(store: impl Store, orders: Arc<Orders>, delay: Duration) -> Router {
    router_with(IdempotencyLayer::new(store), orders, delay)
}

/// [`router`] with a configured idempotency layer.
pub fn router_with(idempotency: IdempotencyLayer, orders: Arc<Orders>, delay: Duration) -> Router {
    Router::new()
        .route(
            "/v1/orders",
            post(create_order).layer(idempotency).get(list_orders),
        )
        .with_state(AppState { orders, delay })
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
        _ => "send {sku: non-empty string, qty: integer 1..99, currency: \"USD\"}",
    };
    (status, Json(json!({ "code": code, "message": message })))
}

async fn create_order(
    State(state): State<AppState>,
    Extension(merchant): Extension<Scope>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let Some((sku, qty)) = validate(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_body").into_response();
    };
    // A slow payment network: the window in which retries race the first request.
    if !state.delay.is_zero() {
        tokio::time::sleep(state.delay).await;
    }
    let id = format!(
        "ord_{:06}",
        state.orders.next_id.fetch_add(1, Ordering::SeqCst) + 1
    );
    let order = json!({ "id": id, "sku": sku, "qty": qty, "currency": "USD" });
    state
        .orders
        .by_merchant
        .lock()
        .unwrap()
        .entry(merchant.as_str().to_owned())
        .or_default()
        .push(order.clone());
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
) -> Json<Value> {
    let orders = state.orders.by_merchant.lock().unwrap();
    let mine = orders.get(merchant.as_str()).cloned().unwrap_or_default();
    Json(json!({ "orders": mine }))
}
