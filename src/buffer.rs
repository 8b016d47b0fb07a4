//! Request body buffering shared by both layers.

use crate::body::BoxError;
use crate::response::Refusal;
use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::time::Duration;

/// Reads the whole request body within the configured size and time limits.
pub(crate) async fn buffer_body<B>(
    body: B,
    headers: &http::HeaderMap,
    limit: usize,
    timeout: Option<Duration>,
) -> Result<Bytes, Refusal>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(Refusal::PayloadTooLarge);
    }
    let collect = Limited::new(body, limit).collect();
    let collected = match timeout {
        Some(limit) => tokio::time::timeout(limit, collect)
            .await
            .map_err(|_| Refusal::BodyTimeout)?,
        None => collect.await,
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if over_limit(&*error) => Err(Refusal::PayloadTooLarge),
        Err(_) => Err(Refusal::BodyUnreadable),
    }
}

/// Whether a body error is a length limit: ours, or one an outer layer (such as
/// tower-http's `RequestBodyLimitLayer`) put into the body, wrapped or not.
fn over_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<LengthLimitError>() {
            return true;
        }
        current = e.source();
    }
    false
}
