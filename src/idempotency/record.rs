//! Recording a response: its body reaches the caller as it is produced, while
//! a copy of at most the record limit is kept for the record.
//!
//! Once a handler answered with a response to record, its effects happened:
//! whatever happens to the body from then on (it fails, it is larger than the
//! limit, the caller hangs up), the key is completed, never released. A body
//! that cannot be recorded completes the key as "response unavailable", so a
//! retry is told so instead of running the handler again.

use super::claimed::{kept_alive, Running};
use crate::body::BoxError;
use crate::store::{FencingToken, RecordKey, Store, StoredResponse};
use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use tokio::sync::mpsc;

/// How many frames may wait for a slow caller before the recorder waits too.
const FORWARD_FRAMES: usize = 8;

/// The copy of a body kept for the record: at most `limit` bytes.
pub(crate) struct Copy {
    chunks: Vec<Bytes>,
    len: usize,
    limit: usize,
    over: bool,
}

impl Copy {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            chunks: Vec::new(),
            len: 0,
            limit,
            over: false,
        }
    }

    fn keep(&mut self, data: &Bytes) {
        if self.over {
            return;
        }
        if self.len + data.len() > self.limit {
            // Over the limit: no record of it, so no copy to keep either.
            self.over = true;
            self.chunks = Vec::new();
            return;
        }
        self.len += data.len();
        self.chunks.push(data.clone());
    }

    /// Whether the body went over the record limit.
    pub(crate) fn is_over(&self) -> bool {
        self.over
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        match self.chunks.len() {
            0 => Bytes::new(),
            1 => self.chunks.into_iter().next().expect("one chunk"),
            _ => {
                let mut joined = BytesMut::with_capacity(self.len);
                for chunk in &self.chunks {
                    joined.extend_from_slice(chunk);
                }
                joined.freeze()
            }
        }
    }
}

/// A response body read so far.
pub(crate) enum Read {
    /// It ended: the copy holds all of it (unless it went over the limit).
    Ended,
    /// It failed.
    Failed(BoxError),
    /// More is to come; the frames read so far are waiting to be forwarded.
    Continues,
}

/// A response body, boxed so that a recorder task can take it over.
pub(crate) type Pinned<B> = Pin<Box<B>>;

fn data_frame<D: Into<Bytes>>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(Into::into)
}

/// Reads the frames `body` has ready now, without waiting for more (most
/// recorded bodies are whole at once), or, with `wait`, until it ends, fails
/// or goes over the limit.
pub(crate) async fn read<B>(
    body: &mut Pinned<B>,
    copy: &mut Copy,
    read: &mut Vec<Frame<Bytes>>,
    wait: bool,
) -> Read
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| loop {
        match body.as_mut().poll_frame(cx) {
            Poll::Ready(None) => return Poll::Ready(Read::Ended),
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Read::Failed(error.into())),
            Poll::Ready(Some(Ok(frame))) => {
                let frame = data_frame(frame);
                if let Some(data) = frame.data_ref() {
                    copy.keep(data);
                }
                read.push(frame);
                if copy.is_over() {
                    // Never recorded: the rest is only forwarded.
                    return Poll::Ready(Read::Continues);
                }
            }
            Poll::Pending if wait => return Poll::Pending,
            Poll::Pending => return Poll::Ready(Read::Continues),
        }
    })
    .await
}

/// Completes the claim with what the body turned out to be.
pub(crate) struct Recorder {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) record: RecordKey,
    pub(crate) token: FencingToken,
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

impl Recorder {
    /// Records the whole body; `false` if the store refused or failed.
    pub(crate) async fn complete(self, body: Bytes) -> bool {
        let stored = StoredResponse {
            status: self.status,
            headers: self.headers,
            body,
        };
        match self.store.complete(&self.record, self.token, stored).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, "the handler ran but its response could not be recorded");
                false
            }
        }
    }

    /// Completes the key without a replayable response.
    pub(crate) async fn unavailable(self, why: &str) {
        tracing::warn!(why, "the handler ran; its response is not replayable");
        if let Err(error) = self
            .store
            .complete_unavailable(&self.record, self.token)
            .await
        {
            tracing::warn!(%error, "the handler ran but its completion could not be recorded");
        }
    }
}

/// Forwards frames to the caller for as long as it listens.
struct Forward(Option<mpsc::Sender<Result<Frame<Bytes>, BoxError>>>);

impl Forward {
    async fn send(&mut self, frame: Result<Frame<Bytes>, BoxError>) {
        if let Some(tx) = &self.0 {
            if tx.send(frame).await.is_err() {
                // The caller is gone: the body is still read to its end.
                self.0 = None;
            }
        }
    }
}

/// A body part-read: what is left of it, its copy so far, the frames read
/// and not yet forwarded, and what records it at its end (none once it cannot
/// be recorded, or when it is only forwarded).
pub(crate) struct Rest<B> {
    pub(crate) body: Pinned<B>,
    pub(crate) copy: Copy,
    pub(crate) read: Vec<Frame<Bytes>>,
    pub(crate) recorder: Option<Recorder>,
}

/// Hands `rest` to a task that forwards it to the returned receiver and, with
/// a recorder, records it (or completes the key as unavailable), keeping the
/// claim alive meanwhile. Given back outside a tokio runtime.
pub(crate) fn spawn_rest<B>(
    rest: Rest<B>,
    running: Running,
) -> Result<crate::body::Frames, Box<Rest<B>>>
where
    B: Body + Send + 'static,
    B::Data: Into<Bytes> + Send,
    B::Error: Into<BoxError>,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Err(Box::new(rest));
    };
    let Rest {
        body,
        mut copy,
        read,
        recorder,
    } = rest;
    let (tx, rx) = mpsc::channel(FORWARD_FRAMES);
    let heartbeat = recorder
        .as_ref()
        .map(|r| (r.store.clone(), r.record.clone(), r.token));
    let rest = async move {
        let mut body = body;
        let mut forward = Forward(Some(tx));
        for frame in read {
            forward.send(Ok(frame)).await;
        }
        let mut recorder = recorder;
        let failed: Option<BoxError> = loop {
            if copy.is_over() {
                // It will never be recorded: say so now, not at an end that may
                // never come (an endless stream), and stop holding the key.
                if let Some(recorder) = recorder.take() {
                    recorder
                        .unavailable("the response is over the record limit")
                        .await;
                }
                if forward.0.is_none() {
                    // Nobody reads it and nothing keeps it: stop producing it.
                    return;
                }
            }
            let frame = match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                None => break None,
                Some(Err(error)) => break Some(error.into()),
                Some(Ok(frame)) => data_frame(frame),
            };
            if let Some(data) = frame.data_ref() {
                copy.keep(data);
            }
            forward.send(Ok(frame)).await;
        };
        if let Some(error) = failed {
            forward.send(Err(error)).await;
            if let Some(recorder) = recorder {
                recorder.unavailable("the response body failed").await;
            }
        } else if let Some(recorder) = recorder {
            recorder.complete(copy.into_bytes()).await;
        }
    };
    let span = tracing::Span::current();
    match heartbeat {
        Some((store, record, token)) => {
            runtime.spawn(tracing::Instrument::instrument(
                async move {
                    kept_alive(rest, store, record, token).await;
                    drop(running);
                },
                span,
            ));
        }
        None => {
            runtime.spawn(tracing::Instrument::instrument(
                async move {
                    rest.await;
                    drop(running);
                },
                span,
            ));
        }
    }
    Ok(rx)
}
