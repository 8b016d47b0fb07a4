//! Transactional mode claims a key with its advisory lock alone and writes
//! the record once, at completion: what that must never open up. A rival
//! finds the key in progress without blocking, a killed owner leaves the key
//! free at once, and two keys whose locks collide only make one wait.

use super::*;
use tower_idempotency::store::{Completion, RecordTransaction, TransactionalStore};
use tower_idempotency::store::{PostgresRecordTransaction, PostgresStoreBuilder};

/// Generous: only reached when a call blocks instead of answering.
const NEVER: Duration = Duration::from_secs(20);

async fn begin_txn(
    store: &PostgresStore,
    key: &RecordKey,
    body: &str,
) -> (Begin, Option<PostgresRecordTransaction>) {
    tokio::time::timeout(NEVER, store.begin_in_transaction(key, &fingerprint(body)))
        .await
        .expect("begin_in_transaction answers without waiting for the owner")
        .expect("begin_in_transaction")
}

async fn claimed(store: &PostgresStore, key: &RecordKey, body: &str) -> PostgresRecordTransaction {
    match begin_txn(store, key, body).await {
        (Begin::Claimed(claim), Some(transaction)) => {
            assert_eq!(claim.attempt(), 1, "nothing was left to take over");
            transaction
        }
        (other, _) => panic!("expected a claim with its transaction, got {other:?}"),
    }
}

async fn in_progress(store: &PostgresStore, key: &RecordKey, body: &str) {
    let (begun, transaction) = begin_txn(store, key, body).await;
    assert!(matches!(begun, Begin::InProgress), "got {begun:?}");
    assert!(transaction.is_none());
    let plain = tokio::time::timeout(NEVER, store.begin(key, &fingerprint(body)))
        .await
        .expect("begin answers without waiting for the owner")
        .expect("begin");
    assert!(matches!(plain, Begin::InProgress), "plain begin: {plain:?}");
}

async fn replays(store: &PostgresStore, key: &RecordKey, body: &str, expected: &[u8]) {
    match begin_txn(store, key, body).await {
        (Begin::Replay(stored), None) => assert_eq!(&stored.body[..], expected),
        (other, _) => panic!("expected a replay of {expected:?}, got {other:?}"),
    }
}

/// The handler's handle to the claim's transaction.
fn handle(transaction: &PostgresRecordTransaction) -> PostgresTransaction {
    let mut extensions = http::Extensions::new();
    transaction.share(&mut extensions);
    extensions.get::<PostgresTransaction>().cloned().unwrap()
}

async fn rows_of(sql: &tokio_postgres::Client, table: &str, key: &RecordKey) -> i64 {
    sql.query_one(
        &format!(r#"SELECT count(*) FROM public."{table}" WHERE scope = $1 AND key = $2"#),
        &[&key.scope().as_str(), &key.key().as_str()],
    )
    .await
    .unwrap()
    .get(0)
}

/// While the owner's transaction runs, nothing of its claim is written: a
/// second instance finds the key in progress at once (its lock) and draws no
/// token, and the record is inserted once, at completion, never rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_claim_is_its_lock_and_its_record_is_written_once() {
    let Some(url) = pg::database_url("a_transactional_claim_is_its_lock") else {
        return;
    };
    let table = pg::unique_table("once");
    let owner = pg::store(&url, &table, |s| s).await;
    let rival = pg::store(&url, &table, |s| s).await;
    let sql = pg::connect(&url).await;
    let key = fresh_key();

    let transaction = claimed(&owner, &key, "a").await;
    assert_eq!(rows_of(&sql, &table, &key).await, 0, "no claim row");
    let tokens = format!(r#"SELECT last_value FROM public."{table}_token_seq""#);
    let drawn: i64 = sql.query_one(&tokens, &[]).await.unwrap().get(0);
    in_progress(&rival, &key, "a").await;
    in_progress(&rival, &key, "other request").await;
    let after: i64 = sql.query_one(&tokens, &[]).await.unwrap().get(0);
    assert_eq!(after, drawn, "an answer of \"in progress\" draws no token");

    transaction
        .commit(Completion::Response(response(b"A")))
        .await
        .expect("commit");
    replays(&rival, &key, "a", b"A").await;
    let row = sql
        .query_one(
            &format!(
                r#"SELECT ctid::text, xmax::text, state FROM public."{table}"
                   WHERE scope = $1 AND key = $2"#
            ),
            &[&key.scope().as_str(), &key.key().as_str()],
        )
        .await
        .unwrap();
    let (ctid, xmax, state): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(state, "completed");
    assert_eq!(
        (ctid.as_str(), xmax.as_str()),
        ("(0,1)", "0"),
        "the table's only row version: inserted once, never updated"
    );
}

/// The owner's session is killed while its handler runs: its lock goes with
/// it, so a retry on another instance claims at once (attempt 1: the dead
/// transaction left nothing), runs once and records; the dead owner's writes
/// and its late completion commit nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_frees_its_key_at_once_and_the_retry_runs_once() {
    let Some(url) = pg::database_url("a_killed_owner_frees_its_key_at_once") else {
        return;
    };
    let table = pg::unique_table("killed");
    // A lock far longer than the test: only the session's end frees the key.
    let long = |s: PostgresStoreBuilder| s.with_lock_timeout(Duration::from_secs(600));
    let owner = pg::store(&url, &table, long).await;
    let retry = pg::store(&url, &table, long).await;
    let sql = pg::connect(&url).await;
    let orders = format!("{table}_orders");
    sql.batch_execute(&format!(r#"CREATE TABLE "{orders}" (body text NOT NULL)"#))
        .await
        .unwrap();
    let insert = format!(r#"INSERT INTO "{orders}" (body) VALUES ($1)"#);
    let key = fresh_key();

    let dead = claimed(&owner, &key, "a").await;
    let pid: i32 = {
        let client = handle(&dead).client().await.unwrap();
        client.execute(&insert, &[&"dead"]).await.unwrap();
        client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0)
    };
    in_progress(&retry, &key, "a").await;

    let killed: bool = sql
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    let deadline = Instant::now() + NEVER;
    loop {
        let left: i64 = sql
            .query_one(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE pid = $1) \
                      + (SELECT count(*) FROM pg_locks WHERE pid = $1)",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the killed session never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let again = claimed(&retry, &key, "a").await;
    handle(&again)
        .client()
        .await
        .unwrap()
        .execute(&insert, &[&"retry"])
        .await
        .unwrap();
    again
        .commit(Completion::Response(response(b"retry")))
        .await
        .expect("the retry commits");
    assert!(
        dead.commit(Completion::Response(response(b"dead")))
            .await
            .is_err(),
        "the dead owner's connection is gone"
    );

    replays(&retry, &key, "a", b"retry").await;
    replays(&owner, &key, "a", b"retry").await;
    let bodies: Vec<String> = sql
        .query(&format!(r#"SELECT body FROM "{orders}""#), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(bodies, ["retry"], "the handler's writes committed once");
}

/// Every key of a scope shares one advisory lock (an injected collision):
/// while one key's owner runs, another key's completed record still replays
/// as itself and a third key only answers "in progress" until the owner ends,
/// then runs once; no record answers for another key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colliding_key_locks_only_make_a_key_wait_and_never_replay_another_record() {
    let Some(url) = pg::database_url("colliding_key_locks_only_make_a_key_wait") else {
        return;
    };
    let table = pg::unique_table("collide");
    let owner = pg::store(&url, &table, |s| s.with_colliding_key_locks()).await;
    let rival = pg::store(&url, &table, |s| s.with_colliding_key_locks()).await;
    let scope = pg::unique_table("tenant");
    let (a, b, c) = (
        record(&scope, "key-0000000a"),
        record(&scope, "key-0000000b"),
        record(&scope, "key-0000000c"),
    );

    claimed(&owner, &a, "a")
        .await
        .commit(Completion::Response(response(b"A")))
        .await
        .expect("a commits");

    let running_b = claimed(&owner, &b, "b").await;
    replays(&rival, &a, "a", b"A").await;
    let (mismatch, _) = begin_txn(&rival, &a, "b").await;
    assert!(matches!(mismatch, Begin::KeyReused), "got {mismatch:?}");
    in_progress(&rival, &c, "c").await;
    in_progress(&rival, &b, "b").await;

    running_b
        .commit(Completion::Response(response(b"B")))
        .await
        .expect("b commits");
    claimed(&rival, &c, "c")
        .await
        .commit(Completion::Response(response(b"C")))
        .await
        .expect("c commits");

    for store in [&owner, &rival] {
        replays(store, &a, "a", b"A").await;
        replays(store, &b, "b", b"B").await;
        replays(store, &c, "c", b"C").await;
    }
}

/// A database whose transactions default to SERIALIZABLE reads with the
/// transaction's first snapshot, taken before the key's lock: a record
/// committed in between would be missed. Such a store claims with a row
/// written in the transaction instead, and still runs each request once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_default_claims_with_a_row_and_runs_once() {
    let Some(url) = pg::database_url("a_serializable_default_claims_with_a_row") else {
        return;
    };
    let table = pg::unique_table("serializable");
    let mut config = pg::pg_config(&url);
    config.options("-c default_transaction_isolation=serializable");
    let owner = PostgresStore::builder(pg::pool(config, 4))
        .with_table(table.parse().unwrap())
        .build();
    owner.migrate().await.expect("migrate");
    let rival = pg::store(&url, &table, |s| s).await;
    let sql = pg::connect(&url).await;
    let key = fresh_key();

    let transaction = claimed(&owner, &key, "a").await;
    in_progress(&rival, &key, "a").await;
    in_progress(&owner, &key, "a").await;
    transaction
        .commit(Completion::Response(response(b"A")))
        .await
        .expect("commit");
    replays(&rival, &key, "a", b"A").await;
    replays(&owner, &key, "a", b"A").await;
    let ctid: String = sql
        .query_one(
            &format!(r#"SELECT ctid::text FROM public."{table}" WHERE scope = $1 AND key = $2"#),
            &[&key.scope().as_str(), &key.key().as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ctid, "(0,2)", "a claim row, completed by an update");
}

/// A key whose record expired is claimed again (attempt 1: it completed) and
/// its new record is written over the old row, in the claiming transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_record_is_claimed_again_and_overwritten_once() {
    let Some(url) = pg::database_url("an_expired_record_is_claimed_again") else {
        return;
    };
    let table = pg::unique_table("expired");
    let retention = Duration::from_millis(300);
    // No tombstone: the key is free for another body once the record expired.
    let store = pg::store(&url, &table, |s| {
        s.with_retention(retention).with_tombstone(Duration::ZERO)
    })
    .await;
    let sql = pg::connect(&url).await;
    let key = fresh_key();

    claimed(&store, &key, "a")
        .await
        .commit(Completion::Response(response(b"first")))
        .await
        .expect("first commit");
    tokio::time::sleep(retention + Duration::from_millis(300)).await;
    // Another request under the key, now that the first one's record expired.
    let again = claimed(&store, &key, "b").await;
    in_progress(&store, &key, "b").await;
    again
        .commit(Completion::Response(response(b"second")))
        .await
        .expect("second commit");
    // Read in SQL: the new record may have expired again by now.
    let rows = sql
        .query(
            &format!(
                r#"SELECT state, body, fingerprint = $3 FROM public."{table}"
                   WHERE scope = $1 AND key = $2"#
            ),
            &[
                &key.scope().as_str(),
                &key.key().as_str(),
                &fingerprint("b").fingerprint().as_bytes().as_slice(),
            ],
        )
        .await
        .unwrap();
    let [row] = &rows[..] else {
        panic!("one row for the key, got {}", rows.len());
    };
    let (state, body, same): (String, Vec<u8>, bool) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (state.as_str(), &body[..], same),
        ("completed", &b"second"[..], true)
    );
}

/// A transactional completion sends its key's wake-up only when the key has
/// waiters: none when nobody waits, and a waiter on another instance
/// (registered on its listener's session before its first check, one
/// registration per key) is woken by it, before its first re-check; a waiter
/// that gave up is unregistered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_completion_wakes_only_registered_waiters() {
    let Some(url) = pg::database_url("a_transactional_completion_wakes_only_registered") else {
        return;
    };
    let (owner, waiting) = owner_and_listening_waiter(&url, "wake").await;

    let key = fresh_key();
    let received = waiting.notifications_received();
    claimed(&owner, &key, "a")
        .await
        .commit(Completion::Response(response(b"A")))
        .await
        .expect("commit");
    replays(&waiting, &key, "a", b"A").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        waiting.notifications_received(),
        received,
        "nobody waited: no wake-up"
    );

    let key = fresh_key();
    let transaction = claimed(&owner, &key, "a").await;
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (store, key) = (waiting.clone(), key.clone());
            tokio::spawn(async move {
                store.wait(&key, NEVER).await.unwrap();
                Instant::now()
            })
        })
        .collect();
    // Registered and checked once; their first re-check is 250 ms away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(waiting.registered_keys(), 1, "one registration per key");
    let committed = Instant::now();
    transaction
        .commit(Completion::Response(response(b"B")))
        .await
        .expect("commit");
    for waiter in waiters {
        let woken = tokio::time::timeout(NEVER, waiter)
            .await
            .expect("woken")
            .unwrap();
        eprintln!("woken {:?} after the commit", woken - committed);
    }
    assert!(
        waiting.notifications_received() > received,
        "the completion woke its waiters"
    );
    assert_eq!(waiting.registered_keys(), 0, "the last waiter unregistered");
    replays(&waiting, &key, "a", b"B").await;

    let key = fresh_key();
    let transaction = claimed(&owner, &key, "a").await;
    waiting
        .wait(&key, Duration::from_millis(50))
        .await
        .expect("gives up");
    tokio::time::sleep(Duration::from_millis(300)).await;
    commits_without_a_wake_up(
        &waiting,
        transaction,
        "the waiter that gave up was unregistered: no wake-up",
    )
    .await;
}

/// Two instances on one new table: an owner, and one whose listener is up
/// (its waiters register there).
async fn owner_and_listening_waiter(url: &str, name: &str) -> (PostgresStore, Arc<PostgresStore>) {
    let table = pg::unique_table(name);
    let owner = pg::store(url, &table, |s| s).await;
    let waiting = Arc::new(pg::store(url, &table, |s| s).await);
    until_listening(&waiting).await;
    (owner, waiting)
}

/// Commits `transaction` and asserts that `waiting` received no wake-up
/// for it (`why` otherwise).
async fn commits_without_a_wake_up(
    waiting: &PostgresStore,
    transaction: PostgresRecordTransaction,
    why: &str,
) {
    let received = waiting.notifications_received();
    transaction
        .commit(Completion::Response(response(b"done")))
        .await
        .expect("commit");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(waiting.notifications_received(), received, "{why}");
}

/// A waiter dropped while its registration's statement is on the wire (a
/// client hanging up) leaves no lock on the listener's session: the
/// registration runs to its answer and is undone, so dropped waiters cannot
/// fill the server's lock table, which every session shares. A lock left
/// behind would make the key's completion see a waiter and send a wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_dropped_while_registering_leave_no_lock_on_the_session() {
    let Some(url) = pg::database_url("waiters_dropped_while_registering") else {
        return;
    };
    let (owner, waiting) = owner_and_listening_waiter(&url, "dropped").await;
    let key = fresh_key();
    let transaction = claimed(&owner, &key, "a").await;
    // Dropped at every delay from the first poll to well past the statement.
    for round in 0..120u64 {
        let (store, key) = (waiting.clone(), key.clone());
        let waiter = tokio::spawn(async move { store.wait(&key, NEVER).await });
        tokio::time::sleep(Duration::from_micros(25 * (round % 40))).await;
        waiter.abort();
        let _ = waiter.await;
    }
    // Undone by now (each unregistration is a statement on the session).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(waiting.registered_keys(), 0);
    commits_without_a_wake_up(
        &waiting,
        transaction,
        "a waiter's lock was left on the listener's session",
    )
    .await;
}
