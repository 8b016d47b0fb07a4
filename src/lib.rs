//! Tower middleware that makes state-changing HTTP endpoints safe to retry.
//!
//! Clients retry: double clicks, restored tabs, proxies that time out, mobile
//! apps that die mid-call. [`IdempotencyLayer`] makes each retry of
//! `POST /orders` that carries the same `Idempotency-Key` get the first
//! response back — same status, headers and body bytes — while the handler
//! runs once. [`LeaseLayer`] (feature `leases`) does the same for jobs named
//! by what they are (`tenant:kind:period`) when clients cannot keep a key.
//!
//! # Where to start
//!
//! | To | Use |
//! |---|---|
//! | make `POST`/`PATCH` routes safe to retry | [`IdempotencyLayer`] over a store: [`MemoryStore`] in one process, `PostgresStore` (feature `postgres`) or `RedisStore` (feature `redis`) for many |
//! | tell the layer who the tenant is | a [`Scope`] in the request extensions, or any [`ScopeExtractor`] |
//! | record more than `201` | a [`RecordPolicy`]: [`RecordSuccess`] records every 2xx |
//! | shape the refusals (`409`, `422`, `503`, ...) | [`ErrorFormat`], or a [`RefusalResponse`] hook that sees the [`Refusal`] |
//! | commit the handler's writes with the record | `IdempotencyLayer::transactional` and `PostgresTransaction` |
//! | hand the key on to a payment processor | the [`DownstreamKeys`](downstream::DownstreamKeys) in a claimed request's extensions; [`Attempt`](engine::Attempt) says whether it took over |
//! | drain running handlers at shutdown | [`InFlight`], from `IdempotencyLayer::in_flight` |
//! | give a job named by what it is one live run | [`LeaseLayer`] and its fenced [`Lease`] (feature `leases`) |
//! | run an operation once outside HTTP | the [`engine`] |
//! | write a store of your own | the traits in [`store`] and their conformance suites (feature `test-util`) |
//! | send keys and retry from a client | [`client`] |
//! | document the guarded routes | [`openapi`][openapi-module] (feature `utoipa`) |
//!
//! The decision every request goes through, and why, is the
//! [contract](crate::idempotency::contract).
//!
//! # Quick start
//!
//! **1. Add the crate** (features: `postgres` for [`store`]'s PostgreSQL
//! stores, `redis` for `RedisStore` on Redis or Valkey, `metrics` for counters
//! and a latency histogram, `client` for the retry policy in [`client`],
//! `leases` for [`LeaseLayer`]):
//!
//! ```toml
//! [dependencies]
//! # Until the crate is on crates.io, a checkout (or `git = "..."`); then `"0.1"`.
//! tower-idempotency = { path = "../tower-idempotency" }
//! tracing-subscriber = "0.3" # to see the layer's warnings
//! ```
//!
//! **2. Authenticate, then put the layer on the routes that change state.**
//! The layer keys records by `(scope, key)`: the scope is the tenant your
//! authentication established, put into the request extensions as a
//! [`Scope`] (or found by any [`ScopeExtractor`]: a closure over the request
//! head works).
//!
//! ```no_run
//! use axum::extract::{Extension, Request};
//! use axum::http::StatusCode;
//! use axum::middleware::{self, Next};
//! use axum::response::{IntoResponse, Response};
//! use axum::routing::post;
//! use axum::Router;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, RecordCreated, Scope};
//!
//! /// Your authentication: here `Authorization: Bearer <tenant>`.
//! async fn auth(mut req: Request, next: Next) -> Response {
//!     let tenant = req.headers().get("authorization")
//!         .and_then(|v| v.to_str().ok())
//!         .and_then(|v| v.strip_prefix("Bearer "))
//!         .map(Scope::new);
//!     match tenant {
//!         Some(tenant) => {
//!             req.extensions_mut().insert(tenant);
//!             next.run(req).await
//!         }
//!         None => StatusCode::UNAUTHORIZED.into_response(),
//!     }
//! }
//!
//! fn app(orders: Arc<AtomicU64>) -> Router {
//!     let create_order = move |Extension(tenant): Extension<Scope>| async move {
//!         let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
//!         (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}","tenant":"{}"}}"#, tenant.as_str()))
//!     };
//!     let idempotency = IdempotencyLayer::new(MemoryStore::new())
//!         // The default, written out: only `201 Created` is recorded. A handler
//!         // answering `200` runs again on every retry (its answers carry
//!         // `Idempotency-Status: not-recorded`); `RecordSuccess` records every 2xx.
//!         .with_record_policy(RecordCreated);
//!     Router::new()
//!         .route("/v1/orders", post(create_order))
//!         // Only on the routes above, and only when one matched.
//!         .route_layer(idempotency)
//!         // Outside (runs first): authentication sets the scope.
//!         .layer(middleware::from_fn(auth))
//! }
//!
//! #[tokio::main]
//! async fn main() {
//!     // The layer reports setup mistakes (a route whose answers it does not
//!     // record, requests without a scope) as `WARN` events: print them.
//!     tracing_subscriber::fmt().init();
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
//!     axum::serve(listener, app(Arc::default())).await.unwrap();
//! }
//! ```
//!
//! **3. What clients get.** Run it and send the same request twice:
//!
//! ```
//! # use axum::{body::Body, extract::{Extension, Request}, http::StatusCode, routing::post, Router};
//! # use http_body_util::BodyExt;
//! # use tower::ServiceExt;
//! # use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # let app = Router::new()
//! #     .route("/v1/orders", post(|| async { (StatusCode::CREATED, r#"{"id":"ord_1"}"#) }))
//! #     .route_layer(IdempotencyLayer::new(MemoryStore::new()))
//! #     .layer(axum::middleware::from_fn(|mut req: Request, next: axum::middleware::Next| async move {
//! #         req.extensions_mut().insert(Scope::new("acme"));
//! #         next.run(req).await
//! #     }));
//! let order = |body: &'static str| {
//!     Request::post("/v1/orders")
//!         .header("authorization", "Bearer acme")
//!         .header("idempotency-key", "order-7f3a9c2e")
//!         .header("content-type", "application/json")
//!         .body(Body::from(body))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(order(r#"{"sku":"A-1","qty":2}"#)).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//!
//! // A retry (JSON compared by value: key order and whitespace do not matter).
//! let retry = app.clone().oneshot(order(r#"{ "qty": 2, "sku": "A-1" }"#)).await.unwrap();
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let (first, retry) = (
//!     first.into_body().collect().await.unwrap().to_bytes(),
//!     retry.into_body().collect().await.unwrap().to_bytes(),
//! );
//! assert_eq!(first, retry);
//!
//! // The same key with another request is refused; nothing runs.
//! let reuse = app.clone().oneshot(order(r#"{"sku":"A-1","qty":3}"#)).await.unwrap();
//! assert_eq!(reuse.status(), StatusCode::CONFLICT); // {"code":"idempotency_key_reuse",...}
//! # }
//! ```
//!
//! Every other answer (no scope, a missing or malformed key, a body over the
//! limit, a retry while the first request runs, a store that is down, a
//! response the [`RecordPolicy`] does not record, ...) is a row of the
//! [decision table](idempotency::contract#decision-table), in the order the
//! checks run; the flow and the reasons behind it are
//! [`idempotency::contract`].
//!
//! **4. Tune it** where the defaults do not fit:
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::{RecordSuccess, ErrorFormat, IdempotencyLayer, KeyReuseStatus, MemoryStore};
//!
//! let store = MemoryStore::builder()
//!     .with_retention(Duration::from_secs(24 * 3600)) // how long a response replays
//!     .with_lock_timeout(Duration::from_secs(10))     // how long a dead owner blocks
//!     .build();
//! let layer = IdempotencyLayer::new(store)
//!     .with_record_policy(RecordSuccess)                // record every 2xx, not only 201
//!     .with_body_limit(256 * 1024)
//!     .with_wait_timeout(Duration::from_secs(2))      // a duplicate waits this long
//!     .with_key_reuse_status(KeyReuseStatus::UnprocessableEntity) // 422, as the IETF draft
//!     .with_error_format(ErrorFormat::Problem);       // RFC 9457 problem details
//! # let _ = layer;
//! ```
//!
//! **5. Share records between instances** with PostgreSQL (feature
//! `postgres`): `PostgresStore::connect(url)` (or `PostgresStore::builder`
//! for options, TLS or a pool of your own), `migrate()` at startup,
//! `purge_expired()` every few minutes; `IdempotencyLayer::transactional`
//! commits the handler's writes with the record (`PostgresTransaction`). See
//! the repository's `docs/postgres.md`. With Redis or Valkey
//! (feature `redis`), one server or a Cluster: `RedisStore::connect(url)` or
//! `RedisStore::connect_cluster(nodes)` (`docs/redis.md`).
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn run(database_url: &str) -> Result<(), tower_idempotency::store::StoreError> {
//! use tower_idempotency::{IdempotencyLayer, PostgresStore};
//!
//! let store = PostgresStore::connect(database_url).await?;
//! store.migrate().await?;
//! let layer = IdempotencyLayer::new(store.clone());
//! // and, for expired records: store::purge::PurgeTask::new(store.clone()).spawn()?;
//! # let _ = layer;
//! # Ok(())
//! # }
//! ```
//!
//! # Beyond axum
//!
//! The layers are plain tower layers over `http::Request<B>` where `B` is
//! `From<Bytes>` (axum's `Body`, `http_body_util::Full<Bytes>`); the
//! repository's examples show them in other stacks:
//!
//! - `examples/hyper_service_fn.rs` — hyper 1 with `service_fn` and hyper-util,
//!   the scope from a closure (`.with_scope(...)`);
//! - `examples/grpc_web/` — a tonic-web gRPC-Web service (protobuf bodies
//!   are fingerprinted as bytes), a package of its own
//!   (`cargo run -p tower-idempotency-grpc-web`);
//! - `examples/layer_order.rs` — with tower-http's trace, body limit,
//!   compression and timeout layers: compression *outside* (stored bytes stay
//!   identity), the body limit outside, the timeout inside;
//! - `examples/axum_per_route/` — per-route opt-in three ways, tracing
//!   output and metrics, a package of its own
//!   (`cargo run -p tower-idempotency-axum-per-route`).
//!
//! # Observability
//!
//! Every decision runs in a `tracing` span with the scope, a hash of the key
//! (never the key) and the outcome (`claimed`, `replayed`, `key_reused`,
//! `in_progress`, `released`, `store_error`, ...); with the `metrics`
//! feature, counters and a latency histogram per outcome. See [`telemetry`].
//!
//! # Clients
//!
//! A key names an operation, not an attempt: [`client`] generates one per
//! operation and keeps it across retries ([`client::IdempotencyKeyLayer`],
//! [`client::OperationKey`]), and (feature `client`) retries
//! `409 idempotency_in_progress` after its `Retry-After`, `503` and transport
//! errors with `tower::retry` — never `idempotency_key_reuse` or other `4xx`.
//!
//! # Outside HTTP
//!
//! [`Engine`](engine::Engine) is the machinery the layer runs on, for queue consumers,
//! webhooks and scheduled jobs: it runs an async operation at most once per
//! `(scope, key)` over any store and gives repeats the recorded result. See
//! [`engine`] and `examples/consumer.rs`.
//!
//! # Jobs without keys
//!
//! [`LeaseLayer`] (feature `leases`) gives a natural key ("Acme's August
//! report") one live job: duplicates join it, a worker holds a fenced
//! [`Lease`]. See [the `lease` module][lease-module].
// Without `leases`, these links go to the documentation built with every feature.
#![cfg_attr(not(feature = "leases"), doc = "")]
#![cfg_attr(
    not(feature = "leases"),
    doc = "[`LeaseLayer`]: https://docs.rs/tower-idempotency/latest/tower_idempotency/struct.LeaseLayer.html"
)]
#![cfg_attr(
    not(feature = "leases"),
    doc = "[`Lease`]: https://docs.rs/tower-idempotency/latest/tower_idempotency/struct.Lease.html"
)]
#![cfg_attr(
    not(feature = "leases"),
    doc = "[lease-module]: https://docs.rs/tower-idempotency/latest/tower_idempotency/lease/index.html"
)]
#![cfg_attr(feature = "leases", doc = "", doc = "[lease-module]: crate::lease")]
#![cfg_attr(
    not(feature = "utoipa"),
    doc = "[openapi-module]: https://docs.rs/tower-idempotency/latest/tower_idempotency/openapi/index.html"
)]
#![cfg_attr(feature = "utoipa", doc = "[openapi-module]: crate::openapi")]
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
#[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
pub mod admin;
pub mod body;
mod buffer;
pub mod client;
mod config;
pub mod downstream;
pub mod engine;
pub mod fingerprint;
mod future;
pub mod idempotency;
mod key;
#[cfg(feature = "leases")]
pub mod lease;
mod limits;
#[cfg(feature = "utoipa")]
#[cfg_attr(docsrs, doc(cfg(feature = "utoipa")))]
pub mod openapi;
mod options;
mod policy;
mod random;
mod response;
mod run;
mod scope;
pub mod store;
pub mod telemetry;
mod warn_once;

/// The PostgreSQL driver crates the `postgres` feature builds on, re-exported
/// so that an application names the versions the stores take without
/// depending on them itself: `deadpool_postgres::Pool` for
/// [`PostgresStore::builder`], `tokio_postgres::Config` for its listener, and
/// `tokio_postgres::types::ToSql` and `Row` for the queries a handler sends
/// through its [`PostgresTransaction`]. [`PostgresStore::connect`] needs
/// neither.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    #[doc(no_inline)]
    pub use deadpool_postgres;
    #[doc(no_inline)]
    pub use tokio_postgres;
}

pub use config::ConfigError;
pub use idempotency::layer::IdempotencyLayer;
pub use key::{IdempotencyKey, MAX_KEY_LEN, MIN_KEY_LEN};
#[cfg(feature = "leases")]
pub use lease::{handle::Lease, layer::LeaseLayer};
pub use run::in_flight::InFlight;

/// The README's quick start, compiled as a doctest so that it works as written.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeQuickStart;

/// The Rust examples of `docs/postgres.md`, compiled as doctests.
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../docs/postgres.md")]
pub struct PostgresGuide;

/// The Rust examples of `docs/beyond-http.md` (the engine, and a store's
/// conformance suite, which needs `test-util`), compiled and run as doctests.
#[cfg(all(doctest, feature = "test-util"))]
#[doc = include_str!("../docs/beyond-http.md")]
pub struct BeyondHttpGuide;

/// The Rust example of `docs/redis.md`, compiled as a doctest.
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../docs/redis.md")]
pub struct RedisGuide;

/// The Rust example of `docs/idempotency.md`, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../docs/idempotency.md")]
pub struct IdempotencyGuide;

/// The Rust examples of `docs/compatibility.md`, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../docs/compatibility.md")]
pub struct CompatibilityGuide;

pub use policy::{RecordCreated, RecordPolicy, RecordSuccess};
pub use response::{ErrorFormat, KeyCodes, KeyReuseStatus, Refusal, RefusalResponse, Refused};
pub use scope::{FromExtension, Scope, ScopeExtractor};
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::{PostgresStore, PostgresTransaction};
#[cfg(feature = "redis")]
pub use store::redis::RedisStore;
