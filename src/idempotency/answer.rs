//! What the layer answers with: the handler's response or a replay, and the
//! headers recorded and added.

use super::config::{IDEMPOTENCY_KEY_RETENTION, IDEMPOTENCY_STATUS, IDEMPOTENT_REPLAYED};
use crate::body::ResponseBody;
use crate::store::StoredResponse;
use http::header::{CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_RANGE, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Response};

/// A response of the layer: the inner service's body, or one it built.
pub(crate) type Reply<B> = Response<ResponseBody<B>>;

/// The headers that describe the body's bytes themselves: recorded with them
/// whatever the allow-list says, since bytes replayed without them cannot be
/// read (gzip bytes without `content-encoding`) or are misread (a part
/// without `content-range`, a digest checked against other bytes). None of
/// them describes the caller. `content-location` names a resource, as
/// `location` does, and stays with the allow-list.
pub(crate) const REPRESENTATION_HEADERS: [HeaderName; 7] = [
    CONTENT_TYPE,
    CONTENT_ENCODING,
    CONTENT_LANGUAGE,
    CONTENT_RANGE,
    HeaderName::from_static("content-digest"),
    HeaderName::from_static("repr-digest"),
    HeaderName::from_static("digest"),
];

/// The headers of a response as they are recorded: those describing its bytes,
/// then the allow-listed ones (which never repeat the former), each with every
/// value in order.
pub(crate) fn recorded_headers(
    replayed_headers: &[HeaderName],
    parts: &http::response::Parts,
) -> Vec<(HeaderName, HeaderValue)> {
    // One pass over the response's fields (a response has few), each placed
    // by where its name is listed; the sort is stable, so the values of one
    // name keep their order.
    let rank = |name: &HeaderName| {
        REPRESENTATION_HEADERS
            .iter()
            .chain(replayed_headers)
            .position(|listed| listed == name)
    };
    let mut recorded: Vec<(HeaderName, HeaderValue)> = parts
        .headers
        .iter()
        .filter(|(name, _)| rank(name).is_some())
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    recorded.sort_by_key(|(name, _)| rank(name));
    recorded
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

pub(crate) fn replay<B>(stored: &StoredResponse, retention: Option<&HeaderValue>) -> Reply<B> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyLayer, MemoryStore};
    use http::header::{LOCATION, SET_COOKIE};

    fn parts(headers: &[(&str, &str)]) -> http::response::Parts {
        let mut builder = Response::builder().status(201);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn the_headers_describing_the_bytes_are_recorded_whatever_the_allow_list() {
        let parts = parts(&[
            ("x-request-id", "req-1"),
            (
                "digest",
                "sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
            ),
            ("content-encoding", "gzip"),
            ("content-encoding", "br"),
            ("content-range", "bytes 0-9/20"),
            ("repr-digest", "sha-256=:AAAA:"),
            ("content-digest", "sha-256=:BBBB:"),
            ("content-language", "fr"),
            ("content-type", "application/json"),
            ("location", "/v1/orders/1"),
        ]);
        let names = |recorded: Vec<(HeaderName, HeaderValue)>| -> Vec<String> {
            recorded
                .iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect()
        };
        let representation = [
            "content-type: application/json",
            "content-encoding: gzip",
            "content-encoding: br",
            "content-language: fr",
            "content-range: bytes 0-9/20",
            "content-digest: sha-256=:BBBB:",
            "repr-digest: sha-256=:AAAA:",
            "digest: sha-256=X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=",
        ];
        assert_eq!(names(recorded_headers(&[], &parts)), representation);
        let mut with_location = representation.to_vec();
        with_location.push("location: /v1/orders/1");
        assert_eq!(names(recorded_headers(&[LOCATION], &parts)), with_location);
        // A response with few header names (each listed name compared with
        // them rather than looked up): the same order and values.
        let few = self::parts(&[
            ("location", "/v1/orders/2"),
            ("content-encoding", "gzip"),
            ("x-request-id", "req-2"),
            ("content-encoding", "br"),
            ("content-type", "application/json"),
        ]);
        assert_eq!(
            names(recorded_headers(&[LOCATION], &few)),
            [
                "content-type: application/json",
                "content-encoding: gzip",
                "content-encoding: br",
                "location: /v1/orders/2",
            ]
        );
        assert_eq!(
            names(recorded_headers(&[], &few)),
            [
                "content-type: application/json",
                "content-encoding: gzip",
                "content-encoding: br",
            ]
        );
    }

    #[test]
    fn the_allow_list_keeps_each_other_name_once_and_never_cookies() {
        let layer = IdempotencyLayer::new(MemoryStore::new()).with_replayed_headers([
            CONTENT_ENCODING,
            LOCATION,
            SET_COOKIE,
            CONTENT_TYPE,
            LOCATION,
        ]);
        // Listing a header of the body does not record it twice.
        assert_eq!(layer.config.replayed_headers, [LOCATION]);
    }
}
