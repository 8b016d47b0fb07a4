//! Local phases on PostgreSQL: a phase's writes and its recovery point
//! commit in one transaction, fenced by the claim's token.

use super::*;
use tokio::sync::Notify;
use tower_idempotency::engine::{Engine, Identity, Outcome, PhaseError, RunContext};
use tower_idempotency::store::{Maintenance, StoreError};
use tower_idempotency::IdempotencyKey;

async fn orders(url: &str, table: &str) -> (tokio_postgres::Client, String) {
    let sql = pg::connect(url).await;
    let orders = format!("{table}_orders");
    sql.batch_execute(&format!(r#"CREATE TABLE "{orders}" (item text NOT NULL)"#))
        .await
        .unwrap();
    (sql, orders)
}

async fn items(sql: &tokio_postgres::Client, orders: &str) -> Vec<String> {
    let rows = sql
        .query(
            &format!(r#"SELECT item FROM "{orders}" ORDER BY item"#),
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// Inserts `item` in phase `phase`'s transaction, then fails if `fail`.
async fn insert(
    context: &RunContext,
    orders: &str,
    phase: &str,
    item: &str,
    fail: bool,
) -> Result<String, PhaseError<String>> {
    let phases = context.phases().expect("a phased engine");
    let statement = format!(r#"INSERT INTO "{orders}" (item) VALUES ($1)"#);
    phases
        .local(phase, |client| async move {
            client
                .execute(&statement, &[&item])
                .await
                .map_err(|e| e.to_string())?;
            match fail {
                true => Err(format!("{phase} failed after its write")),
                false => Ok(item.to_owned()),
            }
        })
        .await
}

fn key() -> (Scope, IdempotencyKey) {
    (
        Scope::new("shop"),
        IdempotencyKey::parse(b"order-local-0001").unwrap(),
    )
}

/// A phase that fails rolls its own write back and records nothing; the
/// phase before it stays committed with its recovery point, and the retry
/// runs only the failed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_phase_commits_its_writes_with_its_recovery_point_or_neither() {
    let Some(url) = pg::database_url("local phases") else {
        return;
    };
    let table = pg::unique_table("phases");
    let store = pg::store(&url, &table, |s| s).await;
    let (sql, orders) = orders(&url, &table).await;
    let engine = Engine::phased(store);
    let (scope, key) = key();

    for attempt in 1..=2 {
        let table = orders.clone();
        let run = move |context: RunContext| async move {
            let orders = table;
            // On the retry, recorded: not run again (one row "reserved").
            let reserve = insert(&context, &orders, "reserve", "reserved", false);
            let first = reserve.await.map_err(|e| e.to_string())?;
            let pay = insert(&context, &orders, "pay", "paid", attempt == 1).await;
            let second = pay.map_err(|e| e.to_string())?;
            Ok::<_, String>(format!("{first} {second}"))
        };
        let outcome = engine.run(&scope, &key, Identity::Bytes(b"o"), run).await;
        match attempt {
            1 => {
                assert!(outcome.is_err(), "{outcome:?}");
                assert_eq!(items(&sql, &orders).await, ["reserved"]);
            }
            _ => assert_eq!(outcome.unwrap(), Outcome::Executed("reserved paid".into())),
        }
    }
    assert_eq!(items(&sql, &orders).await, ["paid", "reserved"]);
}

/// The first run stops before its second phase and its lock runs out (set
/// in the past in SQL, so no heartbeat can race it: the lock is long); the
/// retry takes over, resumes after phase 1 and commits phase 2. The first
/// run then goes on to phase 2 too: its record is refused in the
/// transaction that holds its write, and the write rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_local_phase_commits_nothing() {
    let Some(url) = pg::database_url("local phases") else {
        return;
    };
    let table = pg::unique_table("phases");
    let lock = Duration::from_secs(600);
    let store = pg::store(&url, &table, |s| s.with_lock_timeout(lock)).await;
    let (sql, orders) = orders(&url, &table).await;
    let engine = Engine::phased(store);
    let (scope, key) = key();
    let (stopped, resume) = (Arc::new(Notify::new()), Arc::new(Notify::new()));

    let first = {
        let (engine, orders) = (engine.clone(), orders.clone());
        let (stopped, resume) = (stopped.clone(), resume.clone());
        let (scope, key) = (scope.clone(), key.clone());
        tokio::spawn(async move {
            let run = move |context: RunContext| async move {
                insert(&context, &orders, "reserve", "reserved", false)
                    .await
                    .map_err(|e| e.to_string())?;
                stopped.notify_one();
                resume.notified().await;
                match insert(&context, &orders, "pay", "paid-stale", false).await {
                    Err(PhaseError::Store(StoreError::ClaimLost)) => {
                        Err::<String, _>("claim lost".to_owned())
                    }
                    other => Err(format!("expected the claim lost, got {other:?}")),
                }
            };
            engine.run(&scope, &key, Identity::Bytes(b"o"), run).await
        })
    };
    stopped.notified().await;
    let expired = sql
        .execute(
            &format!(r#"UPDATE "{table}" SET expires_at = now() - interval '1 second'"#),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(expired, 1);

    let retry = {
        let orders = orders.clone();
        move |context: RunContext| async move {
            assert!(context.attempt().is_takeover());
            let first = insert(&context, &orders, "reserve", "reserved-again", false).await;
            let second = insert(&context, &orders, "pay", "paid", false).await;
            Ok::<_, PhaseError<String>>(format!("{} {}", first?, second?))
        }
    };
    let outcome = engine.run(&scope, &key, Identity::Bytes(b"o"), retry).await;
    assert_eq!(outcome.unwrap(), Outcome::Executed("reserved paid".into()));

    resume.notify_one();
    let stale = first.await.unwrap();
    assert!(
        matches!(&stale, Err(tower_idempotency::engine::EngineError::Operation(e)) if e == "claim lost"),
        "{stale:?}"
    );
    assert_eq!(items(&sql, &orders).await, ["paid", "reserved"]);
}

/// What a phase costs on PostgreSQL, by the store's counter (warm): an
/// operation of a phased engine that uses no phases costs what an unphased
/// one does (`begin`, `complete`); its first phase adds the read of the
/// recorded phases and each phase one statement that records it. A local
/// phase is three: `BEGIN`, the record, `COMMIT` (its own statements aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase_costs_one_round_trip_and_a_local_phase_three() {
    let Some(url) = pg::database_url("phase cost") else {
        return;
    };
    let table = pg::unique_table("phase_cost");
    let store = pg::store(&url, &table, |s| s).await;
    let engine = Engine::phased(store.clone());
    let count = || store.round_trips();
    let trips = tower_idempotency_tests::phase_cost::report("PostgreSQL", &engine, count).await;
    assert_eq!(trips, [2, 4, 6], "0, 1 and 3 phases");

    let (sql, orders) = self::orders(&url, &table).await;
    let mut local = [0; 2];
    for (slot, phases) in [1usize, 3].into_iter().enumerate() {
        for run in 0..3 {
            let key = IdempotencyKey::parse(format!("local-{phases}-{run}").as_bytes()).unwrap();
            let orders = orders.clone();
            let operation = move |context: RunContext| async move {
                for n in 0..phases {
                    let item = format!("{phases}-{run}-{n}");
                    insert(&context, &orders, &format!("step-{n}"), &item, false).await?;
                }
                Ok::<_, PhaseError<String>>(phases)
            };
            let before = store.round_trips();
            let scope = Scope::new("cost");
            let outcome = engine.run(&scope, &key, Identity::Bytes(b"l"), operation);
            assert_eq!(outcome.await.unwrap(), Outcome::Executed(phases));
            // The last of three runs, warm.
            local[slot] = store.round_trips() - before;
        }
    }
    eprintln!(
        "phase cost on PostgreSQL: round trips per operation with 1 / 3 local phases: {} / {}",
        local[0], local[1]
    );
    assert_eq!(local, [2 + 1 + 3, 2 + 1 + 3 * 3], "1 and 3 local phases");
    assert_eq!(items(&sql, &orders).await.len(), 3 + 9);
}

/// Expired recovery points are purged however many there are, even when
/// few records expire with them: each batch deletes as many phases as
/// records, and the purge goes on while either fills its batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_goes_on_while_expired_phases_fill_its_batches() {
    let Some(url) = pg::database_url("phase purge") else {
        return;
    };
    let table = pg::unique_table("phases");
    let store = pg::store(&url, &table, |s| s).await;
    let sql = pg::connect(&url).await;
    let phases = format!("{table}_phases");
    sql.batch_execute(&format!(
        r#"INSERT INTO "{phases}" (scope, key, phase, fingerprint, output, expires_at)
SELECT 'shop', 'key-' || g, 'reserve', '\x00', '\x00', now() - interval '1 second'
FROM generate_series(1, 2500) AS g"#
    ))
    .await
    .unwrap();

    store.purge_expired().await.unwrap();
    let left: i64 = sql
        .query_one(&format!(r#"SELECT count(*) FROM "{phases}""#), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "expired phases left after a purge");
}

/// Another request under the key (another body, after the first was
/// released with a recovery point) runs a local phase: its record is
/// refused and its writes roll back; the first request's retry resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_requests_local_phase_commits_nothing_while_the_first_ones_phases_live() {
    use tower_idempotency::store::phases::PhasesOfAnotherRequest;
    let Some(url) = pg::database_url("local phases") else {
        return;
    };
    let table = pg::unique_table("phases");
    let store = pg::store(&url, &table, |s| s).await;
    let (sql, orders) = orders(&url, &table).await;
    let engine = Engine::phased(store);
    let (scope, key) = key();

    let first = |fail: bool| {
        let orders = orders.clone();
        move |context: RunContext| async move {
            let reserved = insert(&context, &orders, "reserve", "reserved", false).await;
            let reserved = reserved.map_err(|e| e.to_string())?;
            match fail {
                true => Err(format!("{reserved}, then failed")),
                false => Ok(reserved),
            }
        }
    };
    let failed = engine
        .run(&scope, &key, Identity::Bytes(b"a"), first(true))
        .await;
    assert!(failed.is_err(), "{failed:?}");

    let other = {
        let orders = orders.clone();
        move |context: RunContext| async move {
            match insert(&context, &orders, "reserve", "other", false).await {
                Err(PhaseError::Store(StoreError::Backend(e)))
                    if e.downcast_ref::<PhasesOfAnotherRequest>().is_some() =>
                {
                    Err::<String, _>("refused".to_owned())
                }
                other => Err(format!("expected a refusal, got {other:?}")),
            }
        }
    };
    let refused = engine.run(&scope, &key, Identity::Bytes(b"b"), other).await;
    assert!(
        matches!(&refused, Err(e) if e.to_string().contains("refused")),
        "{refused:?}"
    );
    assert_eq!(items(&sql, &orders).await, ["reserved"]);

    let retry = engine
        .run(&scope, &key, Identity::Bytes(b"a"), first(false))
        .await;
    assert_eq!(retry.unwrap(), Outcome::Executed("reserved".into()));
    assert_eq!(items(&sql, &orders).await, ["reserved"]);
}
