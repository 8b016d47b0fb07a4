//! Allocations per request of each mounted variant (see `benches/mounted.rs`):
//! a counting global allocator, on a current-thread runtime, over a batch of
//! requests after a warm-up; the counts minus the do-nothing baseline's are
//! what each layer adds. Deterministic, unlike timings.
//!
//! `cargo bench -p tower-idempotency-bench --ignore-rust-version --bench allocs`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use tower_idempotency_bench::mounted::*;

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
/// Allocations above glibc's per-thread cache limit (1032 bytes), which take
/// the slower bin path on allocation and free.
static LARGE: AtomicU64 = AtomicU64::new(0);
const LARGE_ABOVE: usize = 1032;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        if layout.size() > LARGE_ABOVE {
            LARGE.fetch_add(1, Ordering::Relaxed);
            if std::env::var_os("ALLOCS_TRACE_LARGE").is_some() {
                eprintln!("large allocation: {} bytes", layout.size());
            }
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        if new_size > LARGE_ABOVE {
            LARGE.fetch_add(1, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let body = order_body();
    let batch = 2_000u64;
    println!(
        "## Allocations per request, mounted in axum ({} bytes of unsorted JSON)",
        body.len()
    );
    println!();
    println!(
        "| variant | allocations | of them over {LARGE_ABOVE} bytes | bytes allocated | allocations over its baseline |"
    );
    println!("|---|---|---|---|---|");
    let mut counts = Vec::new();
    for v in Variant::ALL {
        let (allocs, large, bytes) = rt.block_on(async {
            let (app, cookie) = ready(v, &body).await;
            for req in requests(v, 200, 1, &body, cookie.as_ref()) {
                send(&app, req).await;
            }
            // Requests are built before counting: only serving them counts.
            let reqs = requests(v, batch, 2, &body, cookie.as_ref());
            let (a0, l0, b0) = (
                ALLOCS.load(Ordering::Relaxed),
                LARGE.load(Ordering::Relaxed),
                BYTES.load(Ordering::Relaxed),
            );
            for req in reqs {
                send(&app, req).await;
            }
            (
                (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / batch as f64,
                (LARGE.load(Ordering::Relaxed) - l0) as f64 / batch as f64,
                (BYTES.load(Ordering::Relaxed) - b0) as f64 / batch as f64,
            )
        });
        counts.push((v, allocs));
        let base = counts
            .iter()
            .find(|(b, _)| *b == v.baseline())
            .map_or(allocs, |(_, a)| *a);
        let over = if v.is_baseline() {
            "—".to_owned()
        } else {
            format!("{:+.1}", allocs - base)
        };
        println!(
            "| {} | {allocs:.1} | {large:.1} | {bytes:.0} | {over} |",
            v.name()
        );
    }
}
