//! Refusals: every error body is `{"code", "detail", "message", ...}` with
//! its status, `detail` repeating `code`.

use axum::body::Body;
use axum::http::{header, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};
use tower_idempotency::lease::store::LeaseError;

/// A refusal: `{"code", "message", ...}` with its status.
#[derive(Debug)]
pub(super) struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    /// Adds a field to the body (e.g. `expected` of a sequence gap).
    pub(super) fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.body[field] = value.into();
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response<Body> {
        (self.status, Json(self.body)).into_response()
    }
}

/// What a handler answers.
pub(super) type Answer = Result<Response<Body>, ApiError>;

pub(super) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        body: json!({ "code": code, "message": message.into() }),
    }
}

pub(super) fn unknown_job() -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "unknown_job",
        "no such job for this tenant",
    )
}

pub(super) fn store_unavailable<E>(_: E) -> ApiError {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the job store is unavailable; nothing was changed",
    )
}

pub(super) fn invalid_body(shape: &str) -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_body",
        format!("send {shape}"),
    )
}

pub(super) fn invalid_query() -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        "use ?attempt=N with ?from_seq=N or ?offset=BYTES (non-negative integers), \
         not both from_seq and offset",
    )
}

/// A resume position without the attempt it belongs to: it could splice two
/// attempts' cursors, so it is refused rather than guessed.
pub(super) fn attempt_required() -> ApiError {
    error(
        StatusCode::BAD_REQUEST,
        "attempt_required",
        "resuming needs the attempt the position belongs to: \
         ?attempt=N&from_seq=M (or &offset=BYTES), with N from the previous answer",
    )
}

/// The HTTP answer to a refused lease operation.
pub(super) fn lease_error(e: LeaseError) -> ApiError {
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

/// Every error answer of the service names its code in `detail` too
/// (`{"code": "not_owner", "detail": "not_owner", ...}`), where clients written
/// against FastAPI-style APIs read it: the handlers' refusals, the auth
/// layer's `401`, and the lease and idempotency layers' refusals alike.
pub(super) async fn detail_names_the_code(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Error bodies are a few hundred bytes, built whole by this service.
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let Ok(Value::Object(mut members)) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Some(code) = members.get("code").cloned() {
        members.entry("detail").or_insert(code);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(Value::Object(members).to_string()))
}
