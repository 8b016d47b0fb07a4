//! `Idempotency-Key` middleware: run each request once, replay it to retries.
//!
//! For a request whose method it applies to (POST and PATCH by default), the
//! layer takes the tenant's [`Scope`](crate::Scope) and the `Idempotency-Key`,
//! buffers and fingerprints the body, and asks the [`Store`](crate::store::Store), in
//! one atomic step, whether to run the handler, replay the recorded response
//! or refuse. A claimed handler runs to completion and its response is
//! recorded for the retries; with
//! [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)
//! its writes to PostgreSQL commit with the record. The flow drawn, each step
//! with its reasons, and every answer in the order the checks run (the
//! [decision table](contract#decision-table)) are in [`contract`].
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let orders = Arc::new(AtomicUsize::new(0));
//! let counter = orders.clone();
//! let service = ServiceBuilder::new()
//!     .layer(IdempotencyLayer::new(MemoryStore::new()))
//!     .service_fn(move |_req: Request<Full<Bytes>>| {
//!         let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
//!         async move {
//!             let body = Full::new(Bytes::from(format!(r#"{{"order":{n}}}"#)));
//!             Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
//!         }
//!     });
//!
//! let request = || {
//!     let mut req = Request::post("/v1/orders")
//!         .header("idempotency-key", "order-7f3a9c2e")
//!         .header("content-type", "application/json")
//!         .body(Full::new(Bytes::from_static(br#"{"sku":"A-1","qty":2}"#)))
//!         .unwrap();
//!     req.extensions_mut().insert(Scope::new("merchant_1")); // set by your auth layer
//!     req
//! };
//!
//! let first = service.clone().oneshot(request()).await.unwrap();
//! let retry = service.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let first = first.into_body().collect().await.unwrap().to_bytes();
//! let retry = retry.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(first, retry);
//! assert_eq!(orders.load(Ordering::SeqCst), 1, "the handler ran once");
//! # }
//! ```

mod future;

/// The layer's contract in full: the order of checks, the decision table,
/// running and recording the handler, transactional mode, locks, retention
/// and errors, with the reasons behind each choice (the crate's
/// `docs/idempotency.md`).
#[doc = include_str!("../../docs/idempotency.md")]
pub mod contract {}

mod answer;
mod config;
pub(crate) mod layer;
mod record;
mod run_claimed;
mod service;

pub use config::{
    IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_RETENTION, IDEMPOTENCY_STATUS, IDEMPOTENT_REPLAYED,
};
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use service::IdempotencyService;
