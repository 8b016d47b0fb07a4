//! Every fault at every poll on `MemoryStore` (tests/common/faults.rs): a
//! panic, then an error, injected at each poll of the claimed path — the
//! handler, the response body (whole, and trickled so that the layer records
//! it in a task of its own) and every store call — of the layer and of the
//! engine, each followed by the promise's checks.
#![cfg(feature = "test-util")]

use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency_tests::faults::{at_every_poll, engine_run, layer_run};

const LOCK: Duration = Duration::from_millis(400);

fn store() -> MemoryStore {
    MemoryStore::builder().with_lock_timeout(LOCK).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_whole_body_every_fault_at_every_poll() {
    at_every_poll("memory layer, whole body", |plan, what| async move {
        layer_run(&what, store(), plan, false, LOCK).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_trickled_body_every_fault_at_every_poll() {
    at_every_poll("memory layer, trickled body", |plan, what| async move {
        layer_run(&what, store(), plan, true, LOCK).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_every_fault_at_every_poll() {
    at_every_poll("memory engine", |plan, what| async move {
        engine_run(&what, store(), plan, LOCK).await
    })
    .await;
}

/// Memory over time, the in-flight set: ten thousand claimed requests whose
/// handlers succeed, fail, panic, answer an unrecorded status, or are
/// dropped by their caller mid-handler (with and without
/// `with_cancel_on_drop`) leave the in-flight count at zero and the store
/// holding exactly the recorded answers: nothing counted or held for a
/// request that ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_set_returns_to_zero_whatever_the_requests_did() {
    use bytes::Bytes;
    use http::{Request, Response, StatusCode};
    use http_body_util::Full;
    use tower::{Layer, ServiceExt};
    use tower_idempotency::IdempotencyLayer;
    use tower_idempotency_tests::faults::{fresh_key, request};

    for cancel_on_drop in [false, true] {
        let store = store();
        let layer = IdempotencyLayer::new(store.clone()).with_cancel_on_drop(cancel_on_drop);
        let in_flight = layer.in_flight();
        let service = layer.layer(tower::service_fn(|req: Request<Full<Bytes>>| async move {
            let key = req.headers()["idempotency-key"]
                .to_str()
                .unwrap()
                .to_owned();
            let n: usize = key.rsplit('-').next().unwrap().parse().unwrap();
            tokio::task::yield_now().await;
            let status = match n % 5 {
                0 => return Err(std::io::Error::other("failed")),
                1 => panic!("the handler panicked"),
                2 => StatusCode::OK,
                _ => StatusCode::CREATED,
            };
            let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
            *response.status_mut() = status;
            Ok(response)
        }));
        let mut recorded = 0;
        for i in 0..10_000usize {
            let key = format!("{}-{i}", fresh_key("in-flight"));
            let call = service.clone().oneshot(request(&key));
            if i % 5 == 4 {
                // Dropped by its caller after the first poll, mid-handler.
                let mut call = Box::pin(call);
                let _ = futures_poll_once(&mut call).await;
                drop(call);
                recorded += usize::from(!cancel_on_drop);
            } else {
                let _ = tokio::spawn(call).await;
                recorded += usize::from(i % 5 == 3);
            }
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), in_flight.idle())
            .await
            .expect("every claimed request ended");
        assert_eq!(in_flight.count(), 0);
        // A cut handler's release may still be on its way.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
        while store.len() != recorded && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(store.len(), recorded, "cancel_on_drop {cancel_on_drop}");
    }
}

/// Polls `future` once.
async fn futures_poll_once<F: std::future::Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let polled = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx))
    })
    .await;
    match polled {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}
