use crate::Scope;
use bytes::Bytes;
use http::request::Parts;
use http::StatusCode;
use std::borrow::Cow;
use std::sync::Arc;

/// Builds the natural job key of a start request, after the tenant.
///
/// The store identifies a job by the tenant, the layer's kind and this key as
/// three separate fields, so two tenants never share a job, whatever a body
/// or a key says. Closures
/// `Fn(&Scope, &http::request::Parts, &Bytes) -> Result<String, JobKeyRejection>`
/// implement this trait.
pub trait JobKeyExtractor: Clone + Send + Sync + 'static {
    /// The key for this request (e.g. `customer_health:2026-08`), or why it is refused.
    fn job_key(
        &self,
        scope: &Scope,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<String, JobKeyRejection>;
}

impl<F> JobKeyExtractor for F
where
    F: Fn(&Scope, &Parts, &Bytes) -> Result<String, JobKeyRejection>
        + Clone
        + Send
        + Sync
        + 'static,
{
    fn job_key(
        &self,
        scope: &Scope,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<String, JobKeyRejection> {
        self(scope, parts, body)
    }
}

/// Estimates what a start costs against the layer's budget, in its units
/// (model tokens, say), from the request. The estimate is reserved when the
/// job is accepted, kept once it completes and returned if it fails. Closures
/// `Fn(&Scope, &http::request::Parts, &Bytes) -> u64` implement this trait.
pub trait JobCost: Send + Sync + 'static {
    /// The units this start reserves.
    fn cost(&self, scope: &Scope, parts: &Parts, body: &Bytes) -> u64;
}

impl<F> JobCost for F
where
    F: Fn(&Scope, &Parts, &Bytes) -> u64 + Send + Sync + 'static,
{
    fn cost(&self, scope: &Scope, parts: &Parts, body: &Bytes) -> u64 {
        self(scope, parts, body)
    }
}

/// A start request refused before any job is touched, answered as
/// `{"code": ..., "message": ...}` with its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobKeyRejection {
    /// The HTTP status.
    pub status: StatusCode,
    /// The machine-readable code.
    pub code: Cow<'static, str>,
    /// A human-readable explanation.
    pub message: Cow<'static, str>,
}

impl JobKeyRejection {
    /// A refusal with any status and code.
    pub fn new(
        status: StatusCode,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// `400` with `code`.
    pub fn bad_request(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// `403 tenant_mismatch`: the body claims another tenant than the session's.
    pub fn tenant_mismatch() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "tenant_mismatch",
            "the request names another tenant than the authenticated one",
        )
    }
}

/// Builds the key from string fields of a JSON body, joined by `:`; optionally
/// refuses a body whose claimed-tenant field names another tenant.
///
/// ```
/// use bytes::Bytes;
/// use tower_idempotency::lease::{JobKeyExtractor, JsonJobKey};
/// use tower_idempotency::Scope;
///
/// let key = JsonJobKey::new(["report_type", "period"]).with_claimed_tenant("claimed_tenant_id");
/// let (parts, ()) = http::Request::post("/reports/start").body(()).unwrap().into_parts();
/// let acme = Scope::new("acme");
/// let body = Bytes::from_static(br#"{"report_type":"customer_health","period":"2026-08"}"#);
/// assert_eq!(key.job_key(&acme, &parts, &body).unwrap(), "customer_health:2026-08");
///
/// let claims_other = Bytes::from_static(
///     br#"{"report_type":"customer_health","period":"2026-08","claimed_tenant_id":"globex"}"#);
/// assert_eq!(key.job_key(&acme, &parts, &claims_other).unwrap_err().code, "tenant_mismatch");
/// ```
#[derive(Clone, Debug)]
pub struct JsonJobKey {
    fields: Arc<[String]>,
    claimed_tenant: Option<Arc<str>>,
}

impl JsonJobKey {
    /// Uses these fields, in order; each must be a non-empty string without `:`.
    pub fn new<I, S>(fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            fields: fields.into_iter().map(Into::into).collect(),
            claimed_tenant: None,
        }
    }

    /// A field the client may use to say which tenant it means: evidence, never
    /// authority. When present and different from the scope → `403 tenant_mismatch`.
    pub fn with_claimed_tenant(mut self, field: impl Into<Arc<str>>) -> Self {
        self.claimed_tenant = Some(field.into());
        self
    }
}

impl JobKeyExtractor for JsonJobKey {
    fn job_key(
        &self,
        scope: &Scope,
        _parts: &Parts,
        body: &Bytes,
    ) -> Result<String, JobKeyRejection> {
        let invalid = || {
            let fields = self.fields.join(", ");
            JobKeyRejection::bad_request(
                "invalid_job_key",
                format!("send a JSON object with non-empty string fields without ':': {fields}"),
            )
        };
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| invalid())?;
        if let Some(field) = &self.claimed_tenant {
            match value.get(&**field) {
                None | Some(serde_json::Value::Null) => {}
                Some(claimed) if claimed.as_str() == Some(scope.as_str()) => {}
                Some(_) => return Err(JobKeyRejection::tenant_mismatch()),
            }
        }
        let mut parts = Vec::with_capacity(self.fields.len());
        for field in self.fields.iter() {
            let part = value
                .get(field)
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty() && !s.contains(':'))
                .ok_or_else(invalid)?;
            parts.push(part);
        }
        Ok(parts.join(":"))
    }
}
