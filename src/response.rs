//! Every response the layers build themselves: refusals and replays.

use crate::body::ResponseBody;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use std::time::Duration;

/// A request the layer answers itself instead of calling the inner service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// `400 idempotency_key_required`: the key header is missing, repeated or malformed.
    KeyRequired,
    /// `401 unauthorized`: the request has no scope.
    Unauthorized,
    /// `413 payload_too_large`: the body is over the configured limit.
    PayloadTooLarge,
    /// `408 request_timeout`: the body did not arrive within the configured time.
    BodyTimeout,
    /// `400 body_unreadable`: reading the request body failed.
    BodyUnreadable,
    /// `409 idempotency_key_reuse` (or 422): the key was used with another request.
    KeyReuse,
    /// `409 idempotency_in_progress` with `Retry-After`: the first request is still running.
    InProgress,
    /// `410 idempotency_response_unavailable`: the first request ran (its
    /// effects happened) but its response could not be recorded; it is not
    /// run again, and there is nothing to replay.
    ResponseUnavailable,
    /// `503 idempotency_store_unavailable`: the store failed; nothing was run.
    StoreUnavailable,
    /// `429 idempotency_quota_exceeded`: the request's scope holds as many
    /// records as the store's per-scope quota allows; nothing was run.
    QuotaExceeded,
    /// `503 overloaded` with `Retry-After`: as many claimed handlers as
    /// [`with_max_in_flight`](crate::IdempotencyLayer::with_max_in_flight)
    /// allows are running; this one was not started and its key is free.
    Overloaded,
    /// `500 internal_error`: the handler panicked (or its runtime shut down)
    /// before it answered; its claim was released, so a retry runs it again.
    HandlerFailed,
}

impl Refusal {
    /// The machine-readable `code` of the response body.
    pub fn code(self) -> &'static str {
        match self {
            Self::KeyRequired => "idempotency_key_required",
            Self::Unauthorized => "unauthorized",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BodyTimeout => "request_timeout",
            Self::BodyUnreadable => "body_unreadable",
            Self::KeyReuse => "idempotency_key_reuse",
            Self::InProgress => "idempotency_in_progress",
            Self::ResponseUnavailable => "idempotency_response_unavailable",
            Self::StoreUnavailable => "idempotency_store_unavailable",
            Self::QuotaExceeded => "idempotency_quota_exceeded",
            Self::Overloaded => "overloaded",
            Self::HandlerFailed => "internal_error",
        }
    }

    /// A human-readable explanation, sent as `message` (or `detail`).
    pub fn message(self) -> &'static str {
        match self {
            Self::KeyRequired => {
                "send exactly one Idempotency-Key header of 8 to 128 characters [A-Za-z0-9._-]"
            }
            Self::Unauthorized => "authentication is required",
            Self::PayloadTooLarge => "the request body is larger than the configured limit",
            Self::BodyTimeout => "the request body did not arrive in time",
            Self::BodyUnreadable => "the request body could not be read",
            Self::KeyReuse => "this idempotency key was already used with a different request",
            Self::InProgress => {
                "a request with this idempotency key is still in progress; retry later"
            }
            Self::ResponseUnavailable => {
                "the request with this idempotency key was processed, but its response \
                 could not be recorded; it will not be processed again"
            }
            Self::StoreUnavailable => {
                "the idempotency store is unavailable; the request was not processed"
            }
            Self::QuotaExceeded => {
                "this account holds as many idempotency keys as it may; the request was not \
                 processed, retry once earlier keys have expired"
            }
            Self::Overloaded => "the server is busy; the request was not processed, retry later",
            Self::HandlerFailed => "the request failed before it completed; it was not recorded",
        }
    }

    fn default_status(self) -> StatusCode {
        match self {
            Self::KeyRequired | Self::BodyUnreadable => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::KeyReuse | Self::InProgress => StatusCode::CONFLICT,
            // Not 409: clients following the IETF draft retry a 409 later,
            // and this answer never changes while the record is retained.
            Self::ResponseUnavailable => StatusCode::GONE,
            Self::StoreUnavailable | Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            Self::HandlerFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The shape of refusal bodies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorFormat {
    /// `application/json`: `{"code": "...", "message": "..."}`.
    #[default]
    Json,
    /// RFC 9457 `application/problem+json`:
    /// `{"type":"about:blank","title":"...","status":409,"detail":"...","code":"..."}`.
    Problem,
}

/// Builds refusals; the one place their status, headers and body are decided.
#[derive(Clone, Debug)]
pub(crate) struct Responder {
    pub(crate) format: ErrorFormat,
    pub(crate) reuse_status: StatusCode,
    pub(crate) retry_after: Duration,
}

impl Default for Responder {
    fn default() -> Self {
        Self {
            format: ErrorFormat::Json,
            reuse_status: StatusCode::CONFLICT,
            retry_after: Duration::from_secs(1),
        }
    }
}

impl Responder {
    pub(crate) fn status(&self, refusal: Refusal) -> StatusCode {
        match refusal {
            Refusal::KeyReuse => self.reuse_status,
            other => other.default_status(),
        }
    }

    pub(crate) fn refuse<B>(&self, refusal: Refusal) -> Response<ResponseBody<B>> {
        let mut response = self.error(self.status(refusal), refusal.code(), refusal.message());
        if matches!(
            refusal,
            Refusal::InProgress | Refusal::StoreUnavailable | Refusal::Overloaded
        ) {
            self.retry_after(&mut response);
        }
        response
    }

    /// Adds the configured `Retry-After` (whole seconds, at least one).
    pub(crate) fn retry_after<B>(&self, response: &mut Response<B>) {
        let secs = self.retry_after.as_secs_f64().ceil().max(1.0) as u64;
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }

    /// Any error answer, in the configured format.
    pub(crate) fn error<B>(
        &self,
        status: StatusCode,
        code: &str,
        message: &str,
    ) -> Response<ResponseBody<B>> {
        self.error_with(status, code, message, serde_json::Map::new())
    }

    /// An error answer with more members in its body (problem details
    /// extension members, in that format).
    pub(crate) fn error_with<B>(
        &self,
        status: StatusCode,
        code: &str,
        message: &str,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> Response<ResponseBody<B>> {
        let (content_type, mut body) = match self.format {
            ErrorFormat::Json => (
                "application/json",
                serde_json::json!({ "code": code, "message": message }),
            ),
            ErrorFormat::Problem => (
                "application/problem+json",
                serde_json::json!({
                    "type": "about:blank",
                    "title": status.canonical_reason().unwrap_or_default(),
                    "status": status.as_u16(),
                    "detail": message,
                    "code": code,
                }),
            ),
        };
        if let Some(members) = body.as_object_mut() {
            members.extend(extra);
        }
        json_response(status, content_type, &body)
    }
}

/// A response with a JSON body the layer built itself.
pub(crate) fn json_response<B>(
    status: StatusCode,
    content_type: &'static str,
    body: &serde_json::Value,
) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
