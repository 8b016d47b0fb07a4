//! Loopback HTTP load harness: one axum server with the same handler on several
//! routes — no layer, our layer over `MemoryStore`, our layer over
//! `PostgresStore` (when `DATABASE_URL` is set), and the peers `idempotent` 2.0
//! and `axum-idempotent` 0.6 over their in-memory stores (each connection
//! opens its session first, as axum-idempotent needs) — and a closed-loop load
//! generator on hyper's HTTP/1 client, in the same process on separate runtimes.
//!
//! `cargo bench -p tower-idempotency-bench --ignore-rust-version --bench load`
//!
//! Scenarios, each at 1, 16 and 64 keep-alive connections:
//! - `fresh`: every request has a new key (the handler runs every time);
//! - `replay`: each connection cycles through 16 keys it completed beforehand;
//! - `hot`: all connections share one key at a time, a new key every 64
//!   requests, so concurrent duplicates wait for the first and replay.
//!
//! Environment: `LOAD_SECS` (5), `LOAD_CONNS` (1,16,64), `LOAD_SCENARIOS`
//! (fresh,replay,hot), `LOAD_ROUTES` (plain,memory,pg; also `idempotent`,
//! `axum-idempotent`, with the trivial handler; with `REDIS_URL`: `redis`, ours
//! on `RedisStore`, and `idempotent-valkey`, the peer's Valkey store on the same
//! server; with `REDIS_CLUSTER_URLS`: `redis-cluster` and `redis-cluster-acks`,
//! ours on the Cluster without and with `with_replica_acks(1, 1 s)`),
//! `SERVER_THREADS` (1),
//! `CLIENT_THREADS` (1), `PG_POOL` (16), `LOAD_BODY` (1024 bytes of JSON),
//! `LOAD_SERVE=ADDR` (only serve, e.g. for wrk; `LOAD_SERVE_BODY=FILE` writes
//! the request body there, for the client to send), `DATABASE_URL`,
//! `LOAD_ROUNDS` (1): the whole grid is run this many times, the routes in
//! alternating order, and each ratio is taken within a round (the bare route
//! measured seconds before or after the layered one) and reported as the
//! median over rounds, since the machine's speed drifts between cells;
//! `LOAD_HANDLER`: `trivial` (default: reads the body, answers a small JSON),
//! `json` (deserialises the order into typed structs, answers a serialised
//! one), `insert` (`json` plus one `INSERT` into PostgreSQL, as `POST /orders`
//! does; needs `DATABASE_URL`).

use axum::extract::Request;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower_idempotency::{IdempotencyLayer, MemoryStore, PostgresStore, Scope};
use tower_idempotency_bench::realistic::{self, Realistic};
use tower_idempotency_bench::*;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

struct Server {
    addr: SocketAddr,
    handlers: Vec<(String, Arc<Handler>)>,
    pg: Option<PostgresStore>,
}

fn pool(url: &str, pool_size: usize) -> deadpool_postgres::Pool {
    let config: tokio_postgres::Config = url.parse().expect("DATABASE_URL");
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    deadpool_postgres::Pool::builder(manager)
        .max_size(pool_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .expect("pool")
}

async fn pg_store(url: &str, pool_size: usize, table: &str) -> PostgresStore {
    let config: tokio_postgres::Config = url.parse().expect("DATABASE_URL");
    let pool = pool(url, pool_size);
    let store = PostgresStore::builder(pool.clone())
        .with_table(table.parse().unwrap())
        .with_listener(config)
        .build();
    store.migrate().await.expect("migrate");
    let client = pool.get().await.expect("connection");
    client
        .batch_execute(&format!("TRUNCATE {}", store.table()))
        .await
        .expect("truncate");
    store
}

async fn start_server(bind: &str, routes: &[String], handler_kind: &str) -> Server {
    let mut app = Router::new();
    let mut handlers = Vec::new();
    let mut pg = None;
    let orders_pool = match handler_kind {
        "trivial" | "json" => None,
        "insert" => {
            let url =
                std::env::var("DATABASE_URL").expect("LOAD_HANDLER=insert needs DATABASE_URL");
            let pool = pool(&url, env_or("PG_POOL", 16));
            realistic::prepare_orders_table(&pool).await;
            Some(pool)
        }
        other => panic!("unknown LOAD_HANDLER {other}"),
    };
    for route in routes {
        let h = Handler::new();
        // The same handler on every route; only the layer in front differs.
        let handler_app = || match handler_kind {
            "trivial" => None,
            _ => Some(realistic::app(Arc::new(Realistic {
                handler: h.clone(),
                pool: orders_pool.clone(),
            }))),
        };
        let sub = match route.as_str() {
            "plain" => handler_app().unwrap_or_else(|| plain_app(h.clone())),
            "memory" => match handler_app() {
                None => ours_memory_app(h.clone()),
                Some(app) => app.route_layer(IdempotencyLayer::new(
                    MemoryStore::builder()
                        .with_capacity(NonZeroUsize::new(50_000_000).unwrap())
                        .build(),
                )),
            },
            "pg" => {
                let Ok(url) = std::env::var("DATABASE_URL") else {
                    println!("(route pg skipped: DATABASE_URL is not set)");
                    continue;
                };
                let store = pg_store(&url, env_or("PG_POOL", 16), "bench_load_records").await;
                pg = Some(store.clone());
                match handler_app() {
                    None => ours_app(h.clone(), store),
                    Some(app) => app.route_layer(IdempotencyLayer::new(store)),
                }
            }
            "redis" | "idempotent-valkey" | "redis-cluster" | "redis-cluster-acks"
                if handler_kind != "trivial" =>
            {
                println!("(route {route} skipped: Redis routes use the trivial handler)");
                continue;
            }
            "redis" | "idempotent-valkey" => {
                let Ok(url) = std::env::var("REDIS_URL") else {
                    println!("(route {route} skipped: REDIS_URL is not set)");
                    continue;
                };
                let prefix = format!("bench-load-{}", std::process::id());
                if route == "redis" {
                    let store = tower_idempotency::RedisStore::builder()
                        .with_prefix(prefix.parse().unwrap())
                        .connect(&url)
                        .await
                        .expect("Redis");
                    ours_app(h.clone(), store)
                } else {
                    idempotent_valkey_app(h.clone(), &url, &prefix).await
                }
            }
            "redis-cluster" | "redis-cluster-acks" => {
                let Ok(urls) = std::env::var("REDIS_CLUSTER_URLS") else {
                    println!("(route {route} skipped: REDIS_CLUSTER_URLS is not set)");
                    continue;
                };
                let nodes: Vec<&str> = urls.split(',').collect();
                let builder = tower_idempotency::RedisStore::builder().with_prefix(
                    format!("bench-{route}-{}", std::process::id())
                        .parse()
                        .unwrap(),
                );
                let builder = match route.as_str() {
                    "redis-cluster-acks" => builder.with_replica_acks(1, Duration::from_secs(1)),
                    _ => builder,
                };
                let store = builder
                    .connect_cluster(&nodes)
                    .await
                    .expect("Redis Cluster");
                ours_app(h.clone(), store)
            }
            "idempotent" | "axum-idempotent" if handler_kind != "trivial" => {
                println!("(route {route} skipped: peers are measured with the trivial handler)");
                continue;
            }
            "idempotent" => idempotent_app(h.clone()),
            "axum-idempotent" => axum_idempotent_app(h.clone(), true),
            other => panic!("unknown route {other}"),
        };
        app = app.nest(&format!("/{route}"), sub);
        handlers.push((route.clone(), h));
    }
    // The auth layer every route shares: the tenant as a request extension.
    let scope = Scope::new(TENANT);
    let app = app.layer(tower::util::MapRequestLayer::new(
        move |mut req: Request| {
            req.extensions_mut().insert(scope.clone());
            req
        },
    ));
    let listener = tokio::net::TcpListener::bind(bind).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    Server { addr, handlers, pg }
}

#[derive(Default)]
struct Tally {
    latencies_ns: Vec<u64>,
    created: u64,
    replayed: u64,
    other: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Fresh,
    Replay,
    Hot,
}

const REPLAY_KEYS: u64 = 16;
const HOT_PER_KEY: u64 = 64;

#[allow(clippy::too_many_arguments)]
async fn connection(
    addr: SocketAddr,
    path: String,
    scenario: Scenario,
    run: u64,
    conn: u64,
    body: Bytes,
    hot: Arc<AtomicU64>,
    start: Arc<tokio::sync::Barrier>,
    secs: Duration,
) -> Tally {
    let mut sender = connect_http1(addr).await;
    // axum-idempotent keys its records by session: open one on this connection.
    let cookie = match path.strip_suffix(ORDERS) {
        Some(prefix @ "/axum-idempotent") => {
            let req = http::Request::post(format!("{prefix}/session"))
                // Its layer wants a key on every request, this one included.
                .header("idempotency-key", format!("session-open-{run}-{conn}"))
                .body(Full::new(Bytes::new()))
                .expect("request");
            let response = sender.send_request(req).await.expect("session");
            let cookie = response
                .headers()
                .get_all(http::header::SET_COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find(|v| v.starts_with("session="))
                .and_then(|v| v.split(';').next())
                .expect("a session cookie")
                .to_owned();
            response.into_body().collect().await.expect("body");
            Some(cookie)
        }
        _ => None,
    };
    let mut tally = Tally::default();
    let mut send = |key: String| {
        let mut req = http::Request::post(&path)
            .header("content-type", "application/json")
            .header("idempotency-key", key);
        if let Some(cookie) = &cookie {
            req = req.header(http::header::COOKIE, cookie.as_str());
        }
        let req = req.body(Full::new(body.clone())).expect("request");
        let fut = sender.send_request(req);
        async move {
            let response = fut.await.expect("response");
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed")
                || response.headers().contains_key("idempotency-replayed");
            response.into_body().collect().await.expect("body");
            (status, replayed)
        }
    };
    if scenario == Scenario::Replay {
        for i in 0..REPLAY_KEYS {
            send(format!("rep-{run}-{conn}-{i:04}")).await;
        }
    }
    start.wait().await;
    let deadline = Instant::now() + secs;
    let mut i = 0u64;
    while Instant::now() < deadline {
        let key = match scenario {
            Scenario::Fresh => format!("fr-{run}-{conn}-{i:09}"),
            Scenario::Replay => format!("rep-{run}-{conn}-{:04}", i % REPLAY_KEYS),
            Scenario::Hot => format!(
                "hot-{run}-{:09}",
                hot.fetch_add(1, Ordering::Relaxed) / HOT_PER_KEY
            ),
        };
        let t = Instant::now();
        let (status, replayed) = send(key).await;
        tally.latencies_ns.push(t.elapsed().as_nanos() as u64);
        match (status.as_u16(), replayed) {
            (201, false) => tally.created += 1,
            (201, true) => tally.replayed += 1,
            _ => tally.other += 1,
        }
        i += 1;
    }
    tally
}

struct Row {
    round: usize,
    route: String,
    scenario: &'static str,
    conns: u64,
    rps: f64,
    p50: f64,
    p99: f64,
    tally: Tally,
    handler_runs: u64,
    /// Server threads' CPU per request, µs.
    server_cpu_us: f64,
}

fn main() {
    let secs = Duration::from_secs_f64(env_or("LOAD_SECS", 5.0));
    let conns: Vec<u64> = env_list("LOAD_CONNS", "1,16,64")
        .iter()
        .map(|c| c.parse().expect("LOAD_CONNS"))
        .collect();
    let scenarios = env_list("LOAD_SCENARIOS", "fresh,replay,hot");
    let routes = env_list("LOAD_ROUTES", "plain,memory,pg");
    let body = json_body(env_or("LOAD_BODY", 1024));
    let handler_kind = std::env::var("LOAD_HANDLER").unwrap_or_else(|_| "trivial".into());
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("SERVER_THREADS", 1))
        .thread_name("server")
        .enable_all()
        .build()
        .expect("server runtime");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("CLIENT_THREADS", 1))
        .thread_name("client")
        .enable_all()
        .build()
        .expect("client runtime");

    if let Ok(bind) = std::env::var("LOAD_SERVE") {
        let server = server_rt.block_on(start_server(&bind, &routes, &handler_kind));
        if let Ok(path) = std::env::var("LOAD_SERVE_BODY") {
            std::fs::write(path, &body).expect("LOAD_SERVE_BODY");
        }
        println!(
            "serving on http://{} (routes /<route>/v1/orders)",
            server.addr
        );
        server_rt.block_on(std::future::pending::<()>());
        return;
    }

    let server = server_rt.block_on(start_server("127.0.0.1:0", &routes, &handler_kind));
    println!("# load: {}", machine_line());
    println!(
        "handler {handler_kind}, server threads {}, client threads {}, {} s per cell, {}-byte JSON body, routes {:?}",
        env_or("SERVER_THREADS", 1),
        env_or("CLIENT_THREADS", 1),
        secs.as_secs_f64(),
        body.len(),
        server.handlers.iter().map(|h| &h.0).collect::<Vec<_>>()
    );
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    let mut rows: Vec<Row> = Vec::new();
    let mut run = 0u64;
    let rounds: usize = env_or("LOAD_ROUNDS", 1);
    for round in 0..rounds {
        for &n in &conns {
            for scenario_name in &scenarios {
                let scenario = match scenario_name.as_str() {
                    "fresh" => Scenario::Fresh,
                    "replay" => Scenario::Replay,
                    "hot" => Scenario::Hot,
                    other => panic!("unknown scenario {other}"),
                };
                // Alternating order, so that neither route always runs first.
                let ordered: Vec<_> = if round % 2 == 0 {
                    server.handlers.iter().collect()
                } else {
                    server.handlers.iter().rev().collect()
                };
                for (route, handler) in ordered {
                    // Without the layer the key is ignored: one scenario is enough.
                    if route == "plain" && scenario != Scenario::Fresh {
                        continue;
                    }
                    run += 1;
                    let runs_before = handler.runs();
                    let server_cpu = threads_cpu_ns("server");
                    let rt_before = server.pg.as_ref().map(|p| p.round_trips());
                    let path = format!("/{route}{ORDERS}");
                    let start = Arc::new(tokio::sync::Barrier::new(n as usize + 1));
                    let hot = Arc::new(AtomicU64::new(0));
                    let begun = client_rt.block_on(async {
                        let tasks: Vec<_> = (0..n)
                            .map(|c| {
                                tokio::spawn(connection(
                                    server.addr,
                                    path.clone(),
                                    scenario,
                                    run_id * 1000 + run,
                                    c,
                                    body.clone(),
                                    hot.clone(),
                                    start.clone(),
                                    secs,
                                ))
                            })
                            .collect();
                        start.wait().await;
                        let begun = Instant::now();
                        let mut total = Tally::default();
                        for t in tasks {
                            let t = t.await.expect("connection");
                            total.latencies_ns.extend(t.latencies_ns);
                            total.created += t.created;
                            total.replayed += t.replayed;
                            total.other += t.other;
                        }
                        (total, begun.elapsed())
                    });
                    let (mut tally, elapsed) = begun;
                    let server_cpu = threads_cpu_ns("server") - server_cpu;
                    tally.latencies_ns.sort_unstable();
                    let count = tally.latencies_ns.len() as f64;
                    let row = Row {
                        round,
                        route: route.clone(),
                        scenario: match scenario {
                            Scenario::Fresh => "fresh",
                            Scenario::Replay => "replay",
                            Scenario::Hot => "hot",
                        },
                        conns: n,
                        rps: count / elapsed.as_secs_f64(),
                        p50: quantile_us(&tally.latencies_ns, 0.5),
                        p99: quantile_us(&tally.latencies_ns, 0.99),
                        handler_runs: handler.runs() - runs_before,
                        server_cpu_us: server_cpu as f64
                            / 1000.0
                            / (tally.latencies_ns.len().max(1) as f64),
                        tally,
                    };
                    let pg_note = match (rt_before, server.pg.as_ref()) {
                        (Some(before), Some(pg)) if route == "pg" => format!(
                            " pg round trips/request {:.2}",
                            (pg.round_trips() - before) as f64 / count.max(1.0)
                        ),
                        _ => String::new(),
                    };
                    println!(
                    "{:>6} {:>6} conns={:<3} {:>9.0} req/s  p50 {:>8.1} µs  p99 {:>8.1} µs  server CPU {:>5.1} µs/req  201 {} replayed {} other {} handler runs {}{pg_note}",
                    row.route,
                    row.scenario,
                    row.conns,
                    row.rps,
                    row.p50,
                    row.p99,
                    row.server_cpu_us,
                    row.tally.created,
                    row.tally.replayed,
                    row.tally.other,
                    row.handler_runs,
                );
                    rows.push(row);
                }
            }
        }
    }
    println!();
    println!("| round | route | scenario | connections | requests/s | p50 µs | p99 µs | server CPU µs/request | answers (new / replayed / other) | handler runs |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {} / {} / {} | {} |",
            r.round + 1,
            r.route,
            r.scenario,
            r.conns,
            r.rps,
            r.p50,
            r.p99,
            r.server_cpu_us,
            r.tally.created,
            r.tally.replayed,
            r.tally.other,
            r.handler_runs
        );
    }
    println!();
    // Ours against each peer, the same scenario and connections, per round.
    for &n in &conns {
        for scenario in ["fresh", "replay", "hot"] {
            for (ours_route, peer) in [
                ("memory", "idempotent"),
                ("memory", "axum-idempotent"),
                ("redis", "idempotent-valkey"),
                ("redis", "pg"),
                ("redis-cluster", "redis-cluster-acks"),
            ] {
                let mut ratios: Vec<f64> = Vec::new();
                for round in 0..rounds {
                    let cell = |route: &str| {
                        rows.iter().find(|r| {
                            r.round == round
                                && r.route == route
                                && r.scenario == scenario
                                && r.conns == n
                        })
                    };
                    if let (Some(ours), Some(theirs)) = (cell(ours_route), cell(peer)) {
                        ratios.push(ours.rps / theirs.rps);
                    }
                }
                if ratios.is_empty() {
                    continue;
                }
                ratios.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
                println!(
                    "{n} conns: {scenario}: {ours_route} / {peer} requests/s = {:.2}x (median of {} rounds)",
                    ratios[ratios.len() / 2],
                    ratios.len()
                );
            }
        }
    }
    println!();
    for &n in &conns {
        for route in ["memory", "pg"] {
            for scenario in ["fresh", "replay", "hot"] {
                // (requests/s ratio, server CPU of the route, of the bare route) per round.
                let mut paired: Vec<(f64, f64, f64)> = Vec::new();
                for round in 0..rounds {
                    let cell = |route: &str, scenario: &str| {
                        rows.iter().find(|r| {
                            r.round == round
                                && r.route == route
                                && r.scenario == scenario
                                && r.conns == n
                        })
                    };
                    if let (Some(plain), Some(v)) = (cell("plain", "fresh"), cell(route, scenario))
                    {
                        paired.push((v.rps / plain.rps, v.server_cpu_us, plain.server_cpu_us));
                    }
                }
                if paired.is_empty() {
                    continue;
                }
                let median = |mut v: Vec<f64>| {
                    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
                    v[v.len() / 2]
                };
                let ratios: Vec<f64> = paired.iter().map(|p| 100.0 * p.0).collect();
                let listed = ratios
                    .iter()
                    .map(|r| format!("{r:.1}%"))
                    .collect::<Vec<_>>()
                    .join(", ");
                println!(
                    "{n} conns: {route} {scenario} = {:.1}% of the no-layer route's requests/s (median of {} rounds: {listed}); server CPU per request {:.1} vs {:.1} µs (medians)",
                    median(ratios.clone()),
                    paired.len(),
                    median(paired.iter().map(|p| p.1).collect()),
                    median(paired.iter().map(|p| p.2).collect()),
                );
            }
        }
    }
}
