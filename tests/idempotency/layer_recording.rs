//! Once the handler returned a response to record, its effects have happened:
//! a client that disconnects mid-body, a body that streams without end or is
//! over the record limit must never free the key for a second run. Recorded
//! responses stream to the caller as they are produced.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};

/// Yields one chunk, then never finishes: a response body still being produced.
struct OnceThenPending(bool);

impl Body for OnceThenPending {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.0 {
            Poll::Pending
        } else {
            self.0 = true;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"{\"id\":1")))))
        }
    }
}

fn request() -> Request<Full<Bytes>> {
    let mut req = Request::post("/v1/orders")
        .header("idempotency-key", "record-key-1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    req.extensions_mut().insert(Scope::new("acme"));
    req
}

#[tokio::test]
async fn dropping_the_future_while_recording_keeps_the_claim() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .with_wait_timeout(Duration::ZERO)
        .layer(service_fn(move |_req: Request<Full<Bytes>>| {
            // The order exists once the handler returns; its body is slow to produce.
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let body = OnceThenPending(false);
                Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
            }
        }));
    // The head comes at once (the body streams as it is produced); the client
    // then gives up mid-body.
    let first = tokio::time::timeout(Duration::from_millis(200), svc.clone().oneshot(request()))
        .await
        .expect("the first byte is not delayed until the last")
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    drop(first);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retry = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("idempotency_in_progress"));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );
}

/// An endless event stream (a chat completion, server-sent events).
struct Ticks(u64);

impl Body for Ticks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0 += 1;
        let event = format!("data: tick {:06}\n\n{}", self.0, " ".repeat(200));
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(event)))))
    }
}

/// The handler answers `size` bytes, or with `x-stream` an endless stream.
fn layer_over(
    runs: &Arc<AtomicUsize>,
    layer: IdempotencyLayer,
    size: usize,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<
        tower_idempotency::body::ResponseBody<
            http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>,
        >,
    >,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    let counter = runs.clone();
    layer.layer(service_fn(move |req: Request<Full<Bytes>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        let endless = req.headers().contains_key("x-stream");
        async move {
            let body = if endless {
                Ticks(0).boxed_unsync()
            } else {
                Full::new(Bytes::from(vec![b'x'; size])).boxed_unsync()
            };
            Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
        }
    }))
}

async fn code_of(res: Response<impl Body<Error = impl std::fmt::Debug>>) -> (StatusCode, String) {
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_response_over_the_record_limit_is_delivered_whole_and_never_run_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_record_limit(1024);
    let svc = layer_over(&runs, layer, 10 * 1024);
    let first = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 10 * 1024, "the first caller gets all of it");
    let (status, retry) = code_of(svc.clone().oneshot(request()).await.unwrap()).await;
    assert_eq!(status, StatusCode::GONE);
    assert!(
        retry.contains("idempotency_response_unavailable"),
        "{retry}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An endless recorded stream: headers and the first events arrive at once,
/// nothing is buffered past the limit, and once over it the key answers
/// `410` while the stream still runs.
#[tokio::test]
async fn an_endless_recorded_stream_flows_at_once_and_never_holds_the_key() {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_record_limit(4096);
    let svc = layer_over(&runs, layer, 0);
    let mut req = request();
    req.headers_mut().insert("x-stream", "1".parse().unwrap());
    let first = tokio::time::timeout(Duration::from_secs(1), svc.clone().oneshot(req))
        .await
        .expect("headers at once")
        .unwrap();
    let mut body = first.into_body();
    let mut received = 0;
    while received < 64 * 1024 {
        let frame = body.frame().await.unwrap().unwrap();
        received += frame.into_data().unwrap().len();
    }
    let mut retry = request();
    retry.headers_mut().insert("x-stream", "1".parse().unwrap());
    let (status, text) = code_of(svc.clone().oneshot(retry).await.unwrap()).await;
    assert_eq!(status, StatusCode::GONE, "{text}");
    drop(body); // the client leaves; the recorder stops reading
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The record policy sees the response head: declining an event stream frees
/// the key at once (as any response not recorded), so a retry runs again.
#[tokio::test]
async fn a_record_policy_can_decline_event_streams_by_their_head() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_record_policy(
        |head: &http::response::Parts| {
            head.status == StatusCode::CREATED
                && head
                    .headers
                    .get("content-type")
                    .is_none_or(|v| v != "text/event-stream")
        },
    );
    let svc = layer.layer(service_fn(move |_req: Request<Full<Bytes>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .header("content-type", "text/event-stream")
                    .body(Full::new(Bytes::from_static(b"data: hi\n\n")))
                    .unwrap(),
            )
        }
    }));
    for _ in 0..2 {
        let res = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        assert!(!res.headers().contains_key("idempotent-replayed"));
        res.into_body().collect().await.unwrap();
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "declined: each request runs"
    );
}

/// Serves `steps` as the handler's `201` body through `layer`: the caller
/// gets `expected`, a retry the same bytes replayed, and the handler ran once.
async fn recorded_whole_and_replayed_alike(
    layer: IdempotencyLayer,
    steps: Vec<crate::layer_failures::Step>,
    expected: &str,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = layer.layer(service_fn({
        let runs = runs.clone();
        move |_req: Request<Full<Bytes>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            let body = crate::layer_failures::scripted(steps.clone());
            async move { Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap()) }
        }
    }));
    let (status, first) = code_of(svc.clone().oneshot(request()).await.unwrap()).await;
    assert_eq!((status, first.as_str()), (StatusCode::CREATED, expected));
    let retry = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let (status, replayed) = code_of(retry).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, first));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_of_several_ready_frames_is_recorded_whole_and_replayed_alike() {
    use crate::layer_failures::data;
    // Four frames, each ready when the layer reads the body.
    let chunks = [&b"{\"id\":"[..], b"1", b",\"lines\":[1,2", b",3]}"];
    let layer = IdempotencyLayer::new(MemoryStore::new());
    recorded_whole_and_replayed_alike(
        layer,
        chunks.map(data).into(),
        r#"{"id":1,"lines":[1,2,3]}"#,
    )
    .await;
}

/// With `with_cancel_on_drop(true)` nothing outlives the caller's future, so
/// a body still streaming when the handler answers is read to its end there,
/// recorded, and then answered whole.
#[tokio::test]
async fn with_cancel_on_drop_a_streaming_body_is_read_to_its_end_and_recorded() {
    use crate::layer_failures::{data, Step};
    // The second half comes after a pause: not ready when the layer first reads.
    let steps = vec![
        data(b"{\"id\":1,"),
        Step::Pause(Duration::from_millis(20)),
        data(b"\"lines\":3}"),
    ];
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_cancel_on_drop(true);
    recorded_whole_and_replayed_alike(layer, steps, r#"{"id":1,"lines":3}"#).await;
}

/// A `2xx` the record policy declines says so on the answer itself
/// (`Idempotency-Status: not-recorded`), so that a `200` handler left
/// unprotected by the default policy shows on its first answer, with no
/// tracing subscriber installed; a recorded `201`, its replay and a `4xx`
/// carry nothing.
#[tokio::test]
async fn a_2xx_the_record_policy_declines_is_marked_not_recorded() {
    // `tower_idempotency::idempotency::IDEMPOTENCY_STATUS`, as clients see it.
    const IDEMPOTENCY_STATUS: &str = "idempotency-status";
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    // Answers the status named by the request's `x-status` header.
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service_fn(
        move |req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            let status = req.headers()["x-status"].to_str().unwrap().parse::<u16>();
            async move {
                let status = StatusCode::from_u16(status.unwrap()).unwrap();
                let response = Response::builder().status(status);
                Ok::<_, Infallible>(response.body(Full::new(Bytes::from_static(b"{}"))).unwrap())
            }
        },
    ));
    let send = |key: &'static str, status: &'static str| {
        let mut req = request();
        req.headers_mut()
            .insert("idempotency-key", key.parse().unwrap());
        req.headers_mut()
            .insert("x-status", status.parse().unwrap());
        svc.clone().oneshot(req)
    };

    for run in 1..=2 {
        let ok = send("refund-key-200", "200").await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers().get(IDEMPOTENCY_STATUS).unwrap(),
            "not-recorded"
        );
        assert!(!ok.headers().contains_key("idempotent-replayed"));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            run,
            "not recorded: it runs again"
        );
    }
    let accepted = send("refund-key-202", "202").await.unwrap();
    assert_eq!(
        accepted.headers().get(IDEMPOTENCY_STATUS).unwrap(),
        "not-recorded"
    );

    let created = send("refund-key-201", "201").await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    assert!(
        !created.headers().contains_key(IDEMPOTENCY_STATUS),
        "{created:?}"
    );
    let replay = send("refund-key-201", "201").await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert!(
        !replay.headers().contains_key(IDEMPOTENCY_STATUS),
        "{replay:?}"
    );

    // A handler's `4xx` is not recorded either, as expected of it: no mark.
    let invalid = send("refund-key-422", "422").await.unwrap();
    assert_eq!(invalid.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        !invalid.headers().contains_key(IDEMPOTENCY_STATUS),
        "{invalid:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 5);
}

/// A data frame, then (after a wait, if `wait`) trailers, as a native gRPC
/// answer ends with `grpc-status: 0`.
struct Trailed {
    data: Option<Bytes>,
    wait: bool,
    trailers: Option<http::HeaderMap>,
}

fn trailed(data: Bytes, wait: bool) -> Trailed {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    Trailed {
        data: Some(data),
        wait,
        trailers: Some(trailers),
    }
}

impl Body for Trailed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.wait) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }
}

/// A response that ends with trailers reaches its caller with them, whether
/// read whole, streamed or over the record limit, and with or without
/// `with_cancel_on_drop`. A record cannot carry trailers, so a retry is
/// never given the response without them: it gets `410`, and the handler
/// never runs again.
#[tokio::test]
async fn a_response_with_trailers_reaches_its_caller_with_them_and_is_never_replayed_without() {
    let limit = 1024;
    for cancel_on_drop in [false, true] {
        for wait in [false, true] {
            for size in [16, 4 * limit] {
                let case = format!("cancel on drop: {cancel_on_drop}, wait: {wait}, size: {size}");
                let runs = Arc::new(AtomicUsize::new(0));
                let data = Bytes::from(vec![b'x'; size]);
                let layer = IdempotencyLayer::new(MemoryStore::new())
                    .with_record_limit(limit)
                    .with_cancel_on_drop(cancel_on_drop);
                let svc = layer.layer(service_fn({
                    let (runs, data) = (runs.clone(), data.clone());
                    move |_req: Request<Full<Bytes>>| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let body = trailed(data.clone(), wait);
                        async move {
                            Ok::<_, Infallible>(Response::builder().status(201).body(body).unwrap())
                        }
                    }
                }));
                let first = svc.clone().oneshot(request()).await.unwrap();
                assert_eq!(first.status(), StatusCode::CREATED, "{case}");
                let first = first.into_body().collect().await.unwrap();
                let trailers = first.trailers().cloned();
                assert_eq!(first.to_bytes(), data, "{case}");
                let status = trailers.as_ref().and_then(|t| t.get("grpc-status"));
                assert_eq!(
                    status.map(|v| v.as_bytes()),
                    Some(&b"0"[..]),
                    "{case}: no trailers"
                );
                for _ in 0..2 {
                    let retry = svc.clone().oneshot(request()).await.unwrap();
                    if retry.status() == StatusCode::GONE {
                        let (_, text) = code_of(retry).await;
                        assert!(
                            text.contains("idempotency_response_unavailable"),
                            "{case}: {text}"
                        );
                        continue;
                    }
                    // A replay, if any, must be the whole answer.
                    assert_eq!(retry.status(), StatusCode::CREATED, "{case}");
                    let replayed = retry.into_body().collect().await.unwrap();
                    let trailers = replayed.trailers().cloned();
                    assert_eq!(replayed.to_bytes(), data, "{case}");
                    assert!(
                        trailers.is_some_and(|t| t.get("grpc-status").is_some()),
                        "{case}: replayed without its trailers"
                    );
                }
                assert_eq!(runs.load(Ordering::SeqCst), 1, "{case}: ran again");
            }
        }
    }
}
