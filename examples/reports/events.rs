//! `GET /reports/{job_id}/events`: the cursor as server-sent events.
//!
//! Every chunk event carries `id: {attempt}-{seq}`, so a reconnecting
//! `EventSource` sends back both where it was and which run of the job that
//! position belongs to. When the job's attempt is not the reader's (the job
//! was taken over after its lease expired), the stream says `event: reset` and
//! replays the new attempt from chunk 0: two attempts' chunks are never spliced.

use super::answers::{attempt_required, error, Answer, ApiError};
use super::{tenant_job, AppState};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tower_idempotency::lease::store::{AnyJobStore, JobReader, JobStatus};
use tower_idempotency::Scope;

/// How readers of `/events` poll the store.
const EVENTS_POLL: Duration = Duration::from_millis(150);
/// An SSE comment this often keeps proxies from closing an idle stream.
const EVENTS_KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
pub(super) struct EventsQuery {
    attempt: Option<u64>,
    from_seq: Option<u64>,
}

/// Where a reader resumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    /// The attempt the reader's chunks belong to; `None`: the reader has none
    /// yet, and follows whichever attempt is current from chunk 0.
    attempt: Option<u64>,
    /// The first chunk to send (within `attempt`).
    next_seq: u64,
}

/// Server-sent events: one `id: {attempt}-{seq}` event per chunk, from after
/// `Last-Event-ID` (or `?attempt=N&from_seq=M`, default: the current attempt
/// from 0), then `event: done` or `event: failed` when the job ends. Polls the
/// store; never calls start.
pub(super) async fn read_events(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            "use ?attempt=N&from_seq=M (non-negative integers)",
        )
    })?;
    // An empty header is no position (browsers never send one).
    let last_event_id = headers
        .get("last-event-id")
        .filter(|v| !v.as_bytes().trim_ascii().is_empty());
    let position = match last_event_id {
        Some(value) => last_event_position(value)?,
        None => {
            let next_seq = query.from_seq.unwrap_or(0);
            if next_seq > 0 && query.attempt.is_none() {
                return Err(attempt_required());
            }
            Position {
                attempt: query.attempt,
                next_seq,
            }
        }
    };
    tenant_job(&state, &tenant, &job_id).await?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(stream_events(state.store, tenant, job_id, position, tx));
    let response = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::new(EventBody(rx)))
        .expect("valid response");
    Ok(response)
}

/// `Last-Event-ID: {attempt}-{seq}` resumes after chunk `seq` of `attempt`.
///
/// A bare sequence number (what this demo sent before jobs had attempts) is
/// refused: it cannot say which attempt its chunks came from, and guessing
/// "the current one" is exactly how a reader splices two runs' output.
fn last_event_position(value: &HeaderValue) -> Result<Position, ApiError> {
    let invalid = || {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_last_event_id",
            "Last-Event-ID must be ATTEMPT-SEQ as sent in this stream's ids (e.g. 1-3); \
             reconnect without it to read from the start",
        )
    };
    let (attempt, seq) = value
        .to_str()
        .map_err(|_| invalid())?
        .trim()
        .split_once('-')
        .ok_or_else(invalid)?;
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let attempt = number(attempt).ok_or_else(invalid)?;
    let next_seq = number(seq)
        .and_then(|seq| seq.checked_add(1))
        .ok_or_else(invalid)?;
    Ok(Position {
        attempt: Some(attempt),
        next_seq,
    })
}

async fn stream_events(
    store: AnyJobStore,
    tenant: Scope,
    job_id: String,
    position: Position,
    tx: mpsc::Sender<Bytes>,
) {
    let store_error = || event("error", r#"{"code":"store_unavailable"}"#);
    let Position {
        mut attempt,
        next_seq: mut next,
    } = position;
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        let job = match store.job(tenant.as_str(), &job_id).await {
            Ok(Some(job)) => job,
            Ok(None) => return,
            Err(_) => {
                let _ = tx.send(store_error()).await;
                return;
            }
        };
        if attempt != Some(job.attempt) {
            if attempt.is_some() {
                // The reader's chunks are another attempt's: the job was taken
                // over after its lease expired. Say so, then replay from 0.
                let data = json!({ "job_id": job.id, "attempt": job.attempt, "next_seq": 0 });
                if tx.send(event("reset", &data.to_string())).await.is_err() {
                    return;
                }
            }
            attempt = Some(job.attempt);
            next = 0;
        }
        let chunks = match store.chunks(tenant.as_str(), &job_id, next).await {
            Ok(Some(chunks)) => chunks,
            Ok(None) => return,
            Err(_) => {
                let _ = tx.send(store_error()).await;
                return;
            }
        };
        // Chunks of a later attempt than the job read: it was taken over
        // between the two reads. Send none of them; the next poll resets.
        if chunks.iter().all(|c| c.attempt == job.attempt) {
            for chunk in chunks {
                let data = json!({
                    "attempt": chunk.attempt,
                    "seq": chunk.seq,
                    "data": String::from_utf8_lossy(&chunk.data),
                });
                let frame = format!("id: {}-{}\ndata: {data}\n\n", chunk.attempt, chunk.seq);
                if tx.send(Bytes::from(frame)).await.is_err() {
                    return; // the reader went away
                }
                next = chunk.seq + 1;
                quiet_since = tokio::time::Instant::now();
            }
            // Status was read before the chunks: an ended job's are all sent.
            let ending = match job.status {
                JobStatus::Complete => Some((
                    "done",
                    json!({ "job_id": job.id, "status": "complete", "attempt": job.attempt,
                            "artifact_id": job.artifact_id }),
                )),
                JobStatus::Failed => Some((
                    "failed",
                    json!({ "job_id": job.id, "status": "failed", "attempt": job.attempt,
                            "error_code": job.error_code }),
                )),
                JobStatus::Queued | JobStatus::Running => None,
            };
            if let Some((name, data)) = ending {
                let _ = tx.send(event(name, &data.to_string())).await;
                return;
            }
        }
        if quiet_since.elapsed() >= EVENTS_KEEP_ALIVE {
            if tx
                .send(Bytes::from_static(b": keep-alive\n\n"))
                .await
                .is_err()
            {
                return;
            }
            quiet_since = tokio::time::Instant::now();
        }
        tokio::select! {
            _ = tokio::time::sleep(EVENTS_POLL) => {}
            _ = tx.closed() => return,
        }
    }
}

fn event(name: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

/// A response body fed by the task that polls the store; dropping it (the
/// client went away) ends that task.
struct EventBody(mpsc::Receiver<Bytes>);

impl http_body::Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|frame| frame.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}
