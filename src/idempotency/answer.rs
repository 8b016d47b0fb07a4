//! What the layer answers with: the handler's response or a replay, and the
//! headers recorded and added.

use super::config::{IDEMPOTENCY_KEY_RETENTION, IDEMPOTENCY_STATUS, IDEMPOTENT_REPLAYED};
use crate::body::ResponseBody;
use crate::store::StoredResponse;
use http::{HeaderValue, Response};

/// A response of the layer: the inner service's body, or one it built.
pub(crate) type Answer<B> = Response<ResponseBody<B>>;

/// The allow-listed headers of a response, as they are recorded.
pub(crate) fn recorded_headers(
    replayed_headers: &[http::HeaderName],
    parts: &http::response::Parts,
) -> Vec<(http::HeaderName, HeaderValue)> {
    replayed_headers
        .iter()
        .flat_map(|name| {
            parts
                .headers
                .get_all(name)
                .iter()
                .map(move |value| (name.clone(), value.clone()))
        })
        .collect()
}

/// Adds `Idempotency-Key-Retention` to an answer whose key is kept, after
/// its record's headers were taken: it is never part of the record.
pub(crate) fn advertise_retention(parts: &mut http::response::Parts, value: Option<&HeaderValue>) {
    if let Some(value) = value {
        parts
            .headers
            .insert(IDEMPOTENCY_KEY_RETENTION, value.clone());
    }
}

/// Marks a `2xx` answer the record policy declined (its key was released):
/// a handler left unprotected by the policy shows on its first answer,
/// without a tracing subscriber to print the warning.
pub(crate) fn mark_not_recorded(parts: &mut http::response::Parts) {
    if parts.status.is_success() {
        parts
            .headers
            .insert(IDEMPOTENCY_STATUS, HeaderValue::from_static("not-recorded"));
    }
}

pub(crate) fn replay<B>(stored: &StoredResponse, retention: Option<&HeaderValue>) -> Answer<B> {
    let mut response = Response::new(ResponseBody::full(stored.body.clone()));
    *response.status_mut() = stored.status;
    let headers = response.headers_mut();
    for (name, value) in &stored.headers {
        headers.append(name.clone(), value.clone());
    }
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    if let Some(retention) = retention {
        headers.insert(IDEMPOTENCY_KEY_RETENTION, retention.clone());
    }
    response
}
