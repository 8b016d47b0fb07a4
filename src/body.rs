//! The response body type of both layers.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A boxed error, as tower and hyper use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Response body of [`IdempotencyService`](crate::idempotency::IdempotencyService): the inner
    /// service's body passed through, or bytes the layer holds (a replay, a refusal,
    /// or a recorded response).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        // A response read whole that ended with trailers (boxed: rare, and large).
        Trailed { data: Option<Bytes>, trailers: Option<Box<HeaderMap>> },
        Failed { error: Option<BoxError> },
        Streamed { frames: Frames },
    }
}

/// Frames of a recorded response, forwarded as its recorder reads them.
pub(crate) type Frames = tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, BoxError>>;

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            kind: Kind::Full { data },
        }
    }

    /// A response read whole: its data, then its trailers.
    pub(crate) fn trailed(data: Bytes, trailers: HeaderMap) -> Self {
        let data = (!data.is_empty()).then_some(data);
        Self {
            kind: Kind::Trailed {
                data,
                trailers: Some(Box::new(trailers)),
            },
        }
    }

    /// The frames a recorder forwards while it keeps a copy of the body.
    pub(crate) fn streamed(frames: Frames) -> Self {
        Self {
            kind: Kind::Streamed { frames },
        }
    }

    /// A body that yields `error` on first poll: the inner body failed while the
    /// layer was buffering it, and the client must see that failure.
    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            kind: Kind::Failed { error: Some(error) },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|result| {
                    result
                        .map(|frame| frame.map_data(Into::into))
                        .map_err(Into::into)
                })
            }),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Trailed { data, trailers } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => trailers.take().map(|t| Ok(Frame::trailers(*t))),
            }),
            KindProj::Failed { error } => Poll::Ready(error.take().map(Err)),
            KindProj::Streamed { frames } => frames.poll_recv(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Trailed { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Failed { error } => error.is_none(),
            Kind::Streamed { frames } => frames.is_closed() && frames.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } | Kind::Trailed { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Failed { .. } | Kind::Streamed { .. } => SizeHint::default(),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Full { .. } => "Full",
            Kind::Trailed { .. } => "Trailed",
            Kind::Failed { .. } => "Failed",
            Kind::Streamed { .. } => "Streamed",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}
