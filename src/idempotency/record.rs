//! Recording a response: its body reaches the caller as it is produced, while
//! a copy of at most the record limit is kept for the record.
//!
//! Once a handler answered with a response to record, its effects happened:
//! whatever happens to the body from then on (it fails, it is larger than the
//! limit, the caller hangs up), the key is completed, never released. A body
//! that cannot be recorded completes the key as "response unavailable", so a
//! retry is told so instead of running the handler again.

use crate::body::{BoxError, ResponseBody};
use crate::run::in_flight::Running;
use crate::run::keep_alive::kept_alive_handed_over;
use crate::run::recorder::Recorder;
use crate::store::StoredResponse;
use crate::telemetry::Outcome;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::sync::mpsc;

/// A response's record to complete once its body is known: the claim's
/// recorder and the head every replay repeats.
pub(crate) struct Recording {
    pub(crate) recorder: Recorder,
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

impl Recording {
    /// Records the whole body; `false` if the store refused or failed.
    fn complete(self, body: Bytes) -> impl Future<Output = bool> + Send {
        let Self {
            recorder,
            status,
            headers,
        } = self;
        recorder.complete(StoredResponse {
            status,
            headers,
            body,
        })
    }

    /// Completes the key without a replayable response.
    fn unavailable(self, why: &'static str) -> impl Future<Output = ()> + Send {
        self.recorder.unavailable(why)
    }
}

/// How many frames may wait for a slow caller before the recorder waits too.
const FORWARD_FRAMES: usize = 8;

/// Items read from a body: almost always one, which is then kept without an
/// allocation of its own.
#[derive(Default)]
pub(crate) enum OneOrMany<T> {
    #[default]
    None,
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub(crate) fn push(&mut self, item: T) {
        *self = match std::mem::take(self) {
            Self::None => Self::One(item),
            Self::One(first) => Self::Many(vec![first, item]),
            Self::Many(mut all) => {
                all.push(item);
                Self::Many(all)
            }
        };
    }
}

impl<T> IntoIterator for OneOrMany<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<std::option::IntoIter<T>, std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        let (one, many) = match self {
            Self::None => (None, Vec::new()),
            Self::One(item) => (Some(item), Vec::new()),
            Self::Many(all) => (None, all),
        };
        one.into_iter().chain(many)
    }
}

/// The copy of a body kept for the record: at most `limit` bytes.
pub(crate) struct RecordCopy {
    chunks: OneOrMany<Bytes>,
    len: usize,
    limit: usize,
    over: bool,
    trailers: bool,
}

impl RecordCopy {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            chunks: OneOrMany::None,
            len: 0,
            limit,
            over: false,
            trailers: false,
        }
    }

    /// Keeps a frame's data; notes trailers, which a record cannot carry.
    fn keep_frame(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.keep(data);
        } else if frame.trailers_ref().is_some_and(|t| !t.is_empty()) {
            self.trailers = true;
        }
    }

    fn keep(&mut self, data: &Bytes) {
        if self.over {
            return;
        }
        if self.len + data.len() > self.limit {
            // Over the limit: no record of it, so no copy to keep either.
            self.over = true;
            self.chunks = OneOrMany::None;
            return;
        }
        self.len += data.len();
        self.chunks.push(data.clone());
    }

    /// Whether the body went over the record limit.
    pub(crate) fn is_over(&self) -> bool {
        self.over
    }

    /// Whether the body had trailers: replayed without them, the response
    /// would not be the one the handler gave (gRPC's `grpc-status`), so it is
    /// not replayable.
    pub(crate) fn has_trailers(&self) -> bool {
        self.trailers
    }

    pub(crate) fn into_bytes(self) -> Bytes {
        match self.chunks {
            OneOrMany::None => Bytes::new(),
            OneOrMany::One(chunk) => chunk,
            OneOrMany::Many(chunks) => {
                let mut joined = BytesMut::with_capacity(self.len);
                for chunk in &chunks {
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
    /// It went over the record limit: it will never be recorded.
    Over,
    /// More is to come; the frames read so far are waiting to be forwarded.
    Continues,
}

pin_project! {
    /// A handler's response body whose panics are its failures: once the
    /// handler answered, its effects happened, so a body that panics must
    /// complete the key (as "response unavailable") and reach the caller as
    /// an error, as a body that fails does. Uncaught, the panic would end
    /// whatever reads it (and the claim's keep-alive with it) and leave the
    /// claim to expire, for a retry to run the handler again.
    pub(crate) struct Caught<B> {
        #[pin]
        body: B,
        panicked: bool,
    }
}

/// A response body, caught, and boxed so that a recorder task can take it over.
pub(crate) type Pinned<B> = Pin<Box<Caught<B>>>;

/// The one way to read a handler's response body for its record.
pub(crate) fn pinned<B>(body: B) -> Pinned<B> {
    Box::pin(Caught {
        body,
        panicked: false,
    })
}

impl<B> Caught<B>
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    /// The body's next frame, its data and error converted (the application's
    /// conversions may panic too); a panic is an error, and the end after it.
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        if *this.panicked {
            // Never polled again: a body that panicked may be in any state.
            return Poll::Ready(None);
        }
        let body = this.body;
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let polled = body.poll_frame(cx);
            polled.map(|frame| frame.map(|f| f.map(|f| f.map_data(Into::into)).map_err(Into::into)))
        }));
        polled.unwrap_or_else(|_| {
            *this.panicked = true;
            Poll::Ready(Some(Err(BodyPanicked.into())))
        })
    }
}

/// What the caller of a body that panicked sees (the panic itself went to
/// the panic hook).
#[derive(Debug)]
struct BodyPanicked;

impl std::fmt::Display for BodyPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the response body panicked")
    }
}

impl std::error::Error for BodyPanicked {}

/// Reads `body` until it ends, fails or goes over the limit.
pub(crate) async fn read_to_end<B>(
    body: &mut Pinned<B>,
    copy: &mut RecordCopy,
    read: &mut OneOrMany<Frame<Bytes>>,
) -> Read
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| read_until_pending(body, copy, read, cx)).await
}

/// Reads the frames `body` has ready now, without waiting for more (most
/// recorded bodies are whole at once): [`Read::Continues`] if it has to wait.
pub(crate) fn read_ready<B>(
    body: &mut Pinned<B>,
    copy: &mut RecordCopy,
    read: &mut OneOrMany<Frame<Bytes>>,
    cx: &mut Context<'_>,
) -> Read
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    match read_until_pending(body, copy, read, cx) {
        Poll::Ready(end) => end,
        Poll::Pending => Read::Continues,
    }
}

/// Reads frames until the body ends, fails or goes over the limit (`Ready`),
/// or has to wait (`Pending`).
fn read_until_pending<B>(
    body: &mut Pinned<B>,
    copy: &mut RecordCopy,
    read: &mut OneOrMany<Frame<Bytes>>,
    cx: &mut Context<'_>,
) -> Poll<Read>
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    loop {
        match ready!(body.as_mut().poll_frame(cx)) {
            None => return Poll::Ready(Read::Ended),
            Some(Err(error)) => return Poll::Ready(Read::Failed(error)),
            Some(Ok(frame)) => {
                copy.keep_frame(&frame);
                read.push(frame);
                if copy.is_over() {
                    return Poll::Ready(Read::Over);
                }
            }
        }
    }
}

/// Forwards frames to the caller for as long as it listens.
struct Forward(Option<mpsc::Sender<Result<Frame<Bytes>, BoxError>>>);

impl Forward {
    async fn send(&mut self, frame: Result<Frame<Bytes>, BoxError>) {
        if let Some(tx) = &self.0 {
            if tx.send(frame).await.is_err() {
                // The caller is gone: a body being recorded is still read to its end.
                self.0 = None;
            }
        }
    }
}

/// A body part-read: what is left of it, its copy so far, the frames read
/// and not yet forwarded, and what records it at its end (none when it is
/// only forwarded).
pub(crate) struct Rest<B> {
    pub(crate) body: Pinned<B>,
    pub(crate) copy: RecordCopy,
    pub(crate) read: OneOrMany<Frame<Bytes>>,
    pub(crate) recorder: Option<Recording>,
}

async fn next_frame<B>(body: &mut Pinned<B>) -> Option<Result<Frame<Bytes>, BoxError>>
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
}

/// Forwards and records the rest of a body until it ends, fails or passes
/// the limit, then completes the key accordingly. `true` when it stopped at
/// the limit with more to come (to be forwarded only).
async fn record_rest<B>(
    body: &mut Pinned<B>,
    mut copy: RecordCopy,
    forward: &mut Forward,
    recorder: Recording,
) -> bool
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    loop {
        if copy.is_over() {
            // Said now, not at an end that may never come (an endless stream).
            recorder.unavailable(OVER).await;
            return true;
        }
        match next_frame(body).await {
            None if copy.has_trailers() => {
                recorder.unavailable(TRAILERS).await;
                return false;
            }
            None => {
                recorder.complete(copy.into_bytes()).await;
                return false;
            }
            Some(Err(error)) => {
                forward.send(Err(error)).await;
                recorder.unavailable("the response body failed").await;
                return false;
            }
            Some(Ok(frame)) => {
                copy.keep_frame(&frame);
                forward.send(Ok(frame)).await;
            }
        }
    }
}

/// Forwards the rest of a body for as long as someone listens.
async fn forward_rest<B>(body: &mut Pinned<B>, forward: &mut Forward)
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    while forward.0.is_some() {
        match next_frame(body).await {
            None => return,
            Some(frame) => {
                let failed = frame.is_err();
                forward.send(frame).await;
                if failed {
                    return;
                }
            }
        }
    }
}

/// Hands `rest` to a task that forwards it to the returned receiver and, with
/// a recorder, records it (or completes the key as unavailable), keeping the
/// claim alive until it is completed. Given back outside a tokio runtime.
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
    let (tx, rx) = mpsc::channel(FORWARD_FRAMES);
    let task = async move {
        let Rest {
            mut body,
            copy,
            read,
            recorder,
        } = rest;
        let mut forward = Forward(Some(tx));
        for frame in read {
            forward.send(Ok(frame)).await;
        }
        if let Some(recorder) = recorder {
            let (store, record, token) = recorder.recorder.claim();
            let (store, record) = (store.clone(), record.clone());
            let recording = record_rest(&mut body, copy, &mut forward, recorder);
            if !kept_alive_handed_over(recording, store, record, token).await {
                return;
            }
        }
        // Past the limit, or nothing to record: no claim to keep any more.
        forward_rest(&mut body, &mut forward).await;
        drop(running);
    };
    runtime.spawn(tracing::Instrument::instrument(
        task,
        tracing::Span::current(),
    ));
    Ok(rx)
}

/// Concludes a body that ended or failed: answers it whole (or failing) and,
/// with a recorder, records it or completes the key as unavailable.
///
/// Settled before the one await, so that the future holds only the answer
/// and the completion still to run.
pub(crate) fn conclude<X>(
    end: Read,
    copy: RecordCopy,
    read: OneOrMany<Frame<Bytes>>,
    recorder: Option<Recording>,
) -> impl Future<Output = (ResponseBody<X>, Outcome)> {
    let (body, completion) = match (end, recorder) {
        (Read::Failed(error), recorder) => {
            // The effects happened: never released, never run again.
            let completion = recorder.map(|r| Ending::Unavailable(r, "the response body failed"));
            (ResponseBody::failed(error), completion)
        }
        (_, Some(recorder)) if copy.is_over() || copy.has_trailers() => {
            let why = match copy.is_over() {
                true => OVER,
                false => TRAILERS,
            };
            (answer(read), Some(Ending::Unavailable(recorder, why)))
        }
        (_, Some(recorder)) => {
            let body = copy.into_bytes();
            let completion = Ending::Record(recorder, body.clone());
            (ResponseBody::full(body), Some(completion))
        }
        (_, None) => (answer(read), None),
    };
    async move {
        let outcome = match completion {
            None => Outcome::Unavailable,
            Some(Ending::Record(recorder, body)) => match recorder.complete(body).await {
                true => Outcome::Claimed,
                // The handler has still run: it answers, and its claim is kept
                // until the lock expires, so no retry runs it again before.
                false => Outcome::StoreError,
            },
            Some(Ending::Unavailable(recorder, why)) => {
                recorder.unavailable(why).await;
                Outcome::Unavailable
            }
        };
        (body, outcome)
    }
}

/// How a concluded body completes its key.
enum Ending {
    Record(Recording, Bytes),
    Unavailable(Recording, &'static str),
}

/// Reads the rest here, without a task (no runtime, or cancel-on-drop), then
/// [`conclude`]s it.
pub(crate) async fn finish_here<B, X>(rest: Rest<B>) -> (ResponseBody<X>, Outcome)
where
    B: Body,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let Rest {
        mut body,
        mut copy,
        read: mut frames,
        recorder,
    } = rest;
    let end = loop {
        match read_to_end(&mut body, &mut copy, &mut frames).await {
            // Past the limit the frames are still gathered, for the caller.
            Read::Over | Read::Continues => continue,
            end => break end,
        }
    };
    conclude(end, copy, frames, recorder).await
}

/// Why a response over the record limit is completed as "response unavailable".
pub(crate) const OVER: &str = "the response is over the record limit";

/// Why a response with trailers is completed as "response unavailable".
pub(crate) const TRAILERS: &str = "the response has trailers, which a record cannot carry";

/// The answer of a body read whole: its data joined, then its trailers.
pub(crate) fn answer<X>(frames: OneOrMany<Frame<Bytes>>) -> ResponseBody<X> {
    let mut joined = BytesMut::new();
    let mut trailers: Option<HeaderMap> = None;
    for frame in frames {
        match frame.into_data() {
            Ok(data) => joined.extend_from_slice(&data),
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    match &mut trailers {
                        Some(trailers) => trailers.extend(more),
                        None => trailers = Some(more),
                    }
                }
            }
        }
    }
    match trailers {
        None => ResponseBody::full(joined.freeze()),
        Some(trailers) => ResponseBody::trailed(joined.freeze(), trailers),
    }
}
