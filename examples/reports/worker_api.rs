//! The worker side over HTTP (`REPORT_WORKER=off`): acquire, heartbeat,
//! append, finalize, fail. Every write is fenced by `X-Worker-Id` and
//! `X-Lease-Token`; a write without them is refused as one with a stale lease.

use super::answers::{error, invalid_body, lease_error, store_unavailable, unknown_job};
use super::answers::{Answer, ApiError};
use super::{tenant_job, AppState};
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tower_idempotency::lease::store::{Appended, JobReader, JobStore, LeaseError, LeaseGrant};
use tower_idempotency::{store::FencingToken, Scope};

/// `X-Worker-Id`: 1 to 128 visible ASCII characters.
fn worker_id(headers: &HeaderMap) -> Result<String, ApiError> {
    headers
        .get("x-worker-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| (1..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                "worker_id_required",
                "send X-Worker-Id: <worker identity> (1 to 128 visible ASCII characters)",
            )
        })
}

/// The worker's lease from `X-Worker-Id` and `X-Lease-Token`, after checking
/// the job is the caller's tenant's. A caller that sends no lease (or one
/// that is not a lease) does not hold it: it gets the same `409` as a stale
/// one, `not_lease` (`lease_lost` or `not_owner`, by the operation).
async fn worker_grant(
    state: &AppState,
    tenant: &Scope,
    job_id: &str,
    headers: &HeaderMap,
    not_lease: fn() -> LeaseError,
) -> Result<LeaseGrant, ApiError> {
    tenant_job(state, tenant, job_id).await?;
    let owner = worker_id(headers).map_err(|_| lease_error(not_lease()))?;
    let token = headers
        .get("x-lease-token")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .ok_or_else(|| lease_error(not_lease()))?;
    Ok(LeaseGrant {
        job_id: job_id.to_owned(),
        owner,
        token: FencingToken::new(token),
    })
}

fn lease_seconds(state: &AppState) -> f64 {
    state.store.lease_duration().as_secs_f64()
}

pub(super) async fn acquire(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let owner = worker_id(&headers)?;
    let job = tenant_job(&state, &tenant, &job_id).await?;
    let grant = state
        .store
        .acquire(&job_id, &owner)
        .await
        .map_err(store_unavailable)?
        .ok_or_else(|| {
            error(
                StatusCode::CONFLICT,
                "not_available",
                "the job has ended, another worker holds a live lease, \
                 or the allowance has no room to revive it",
            )
            .with("status", job.status.as_str())
        })?;
    Ok(Json(json!({
        "job_id": grant.job_id,
        "owner": grant.owner,
        "token": grant.token.get(),
        "lease_seconds": lease_seconds(&state),
    }))
    .into_response())
}

pub(super) async fn heartbeat(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers, || LeaseError::LeaseLost).await?;
    state.store.heartbeat(&grant).await.map_err(lease_error)?;
    Ok(Json(json!({
        "job_id": job_id,
        "status": "running",
        "lease_seconds": lease_seconds(&state),
    }))
    .into_response())
}

#[derive(Deserialize)]
pub(super) struct AppendBody {
    seq: u64,
    chunk: String,
}

pub(super) async fn append(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<AppendBody>, JsonRejection>,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers, || LeaseError::LeaseLost).await?;
    let Json(body) =
        body.map_err(|_| invalid_body("{\"seq\": <integer from 0>, \"chunk\": <string>}"))?;
    let appended = state
        .store
        .append(&grant, body.seq, body.chunk.into())
        .await
        .map_err(lease_error)?;
    let body = match appended {
        Appended::Added { next_seq } => {
            json!({ "job_id": job_id, "added": true, "next_seq": next_seq })
        }
        Appended::Duplicate { next_seq } => {
            json!({ "job_id": job_id, "added": false, "duplicate": true, "next_seq": next_seq })
        }
    };
    Ok(Json(body).into_response())
}

/// Completes the job. An empty body makes the artifact the concatenated
/// cursor; any other body is stored as the artifact as sent.
pub(super) async fn finalize(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers, || LeaseError::NotOwner).await?;
    let artifact = if body.is_empty() {
        // Only the owner appends, so the cursor cannot change under its
        // finalize; and if the job was taken over meanwhile (a new attempt),
        // the finalize below is refused, so what was read is never stored.
        let chunks = state
            .store
            .chunks(tenant.as_str(), &job_id, 0)
            .await
            .map_err(store_unavailable)?
            .ok_or_else(unknown_job)?;
        chunks.iter().flat_map(|c| c.data.iter().copied()).collect()
    } else {
        body
    };
    let artifact_id = state
        .store
        .finalize(&grant, artifact)
        .await
        .map_err(lease_error)?;
    Ok(Json(json!({
        "job_id": job_id,
        "status": "complete",
        "artifact_id": artifact_id,
    }))
    .into_response())
}

#[derive(Deserialize)]
pub(super) struct FailBody {
    code: String,
}

pub(super) async fn fail(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<FailBody>, JsonRejection>,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers, || LeaseError::NotOwner).await?;
    let code = body
        .ok()
        .map(|Json(body)| body.code)
        .filter(|code| {
            (1..=64).contains(&code.len())
                && code
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .ok_or_else(|| invalid_body("{\"code\": <1 to 64 characters [a-z0-9_]>}"))?;
    state.store.fail(&grant, &code).await.map_err(lease_error)?;
    Ok(Json(json!({ "job_id": job_id, "status": "failed", "error_code": code })).into_response())
}
