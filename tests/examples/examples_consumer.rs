//! `cargo run --example consumer` as users run it: a separate process whose
//! queue redelivers messages (duplicates, reordered fields), and with
//! PostgreSQL a consumer killed (SIGKILL) in the middle of a message, then
//! started again: every message's effect is written exactly once.

use std::process::Command;
use tower_idempotency_tests::http::example_binary;

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

#[cfg(feature = "postgres")]
#[test]
fn a_consumer_killed_mid_message_and_restarted_writes_each_effect_once() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
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
    let mut command = Command::new(example_binary("consumer"));
    for (key, value) in env {
        command.env(key, value.unwrap());
    }
    let mut child = command
        .env("CONSUMER_SLOW_MS", "300")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the consumer");
    let reader = BufReader::new(child.stdout.take().unwrap());
    let mut written = 0;
    for line in reader.lines().map_while(Result::ok) {
        if line.starts_with("effect written for message") {
            written += 1;
            if written == 5 {
                break;
            }
        }
    }
    assert_eq!(
        written, 5,
        "the consumer wrote five effects before the kill"
    );
    child.kill().unwrap(); // SIGKILL: no cleanup, the fifth effect uncommitted
    child.wait().unwrap();
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
