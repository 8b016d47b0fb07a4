use crate::body::ResponseBody;
use crate::lease::store::BudgetReset;
use crate::response::{Refusal, Responder};
use http::{Response, StatusCode};

/// A start the lease layer answers itself, without starting a job.
///
/// Answered as `{"code","message"}` JSON (or RFC 9457 problem details, as the
/// layer's [`ErrorFormat`](crate::ErrorFormat) says), built by the same
/// responder as the idempotency layer's refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum JobRefusal {
    /// `401 unauthorized`: the request has no tenant.
    Unauthorized,
    /// `413 payload_too_large`: the start body is over the layer's limit.
    PayloadTooLarge,
    /// `408 request_timeout`: the start body did not arrive in time.
    BodyTimeout,
    /// `400 body_unreadable`: reading the start body failed.
    BodyUnreadable,
    /// `503 job_store_unavailable` with `Retry-After`: the job store failed or
    /// did not answer in time; nothing was started.
    StoreUnavailable,
    /// `429 budget_exhausted`: the tenant's allowance for the period is spent.
    BudgetExhausted,
}

impl JobRefusal {
    /// The machine-readable `code` of the response body.
    pub fn code(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BodyTimeout => "request_timeout",
            Self::BodyUnreadable => "body_unreadable",
            Self::StoreUnavailable => "job_store_unavailable",
            Self::BudgetExhausted => "budget_exhausted",
        }
    }

    /// A human-readable explanation, sent as `message` (or `detail`).
    pub fn message(self) -> &'static str {
        match self {
            Self::Unauthorized => "authentication is required",
            Self::PayloadTooLarge => "the request body is larger than the configured limit",
            Self::BodyTimeout => "the request body did not arrive in time",
            Self::BodyUnreadable => "the request body could not be read",
            Self::StoreUnavailable => "the job store is unavailable; nothing was started",
            Self::BudgetExhausted => "the job allowance for this period is spent",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::BodyUnreadable => StatusCode::BAD_REQUEST,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::BudgetExhausted => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The start body's refusals, as the shared body reader reports them.
    pub(crate) fn of_body(refusal: Refusal) -> Self {
        match refusal {
            Refusal::PayloadTooLarge => Self::PayloadTooLarge,
            Refusal::BodyTimeout => Self::BodyTimeout,
            _ => Self::BodyUnreadable,
        }
    }

    /// `429 budget_exhausted` with when the period resets: `Retry-After` (whole
    /// seconds) and `resets_at` (RFC 3339, UTC) with `retry_after` in the body.
    pub(crate) fn budget_exhausted<B>(
        responder: &Responder,
        reset: &BudgetReset,
    ) -> Response<ResponseBody<B>> {
        let seconds = reset.after.as_secs() + u64::from(reset.after.subsec_nanos() > 0);
        let seconds = seconds.max(1);
        let mut extra = serde_json::Map::new();
        extra.insert("resets_at".into(), reset.at.clone().into());
        extra.insert("retry_after".into(), seconds.into());
        let refusal = Self::BudgetExhausted;
        let mut response =
            responder.error_with(refusal.status(), refusal.code(), refusal.message(), extra);
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, http::HeaderValue::from(seconds));
        response
    }

    pub(crate) fn respond<B>(self, responder: &Responder) -> Response<ResponseBody<B>> {
        let mut response = responder.error(self.status(), self.code(), self.message());
        if self == Self::StoreUnavailable {
            responder.retry_after(&mut response);
        }
        response
    }
}
