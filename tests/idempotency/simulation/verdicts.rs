//! The checker on histories written by hand: each broken promise it must
//! find, and the one double effect the contract allows, which it must excuse.

use super::checker::{check, Attempt, Effect, Outcome, Purge, Run};
use super::faults::{Fault, Kind};
use super::wire::{Applied, Op};
use bytes::Bytes;

const KEY: &str = "order-key-0";

/// Effect `n`, made by the run of claim `n + 1`.
fn effect(n: usize, by: &'static str, at: u64) -> Effect {
    Effect {
        token: n as i64 + 1,
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
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
        purges: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("not one of its own")),
        "{found:?}"
    );
}

/// `purge_scope` #7 of tenant-a, applied at 300 ms, returned to app2 at 310 ms.
fn purge_of_tenant_a() -> (Applied, Purge) {
    let applied = Applied {
        at: 300,
        from: "app2".into(),
        key: ("tenant-a".into(), String::new()),
        op: Op::PurgedScope { id: 7, removed: 1 },
    };
    let purge = Purge {
        id: 7,
        by: "app2",
        scope: Some("tenant-a"),
        invoked: 290,
        ended: 310,
        removed: Ok(1),
    };
    (applied, purge)
}

fn replayed(mut attempt: Attempt) -> Attempt {
    if let Outcome::Answer { replayed, .. } = &mut attempt.outcome {
        *replayed = true;
    }
    attempt
}

#[test]
fn a_replay_after_a_purge_returned_of_a_run_claimed_before_it_is_a_violation() {
    let (purged, purge) = purge_of_tenant_a();
    let effects = [effect(0, "app1", 100)];
    // The store kept the record the purge should have erased.
    let log = [
        applied(90, "app1", Op::Claimed(1)),
        applied(150, "app1", Op::Completed(1)),
        purged,
        applied(400, "app2", Op::Decided("replay")),
    ];
    let history = [
        answer("tenant-a", 0, 120),
        replayed(answer("tenant-a", 0, 400)),
    ];
    let purges = [purge];
    let run = Run {
        history: &history,
        effects: &effects,
        log: &log,
        faults: &[],
        purges: &purges,
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("claimed before the purge")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|v| v.contains("holds no record of")),
        "{found:?}"
    );
}

#[test]
fn a_key_run_again_after_a_purge_of_its_scope_is_allowed() {
    let (purged, purge) = purge_of_tenant_a();
    let effects = [effect(0, "app1", 100), effect(1, "app2", 360)];
    let log = [
        applied(90, "app1", Op::Claimed(1)),
        applied(150, "app1", Op::Completed(1)),
        purged,
        applied(350, "app2", Op::Claimed(2)),
        applied(380, "app2", Op::Completed(2)),
        applied(420, "app1", Op::Decided("replay")),
    ];
    // Answered once before the purge, then (another answer) after it.
    let history = [
        answer("tenant-a", 0, 120),
        answer("tenant-a", 1, 340),
        replayed(answer("tenant-a", 1, 420)),
    ];
    let purges = [purge];
    let run = Run {
        history: &history,
        effects: &effects,
        log: &log,
        faults: &[],
        purges: &purges,
    };
    let figures = check(&run).expect("a purge frees the key");
    assert_eq!(
        (figures.reruns_after_purge, figures.answers_after_purge),
        (1, 2)
    );
}

#[test]
fn a_completion_after_a_purge_by_a_run_claimed_before_it_is_a_violation() {
    let (purged, _) = purge_of_tenant_a();
    let log = [
        applied(90, "app1", Op::Claimed(1)),
        purged,
        applied(320, "app1", Op::Completed(1)),
    ];
    let run = Run {
        history: &[],
        effects: &[],
        log: &log,
        faults: &[],
        purges: &[],
    };
    let found = violations(&run);
    assert!(
        found.iter().any(|v| v.contains("not holding the key")),
        "{found:?}"
    );
}

#[test]
fn purge_expired_removing_a_live_claim_is_a_violation() {
    let expired = Applied {
        at: 400,
        from: "app2".into(),
        key: (String::new(), String::new()),
        op: Op::PurgedExpired { id: 3, removed: 1 },
    };
    // The owner's next extension is refused...
    let log = [
        applied(90, "app1", Op::Claimed(1)),
        applied(300, "app1", Op::Extended(1)),
        expired.clone(),
        applied(450, "app1", Op::Refused("extend", 1)),
    ];
    let run = Run {
        history: &[],
        effects: &[],
        log: &log,
        faults: &[],
        purges: &[],
    };
    let found = violations(&run);
    assert!(
        found
            .iter()
            .any(|v| v.contains("refused extend of the live claim")),
        "{found:?}"
    );
    // ...or a retry claims the key and runs a second time.
    let log = [
        applied(90, "app1", Op::Claimed(1)),
        applied(300, "app1", Op::Extended(1)),
        expired,
        applied(450, "app2", Op::Claimed(2)),
    ];
    let effects = [effect(0, "app1", 100), effect(1, "app2", 460)];
    let run = Run {
        history: &[],
        effects: &effects,
        log: &log,
        faults: &[],
        purges: &[],
    };
    let found = violations(&run);
    assert!(
        found
            .iter()
            .any(|v| v.contains("took over a claim extended")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|v| v.contains("a second effect")),
        "{found:?}"
    );
}
