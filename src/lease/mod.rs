//! Natural-key job leases: one live job per `tenant:kind:period`, duplicates join it.
//!
//! Clients cannot always keep an `Idempotency-Key`: a reloaded tab mints a new
//! one, yet "Acme's August health report" is still one job. [`LeaseLayer`]
//! keys jobs by what they *are* — the tenant from authentication plus a key a
//! [`JobKeyExtractor`] builds from the request — and decides each start
//! atomically in a [`JobStore`](crate::lease::store::JobStore). A new key creates the job with a lease and calls the handler (`202`,
//! or the status of [`with_started_status`](crate::LeaseLayer::with_started_status)); a
//! start of a job under a live lease joins it (`200`, nothing new starts); an
//! expired lease is stolen once, by compare-and-set with a higher fencing
//! token; a complete job answers its artifact; a tenant over its budget is
//! `429`, a store failure `503`, before anything starts. Every answer is in
//! the [decision table](contract#start-one-atomic-decision).
//!
//! The handler receives a [`Lease`] in the request extensions and decides what
//! starts the work; any `2xx` it returns becomes the `202` above, anything else
//! is passed through and fails the job. The worker heartbeats, appends numbered
//! chunks to the job's cursor, and finalizes — each write fenced by the lease's
//! token, so a worker that stalled past its lease and was replaced cannot write.
//!
//! # Example
//!
//! ```
//! use axum::{routing::post, Extension, Router};
//! use http::StatusCode;
//! use tower_idempotency::{Lease, LeaseLayer, lease::JsonJobKey};
//! use tower_idempotency::lease::store::MemoryJobStore;
//!
//! async fn start_report(Extension(lease): Extension<Lease>) -> StatusCode {
//!     lease.spawn_worker(|lease| async move {
//!         lease.append(0, "# Health report\n").await.map_err(|e| e.to_string())?;
//!         Ok("# Health report\n".into())
//!     });
//!     StatusCode::ACCEPTED
//! }
//!
//! let jobs = MemoryJobStore::new();
//! let app: Router = Router::new().route(
//!     "/reports/start",
//!     post(start_report).layer(
//!         LeaseLayer::new(jobs, "report".parse()?, JsonJobKey::new(["report_type", "period"]))
//!             .with_location_prefix("/reports/"),
//!     ),
//! );
//! # let _ = app;
//! # Ok::<(), tower_idempotency::ConfigError>(())
//! ```

/// The subsystem's contract in full: setting it up, the natural key, the
/// start decision table, the worker's fenced writes, readers, endings,
/// budgets and stores (the crate's `docs/leases.md`). Its examples need the
/// `postgres` feature, so they are doctests only with it.
#[cfg_attr(any(not(doctest), feature = "postgres"), doc = include_str!("../../docs/leases.md"))]
pub mod contract {}

mod config;
mod future;
pub(crate) mod handle;
mod key;
mod kind;
pub(crate) mod layer;
mod outcome;
mod service;
pub mod store;

pub use config::StartedStatus;
pub use future::ResponseFuture;
pub use handle::Lease;
pub use key::{JobCost, JobKeyExtractor, JobKeyRejection, JsonJobKey};
pub use kind::JobKind;
pub use layer::LeaseLayer;
pub use service::LeaseService;
