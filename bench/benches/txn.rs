//! Transactional mode against plain mode and against the bare handler on a
//! durable PostgreSQL: a fresh request whose handler writes one order row,
//! mounted as users mount it (axum `Router`, `route_layer`, a 1 KiB unsorted
//! JSON body).
//!
//! - bare: no layer; the handler runs its INSERT in a transaction of its own
//!   (`client.transaction()`, `execute`, `commit`), as it would without us;
//! - plain: `IdempotencyLayer::new(store)`, the handler commits its own INSERT
//!   on the application's pool;
//! - transactional: `IdempotencyLayer::transactional(store)`, the handler's
//!   INSERT goes through the layer's transaction and commits with the record.
//!
//! ```sh
//! PG_DURABLE=1 bench/scripts/with-pg.sh \
//!   cargo bench -p tower-idempotency-bench --ignore-rust-version --bench txn
//! ```
//!
//! `TXN_HANDLER=payment` swaps the one-row handler for a payments-shaped one,
//! in the same transaction: `SELECT` the account's balance `FOR UPDATE`,
//! `INSERT` the payment row, `UPDATE` the balance (one of 10 000 accounts,
//! chosen by the key's hash, so clients seldom wait for each other's row).
//!
//! After each round with the layer, every key it completed (up to 2 000 per
//! client) is retried once, as a client whose answer was lost would: the
//! retries' requests/s, p50 and p99, and the store's round trips per retry
//! are printed on a line of their own.
//!
//! `PG_DURABLE=1` keeps the server's defaults (`fsync` and `synchronous_commit`
//! on), so a commit costs a WAL flush. Environment: `TXN_SECS` (5 per round),
//! `TXN_ROUNDS` (3, rotating the modes' order), `TXN_CLIENTS` (`1,16`:
//! concurrent tasks, and each pool's size), `TXN_PLAIN=0` (bare and
//! transactional only), `TXN_ONLY=bare|plain|transactional` (one mode alone, to
//! profile it), `TXN_STATEMENTS=1` (each round's time per statement
//! on the server, from `pg_stat_statements`), `BENCH_RESULTS=DIR` (each
//! round's requests/s also to `DIR/txn.csv`, for the picture). Each round reports the CPU per
//! request of this process and of the server's processes, read from `/proc`
//! (the server on this machine), apart from whatever else the machine runs. A shared disk's flush time drifts over minutes: many
//! short rounds compare modes at the same moment better than a few long ones.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use deadpool_postgres::Pool;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;
use tower_idempotency::{IdempotencyLayer, PostgresStore, PostgresTransaction};
use tower_idempotency_bench::*;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone)]
struct Orders {
    /// Plain mode and the bare handler: the application's own pool.
    pool: Option<Pool>,
    /// The bare handler: its INSERT in a transaction of its own.
    own_transaction: bool,
    /// `TXN_HANDLER=payment`: the payments-shaped handler.
    payment: bool,
}

/// The handler's shape: `TXN_HANDLER=payment`, or the one-row order.
fn payment_shape() -> bool {
    std::env::var("TXN_HANDLER").is_ok_and(|v| v == "payment")
}

/// Accounts of the payments-shaped handler.
const ACCOUNTS: i64 = 10_000;

/// The account a payment's key pays from (FNV-1a of the key).
fn account_of(key: &str) -> i64 {
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % ACCOUNTS as u64) as i64 + 1
}

const LOCK_ACCOUNT: &str = "SELECT balance FROM bench_txn_accounts WHERE id = $1 FOR UPDATE";
const INSERT_PAYMENT: &str =
    "INSERT INTO bench_txn_payments (account, amount, key, body) VALUES ($1, $2, $3, $4) RETURNING id";
const DEBIT: &str = "UPDATE bench_txn_accounts SET balance = balance - $2 WHERE id = $1";

/// The handler's statements on `$client` (any client with `query_one` and
/// `execute` taking SQL text): the one-row order, or the payment.
macro_rules! handle {
    ($client:expr, $payment:expr, $key:expr, $body:expr) => {{
        let client = $client;
        if $payment {
            let (account, amount) = (account_of($key), 1_i64);
            async {
                let balance: i64 = client.query_one(LOCK_ACCOUNT, &[&account]).await?.get(0);
                assert!(balance > 0, "the bench's accounts never run dry");
                let row = client
                    .query_one(INSERT_PAYMENT, &[&account, &amount, &$key, &$body])
                    .await?;
                client.execute(DEBIT, &[&account, &amount]).await?;
                Ok::<_, tokio_postgres::Error>(row)
            }
            .await
        } else {
            client.query_one(INSERT, &[&$key, &$body]).await
        }
    }};
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Bare,
    Plain,
    Transactional,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bare => "bare",
            Mode::Plain => "plain",
            Mode::Transactional => "transactional",
        }
    }
}

const INSERT: &str = "INSERT INTO bench_txn_orders (key, body) VALUES ($1, $2) RETURNING id";

async fn create_order(State(orders): State<Orders>, req: Request) -> (StatusCode, String) {
    let key = req.headers()["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned();
    let tx = req.extensions().get::<PostgresTransaction>().cloned();
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = std::str::from_utf8(&body).unwrap();
    let payment = orders.payment;
    let key = key.as_str();
    let id: i64 = match (&tx, &orders.pool) {
        (Some(tx), _) => handle!(&tx.client().await.unwrap(), payment, key, body),
        (None, Some(pool)) if orders.own_transaction => {
            let mut client = pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            let row = handle!(&tx, payment, key, body);
            tx.commit().await.unwrap();
            row
        }
        (None, Some(pool)) => {
            // Plain mode: the payment's statements in a transaction of its own.
            let mut client = pool.get().await.unwrap();
            match payment {
                true => {
                    let tx = client.transaction().await.unwrap();
                    let row = handle!(&tx, payment, key, body);
                    tx.commit().await.unwrap();
                    row
                }
                false => handle!(&client, payment, key, body),
            }
        }
        (None, None) => unreachable!(),
    }
    .unwrap()
    .get(0);
    (StatusCode::CREATED, format!(r#"{{"id":{id}}}"#))
}

fn pool(url: &str, size: usize) -> Pool {
    let config: tokio_postgres::Config = url.parse().expect("DATABASE_URL");
    let manager = deadpool_postgres::Manager::new(config, NoTls);
    Pool::builder(manager).max_size(size).build().unwrap()
}

/// Transaction ids the server has handed out (one per transaction that wrote
/// or notified; the reading transaction itself takes one) and the WAL flushes
/// it has made. A transaction that only notified writes no WAL and commits
/// without a flush; concurrent commits may share one (group commit).
async fn server_counters(sql: &tokio_postgres::Client) -> (i64, i64) {
    let row = sql
        .query_one(
            "SELECT txid_current(), (SELECT wal_sync FROM pg_stat_wal)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// User plus system CPU time of a process, in clock ticks (`/proc/<pid>/stat`
/// fields 14 and 15), and its parent's pid.
fn process_cpu(pid: &str) -> Option<(u64, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields that follow it are fixed.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((ticks, fields.get(1)?.parse().ok()?))
}

/// CPU time in clock ticks of this process (the application and its clients)
/// and of the PostgreSQL server whose postmaster is `postmaster` (its
/// backends and background processes, alive at the reading), and the machine's
/// idle ticks (`/proc/stat`): other work on the machine is in neither.
fn cpu_ticks(postmaster: Option<u32>) -> (u64, u64, u64) {
    let app = process_cpu("self").map_or(0, |(ticks, _)| ticks);
    let server = postmaster.map_or(0, |postmaster| {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| process_cpu(entry.file_name().to_str()?))
            .filter(|&(_, parent)| parent == postmaster)
            .map(|(ticks, _)| ticks)
            .sum()
    });
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let machine: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait ...: idle and iowait are the machine's idle time.
    let idle = machine.get(3).copied().unwrap_or(0) + machine.get(4).copied().unwrap_or(0);
    (app, server, idle)
}

/// The pid of the server's postmaster (the first line of `postmaster.pid` in
/// its data directory), when the bench runs beside the server.
async fn postmaster(sql: &tokio_postgres::Client) -> Option<u32> {
    let row = sql.query_one("SHOW data_directory", &[]).await.ok()?;
    let dir: String = row.get(0);
    let pid = std::fs::read_to_string(format!("{dir}/postmaster.pid")).ok()?;
    pid.lines().next()?.trim().parse().ok()
}

struct Run {
    per_sec: f64,
    /// CPU per request in milliseconds: the application (this process:
    /// server, layer and clients) and the PostgreSQL server; and the share of
    /// the machine's time left idle during the round.
    app_ms: f64,
    server_ms: f64,
    idle: f64,
    round_trips: f64,
    transactions: f64,
    flushes: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Retries of the round's keys, with the layer.
    retries: Option<Retries>,
}

async fn run(url: &str, mode: Mode, secs: u64, clients: usize, round: usize) -> Run {
    let store = PostgresStore::builder(pool(url, clients))
        .with_table("bench_txn_records".parse().unwrap())
        .with_lock_timeout(Duration::from_secs(2))
        .build();
    let payment = payment_shape();
    let own = |own_transaction| Orders {
        pool: Some(pool(url, clients)),
        own_transaction,
        payment,
    };
    let router = Router::new().route(ORDERS, post(create_order));
    let app = match mode {
        Mode::Bare => router.with_state(own(true)),
        Mode::Plain => router
            .route_layer(IdempotencyLayer::new(store.clone()))
            .with_state(own(false)),
        Mode::Transactional => router
            .route_layer(IdempotencyLayer::transactional(store.clone()))
            .with_state(Orders {
                pool: None,
                own_transaction: false,
                payment,
            }),
    };
    let template = RequestTemplate::new(json_body(1024));
    let name = mode.name();
    // Warm every connection's statement cache.
    for i in 0..(clients as u64 * 4) {
        let (status, _) = send(
            &app,
            template.request(&key(&format!("warm{name}{clients}r{round}"), i)),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (sql, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let (trips_before, (xids_before, flushes_before)) =
        (store.round_trips(), server_counters(&sql).await);
    let postmaster = postmaster(&sql).await;
    let statements = env_or("TXN_STATEMENTS", 0u8) == 1;
    if statements {
        sql.batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .unwrap();
    }
    let cpu_before = cpu_ticks(postmaster);
    let wall = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (app, template) = (app.clone(), template.clone());
            let prefix = format!("{name}{clients}r{round}c{c}");
            tokio::spawn(async move {
                // One latency per request: key `i` is the `i`-th.
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let i = latencies.len() as u64;
                    let start = Instant::now();
                    let (status, _) = send(&app, template.request(&key(&prefix, i))).await;
                    assert_eq!(status, StatusCode::CREATED);
                    latencies.push(start.elapsed().as_nanos() as u64);
                }
                latencies
            })
        })
        .collect();
    let (mut latencies, mut completed) = (Vec::new(), Vec::new());
    for task in tasks {
        let client = task.await.unwrap();
        completed.push(client.len() as u64);
        latencies.extend(client);
    }
    let n = latencies.len() as f64;
    let cpu_after = cpu_ticks(postmaster);
    let trips_after = store.round_trips();
    // Linux's clock ticks are 100 per second (USER_HZ), on each of the cores.
    let ms = |after: u64, before: u64| (after - before) as f64 * 10.0;
    let (app_ms, server_ms) = (
        ms(cpu_after.0, cpu_before.0) / n,
        ms(cpu_after.1, cpu_before.1) / n,
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let idle = ms(cpu_after.2, cpu_before.2) / (wall.elapsed().as_secs_f64() * 1000.0 * cores);
    if statements {
        print_statements(&sql, mode, clients, n).await;
    }
    // The handler's statements are round trips the store does not count
    // (one, or three for a payment); the bare handler's BEGIN and COMMIT two
    // more (so are a plain-mode payment's).
    let handler_statements = if payment { 3.0 } else { 1.0 };
    let own_transaction = mode == Mode::Bare || (mode == Mode::Plain && payment);
    let handler_trips = handler_statements + if own_transaction { 2.0 } else { 0.0 };
    let round_trips = (trips_after - trips_before) as f64 / n + handler_trips;
    let retries = match mode {
        Mode::Bare => None,
        _ => Some(retry_all(&app, &template, name, &completed, round, &store).await),
    };
    // The second reading takes an id of its own: subtract it.
    let (xids, flushes) = server_counters(&sql).await;
    let transactions = (xids - xids_before - 1) as f64 / n;
    let flushes = (flushes - flushes_before) as f64 / n;
    latencies.sort_unstable();
    Run {
        per_sec: n / secs as f64,
        app_ms,
        server_ms,
        idle,
        round_trips,
        transactions,
        flushes,
        p50_ms: quantile_us(&latencies, 0.5) / 1000.0,
        p99_ms: quantile_us(&latencies, 0.99) / 1000.0,
        retries,
    }
}

/// A client's retry of a request the layer completed: how long it takes and
/// what it costs the store, measured after the round on the keys the round
/// completed (each retried once, by as many clients, on the instance that
/// completed it, whose near cache keeps only what it read).
struct Retries {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    round_trips: f64,
}

/// Retries each client's keys of the round once (at most 2 000 per client);
/// `completed`: how many each client completed.
async fn retry_all(
    app: &Router,
    template: &RequestTemplate,
    name: &str,
    completed: &[u64],
    round: usize,
    store: &PostgresStore,
) -> Retries {
    let clients = completed.len();
    let trips_before = store.round_trips();
    let wall = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (app, template) = (app.clone(), template.clone());
            let prefix = format!("{name}{clients}r{round}c{c}");
            let keys = completed[c].min(2_000);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                for i in 0..keys {
                    let start = Instant::now();
                    let (status, replayed) = send(&app, template.request(&key(&prefix, i))).await;
                    assert_eq!(status, StatusCode::CREATED, "the recorded answer");
                    assert!(replayed, "a retry is answered from the record");
                    latencies.push(start.elapsed().as_nanos() as u64);
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let secs = wall.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let n = latencies.len() as f64;
    Retries {
        per_sec: n / secs,
        p50_ms: quantile_us(&latencies, 0.5) / 1000.0,
        p99_ms: quantile_us(&latencies, 0.99) / 1000.0,
        round_trips: (store.round_trips() - trips_before) as f64 / n,
    }
}

/// The server's time per statement over the round (`pg_stat_statements`,
/// `TXN_STATEMENTS=1`): what each request spends in the database, by statement.
async fn print_statements(sql: &tokio_postgres::Client, mode: Mode, clients: usize, n: f64) {
    let rows = sql
        .query(
            "SELECT calls, total_exec_time, query FROM pg_stat_statements \
             WHERE query NOT LIKE '%pg_stat%' AND calls > 0 ORDER BY total_exec_time DESC LIMIT 10",
            &[],
        )
        .await
        .unwrap();
    let total: f64 = rows.iter().map(|r| r.get::<_, f64>(1)).sum();
    println!(
        "\n{} at {clients} clients: {:.3} ms of statement execution per request",
        mode.name(),
        total / n
    );
    println!("| calls/request | ms/request | statement |\n|---|---|---|");
    for row in rows {
        let (calls, time, query): (i64, f64, String) = (row.get(0), row.get(1), row.get(2));
        let query: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
        let query = query.chars().take(90).collect::<String>();
        println!("| {:.2} | {:.3} | `{query}` |", calls as f64 / n, time / n);
    }
    println!();
}

fn main() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("txn bench: set DATABASE_URL (bench/scripts/with-pg.sh does)");
        return;
    };
    let (secs, rounds) = (env_or("TXN_SECS", 5u64), env_or("TXN_ROUNDS", 3usize));
    let clients: Vec<usize> = std::env::var("TXN_CLIENTS")
        .unwrap_or_else(|_| "1,16".into())
        .split(',')
        .map(|n| n.trim().parse().expect("TXN_CLIENTS: numbers"))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (sql, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        let settings = sql
            .query_one("SELECT current_setting('fsync'), current_setting('synchronous_commit')", &[])
            .await
            .unwrap();
        let (fsync, sync): (String, String) = (settings.get(0), settings.get(1));
        if env_or("TXN_STATEMENTS", 0u8) == 1 {
            sql.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                .await
                .expect("TXN_STATEMENTS=1 needs pg_stat_statements loaded (bench/scripts/with-pg.sh does)");
        }
        sql.batch_execute(
            "DROP TABLE IF EXISTS bench_txn_orders; \
             CREATE TABLE bench_txn_orders (id bigserial PRIMARY KEY, key text NOT NULL, body text NOT NULL); \
             DROP TABLE IF EXISTS bench_txn_payments; DROP TABLE IF EXISTS bench_txn_accounts; \
             CREATE TABLE bench_txn_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL); \
             INSERT INTO bench_txn_accounts SELECT id, 1000000000 FROM generate_series(1, 10000) AS id; \
             CREATE TABLE bench_txn_payments (id bigserial PRIMARY KEY, \
                 account bigint NOT NULL REFERENCES bench_txn_accounts, amount bigint NOT NULL, \
                 key text NOT NULL, body text NOT NULL); \
             ANALYZE bench_txn_accounts",
        )
        .await
        .unwrap();
        let store = PostgresStore::builder(pool(&url, 2)).with_table("bench_txn_records".parse().unwrap()).build();
        store.migrate().await.unwrap();
        let shape = match payment_shape() {
            true => "a payment (SELECT the account FOR UPDATE, INSERT the payment, UPDATE the balance)",
            false => "inserting one row",
        };
        println!("## Transactional vs plain mode vs the bare handler: fresh requests {shape}");
        println!("{}", machine_line());
        println!(
            "fsync={fsync}, synchronous_commit={sync}; clients {clients:?}, a pool of that size \
             per pool; {rounds} rounds of {secs} s per mode, the modes' order rotating"
        );
        println!();
        println!("| clients | round | mode | requests/s | p50 ms | p99 ms | round trips/request | write transactions/request | WAL flushes/request | app CPU ms/request | PostgreSQL CPU ms/request | machine idle |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
        // `TXN_PLAIN=0` leaves plain mode out (more rounds of the other two in the same time).
        let with_plain = env_or("TXN_PLAIN", 1u8) == 1;
        // `TXN_ONLY=<mode>`: that mode alone (to profile it).
        let only = std::env::var("TXN_ONLY").ok();
        let modes = [Mode::Bare, Mode::Plain, Mode::Transactional];
        let mut summary = Vec::new();
        let mut csv = Vec::new();
        for &clients in &clients {
            let mut ratios = Vec::new();
            for round in 0..rounds {
                // Rotate which mode goes first, so drift does not favour one.
                let mut per_sec = [f64::NAN; 3];
                for k in 0..3 {
                    let i = (round + k) % 3;
                    if modes[i] == Mode::Plain && !with_plain {
                        continue;
                    }
                    if only.as_deref().is_some_and(|only| only != modes[i].name()) {
                        continue;
                    }
                    let r = run(&url, modes[i], secs, clients, round).await;
                    println!(
                        "| {clients} | {round} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.0}% |",
                        modes[i].name(),
                        r.per_sec,
                        r.p50_ms,
                        r.p99_ms,
                        r.round_trips,
                        r.transactions,
                        r.flushes,
                        r.app_ms,
                        r.server_ms,
                        r.idle * 100.0
                    );
                    if let Some(t) = &r.retries {
                        println!(
                            "| {clients} | {round} | {} retries | {:.0} | {:.2} | {:.2} | {:.2} | | | | | |",
                            modes[i].name(),
                            t.per_sec,
                            t.p50_ms,
                            t.p99_ms,
                            t.round_trips,
                        );
                    }
                    per_sec[i] = r.per_sec;
                    csv.push(format!(
                        "{clients},{round},{},{:.1},{:.3}",
                        modes[i].name(),
                        r.per_sec,
                        r.p50_ms
                    ));
                }
                ratios.push((per_sec[2] / per_sec[0], per_sec[2] / per_sec[1]));
            }
            summary.push((clients, ratios));
        }
        println!();
        tower_idempotency_bench::results::write_csv(
            "txn",
            "clients,round,mode,rps,p50_ms",
            &csv,
        );
        for (clients, mut ratios) in summary {
            let rounds = ratios
                .iter()
                .map(|r| format!("{:.2}", r.0))
                .collect::<Vec<_>>()
                .join(", ");
            ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
            let bare = ratios[ratios.len() / 2].0;
            ratios.sort_by(|a, b| a.1.total_cmp(&b.1));
            let plain = ratios[ratios.len() / 2].1;
            println!(
                "{clients} clients: transactional / bare throughput median {bare:.2}x, \
                 transactional / plain {plain:.2}x (rounds: {rounds})"
            );
        }
    });
}
