//! Natural-key job leases: one live job per `tenant:kind:period`, duplicates join it.
//!
//! Clients cannot always keep an `Idempotency-Key`: a reloaded tab mints a new
//! one, yet "Acme's August health report" is still one job. [`LeaseLayer`]
//! keys jobs by what they *are* — the tenant from authentication plus a key a
//! [`JobKeyExtractor`] builds from the request — and decides each start
//! atomically in a [`JobStore`](crate::store::JobStore):
//!
//! | Store holds for the natural key   | Answer                                                       |
//! |-----------------------------------|--------------------------------------------------------------|
//! | nothing (or only failed jobs)     | create the job with a lease, call the handler → `202 {"job_id","status":"queued","created":true}` + `Location` |
//! | a job under a live lease          | `200 {"job_id","status","join":true}` + `Location`; nothing new starts |
//! | a job whose lease expired         | steal it by compare-and-set (higher fencing token), call the handler → `202 {...,"stolen":true}` |
//! | a complete job                    | `200 {"job_id","status":"complete","artifact_id"}`             |
//! | a body naming another tenant      | `403 tenant_mismatch` (from the key extractor)               |
//! | over the tenant's budget          | `429 budget_exhausted`, before anything starts               |
//! | no tenant                         | `401 unauthorized`                                           |
//! | store error                       | `503`, nothing starts                                        |
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
//! use tower_idempotency::lease::{JsonJobKey, Lease, LeaseLayer};
//! use tower_idempotency::store::MemoryJobStore;
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
//!         LeaseLayer::new(jobs, "report", JsonJobKey::new(["report_type", "period"]))
//!             .with_location_prefix("/reports/"),
//!     ),
//! );
//! # let _ = app;
//! ```

mod future;
mod handle;
mod key;
mod layer;
mod outcome;
mod refusal;
mod service;

pub use future::ResponseFuture;
pub use handle::Lease;
pub use key::{JobCost, JobKeyExtractor, JobKeyRejection, JsonJobKey};
pub use layer::LeaseLayer;
pub(crate) use refusal::JobRefusal;
pub use service::LeaseService;
