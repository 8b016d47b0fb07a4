//! Once the handler returned a response to record, its effects have happened:
//! a client that disconnects while the body is buffered must not free the key.

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
