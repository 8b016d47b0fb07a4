//! Growth: per-request cost and memory as the MemoryStore retains 1 thousand,
//! 100 thousand and 1 million records, and the bytes each retained record costs.
//!
//! `cargo bench -p tower-idempotency-bench --ignore-rust-version --bench growth`
//!
//! Records are filled through the whole layer (fresh keys, a handler answering
//! `201` with a 100-byte body), as in production. Memory is counted two ways: a
//! counting global allocator (bytes requested and not yet freed, without the
//! allocator's own overhead) and the process RSS. Costs are measured at two
//! levels: the layer (100-byte JSON request, `oneshot`) and the store alone
//! (`begin`+`complete` of a new key; `begin` of a retained key, i.e. a replay).
//! Layer replays are measured twice: of uniformly random retained keys (the
//! worst case for caches) and of the batch of keys just completed (retries soon
//! after the first attempt, as clients send them).
//!
//! The same app is also served over loopback HTTP (one server thread, one
//! keep-alive connection, requests one at a time): the server thread's CPU per
//! request and the median latency, for fresh keys and replays of random
//! retained keys, i.e. the per-request cost as a client sees it.
//!
//! Every record a measurement adds (fresh keys, the store-alone claims) is in
//! a scope of its own and purged after each round, so each size is measured
//! with its retained records plus at most one round's additions; the table
//! prints the range of records held while measuring.
//!
//! Environment: `GROWTH_SIZES` (1000,100000,1000000), `GROWTH_BATCH` (20000),
//! `GROWTH_ROUNDS` (7), `GROWTH_HTTP_BATCH` (5000 requests per round and kind).

use axum::http::StatusCode;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;
use tower_idempotency::{
    fingerprint::{Fingerprint, RequestFingerprint},
    store::{Begin, RecordKey, Store, StoredResponse},
    IdempotencyKey, MemoryStore, Scope,
};
use tower_idempotency_bench::*;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic permutation-like walk over `0..n` (odd stride mod n).
fn spread(i: u64, n: u64) -> u64 {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1)) % n
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

async fn layer_ns(app: &Router, template: &RequestTemplate, keys: Vec<String>) -> f64 {
    let n = keys.len() as f64;
    let reqs: Vec<_> = keys.iter().map(|k| template.request(k)).collect();
    let start = Instant::now();
    for req in reqs {
        black_box(send(app, req).await);
    }
    start.elapsed().as_nanos() as f64 / n
}

/// The scope of the records a measurement adds (purged after each round).
const ADDED: &str = "growth-added";

fn record_key(prefix: &str, i: u64) -> RecordKey {
    RecordKey::new(
        Scope::new(ADDED),
        IdempotencyKey::parse(key(prefix, i).as_bytes()).expect("key"),
    )
}

/// Serves `app` on a loopback port from its own one-thread runtime (threads
/// named `server`), behind the layer that sets the tenant, as the load
/// harness does.
fn serve(app: Router) -> (SocketAddr, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("server")
        .enable_all()
        .build()
        .expect("server runtime");
    let (tenant, added) = (Scope::new(TENANT), Scope::new(ADDED));
    let app = app.layer(tower::util::MapRequestLayer::new(
        move |mut req: axum::extract::Request| {
            let scope = if req.headers().contains_key("x-added") {
                added.clone()
            } else {
                tenant.clone()
            };
            req.extensions_mut().insert(scope);
            req
        },
    ));
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    rt.spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (addr, rt)
}

/// Sends `keys` one at a time on one keep-alive connection: the server
/// threads' CPU per request (µs) and the median latency (µs).
async fn http_cost(addr: SocketAddr, body: &Bytes, keys: &[String], replayed: bool) -> (f64, f64) {
    let mut sender = connect_http1(addr).await;
    let mut latencies = Vec::with_capacity(keys.len());
    let cpu = threads_cpu_ns("server");
    for key in keys {
        let mut req = http::Request::post(ORDERS)
            .header("content-type", "application/json")
            .header("idempotency-key", key.as_str())
            .body(Full::new(body.clone()))
            .expect("request");
        if !replayed {
            // Fresh keys go to the purged scope.
            req.headers_mut()
                .insert("x-added", http::HeaderValue::from_static("1"));
        }
        let start = Instant::now();
        let response = sender.send_request(req).await.expect("response");
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(
            response.headers().contains_key("idempotent-replayed"),
            replayed
        );
        response.into_body().collect().await.expect("body");
        latencies.push(start.elapsed().as_nanos() as u64);
    }
    let cpu = threads_cpu_ns("server") - cpu;
    latencies.sort_unstable();
    (
        cpu as f64 / 1000.0 / keys.len() as f64,
        quantile_us(&latencies, 0.5),
    )
}

fn main() {
    let sizes: Vec<u64> = std::env::var("GROWTH_SIZES")
        .unwrap_or_else(|_| "1000,100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("GROWTH_SIZES"))
        .collect();
    let batch: u64 = env_or("GROWTH_BATCH", 20_000);
    let rounds: usize = env_or("GROWTH_ROUNDS", 7);
    // Claims' lock deadlines stay queued for the lock timeout (60 s by default)
    // even after completion; a short one shows the steady state, where only the
    // retention deadline remains per record.
    let lock_ms: u64 = env_or("GROWTH_LOCK_MS", 60_000);
    let http_batch: u64 = env_or("GROWTH_HTTP_BATCH", 5_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("# growth: {}", machine_line());
    println!(
        "MemoryStore filled through the layer (100-byte response body); {rounds} rounds × {batch} requests, median"
    );
    println!();
    println!("lock timeout {lock_ms} ms");
    println!();
    println!("| retained records | allocator bytes/record (filled) | allocator bytes/record (after the rounds) | allocations/request | RSS bytes/record | layer fresh ns | layer replay ns (random retained key) | layer replay ns (key of the batch just completed) | store begin+complete ns | store begin (replay) ns | HTTP fresh: server µs / p50 µs | HTTP replay (random retained key): server µs / p50 µs | records held while measuring |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let body = json_body(100);
    let template = RequestTemplate::new(body.clone());
    let mut added_template = RequestTemplate::new(body.clone());
    added_template.scope = Scope::new(ADDED);
    let fp = RequestFingerprint::from(Fingerprint::from_bytes([3; 32]));
    let response = StoredResponse {
        status: StatusCode::CREATED,
        headers: vec![(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        )],
        body: Bytes::from(vec![b'x'; 100]),
    };
    for &n in &sizes {
        let capacity = (n + (batch * 2 + http_batch) * rounds as u64 + 10_000) as usize;
        let store = MemoryStore::builder()
            .with_capacity(NonZeroUsize::new(capacity).unwrap())
            .with_lock_timeout(Duration::from_millis(lock_ms))
            .build();
        let app = ours_app(Handler::with(Duration::ZERO, 100), store.clone());
        // Fill through the layer, measuring what stays allocated.
        let (bytes, allocations, rss) = rt.block_on(async {
            // Warm the runtime, the router and the allocator first.
            for i in 0..100 {
                send(&app, template.request(&key("warm", i))).await;
            }
            let (b0, a0, r0) = (live(), ALLOCATIONS.load(Ordering::Relaxed), rss_bytes());
            let mut done = 0;
            while done < n {
                let chunk = (n - done).min(10_000);
                let reqs: Vec<_> = (done..done + chunk)
                    .map(|i| template.request(&key("fill", i)))
                    .collect();
                for req in reqs {
                    let (status, _) = send(&app, req).await;
                    assert_eq!(status, StatusCode::CREATED);
                }
                done += chunk;
            }
            (
                (live() - b0) as f64 / n as f64,
                (ALLOCATIONS.load(Ordering::Relaxed) - a0) as f64 / n as f64,
                (rss_bytes() as f64 - r0 as f64) / n as f64,
            )
        });
        assert_eq!(store.len() as u64, n + 100);
        let b_filled = live() - (bytes * n as f64) as isize;
        let mut layer_fresh = Vec::new();
        let mut layer_replay = Vec::new();
        let mut layer_retry = Vec::new();
        let mut store_fresh = Vec::new();
        let mut store_replay = Vec::new();
        let (mut held_min, mut held_max) = (usize::MAX, 0);
        let mut note_held = |store: &MemoryStore| {
            held_min = held_min.min(store.len());
            held_max = held_max.max(store.len());
        };
        for round in 0..rounds as u64 {
            rt.block_on(async {
                note_held(&store);
                let fresh: Vec<String> =
                    (0..batch).map(|i| key(&format!("new{round}"), i)).collect();
                layer_fresh.push(layer_ns(&app, &added_template, fresh.clone()).await);
                // Retries soon after the first attempt: the batch just completed.
                layer_retry.push(layer_ns(&app, &added_template, fresh).await);
                let replays: Vec<String> = (0..batch)
                    .map(|i| key("fill", spread(i + round * batch, n)))
                    .collect();
                layer_replay.push(layer_ns(&app, &template, replays).await);
                // The store alone.
                let keys: Vec<RecordKey> = (0..batch)
                    .map(|i| record_key(&format!("st{round}"), i))
                    .collect();
                let start = Instant::now();
                for k in &keys {
                    let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(k, &fp).await else {
                        panic!("claim")
                    };
                    store
                        .complete(k, token, Completion::Response(response.clone()))
                        .await
                        .expect("complete");
                }
                store_fresh.push(start.elapsed().as_nanos() as f64 / batch as f64);
                // Replays of retained (filled) records, spread over the map,
                // with the fingerprint the layer stored.
                let json = http::HeaderValue::from_static("application/json");
                let retained: Vec<RecordKey> = (0..batch)
                    .map(|i| {
                        let k = key("fill", spread(i + round * batch + 7, n));
                        let id = IdempotencyKey::parse(k.as_bytes()).expect("key");
                        RecordKey::new(Scope::new(TENANT), id)
                    })
                    .collect();
                let start = Instant::now();
                for k in &retained {
                    let fp = RequestFingerprint::new(
                        &http::Method::POST,
                        ORDERS,
                        k.key(),
                        TENANT,
                        Some(&json),
                        &body,
                    );
                    let Ok(Begin::Replay(r)) = store.begin(k, &fp).await else {
                        panic!("replay")
                    };
                    black_box(r);
                }
                store_replay.push(start.elapsed().as_nanos() as f64 / batch as f64);
                note_held(&store);
                store.purge_scope(&Scope::new(ADDED)).await.expect("purge");
            });
        }
        // After the rounds (which added records and, through `begin`, evicted
        // due deadlines): live bytes per record held now.
        let held = store.len() as f64 - 100.0;
        let after = (live() - b_filled) as f64 / held;
        // The same app over loopback HTTP.
        let (addr, server_rt) = serve(app.clone());
        let (mut http_fresh, mut http_replay) = (Vec::new(), Vec::new());
        rt.block_on(async {
            let warm: Vec<String> = (0..200).map(|i| key("httpwarm", i)).collect();
            http_cost(addr, &body, &warm, false).await;
            for round in 0..rounds as u64 {
                let fresh: Vec<String> = (0..http_batch)
                    .map(|i| key(&format!("http{round}"), i))
                    .collect();
                note_held(&store);
                http_fresh.push(http_cost(addr, &body, &fresh, false).await);
                let replays: Vec<String> = (0..http_batch)
                    .map(|i| key("fill", spread(i + round * http_batch + 13, n)))
                    .collect();
                http_replay.push(http_cost(addr, &body, &replays, true).await);
                note_held(&store);
                store.purge_scope(&Scope::new(ADDED)).await.expect("purge");
            }
        });
        drop(server_rt);
        let split = |v: Vec<(f64, f64)>| {
            let (cpu, p50): (Vec<f64>, Vec<f64>) = v.into_iter().unzip();
            format!("{:.1} / {:.1}", median(cpu), median(p50))
        };
        println!(
            "| {n} | {bytes:.0} | {after:.0} | {allocations:.1} | {rss:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {held_min}–{held_max} |",
            median(layer_fresh),
            median(layer_replay),
            median(layer_retry),
            median(store_fresh),
            median(store_replay),
            split(http_fresh),
            split(http_replay),
        );
        drop(app);
        drop(store);
    }
}
