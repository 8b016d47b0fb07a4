//! The reports service: `POST /reports/start` behind demo bearer auth and the
//! [`LeaseLayer`], the worker endpoints an external worker calls, the readers
//! (job, cursor, server-sent events, artifact) and an operator budget reset.
//! Shared by `main.rs` and the tests, which mount the same router.
//!
//! This file holds the configuration and the router; the handlers live in the
//! submodules next to it. They are declared with `#[path]` so that this file
//! works both as `main.rs`'s `mod app` and when a test includes it with
//! `#[path = ".../examples/reports/app.rs"]`: a `#[path]` is relative to the
//! directory of the file that declares the module, wherever it is included from.
//!
//! Every endpoint, body and status code is documented in `docs/reports.md`.

#[path = "admin.rs"]
mod admin;
#[path = "answers.rs"]
mod answers;
#[path = "auth.rs"]
mod auth;
#[path = "events.rs"]
mod events;
#[path = "readers.rs"]
mod readers;
#[path = "start.rs"]
mod start;
#[path = "worker_api.rs"]
mod worker_api;

pub use auth::BearerTenant;

use answers::{store_unavailable, unknown_job, ApiError};
use axum::body::Bytes;
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;
use serde_json::Value;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;
use tower_http::auth::AsyncRequireAuthorizationLayer;
use tower_idempotency::lease::store::{AnyJobStore, Budget, Job, JobMaintenance, JobReader};
use tower_idempotency::{
    lease::{JobKeyExtractor, JobKeyRejection, JsonJobKey, StartedStatus},
    LeaseLayer,
};
use tower_idempotency::{store::Store, IdempotencyLayer, MemoryStore, Scope};

/// Report types `POST /reports/start` accepts.
pub const REPORT_TYPES: &[&str] = &["customer_health", "usage_summary"];

/// Who does the work of a started job.
#[derive(Clone, Copy, Debug)]
pub enum Worker {
    /// The start handler spawns a simulated model under the lease
    /// ([`Lease::spawn_worker`](tower_idempotency::Lease::spawn_worker)): it
    /// appends one chunk every `chunk_delay`, then finalizes with the
    /// concatenated text.
    BuiltIn {
        /// The pause before each chunk (`REPORT_CHUNK_MS`).
        chunk_delay: Duration,
    },
    /// `REPORT_WORKER=off`: the start handler does nothing; the job stays
    /// queued until an external worker acquires it over HTTP.
    Off,
}

/// How the simulated model provider fails (`REPORT_PROVIDER_FAIL`), so that a
/// failed job's budget reservation is seen coming back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderFailure {
    /// `5xx`: the provider answers an error; the job fails `provider_5xx`.
    Status5xx,
    /// `timeout`: the provider never answers; the job fails `provider_timeout`.
    Timeout,
}

impl ProviderFailure {
    /// The job's error code.
    pub fn code(self) -> &'static str {
        match self {
            Self::Status5xx => "provider_5xx",
            Self::Timeout => "provider_timeout",
        }
    }
}

/// The model tokens a report is estimated to cost, reserved when it starts.
pub fn report_tokens(report_type: &str) -> u64 {
    match report_type {
        "customer_health" => 1200,
        _ => 800,
    }
}

/// How the service is configured (`main.rs` reads it from the environment).
#[derive(Clone, Debug)]
pub struct Config {
    /// Who does the work.
    pub worker: Worker,
    /// Jobs per tenant and month (`REPORT_ALLOWANCE`); `None` is unlimited.
    pub budget: Option<Budget>,
    /// Model tokens per tenant and day (`REPORT_TOKEN_CAP`): each start
    /// reserves its report's estimate ([`report_tokens`]). Replaces `budget`.
    pub token_cap: Option<NonZeroU64>,
    /// Makes the built-in worker's provider fail (`REPORT_PROVIDER_FAIL`).
    pub provider_failure: Option<ProviderFailure>,
    /// Holds each provider call until a permit is available (one per call):
    /// the caller decides when the provider answers. `None`: at once.
    pub provider_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// The bearer token of `POST /admin/budget/reset` (`ADMIN_TOKEN`).
    pub admin_token: Arc<str>,
    /// The identity leases granted by `POST /reports/start` go to
    /// (default: the layer's `"{hostname}-{pid}"`).
    pub owner: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            worker: Worker::BuiltIn {
                chunk_delay: Duration::from_millis(200),
            },
            budget: None,
            token_cap: None,
            provider_failure: None,
            provider_gate: None,
            admin_token: "admin".into(),
            owner: None,
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
struct AppState {
    /// Picked at start-up (memory or PostgreSQL), and called for all of it:
    /// starts and worker writes, the readers' queries, and upkeep.
    store: AnyJobStore,
    worker: Worker,
    provider_failure: Option<ProviderFailure>,
    provider_gate: Option<Arc<tokio::sync::Semaphore>>,
    admin_token: Arc<str>,
}

/// The whole service, with `POST /reports`'s idempotency records in this
/// process. Tenant auth runs on the tenant routes only; the admin route checks
/// its own token.
#[allow(dead_code)] // the tests mount it
pub fn router(store: AnyJobStore, config: Config) -> Router {
    router_with_records(store, MemoryStore::new(), config)
}

/// [`router`] with the idempotency records of `POST /reports` in `records`
/// (PostgreSQL when the jobs are, so every instance replays the same answers).
pub fn router_with_records(store: AnyJobStore, records: impl Store, config: Config) -> Router {
    let mut lease = lease_layer(store.clone(), config.budget, config.token_cap);
    if let Some(owner) = &config.owner {
        lease = lease.with_owner(owner.as_str());
    }
    // `POST /reports` with an `Idempotency-Key`: the same start as
    // `/reports/start` (same kind, so the same jobs), and the layer's `202`
    // is recorded: a retry with the key gets the same `job_id` byte for byte,
    // and starts nothing. Joins (`200`) are not recorded; they start nothing.
    let keyed =
        IdempotencyLayer::new(records).with_record_policy(|parts: &http::response::Parts| {
            parts.status == http::StatusCode::ACCEPTED
        });
    let state = AppState {
        store,
        worker: config.worker,
        provider_failure: config.provider_failure,
        provider_gate: config.provider_gate,
        admin_token: config.admin_token,
    };
    let tenant = Router::new()
        .route(
            "/reports/start",
            // The start table's statuses: `200` for every start, the body
            // saying `created`, `join` or `stolen`.
            post(start::start_report).layer(lease.clone().with_started_status(StartedStatus::Ok)),
        )
        .route(
            "/reports",
            // Outermost first: the key's record, then the job.
            post(start::start_report).layer(tower::ServiceBuilder::new().layer(keyed).layer(lease)),
        )
        .route("/reports/{job_id}", get(readers::read_job))
        .route("/reports/{job_id}/cursor", get(readers::read_cursor))
        .route("/reports/{job_id}/events", get(events::read_events))
        .route("/reports/{job_id}/artifact", get(readers::read_artifact))
        .route("/reports/{job_id}/acquire", post(worker_api::acquire))
        .route("/reports/{job_id}/heartbeat", post(worker_api::heartbeat))
        .route("/reports/{job_id}/append", post(worker_api::append))
        .route("/reports/{job_id}/finalize", post(worker_api::finalize))
        .route("/reports/{job_id}/fail", post(worker_api::fail))
        .route_layer(AsyncRequireAuthorizationLayer::new(BearerTenant));
    let admin = Router::new().route("/admin/budget/reset", post(admin::reset_budget));
    tenant
        .merge(admin)
        .layer(axum::middleware::map_response(
            answers::detail_names_the_code,
        ))
        .with_state(state)
}

/// The start route's layer: one live job per `tenant:report_type:period`,
/// within a job allowance or a daily token envelope.
pub fn lease_layer(
    store: AnyJobStore,
    budget: Option<Budget>,
    token_cap: Option<NonZeroU64>,
) -> LeaseLayer<impl JobKeyExtractor> {
    let kind = "report".parse().expect("a non-empty literal");
    let layer = LeaseLayer::new(store, kind, report_key()).with_location_prefix("/reports/");
    match (token_cap, budget) {
        (Some(cap), _) => layer.with_budget(Budget::per_day(cap)).with_cost(
            |_: &Scope, _: &Parts, body: &Bytes| {
                let value: Value = serde_json::from_slice(body).unwrap_or_default();
                report_tokens(value["report_type"].as_str().unwrap_or_default())
            },
        ),
        (None, Some(budget)) => layer.with_budget(budget),
        (None, None) => layer,
    }
}

/// `report_type:period` from the start body, after refusing unknown report
/// types (`400 unknown_report_type`) and malformed periods (`400
/// invalid_period`). A `claimed_tenant_id` naming another tenant than the
/// session's is `403 tenant_mismatch`; the tenant itself always comes from auth.
pub fn report_key() -> impl JobKeyExtractor {
    let fields =
        JsonJobKey::new(["report_type", "period"]).with_claimed_tenant("claimed_tenant_id");
    move |scope: &Scope, parts: &Parts, body: &Bytes| {
        if let Ok(value) = serde_json::from_slice::<Value>(body) {
            if let Some(kind) = value.get("report_type").and_then(Value::as_str) {
                if !REPORT_TYPES.contains(&kind) {
                    return Err(JobKeyRejection::bad_request(
                        "unknown_report_type",
                        format!("report_type must be one of: {}", REPORT_TYPES.join(", ")),
                    ));
                }
            }
            if let Some(period) = value.get("period").and_then(Value::as_str) {
                if !is_period(period) {
                    return Err(JobKeyRejection::bad_request(
                        "invalid_period",
                        "period must be a month, YYYY-MM (e.g. 2026-08)",
                    ));
                }
            }
        }
        fields.job_key(scope, parts, body)
    }
}

/// `^\d{4}-\d{2}$` with a month from 01 to 12.
fn is_period(period: &str) -> bool {
    let b = period.as_bytes();
    b.len() == 7
        && b[4] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || c.is_ascii_digit())
        && matches!(
            &period[5..],
            "01" | "02" | "03" | "04" | "05" | "06" | "07" | "08" | "09" | "10" | "11" | "12"
        )
}

/// Fails jobs whose lease expired with nobody behind them, every `every`.
pub fn spawn_stale_sweep(store: AnyJobStore, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match store.sweep_stale().await {
                Ok(0) => {}
                Ok(n) => eprintln!("stale sweep: failed {n} job(s) whose lease expired"),
                Err(e) => eprintln!("stale sweep: {e}"),
            }
        }
    })
}

/// The caller's job; 404 for unknown jobs and other tenants' jobs alike, so
/// job ids leak nothing.
async fn tenant_job(state: &AppState, tenant: &Scope, job_id: &str) -> Result<Job, ApiError> {
    state
        .store
        .job(tenant.as_str(), job_id)
        .await
        .map_err(store_unavailable)?
        .ok_or_else(unknown_job)
}
