//! Readers: the job, its cursor (by sequence number or byte offset, within
//! one attempt) and the artifact. Reading never starts, joins or inserts.

use super::answers::{attempt_required, error, invalid_query, store_unavailable, unknown_job};
use super::answers::{Answer, ApiError};
use super::{tenant_job, AppState};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tower_idempotency::lease::store::{ArtifactLookup, Chunk, Job, JobReader};
use tower_idempotency::Scope;

/// How often a reader reads the job and its chunks again when a takeover
/// happened between the two reads, before answering `503 cursor_unstable`.
/// Takeovers happen at most once per lease length, so the second read settles.
const CONSISTENT_READ_TRIES: usize = 3;

pub(super) fn job_json(job: &Job) -> Value {
    let mut body = json!({
        "job_id": job.id,
        "status": job.status.as_str(),
        "attempt": job.attempt,
        "next_seq": job.next_seq,
        "cursor_len": job.cursor_len,
    });
    if let Some(artifact_id) = &job.artifact_id {
        body["artifact_id"] = artifact_id.as_str().into();
    }
    if let Some(code) = &job.error_code {
        body["error_code"] = code.as_str().into();
    }
    body
}

pub(super) async fn read_job(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
) -> Answer {
    let job = tenant_job(&state, &tenant, &job_id).await?;
    Ok(Json(job_json(&job)).into_response())
}

#[derive(Deserialize)]
pub(super) struct CursorQuery {
    attempt: Option<u64>,
    from_seq: Option<u64>,
    offset: Option<u64>,
}

/// The cursor of the job's current attempt, from a sequence number
/// (`?attempt=N&from_seq=M`) or a byte offset (`?attempt=N&offset=BYTES`);
/// both default to 0, and a position above 0 needs the attempt it belongs to.
/// If `N` is not the current attempt (the job was taken over since), the
/// answer says `"reset": true` and lists the current attempt from 0.
pub(super) async fn read_cursor(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    query: Result<Query<CursorQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(|_| invalid_query())?;
    if query.from_seq.is_some() && query.offset.is_some() {
        return Err(invalid_query());
    }
    let position = query.from_seq.or(query.offset).unwrap_or(0);
    if position > 0 && query.attempt.is_none() {
        return Err(attempt_required());
    }
    for _ in 0..CONSISTENT_READ_TRIES {
        // Status first, chunks second: a job read as ended has all its chunks.
        let job = tenant_job(&state, &tenant, &job_id).await?;
        let reset = query.attempt.is_some_and(|attempt| attempt != job.attempt);
        let from_seq = match (reset, query.offset) {
            (false, None) => query.from_seq.unwrap_or(0),
            // Offsets are counted over the whole cursor; a reset restarts it.
            _ => 0,
        };
        let chunks = state
            .store
            .chunks(tenant.as_str(), &job_id, from_seq)
            .await
            .map_err(store_unavailable)?
            .ok_or_else(unknown_job)?;
        if chunks.iter().any(|c| c.attempt != job.attempt) {
            continue; // taken over between the two reads: read both again
        }
        let offset = query.offset.map(|offset| if reset { 0 } else { offset });
        return Ok(Json(cursor_json(&job, reset, &chunks, offset)).into_response());
    }
    Err(cursor_unstable())
}

fn cursor_unstable() -> ApiError {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "cursor_unstable",
        "the job was taken over while its cursor was read; read again",
    )
}

/// The answer of `read_cursor`: the chunks all belong to `job.attempt`.
fn cursor_json(job: &Job, reset: bool, chunks: &[Chunk], offset: Option<u64>) -> Value {
    let next_seq = chunks.last().map_or(job.next_seq, |c| c.seq + 1);
    let mut body = json!({
        "job_id": job.id,
        "status": job.status.as_str(),
        "attempt": job.attempt,
        "reset": reset,
        "next_seq": next_seq,
    });
    match offset {
        None => body["chunks"] = chunks.iter().map(|c| chunk_json(c, None)).collect(),
        Some(offset) => {
            body["chunks"] = from_offset(chunks, offset).into();
            body["next_offset"] = chunks
                .iter()
                .map(|c| c.data.len() as u64)
                .sum::<u64>()
                .into();
        }
    }
    body
}

fn chunk_json(chunk: &Chunk, offset: Option<u64>) -> Value {
    let mut value = json!({ "seq": chunk.seq, "data": String::from_utf8_lossy(&chunk.data) });
    if let Some(offset) = offset {
        value["offset"] = offset.into();
    }
    value
}

/// The chunks covering bytes `offset..` of the cursor, the first one cut to
/// start at `offset`; each says where its data starts.
fn from_offset(chunks: &[Chunk], offset: u64) -> Vec<Value> {
    let mut start = 0u64;
    let mut listed = Vec::new();
    for chunk in chunks {
        let end = start + chunk.data.len() as u64;
        if end > offset {
            let skip = offset.saturating_sub(start) as usize;
            let cut = Chunk {
                attempt: chunk.attempt,
                seq: chunk.seq,
                data: chunk.data.slice(skip..),
            };
            listed.push(chunk_json(&cut, Some(start + skip as u64)));
        }
        start = end;
    }
    listed
}

/// The artifact bytes, for the owning tenant only.
pub(super) async fn read_artifact(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
) -> Answer {
    let lookup = state
        .store
        .artifact(tenant.as_str(), &job_id)
        .await
        .map_err(store_unavailable)?;
    match lookup {
        ArtifactLookup::Found(bytes) => {
            let content_type = [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")];
            Ok((content_type, bytes).into_response())
        }
        ArtifactLookup::NotReady(status) => Err(error(
            StatusCode::CONFLICT,
            "not_ready",
            "the job has not completed",
        )
        .with("status", status.as_str())),
        ArtifactLookup::OtherTenant => Err(error(
            StatusCode::FORBIDDEN,
            "tenant_mismatch",
            "this job belongs to another tenant",
        )),
        ArtifactLookup::Unknown => Err(unknown_job()),
    }
}
