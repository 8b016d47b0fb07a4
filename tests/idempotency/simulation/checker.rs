//! The checker: reads a run's history (every client attempt and its
//! answer, every handler effect, every store operation in the order the
//! store applied them, and the fault schedule) and judges the crate's one
//! promise: at most one effect per key, and every acknowledged answer
//! replays. In the manner of Elle and Knossos, it checks the observed
//! history against a model, not the code's internals.
//!
//! The only double effect the contract allows in plain mode is a takeover
//! after the owner could not reach the store for longer than the lock
//! timeout. That is modelled explicitly: the store's own log says when a
//! claim was taken over and when its owner last extended it; a takeover is
//! excused only if the claim had gone a whole lock timeout without
//! extension *and* its owner's link to the store had a fault longer than the
//! bounded ones (see `faults::BOUNDED_MS`) during that time.

use super::faults::Fault;
use super::instance::Sent;
use super::wire::{Applied, Op};
use super::LOCK;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug)]
pub enum Outcome {
    Answer {
        status: u16,
        replayed: bool,
        body: Bytes,
    },
    /// The client does not know what happened: it hung up, or the
    /// connection failed.
    Info(String),
}

/// One client attempt: invoked, then answered (ok or refused) or not (info).
#[derive(Clone, Debug)]
pub struct Attempt {
    pub client: String,
    pub op: usize,
    pub instance: &'static str,
    pub tenant: &'static str,
    pub key: String,
    pub v: u8,
    pub invoked: u64,
    pub ended: u64,
    pub outcome: Outcome,
}

/// One handler effect, as the handler recorded it.
#[derive(Clone, Debug)]
pub struct Effect {
    pub n: usize,
    pub tenant: String,
    pub key: String,
    pub v: u8,
    pub item: String,
    pub by: &'static str,
    pub at: u64,
}

pub struct Run<'a> {
    pub history: &'a [Attempt],
    pub effects: &'a [Effect],
    pub log: &'a [Applied],
    pub faults: &'a [Fault],
}

type Key = (String, String);

/// What a run amounted to.
#[derive(Default, Debug, Clone)]
pub struct Figures {
    pub attempts: usize,
    pub acknowledged: usize,
    pub hung_up: usize,
    pub refused: usize,
    pub effects: usize,
    pub faults: usize,
    pub long_faults: usize,
    pub store_ops: usize,
    pub takeovers: usize,
    pub excused_takeovers: usize,
    pub excused_double_effects: usize,
}

/// A broken promise: what, and the history of its key.
#[derive(Debug)]
pub struct Violation {
    pub what: String,
    pub key: Key,
}

/// The distinct requests answered `2xx`, for the auditor to ask again.
pub fn acknowledged(history: &[Attempt]) -> Vec<Sent> {
    let mut seen = BTreeSet::new();
    history
        .iter()
        .filter(
            |a| matches!(a.outcome, Outcome::Answer { status, .. } if (200..300).contains(&status)),
        )
        .filter(|a| seen.insert((a.tenant, a.key.clone(), a.v)))
        .map(|a| Sent {
            tenant: a.tenant,
            key: a.key.clone(),
            v: a.v,
            reordered: false,
        })
        .collect()
}

/// A takeover the store's log shows: a claim of `key` while another claim
/// of it was still in progress.
struct Takeover {
    at: u64,
    owner: String,
    excused: bool,
}

/// Replays the store's log against a model of a fenced lease per key, and
/// finds the takeovers. A takeover of a claim extended less than a lock
/// timeout ago, a claim of a completed key, or a completion by a token that
/// does not hold the key is the store's bug.
fn takeovers(run: &Run<'_>, violations: &mut Vec<Violation>) -> BTreeMap<Key, Vec<Takeover>> {
    enum State {
        Held {
            token: i64,
            owner: String,
            last: u64,
        },
        Done,
    }
    let lock = LOCK.as_millis() as u64;
    let mut state: BTreeMap<Key, State> = BTreeMap::new();
    let mut found: BTreeMap<Key, Vec<Takeover>> = BTreeMap::new();
    let mut bug = |key: &Key, what: String| {
        violations.push(Violation {
            what,
            key: key.clone(),
        })
    };
    for a in run.log {
        let current = state.get(&a.key);
        match (&a.op, current) {
            (Op::Claimed(token), Some(State::Held { owner, last, .. })) => {
                let stale = a.at.saturating_sub(*last);
                // The store's clock and the log's agree to a tick.
                if stale + super::TICK_MS < lock {
                    bug(
                        &a.key,
                        format!("the store took over a claim extended {stale} ms ago"),
                    );
                }
                let excused = run.faults.iter().any(|f| {
                    f.instance == owner && f.exceeds_tolerance() && f.start < a.at && f.end > *last
                });
                found.entry(a.key.clone()).or_default().push(Takeover {
                    at: a.at,
                    owner: owner.clone(),
                    excused,
                });
                let held = State::Held {
                    token: *token,
                    owner: a.from.clone(),
                    last: a.at,
                };
                state.insert(a.key.clone(), held);
            }
            (Op::Claimed(_), Some(State::Done)) => {
                bug(&a.key, "a completed key was claimed again".into());
            }
            (Op::Claimed(token), None) => {
                let held = State::Held {
                    token: *token,
                    owner: a.from.clone(),
                    last: a.at,
                };
                state.insert(a.key.clone(), held);
            }
            (Op::Extended(t), Some(State::Held { token, .. })) if t == token => {
                if let Some(State::Held { last, .. }) = state.get_mut(&a.key) {
                    *last = a.at;
                }
            }
            (Op::Completed(t) | Op::CompletedUnavailable(t), Some(State::Held { token, .. }))
                if t == token =>
            {
                state.insert(a.key.clone(), State::Done);
            }
            (Op::Released(t), Some(State::Held { token, .. })) if t == token => {
                state.remove(&a.key);
            }
            // Releasing a claim that is gone is not an error.
            (Op::Released(_), _) | (Op::Decided(_) | Op::Refused(..), _) => {}
            (op, _) => bug(
                &a.key,
                format!("the store accepted {op:?} from a token not holding the key"),
            ),
        }
    }
    found
}

/// Judges a run; the figures, or every violation found.
pub fn check(run: &Run<'_>) -> Result<Figures, Vec<Violation>> {
    let mut violations = Vec::new();
    let takeovers = takeovers(run, &mut violations);
    let mut figures = Figures {
        attempts: run.history.len(),
        effects: run.effects.len(),
        faults: run.faults.len(),
        long_faults: run.faults.iter().filter(|f| f.exceeds_tolerance()).count(),
        store_ops: run.log.len(),
        takeovers: takeovers.values().map(Vec::len).sum(),
        excused_takeovers: takeovers.values().flatten().filter(|t| t.excused).count(),
        ..Figures::default()
    };
    let excused_key = |key: &Key| {
        takeovers
            .get(key)
            .is_some_and(|ts| ts.iter().any(|t| t.excused))
    };

    // (a) At most one effect per key, unless an excused takeover separates two.
    let mut by_key: BTreeMap<Key, Vec<&Effect>> = BTreeMap::new();
    for e in run.effects {
        by_key
            .entry((e.tenant.clone(), e.key.clone()))
            .or_default()
            .push(e);
    }
    for (key, effects) in &by_key {
        for pair in effects.windows(2) {
            let (first, second) = (pair[0], pair[1]);
            let excused = takeovers.get(key).is_some_and(|ts| {
                ts.iter().any(|t| {
                    t.excused && t.owner == first.by && t.at >= first.at && t.at <= second.at
                })
            });
            if excused {
                figures.excused_double_effects += 1;
            } else {
                violations.push(Violation {
                    what: format!(
                        "a second effect: #{} by {} at {} ms after #{} by {} at {} ms",
                        second.n, second.by, second.at, first.n, first.by, first.at
                    ),
                    key: key.clone(),
                });
            }
        }
    }

    // (b) Every 2xx answer of a key is the same answer; (c) it is this
    // request's own, and names a real effect of it.
    let mut answers: BTreeMap<Key, &Bytes> = BTreeMap::new();
    for a in run.history {
        match &a.outcome {
            Outcome::Info(why) if why == "hung up" => figures.hung_up += 1,
            Outcome::Answer { status, body, .. } if (200..300).contains(status) => {
                figures.acknowledged += 1;
                let key = (a.tenant.to_owned(), a.key.clone());
                if let Err(what) = own_answer(a, body, run.effects) {
                    violations.push(Violation {
                        what,
                        key: key.clone(),
                    });
                }
                let first = *answers.entry(key.clone()).or_insert(body);
                if first != body && !excused_key(&key) {
                    violations.push(Violation {
                        what: format!(
                            "{} got {} for {:?}, acknowledged before as {}",
                            a.client,
                            String::from_utf8_lossy(body),
                            key,
                            String::from_utf8_lossy(first)
                        ),
                        key,
                    });
                }
            }
            Outcome::Answer { .. } => figures.refused += 1,
            Outcome::Info(_) => {}
        }
    }
    match violations.is_empty() {
        true => Ok(figures),
        false => Err(violations),
    }
}

/// Whether a `2xx` body answers this attempt's own tenant, key and request,
/// and names an effect made for them.
fn own_answer(a: &Attempt, body: &[u8], effects: &[Effect]) -> Result<(), String> {
    let answer: serde_json::Value = serde_json::from_slice(body).map_err(|_| {
        format!(
            "a 2xx that is not an order: {}",
            String::from_utf8_lossy(body)
        )
    })?;
    let item = format!("item-{}", a.key);
    let own = answer["tenant"] == a.tenant
        && answer["key"] == a.key.as_str()
        && answer["v"] == a.v
        && answer["item"] == item.as_str();
    if !own {
        return Err(format!(
            "{} ({} {} v{}) was answered {answer}",
            a.client, a.tenant, a.key, a.v
        ));
    }
    let n = answer["effect"].as_u64().unwrap_or(u64::MAX) as usize;
    match effects.get(n) {
        Some(e) if e.tenant == a.tenant && e.key == a.key && e.v == a.v && e.item == item => Ok(()),
        _ => Err(format!(
            "{} was answered with effect {n}, not one of its own",
            a.client
        )),
    }
}

/// Everything the run shows about `key`, in time order: what a failure prints.
pub fn history_of(run: &Run<'_>, key: &Key) -> String {
    let mut lines: Vec<(u64, String)> = Vec::new();
    for a in run
        .history
        .iter()
        .filter(|a| a.tenant == key.0 && a.key == key.1)
    {
        let outcome = match &a.outcome {
            Outcome::Answer {
                status,
                replayed,
                body,
            } => {
                let replay = if *replayed { " (replayed)" } else { "" };
                format!("ok {status}{replay} {}", String::from_utf8_lossy(body))
            }
            Outcome::Info(why) => format!("info: {why}"),
        };
        lines.push((
            a.invoked,
            format!("{} op {} v{} -> {} invoke", a.client, a.op, a.v, a.instance),
        ));
        lines.push((
            a.ended,
            format!(
                "{} op {} v{} <- {} {outcome}",
                a.client, a.op, a.v, a.instance
            ),
        ));
    }
    for e in run
        .effects
        .iter()
        .filter(|e| e.tenant == key.0 && e.key == key.1)
    {
        lines.push((e.at, format!("EFFECT #{} v{} by {}", e.n, e.v, e.by)));
    }
    for l in run.log.iter().filter(|l| &l.key == key) {
        lines.push((l.at, format!("store applied {:?} from {}", l.op, l.from)));
    }
    for f in run.faults {
        lines.push((
            f.start,
            format!("fault {:?} {}<->store begins", f.kind, f.instance),
        ));
        lines.push((
            f.end,
            format!("fault {:?} {}<->store ends", f.kind, f.instance),
        ));
    }
    lines.sort_by_key(|(at, _)| *at);
    lines
        .into_iter()
        .map(|(at, line)| format!("{at:>7} ms  {line}\n"))
        .collect()
}
