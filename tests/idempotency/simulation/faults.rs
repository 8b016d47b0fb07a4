//! The fault schedule of one seed, drawn before the run and applied by the
//! driver between simulation steps: what can go wrong between an instance
//! and the store, when, and for how long.

use super::{Rng, INSTANCES, LOCK};
use crate::simulation::wire::STORE;

/// The longest fault within the tolerance the crate documents: shorter than
/// a heartbeat interval less one operation timeout, so at most one
/// extension in a row fails and no live claim's lock runs out.
pub const BOUNDED_MS: u64 = 200;
/// The least time between two faults on one link (so two faults cannot
/// fail two extensions in a row either).
const GAP_MS: u64 = 1_200;
/// Faults start within this window; the clients run a little past it.
const WINDOW_MS: u64 = 5_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Both directions dropped: calls hang until their timeout.
    Partition,
    /// Both directions held, delivered late on release: calls hang, and
    /// some are applied after their caller gave up.
    Hold,
    /// Replies dropped: calls are applied and their callers never hear.
    RepliesLost,
    /// Requests dropped.
    RequestsLost,
}

#[derive(Clone, Debug)]
pub struct Fault {
    pub instance: &'static str,
    pub kind: Kind,
    pub start: u64,
    pub end: u64,
}

impl Fault {
    /// Longer than the documented tolerance: the owner may legitimately
    /// lose its claim.
    pub fn exceeds_tolerance(&self) -> bool {
        self.end - self.start > BOUNDED_MS
    }
}

/// Faults on each instance's link to the store. One seed in four (those
/// that are 1 modulo 4) also cuts one instance off for longer than the lock
/// timeout first: the window the contract leaves open in plain mode.
pub fn schedule(seed: u64, rng: &mut Rng) -> Vec<Fault> {
    let mut faults = Vec::new();
    let outage = (seed % 4 == 1).then(|| rng.below(2) as usize);
    for (i, &instance) in INSTANCES.iter().enumerate() {
        let mut at = rng.range(50, 800);
        let mut long_done = outage != Some(i);
        while at < WINDOW_MS {
            let kind = match rng.below(4) {
                0 => Kind::Partition,
                1 => Kind::Hold,
                2 => Kind::RepliesLost,
                _ => Kind::RequestsLost,
            };
            let lock = LOCK.as_millis() as u64;
            let (kind, len) = if !long_done {
                long_done = true;
                (
                    Kind::Partition,
                    rng.range(lock + lock / 5, 2 * lock + lock / 2),
                )
            } else {
                (kind, rng.range(20, BOUNDED_MS))
            };
            faults.push(Fault {
                instance,
                kind,
                start: at,
                end: at + len,
            });
            at += len + rng.range(GAP_MS, 3 * GAP_MS);
        }
    }
    faults.sort_by_key(|f| f.start);
    faults
}

/// Applies the changes due at `now` (ms): starts and ends of faults.
pub fn apply(sim: &turmoil::Sim<'_>, faults: &[Fault], now: u64, applied: &mut [u8]) {
    for (fault, state) in faults.iter().zip(applied.iter_mut()) {
        let (a, s) = (fault.instance, STORE);
        if *state == 0 && now >= fault.start {
            *state = 1;
            match fault.kind {
                Kind::Partition => sim.partition(a, s),
                Kind::Hold => sim.hold(a, s),
                Kind::RepliesLost => sim.partition_oneway(s, a),
                Kind::RequestsLost => sim.partition_oneway(a, s),
            }
        }
        if *state == 1 && now >= fault.end {
            *state = 2;
            match fault.kind {
                Kind::Partition => sim.repair(a, s),
                Kind::Hold => sim.release(a, s),
                Kind::RepliesLost => sim.repair_oneway(s, a),
                Kind::RequestsLost => sim.repair_oneway(a, s),
            }
        }
    }
}
