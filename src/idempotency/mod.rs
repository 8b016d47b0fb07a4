//! `Idempotency-Key` middleware: run each request once, replay it to retries.
//!
//! # The flow
//!
//! For a request whose method the layer applies to (POST and PATCH by default):
//!
//! 1. **Scope**: the tenant, from a [`ScopeExtractor`](crate::ScopeExtractor)
//!    (by default a [`Scope`](crate::Scope) an auth layer put into the request
//!    extensions). None → `401 unauthorized`.
//! 2. **Key**: exactly one `Idempotency-Key` header, a token of 8 to 128
//!    `[A-Za-z0-9._-]` or the same as an RFC 8941 sf-string (`"..."`).
//!    None → `400 idempotency_key_required`; another value →
//!    `400 idempotency_key_invalid`; two, or a comma-joined list →
//!    `400 idempotency_key_repeated`.
//! 3. **Body**: buffered up to the limit (1 MiB) → else `413 payload_too_large`.
//! 4. **Fingerprint**: SHA-256 of method, path and query, key, scope and the body,
//!    JSON in its RFC 8785 canonical form ([`Fingerprint`](crate::Fingerprint)).
//! 5. **Decision**, one atomic step in the [`Store`](crate::Store): a new key
//!    is claimed and its handler runs; the same request replays the recorded
//!    response (`Idempotent-Replayed: true`); another request under the key is
//!    `409 idempotency_key_reuse`; a retry of a request still running waits to
//!    be woken, then decides again; a store failure is `503` and nothing runs.
//!    Every answer, in the order the checks run, is in the
//!    [decision table](contract#decision-table).
//! 6. **Run**: the claimed inner future is polled once in place and, if it
//!    has to wait, handed to a task of its own before the caller's future can
//!    be dropped, so a caller that hangs up (or an outer `TimeoutLayer`) stops
//!    waiting, not the handler
//!    ([`with_cancel_on_drop`](crate::IdempotencyLayer::with_cancel_on_drop) to
//!    opt out); its claim is extended while it runs, and
//!    [`in_flight`](crate::IdempotencyLayer::in_flight) lets a server wait for
//!    running handlers at shutdown.
//! 7. **Record**: a response the [`CachePolicy`](crate::CachePolicy) accepts
//!    (`201` by default) is stored under the claim's fencing token (streamed to
//!    the caller as it is produced, its copy bounded by
//!    [`with_record_limit`](crate::IdempotencyLayer::with_record_limit)), and the
//!    retry that waited for it replays it. Another status, an inner error or a
//!    panic releases the key so a corrected request runs; a recorded response
//!    whose body fails or is too large keeps the key, and retries get `410
//!    idempotency_response_unavailable`: the handler never runs twice.
//!
//! With [`IdempotencyLayer::transactional`](crate::IdempotencyLayer::transactional)
//! over `PostgresStore`, the handler writes through a `PostgresTransaction`
//! from its request extensions, and its writes commit with the record or are
//! rolled back with the key's release.
//!
//! Refusals are JSON `{"code","message"}` (or RFC 9457 problem details, or
//! what [`with_refusal_response`](crate::IdempotencyLayer::with_refusal_response)
//! builds) with the typed [`Refused`](crate::Refused) in their extensions, and
//! never change the inner service's error type.
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
mod layer;
mod run_claimed;
mod service;
mod warn_once;

pub use config::{IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_RETENTION, IDEMPOTENT_REPLAYED};
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use service::IdempotencyService;
