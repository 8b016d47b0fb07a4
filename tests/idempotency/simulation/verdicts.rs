//! The checker on histories written by hand: each broken promise it must
//! find, and the one double effect the contract allows, which it must excuse.

use super::checker::{check, Attempt, Effect, Outcome, Run};
use super::faults::{Fault, Kind};
use super::wire::{Applied, Op};
use bytes::Bytes;

const KEY: &str = "order-key-0";

fn effect(n: usize, by: &'static str, at: u64) -> Effect {
    Effect {
        n,
        tenant: "tenant-a".into(),
        key: KEY.into(),
        v: 0,
        item: format!("item-{KEY}"),
        by,
        at,
    }
}

fn answer(tenant: &str, effect: usize, at: u64) -> Attempt {
    let body = format!(
        r#"{{"tenant":"{tenant}","key":"{KEY}","v":0,"item":"item-{KEY}","by":"app1","effect":{effect}}}"#
    );
    Attempt {
        client: "client0".into(),
        op: 0,
        instance: "app1",
        tenant: "tenant-a",
        key: KEY.into(),
        v: 0,
        invoked: at,
        ended: at + 10,
        outcome: Outcome::Answer {
            status: 201,
            replayed: false,
            body: Bytes::from(body),
        },
    }
}

fn applied(at: u64, from: &str, op: Op) -> Applied {
    Applied {
        at,
        from: from.into(),
        key: ("tenant-a".into(), KEY.into()),
        op,
    }
}

fn partition(instance: &'static str, start: u64, end: u64) -> Fault {
    Fault {
        instance,
        kind: Kind::Partition,
        start,
        end,
    }
}

/// Effect 0 by app1 under claim 1 at 100 ms, its claim taken over by app2
/// at 1 300 ms (claim 2) and effect 1 made under it.
fn takeover_log() -> Vec<Applied> {
    vec![
        applied(90, "app1", Op::Claimed(1)),
        applied(300, "app1", Op::Extended(1)),
        applied(1_300, "app2", Op::Claimed(2)),
        applied(1_350, "app2", Op::Completed(2)),
    ]
}

fn violations(run: &Run<'_>) -> Vec<String> {
    match check(run) {
        Ok(_) => Vec::new(),
        Err(v) => v.into_iter().map(|v| v.what).collect(),
    }
}

#[test]
fn a_second_effect_without_a_takeover_is_a_violation() {
    let effects = [effect(0, "app1", 100), effect(1, "app2", 200)];
    let log = [
        applied(90, "app1", Op::Claimed(1)),
        applied(150, "app1", Op::Completed(1)),
    ];
    let run = Run {
        history: &[],
        effects: &effects,
        log: &log,
        faults: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("a second effect")),
        "{found:?}"
    );
}

#[test]
fn a_takeover_after_an_outage_longer_than_the_lock_is_excused() {
    let effects = [effect(0, "app1", 100), effect(1, "app2", 1_320)];
    let (log, faults) = (takeover_log(), [partition("app1", 310, 2_000)]);
    let run = Run {
        history: &[],
        effects: &effects,
        log: &log,
        faults: &faults,
    };
    let figures = check(&run).expect("excused");
    assert_eq!(figures.excused_double_effects, 1);
}

#[test]
fn a_takeover_without_an_outage_of_the_owner_is_a_violation() {
    let effects = [effect(0, "app1", 100), effect(1, "app2", 1_320)];
    let log = takeover_log();
    // A short fault of the owner, and a long one of the other instance.
    let faults = [partition("app1", 310, 400), partition("app2", 310, 2_000)];
    let run = Run {
        history: &[],
        effects: &effects,
        log: &log,
        faults: &faults,
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("a second effect")),
        "{found:?}"
    );
}

#[test]
fn the_store_taking_over_a_live_claim_is_a_violation() {
    let mut log = takeover_log();
    log[1].at = 800; // extended 500 ms before the takeover
    let faults = [partition("app1", 810, 2_000)];
    let run = Run {
        history: &[],
        effects: &[],
        log: &log,
        faults: &faults,
    };
    let found = violations(&run);
    assert!(
        found
            .iter()
            .any(|v| v.contains("took over a claim extended")),
        "{found:?}"
    );
}

#[test]
fn a_completion_by_a_token_that_lost_the_key_is_a_violation() {
    let mut log = takeover_log();
    log.insert(3, applied(1_310, "app1", Op::Completed(1)));
    let run = Run {
        history: &[],
        effects: &[],
        log: &log,
        faults: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("not holding the key")),
        "{found:?}"
    );
}

#[test]
fn two_different_acknowledged_answers_of_a_key_are_a_violation() {
    let effects = [effect(0, "app1", 100), effect(1, "app1", 100)];
    let history = [answer("tenant-a", 0, 120), answer("tenant-a", 1, 500)];
    let log = [applied(90, "app1", Op::Claimed(1))];
    let run = Run {
        history: &history,
        effects: &effects[..1],
        log: &log,
        faults: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("acknowledged before as")),
        "{found:?}"
    );
    let run = Run {
        history: &history[..1],
        effects: &effects[..1],
        log: &log,
        faults: &[],
    };
    assert_eq!(violations(&run), Vec::<String>::new(), "one answer is fine");
}

#[test]
fn an_answer_naming_another_tenant_or_effect_is_a_violation() {
    let effects = [effect(0, "app1", 100)];
    let log = [applied(90, "app1", Op::Claimed(1))];
    let history = [answer("tenant-b", 0, 120)];
    let run = Run {
        history: &history,
        effects: &effects,
        log: &log,
        faults: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("was answered")),
        "{found:?}"
    );
    let history = [answer("tenant-a", 7, 120)];
    let run = Run {
        history: &history,
        effects: &effects,
        log: &log,
        faults: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("not one of its own")),
        "{found:?}"
    );
}
