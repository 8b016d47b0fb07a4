//! The application's cost per request on `RedisStore` next to `idempotent`'s
//! Valkey store, in process (no HTTP): allocations and bytes allocated by a
//! counting allocator, the store's round trips, the commands Redis ran
//! (`INFO commandstats`, scripts' calls included) and its CPU, the
//! process's CPU and wall time, on a
//! current-thread runtime, so that the connections' own tasks are counted
//! too. Deterministic but for the timing; for instruction counts run one
//! route and scenario under `valgrind --tool=callgrind
//! --toggle-collect=*redis_cost::measured*` and divide by `COST_REQUESTS`.
//!
//! `bench/scripts/with-redis.sh cargo bench -p tower-idempotency-bench --ignore-rust-version --bench redis_cost`
//!
//! Environment: `REDIS_URL`, `COST_REQUESTS` (2000), `COST_ROUTES`
//! (redis,idempotent-valkey), `COST_SCENARIOS` (fresh,replay),
//! `COST_CONCURRENCY` (1: requests one after the other), `COST_RUNTIME`
//! (`current`; `multi`: one worker thread, as the load bench), `LOAD_BODY`
//! (1024 bytes of JSON), `COST_NEAR_CACHE` (1: ours keeps the records it reads
//! near, as by default; 0: every replay asks Redis; any other number: a near
//! cache of that many bytes instead of the default 16 MiB, to measure one
//! at capacity).

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tower::ServiceExt;
use tower_idempotency::{RedisStore, Scope};
use tower_idempotency_bench::*;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn request(key: &str, body: &Bytes) -> Request {
    let mut req = http::Request::post(ORDERS)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.clone()))
        .expect("request");
    // As the auth layer of the load bench: the tenant as an extension.
    req.extensions_mut().insert(Scope::new(TENANT));
    req
}

async fn send(app: &Router, req: Request) -> (u16, bool) {
    let response = app.clone().oneshot(req).await.expect("infallible");
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed")
        || response.headers().contains_key("idempotency-replayed");
    std::hint::black_box(response.into_body().collect().await.expect("body"));
    (status, replayed)
}

/// The server's `INFO`: (commands run, scripts' calls included; CPU seconds).
fn server_stats(url: &str) -> (u64, f64) {
    let out = std::process::Command::new("redis-cli")
        .args(["-u", url, "INFO", "all"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut calls = 0;
    let mut cpu = 0.0;
    for line in out.lines() {
        if line.starts_with("cmdstat_") {
            calls += line
                .split(&[':', ','][..])
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0);
        } else if let Some(v) = line
            .strip_prefix("used_cpu_user:")
            .or_else(|| line.strip_prefix("used_cpu_sys:"))
        {
            cpu += v.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    (calls, cpu)
}

/// Serves `reqs` on `concurrency` tasks, each its share one after the other;
/// what callgrind's toggle names.
#[inline(never)]
fn measured(
    rt: &tokio::runtime::Runtime,
    app: &Router,
    reqs: Vec<Request>,
    concurrency: usize,
) -> (u64, u64) {
    rt.block_on(async {
        let mut shares: Vec<Vec<Request>> = (0..concurrency).map(|_| Vec::new()).collect();
        for (i, req) in reqs.into_iter().enumerate() {
            shares[i % concurrency].push(req);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for share in shares {
            let app = app.clone();
            tasks.spawn(async move {
                let (mut created, mut replayed) = (0, 0);
                for req in share {
                    match send(&app, req).await {
                        (201, false) => created += 1,
                        (201, true) => replayed += 1,
                        other => panic!("unexpected answer {other:?}"),
                    }
                }
                (created, replayed)
            });
        }
        let (mut created, mut replayed) = (0, 0);
        while let Some(done) = tasks.join_next().await {
            let (c, r) = done.expect("task");
            created += c;
            replayed += r;
        }
        (created, replayed)
    })
}

fn main() {
    let Ok(url) = std::env::var("REDIS_URL") else {
        println!("redis_cost: REDIS_URL is not set (run under bench/scripts/with-redis.sh)");
        return;
    };
    let n: u64 = std::env::var("COST_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let near = std::env::var("COST_NEAR_CACHE").map_or(true, |v| v != "0");
    let concurrency: usize = std::env::var("COST_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let body = json_body(
        std::env::var("LOAD_BODY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024),
    );
    // `COST_RUNTIME=multi`: one worker thread, as the load bench's server.
    let rt = match std::env::var("COST_RUNTIME").as_deref() {
        Ok("multi") => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
    .expect("runtime");
    println!(
        "## Application cost per request, in process, {n} requests on {concurrency} tasks, {}-byte JSON body, near cache {}",
        body.len(),
        if near { "on" } else { "off" }
    );
    println!();
    println!("| route | scenario | allocations | bytes allocated | round trips | Redis commands | application CPU µs | Redis CPU µs | µs (wall) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    for route in env_list("COST_ROUTES", "redis,idempotent-valkey") {
        let prefix = format!("bench-cost-{}-{run}", std::process::id());
        let mut ours = None;
        let app = rt.block_on(async {
            match route.as_str() {
                "redis" => {
                    let mut builder = RedisStore::builder().with_prefix(prefix.parse().unwrap());
                    if !near {
                        builder = builder
                            .with_near_cache(tower_idempotency::store::NearCache::disabled());
                    } else if let Some(bytes) = std::env::var("COST_NEAR_CACHE")
                        .ok()
                        .and_then(|v| v.parse::<usize>().ok())
                        .filter(|b| *b > 1)
                    {
                        builder = builder
                            .with_near_cache(tower_idempotency::store::NearCache::new(bytes));
                    }
                    let store = builder.connect(&url).await.expect("Redis");
                    ours = Some(store.clone());
                    ours_app(Handler::new(), store)
                }
                "idempotent-valkey" => idempotent_valkey_app(Handler::new(), &url, &prefix).await,
                other => panic!("unknown route {other}"),
            }
        });
        for scenario in env_list("COST_SCENARIOS", "fresh,replay") {
            let key = |i: u64| match scenario.as_str() {
                "fresh" => format!("fr-{run}-{i:09}"),
                "replay" => format!("rep-{run}-{:04}", i % 16),
                other => panic!("unknown scenario {other}"),
            };
            // Warm-up (and the replayed keys completed).
            let warm: Vec<_> = (0..200)
                .map(|i| request(&key(1_000_000 + i), &body))
                .collect();
            let warm = if scenario == "replay" {
                (0..16).map(|i| request(&key(i), &body)).collect()
            } else {
                warm
            };
            measured(&rt, &app, warm, 1);
            let reqs: Vec<_> = (0..n).map(|i| request(&key(i), &body)).collect();
            let trips = ours.as_ref().map(RedisStore::round_trips);
            let (a0, b0) = (
                ALLOCS.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
            );
            let (calls0, server0) = server_stats(&url);
            let cpu0 = threads_cpu_ns("");
            let t = Instant::now();
            let (created, replayed) = measured(&rt, &app, reqs, concurrency);
            let wall = t.elapsed();
            let cpu = threads_cpu_ns("") - cpu0;
            let (a1, b1) = (
                ALLOCS.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
            );
            let (calls1, server1) = server_stats(&url);
            match scenario.as_str() {
                "fresh" => assert_eq!(created, n, "{route}"),
                _ => assert_eq!(replayed, n, "{route}"),
            }
            let trips = match (trips, ours.as_ref()) {
                (Some(before), Some(store)) => {
                    format!("{:.2}", (store.round_trips() - before) as f64 / n as f64)
                }
                _ => "–".to_owned(),
            };
            println!(
                "| {route} | {scenario} | {:.1} | {:.0} | {trips} | {:.2} | {:.1} | {:.1} | {:.1} |",
                (a1 - a0) as f64 / n as f64,
                (b1 - b0) as f64 / n as f64,
                // The second INFO counts itself.
                (calls1 - calls0).saturating_sub(1) as f64 / n as f64,
                cpu as f64 / 1000.0 / n as f64,
                (server1 - server0) * 1e6 / n as f64,
                wall.as_secs_f64() * 1e6 / n as f64,
            );
        }
    }
}
