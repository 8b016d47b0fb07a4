//! Every response the layers build themselves: refusals and replays.

use crate::body::ResponseBody;
use crate::config::ConfigError;
use crate::key::KeyProblem;
use crate::telemetry::Outcome;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;

/// A request the layer answers itself instead of calling the inner service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// `400 idempotency_key_required`, `"reason": "missing"`: the request
    /// has no key header.
    KeyRequired,
    /// `400 idempotency_key_required`, `"reason": "invalid"` (or the code
    /// `idempotency_key_invalid` with [`KeyCodes::Distinct`]): the key
    /// header's value is not a key (8 to 128 characters of `[A-Za-z0-9._-]`,
    /// bare or as an RFC 8941 sf-string of them); empty is not a key either.
    KeyInvalid,
    /// `400 idempotency_key_required`, `"reason": "repeated"` (or the code
    /// `idempotency_key_repeated` with [`KeyCodes::Distinct`]): more than one
    /// key header, or one holding a comma-separated list.
    KeyRepeated,
    /// `401 unauthorized`: the request has no scope.
    Unauthorized,
    /// `413 payload_too_large`: the body is over the configured limit (the
    /// default answer's message names it, in bytes).
    PayloadTooLarge,
    /// `408 request_timeout`: the body did not arrive within the configured time.
    BodyTimeout,
    /// `400 body_unreadable`: reading the request body failed.
    BodyUnreadable,
    /// `409 idempotency_key_reuse` (or 422): the key was used with another request.
    KeyReused,
    /// `409 idempotency_in_progress` with `Retry-After`: the first request is still running.
    InProgress,
    /// `410 idempotency_response_unavailable`: the first request ran (its
    /// effects happened) but its response could not be recorded; it is not
    /// run again, and there is nothing to replay.
    ResponseUnavailable,
    /// `410 idempotency_key_expired`: the same request ran under this key
    /// before, and its record has expired; its tombstone says the key was
    /// used, so the request is not run again, and there is no answer left to
    /// replay. (Another request under the key is [`KeyReused`](Self::KeyReused).)
    KeyExpired,
    /// `503 idempotency_store_unavailable`: the store failed; nothing was run.
    StoreUnavailable,
    /// `503 idempotency_outcome_unknown` with `Retry-After`: the handler ran,
    /// then its transaction's commit failed, or its outcome is unknown (the
    /// connection lost during `COMMIT`). Its writes and its record committed
    /// together or not at all: a retry under the same key replays the record,
    /// or runs the request once more on a clean slate.
    OutcomeUnknown,
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
    /// `503 job_store_unavailable` with `Retry-After` (`LeaseLayer`): the job
    /// store failed; nothing was started.
    JobStoreUnavailable,
    /// `429 budget_exhausted` with `Retry-After` until the budget resets
    /// (`LeaseLayer`): the tenant's job allowance for this period is spent;
    /// the body also says when (`resets_at`, `retry_after`).
    BudgetExhausted,
}

impl Refusal {
    /// The machine-readable `code` of the default response body. The three
    /// key refusals share `idempotency_key_required`, the code a client
    /// written against the key contract recognises; [`reason`](Self::reason)
    /// tells them apart (and [`KeyCodes::Distinct`] gives each its own code).
    pub fn code(self) -> &'static str {
        match self {
            Self::KeyRequired | Self::KeyInvalid | Self::KeyRepeated => "idempotency_key_required",
            Self::Unauthorized => "unauthorized",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BodyTimeout => "request_timeout",
            Self::BodyUnreadable => "body_unreadable",
            Self::KeyReused => "idempotency_key_reuse",
            Self::InProgress => "idempotency_in_progress",
            Self::ResponseUnavailable => "idempotency_response_unavailable",
            Self::KeyExpired => "idempotency_key_expired",
            Self::StoreUnavailable => "idempotency_store_unavailable",
            Self::OutcomeUnknown => "idempotency_outcome_unknown",
            Self::QuotaExceeded => "idempotency_quota_exceeded",
            Self::Overloaded => "overloaded",
            Self::HandlerFailed => "internal_error",
            Self::JobStoreUnavailable => "job_store_unavailable",
            Self::BudgetExhausted => "budget_exhausted",
        }
    }

    /// What went wrong with the key, sent as the body's `reason` member:
    /// `missing`, `invalid` or `repeated` for the three key refusals, `None`
    /// for the others.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Self::KeyRequired => Some("missing"),
            Self::KeyInvalid => Some("invalid"),
            Self::KeyRepeated => Some("repeated"),
            _ => None,
        }
    }

    /// The code of [`KeyCodes::Distinct`]: the key refusals' own codes.
    fn distinct_code(self) -> &'static str {
        match self {
            Self::KeyInvalid => "idempotency_key_invalid",
            Self::KeyRepeated => "idempotency_key_repeated",
            other => other.code(),
        }
    }

    /// The RFC 9457 problem `type` of this refusal in
    /// [`ErrorFormat::Problem`] bodies: a URI naming this refusal (its entry
    /// in this crate's documentation), so that the three key refusals are
    /// three problem types even when they share a `code`.
    pub fn problem_type(self) -> &'static str {
        macro_rules! doc {
            ($variant:literal) => {
                concat!(
                    "https://docs.rs/tower-idempotency/latest/tower_idempotency/enum.Refusal.html#variant.",
                    $variant
                )
            };
        }
        match self {
            Self::KeyRequired => doc!("KeyRequired"),
            Self::KeyInvalid => doc!("KeyInvalid"),
            Self::KeyRepeated => doc!("KeyRepeated"),
            Self::Unauthorized => doc!("Unauthorized"),
            Self::PayloadTooLarge => doc!("PayloadTooLarge"),
            Self::BodyTimeout => doc!("BodyTimeout"),
            Self::BodyUnreadable => doc!("BodyUnreadable"),
            Self::KeyReused => doc!("KeyReused"),
            Self::InProgress => doc!("InProgress"),
            Self::ResponseUnavailable => doc!("ResponseUnavailable"),
            Self::KeyExpired => doc!("KeyExpired"),
            Self::StoreUnavailable => doc!("StoreUnavailable"),
            Self::OutcomeUnknown => doc!("OutcomeUnknown"),
            Self::QuotaExceeded => doc!("QuotaExceeded"),
            Self::Overloaded => doc!("Overloaded"),
            Self::HandlerFailed => doc!("HandlerFailed"),
            Self::JobStoreUnavailable => doc!("JobStoreUnavailable"),
            Self::BudgetExhausted => doc!("BudgetExhausted"),
        }
    }

    /// A human-readable explanation, sent as `message` (or `detail`).
    pub fn message(self) -> &'static str {
        match self {
            Self::KeyRequired => {
                "this request needs an Idempotency-Key header: 8 to 128 characters of \
                 [A-Za-z0-9._-], bare or as an RFC 8941 sf-string (\"...\"); a new key \
                 (a UUID) per operation, the same one on its retries"
            }
            Self::KeyInvalid => {
                "the Idempotency-Key header is not a valid key: 8 to 128 characters of \
                 [A-Za-z0-9._-], bare or as an RFC 8941 sf-string of them (\"...\")"
            }
            Self::KeyRepeated => {
                "send exactly one Idempotency-Key header, with one key (not several headers \
                 or a comma-separated list)"
            }
            Self::Unauthorized => "authentication is required",
            Self::PayloadTooLarge => "the request body is larger than the configured limit",
            Self::BodyTimeout => "the request body did not arrive in time",
            Self::BodyUnreadable => "the request body could not be read",
            Self::KeyReused => "this idempotency key was already used with a different request",
            Self::InProgress => {
                "a request with this idempotency key is still in progress; retry later"
            }
            Self::ResponseUnavailable => {
                "the request with this idempotency key was processed, but its response \
                 could not be recorded; it will not be processed again"
            }
            Self::KeyExpired => {
                "this idempotency key was already used for this request, and its response \
                 is no longer kept; the request will not be processed again (use a new key \
                 for a new operation)"
            }
            Self::StoreUnavailable => {
                "the idempotency store is unavailable; the request was not processed"
            }
            Self::OutcomeUnknown => {
                "the request was processed, but whether its result was saved is unknown; \
                 retry with the same idempotency key: the retry returns the saved result, \
                 or processes the request again if nothing was saved"
            }
            Self::QuotaExceeded => {
                "this account holds as many idempotency keys as it may; the request was not \
                 processed, retry once earlier keys have expired"
            }
            Self::Overloaded => "the server is busy; the request was not processed, retry later",
            Self::HandlerFailed => "the request failed before it completed; it was not recorded",
            Self::JobStoreUnavailable => "the job store is unavailable; nothing was started",
            Self::BudgetExhausted => "the job allowance for this period is spent",
        }
    }

    /// Whether the answer carries `Retry-After`: the same request may succeed later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::InProgress
                | Self::StoreUnavailable
                | Self::OutcomeUnknown
                | Self::Overloaded
                | Self::JobStoreUnavailable
                | Self::BudgetExhausted
        )
    }

    fn default_status(self) -> StatusCode {
        match self {
            Self::KeyRequired | Self::KeyInvalid | Self::KeyRepeated | Self::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::KeyReused | Self::InProgress => StatusCode::CONFLICT,
            // Not 409: clients following the IETF draft retry a 409 later,
            // and this answer never changes while the record is retained.
            Self::ResponseUnavailable | Self::KeyExpired => StatusCode::GONE,
            Self::StoreUnavailable
            | Self::OutcomeUnknown
            | Self::Overloaded
            | Self::JobStoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::QuotaExceeded | Self::BudgetExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::HandlerFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// Which `code` the key refusals answer with. Either way their body's
/// `reason` member says what went wrong (`missing`, `invalid`, `repeated`),
/// and their problem `type` differs ([`Refusal::problem_type`]).
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, KeyCodes, MemoryStore};
///
/// // `400 idempotency_key_invalid` and `400 idempotency_key_repeated`.
/// let layer = IdempotencyLayer::new(MemoryStore::new()).with_key_codes(KeyCodes::Distinct);
/// # let _ = layer;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyCodes {
    /// `idempotency_key_required` for a missing, malformed or repeated key:
    /// the key contract's one code for "send one valid key".
    #[default]
    Shared,
    /// `idempotency_key_required` (missing), `idempotency_key_invalid`
    /// (malformed), `idempotency_key_repeated` (several keys).
    Distinct,
}

/// The status of `idempotency_key_reuse` (a key reused with another
/// request): the two the IETF `Idempotency-Key` draft allows.
///
/// ```
/// use http::StatusCode;
/// use tower_idempotency::{IdempotencyLayer, KeyReuseStatus, MemoryStore};
///
/// // `422`, as the draft's examples.
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .with_key_reuse_status(KeyReuseStatus::UnprocessableEntity);
/// # let _ = layer;
/// // From a status read from configuration: any other is an `Err`.
/// assert_eq!(KeyReuseStatus::try_from(StatusCode::CONFLICT), Ok(KeyReuseStatus::Conflict));
/// assert!(KeyReuseStatus::try_from(StatusCode::BAD_REQUEST).is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KeyReuseStatus {
    /// `409 Conflict` (default).
    #[default]
    Conflict,
    /// `422 Unprocessable Entity`.
    UnprocessableEntity,
}

impl From<KeyReuseStatus> for StatusCode {
    fn from(status: KeyReuseStatus) -> Self {
        match status {
            KeyReuseStatus::Conflict => StatusCode::CONFLICT,
            KeyReuseStatus::UnprocessableEntity => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

impl TryFrom<StatusCode> for KeyReuseStatus {
    type Error = ConfigError;

    /// `409` or `422`; any other status is [`ConfigError::KeyReuseStatus`].
    fn try_from(status: StatusCode) -> Result<Self, ConfigError> {
        match status {
            StatusCode::CONFLICT => Ok(Self::Conflict),
            StatusCode::UNPROCESSABLE_ENTITY => Ok(Self::UnprocessableEntity),
            other => Err(ConfigError::KeyReuseStatus(other)),
        }
    }
}

/// The shape of refusal bodies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorFormat {
    /// `application/json`: `{"code": "...", "message": "..."}` (and
    /// `"reason"` for the key refusals).
    #[default]
    Json,
    /// RFC 9457 `application/problem+json`:
    /// `{"type":"<Refusal::problem_type>","title":"...","status":409,"detail":"...","code":"..."}`
    /// (and `"reason"` for the key refusals).
    Problem,
}

/// A refusal as the idempotency layer answered it: in the extensions of every
/// refusal response (`response.extensions().get::<Refused>()`), and handed to
/// a [`RefusalResponse`] hook, so that an outer layer or the application can
/// act on the refusal without parsing its body.
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, StatusCode};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_idempotency::{IdempotencyLayer, MemoryStore, Refusal, Refused, Scope};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let svc = IdempotencyLayer::new(MemoryStore::new()).layer(tower::service_fn(
///     |_req: Request<Full<Bytes>>| async {
///         Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
///     },
/// ));
/// let mut req = Request::post("/v1/orders").body(Full::new(Bytes::new())).unwrap();
/// req.extensions_mut().insert(Scope::new("acme"));
/// let res = svc.oneshot(req).await.unwrap(); // no Idempotency-Key
/// let refused = res.extensions().get::<Refused>().unwrap();
/// assert_eq!(refused.refusal, Refusal::KeyRequired);
/// assert_eq!(refused.status, StatusCode::BAD_REQUEST);
/// assert_eq!(refused.retry_after, None);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refused {
    /// What was refused; [`Refusal::code`] is the `code` of the default body.
    pub refusal: Refusal,
    /// The status of the default answer (the configured one for key reuse).
    pub status: StatusCode,
    /// When to retry, for the refusals a retry may overcome (the default
    /// answer's `Retry-After`, in whole seconds).
    pub retry_after: Option<Duration>,
}

/// Builds the application's own answer to a refusal, in place of (or from)
/// the default JSON one: a gRPC status, an HTML page, another error envelope.
/// Set with
/// [`IdempotencyLayer::with_refusal_response`](crate::IdempotencyLayer::with_refusal_response);
/// any `Fn(&Refused, Response<Bytes>) -> Response<Bytes>` closure is one.
///
/// The returned response is sent as it is (its body as its bytes), with the
/// [`Refused`] in its extensions. Whatever it says, the request was not run.
pub trait RefusalResponse: Send + Sync + 'static {
    /// The answer to `refused`; `default` is what the layer would send.
    fn respond(&self, refused: &Refused, default: Response<Bytes>) -> Response<Bytes>;
}

impl<F> RefusalResponse for F
where
    F: Fn(&Refused, Response<Bytes>) -> Response<Bytes> + Send + Sync + 'static,
{
    fn respond(&self, refused: &Refused, default: Response<Bytes>) -> Response<Bytes> {
        self(refused, default)
    }
}

/// Builds refusals; the one place their status, headers and body are decided.
#[derive(Clone)]
pub(crate) struct Responder {
    pub(crate) format: ErrorFormat,
    pub(crate) reuse_status: KeyReuseStatus,
    pub(crate) key_codes: KeyCodes,
    pub(crate) retry_after: Duration,
    /// The application's own refusal answers, if it has them.
    pub(crate) hook: Option<Arc<dyn RefusalResponse>>,
    /// The request body limit, named in `413 payload_too_large`'s message.
    pub(crate) body_limit: Option<usize>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("format", &self.format)
            .field("reuse_status", &self.reuse_status)
            .field("key_codes", &self.key_codes)
            .field("retry_after", &self.retry_after)
            .field("hook", &self.hook.is_some())
            .field("body_limit", &self.body_limit)
            .finish()
    }
}

impl Default for Responder {
    fn default() -> Self {
        Self {
            format: ErrorFormat::Json,
            reuse_status: KeyReuseStatus::Conflict,
            key_codes: KeyCodes::Shared,
            retry_after: Duration::from_secs(1),
            hook: None,
            body_limit: None,
        }
    }
}

impl Responder {
    pub(crate) fn status(&self, refusal: Refusal) -> StatusCode {
        match refusal {
            Refusal::KeyReused => self.reuse_status.into(),
            other => other.default_status(),
        }
    }

    /// The `code` this layer answers `refusal` with.
    pub(crate) fn code(&self, refusal: Refusal) -> &'static str {
        match self.key_codes {
            KeyCodes::Shared => refusal.code(),
            KeyCodes::Distinct => refusal.distinct_code(),
        }
    }

    /// The `Retry-After` sent: whole seconds, at least one.
    fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs_f64().ceil().max(1.0) as u64
    }

    pub(crate) fn refuse<B>(&self, refusal: Refusal) -> Response<ResponseBody<B>> {
        let retry_after = refusal
            .is_retryable()
            .then(|| Duration::from_secs(self.retry_after_secs()));
        self.refuse_with(refusal, retry_after, serde_json::Map::new())
    }

    /// [`refuse`](Self::refuse), with its own `Retry-After` (whole seconds, at
    /// least one) and more members in its body.
    pub(crate) fn refuse_with<B>(
        &self,
        refusal: Refusal,
        retry_after: Option<Duration>,
        mut extra: serde_json::Map<String, serde_json::Value>,
    ) -> Response<ResponseBody<B>> {
        let status = self.status(refusal);
        if let Some(reason) = refusal.reason() {
            extra.insert("reason".into(), reason.into());
        }
        let seconds = retry_after.map(|after| after.as_secs_f64().ceil().max(1.0) as u64);
        let refused = Refused {
            refusal,
            status,
            retry_after: seconds.map(Duration::from_secs),
        };
        let message = match (refusal, self.body_limit) {
            // Which limit: the client (or its developer) cannot know it otherwise.
            (Refusal::PayloadTooLarge, Some(limit)) => {
                format!("the request body is larger than the limit of {limit} bytes").into()
            }
            _ => std::borrow::Cow::Borrowed(refusal.message()),
        };
        let kind = ErrorKind {
            code: self.code(refusal),
            problem_type: refusal.problem_type(),
        };
        let mut response = self.error_bytes(status, kind, &message, extra);
        if let Some(seconds) = seconds {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(hook) = &self.hook {
            response = hook.respond(&refused, response);
        }
        response.extensions_mut().insert(refused);
        response.map(ResponseBody::full)
    }

    /// Any error answer, in the configured format.
    #[cfg(feature = "leases")]
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
    #[cfg(feature = "leases")]
    pub(crate) fn error_with<B>(
        &self,
        status: StatusCode,
        code: &str,
        message: &str,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> Response<ResponseBody<B>> {
        let kind = ErrorKind {
            code,
            problem_type: "about:blank",
        };
        self.error_bytes(status, kind, message, extra)
            .map(ResponseBody::full)
    }

    fn error_bytes(
        &self,
        status: StatusCode,
        ErrorKind { code, problem_type }: ErrorKind<'_>,
        message: &str,
        extra: serde_json::Map<String, serde_json::Value>,
    ) -> Response<Bytes> {
        let (content_type, mut body) = match self.format {
            ErrorFormat::Json => (
                "application/json",
                serde_json::json!({ "code": code, "message": message }),
            ),
            ErrorFormat::Problem => (
                "application/problem+json",
                serde_json::json!({
                    "type": problem_type,
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
        json_bytes(status, content_type, &body)
    }
}

/// What an error body names: its `code`, and its problem `type`.
#[derive(Clone, Copy)]
struct ErrorKind<'a> {
    code: &'a str,
    problem_type: &'a str,
}

/// A response with a JSON body the layer built itself.
#[cfg(feature = "leases")]
pub(crate) fn json_response<B>(
    status: StatusCode,
    content_type: &'static str,
    body: &serde_json::Value,
) -> Response<ResponseBody<B>> {
    json_bytes(status, content_type, body).map(ResponseBody::full)
}

fn json_bytes(
    status: StatusCode,
    content_type: &'static str,
    body: &serde_json::Value,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

impl From<KeyProblem> for Refusal {
    fn from(problem: KeyProblem) -> Self {
        match problem {
            KeyProblem::Missing => Self::KeyRequired,
            KeyProblem::Repeated => Self::KeyRepeated,
            KeyProblem::Invalid => Self::KeyInvalid,
        }
    }
}

impl From<Refusal> for Outcome {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::KeyReused => Self::KeyReused,
            Refusal::InProgress => Self::InProgress,
            Refusal::StoreUnavailable | Refusal::OutcomeUnknown | Refusal::JobStoreUnavailable => {
                Self::StoreError
            }
            Refusal::HandlerFailed => Self::Released,
            Refusal::ResponseUnavailable => Self::Unavailable,
            Refusal::KeyExpired => Self::Expired,
            Refusal::QuotaExceeded => Self::OverQuota,
            Refusal::Overloaded => Self::Shed,
            _ => Self::Rejected,
        }
    }
}
