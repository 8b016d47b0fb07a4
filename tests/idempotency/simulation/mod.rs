//! Deterministic simulation of two application instances sharing one store
//! (turmoil: simulated hosts, network and clock), with faults injected
//! between each instance and the store, and random client histories checked
//! for the crate's promise: at most one effect per key, and every
//! acknowledged answer replays (see `checker`). The instances purge as an
//! application does (`purge_expired`, and now and then `purge_scope` of a
//! tenant) at seeded random points, and the checker holds them to it: after
//! a purge of a scope returns, no record of it replays.
//!
//! Everything runs on one thread under turmoil's simulated time, which
//! drives each host's tokio clock, and so the store's lock expiry
//! (`MemoryStore` reads `tokio::time::Instant`). A run is a function of its
//! seed: `SIM_SEED=n` replays seed `n` and prints its figures; `SIM_SEEDS=k`
//! (and `SIM_SEED_START`) runs `k` seeds instead of the default few.
//!
//! `phases` checks histories of recovery points the same way, on tokio's
//! paused clock rather than turmoil's network: instances that crash between
//! and inside the phases of a checkout.

mod checker;
mod faults;
mod instance;
mod phases;
mod verdicts;
mod wire;

use checker::{Figures, Run};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The store's lock timeout; the layer extends a running claim every third of it.
const LOCK: Duration = Duration::from_millis(1_000);
const INSTANCES: [&str; 2] = ["app1", "app2"];
const CLIENTS: usize = 4;
/// One simulation step: the resolution of every clock in the run.
const TICK_MS: u64 = 4;
/// Seeds the ordinary test run checks.
const DEFAULT_SEEDS: u64 = 6;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Simulated time since the run began.
fn now_ms() -> u64 {
    turmoil::sim_elapsed()
        .expect("in the simulation")
        .as_millis() as u64
}

/// SplitMix64: small, seedable, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// In `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What the hosts and clients of one run write to: the observations the
/// checker reads. Not part of the system under test.
#[derive(Clone, Default)]
struct Shared {
    history: Arc<Mutex<Vec<checker::Attempt>>>,
    effects: Arc<Mutex<Vec<checker::Effect>>>,
    purges: Arc<Mutex<Vec<checker::Purge>>>,
    log: wire::StoreLog,
    clients_done: Arc<AtomicUsize>,
}

/// One seed's run, its checked figures, and a digest of its whole history.
struct Outcome {
    figures: Result<Figures, String>,
    digest: String,
    simulated: Duration,
}

fn run_seed(seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let faults = faults::schedule(seed, &mut rng);
    let shared = Shared::default();
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(Duration::from_secs(600))
        .tick_duration(ms(TICK_MS))
        .min_message_latency(ms(2))
        .max_message_latency(ms(8))
        .build();
    let log = shared.log.clone();
    sim.host(wire::STORE, move || wire::serve_store(log.clone()));
    for name in INSTANCES {
        let (seed, shared) = (rng.next(), shared.clone());
        sim.host(name, move || {
            instance::serve_instance(name, seed, shared.clone())
        });
    }
    for c in 0..CLIENTS {
        let name = format!("client{c}");
        sim.client(
            name.clone(),
            instance::client(name, rng.next(), shared.clone()),
        );
    }
    // Quiet: every fault over, and a lock timeout twice over for claims left behind.
    let last = faults.iter().map(|f| f.end).max().unwrap_or(0);
    let quiet = last + 2 * LOCK.as_millis() as u64;
    sim.client("auditor", instance::auditor(CLIENTS, quiet, shared.clone()));

    let mut applied = vec![0u8; faults.len()];
    let ended = loop {
        faults::apply(
            &sim,
            &faults,
            sim.elapsed().as_millis() as u64,
            &mut applied,
        );
        match sim.step() {
            Ok(false) => {}
            Ok(true) => break Ok(()),
            Err(e) => break Err(e.to_string()),
        }
    };
    let simulated = sim.elapsed();
    drop(sim);

    let (history, effects, log, purges) = (
        shared.history.lock().unwrap(),
        shared.effects.lock().unwrap(),
        shared.log.lock().unwrap(),
        shared.purges.lock().unwrap(),
    );
    let run = Run {
        history: &history,
        effects: &effects,
        log: &log,
        faults: &faults,
        purges: &purges,
    };
    let digest = format!("{:?}\n{:?}\n{:?}\n{:?}", *history, *effects, *log, *purges);
    let figures = ended
        .map_err(|e| format!("seed {seed}: the simulation failed: {e}"))
        .and_then(|()| {
            checker::check(&run).map_err(|violations| {
                let mut report = format!("seed {seed} (SIM_SEED={seed} replays it):\n");
                for v in &violations {
                    report += &format!("- {:?}: {}\n", v.key, v.what);
                }
                let key = &violations[0].key;
                report += &format!("history of {key:?}:\n{}", checker::history_of(&run, key));
                report
            })
        });
    Outcome {
        figures,
        digest,
        simulated,
    }
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().expect("a number"))
}

/// Random histories of two instances, one store and four clients, with
/// partitions, held and lost messages between the instances and the store,
/// clients that hang up and retry, handlers that fail or outlast the lock:
/// each key has at most one effect (but for a takeover after an outage
/// longer than the lock timeout, or a `purge_scope` that erased its record),
/// every `2xx` answer of a key is the same until its scope is purged,
/// replayed identically to the auditor once the network is healthy, and
/// answers only its own tenant and key; after a `purge_scope` returns, no
/// answer comes from a run claimed before it.
#[test]
fn random_histories_keep_one_effect_per_key_and_replay_every_answer() {
    let seeds: Vec<u64> = match env("SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let start = env("SIM_SEED_START").unwrap_or(0);
            (start..start + env("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect()
        }
    };
    let started = Instant::now();
    let (mut total, mut simulated, mut failures) = (Figures::default(), Duration::ZERO, Vec::new());
    for &seed in &seeds {
        let outcome = run_seed(seed);
        if seeds.len() == 1 {
            // FNV-1a of the whole history: equal across processes and machines.
            let digest = outcome
                .digest
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
            println!("seed {seed}: history digest {digest:016x}");
        }
        simulated += outcome.simulated;
        match outcome.figures {
            Ok(f) => total.add(&f),
            Err(report) => failures.push(report),
        }
    }
    println!(
        "simulation: {} seeds in {:.1} s ({:.0} s simulated): {total:?}",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        simulated.as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed; the first:\n{}",
        failures.len(),
        seeds.len(),
        failures[0]
    );
    assert!(
        total.acknowledged > 0 && total.effects > 0,
        "the histories did something"
    );
    // A single seed may draw no purge of a scope; the default run must.
    if seeds.len() >= DEFAULT_SEEDS as usize {
        assert!(
            total.scope_purges > 0 && total.expired_purges > 0 && total.answers_after_purge > 0,
            "the histories purged, and asked after purges: {total:?}"
        );
    }
}

/// A seed is its history: two runs of one seed observe the same attempts,
/// effects and store operations, byte for byte.
#[test]
fn a_seed_replays_the_same_history() {
    let (first, second) = (run_seed(3), run_seed(3));
    assert!(first.figures.is_ok(), "{:?}", first.figures);
    assert_eq!(first.digest, second.digest);
}

impl Figures {
    fn add(&mut self, f: &Figures) {
        self.attempts += f.attempts;
        self.acknowledged += f.acknowledged;
        self.hung_up += f.hung_up;
        self.refused += f.refused;
        self.effects += f.effects;
        self.faults += f.faults;
        self.long_faults += f.long_faults;
        self.store_ops += f.store_ops;
        self.takeovers += f.takeovers;
        self.excused_takeovers += f.excused_takeovers;
        self.excused_double_effects += f.excused_double_effects;
        self.scope_purges += f.scope_purges;
        self.expired_purges += f.expired_purges;
        self.purged_records += f.purged_records;
        self.reruns_after_purge += f.reruns_after_purge;
        self.answers_after_purge += f.answers_after_purge;
    }
}
