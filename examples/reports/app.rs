//! The reports service: `POST /reports/start` behind demo bearer auth and the
//! [`LeaseLayer`], the worker endpoints an external worker calls, the readers
//! (job, cursor, server-sent events, artifact) and an operator budget reset.
//! Shared by `main.rs` and the tests, which mount the same router.
//!
//! Every endpoint, body and status code is documented in `docs/reports.md`.

use axum::body::{Body, Bytes};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use http::request::Parts;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tower_http::auth::{AsyncAuthorizeRequest, AsyncRequireAuthorizationLayer};
use tower_idempotency::lease::{JobKeyExtractor, JobKeyRejection, JsonJobKey, Lease, LeaseLayer};
use tower_idempotency::store::jobs::{
    Appended, ArtifactLookup, Budget, BudgetPeriod, Chunk, Job, JobStatus, JobStore, LeaseError,
    LeaseGrant,
};
use tower_idempotency::{FencingToken, Scope};

/// Report types `POST /reports/start` accepts.
pub const REPORT_TYPES: &[&str] = &["customer_health", "usage_summary"];

/// How readers of `/events` poll the store.
const EVENTS_POLL: Duration = Duration::from_millis(150);
/// An SSE comment this often keeps proxies from closing an idle stream.
const EVENTS_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Who does the work of a started job.
#[derive(Clone, Copy, Debug)]
pub enum Worker {
    /// The start handler spawns a simulated model under the lease
    /// ([`Lease::spawn_worker`]): it appends one chunk every `chunk_delay`,
    /// then finalizes with the concatenated text.
    BuiltIn {
        /// The pause before each chunk (`REPORT_CHUNK_MS`).
        chunk_delay: Duration,
    },
    /// `REPORT_WORKER=off`: the start handler does nothing; the job stays
    /// queued until an external worker acquires it over HTTP.
    Off,
}

/// How the service is configured (`main.rs` reads it from the environment).
#[derive(Clone, Debug)]
pub struct Config {
    /// Who does the work.
    pub worker: Worker,
    /// Jobs per tenant and month (`REPORT_ALLOWANCE`); `None` is unlimited.
    pub budget: Option<Budget>,
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
            admin_token: "admin".into(),
            owner: None,
        }
    }
}

#[derive(Clone)]
struct AppState {
    store: Arc<dyn JobStore>,
    worker: Worker,
    admin_token: Arc<str>,
}

/// The whole service. Tenant auth runs on the tenant routes only; the admin
/// route checks its own token.
pub fn router(store: Arc<dyn JobStore>, config: Config) -> Router {
    let mut lease = lease_layer(store.clone(), config.budget);
    if let Some(owner) = &config.owner {
        lease = lease.with_owner(owner.as_str());
    }
    let state = AppState {
        store,
        worker: config.worker,
        admin_token: config.admin_token,
    };
    let tenant = Router::new()
        .route("/reports/start", post(start_report).layer(lease))
        .route("/reports/{job_id}", get(read_job))
        .route("/reports/{job_id}/cursor", get(read_cursor))
        .route("/reports/{job_id}/events", get(read_events))
        .route("/reports/{job_id}/artifact", get(read_artifact))
        .route("/reports/{job_id}/acquire", post(acquire))
        .route("/reports/{job_id}/heartbeat", post(heartbeat))
        .route("/reports/{job_id}/append", post(append))
        .route("/reports/{job_id}/finalize", post(finalize))
        .route("/reports/{job_id}/fail", post(fail))
        .route_layer(AsyncRequireAuthorizationLayer::new(BearerTenant));
    let admin = Router::new().route("/admin/budget/reset", post(reset_budget));
    tenant.merge(admin).with_state(state)
}

/// The start route's layer: one live job per `tenant:report_type:period`.
pub fn lease_layer(
    store: Arc<dyn JobStore>,
    budget: Option<Budget>,
) -> LeaseLayer<impl JobKeyExtractor> {
    let layer = LeaseLayer::new(store, report_key()).with_location_prefix("/reports/");
    match budget {
        Some(budget) => layer.with_budget(budget),
        None => layer,
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
pub fn spawn_stale_sweep(store: Arc<dyn JobStore>, every: Duration) -> tokio::task::JoinHandle<()> {
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

// Auth.

/// Demo auth: `Authorization: Bearer <token>`, where a token of 1 to 64
/// characters `[A-Za-z0-9._-]` is the tenant id. The tenant becomes the
/// [`Scope`] the lease layer keys jobs by, and every reader checks it.
#[derive(Clone, Copy)]
pub struct BearerTenant;

impl<B: Send + 'static> AsyncAuthorizeRequest<B> for BearerTenant {
    type RequestBody = B;
    type ResponseBody = Body;
    type Future = Ready<Result<Request<B>, Response<Body>>>;

    fn authorize(&mut self, mut request: Request<B>) -> Self::Future {
        let tenant = bearer(request.headers())
            .filter(|token| is_tenant_token(token))
            .map(str::to_owned);
        ready(match tenant {
            Some(tenant) => {
                request.extensions_mut().insert(Scope::new(tenant));
                Ok(request)
            }
            None => Err(error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "send Authorization: Bearer <tenant id>",
            )
            .into_response()),
        })
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn is_tenant_token(token: &str) -> bool {
    (1..=64).contains(&token.len())
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

// Answers.

/// A refusal: `{"code", "message", ...}` with its status.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    /// Adds a field to the body (e.g. `expected` of a sequence gap).
    fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.body[field] = value.into();
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response<Body> {
        (self.status, Json(self.body)).into_response()
    }
}

type Answer = Result<Response<Body>, ApiError>;

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        body: json!({ "code": code, "message": message.into() }),
    }
}

fn unknown_job() -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "unknown_job",
        "no such job for this tenant",
    )
}

fn store_unavailable<E>(_: E) -> ApiError {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the job store is unavailable; nothing was changed",
    )
}

fn invalid_body(shape: &str) -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_body",
        format!("send {shape}"),
    )
}

fn invalid_query() -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        "use ?from_seq=N or ?offset=BYTES (non-negative integers), not both",
    )
}

/// The HTTP answer to a refused lease operation.
fn lease_error(e: LeaseError) -> ApiError {
    match e {
        LeaseError::LeaseLost => error(
            StatusCode::CONFLICT,
            "lease_lost",
            "the lease expired or belongs to another worker: stop working on this job",
        ),
        LeaseError::NotOwner => error(
            StatusCode::CONFLICT,
            "not_owner",
            "only the current owner of a live lease may end this job",
        ),
        LeaseError::SequenceGap { expected } => error(
            StatusCode::CONFLICT,
            "sequence_gap",
            format!("append seq {expected} first"),
        )
        .with("expected", expected),
        LeaseError::UnknownJob => unknown_job(),
        LeaseError::Store(e) => store_unavailable(e),
        other => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            other.code(),
            other.to_string(),
        ),
    }
}

fn job_json(job: &Job) -> Value {
    let mut body = json!({
        "job_id": job.id,
        "status": job.status.as_str(),
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

// Start.

#[derive(Deserialize)]
struct StartBody {
    report_type: String,
    period: String,
}

/// Runs behind the lease layer, only for a start that created or stole the
/// job: it decides what starts the work. Any 2xx becomes the layer's `202`.
async fn start_report(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Extension(lease): Extension<Lease>,
    body: Bytes,
) -> Answer {
    // The key extractor already checked these fields; a refusal fails the job.
    let start: StartBody =
        serde_json::from_slice(&body).map_err(|_| invalid_body("{\"report_type\", \"period\"}"))?;
    match state.worker {
        Worker::Off => {}
        Worker::BuiltIn { chunk_delay } => {
            lease.spawn_worker(move |lease| {
                simulated_model(lease, tenant, start.report_type, start.period, chunk_delay)
            });
        }
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

/// A stand-in for a model: streams a few numbered chunks into the job's
/// cursor, then returns their concatenation as the artifact.
async fn simulated_model(
    lease: Lease,
    tenant: Scope,
    report_type: String,
    period: String,
    chunk_delay: Duration,
) -> Result<Bytes, String> {
    let title = report_type.replace('_', " ");
    let chunks = [
        format!("# {title} report: {} / {period}\n\n", tenant.as_str()),
        "## Summary\nUsage is steady; two seats went unused all month.\n\n".to_owned(),
        "## Signals\n- support tickets: 3 (down from 5)\n- logins: 412\n\n".to_owned(),
        "## Risks\nThe renewal owner changed; confirm the contact.\n\n".to_owned(),
        "## Next steps\nBook a check-in before the renewal date.\n".to_owned(),
    ];
    let mut text = String::new();
    for (seq, chunk) in chunks.iter().enumerate() {
        tokio::time::sleep(chunk_delay).await;
        lease
            .append(seq as u64, chunk.clone())
            .await
            .map_err(|e| e.code().to_owned())?;
        text.push_str(chunk);
    }
    Ok(text.into())
}

// Readers.

async fn read_job(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
) -> Answer {
    let job = tenant_job(&state, &tenant, &job_id).await?;
    Ok(Json(job_json(&job)).into_response())
}

#[derive(Deserialize)]
struct CursorQuery {
    from_seq: Option<u64>,
    offset: Option<u64>,
}

/// The cursor from a sequence number (`?from_seq=N`, default 0) or a byte
/// offset (`?offset=BYTES`). Reading never starts or joins anything.
async fn read_cursor(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    query: Result<Query<CursorQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(|_| invalid_query())?;
    if query.from_seq.is_some() && query.offset.is_some() {
        return Err(invalid_query());
    }
    // Status first, chunks second: a job read as ended has all its chunks.
    let job = tenant_job(&state, &tenant, &job_id).await?;
    let from_seq = query.from_seq.unwrap_or(0);
    let chunks = state
        .store
        .chunks(tenant.as_str(), &job_id, from_seq)
        .await
        .map_err(store_unavailable)?
        .ok_or_else(unknown_job)?;
    // Where to resume: a value below the one asked for means the cursor
    // restarted (the job was taken over after its lease expired).
    let next_seq = chunks.last().map_or(job.next_seq, |c| c.seq + 1);
    let mut body = json!({ "job_id": job.id, "status": job.status.as_str(), "next_seq": next_seq });
    match query.offset {
        None => body["chunks"] = chunks.iter().map(|c| chunk_json(c, None)).collect(),
        Some(offset) => {
            body["chunks"] = from_offset(&chunks, offset).into();
            body["next_offset"] = chunks
                .iter()
                .map(|c| c.data.len() as u64)
                .sum::<u64>()
                .into();
        }
    }
    Ok(Json(body).into_response())
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
                seq: chunk.seq,
                data: chunk.data.slice(skip..),
            };
            listed.push(chunk_json(&cut, Some(start + skip as u64)));
        }
        start = end;
    }
    listed
}

/// Server-sent events: one `id: <seq>` event per chunk from `Last-Event-ID + 1`
/// (or `?from_seq=N`, default 0), then `event: done` or `event: failed` when
/// the job ends. Polls the store; never calls start.
async fn read_events(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<CursorQuery>, QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(|_| invalid_query())?;
    let from_seq = match headers.get("last-event-id") {
        None => query.from_seq.unwrap_or(0),
        Some(value) => {
            let last = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            last.ok_or_else(|| {
                error(
                    StatusCode::BAD_REQUEST,
                    "invalid_last_event_id",
                    "Last-Event-ID must be a chunk sequence number",
                )
            })? + 1
        }
    };
    tenant_job(&state, &tenant, &job_id).await?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(stream_events(state.store, tenant, job_id, from_seq, tx));
    let response = Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::new(EventBody(rx)))
        .expect("valid response");
    Ok(response)
}

async fn stream_events(
    store: Arc<dyn JobStore>,
    tenant: Scope,
    job_id: String,
    mut next: u64,
    tx: mpsc::Sender<Bytes>,
) {
    let store_error = || event("error", r#"{"code":"store_unavailable"}"#);
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
        if job.next_seq < next {
            // Behind where this reader is: the job was taken over after its lease
            // expired and its cursor restarted (or the reader's position was
            // bogus). Either way, say so and replay the cursor from 0.
            next = 0;
            let data = json!({ "job_id": job.id, "next_seq": 0 }).to_string();
            if tx.send(event("reset", &data)).await.is_err() {
                return;
            }
        }
        let chunks = match store.chunks(tenant.as_str(), &job_id, next).await {
            Ok(Some(chunks)) => chunks,
            Ok(None) => return,
            Err(_) => {
                let _ = tx.send(store_error()).await;
                return;
            }
        };
        for chunk in chunks {
            let data = json!({ "seq": chunk.seq, "data": String::from_utf8_lossy(&chunk.data) });
            let frame = format!("id: {}\ndata: {data}\n\n", chunk.seq);
            if tx.send(Bytes::from(frame)).await.is_err() {
                return; // the reader went away
            }
            next = chunk.seq + 1;
            quiet_since = tokio::time::Instant::now();
        }
        let ending = match job.status {
            JobStatus::Complete => Some((
                "done",
                json!({ "job_id": job.id, "status": "complete", "artifact_id": job.artifact_id }),
            )),
            JobStatus::Failed => Some((
                "failed",
                json!({ "job_id": job.id, "status": "failed", "error_code": job.error_code }),
            )),
            JobStatus::Queued | JobStatus::Running => None,
        };
        if let Some((name, data)) = ending {
            let _ = tx.send(event(name, &data.to_string())).await;
            return;
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

/// The artifact bytes, for the owning tenant only.
async fn read_artifact(
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

// The worker side.

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
/// the job is the caller's tenant's.
async fn worker_grant(
    state: &AppState,
    tenant: &Scope,
    job_id: &str,
    headers: &HeaderMap,
) -> Result<LeaseGrant, ApiError> {
    let owner = worker_id(headers)?;
    let token = headers
        .get("x-lease-token")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                "lease_token_required",
                "send X-Lease-Token: <token from acquire>",
            )
        })?;
    tenant_job(state, tenant, job_id).await?;
    Ok(LeaseGrant {
        job_id: job_id.to_owned(),
        owner,
        token: FencingToken(token),
    })
}

fn lease_seconds(state: &AppState) -> f64 {
    state.store.lease_duration().as_secs_f64()
}

async fn acquire(
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
                "the job has ended or another worker holds a live lease",
            )
            .with("status", job.status.as_str())
        })?;
    Ok(Json(json!({
        "job_id": grant.job_id,
        "owner": grant.owner,
        "token": grant.token.0,
        "lease_seconds": lease_seconds(&state),
    }))
    .into_response())
}

async fn heartbeat(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers).await?;
    state.store.heartbeat(&grant).await.map_err(lease_error)?;
    Ok(Json(json!({
        "job_id": job_id,
        "status": "running",
        "lease_seconds": lease_seconds(&state),
    }))
    .into_response())
}

#[derive(Deserialize)]
struct AppendBody {
    seq: u64,
    chunk: String,
}

async fn append(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<AppendBody>, JsonRejection>,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers).await?;
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
async fn finalize(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers).await?;
    let artifact = if body.is_empty() {
        // Only the owner appends, so the cursor cannot change under its finalize.
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
struct FailBody {
    code: String,
}

async fn fail(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Path(job_id): Path<String>,
    headers: HeaderMap,
    body: Result<Json<FailBody>, JsonRejection>,
) -> Answer {
    let grant = worker_grant(&state, &tenant, &job_id, &headers).await?;
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

// Operator.

#[derive(Deserialize)]
struct ResetBody {
    tenant: String,
}

/// Gives `tenant` its allowance for the current month back: its jobs so far
/// this month stop counting. Nothing is deleted.
async fn reset_budget(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<ResetBody>, JsonRejection>,
) -> Answer {
    let token = bearer(&headers).ok_or_else(|| {
        error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send Authorization: Bearer <admin token>",
        )
    })?;
    if !constant_time_eq(token.as_bytes(), state.admin_token.as_bytes()) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this endpoint needs the admin token",
        ));
    }
    let tenant = body
        .ok()
        .map(|Json(body)| body.tenant)
        .filter(|tenant| is_tenant_token(tenant))
        .ok_or_else(|| invalid_body("{\"tenant\": <tenant id>}"))?;
    let reset = state
        .store
        .reset_budget(&tenant, BudgetPeriod::Month)
        .await
        .map_err(store_unavailable)?;
    Ok(Json(json!({ "tenant": tenant, "period": "month", "reset": reset })).into_response())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
