//! What a phase costs a store, in round trips (the store's own counter:
//! statements, commands and scripts it sent, cache misses included): one
//! operation of the engine with no phases, then with one and with three
//! `run` phases, each under a fresh key after a warm-up.

use tower_idempotency::engine::{Engine, Identity, Outcome, RunContext};
use tower_idempotency::{IdempotencyKey, Scope};

/// Round trips of one operation with `phases` `run` phases, warm.
pub async fn round_trips_of(
    engine: &Engine,
    count: &impl Fn() -> u64,
    tag: &str,
    phases: usize,
) -> u64 {
    let scope = Scope::new(format!("cost-{tag}"));
    let run = |key: String| {
        let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
        let scope = scope.clone();
        async move {
            let operation = move |context: RunContext| phased(context, phases);
            let outcome = engine
                .run(&scope, &key, Identity::Bytes(b"cost"), operation)
                .await
                .unwrap();
            assert!(matches!(outcome, Outcome::Executed(n) if n == phases));
        }
    };
    // Warm: the statement cache and the scripts loaded.
    for warm in 0..2 {
        run(format!("warm-{phases}-{warm}-{}", std::process::id())).await;
    }
    let before = count();
    run(format!("counted-{phases}-{}", std::process::id())).await;
    count() - before
}

async fn phased(context: RunContext, phases: usize) -> Result<usize, String> {
    let Some(handle) = context.phases() else {
        return Ok(phases);
    };
    for n in 0..phases {
        let name = format!("step-{n}");
        handle
            .run(&name, || async { Ok::<_, String>(n) })
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(phases)
}

/// The mean time of `runs` sequential operations with `phases` phases.
async fn mean_time(engine: &Engine, tag: &str, phases: usize, runs: u32) -> std::time::Duration {
    let scope = Scope::new(format!("timed-{tag}"));
    let started = std::time::Instant::now();
    for n in 0..runs {
        let key = format!("timed-{phases}-{n}-{}", std::process::id());
        let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
        let operation = move |context: RunContext| phased(context, phases);
        let outcome = engine.run(&scope, &key, Identity::Bytes(b"t"), operation);
        assert!(matches!(outcome.await.unwrap(), Outcome::Executed(_)));
    }
    started.elapsed() / runs
}

/// The round trips of operations with 0, 1 and 3 phases, printed as the
/// benchmarks page reports them (with the mean time of 200 sequential
/// operations of each, not asserted), and the claim that a phase costs the
/// read of the recorded phases once plus one write each.
pub async fn report(store: &str, engine: &Engine, count: impl Fn() -> u64) -> [u64; 3] {
    let mut trips = [0; 3];
    let mut times = [std::time::Duration::ZERO; 3];
    for (slot, phases) in [0, 1, 3].into_iter().enumerate() {
        trips[slot] = round_trips_of(engine, &count, store, phases).await;
        times[slot] = mean_time(engine, store, phases, 200).await;
    }
    eprintln!(
        "phase cost on {store}: round trips per operation with 0 / 1 / 3 phases: {} / {} / {}; \
         mean µs per operation: {} / {} / {}",
        trips[0],
        trips[1],
        trips[2],
        times[0].as_micros(),
        times[1].as_micros(),
        times[2].as_micros(),
    );
    trips
}
