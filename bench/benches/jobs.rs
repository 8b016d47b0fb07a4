//! `MemoryJobStore`: the cost of a budgeted start as the store fills up.
//!
//! ```sh
//! cargo bench -p tower-idempotency-bench --ignore-rust-version --bench jobs
//! ```
//!
//! The store first holds `N` completed jobs of other tenants (10 per tenant),
//! then a probe tenant with 100 completed jobs this month starts `JOBS_BATCH`
//! new jobs under a monthly budget it never reaches; each start also counts
//! the budget. Median of `JOBS_ROUNDS` rounds per size. Environment:
//! `JOBS_SIZES` (10,100000,1000000,10000000), `JOBS_BATCH` (20000),
//! `JOBS_ROUNDS` (5).

use bytes::Bytes;
use std::num::NonZeroU64;
use std::time::Instant;
use tower_idempotency::lease::store::MemoryJobStore;
use tower_idempotency::lease::store::{Budget, JobStore, StartJob, StartOutcome};
use tower_idempotency_bench::{machine_line, rss_bytes};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn completed(store: &MemoryJobStore, tenant: &str, key: &str, budget: Option<Budget>) {
    let start = StartJob {
        tenant,
        kind: "report",
        key,
        owner: "bench",
        budget,
        cost: 1,
    };
    let StartOutcome::Created(_, grant) = store.start(&start).await.unwrap() else {
        panic!("created")
    };
    store
        .finalize(&grant, Bytes::from_static(b"artifact"))
        .await
        .unwrap();
}

fn main() {
    let sizes: Vec<u64> = std::env::var("JOBS_SIZES")
        .unwrap_or_else(|_| "10,100000,1000000,10000000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let (batch, rounds) = (
        env_or("JOBS_BATCH", 20_000u64),
        env_or("JOBS_ROUNDS", 5usize),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("## MemoryJobStore: a budgeted start as the store fills");
    println!("{}", machine_line());
    println!("{rounds} rounds × {batch} budgeted starts per size; median ns per start (min–max)");
    println!();
    println!("| jobs held | ns/start | min–max | RSS MiB |");
    println!("|---|---|---|---|");
    let budget = Some(Budget::per_month(NonZeroU64::MAX));
    rt.block_on(async {
        for &size in &sizes {
            let store = MemoryJobStore::new();
            for i in 0..size {
                let tenant = format!("tenant-{}", i / 10);
                completed(&store, &tenant, &format!("k{i}"), None).await;
            }
            for i in 0..100 {
                completed(&store, "probe", &format!("done{i}"), None).await;
            }
            let mut samples = Vec::new();
            for round in 0..rounds {
                let keys: Vec<String> = (0..batch).map(|i| format!("r{round}-{i}")).collect();
                let mut spent = std::time::Duration::ZERO;
                for key in &keys {
                    let start = StartJob {
                        tenant: "probe",
                        kind: "report",
                        key,
                        owner: "bench",
                        budget,
                        cost: 1,
                    };
                    let started = Instant::now();
                    let outcome = store.start(&start).await.unwrap();
                    spent += started.elapsed();
                    // Each job completes (untimed), as delivered work does: the
                    // probe's completed count grows, its in-flight set does not.
                    let StartOutcome::Created(_, grant) = outcome else {
                        panic!("created")
                    };
                    store.finalize(&grant, Bytes::new()).await.unwrap();
                }
                samples.push(spent.as_nanos() as f64 / batch as f64);
            }
            samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!(
                "| {size} | {:.0} | {:.0}–{:.0} | {} |",
                samples[samples.len() / 2],
                samples[0],
                samples[samples.len() - 1],
                rss_bytes() / (1 << 20)
            );
            drop(store);
        }
    });
}
