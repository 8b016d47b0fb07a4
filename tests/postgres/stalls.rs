//! `PostgresStore` stalled at every phase of a request, plain and
//! transactional: instance A's pool and listener go through a proxy that
//! freezes, instance B shares the table directly (see tests/common/stalls.rs).
//!
//! Plain mode counts the handler's runs (its effect); transactional mode
//! writes one row per run through the request's `PostgresTransaction` and
//! counts the committed rows, so a run rolled back is no effect. In
//! transactional mode nothing commits without its record: exactly one effect
//! must hold for every stall length.

use std::sync::Arc;
use tower_idempotency::{IdempotencyLayer, PostgresStore, PostgresTransaction};
use tower_idempotency_tests::stalls::{
    run_phase, Count, Mode, Phase, World, Write, LOCK, OPERATION,
};
use tower_idempotency_tests::support::pg;
use tower_idempotency_tests::support::proxy::Proxy;

/// A migrated table of the case's own (so no other case's notifications
/// reach its listener), and in transactional mode a table of effects.
async fn tables(url: &str, mode: Mode) -> (String, Option<String>) {
    let table = pg::unique_table("stalls");
    pg::store(url, &table, |s| s).await;
    let effects = match mode {
        Mode::Plain => None,
        Mode::Transactional => {
            let effects = pg::unique_table("stall_effects");
            pg::connect(url)
                .await
                .batch_execute(&format!(
                    "CREATE TABLE {effects} (key text NOT NULL, run bigint NOT NULL)"
                ))
                .await
                .unwrap();
            Some(effects)
        }
    };
    (table, effects)
}

fn layer(store: PostgresStore, mode: Mode) -> IdempotencyLayer {
    match mode {
        Mode::Plain => IdempotencyLayer::new(store),
        Mode::Transactional => IdempotencyLayer::transactional(store),
    }
}

/// A behind a proxy of its own (pool and listener), B direct, on a table
/// of their own.
async fn world(url: &str, mode: Mode) -> World {
    let (table, effects) = tables(url, mode).await;
    let (table, effects) = (table.as_str(), effects.as_deref());
    let proxy = Arc::new(Proxy::start_half_closing(pg::server_addr(url).await).await);
    let through = || pg::pg_config_at(url, proxy.port);
    let a_store = PostgresStore::builder(pg::pool(through(), 4))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(LOCK)
        .with_operation_timeout(OPERATION)
        .with_listener(through())
        .build();
    let b_store = PostgresStore::builder(pg::pool(pg::pg_config(url), 4))
        .with_table(table.parse().unwrap())
        .with_lock_timeout(LOCK)
        .with_listener(pg::pg_config(url))
        .build();
    let a_waiting = {
        let store = a_store.clone();
        Arc::new(move || store.watched_keys() > 0)
    };
    World {
        proxy,
        a: layer(a_store, mode),
        b: layer(b_store, mode),
        a_waiting,
        effect: effects.map(|effects| (write(effects), count(url, effects))),
    }
}

/// Inserts the run's row through the request's transaction.
fn write(effects: &str) -> Write {
    let sql = format!("INSERT INTO {effects} (key, run) VALUES ($1, $2)");
    Arc::new(move |extensions, key, run| {
        let tx = extensions.get::<PostgresTransaction>().cloned();
        let sql = sql.clone();
        Box::pin(async move {
            let tx = tx.ok_or("no PostgresTransaction in the request")?;
            let client = tx.client().await.map_err(|e| e.to_string())?;
            client
                .execute(&sql, &[&key, &(run as i64)])
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    })
}

/// The committed rows of a key.
fn count(url: &str, effects: &str) -> Count {
    let (url, sql) = (
        url.to_owned(),
        format!("SELECT count(*) FROM {effects} WHERE key = $1"),
    );
    Arc::new(move |key| {
        let (url, sql) = (url.clone(), sql.clone());
        Box::pin(async move {
            let n: i64 = pg::connect(&url)
                .await
                .query_one(&sql, &[&key])
                .await
                .unwrap()
                .get(0);
            n as usize
        })
    })
}

async fn stall_at(test: &str, mode: Mode, phase: Phase) {
    let Some(url) = pg::database_url(test) else {
        return;
    };
    run_phase("postgres", mode, phase, || world(&url, mode)).await;
}

mod plain {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_claim_runs_once_and_frees_the_key_within_its_lock() {
        stall_at("plain_stalled_claim", Mode::Plain, Phase::Claim).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_heartbeat_up_to_half_the_lock_is_survived_and_fenced_past_it() {
        stall_at("plain_stalled_heartbeat", Mode::Plain, Phase::Handler).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_completion_up_to_half_the_lock_is_recorded_once_and_fenced_past_it() {
        stall_at("plain_stalled_completion", Mode::Plain, Phase::Complete).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_waiter_replays_or_refuses_and_never_runs() {
        stall_at("plain_stalled_waiter", Mode::Plain, Phase::Wait).await;
    }
}

mod transactional {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_claim_and_transaction_begin_commit_once_and_free_the_key() {
        stall_at("tx_stalled_claim", Mode::Transactional, Phase::Claim).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_open_transaction_commits_once_at_any_length() {
        stall_at("tx_stalled_handler", Mode::Transactional, Phase::Handler).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_commit_commits_once_at_any_length() {
        stall_at("tx_stalled_commit", Mode::Transactional, Phase::Complete).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_waiter_replays_or_refuses_and_never_runs() {
        stall_at("tx_stalled_waiter", Mode::Transactional, Phase::Wait).await;
    }
}
