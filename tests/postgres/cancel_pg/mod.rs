//! Cancel at every poll on PostgreSQL: every `Store` method of a plain
//! `PostgresStore`, every `TransactionalStore`/`RecordTransaction` method,
//! the layer (plain and transactional) and the engine, each future dropped
//! after every number of polls (tests/common/cancel/driver.rs). After each
//! cut, besides the checks of tests/common/cancel/store.rs: no connection of
//! the store's pool (told apart by its `application_name`) stays idle inside
//! a transaction, every pooled connection starts a fresh transaction (its
//! `now()` is not frozen), and completions acknowledged through the pool are
//! committed. The pool has two connections, so a leaked one is reused at once.
//!
//! On the transaction.rs that predates its rewrite for cancellation, the
//! `transaction::` tests (except `rollback_cut_at_every_poll`) and the
//! `claimed_paths::transactional_*` tests fail: a cut `begin_in_transaction`,
//! `open`, `commit` or `commit_unavailable` returns its connection to the pool
//! inside the open transaction.
#![cfg(feature = "test-util")]

mod claimed_paths;
mod every_fault;
mod transaction;

use cases::{Harness, Probe};
use deadpool_postgres::Pool;
use driver::eventually;
use std::time::Duration;
use tower_idempotency::{store::RecordKey, PostgresStore};
use tower_idempotency_tests::cancel::{claimed, driver, store as cases};
use tower_idempotency_tests::store_cut_tests;
use tower_idempotency_tests::support::pg;

const LOCK: Duration = Duration::from_millis(500);
const POOL_SIZE: usize = 2;

/// The store's pool, seen from a connection of the test's own.
pub struct PgProbe {
    monitor: tokio_postgres::Client,
    pool: Pool,
    application_name: String,
    table: String,
}

impl PgProbe {
    /// The rows of `key` in the effects table, committed.
    pub async fn effects(&self, key: &str) -> usize {
        let sql = format!("SELECT count(*) FROM {}_effects WHERE key = $1", self.table);
        let row = self.monitor.query_one(&sql, &[&key]).await.unwrap();
        row.get::<_, i64>(0) as usize
    }

    /// Connections idle inside a transaction for over half a second: longer
    /// than any live owner pauses between its statements here (its handler's
    /// writes, a background `ROLLBACK`), which a connection leaked by a cut
    /// exceeds forever.
    async fn idle_in_transaction(&self) -> Vec<String> {
        let rows = self
            .monitor
            .query(
                "SELECT pid, state, query, (now() - xact_start)::text FROM pg_stat_activity \
                 WHERE application_name = $1 AND state LIKE 'idle in transaction%' \
                 AND now() - state_change > interval '500 milliseconds'",
                &[&self.application_name],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|row| {
                // The row is read as the backend's state moves on: any of
                // its columns may have become NULL.
                format!(
                    "pooled connection (pid {}) is {:?} for {}, last statement {:?}",
                    row.get::<_, Option<i32>>(0).unwrap_or_default(),
                    row.get::<_, Option<String>>(1).unwrap_or_default(),
                    row.get::<_, Option<String>>(3).unwrap_or_default(),
                    row.get::<_, Option<String>>(2).unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Every connection of the pool, all taken at once: each must run its
    /// next statement in a transaction of its own.
    async fn stale_transactions(&self) -> Vec<String> {
        let mut held = Vec::new();
        let mut broken = Vec::new();
        for _ in 0..self.pool.status().max_size {
            match self.pool.get().await {
                Ok(connection) => held.push(connection),
                Err(error) => broken.push(format!("the pool gives no connection: {error}")),
            }
        }
        // Bounded: a connection may queue behind a statement blocked on a
        // row lock that a leaked transaction (perhaps one held here) keeps.
        let answer = Duration::from_secs(3);
        for connection in &held {
            // The simple query protocol: a statement outside a transaction is
            // a transaction of its own, begun as the statement is.
            let row = tokio::time::timeout(
                answer,
                connection.simple_query(
                    "SELECT now() = statement_timestamp(), \
                     pg_current_xact_id_if_assigned()::text, \
                     (statement_timestamp() - now())::text",
                ),
            )
            .await;
            let Ok(row) = row else {
                broken.push(format!(
                    "a pooled connection does not answer within {answer:?} \
                     (queued behind a statement blocked on a lock)"
                ));
                continue;
            };
            let row = row.map(|messages| {
                messages.into_iter().find_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some((
                        row.get(0) == Some("t"),
                        row.get(1).map(str::to_owned),
                        row.get(2).unwrap_or_default().to_owned(),
                    )),
                    _ => None,
                })
            });
            match row {
                Ok(Some((true, _, _))) => {}
                Ok(Some((false, xact, age))) => broken.push(format!(
                    "a pooled connection runs its next statement inside a transaction begun \
                     {age} earlier (now() frozen; transaction id {xact:?})"
                )),
                Ok(None) => broken.push("a pooled connection answered no row".to_owned()),
                Err(error) => broken.push(format!("a pooled connection fails: {error}")),
            }
        }
        broken
    }
}

impl Probe for PgProbe {
    async fn violations(&self) -> Vec<String> {
        // The cut's cleanup (a ROLLBACK sent, a connection closed) runs in
        // the background: give it two seconds.
        eventually(Duration::from_secs(2), || async {
            self.idle_in_transaction().await.is_empty()
        })
        .await;
        let mut broken = self.idle_in_transaction().await;
        broken.extend(self.stale_transactions().await);
        broken
    }

    async fn committed(&self, key: &RecordKey) -> Option<bool> {
        let sql = format!(
            "SELECT state FROM {} WHERE scope = $1 AND key = $2",
            self.table
        );
        let rows = self
            .monitor
            .query(&sql, &[&key.scope().as_str(), &key.key().as_str()])
            .await
            .unwrap();
        // Completed with a response or without one ('unavailable').
        let state = rows.first().map(|row| row.get::<_, String>(0));
        Some(state.is_some_and(|state| state != "in_progress"))
    }
}

/// A migrated store on a two-connection pool of its own, with an effects
/// table beside it.
pub async fn postgres() -> Option<Harness<PostgresStore, PgProbe>> {
    let url = pg::database_url("cancel_pg")?;
    let table = pg::unique_table("cut");
    let application_name = format!("cut-{table}");
    let mut config = pg::pg_config(&url);
    config.application_name(&application_name);
    let pool = pg::pool(config, POOL_SIZE);
    let store = PostgresStore::builder(pool.clone())
        .with_table(table.parse().unwrap())
        .with_lock_timeout(LOCK)
        .with_operation_timeout(Duration::from_secs(2))
        .with_listener(pg::pg_config(&url))
        .build();
    store.migrate().await.expect("migrate");
    let monitor = pg::connect(&url).await;
    monitor
        .batch_execute(&format!("CREATE TABLE {table}_effects (key text NOT NULL)"))
        .await
        .unwrap();
    Some(Harness {
        store,
        probe: PgProbe {
            monitor,
            pool,
            application_name,
            table,
        },
        lock: LOCK,
    })
}

store_cut_tests!(postgres);
