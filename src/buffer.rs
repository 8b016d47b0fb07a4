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
    let expected = match declared {
        Some(len) if len > limit as u64 => return Err(Refusal::PayloadTooLarge),
        // At most the limit, so a lying length never reserves more.
        Some(len) => usize::try_from(len).map_or(limit, |len| len.min(limit)),
        None => 0,
    };
    let collect = collect_within(Limited::new(body, limit), expected, limit);
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
#[cfg(test)]
pub(crate) async fn collect<B>(body: B) -> Result<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    collect_within(body, 0, usize::MAX).await
}

/// [`collect`], for a body of `expected` bytes (its declared length, 0 if
/// unknown) that never exceeds `limit`. A body of several frames is joined in
/// one buffer of the expected size, reserved once: grown by doubling as it
/// arrives, its buffer would be copied at each step and end up to twice the
/// bytes received, for as long as the request lives. Whatever it grows to
/// beyond that stays within `limit`.
async fn collect_within<B>(body: B, expected: usize, limit: usize) -> Result<Bytes, BoxError>
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
            (Some(joined), _) => {
                reserve_within(joined, chunk.len(), limit);
                joined.extend_from_slice(&chunk);
            }
            (None, None) => first = Some(chunk),
            (None, Some(earlier)) => {
                let len = earlier.len() + chunk.len();
                let mut buf = BytesMut::with_capacity(len.max(expected));
                buf.extend_from_slice(&earlier);
                buf.extend_from_slice(&chunk);
                joined = Some(buf);
            }
        }
    }
    Ok(joined.map_or_else(|| first.unwrap_or_default(), BytesMut::freeze))
}

/// Makes room for `additional` bytes: doubling, as a `Vec` grows, but never
/// past `limit` (the body cannot go beyond it) unless the bytes need it.
fn reserve_within(buf: &mut BytesMut, additional: usize, limit: usize) {
    if buf.capacity() - buf.len() >= additional {
        return;
    }
    let needed = buf.len().saturating_add(additional);
    let target = buf.capacity().saturating_mul(2).min(limit).max(needed);
    // Not `reserve`: its `Vec` may double past the limit.
    let mut grown = BytesMut::with_capacity(target);
    grown.extend_from_slice(buf);
    *buf = grown;
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

    /// `count` frames of `size` bytes each.
    fn even_frames(count: usize, size: usize) -> Frames {
        Frames(
            (0..count)
                .map(|i| Frame::data(Bytes::from(vec![i as u8; size])))
                .collect(),
        )
    }

    fn content_length(len: usize) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(CONTENT_LENGTH, len.into());
        headers
    }

    /// The allocation behind a buffered body (the buffer is not shared, so it
    /// is handed back as it is, capacity included).
    fn capacity(bytes: Bytes) -> usize {
        bytes
            .try_into_mut()
            .expect("the buffer is not shared")
            .capacity()
    }

    #[tokio::test]
    async fn a_declared_length_within_the_limit_is_one_allocation_of_that_size() {
        // Ten frames of 100: growing by doubling would end at 1600 bytes.
        let bytes = buffer_body(even_frames(10, 100), &content_length(1000), 4096, None)
            .await
            .unwrap();
        assert_eq!(bytes.len(), 1000);
        assert!(bytes
            .chunks(100)
            .enumerate()
            .all(|(i, c)| c == [i as u8; 100]));
        assert_eq!(capacity(bytes), 1000);
    }

    #[tokio::test]
    async fn the_buffer_never_grows_past_the_limit() {
        // Without a declared length, or with one that understates the body.
        for headers in [http::HeaderMap::new(), content_length(150)] {
            let bytes = buffer_body(even_frames(10, 100), &headers, 1000, None)
                .await
                .unwrap();
            assert_eq!(bytes.len(), 1000);
            assert!(capacity(bytes) <= 1000, "{headers:?}");
        }
        // A declared length over the limit is refused before a frame is read.
        let mut body = even_frames(10, 100);
        let refused = buffer_body(&mut body, &content_length(1001), 1000, None).await;
        assert!(matches!(refused, Err(Refusal::PayloadTooLarge)));
        assert_eq!(body.0.len(), 10, "no frame was read");
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
