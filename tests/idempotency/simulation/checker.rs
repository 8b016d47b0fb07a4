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
//!
//! The instances also purge while the clients run. `purge_expired` changes
//! nothing in the model: it may only remove what had expired, so the rules
//! above hold as they are (a live claim it removed shows as a takeover of a
//! claim extended less than a lock ago, or as its owner's token refused).
//! `purge_scope` erases the records of its scope: in the store's model every
//! key of the scope is free again, so a token claimed before it holds
//! nothing after it, and a key answered before it may run once more after
//! it (an *epoch* of a key is its time between two purges of its scope).
//! And once a purge has returned to its caller, no answer asked for after
//! that comes from a run claimed before the purge.

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
    /// The fencing token of the run that made it.
    pub token: i64,
}

/// One maintenance call as its caller saw it: `purge_scope` of `scope`, or
/// `purge_expired` without one.
#[derive(Clone, Debug)]
pub struct Purge {
    /// What the store's log records it by.
    pub id: u64,
    pub by: &'static str,
    pub scope: Option<&'static str>,
    pub invoked: u64,
    pub ended: u64,
    /// How many records it removed, or why its caller does not know.
    pub removed: Result<u64, String>,
}

pub struct Run<'a> {
    pub history: &'a [Attempt],
    pub effects: &'a [Effect],
    pub log: &'a [Applied],
    pub faults: &'a [Fault],
    pub purges: &'a [Purge],
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
    /// `purge_scope` and `purge_expired` calls the store applied, and the
    /// records they removed.
    pub scope_purges: usize,
    pub expired_purges: usize,
    pub purged_records: u64,
    /// Second effects of a key whose record a `purge_scope` had erased.
    pub reruns_after_purge: usize,
    /// `2xx` answers asked for after a `purge_scope` of their scope returned.
    pub answers_after_purge: usize,
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
        match &a.op {
            // Every key of the scope is free: its tokens hold nothing.
            Op::PurgedScope { .. } => {
                state.retain(|key, _| key.0 != a.key.0);
                continue;
            }
            // Only what had expired goes, which the model need not know.
            Op::PurgedExpired { .. } => continue,
            _ => {}
        }
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
            // Only a takeover or a purge of its scope (each of which
            // changes the model's holder) ends a live claim.
            (Op::Refused(what, t), Some(State::Held { token, last, .. }))
                if t == token && a.at.saturating_sub(*last) + super::TICK_MS < lock =>
            {
                let stale = a.at.saturating_sub(*last);
                bug(
                    &a.key,
                    format!("the store refused {what} of the live claim {t}, extended {stale} ms ago"),
                );
            }
            // A begin that did not claim found a record: none exists after
            // a release or a purge of its scope (nor before the first claim).
            (Op::Decided(what), None) => bug(
                &a.key,
                format!("the store answered {what} for a key it holds no record of (purged, released or never claimed)"),
            ),
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

/// Where each token's claim, and each applied `purge_scope`, is in the
/// store's log.
struct Positions {
    claims: BTreeMap<i64, usize>,
    /// Per scope, the log positions of its purges, in order.
    scope_purges: BTreeMap<String, Vec<usize>>,
    /// Per purge id, its log position.
    purge_ids: BTreeMap<u64, usize>,
}

impl Positions {
    fn of(log: &[Applied]) -> Self {
        let mut positions = Self {
            claims: BTreeMap::new(),
            scope_purges: BTreeMap::new(),
            purge_ids: BTreeMap::new(),
        };
        for (i, a) in log.iter().enumerate() {
            match &a.op {
                Op::Claimed(token) => {
                    positions.claims.insert(*token, i);
                }
                Op::PurgedScope { id, .. } => {
                    positions
                        .scope_purges
                        .entry(a.key.0.clone())
                        .or_default()
                        .push(i);
                    positions.purge_ids.insert(*id, i);
                }
                Op::PurgedExpired { id, .. } => {
                    positions.purge_ids.insert(*id, i);
                }
                _ => {}
            }
        }
        positions
    }

    /// How many purges of `scope` the store applied before `token`'s claim:
    /// the epoch of the key its run answers for.
    fn epoch(&self, scope: &str, token: i64) -> usize {
        let Some(&claimed) = self.claims.get(&token) else {
            return 0;
        };
        self.scope_purges
            .get(scope)
            .map_or(0, |purges| purges.partition_point(|&p| p < claimed))
    }
}

/// The token of the run whose effect a `2xx` body names, if it names one.
fn answer_token(body: &[u8], effects: &[Effect]) -> Option<i64> {
    let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    let n = answer["effect"].as_u64()? as usize;
    effects.get(n).map(|e| e.token)
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
    let positions = Positions::of(run.log);
    for a in run.log {
        match a.op {
            Op::PurgedScope { removed, .. } => {
                figures.scope_purges += 1;
                figures.purged_records += removed;
            }
            Op::PurgedExpired { removed, .. } => {
                figures.expired_purges += 1;
                figures.purged_records += removed;
            }
            _ => {}
        }
    }

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
            // Erased between the two runs' claims: the key was free again.
            let purged =
                positions.epoch(&key.0, first.token) != positions.epoch(&key.0, second.token);
            if purged {
                figures.reruns_after_purge += 1;
            } else if excused {
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

    // (b) Every 2xx answer of a key in one epoch is the same answer; (c) it
    // is this request's own, and names a real effect of it.
    let mut answers: BTreeMap<(Key, usize), &Bytes> = BTreeMap::new();
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
                let token = answer_token(body, run.effects);
                let epoch = token.map_or(0, |t| positions.epoch(a.tenant, t));
                let first = *answers.entry((key.clone(), epoch)).or_insert(body);
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

    // (d) Once a `purge_scope` has returned, no answer asked for after it
    // comes from a run claimed before it: a request claimed after the purge
    // runs and is recorded anew, a request running during it is never
    // replayed afterwards.
    for purge in run.purges {
        let (Some(scope), Ok(_)) = (purge.scope, &purge.removed) else {
            continue;
        };
        let Some(&purged) = positions.purge_ids.get(&purge.id) else {
            violations.push(Violation {
                what: format!(
                    "purge {} of {scope} returned to {} at {} ms, but the store never applied it",
                    purge.id, purge.by, purge.ended
                ),
                key: (scope.to_owned(), String::new()),
            });
            continue;
        };
        for a in run.history {
            let Outcome::Answer {
                status,
                replayed,
                body,
            } = &a.outcome
            else {
                continue;
            };
            if a.tenant != scope || a.invoked < purge.ended || !(200..300).contains(status) {
                continue;
            }
            figures.answers_after_purge += 1;
            let Some(token) = answer_token(body, run.effects) else {
                continue; // (c) said so already
            };
            match positions.claims.get(&token) {
                Some(&claimed) if claimed > purged => {}
                claimed => {
                    violations.push(Violation {
                        what: format!(
                        "{} asked at {} ms, after purge {} of {scope} returned at {} ms, and was \
                         answered{} by run {token}, claimed {} the purge",
                        a.client,
                        a.invoked,
                        purge.id,
                        purge.ended,
                        if *replayed { " (replayed)" } else { "" },
                        if claimed.is_some() { "before" } else { "never (in the log) before" },
                    ),
                        key: (a.tenant.to_owned(), a.key.clone()),
                    })
                }
            }
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
    let about_key = |l: &Applied| match l.op {
        Op::PurgedScope { .. } => l.key.0 == key.0,
        Op::PurgedExpired { .. } => true,
        _ => &l.key == key,
    };
    for l in run.log.iter().filter(|l| about_key(l)) {
        lines.push((l.at, format!("store applied {:?} from {}", l.op, l.from)));
    }
    for p in run
        .purges
        .iter()
        .filter(|p| p.scope.is_none_or(|s| s == key.0))
    {
        let what = match p.scope {
            Some(scope) => format!("purge_scope({scope})"),
            None => "purge_expired".to_owned(),
        };
        lines.push((p.invoked, format!("{} {what} #{} invoke", p.by, p.id)));
        lines.push((
            p.ended,
            format!("{} {what} #{} <- {:?}", p.by, p.id, p.removed),
        ));
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
