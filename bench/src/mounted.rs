//! The layers as users mount them (see `benches/mounted.rs`): the apps, the
//! body and the requests, shared by the timing and the allocation counts.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_TYPE, COOKIE};
use axum::http::{HeaderValue, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use tower::ServiceExt;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};

use crate::establish_session;

/// The request body: 20 line items, keys not in sorted order.
pub fn order_body() -> Bytes {
    let items: Vec<String> = (1..=20)
        .map(|i| {
            format!(
                r#"{{"sku":"SKU-{i:04}","qty":{},"note":"lorem ipsum"}}"#,
                i % 9 + 1
            )
        })
        .collect();
    Bytes::from(format!(
        r#"{{"currency":"USD","items":[{}],"customer":"cus_8f2a1c"}}"#,
        items.join(",")
    ))
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// The handler: the body as `String`, `201` with a small JSON answer.
async fn create_order(
    body: String,
) -> (
    StatusCode,
    [(axum::http::HeaderName, &'static str); 1],
    String,
) {
    let n = RUNS.fetch_add(1, Ordering::Relaxed) + 1;
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        format!(r#"{{"id":"ord_{n:08}","received":{}}}"#, body.len()),
    )
}

fn tenant(parts: &http::request::Parts) -> Option<Scope> {
    parts
        .headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .map(Scope::new)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Baseline,
    OursFresh,
    OursReplay,
    IdempotentFresh,
    IdempotentReplay,
    AxumIdemBaseline,
    AxumIdemFresh,
    AxumIdemReplay,
}

impl Variant {
    pub const ALL: [Variant; 8] = [
        Variant::Baseline,
        Variant::OursFresh,
        Variant::OursReplay,
        Variant::IdempotentFresh,
        Variant::IdempotentReplay,
        Variant::AxumIdemBaseline,
        Variant::AxumIdemFresh,
        Variant::AxumIdemReplay,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Baseline => "do-nothing route_layer",
            Variant::OursFresh => "ours/fresh",
            Variant::OursReplay => "ours/replay",
            Variant::IdempotentFresh => "idempotent/fresh",
            Variant::IdempotentReplay => "idempotent/replay",
            Variant::AxumIdemBaseline => "session stack, do-nothing route_layer",
            Variant::AxumIdemFresh => "axum-idempotent/fresh",
            Variant::AxumIdemReplay => "axum-idempotent/replay",
        }
    }

    pub fn fresh(self) -> bool {
        matches!(
            self,
            Variant::OursFresh | Variant::IdempotentFresh | Variant::AxumIdemFresh
        )
    }

    pub fn is_baseline(self) -> bool {
        matches!(self, Variant::Baseline | Variant::AxumIdemBaseline)
    }

    /// Whether its requests replay one completed key.
    pub fn replays(self) -> bool {
        !self.fresh() && !self.is_baseline()
    }

    /// What its overhead is measured against: axum-idempotent needs a
    /// session stack (cookies, a session store) whatever it does.
    pub fn baseline(self) -> Variant {
        match self {
            Variant::AxumIdemFresh | Variant::AxumIdemReplay => Variant::AxumIdemBaseline,
            _ => Variant::Baseline,
        }
    }
}

/// The route, as the README mounts a layer.
fn route() -> Router {
    Router::new().route("/v1/orders", post(create_order))
}

/// The app of `variant`, and the cookie its requests carry (axum-idempotent).
pub async fn app(variant: Variant) -> (Router, Option<HeaderValue>) {
    let identity = tower::layer::util::Identity::new();
    match variant {
        Variant::Baseline => (route().route_layer(identity), None),
        Variant::OursFresh | Variant::OursReplay => (
            route().route_layer(
                IdempotencyLayer::new(
                    MemoryStore::builder()
                        .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
                        .build(),
                )
                .with_scope(tenant),
            ),
            None,
        ),
        Variant::IdempotentFresh | Variant::IdempotentReplay => {
            let store = idempotent::memory::MemoryStore::builder()
                .try_build()
                .expect("idempotent memory store");
            let layer = idempotent::middleware::IdempotencyLayer::new(store)
                .scope(|parts| tenant(parts).map(|s| s.as_str().to_owned()));
            (route().route_layer(layer), None)
        }
        Variant::AxumIdemBaseline | Variant::AxumIdemFresh | Variant::AxumIdemReplay => {
            let app = session_app(variant != Variant::AxumIdemBaseline);
            let cookie = establish_session(&app).await;
            (app, Some(cookie))
        }
    }
}

/// The session stack `axum-idempotent` needs, with its layer on the route
/// (`route_layer`) or a do-nothing one.
fn session_app(with_layer: bool) -> Router {
    let orders = if with_layer {
        route().route_layer(crate::axum_idempotent_layer())
    } else {
        route().route_layer(tower::layer::util::Identity::new())
    };
    crate::with_session_stack(orders, 1_000_000)
}

pub fn request(key: &str, body: &Bytes, cookie: Option<&HeaderValue>) -> Request {
    let mut builder = Request::post("/v1/orders")
        .header(CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .header("x-tenant", "acme");
    if let Some(cookie) = cookie {
        builder = builder.header(COOKIE, cookie.clone());
    }
    builder.body(Body::from(body.clone())).expect("request")
}

/// Requests for one batch, to be built before timing (`MOUNTED_BUILD=before`).
pub fn requests(
    variant: Variant,
    n: u64,
    run: u64,
    body: &Bytes,
    cookie: Option<&HeaderValue>,
) -> Vec<Request> {
    (0..n)
        .map(|i| nth_request(variant, i, run, body, cookie))
        .collect()
}

/// Request `i` of a batch.
pub fn nth_request(
    variant: Variant,
    i: u64,
    run: u64,
    body: &Bytes,
    cookie: Option<&HeaderValue>,
) -> Request {
    let key = if !variant.replays() {
        format!("order-{run:04}-{i:010}")
    } else {
        seed_key(i % replay_keys())
    };
    request(&key, body, cookie)
}

/// How many completed keys the replay variants cycle through
/// (`MOUNTED_REPLAY_KEYS`, default 1: the same record every time, as hot in
/// the caches as it can be; more spread the replays over cold records).
pub fn replay_keys() -> u64 {
    std::env::var("MOUNTED_REPLAY_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

fn seed_key(i: u64) -> String {
    format!("order-seed-{i:06}")
}

/// One response, read whole; whether it was a replay.
pub async fn send(app: &Router, req: Request) -> (StatusCode, bool) {
    let response = app.clone().oneshot(req).await.expect("infallible");
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed")
        || response.headers().contains_key("idempotency-replayed");
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body");
    black_box(body);
    (status, replayed)
}

/// A ready app: the replay key completed, and checked to answer as intended.
pub async fn ready(variant: Variant, body: &Bytes) -> (Router, Option<HeaderValue>) {
    let (app, cookie) = app(variant).await;
    for i in 0..replay_keys() {
        let seed = request(&seed_key(i), body, cookie.as_ref());
        assert_eq!(send(&app, seed).await.0, StatusCode::CREATED, "{variant:?}");
    }
    let probe = requests(variant, 1, 9_999, body, cookie.as_ref())
        .pop()
        .expect("one");
    let (status, replayed) = send(&app, probe).await;
    assert_eq!(status, StatusCode::CREATED, "{variant:?}");
    assert_eq!(replayed, variant.replays(), "{variant:?}");
    (app, cookie)
}
