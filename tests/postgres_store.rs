//! `PostgresStore` against a real PostgreSQL: the store conformance suite, plus
//! concurrency across pools, the layer end to end, round trips, migrations,
//! waiting, retention and outages.
//!
//! Without `DATABASE_URL` the database tests skip loudly; with
//! `REQUIRE_POSTGRES=1` (CI, `./scripts/test`) they fail instead.
#![cfg(feature = "postgres")]

mod conformance;
mod support;

use bytes::Bytes;
use conformance::{fingerprint, record, response, Durations};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::pg;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::{
    Begin, FencingToken, IdempotencyLayer, PostgresStore, RecordKey, ResponseBody, Scope, Store,
    StoreError,
};

async fn postgres_store(d: Durations) -> Option<PostgresStore> {
    let url = pg::database_url("postgres_store conformance")?;
    let table = pg::unique_table("conformance");
    let store = pg::store(&url, &table, |s| {
        s.with_lock_timeout(d.lock).with_retention(d.retention)
    })
    .await;
    Some(store)
}

store_conformance_tests!(postgres_store);

/// A key in a scope of its own.
fn fresh_key() -> RecordKey {
    record(&pg::unique_table("tenant"), "key-00000001")
}

async fn claim(store: &PostgresStore, key: &RecordKey, body: &str) -> FencingToken {
    match store.begin(key, &fingerprint(body)).await.expect("begin") {
        Begin::Claimed(token) => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Atomic claims under concurrency
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_is_one_atomic_insert_across_two_pools_300_concurrent_begins() {
    let Some(url) = pg::database_url("claim_is_one_atomic_insert_across_two_pools") else {
        return;
    };
    let table = pg::unique_table("two_pools");
    let first = pg::store(&url, &table, |s| s).await;
    // A second, independent pool on the same table, as another app instance has.
    let second = PostgresStore::new(pg::pool(pg::pg_config(&url), 16)).with_table(&table);
    let stores = [Arc::new(first), Arc::new(second)];
    for round in 0..3 {
        let key = fresh_key();
        let tasks: Vec<_> = (0..300)
            .map(|i| {
                let (store, key) = (stores[i % 2].clone(), key.clone());
                tokio::spawn(async move { store.begin(&key, &fingerprint("a")).await })
            })
            .collect();
        let mut claims = 0;
        for task in tasks {
            match task.await.unwrap().expect("begin") {
                Begin::Claimed(_) => claims += 1,
                Begin::InProgress => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(claims, 1, "exactly one claim in round {round}");
    }
    eprintln!(
        "begin re-ran after a concurrent commit {} times",
        stores[0].begin_retries() + stores[1].begin_retries()
    );
}

/// Waits until a statement on `table` is blocked on a lock held by another transaction.
async fn until_blocked_on(observer: &tokio_postgres::Client, table: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
                &[&table],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "begin never blocked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The READ COMMITTED case: the conflicting row is committed after `begin`'s
/// snapshot, so its upsert does nothing and its read sees nothing; it must run
/// again rather than fail or claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_is_one_atomic_insert_even_when_a_rival_commits_after_the_snapshot() {
    let Some(url) = pg::database_url("claim_..._rival_commits_after_the_snapshot") else {
        return;
    };
    let table = pg::unique_table("snapshot");
    let store = Arc::new(pg::store(&url, &table, |s| s).await);
    let (scope, key_str) = (pg::unique_table("tenant"), "key-00000001");
    let key = record(&scope, key_str);
    let fp = fingerprint("a");
    let mut rival = pg::connect(&url).await;
    let observer = pg::connect(&url).await;

    // 1. A rival transaction inserts the key and holds its commit.
    let tx = rival.transaction().await.unwrap();
    tx.execute(
        &format!(
            "INSERT INTO public.{table} (scope, key, fingerprint, token, state, expires_at) \
             VALUES ($1, $2, $3, nextval('public.{table}_token_seq'), 'in_progress', \
                     now() + interval '60 seconds')"
        ),
        &[&scope, &key_str, &fp.fingerprint().as_bytes().as_slice()],
    )
    .await
    .unwrap();
    let retries = store.begin_retries();
    let pending = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { store.begin(&key, &fingerprint("a")).await })
    };
    until_blocked_on(&observer, &table).await;
    tx.commit().await.unwrap();
    let decided = pending.await.unwrap().expect("begin");
    assert!(matches!(decided, Begin::InProgress), "got {decided:?}");
    assert!(
        store.begin_retries() > retries,
        "begin ran its statement again"
    );

    // 2. The same with a takeover: the rival takes over an expired record.
    let key2_str = "key-00000002";
    let key2 = record(&scope, key2_str);
    rival
        .execute(
            &format!(
                "INSERT INTO public.{table} (scope, key, fingerprint, token, state, expires_at) \
                 VALUES ($1, $2, $3, nextval('public.{table}_token_seq'), 'in_progress', \
                         now() - interval '1 second')"
            ),
            &[&scope, &key2_str, &fp.fingerprint().as_bytes().as_slice()],
        )
        .await
        .unwrap();
    let tx = rival.transaction().await.unwrap();
    tx.execute(
        &format!(
            "UPDATE public.{table} SET token = nextval('public.{table}_token_seq'), \
             expires_at = now() + interval '60 seconds' WHERE scope = $1 AND key = $2"
        ),
        &[&scope, &key2_str],
    )
    .await
    .unwrap();
    let retries = store.begin_retries();
    let pending = {
        let (store, key2) = (store.clone(), key2.clone());
        tokio::spawn(async move { store.begin(&key2, &fingerprint("a")).await })
    };
    until_blocked_on(&observer, &table).await;
    tx.commit().await.unwrap();
    let decided = pending.await.unwrap().expect("begin");
    assert!(matches!(decided, Begin::InProgress), "got {decided:?}");
    assert!(
        store.begin_retries() > retries,
        "begin ran its statement again"
    );
}

// ---------------------------------------------------------------------------
// The layer end to end
// ---------------------------------------------------------------------------

fn order_request(key: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"sku":"A-1","qty":2}"#)))
        .unwrap();
    request.extensions_mut().insert(Scope::new("tenant"));
    request
}

async fn error_code(response: Response<impl http_body::Body>) -> String {
    let Ok(collected) = response.into_body().collect().await else {
        panic!("refusal body");
    };
    let json: serde_json::Value = serde_json::from_slice(&collected.to_bytes()).unwrap();
    json["code"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_runs_the_handler_once_for_200_concurrent_identical_requests() {
    let Some(url) = pg::database_url("layer_runs_the_handler_once_for_200_concurrent") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("layer"), |s| s).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(move |_req: Request<Full<Bytes>>| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .header("location", format!("/v1/orders/{n}"))
                    .body(Full::new(Bytes::from(format!(r#"{{"order":{n}}}"#))))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        });
    let key = format!("order-{}", pg::unique_table("k"));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (service, request) = (service.clone(), order_request(&key));
            tokio::spawn(async move { service.oneshot(request).await.unwrap() })
        })
        .collect();
    let (mut created, mut in_progress) = (0, 0);
    for task in tasks {
        let response = task.await.unwrap();
        match response.status() {
            StatusCode::CREATED => {
                assert_eq!(response.headers()["location"], "/v1/orders/1");
                let body = response.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, Bytes::from_static(br#"{"order":1}"#));
                created += 1;
            }
            StatusCode::CONFLICT => {
                assert_eq!(error_code(response).await, "idempotency_in_progress");
                in_progress += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran exactly once"
    );
    assert_eq!(created + in_progress, 200);
    assert!(created >= 1);
    eprintln!("{created} created or replayed, {in_progress} in progress");
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

/// The round-trip budget: fresh request = 2 (begin + complete), replay = 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_fresh_request_two_replay_one() {
    let Some(url) = pg::database_url("round_trips_fresh_request_two_replay_one") else {
        return;
    };
    let table = pg::unique_table("round_trips");
    // One connection, so its statement cache is warm after the first request.
    let store = PostgresStore::new(pg::pool(pg::pg_config(&url), 1)).with_table(&table);
    store.migrate().await.unwrap();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(|_req: Request<Full<Bytes>>| async {
            let response = Response::builder()
                .status(StatusCode::CREATED)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            Ok::<_, Infallible>(response)
        });
    // Warm-up: prepares begin and complete on the pool's connection.
    let warm = service
        .clone()
        .oneshot(order_request("warm-up-key"))
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::CREATED);
    let warm = service
        .clone()
        .oneshot(order_request("warm-up-key"))
        .await
        .unwrap();
    assert_eq!(warm.headers()["idempotent-replayed"], "true");

    let before = store.round_trips();
    let fresh = service
        .clone()
        .oneshot(order_request("counted-key"))
        .await
        .unwrap();
    assert_eq!(fresh.status(), StatusCode::CREATED);
    let fresh_trips = store.round_trips() - before;

    let before = store.round_trips();
    let replay = service
        .clone()
        .oneshot(order_request("counted-key"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay_trips = store.round_trips() - before;

    // A response the policy does not record: begin + release.
    let not_recorded = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        });
    let warm = not_recorded
        .clone()
        .oneshot(order_request("warm-up-200"))
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    let before = store.round_trips();
    let ok = not_recorded
        .oneshot(order_request("counted-200"))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let released_trips = store.round_trips() - before;

    // Directly on the store: a mismatch and an in-progress answer are one each too.
    let key = fresh_key();
    claim(&store, &key, "a").await;
    let before = store.round_trips();
    assert!(matches!(
        store.begin(&key, &fingerprint("a")).await,
        Ok(Begin::InProgress)
    ));
    assert!(matches!(
        store.begin(&key, &fingerprint("b")).await,
        Ok(Begin::Mismatch)
    ));
    let decided_trips = store.round_trips() - before;

    eprintln!(
        "round trips: fresh {fresh_trips}, replay {replay_trips}, \
         not recorded {released_trips}, in progress + mismatch {decided_trips}"
    );
    assert_eq!(fresh_trips, 2, "fresh request = begin + complete");
    assert_eq!(replay_trips, 1, "replay = begin");
    assert_eq!(released_trips, 2, "not recorded = begin + release");
    assert_eq!(decided_trips, 2);
}

/// A replay, a mismatch and an in-progress answer write nothing: no row version,
/// no row lock, no token drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_is_a_read_no_row_write_lock_or_token() {
    let Some(url) = pg::database_url("replay_is_a_read_no_row_write_lock_or_token") else {
        return;
    };
    let table = pg::unique_table("read_only");
    let store = pg::store(&url, &table, |s| s).await;
    let observer = pg::connect(&url).await;
    let (done, running) = (fresh_key(), fresh_key());
    let token = claim(&store, &done, "a").await;
    store
        .complete(&done, token, response(b"body"))
        .await
        .unwrap();
    claim(&store, &running, "a").await;

    let snapshot = || async {
        let row = observer
            .query_one(
                &format!(
                    "SELECT (SELECT array_agg(xmin::text || '/' || xmax::text ORDER BY scope) \
                             FROM public.{table}), \
                            (SELECT last_value FROM public.{table}_token_seq)"
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, Vec<String>>(0), row.get::<_, i64>(1))
    };
    let before = snapshot().await;
    for _ in 0..3 {
        assert!(matches!(
            store.begin(&done, &fingerprint("a")).await,
            Ok(Begin::Replay(_))
        ));
        assert!(matches!(
            store.begin(&done, &fingerprint("b")).await,
            Ok(Begin::Mismatch)
        ));
        assert!(matches!(
            store.begin(&running, &fingerprint("a")).await,
            Ok(Begin::InProgress)
        ));
    }
    assert_eq!(snapshot().await, before, "rows and sequence untouched");
}

// ---------------------------------------------------------------------------
// Schema
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_safe_from_many_instances_at_once() {
    let Some(url) = pg::database_url("migrate_is_idempotent_and_safe_from_many_instances") else {
        return;
    };
    let schema = pg::unique_table("schema");
    let table = "idempotency_records";
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = PostgresStore::new(pg::pool(pg::pg_config(&url), 1))
                .with_schema(&schema)
                .with_table(table);
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("concurrent migrate");
    }
    let store = PostgresStore::new(pg::pool(pg::pg_config(&url), 1))
        .with_schema(&schema)
        .with_table(table);
    store.migrate().await.expect("migrate again");
    assert_eq!(store.table(), format!("{schema}.{table}"));
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    store.complete(&key, token, response(b"ok")).await.unwrap();
}

#[test]
fn identifiers_are_validated_as_plain_lower_case_names() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    // Building a pool does not connect.
    let pool = || pg::pool(pg::pg_config("postgres://nobody@127.0.0.1:1/none"), 1);
    let long = "a".repeat(63);
    for good in ["idempotency_records", "_t", "t1", "select", long.as_str()] {
        PostgresStore::new(pool())
            .with_table(good)
            .with_schema(good);
    }
    let too_long = "a".repeat(64);
    let bad = [
        "",
        "1abc",
        "Records",
        "a-b",
        "a b",
        "a.b",
        "a\"b",
        "a;drop table x",
        "ré",
        too_long.as_str(),
    ];
    for name in bad {
        let table = std::panic::catch_unwind(|| PostgresStore::new(pool()).with_table(name));
        assert!(table.is_err(), "table name {name:?} was accepted");
        let schema = std::panic::catch_unwind(|| PostgresStore::new(pool()).with_schema(name));
        assert!(schema.is_err(), "schema name {name:?} was accepted");
    }
}

// ---------------------------------------------------------------------------
// Waiting
// ---------------------------------------------------------------------------

async fn until_listening(store: &PostgresStore) {
    store.start_listener();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.is_listening() {
        assert!(Instant::now() < deadline, "the listener never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_notify_from_another_instance() {
    let Some(url) = pg::database_url("waiters_are_woken_by_notify_from_another_instance") else {
        return;
    };
    let table = pg::unique_table("notify");
    let waiting = Arc::new(pg::store(&url, &table, |s| s).await);
    // The completing instance has its own pool and no listener.
    let completing = PostgresStore::new(pg::pool(pg::pg_config(&url), 2)).with_table(&table);
    until_listening(&waiting).await;
    let key = fresh_key();
    let token = claim(&completing, &key, "a").await;
    let received = waiting.notifications_received();
    let waiter = {
        let (store, key) = (waiting.clone(), key.clone());
        tokio::spawn(async move {
            store.wait(&key, Duration::from_secs(30)).await.unwrap();
            Instant::now()
        })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    let completed = Instant::now();
    completing
        .complete(&key, token, response(b"done"))
        .await
        .unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("woken")
        .unwrap();
    assert!(
        waiting.notifications_received() > received,
        "a NOTIFY arrived"
    );
    eprintln!("woken {:?} after the completion", woken - completed);
    assert!(matches!(
        waiting.begin(&key, &fingerprint("a")).await,
        Ok(Begin::Replay(_))
    ));
    assert_eq!(
        waiting.watched_keys(),
        0,
        "the waiter's registration is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_without_a_listener_notice_completion_by_rechecking() {
    let Some(url) = pg::database_url("waiters_without_a_listener_notice_completion") else {
        return;
    };
    let table = pg::unique_table("no_listener");
    let store = Arc::new(PostgresStore::new(pg::pool(pg::pg_config(&url), 4)).with_table(&table));
    store.migrate().await.unwrap();
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    let waiter = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { store.wait(&key, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .complete(&key, token, response(b"done"))
        .await
        .unwrap();
    // Re-checks back off to at most one second.
    tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("noticed by a re-check")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_stops_at_the_lock_expiry_measured_by_the_database() {
    let Some(url) = pg::database_url("wait_stops_at_the_lock_expiry") else {
        return;
    };
    let table = pg::unique_table("lock_expiry");
    let store = pg::store(&url, &table, |s| {
        s.with_lock_timeout(Duration::from_millis(1500))
    })
    .await;
    let key = fresh_key();
    let dead = claim(&store, &key, "a").await;
    let started = Instant::now();
    store.wait(&key, Duration::from_secs(30)).await.unwrap();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    // The lock has expired: a retry takes over with a higher token.
    let fresh = claim(&store, &key, "a").await;
    assert!(fresh > dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_one_key_share_their_rechecks() {
    let Some(url) = pg::database_url("a_thousand_waiters_on_one_key_share_their_rechecks") else {
        return;
    };
    let table = pg::unique_table("herd");
    let store = Arc::new(pg::store(&url, &table, |s| s).await);
    let key = fresh_key();
    claim(&store, &key, "a").await;
    let before = store.round_trips();
    let started = Instant::now();
    let waiters: Vec<_> = (0..1000)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.wait(&key, Duration::from_millis(2000)).await })
        })
        .collect();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    let elapsed = started.elapsed();
    let queries = store.round_trips() - before;
    eprintln!("1000 waiters for {elapsed:?} issued {queries} queries");
    // Unshared, 1000 waiters would issue 1000 first checks and ~4000 re-checks.
    assert!(queries <= 50, "{queries} queries");
    assert_eq!(store.watched_keys(), 0);
}

// ---------------------------------------------------------------------------
// Single flight: concurrent identical begins share one query
// ---------------------------------------------------------------------------

/// Polls `done` until it holds (at most 10 s).
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A store on a pool of one connection, and that pool (to hold its connection,
/// so that concurrent begins are all waiting for it), with `key` completed.
async fn one_connection_store(
    url: &str,
    key: &RecordKey,
) -> (PostgresStore, deadpool_postgres::Pool) {
    let pool = pg::pool(pg::pg_config(url), 1);
    let store = PostgresStore::new(pool.clone()).with_table(&pg::unique_table("flight"));
    store.migrate().await.unwrap();
    let token = claim(&store, key, "a").await;
    store.complete(key, token, response(b"done")).await.unwrap();
    (store, pool)
}

fn spawn_begins(
    store: &PostgresStore,
    key: &RecordKey,
    body: &'static str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<Begin, StoreError>>> {
    (0..n)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.begin(&key, &fingerprint(body)).await })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_begins_for_a_completed_key_share_one_query() {
    let Some(url) = pg::database_url("a_thousand_concurrent_begins_share_one_query") else {
        return;
    };
    let key = fresh_key();
    let (store, pool) = one_connection_store(&url, &key).await;
    let (queries, followed, shared) = (
        store.round_trips(),
        store.begins_followed(),
        store.begins_shared(),
    );
    // Every begin waits for the pool's one connection: the first leads, 999 follow.
    let held = pool.get().await.unwrap();
    let begins = spawn_begins(&store, &key, "a", 1000);
    until("999 begins follow the first", || {
        store.begins_followed() - followed == 999
    })
    .await;
    assert_eq!(store.begins_open(), 1);
    drop(held);
    let mut first: Option<Arc<tower_idempotency::StoredResponse>> = None;
    for begin in begins {
        match begin.await.unwrap().expect("begin") {
            Begin::Replay(stored) => {
                assert_eq!(stored.body, Bytes::from_static(b"done"));
                let first = first.get_or_insert_with(|| stored.clone());
                assert!(Arc::ptr_eq(first, &stored), "one decoded response, shared");
            }
            other => panic!("expected a replay, got {other:?}"),
        }
    }
    assert_eq!(
        store.round_trips() - queries,
        1,
        "one query for 1000 begins"
    );
    assert_eq!(store.begins_shared() - shared, 999);
    assert_eq!(store.begins_open(), 0);

    // Another fingerprint is another flight: a mismatch, by its own query.
    let held = pool.get().await.unwrap();
    let (a, b) = (
        spawn_begins(&store, &key, "a", 50),
        spawn_begins(&store, &key, "b", 50),
    );
    until("two flights, 98 followers", || {
        store.begins_followed() - followed == 999 + 98
    })
    .await;
    assert_eq!(store.begins_open(), 2);
    drop(held);
    for begin in a {
        assert!(matches!(begin.await.unwrap(), Ok(Begin::Replay(_))));
    }
    for begin in b {
        assert!(matches!(begin.await.unwrap(), Ok(Begin::Mismatch)));
    }
    assert_eq!(store.round_trips() - queries, 3);
}

/// Without a held connection: the pool's free connections take the first
/// begins, the rest coalesce while they wait for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_begins_through_a_pool_of_eight_issue_far_fewer_queries() {
    let Some(url) = pg::database_url("concurrent_begins_through_a_pool_of_eight") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("flight_pool"), |s| s).await;
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    store
        .complete(&key, token, response(b"done"))
        .await
        .unwrap();
    for round in 0..3 {
        let before = store.round_trips();
        for begin in spawn_begins(&store, &key, "a", 1000) {
            assert!(matches!(begin.await.unwrap(), Ok(Begin::Replay(_))));
        }
        let queries = store.round_trips() - before;
        eprintln!("round {round}: 1000 concurrent begins issued {queries} queries");
        assert!(queries <= 250, "{queries} queries");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_never_shared_by_concurrent_begins() {
    let Some(url) = pg::database_url("a_claim_is_never_shared_by_concurrent_begins") else {
        return;
    };
    let (store, pool) = one_connection_store(&url, &fresh_key()).await;
    for round in 0..3 {
        let key = fresh_key();
        let (queries, followed) = (store.round_trips(), store.begins_followed());
        let held = pool.get().await.unwrap();
        let begins = spawn_begins(&store, &key, "a", 500);
        until("499 begins follow the first", || {
            store.begins_followed() - followed == 499
        })
        .await;
        drop(held);
        let (mut claims, mut in_progress) = (0, 0);
        for begin in begins {
            match begin.await.unwrap().expect("begin") {
                Begin::Claimed(_) => claims += 1,
                Begin::InProgress => in_progress += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        let queries = store.round_trips() - queries;
        eprintln!("round {round}: one claim and {in_progress} in progress by {queries} queries");
        assert_eq!(claims, 1, "exactly one claim");
        assert_eq!(in_progress, 499);
        // The claim, then the followers' own flight(s).
        assert!((2..=100).contains(&queries), "{queries} queries");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_leader_leaves_its_followers_to_query_for_themselves() {
    let Some(url) = pg::database_url("a_cancelled_leader_leaves_its_followers") else {
        return;
    };
    let key = fresh_key();
    let (store, pool) = one_connection_store(&url, &key).await;
    let (queries, followed, shared) = (
        store.round_trips(),
        store.begins_followed(),
        store.begins_shared(),
    );
    let held = pool.get().await.unwrap();
    let leader = spawn_begins(&store, &key, "a", 1).remove(0);
    until("the leader waits for a connection", || {
        store.begins_open() == 1
    })
    .await;
    let followers = spawn_begins(&store, &key, "a", 100);
    until("100 begins follow", || {
        store.begins_followed() - followed == 100
    })
    .await;
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    assert_eq!(
        store.begins_open(),
        0,
        "the dropped flight takes no followers"
    );
    drop(held);
    for follower in followers {
        let answer = tokio::time::timeout(Duration::from_secs(10), follower)
            .await
            .expect("a follower of a cancelled leader is answered")
            .unwrap();
        assert!(matches!(answer, Ok(Begin::Replay(_))), "got {answer:?}");
    }
    assert_eq!(store.begins_shared() - shared, 0, "nothing was shared");
    assert_eq!(store.round_trips() - queries, 100, "each follower queried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_leader_shares_no_answer_and_strands_no_follower() {
    let Some(url) = pg::database_url("a_failed_leader_shares_no_answer") else {
        return;
    };
    let table = pg::unique_table("flight_outage");
    pg::store(&url, &table, |s| s).await; // migrated directly
    let proxy = pg::Proxy::start(pg::server_addr(&url).await).await;
    let pool = pg::pool(pg::pg_config_at(&url, proxy.port), 1);
    let store = PostgresStore::new(pool.clone()).with_table(&table);
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    store
        .complete(&key, token, response(b"done"))
        .await
        .unwrap();
    let (followed, shared) = (store.begins_followed(), store.begins_shared());

    let held = pool.get().await.unwrap();
    let begins = spawn_begins(&store, &key, "a", 100);
    until("99 begins follow the first", || {
        store.begins_followed() - followed == 99
    })
    .await;
    // The held connection is cut; the leader's query (or its reconnection) fails.
    proxy.set_up(false);
    drop(held);
    let started = Instant::now();
    for begin in begins {
        let answer = tokio::time::timeout(Duration::from_secs(15), begin)
            .await
            .expect("no begin hangs")
            .unwrap();
        assert!(
            matches!(answer, Err(StoreError::Backend(_))),
            "got {answer:?}"
        );
    }
    eprintln!("100 begins failed within {:?}", started.elapsed());
    assert_eq!(store.begins_shared() - shared, 0, "an error is not shared");
    assert_eq!(store.begins_open(), 0);

    proxy.set_up(true);
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        store.begin(&key, &fingerprint("a")),
    )
    .await
    .expect("answered after the outage");
    assert!(matches!(answer, Ok(Begin::Replay(_))), "got {answer:?}");
}

/// The issue's scenario through the layer: 1000 duplicates wait for the first,
/// the NOTIFY wakes them all, and their begins share queries instead of queueing
/// 999 of them behind the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_duplicates_woken_by_notify_share_their_begins() {
    let Some(url) = pg::database_url("a_thousand_duplicates_woken_by_notify") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("flight_layer"), |s| s).await;
    until_listening(&store).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(move |_req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        });
    let key = format!("order-{}", pg::unique_table("k"));
    let before = store.round_trips();
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let (service, request) = (service.clone(), order_request(&key));
            tokio::spawn(async move {
                let response = service.oneshot(request).await.unwrap();
                (response.status(), Instant::now())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let queries = store.round_trips() - before;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert!(answers
        .iter()
        .all(|(status, _)| *status == StatusCode::CREATED));
    let first = answers.iter().map(|a| a.1).min().unwrap();
    let last = answers.iter().map(|a| a.1).max().unwrap();
    eprintln!(
        "1000 duplicates: {queries} queries, {} begins shared, answers within {:?} of the first",
        store.begins_shared(),
        last - first
    );
    // Uncoalesced: 1000 first begins, 999 after the wake-up, plus the waits' checks.
    assert!(queries <= 400, "{queries} queries");
}

// ---------------------------------------------------------------------------
// Retention
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_expired_records_in_batches_of_1000() {
    let Some(url) = pg::database_url("purge_deletes_expired_records_in_batches") else {
        return;
    };
    let table = pg::unique_table("purge");
    // One connection, so the purge statement is prepared once.
    let store = PostgresStore::new(pg::pool(pg::pg_config(&url), 1)).with_table(&table);
    store.migrate().await.unwrap();
    let live = fresh_key();
    let token = claim(&store, &live, "a").await;
    store
        .complete(&live, token, response(b"kept"))
        .await
        .unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), 0); // warms the statement cache
    let sql = pg::connect(&url).await;
    sql.execute(
        &format!(
            "INSERT INTO public.{table} \
             (scope, key, fingerprint, token, state, expires_at, status, headers, body) \
             SELECT 's', 'key-' || i, '\\x00', i, 'completed', now() - interval '1 second', \
                    201, '', '' \
             FROM generate_series(1, 2500) AS i"
        ),
        &[],
    )
    .await
    .unwrap();
    let before = store.round_trips();
    assert_eq!(store.purge_expired().await.unwrap(), 2500);
    let statements = store.round_trips() - before;
    assert_eq!(statements, 3, "batches of 1000, 1000 and 500");
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    assert!(matches!(
        store.begin(&live, &fingerprint("a")).await,
        Ok(Begin::Replay(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_binary_bodies_replay_byte_for_byte() {
    let Some(url) = pg::database_url("large_binary_bodies_replay_byte_for_byte") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("large"), |s| s).await;
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    let body: Vec<u8> = (0..1_048_576u32).map(|i| (i * 7 % 256) as u8).collect();
    let mut stored = response(b"");
    stored.body = Bytes::from(body.clone());
    stored.status = StatusCode::ACCEPTED;
    store.complete(&key, token, stored.clone()).await.unwrap();
    match store.begin(&key, &fingerprint("a")).await.unwrap() {
        Begin::Replay(replayed) => assert_eq!(*replayed, stored),
        other => panic!("expected a replay, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Outages
// ---------------------------------------------------------------------------

type OrderService =
    BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

fn counting_service(store: PostgresStore) -> (OrderService, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store))
        .service_fn(move |_req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        })
        .boxed_clone();
    (service, runs)
}

/// Needs no database: the pool points at a port nobody listens on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_answers_503_and_never_runs_the_handler() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = pg::pg_config_at("postgres://postgres@127.0.0.1/postgres", port);
    let store = PostgresStore::new(pg::pool(config, 4));
    assert!(matches!(store.migrate().await, Err(StoreError::Backend(_))));
    let (service, runs) = counting_service(store);
    let started = Instant::now();
    let answer = service
        .oneshot(order_request("outage-key-1"))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(answer).await, "idempotency_store_unavailable");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    assert!(started.elapsed() < Duration::from_secs(3), "failed fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_resumes_without_restart_when_the_database_returns() {
    let Some(url) = pg::database_url("service_resumes_without_restart") else {
        return;
    };
    let table = pg::unique_table("outage");
    pg::store(&url, &table, |s| s).await; // migrated directly
    let proxy = pg::Proxy::start(pg::server_addr(&url).await).await;
    let store = PostgresStore::new(pg::pool(pg::pg_config_at(&url, proxy.port), 4))
        .with_table(&table)
        .with_operation_timeout(Duration::from_secs(3));
    let (service, runs) = counting_service(store.clone());

    let first = service
        .clone()
        .oneshot(order_request("resume-key-1"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    proxy.set_up(false);
    for key in ["resume-key-1", "resume-key-2", "resume-key-2"] {
        let started = Instant::now();
        let answer = service.clone().oneshot(order_request(key)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE, "{key}");
        assert_eq!(error_code(answer).await, "idempotency_store_unavailable");
        assert!(started.elapsed() < Duration::from_secs(4), "failed fast");
    }
    assert!(matches!(
        store.purge_expired().await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran during the outage"
    );

    proxy.set_up(true);
    let second = service
        .clone()
        .oneshot(order_request("resume-key-2"))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let replay = service
        .clone()
        .oneshot(order_request("resume-key-1"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
