//! In-process micro-benchmarks (criterion) and the side-by-side table.
//!
//! `cargo bench -p tower-idempotency-bench --ignore-rust-version --bench micro`
//!
//! Runs, in order:
//! 1. the duplicate report: N concurrent duplicates of one key against ours and
//!    each peer (handler runs, answers), and for ours the waiters' delay after
//!    the first answer and the CPU used while they wait;
//! 2. the side-by-side table: every layer variant on the same handler, measured
//!    in interleaved rounds so that the ratios come from one run;
//! 3. criterion: key parsing, RFC 8785 canonicalisation and fingerprint,
//!    MemoryStore operations, and the whole layer for each variant.
//!
//! Environment: `MICRO_ONLY=duplicates|table|criterion` runs one part;
//! `TABLE_ROUNDS` (default 15) and `TABLE_BATCH` (default 20000) size the table.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::Router;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};
use tower_idempotency::fingerprint::canonicalize_json;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::{
    fingerprint::{Fingerprint, RequestFingerprint},
    store::{Begin, RecordKey, Store, StoredResponse},
    IdempotencyKey, IdempotencyLayer, MemoryStore, Scope,
};
use tower_idempotency_bench::*;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

// ---------------------------------------------------------------------------
// The layer variants, each on the same handler.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    NoLayer,
    OursFresh,
    OursFreshInline,
    OursReplay,
    OursReuse409,
    IdempotentFresh,
    IdempotentReplay,
    AxumIdemFresh,
    AxumIdemReplay,
    SessionStackOnly,
}

impl Variant {
    const ALL: [Variant; 10] = [
        Variant::NoLayer,
        Variant::OursFresh,
        Variant::OursFreshInline,
        Variant::OursReplay,
        Variant::OursReuse409,
        Variant::IdempotentFresh,
        Variant::IdempotentReplay,
        Variant::AxumIdemFresh,
        Variant::AxumIdemReplay,
        Variant::SessionStackOnly,
    ];

    fn name(self) -> &'static str {
        match self {
            Variant::NoLayer => "no_layer",
            Variant::OursFresh => "ours/fresh",
            Variant::OursFreshInline => "ours/fresh_cancel_on_drop",
            Variant::OursReplay => "ours/replay",
            Variant::OursReuse409 => "ours/key_reuse_409",
            Variant::IdempotentFresh => "idempotent/fresh",
            Variant::IdempotentReplay => "idempotent/replay",
            Variant::AxumIdemFresh => "axum-idempotent/fresh",
            Variant::AxumIdemReplay => "axum-idempotent/replay",
            Variant::SessionStackOnly => "axum-idempotent-session-stack-only",
        }
    }

    fn fresh(self) -> bool {
        matches!(
            self,
            Variant::OursFresh
                | Variant::OursFreshInline
                | Variant::IdempotentFresh
                | Variant::AxumIdemFresh
        )
    }

    fn expected(self) -> (StatusCode, bool) {
        match self {
            Variant::OursReuse409 => (StatusCode::CONFLICT, false),
            Variant::OursReplay | Variant::IdempotentReplay | Variant::AxumIdemReplay => {
                (StatusCode::CREATED, true)
            }
            _ => (StatusCode::CREATED, false),
        }
    }
}

/// An app for `variant` and what its requests carry. Replay and 409 variants
/// have key "seed-key-0001" completed already. Call inside the runtime.
async fn setup(variant: Variant, body: &Bytes) -> (Router, RequestTemplate) {
    let h = Handler::new();
    let mut template = RequestTemplate::new(body.clone());
    let app = match variant {
        Variant::NoLayer => plain_app(h),
        Variant::OursFresh | Variant::OursReplay | Variant::OursReuse409 => ours_memory_app(h),
        Variant::OursFreshInline => ours_app_with(
            h,
            IdempotencyLayer::new(
                MemoryStore::builder()
                    .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
                    .build(),
            )
            .with_cancel_on_drop(true),
        ),
        Variant::IdempotentFresh | Variant::IdempotentReplay => idempotent_app(h),
        Variant::AxumIdemFresh | Variant::AxumIdemReplay | Variant::SessionStackOnly => {
            let app = axum_idempotent_app(h, variant != Variant::SessionStackOnly);
            template.cookie = Some(establish_session(&app).await);
            app
        }
    };
    if !variant.fresh() && variant != Variant::NoLayer && variant != Variant::SessionStackOnly {
        let (status, _) = send(&app, template.request("seed-key-0001")).await;
        assert_eq!(status, StatusCode::CREATED, "{variant:?} seed");
    }
    (app, template)
}

/// Requests for `n` iterations of `variant`, built before timing.
fn requests(variant: Variant, template: &RequestTemplate, n: u64, run: u64) -> Vec<Request> {
    // The same order in another currency: a different request under the same key.
    let other_body = Bytes::from(String::from_utf8_lossy(&template.body).replacen("USD", "EUR", 1));
    (0..n)
        .map(|i| match variant {
            v if v.fresh() => template.request(&key(&format!("fresh{run}"), i)),
            Variant::OursReuse409 => {
                template.request_with_body("seed-key-0001", other_body.clone())
            }
            Variant::NoLayer | Variant::SessionStackOnly => {
                template.request(&key(&format!("plain{run}"), i))
            }
            _ => template.request("seed-key-0001"),
        })
        .collect()
}

/// Sends every request through `app`; returns the elapsed time.
async fn drive(app: &Router, reqs: Vec<Request>) -> Duration {
    drive_cpu(app, reqs).await.0
}

/// Sends every request through `app`; returns the elapsed wall time and the
/// time this thread spent on a CPU (current-thread runtime: all the work).
async fn drive_cpu(app: &Router, reqs: Vec<Request>) -> (Duration, u64) {
    let cpu = thread_cpu_ns();
    let start = Instant::now();
    for req in reqs {
        black_box(send(app, req).await);
    }
    (start.elapsed(), thread_cpu_ns() - cpu)
}

/// Checks once that `variant` answers as intended (a benchmark of the wrong
/// path would be worthless).
async fn check(variant: Variant, body: &Bytes) {
    let (app, template) = setup(variant, body).await;
    let req = requests(variant, &template, 1, 999).pop().expect("one");
    let got = send(&app, req).await;
    assert_eq!(
        got,
        variant.expected(),
        "{} answered {got:?}",
        variant.name()
    );
}

// ---------------------------------------------------------------------------
// 1. Duplicates.

struct DupOutcome {
    runs: u64,
    statuses: Vec<(StatusCode, usize)>,
    replayed: usize,
    /// Delay of each answer after the first answer, sorted, in nanoseconds.
    after_first_ns: Vec<u64>,
    /// CPU used by the whole process while the handler slept (waiters waiting).
    wait_cpu: Duration,
    wait_window: Duration,
}

async fn duplicates(which: &str, n: usize, delay: Duration) -> DupOutcome {
    let h = Handler::with(delay, 0);
    let body = json_body(1024);
    let mut template = RequestTemplate::new(body);
    let app = match which {
        "ours" => ours_memory_app(h.clone()),
        "idempotent" => idempotent_app(h.clone()),
        "axum-idempotent" => {
            let app = axum_idempotent_app(h.clone(), true);
            template.cookie = Some(establish_session(&app).await);
            app
        }
        _ => unreachable!(),
    };
    let seen = concurrent_duplicates(&app, &template, "dup-key-00000001", n, delay).await;
    let mut statuses: Vec<(StatusCode, usize)> = Vec::new();
    for (status, _) in &seen.answers {
        match statuses.iter_mut().find(|(s, _)| s == status) {
            Some(e) => e.1 += 1,
            None => statuses.push((*status, 1)),
        }
    }
    DupOutcome {
        runs: h.runs(),
        statuses,
        replayed: seen
            .answers
            .iter()
            .filter(|(_, replayed)| *replayed)
            .count(),
        after_first_ns: seen.after_executed_ns,
        wait_cpu: seen.wait_cpu,
        wait_window: seen.wait_window,
    }
}

fn duplicate_report() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "## Concurrent duplicates of one key (handler sleeps, multi-thread runtime, 2 workers)"
    );
    println!(
        "| layer | duplicates | handler delay | handler runs | answers | replayed | answers after the executed one's (p50 / p99 / max) | CPU while waiting |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (n, delay) in [(100, 50), (1000, 500)] {
        for which in ["ours", "idempotent", "axum-idempotent"] {
            let o = rt.block_on(duplicates(which, n, Duration::from_millis(delay)));
            let statuses = o
                .statuses
                .iter()
                .map(|(s, c)| format!("{c}×{}", s.as_u16()))
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "| {which} | {n} | {delay} ms | {} | {statuses} | {} | {:.2} / {:.2} / {:.2} ms | {} ms in {} ms |",
                o.runs,
                o.replayed,
                quantile_us(&o.after_first_ns, 0.5) / 1000.0,
                quantile_us(&o.after_first_ns, 0.99) / 1000.0,
                quantile_us(&o.after_first_ns, 1.0) / 1000.0,
                o.wait_cpu.as_millis(),
                o.wait_window.as_millis(),
            );
        }
    }
    println!();
}

// ---------------------------------------------------------------------------
// 2. Side-by-side table.

fn side_by_side() {
    let rounds: usize = env_or("TABLE_ROUNDS", 15);
    let batch: u64 = env_or("TABLE_BATCH", 20_000);
    let rt = current_thread();
    let body = json_body(1024);
    rt.block_on(async {
        for v in Variant::ALL {
            check(v, &body).await;
        }
    });
    // Interleaved: each round measures every variant once, on a fresh app.
    // Per-request CPU time of the (only) runtime thread, and wall time.
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    for round in 0..rounds {
        for (i, v) in Variant::ALL.iter().enumerate() {
            let (w, cpu) = rt.block_on(async {
                let (app, template) = setup(*v, &body).await;
                // Warm the app (allocator, maps) with a few requests first.
                let warm = requests(*v, &template, 200, 10_000 + round as u64);
                drive(&app, warm).await;
                let reqs = requests(*v, &template, batch, round as u64);
                drive_cpu(&app, reqs).await
            });
            samples[i].push(cpu as f64 / batch as f64);
            wall[i].push(w.as_nanos() as f64 / batch as f64);
        }
    }
    let wall_med: Vec<f64> = wall
        .iter_mut()
        .map(|v| {
            v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            v[v.len() / 2]
        })
        .collect();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
        v[v.len() / 2]
    };
    let med: Vec<f64> = samples.iter_mut().map(median).collect();
    let spread: Vec<(f64, f64)> = samples.iter().map(|v| (v[0], v[v.len() - 1])).collect();
    let base = med[0];
    let at = |v: Variant| med[Variant::ALL.iter().position(|x| *x == v).expect("variant")];
    println!(
        "## Side by side: 1 KiB JSON body, tower::ServiceExt::oneshot through an axum Router, current-thread runtime"
    );
    println!("{rounds} interleaved rounds × {batch} requests per variant; median per request (min–max of rounds) of the runtime thread's CPU time; wall time beside it");
    println!();
    println!("| variant | CPU ns/request | min–max | overhead vs no layer | wall ns/request |");
    println!("|---|---|---|---|---|");
    for (i, v) in Variant::ALL.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0}–{:.0} | {:+.0} ns | {:.0} |",
            v.name(),
            med[i],
            spread[i].0,
            spread[i].1,
            med[i] - base,
            wall_med[i]
        );
    }
    let over = |v: Variant| at(v) - base;
    println!();
    println!("Ratios (same run):");
    for (path, peer, name, ours) in [
        (
            "replay",
            Variant::IdempotentReplay,
            "idempotent",
            Variant::OursReplay,
        ),
        (
            "replay",
            Variant::AxumIdemReplay,
            "axum-idempotent",
            Variant::OursReplay,
        ),
        (
            "fresh",
            Variant::IdempotentFresh,
            "idempotent",
            Variant::OursFresh,
        ),
        (
            "fresh",
            Variant::AxumIdemFresh,
            "axum-idempotent",
            Variant::OursFresh,
        ),
    ] {
        println!(
            "- {path}, {name} / ours: total {:.2}x, overhead {:.2}x",
            at(peer) / at(ours),
            over(peer) / over(ours)
        );
    }
    println!(
        "- running the claimed handler in its own task (spawn per fresh request): {:+.0} ns",
        at(Variant::OursFresh) - at(Variant::OursFreshInline)
    );
    println!(
        "- axum-idempotent without its session stack (minus session-stack-only): fresh {:+.0} ns, replay {:+.0} ns",
        at(Variant::AxumIdemFresh) - at(Variant::SessionStackOnly),
        at(Variant::AxumIdemReplay) - at(Variant::SessionStackOnly)
    );
    println!();
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------
// 3. Criterion.

fn bench_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("key_parse");
    let bare = b"order-7f3a9c2e-5b1d-4e8a-9f00-1234567890ab".as_slice();
    let quoted = b"\"order-7f3a9c2e-5b1d-4e8a-9f00-1234567890ab\"".as_slice();
    g.bench_function("bare_uuid_like", |b| {
        b.iter(|| IdempotencyKey::parse(black_box(bare)))
    });
    g.bench_function("sf_string", |b| {
        b.iter(|| IdempotencyKey::parse(black_box(quoted)))
    });
    g.finish();
}

fn bench_fingerprint(c: &mut Criterion) {
    let key = IdempotencyKey::parse(b"order-7f3a9c2e-5b1d").expect("key");
    let json = HeaderValue::from_static("application/json");
    let octets = HeaderValue::from_static("application/octet-stream");
    let method = http::Method::POST;
    for (label, size) in [("100B", 100), ("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let body = json_body(size);
        let mut g = c.benchmark_group(format!("json_{label}"));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function("canonicalize", |b| {
            b.iter(|| canonicalize_json(black_box(&body)).expect("json"))
        });
        g.bench_function("fingerprint_json", |b| {
            b.iter(|| {
                Fingerprint::compute(&method, ORDERS, &key, TENANT, Some(&json), black_box(&body))
            })
        });
        g.bench_function("fingerprint_raw_bytes", |b| {
            b.iter(|| {
                Fingerprint::compute(
                    &method,
                    ORDERS,
                    &key,
                    TENANT,
                    Some(&octets),
                    black_box(&body),
                )
            })
        });
        g.finish();
    }
}

fn record_key(i: u64) -> RecordKey {
    RecordKey::new(
        Scope::new(TENANT),
        IdempotencyKey::parse(key("store", i).as_bytes()).expect("key"),
    )
}

fn stored_response() -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body: Bytes::from(vec![b'x'; 100]),
    }
}

fn bench_store(c: &mut Criterion) {
    let rt = current_thread();
    let fp = RequestFingerprint::from(Fingerprint::from_bytes([7; 32]));
    let mut g = c.benchmark_group("memory_store");
    g.bench_function("begin_claim+complete", |b| {
        b.iter_custom(|iters| {
            let store = MemoryStore::builder()
                .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
                .build();
            let keys: Vec<RecordKey> = (0..iters).map(record_key).collect();
            let response = stored_response();
            rt.block_on(async {
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
                start.elapsed()
            })
        })
    });
    g.bench_function("begin_claim+release", |b| {
        b.iter_custom(|iters| {
            let store = MemoryStore::builder()
                .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
                .build();
            let keys: Vec<RecordKey> = (0..iters).map(record_key).collect();
            rt.block_on(async {
                let start = Instant::now();
                for k in &keys {
                    let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(k, &fp).await else {
                        panic!("claim")
                    };
                    store.release(k, token).await.expect("release");
                }
                start.elapsed()
            })
        })
    });
    let store = MemoryStore::new();
    let k = record_key(1);
    rt.block_on(async {
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&k, &fp).await else {
            panic!("claim")
        };
        store
            .complete(&k, token, Completion::Response(stored_response()))
            .await
            .expect("complete");
    });
    g.bench_function("begin_replay", |b| {
        b.iter(|| {
            rt.block_on(async {
                let Ok(Begin::Replay(r)) = store.begin(&k, &fp).await else {
                    panic!("replay")
                };
                r
            })
        })
    });
    g.finish();
}

fn bench_layer(c: &mut Criterion) {
    let rt = current_thread();
    let body = json_body(1024);
    let mut g = c.benchmark_group("layer_1KiB_oneshot");
    for v in Variant::ALL {
        rt.block_on(check(v, &body));
        let mut run = 0u64;
        g.bench_function(BenchmarkId::from_parameter(v.name()), |b| {
            b.iter_custom(|iters| {
                run += 1;
                rt.block_on(async {
                    let (app, template) = setup(v, &body).await;
                    let reqs = requests(v, &template, iters, run);
                    drive(&app, reqs).await
                })
            })
        });
    }
    g.finish();
}

/// `MICRO_ONLY=loop LOOP=<what> N=<count>`: runs one operation N times and
/// exits, for `valgrind --tool=callgrind` (instructions per operation =
/// total / N, stable under a loaded machine).
fn profile_loop() {
    let what = std::env::var("LOOP").unwrap_or_default();
    let n: u64 = env_or("N", 10_000);
    let body = json_body(1024);
    let key = IdempotencyKey::parse(b"order-7f3a9c2e-5b1d").expect("key");
    let json = HeaderValue::from_static("application/json");
    let start = Instant::now();
    match what.as_str() {
        "canon_1k" => {
            for _ in 0..n {
                black_box(canonicalize_json(black_box(&body)).expect("json"));
            }
        }
        "fingerprint_1k" => {
            for _ in 0..n {
                black_box(Fingerprint::compute(
                    &http::Method::POST,
                    ORDERS,
                    &key,
                    TENANT,
                    Some(&json),
                    black_box(&body),
                ));
            }
        }
        "store_fresh" | "store_replay" => {
            let rt = current_thread();
            let store = MemoryStore::builder()
                .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
                .build();
            let fp = RequestFingerprint::from(Fingerprint::from_bytes([7; 32]));
            let keys: Vec<RecordKey> = (0..n).map(record_key).collect();
            let response = stored_response();
            rt.block_on(async {
                for k in &keys {
                    let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(k, &fp).await else {
                        panic!("claim")
                    };
                    store
                        .complete(k, token, Completion::Response(response.clone()))
                        .await
                        .expect("complete");
                }
                if what == "store_replay" {
                    let cpu = thread_cpu_ns();
                    for _ in 0..4 {
                        for k in &keys {
                            let Ok(Begin::Replay(r)) = store.begin(k, &fp).await else {
                                panic!("replay")
                            };
                            black_box(r);
                        }
                    }
                    let per = (thread_cpu_ns() - cpu) as f64 / (4 * n) as f64;
                    println!("store_replay: {per:.0} CPU ns per begin (replay)");
                }
            });
        }
        layer => {
            let v = *Variant::ALL
                .iter()
                .find(|v| v.name() == layer)
                .unwrap_or_else(|| panic!("LOOP=canon_1k|fingerprint_1k|<variant name>"));
            let rt = current_thread();
            rt.block_on(async {
                let (app, template) = setup(v, &body).await;
                let reqs = requests(v, &template, n, 1);
                drive(&app, reqs).await
            });
        }
    }
    println!("{what}: {n} in {:?}", start.elapsed());
}

fn main() {
    println!("# micro: {}", machine_line());
    let only = std::env::var("MICRO_ONLY").unwrap_or_default();
    if only == "loop" {
        return profile_loop();
    }
    if only.is_empty() || only == "duplicates" {
        duplicate_report();
    }
    if only.is_empty() || only == "table" {
        side_by_side();
    }
    if only.is_empty() || only == "criterion" {
        let mut c = Criterion::default()
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
            .sample_size(30)
            .configure_from_args();
        bench_key(&mut c);
        bench_fingerprint(&mut c);
        bench_store(&mut c);
        bench_layer(&mut c);
        c.final_summary();
    }
}
