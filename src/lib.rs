//! Tower middleware that makes state-changing HTTP endpoints safe to retry.
//!
//! Clients retry: double clicks, restored tabs, proxies that time out, mobile
//! apps that die mid-call. [`IdempotencyLayer`] makes each retry of
//! `POST /orders` replay the first response instead of creating a second order.
//!
//! # Quick start (axum)
//!
//! ```
//! use axum::{http::StatusCode, routing::post, Router};
//! use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};
//!
//! async fn create_order() -> (StatusCode, &'static str) {
//!     (StatusCode::CREATED, r#"{"id":"ord_1"}"#)
//! }
//!
//! let app: Router = Router::new()
//!     .route("/v1/orders", post(create_order))
//!     // Runs on matched routes only; your auth layer (outside) inserts a `Scope`.
//!     .route_layer(IdempotencyLayer::new(MemoryStore::new()));
//! # let _ = app;
//! ```
//!
//! See [`idempotency`] for the full flow and decision table, [`store`] for
//! the storage contract.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

pub mod body;
mod buffer;
pub mod client;
pub mod fingerprint;
pub mod idempotency;
mod key;
pub mod lease;
mod policy;
mod response;
mod scope;
pub mod store;
pub mod telemetry;

pub use body::{BoxError, ResponseBody};
pub use fingerprint::Fingerprint;
pub use idempotency::{IdempotencyLayer, IdempotencyService};
pub use key::{IdempotencyKey, MAX_KEY_LEN, MIN_KEY_LEN};
pub use lease::{Lease, LeaseLayer};
pub use policy::{CacheCreated, CachePolicy, CacheSuccess};
pub use response::{ErrorFormat, Refusal};
pub use scope::{FromExtension, Scope, ScopeExtractor};
#[cfg(feature = "postgres")]
pub use store::PostgresStore;
pub use store::{Begin, FencingToken, MemoryStore, RecordKey, Store, StoreError, StoredResponse};
