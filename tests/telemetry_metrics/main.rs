//! With the `metrics` feature: a counter and a latency histogram per outcome.
//! (Its own test binary: the recorder is process-global.)
#![cfg(feature = "metrics")]

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics::{Counter, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};

fn request(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    req.extensions_mut().insert(Scope::new("merchant_7"));
    req
}

/// Counts increments and histogram samples per metric name and label set.
#[derive(Default)]
struct Counting {
    values: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

struct Handle(Arc<AtomicU64>);

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl metrics::HistogramFn for Handle {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl Counting {
    fn handle(&self, key: &Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        self.values.lock().unwrap().entry(name).or_default().clone()
    }
    fn get(&self, name: &str) -> u64 {
        self.values
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }
}

impl Recorder for Counting {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Handle(self.handle(key))))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle(self.handle(key))))
    }
}

#[tokio::test]
async fn counters_and_latency_histogram_per_outcome() {
    let recorder = Arc::new(Counting::default());
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service_fn(
        |_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        },
    ));
    let run = async {
        svc.clone()
            .oneshot(request("metrics-key-01", "{}"))
            .await
            .unwrap();
        svc.clone()
            .oneshot(request("metrics-key-01", "{}"))
            .await
            .unwrap();
        svc.clone()
            .oneshot(request("metrics-key-01", "{}"))
            .await
            .unwrap();
    };
    // Global: the layer records from inside futures polled on the runtime.
    metrics::set_global_recorder(RecorderRef(recorder.clone())).expect("first recorder");
    run.await;
    let total = |outcome: &str| {
        recorder.get(&format!(
            "tower_idempotency_requests_total{{layer=idempotency,outcome={outcome}}}"
        ))
    };
    assert_eq!((total("claimed"), total("replayed")), (1, 2));
    assert_eq!(
        recorder
            .get("tower_idempotency_request_duration_seconds{layer=idempotency,outcome=replayed}"),
        2
    );
}

struct RecorderRef(Arc<Counting>);

impl Recorder for RecorderRef {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_histogram(k, u, d)
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, m)
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> metrics::Gauge {
        self.0.register_gauge(key, m)
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, m)
    }
}
