//! With the `metrics` feature: a counter and a latency histogram per outcome,
//! the gauges beside them (claims in flight, waiting duplicates, the near
//! cache's entries, bytes and hit ratio) and the store calls' latency by
//! operation. (Its own test binary: the recorder is process-global; the
//! tests take turns, as the gauges are the whole process's.)
#![cfg(feature = "metrics")]

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use metrics::{Counter, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
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

/// Counts increments and histogram samples per metric name and label set;
/// keeps gauges' values (as `f64` bits).
#[derive(Default)]
struct Counting {
    values: Mutex<HashMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

struct GaugeHandle(Arc<AtomicU64>);

impl GaugeHandle {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |bits| {
                Some(f(f64::from_bits(bits)).to_bits())
            });
    }
}

impl metrics::GaugeFn for GaugeHandle {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
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

fn name(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Counting {
    fn handle(&self, key: &Key) -> Arc<AtomicU64> {
        self.values
            .lock()
            .unwrap()
            .entry(name(key))
            .or_default()
            .clone()
    }
    fn gauge_handle(&self, key: &Key) -> Arc<AtomicU64> {
        let mut gauges = self.gauges.lock().unwrap();
        let zero = || Arc::new(AtomicU64::new(0f64.to_bits()));
        gauges.entry(name(key)).or_insert_with(zero).clone()
    }
    fn gauge(&self, name: &str) -> f64 {
        self.gauges
            .lock()
            .unwrap()
            .get(name)
            .map_or(0.0, |v| f64::from_bits(v.load(Ordering::Acquire)))
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
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(Arc::new(GaugeHandle(self.gauge_handle(key))))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle(self.handle(key))))
    }
}

/// The process's recorder, installed once; the guard makes the tests take turns.
async fn recorder() -> (Arc<Counting>, tokio::sync::MutexGuard<'static, ()>) {
    static RECORDER: OnceLock<Arc<Counting>> = OnceLock::new();
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let turn = TURN.lock().await;
    let recorder = RECORDER.get_or_init(|| {
        let recorder = Arc::new(Counting::default());
        // Global: the layer records from inside futures polled on the runtime.
        metrics::set_global_recorder(RecorderRef(recorder.clone())).expect("first recorder");
        recorder
    });
    (recorder.clone(), turn)
}

#[tokio::test]
async fn counters_and_latency_histogram_per_outcome() {
    let (recorder, _turn) = recorder().await;
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
    let calls = |operation: &str| {
        recorder.get(&format!(
            "tower_idempotency_store_call_duration_seconds{{operation={operation}}}"
        ))
    };
    let total = |outcome: &str| {
        recorder.get(&format!(
            "tower_idempotency_requests_total{{layer=idempotency,outcome={outcome}}}"
        ))
    };
    let replay_duration = || {
        recorder
            .get("tower_idempotency_request_duration_seconds{layer=idempotency,outcome=replayed}")
    };
    // The other tests of this binary count too: what this one adds.
    let before = (
        total("claimed"),
        total("replayed"),
        replay_duration(),
        calls("begin"),
        calls("complete"),
    );
    run.await;
    assert_eq!(
        (total("claimed") - before.0, total("replayed") - before.1),
        (1, 2)
    );
    assert_eq!(replay_duration() - before.2, 2);
    // Every store call is timed, by operation.
    assert_eq!(
        (calls("begin") - before.3, calls("complete") - before.4),
        (3, 1)
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

/// Waits (bounded) until `check` holds: the gauges move inside tasks.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A claimed handler counts in `claims_in_flight` while it runs, and a
/// duplicate in `waiting_duplicates` while it waits for it; both go back
/// when the handler answers and the duplicate replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_in_flight_and_waiting_duplicates_are_gauged() {
    let (recorder, _turn) = recorder().await;
    let release = Arc::new(tokio::sync::Notify::new());
    let handler_release = release.clone();
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .with_wait_timeout(std::time::Duration::from_secs(30))
        .layer(service_fn(move |_req: Request<Full<Bytes>>| {
            let release = handler_release.clone();
            async move {
                release.notified().await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
            }
        }));
    let in_flight = || recorder.gauge("tower_idempotency_claims_in_flight{}");
    let waiting = || recorder.gauge("tower_idempotency_waiting_duplicates{}");
    assert_eq!((in_flight(), waiting()), (0.0, 0.0));

    let first = tokio::spawn(svc.clone().oneshot(request("gauged-key-01", "{}")));
    eventually("the claimed handler is counted", || in_flight() == 1.0).await;
    let duplicate = tokio::spawn(svc.clone().oneshot(request("gauged-key-01", "{}")));
    eventually("the duplicate is counted while it waits", || {
        waiting() == 1.0
    })
    .await;
    assert_eq!(in_flight(), 1.0, "a waiting duplicate is not a claim");

    release.notify_waiters();
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    assert_eq!(duplicate.await.unwrap().unwrap().status(), 201);
    eventually("both gauges are back to zero", || {
        in_flight() == 0.0 && waiting() == 0.0
    })
    .await;
}

/// A shared store's near cache: its entries and bytes are gauged as it
/// fills and empties (a purge), and its lookups as hits and misses with the
/// hit ratio. On PostgreSQL (`DATABASE_URL`, as `scripts/test` sets it).
#[cfg(all(feature = "postgres", feature = "test-util"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_near_cache_is_gauged_by_entries_bytes_and_hit_ratio() {
    use tower_idempotency::store::Maintenance;
    use tower_idempotency_tests::support::pg;

    let Some(url) = pg::database_url("the_near_cache_is_gauged_by_entries_bytes_and_hit_ratio")
    else {
        return;
    };
    let (recorder, _turn) = recorder().await;
    let table = pg::unique_table("near_gauges");
    let store = pg::store(&url, &table, |b| b).await;
    store.start_listener();
    eventually("the listener is up", || store.is_listening()).await;
    let svc = IdempotencyLayer::new(store.clone()).layer(service_fn(
        |_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from_static(b"made")))
                    .unwrap(),
            )
        },
    ));
    let entries = || recorder.gauge("tower_idempotency_near_cache_entries{}");
    let bytes = || recorder.gauge("tower_idempotency_near_cache_bytes{}");
    let ratio = || recorder.gauge("tower_idempotency_near_cache_hit_ratio{}");
    let lookups = |result: &str| {
        recorder.get(&format!(
            "tower_idempotency_near_cache_lookups_total{{result={result}}}"
        ))
    };
    let (entries0, bytes0, hits0, misses0) = (entries(), bytes(), lookups("hit"), lookups("miss"));

    let keys = ["near-gauged-01", "near-gauged-02"];
    for key in keys {
        let answer = svc.clone().oneshot(request(key, "{}")).await.unwrap();
        assert_eq!(answer.status(), 201);
    }
    // Completions are not kept near (most keys are never retried).
    assert_eq!(entries() - entries0, 0.0);
    assert_eq!(lookups("miss") - misses0, 2, "each claim missed first");
    // Each key's first retry reads its record, which is kept: two more
    // entries, and their bytes.
    for key in keys {
        let replay = svc.clone().oneshot(request(key, "{}")).await.unwrap();
        assert_eq!(replay.status(), 201);
    }
    assert_eq!(entries() - entries0, 2.0);
    assert!(
        bytes() - bytes0 >= 2.0 * 160.0,
        "bytes {}",
        bytes() - bytes0
    );
    assert_eq!(lookups("miss") - misses0, 4, "each first retry missed");
    // Further retries are answered from memory: hits.
    for _ in 0..6 {
        let replay = svc
            .clone()
            .oneshot(request("near-gauged-01", "{}"))
            .await
            .unwrap();
        assert_eq!(replay.status(), 201);
    }
    assert_eq!(lookups("hit") - hits0, 6);
    let (hits, misses) = (lookups("hit") as f64, lookups("miss") as f64);
    assert_eq!(ratio(), hits / (hits + misses));
    assert!(ratio() > 0.0 && ratio() <= 1.0);

    // A purge of the scope empties them again.
    store.purge_scope(&Scope::new("merchant_7")).await.unwrap();
    assert_eq!((entries(), bytes()), (entries0, bytes0));
}
