//! PostgreSQL: round trips per request (counted), fresh-key throughput next to
//! pgbench running the same statements against the same server, 1000
//! concurrent duplicates, and cost as the table grows.
//!
//! ```sh
//! bench/scripts/with-pg.sh cargo bench -p tower-idempotency-bench --ignore-rust-version --bench pg
//! ```
//!
//! Needs `DATABASE_URL` (the script starts a throwaway cluster with
//! `pg_stat_statements` loaded) and `pgbench` (`PG_BIN`, or found in
//! /usr/lib/postgresql/*/bin).
//!
//! Environment: `PG_SECS` (10), `PG_CLIENTS` (16: the pool size, pgbench -c and
//! the number of concurrent tasks), `PG_GROWTH` (1000,100000,1000000; empty to skip).

use axum::http::StatusCode;
use bytes::Bytes;
use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::{
    fingerprint::{Fingerprint, RequestFingerprint},
    store::{Begin, RecordKey, Store, StoredResponse},
    IdempotencyKey, PostgresStore, Scope,
};
use tower_idempotency_bench::*;

const TABLE: &str = "bench_pg_records";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The store's own `begin` and `complete` statements as a pgbench script:
/// parameters `$1..$7` become `:scope :key :fp` (begin) and `:scope :key
/// :begin_token :status :headers :body :id` (complete); `\gset begin_` keeps the
/// columns of `begin` apart from the inputs.
fn pgbench_script(store: &PostgresStore) -> String {
    let (begin, complete) = store.begin_and_complete_sql();
    let named = |sql: &str, names: &[&str]| {
        // Highest number first, so `$1` never rewrites the start of `$10`.
        names
            .iter()
            .enumerate()
            .rev()
            .fold(sql.to_owned(), |sql, (i, name)| {
                sql.replace(&format!("${}", i + 1), &format!(":{name}"))
            })
    };
    format!(
        "\\set key random(1, 1000000000000000)\n{}\n\\gset begin_\n{};\n",
        named(begin, &["scope", "key", "fp"]),
        named(
            complete,
            &[
                "scope",
                "key",
                "begin_token",
                "status",
                "headers",
                "body",
                "id"
            ]
        ),
    )
}

fn pg_bin() -> String {
    if let Ok(bin) = std::env::var("PG_BIN") {
        return bin;
    }
    let mut dirs: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.last()
        .map(|d| d.join("bin").display().to_string())
        .unwrap_or_default()
}

fn response_body() -> Bytes {
    Bytes::from_static(br#"{"id":"ord_00000001","received":967,"pad":""}"#)
}

fn stored() -> StoredResponse {
    StoredResponse {
        status: StatusCode::CREATED,
        headers: vec![(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        )],
        body: response_body(),
    }
}

/// Runs pgbench with the same statements; returns transactions per second.
fn run_pgbench(url: &str, script_text: &str, clients: usize, secs: u64) -> Option<(f64, String)> {
    let script = std::env::temp_dir().join("tower-idempotency-fresh.pgbench");
    std::fs::write(&script, script_text).ok()?;
    let bin = format!("{}/pgbench", pg_bin());
    let fp = format!("\\x{}", hex(&[7u8; 32]));
    let headers = format!("\\x{}", hex(b"content-type:application/json\r\n"));
    let body = format!("\\x{}", hex(&response_body()));
    let output = Command::new(&bin)
        .args(["-n", "-M", "prepared", "-j", "2"])
        .args(["-c", &clients.to_string(), "-T", &secs.to_string()])
        .args(["-D", &format!("scope={TENANT}")])
        .args(["-D", &format!("fp={fp}")])
        .args(["-D", "status=201"])
        .args(["-D", &format!("headers={headers}")])
        .args(["-D", &format!("body={body}")])
        .args(["-D", "id=0123456789abcdef0123456789abcdef"])
        .arg("-f")
        .arg(&script)
        .arg(url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    let tps = text
        .lines()
        .find(|l| l.starts_with("tps ="))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok());
    match tps {
        Some(tps) => Some((tps, text)),
        None => {
            println!("pgbench failed ({bin}):\n{text}");
            None
        }
    }
}

async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(conn);
    client
}

async fn store(url: &str, pool_size: usize) -> PostgresStore {
    let config: tokio_postgres::Config = url.parse().expect("DATABASE_URL");
    let manager = deadpool_postgres::Manager::new(config.clone(), NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(pool_size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .expect("pool");
    let builder = PostgresStore::builder(pool).with_table(TABLE.parse().unwrap());
    let store = if std::env::var("PG_NO_LISTENER").is_ok() {
        builder.build()
    } else {
        builder.with_listener(config).build()
    };
    store.migrate().await.expect("migrate");
    store
}

/// Statements and calls `pg_stat_statements` saw on the bench table since the
/// last reset, and whether it is available.
async fn statement_calls(db: &tokio_postgres::Client) -> Option<Vec<(i64, i64, String)>> {
    let rows = db
        .query(
            "SELECT queryid, calls, regexp_replace(query, '\\s+', ' ', 'g')
             FROM pg_stat_statements WHERE query LIKE $1 ORDER BY calls DESC",
            &[&format!("%{TABLE}%")],
        )
        .await
        .ok()?;
    Some(
        rows.iter()
            .map(|r| {
                (
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1),
                    r.get::<_, String>(2),
                )
            })
            .collect(),
    )
}

async fn reset_statements(db: &tokio_postgres::Client) {
    let _ = db.execute("SELECT pg_stat_statements_reset()", &[]).await;
}

fn main() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        println!("pg: DATABASE_URL is not set; run through bench/scripts/with-pg.sh");
        return;
    };
    let secs: u64 = env_or("PG_SECS", 10);
    let clients: usize = env_or("PG_CLIENTS", 16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!("# pg: {}", machine_line());
    rt.block_on(async {
        let db = admin(&url).await;
        let version: String = db
            .query_one("SHOW server_version", &[])
            .await
            .expect("version")
            .get(0);
        println!("PostgreSQL {version}; {clients} clients, {secs} s per throughput run");
        let pgss = db
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .is_ok();
        let store = store(&url, clients).await;
        db.batch_execute(&format!("TRUNCATE {TABLE}"))
            .await
            .expect("truncate");

        // 1. Round trips, counted by the store and by pg_stat_statements.
        println!();
        println!("## Round trips per request (through the layer, statement cache warm)");
        let h = Handler::new();
        let app = ours_app(h.clone(), store.clone());
        let template = RequestTemplate::new(json_body(1024));
        for i in 0..(clients as u64 * 4) {
            send(&app, template.request(&key("warm", i))).await;
        }
        let n = 1000u64;
        for (label, prefix) in [("fresh", "rt"), ("replay", "rt")] {
            reset_statements(&db).await;
            let before = store.round_trips();
            for i in 0..n {
                let (status, replayed) = send(&app, template.request(&key(prefix, i))).await;
                assert_eq!(status, StatusCode::CREATED);
                assert_eq!(replayed, label == "replay");
            }
            let per = (store.round_trips() - before) as f64 / n as f64;
            print!("- {label}: {per:.2} statements per request (store counter)");
            if let Some(calls) = statement_calls(&db).await.filter(|_| pgss) {
                let total: i64 = calls.iter().map(|c| c.1).sum();
                println!(
                    "; pg_stat_statements: {:.2} per request ({})",
                    total as f64 / n as f64,
                    calls
                        .iter()
                        .map(|(_, c, q)| format!("{c} × `{}…`", &q[..q.len().min(50)]))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            } else {
                println!();
            }
        }

        // 2. Fresh-key throughput: the store alone, then pgbench, same statements.
        println!();
        println!("## Fresh-key throughput ({clients} concurrent clients, {secs} s each)");
        // A table in use: 100k completed records, analysed. The runs add to it
        // (no TRUNCATE between them: on an emptied table, plans cached by the
        // pooled connections made later runs half as fast).
        let base_rows: u64 = env_or("PG_BASE_ROWS", 100_000);
        db.batch_execute(&format!("TRUNCATE {TABLE}"))
            .await
            .expect("truncate");
        db.batch_execute(&format!(
            "INSERT INTO {TABLE} (scope, key, fingerprint, token, state, created_at, expires_at, status, headers, body)
             SELECT '{TENANT}', 'base-' || lpad(g::text, 12, '0'), '\\x{}'::bytea, g, 'completed', now(),
                    now() + interval '1 day', 201, '\\x{}'::bytea, '\\x{}'::bytea
             FROM generate_series(1, {base_rows}) g",
            hex(&[9; 32]),
            hex(b"content-type:application/json\r\n"),
            hex(&[b'x'; 100]),
        ))
        .await
        .expect("fill");
        db.batch_execute(&format!("VACUUM ANALYZE {TABLE}"))
            .await
            .expect("vacuum");
        println!("- table holds {base_rows} completed records before the first run");
        // Alternating runs (the machine is shared): the median of each side.
        let repeat: usize = env_or("PG_REPEAT", 3);
        let mut ours_runs = Vec::new();
        let mut pgbench_runs = Vec::new();
        let mut store_calls = Vec::new();
        let mut pgbench = None;
        for r in 0..repeat {
            reset_statements(&db).await;
            let done = Arc::new(AtomicU64::new(0));
            let deadline = Instant::now() + Duration::from_secs(secs);
            let tasks: Vec<_> = (0..clients)
                .map(|c| {
                    let store = store.clone();
                    let done = done.clone();
                    tokio::spawn(async move {
                        let fp = RequestFingerprint::from(Fingerprint::from_bytes([7; 32]));
                        let mut i = 0u64;
                        while Instant::now() < deadline {
                            let k = RecordKey::new(
                                Scope::new(TENANT),
                                IdempotencyKey::parse(
                                    format!("tp-{r}-{c:03}-{i:012}").as_bytes(),
                                )
                                .expect("key"),
                            );
                            let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&k, &fp).await else {
                                panic!("claim")
                            };
                            store.complete(&k, token, Completion::Response(stored())).await.expect("complete");
                            done.fetch_add(1, Ordering::Relaxed);
                            i += 1;
                        }
                    })
                })
                .collect();
            let start = Instant::now();
            for t in tasks {
                t.await.expect("task");
            }
            let ours = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
            store_calls = statement_calls(&db).await.unwrap_or_default();
            let diag = db
                .query_one(
                    "SELECT count(*)::bigint, pg_relation_size($1::text::regclass)::bigint, pg_notification_queue_usage() FROM bench_pg_records",
                    &[&TABLE],
                )
                .await
                .expect("diag");
            println!(
                "  (after the run: {} rows, {} bytes of heap, notification queue usage {:.4}, notifications received {})",
                diag.get::<_, i64>(0),
                diag.get::<_, i64>(1),
                diag.get::<_, f64>(2),
                store.notifications_received(),
            );
            let url2 = url.clone();
            let script = pgbench_script(&store);
            pgbench = if std::env::var("PG_SKIP_PGBENCH").is_ok() {
                None
            } else {
                tokio::task::spawn_blocking(move || run_pgbench(&url2, &script, clients, secs))
                    .await
                    .expect("pgbench")
            };
            let tps = pgbench.as_ref().map_or(0.0, |p| p.0);
            println!(
                "- run {}: PostgresStore begin+complete {ours:.0} fresh requests/s; pgbench {tps:.0} transactions/s ({:.1}%)",
                r + 1,
                100.0 * ours / tps
            );
            ours_runs.push(ours);
            pgbench_runs.push(tps);

        }
        let med = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            v[v.len() / 2]
        };
        // Each run's ratio is taken between the two halves of that run, which
        // follow each other: the machine's speed drifts less within a run than
        // between runs.
        let paired: Vec<f64> = ours_runs
            .iter()
            .zip(&pgbench_runs)
            .map(|(ours, tps)| 100.0 * ours / tps)
            .collect();
        let (ours, tps) = (med(ours_runs), med(pgbench_runs));
        println!(
            "- median: PostgresStore {ours:.0} fresh requests/s, pgbench {tps:.0} transactions/s: {:.1}% of pgbench; median of the runs' own ratios {:.1}%",
            100.0 * ours / tps,
            med(paired)
        );
        if let Some((_, text)) = &pgbench {
            for line in text.lines().filter(|l| {
                l.starts_with("latency average") || l.starts_with("number of transactions")
            }) {
                println!("  last pgbench: {line}");
            }
        }
        if let (Some(all), Some((_, text))) =
            (statement_calls(&db).await.filter(|_| pgss), &pgbench)
        {
            // pgbench's executions counted under the query ids of the store's
            // statements show that they are the same statements.
            let transactions: i64 = text
                .lines()
                .find(|l| l.starts_with("number of transactions actually processed"))
                .and_then(|l| l.split(':').nth(1)?.trim().split('/').next()?.parse().ok())
                .unwrap_or(0);
            // pgbench numbers its variables in order of first appearance, so its
            // statements get other query ids; with parameter numbers erased the
            // normalised texts must be equal.
            // pg_stat_statements shows constants as `$n` in the texts it
            // normalised, and as written in texts first seen from an already
            // prepared statement: erase both.
            let erase = |q: &str| {
                let mut out = String::new();
                let mut chars = q.chars().peekable();
                while let Some(c) = chars.next() {
                    if c == '\'' {
                        for d in chars.by_ref() {
                            if d == '\'' {
                                break;
                            }
                        }
                        out.push('$');
                    } else if c == '$' || c.is_ascii_alphanumeric() || c == '_' {
                        let mut word = String::from(c);
                        while let Some(&d) = chars.peek() {
                            if d.is_ascii_alphanumeric() || d == '_' {
                                word.push(d);
                                chars.next();
                            } else {
                                break;
                            }
                        }
                        let constant = word.starts_with('$')
                            || word == "NULL"
                            || word.bytes().all(|b| b.is_ascii_digit());
                        out.push_str(if constant { "$" } else { &word });
                    } else {
                        out.push(c);
                    }
                }
                out
            };
            for (id, calls, query) in &store_calls {
                let twin = all
                    .iter()
                    .find(|a| a.0 != *id && erase(&a.2) == erase(query));
                let same_id = all.iter().find(|a| a.0 == *id).map_or(0, |a| a.1) - calls;
                println!(
                    "- store statement `{}…` ({calls} calls by the store): {}",
                    &query[..query.len().min(50)],
                    match twin {
                        Some(t) => format!(
                            "pgbench ran the same text (parameter numbers and constants aside) {} times for {transactions} transactions",
                            t.1
                        ),
                        None if same_id > 0 => format!(
                            "pgbench's executions were counted under the same query id: {same_id} more calls for {transactions} transactions"
                        ),
                        None => "no pgbench statement with the same text".to_owned(),
                    }
                );
            }
        }
        // Through the layer too (fingerprint of a 1 KiB body on the same 2 CPUs).
        db.batch_execute(&format!("TRUNCATE {TABLE}"))
            .await
            .expect("truncate");
        let done = Arc::new(AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(secs);
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let app = app.clone();
                let template = template.clone();
                let done = done.clone();
                tokio::spawn(async move {
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let (status, _) =
                            send(&app, template.request(&format!("ly-{c:03}-{i:012}"))).await;
                        assert_eq!(status, StatusCode::CREATED);
                        done.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        let start = Instant::now();
        for t in tasks {
            t.await.expect("task");
        }
        let layer = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
        println!("- whole layer in process (oneshot, 1 KiB JSON): {layer:.0} fresh requests/s");

        // 3. 1000 concurrent duplicates.
        println!();
        println!("## 1000 concurrent duplicates (handler sleeps 500 ms)");
        let h = Handler::with(Duration::from_millis(500), 0);
        let app = ours_app(h.clone(), store.clone());
        let notified = store.notifications_received();
        let delay = Duration::from_millis(500);
        let seen = concurrent_duplicates(&app, &template, "pg-dup-key-0001", 1000, delay).await;
        let (wait_cpu, window, after) = (seen.wait_cpu, seen.wait_window, seen.after_executed_ns);
        let replayed = seen.answers.iter().filter(|(_, replayed)| *replayed).count();
        let other = seen
            .answers
            .iter()
            .filter(|(status, _)| *status != StatusCode::CREATED)
            .count();
        println!(
            "- handler runs {}; replayed {replayed}; non-201 {other}; answers after the executed one: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; process CPU while waiting {} ms in {} ms; notifications received {}",
            h.runs(),
            quantile_us(&after, 0.5) / 1000.0,
            quantile_us(&after, 0.99) / 1000.0,
            quantile_us(&after, 1.0) / 1000.0,
            wait_cpu.as_millis(),
            window.as_millis(),
            store.notifications_received() - notified,
        );

        // 4. Growth: cost with 1k / 100k / 1M rows retained.
        let sizes: Vec<u64> = std::env::var("PG_GROWTH")
            .unwrap_or_else(|_| "1000,100000,1000000".into())
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        if !sizes.is_empty() {
            println!();
            println!("## Growth (one client, sequential; rows inserted as completed records)");
            println!("| rows | begin+complete µs (fresh) | begin µs (replay of a random retained row) | table+index size |");
            println!("|---|---|---|---|");
        }
        let fp = RequestFingerprint::from(Fingerprint::from_bytes([9; 32]));
        for &rows in &sizes {
            db.batch_execute(&format!("TRUNCATE {TABLE}"))
                .await
                .expect("truncate");
            db.batch_execute(&format!(
                "INSERT INTO {TABLE} (scope, key, fingerprint, token, state, created_at, expires_at, status, headers, body)
                 SELECT '{TENANT}', 'grow-' || lpad(g::text, 12, '0'), '\\x{}'::bytea, g, 'completed', now(),
                        now() + interval '1 day', 201, '\\x{}'::bytea, '\\x{}'::bytea
                 FROM generate_series(0, {rows} - 1) g",
                hex(&[9; 32]),
                hex(b"content-type:application/json\r\n"),
                hex(&[b'x'; 100]),
            ))
            .await
            .expect("fill");
            db.batch_execute(&format!("VACUUM ANALYZE {TABLE}"))
                .await
                .expect("vacuum");
            let size: String = db
                .query_one(
                    &format!("SELECT pg_size_pretty(pg_total_relation_size('{TABLE}'))"),
                    &[],
                )
                .await
                .expect("size")
                .get(0);
            let m = 2000u64;
            let start = Instant::now();
            for i in 0..m {
                let k = RecordKey::new(
                    Scope::new(TENANT),
                    IdempotencyKey::parse(format!("gnew-{rows}-{i:09}").as_bytes()).expect("key"),
                );
                let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&k, &fp).await else {
                    panic!("claim")
                };
                store.complete(&k, token, Completion::Response(stored())).await.expect("complete");
            }
            let fresh = start.elapsed().as_secs_f64() * 1e6 / m as f64;
            let start = Instant::now();
            for i in 0..m {
                let j = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15 | 1)) % rows;
                let k = RecordKey::new(
                    Scope::new(TENANT),
                    IdempotencyKey::parse(format!("grow-{j:012}").as_bytes()).expect("key"),
                );
                let Ok(Begin::Replay(r)) = store.begin(&k, &fp).await else {
                    panic!("replay")
                };
                black_box(r);
            }
            let replay = start.elapsed().as_secs_f64() * 1e6 / m as f64;
            println!("| {rows} | {fresh:.0} | {replay:.0} | {size} |");
        }
    });
}
