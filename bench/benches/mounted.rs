//! The layers as users mount them: on an axum 0.8 `Router` with
//! `route_layer`, each request built as it is sent and a `oneshot` on a clone
//! of the router, a realistic JSON body whose keys are not in sorted order, a
//! handler that takes the body as `String` and answers `201` JSON, and the
//! scope from a header closure. Every layer is compared with the same route
//! behind a do-nothing `route_layer`, in interleaved rounds of one run, on a
//! current-thread and on a multi-thread runtime.
//!
//! `cargo bench -p tower-idempotency-bench --ignore-rust-version --bench mounted`
//!
//! Environment: `MOUNTED_ROUNDS` (default 11), `MOUNTED_BATCH` (default
//! 20000), `MOUNTED_RUNTIME=current|multi` (default both),
//! `MOUNTED_ONLY=<variant name>` (one variant and the baseline, for profiling),
//! `MOUNTED_REPLAY_KEYS` (default 1: how many completed keys replays cycle through),
//! `MOUNTED_BUILD=before` (requests built before the timed loop rather than in it),
//! `BENCH_RESULTS=DIR` (the medians also to `DIR/mounted.csv`, for the picture).

use std::hint::black_box;
use std::time::Instant;
use tower_idempotency_bench::machine_line;
use tower_idempotency_bench::mounted::*;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

/// Each request is built in the timed loop as it is sent, as a server builds
/// it when it arrives (the baseline pays for that too); `MOUNTED_BUILD=before`
/// builds the batch before timing instead. Then the timed loop frees a whole
/// batch of requests it never allocated, and what that costs the allocator
/// depends on what each layer allocates: a replay measured that way moved by
/// 0.25 µs with the size of one allocation.
fn build_inline() -> bool {
    std::env::var("MOUNTED_BUILD").as_deref() != Ok("before")
}

fn run(runtime: &str, variants: &[Variant], rounds: usize, batch: u64, csv: &mut Vec<String>) {
    let rt = match runtime {
        "current" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
    }
    .expect("runtime");
    let body = order_body();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        // Interleaved, starting one later each round.
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let v = variants[i];
            let body = body.clone();
            let ns = rt.block_on(async move {
                // On the multi-thread runtime the requests are sent from a
                // worker, as a server's connection task would.
                tokio::spawn(async move {
                    let (app, cookie) = ready(v, &body).await;
                    let warm = requests(v, 500, 100_000 + round as u64, &body, cookie.as_ref());
                    for req in warm {
                        send(&app, req).await;
                    }
                    if build_inline() {
                        // As a server does: each request built as it arrives.
                        let start = Instant::now();
                        for i in 0..batch {
                            let req = nth_request(v, i, round as u64, &body, cookie.as_ref());
                            black_box(send(&app, req).await);
                        }
                        return start.elapsed().as_nanos() as f64 / batch as f64;
                    }
                    let reqs = requests(v, batch, round as u64, &body, cookie.as_ref());
                    let start = Instant::now();
                    for req in reqs {
                        black_box(send(&app, req).await);
                    }
                    start.elapsed().as_nanos() as f64 / batch as f64
                })
                .await
                .expect("batch")
            });
            samples[i].push(ns);
        }
    }
    let med: Vec<f64> = samples.iter_mut().map(|s| median(s)).collect();
    let at = |v: Variant| variants.iter().position(|x| *x == v).map(|i| med[i]);
    let over = |v: Variant| Some(at(v)? - at(v.baseline())?);
    println!(
        "## Mounted in axum ({runtime}-thread runtime): route_layer, router clone + oneshot per request, {}-byte unsorted JSON, String handler, requests built {}",
        body.len(),
        if build_inline() { "as they are sent" } else { "before timing" }
    );
    println!("{rounds} interleaved rounds × {batch} requests per variant; median wall time per request (min–max of rounds)");
    println!();
    println!("| variant | ns/request | min–max | over its do-nothing baseline |");
    println!("|---|---|---|---|");
    for (i, v) in variants.iter().enumerate() {
        let (lo, hi) = (samples[i][0], samples[i][samples[i].len() - 1]);
        let overhead = over(*v)
            .filter(|_| !v.is_baseline())
            .map_or("—".to_owned(), |o| format!("{:+.2} µs", o / 1000.0));
        println!(
            "| {} | {:.0} | {lo:.0}–{hi:.0} | {overhead} |",
            v.name(),
            med[i]
        );
        let baseline_ns = at(v.baseline()).unwrap_or(f64::NAN);
        csv.push(format!(
            "{runtime},{},{:.1},{baseline_ns:.1}",
            v.name().replace(',', ";"),
            med[i]
        ));
    }
    println!();
    for (path, ours, peers) in [
        (
            "fresh",
            Variant::OursFresh,
            [Variant::IdempotentFresh, Variant::AxumIdemFresh],
        ),
        (
            "replay",
            Variant::OursReplay,
            [Variant::IdempotentReplay, Variant::AxumIdemReplay],
        ),
    ] {
        for peer in peers {
            if let (Some(o), Some(p)) = (over(ours), over(peer)) {
                println!("- {path}: {} overhead / ours = {:.2}x", peer.name(), p / o);
            }
        }
    }
    println!();
}

fn main() {
    let rounds: usize = std::env::var("MOUNTED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(11);
    let batch: u64 = std::env::var("MOUNTED_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let variants: Vec<Variant> = match std::env::var("MOUNTED_ONLY") {
        Ok(only) => {
            let v = *Variant::ALL
                .iter()
                .find(|v| v.name() == only)
                .unwrap_or_else(|| panic!("no variant {only}"));
            if v.is_baseline() {
                vec![v]
            } else {
                vec![v.baseline(), v]
            }
        }
        Err(_) => Variant::ALL.to_vec(),
    };
    println!("{}", machine_line());
    println!("body: {}", String::from_utf8_lossy(&order_body()));
    println!();
    let runtimes = match std::env::var("MOUNTED_RUNTIME").as_deref() {
        Ok("current") => vec!["current"],
        Ok("multi") => vec!["multi"],
        _ => vec!["current", "multi"],
    };
    let mut csv = Vec::new();
    for runtime in runtimes {
        run(runtime, &variants, rounds, batch, &mut csv);
    }
    tower_idempotency_bench::results::write_csv(
        "mounted",
        "runtime,variant,ns_per_request,baseline_ns_per_request",
        &csv,
    );
}
