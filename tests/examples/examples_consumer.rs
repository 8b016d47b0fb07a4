//! `cargo run --example consumer` as users run it: a separate process whose
//! queue redelivers messages (duplicates, reordered fields), and with
//! PostgreSQL a consumer killed (SIGKILL) in the middle of a message, then
//! started again: every message's effect is written exactly once. With the
//! card processor (`examples/processor.rs`, a process too), a consumer killed
//! between a message's charge and its record charges it once: the message
//! redelivered to the restarted consumer runs again under the same
//! downstream key, on PostgreSQL and even on the memory store that forgot it.

use std::process::Command;
use tower_idempotency::{downstream::DownstreamKeys, IdempotencyKey, Scope};
use tower_idempotency_tests::http::{example_binary, HttpClient, RunningExample};

/// Runs the consumer to its end with `env`; returns its output lines.
fn run_to_end(env: &[(&str, Option<&str>)]) -> Vec<String> {
    let mut command = Command::new(example_binary("consumer"));
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let output = command.output().expect("run the consumer");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "the consumer failed: {stdout}");
    stdout.lines().map(str::to_owned).collect()
}

#[test]
fn duplicates_and_reordered_redeliveries_write_each_effect_once() {
    let lines = run_to_end(&[("DATABASE_URL", None), ("CONSUMER_MESSAGES", Some("30"))]);
    assert_eq!(lines[0], "idempotency store: memory");
    assert_eq!(
        lines.last().unwrap(),
        "messages 30, deliveries 40, effects 30"
    );
    let again = lines
        .iter()
        .filter(|l| l.ends_with("delivered again: not run again"));
    assert_eq!(again.count(), 10);
}

/// Starts the consumer with `env` and SIGKILLs it once it printed `after`
/// lines starting with `prefix` (the consumer pauses after each effect,
/// before its record, so the kill lands in that window); returns the last.
fn kill_after(env: &[(&str, Option<&str>)], prefix: &str, after: usize) -> String {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut command = Command::new(example_binary("consumer"));
    for (key, value) in env {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    let mut child = command
        .env("CONSUMER_SLOW_MS", "300")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the consumer");
    let reader = BufReader::new(child.stdout.take().unwrap());
    let seen: Vec<String> = reader
        .lines()
        .map_while(Result::ok)
        .filter(|line| line.starts_with(prefix))
        .take(after)
        .collect();
    assert_eq!(
        seen.len(),
        after,
        "the consumer printed {after} {prefix:?} lines"
    );
    child.kill().unwrap(); // SIGKILL: no cleanup, the last one unrecorded
    child.wait().unwrap();
    seen.last().cloned().unwrap_or_default()
}

/// Each message charged once at the processor, under its downstream key
/// for `name` (`card-processor`, or `phase:charge` for the phased consumer).
async fn one_charge_per_message(processor: &HttpClient, messages: u64, name: &str) {
    let listed = processor.get("/v1/charges", &[]).await.json();
    let charges = listed["charges"].as_array().unwrap();
    assert_eq!(charges.len() as u64, messages, "{charges:#?}");
    for id in 1..=messages {
        let key = IdempotencyKey::parse(format!("message-{id:06}").as_bytes()).unwrap();
        let want = DownstreamKeys::new(Scope::new("consumer"), key).key_for(name);
        let mine: Vec<_> = charges
            .iter()
            .filter(|c| c["idempotency_key"] == want.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "message {id}: {charges:#?}");
        assert_eq!(mine[0]["amount"], 100 * id);
    }
}

/// Killed after the fifth message's charge, before its record; started
/// again, everything is redelivered. On PostgreSQL the four recorded
/// messages replay and the fifth runs again (its effect had rolled back),
/// sending the processor the same key: one charge for each message.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_the_charge_and_the_record_charges_each_message_once() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        assert!(
            std::env::var("REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "REQUIRE_POSTGRES=1 but DATABASE_URL is not set"
        );
        eprintln!("\n*** SKIPPED consumer and processor: DATABASE_URL is not set ***\n");
        return;
    };
    let processor = RunningExample::start("processor", &[("PROCESSOR_LEDGER", None)]);
    let processor_url = format!("http://{}", processor.addr);
    let tables = format!("consumer_charge_{}", std::process::id());
    let env = [
        ("DATABASE_URL", Some(url.as_str())),
        ("CONSUMER_TABLES", Some(tables.as_str())),
        ("CONSUMER_MESSAGES", Some("12")),
        ("PROCESSOR_URL", Some(processor_url.as_str())),
    ];
    kill_after(&env, "effect written for message", 5);
    // Blocks this worker; nothing in this process needs it meanwhile.
    let lines = run_to_end(&env);
    assert_eq!(
        lines.last().unwrap(),
        "messages 12, deliveries 16, effects 12"
    );
    // The fifth, charged before the kill, ran again: the processor replayed.
    let replayed = lines
        .iter()
        .filter(|l| l.ends_with(": replayed by the processor"))
        .count();
    assert_eq!(replayed, 1, "{lines:#?}");
    one_charge_per_message(&HttpClient::new(processor.addr), 12, "card-processor").await;
}

/// The memory store forgets every record with the process: the restarted
/// consumer runs every message again, and the processor, getting the same
/// downstream keys, charges none of the five it charged before again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_forgot_its_records_charges_the_processor_once_per_message() {
    let processor = RunningExample::start("processor", &[("PROCESSOR_LEDGER", None)]);
    let processor_url = format!("http://{}", processor.addr);
    let env = [
        ("DATABASE_URL", None),
        ("CONSUMER_MESSAGES", Some("12")),
        ("PROCESSOR_URL", Some(processor_url.as_str())),
    ];
    kill_after(&env, "effect written for message", 5);
    let lines = run_to_end(&env);
    assert_eq!(lines[0], "idempotency store: memory");
    assert_eq!(
        lines.last().unwrap(),
        "messages 12, deliveries 16, effects 12"
    );
    let replayed = lines
        .iter()
        .filter(|l| l.ends_with(": replayed by the processor"))
        .count();
    assert_eq!(replayed, 5, "{lines:#?}");
    one_charge_per_message(&HttpClient::new(processor.addr), 12, "card-processor").await;
}

#[cfg(feature = "postgres")]
#[test]
fn a_consumer_killed_mid_message_and_restarted_writes_each_effect_once() {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        assert!(
            std::env::var("REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "REQUIRE_POSTGRES=1 but DATABASE_URL is not set"
        );
        eprintln!("\n*** SKIPPED consumer crash test: DATABASE_URL is not set ***\n");
        return;
    };
    let tables = format!("consumer_{}", std::process::id());
    let env = [
        ("DATABASE_URL", Some(url.as_str())),
        ("CONSUMER_TABLES", Some(tables.as_str())),
        ("CONSUMER_MESSAGES", Some("12")),
    ];
    // Slow between each effect and its commit; killed after the fifth effect
    // is written, before it commits.
    kill_after(&env, "effect written for message", 5);
    // Started again, the queue delivers everything again.
    let lines = run_to_end(&env);
    assert_eq!(lines[0], "idempotency store: postgres");
    assert_eq!(
        lines.last().unwrap(),
        "messages 12, deliveries 16, effects 12"
    );
    // The four committed before the kill were not run again.
    let rerun = lines
        .iter()
        .filter(|l| l.starts_with("effect written"))
        .count();
    assert_eq!(rerun, 12 - 4, "{lines:?}");
}

/// In recovery points (`CONSUMER_PHASED=1`): killed once the fifth
/// message's charge phase is recorded, and (a second run) inside its
/// effect's phase, after the row is written and before its recovery point.
/// Started again, the fifth message resumes: its charge is not sent again
/// (no charge, not even a replayed one), its effect is one row, and each
/// message is charged once under its charge phase's downstream key.
#[cfg(feature = "postgres")]
async fn phased_consumer_resumes(store: &str, env: &[(&str, Option<&str>)]) {
    for (n, prefix) in ["charge recorded for message", "effect written for message"]
        .into_iter()
        .enumerate()
    {
        let processor = RunningExample::start("processor", &[("PROCESSOR_LEDGER", None)]);
        let processor_url = format!("http://{}", processor.addr);
        let tables = format!("consumer_phased_{}_{n}_{}", &store[..5], std::process::id());
        let mut env = env.to_vec();
        env.extend([
            ("CONSUMER_TABLES", Some(tables.as_str())),
            ("CONSUMER_MESSAGES", Some("12")),
            ("CONSUMER_PHASED", Some("1")),
            ("PROCESSOR_URL", Some(processor_url.as_str())),
        ]);
        let killed = kill_after(&env, prefix, 5);
        let message: u64 = killed[prefix.len()..]
            .trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("a message id in {killed:?}"));
        let lines = run_to_end(&env);
        assert_eq!(lines[0], format!("idempotency store: {store}, phased"));
        let context = format!("{store}, killed at {prefix} {message}");
        assert_eq!(
            lines.last().unwrap(),
            "messages 12, deliveries 16, effects 12",
            "{context}: {lines:#?}"
        );
        // Resumed after the recorded charge: nothing sent to the processor.
        let charged = format!("charged message {message}");
        assert!(
            !lines.iter().any(|l| l.starts_with(&charged)),
            "{context}, charged again: {lines:#?}"
        );
        let written = format!("effect written for message {message}");
        let rewritten = lines.iter().filter(|l| **l == written).count();
        assert_eq!(rewritten, 1, "{context}: {lines:#?}");
        one_charge_per_message(&HttpClient::new(processor.addr), 12, "phase:charge").await;
    }
}

#[cfg(feature = "postgres")]
use tower_idempotency_tests::support::pg::database_url;

/// On PostgreSQL the effect is a local phase: its row commits with its
/// recovery point, so a kill inside it leaves no row.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phased_consumer_killed_between_and_inside_its_phases_resumes_without_charging_again() {
    let Some(url) = database_url("phased consumer") else {
        return;
    };
    let env = [("DATABASE_URL", Some(url.as_str())), ("REDIS_URL", None)];
    phased_consumer_resumes("postgres", &env).await;
}

/// Records and recovery points in Redis, effects in PostgreSQL: the effect is
/// a plain phase whose row commits first, keyed by the message's id, so the
/// phase run again after a kill inside it writes no second row.
#[cfg(all(feature = "postgres", feature = "redis"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phased_consumer_on_redis_killed_between_and_inside_its_phases_resumes_without_charging_again(
) {
    let Some(url) = database_url("phased consumer on Redis") else {
        return;
    };
    let Some(redis) = tower_idempotency_tests::support::redis::url("phased consumer on Redis")
    else {
        return;
    };
    let env = [
        ("DATABASE_URL", Some(url.as_str())),
        ("REDIS_URL", Some(redis.as_str())),
    ];
    phased_consumer_resumes("redis", &env).await;
}
