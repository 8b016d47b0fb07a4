//! Request body buffering shared by both layers.

use crate::body::BoxError;
use crate::response::Refusal;
use bytes::{Buf, Bytes, BytesMut};
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
    let collect = collect(Limited::new(body, limit));
    let collected = match timeout {
        Some(limit) => tokio::time::timeout(limit, collect)
            .await
            .map_err(|_| Refusal::BodyTimeout)?,
        None => collect.await,
    };
    match collected {
        Ok(bytes) => Ok(bytes),
        Err(error) if over_limit(&*error) => Err(Refusal::PayloadTooLarge),
        Err(_) => Err(Refusal::BodyUnreadable),
    }
}

/// The body's data frames as one buffer. A body of one frame (most buffered
/// requests) is returned as it is, without a copy or a frame list; trailers
/// are not part of the fingerprint and are dropped.
pub(crate) async fn collect<B>(body: B) -> Result<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(mut data) = frame.map_err(Into::into)?.into_data() else {
            continue;
        };
        let chunk = data.copy_to_bytes(data.remaining());
        match (&mut joined, first.take()) {
            (Some(joined), _) => joined.extend_from_slice(&chunk),
            (None, None) => first = Some(chunk),
            (None, Some(earlier)) => {
                let mut buf = BytesMut::with_capacity(earlier.len() + chunk.len());
                buf.extend_from_slice(&earlier);
                buf.extend_from_slice(&chunk);
                joined = Some(buf);
            }
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A body yielding the given frames, one per poll.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    fn frames(parts: &[&'static [u8]]) -> Frames {
        Frames(
            parts
                .iter()
                .map(|p| Frame::data(Bytes::from_static(p)))
                .collect(),
        )
    }

    #[tokio::test]
    async fn one_frame_is_returned_without_a_copy() {
        let data: &'static [u8] = br#"{"sku":"A"}"#;
        let bytes = collect(frames(&[data])).await.unwrap();
        assert_eq!(bytes.as_ptr(), data.as_ptr());
    }

    #[tokio::test]
    async fn frames_are_joined_in_order_and_trailers_dropped() {
        let mut body = frames(&[b"{\"a\"", b":", b"", b"1}"]);
        body.0.push_back(Frame::trailers(http::HeaderMap::new()));
        assert_eq!(
            collect(body).await.unwrap(),
            Bytes::from_static(b"{\"a\":1}")
        );
        assert_eq!(collect(frames(&[])).await.unwrap(), Bytes::new());
        assert_eq!(
            collect(frames(&[b"", b"x"])).await.unwrap(),
            Bytes::from_static(b"x")
        );
    }
}
