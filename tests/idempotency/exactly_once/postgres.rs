//! The same guarantees on PostgreSQL, in plain mode (the handler commits its
//! own writes) and in transactional mode (its writes commit with the record),
//! with the effects counted in SQL.

use super::support::pg;
use super::PATIENCE;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use http_body_util::BodyExt;
use std::num::NonZeroUsize;
use std::time::Duration;
use tokio::time::{sleep, timeout, Instant};
use tower::ServiceExt;
use tower_idempotency::{
    store::PostgresStoreBuilder, IdempotencyLayer, PostgresStore, PostgresTransaction, Scope,
};

/// Where the two-effect handler writes its charge and its order.
#[derive(Clone)]
struct Effects {
    /// Plain mode: the handler's own pool (each INSERT commits by itself).
    pool: Option<deadpool_postgres::Pool>,
    table: String,
    step: Duration,
}

async fn effects_table(url: &str) -> String {
    let table = pg::unique_table("effects");
    pg::connect(url)
        .await
        .batch_execute(&format!(
            "CREATE TABLE {table} (key text NOT NULL, effect text NOT NULL, at timestamptz DEFAULT now())"
        ))
        .await
        .unwrap();
    table
}

/// How many of `effect` the table holds for `key`.
async fn count(url: &str, table: &str, key: &str, effect: &str) -> i64 {
    pg::connect(url)
        .await
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE key = $1 AND effect = $2"),
            &[&key, &effect],
        )
        .await
        .unwrap()
        .get(0)
}

/// `x-outcome`: `created` (default), `declined` (a 400), `panic` (after the
/// charge), `hang` (after the charge, for an hour).
async fn two_effects(State(effects): State<Effects>, req: Request) -> (StatusCode, String) {
    let key = req.headers()["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned();
    let outcome = req
        .headers()
        .get("x-outcome")
        .map_or("created", |v| v.to_str().unwrap())
        .to_owned();
    let tx = req.extensions().get::<PostgresTransaction>().cloned();
    let write = |effect: &'static str| {
        let (effects, key, tx) = (effects.clone(), key.clone(), tx.clone());
        async move {
            let sql = format!(
                "INSERT INTO {} (key, effect) VALUES ($1, $2)",
                effects.table
            );
            match (&tx, &effects.pool) {
                (Some(tx), _) => {
                    tx.client()
                        .await
                        .unwrap()
                        .execute(&sql, &[&key, &effect])
                        .await
                }
                (None, Some(pool)) => {
                    pool.get()
                        .await
                        .unwrap()
                        .execute(&sql, &[&key, &effect])
                        .await
                }
                (None, None) => panic!("transactional mode without a transaction"),
            }
            .unwrap();
        }
    };
    write("charge").await;
    match outcome.as_str() {
        "panic" => panic!("the payment client panicked (expected by this test)"),
        "hang" => sleep(Duration::from_secs(3600)).await,
        _ => {}
    }
    sleep(effects.step).await;
    write("order").await;
    if outcome == "declined" {
        return (StatusCode::BAD_REQUEST, "declined".into());
    }
    (StatusCode::CREATED, format!(r#"{{"order":"{key}"}}"#))
}

fn app(layer: IdempotencyLayer, effects: Effects) -> Router {
    Router::new()
        .route("/orders", post(two_effects))
        .route_layer(layer)
        .with_state(effects)
}

fn order(key: &str, outcome: Option<&str>) -> Request {
    let mut req = http::Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", key);
    if let Some(outcome) = outcome {
        req = req.header("x-outcome", outcome);
    }
    let mut req = req.body(Body::from(r#"{"sku":"A-1"}"#)).unwrap();
    req.extensions_mut().insert(Scope::new("acme"));
    req
}

async fn send(app: &Router, key: &str, outcome: Option<&str>) -> (StatusCode, String, bool) {
    let res = timeout(PATIENCE, app.clone().oneshot(order(key, outcome)))
        .await
        .expect("answered in time")
        .unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        String::from_utf8_lossy(&body).into_owned(),
        replayed,
    )
}

/// A store on its own table with a short lock, and an effects table.
async fn setup(url: &str, lock: Duration, pool_size: usize) -> (PostgresStore, String) {
    setup_with(url, lock, pool_size, |store| store).await
}

/// `setup`, the store configured further by `configure`.
async fn setup_with(
    url: &str,
    lock: Duration,
    pool_size: usize,
    configure: impl FnOnce(PostgresStoreBuilder) -> PostgresStoreBuilder,
) -> (PostgresStore, String) {
    let builder = PostgresStore::builder(pg::pool(pg::pg_config(url), pool_size))
        .with_table(pg::unique_table("exactly_once").parse().unwrap())
        .with_lock_timeout(lock)
        .with_listener(pg::pg_config(url));
    let store = configure(builder).build();
    store.migrate().await.unwrap();
    (store, effects_table(url).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_writes_commit_with_the_record_or_not_at_all() {
    let Some(url) = pg::database_url("transactional_writes_commit_with_the_record") else {
        return;
    };
    let (store, table) = setup(&url, Duration::from_secs(10), 4).await;
    let effects = Effects {
        pool: None,
        table: table.clone(),
        step: Duration::ZERO,
    };
    let app = app(IdempotencyLayer::transactional(store.clone()), effects);

    let created = send(&app, "order-tx-created", None).await;
    assert_eq!((created.0, created.2), (StatusCode::CREATED, false));
    assert!(send(&app, "order-tx-created", None).await.2, "replayed");
    assert_eq!(count(&url, &table, "order-tx-created", "charge").await, 1);
    assert_eq!(count(&url, &table, "order-tx-created", "order").await, 1);

    // Not recorded (a 400), or a panic: the writes vanish and the key is free.
    for (key, outcome, status) in [
        ("order-tx-declined", "declined", StatusCode::BAD_REQUEST),
        (
            "order-tx-panicked",
            "panic",
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    ] {
        let refused = send(&app, key, Some(outcome)).await;
        assert_eq!(refused.0, status, "{}", refused.1);
        assert_eq!(
            count(&url, &table, key, "charge").await,
            0,
            "{outcome}: rolled back"
        );
        let retry = timeout(PATIENCE, async {
            loop {
                let retry = send(&app, key, None).await;
                if retry.0 != StatusCode::CONFLICT {
                    return retry; // the panic's release is spawned
                }
                sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!((retry.0, retry.2), (StatusCode::CREATED, false));
        assert_eq!(count(&url, &table, key, "charge").await, 1);
        assert_eq!(count(&url, &table, key, "order").await, 1);
    }
    assert!(store.round_trips() > 0);
}

/// A handler three times slower than the lock timeout, a retry arriving
/// while it runs: one charge, one order, in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_lock_timeout_is_never_doubled() {
    let Some(url) = pg::database_url("a_handler_slower_than_the_lock_timeout") else {
        return;
    };
    let lock = Duration::from_millis(400);
    for transactional in [false, true] {
        let (store, table) = setup(&url, lock, 8).await;
        let pool = (!transactional).then(|| pg::pool(pg::pg_config(&url), 4));
        let effects = Effects {
            pool,
            table: table.clone(),
            step: lock * 3,
        };
        let layer = match transactional {
            true => IdempotencyLayer::transactional(store),
            false => IdempotencyLayer::new(store),
        };
        let app = app(layer, effects);
        let first = tokio::spawn({
            let app = app.clone();
            async move { send(&app, "order-slow-1", None).await }
        });
        sleep(lock * 2).await; // past the lock, the handler still running
        let retry = send(&app, "order-slow-1", None).await;
        let first = first.await.unwrap();
        assert_eq!(
            (first.0, first.2),
            (StatusCode::CREATED, false),
            "{transactional}"
        );
        assert_eq!(
            (retry.0, &retry.1, retry.2),
            (StatusCode::CREATED, &first.1, true)
        );
        assert_eq!(
            count(&url, &table, "order-slow-1", "charge").await,
            1,
            "{transactional}"
        );
        assert_eq!(
            count(&url, &table, "order-slow-1", "order").await,
            1,
            "{transactional}"
        );
    }
}

/// Duplicates of a transactional handler past its lock's expiry never wait
/// behind its row lock on a pooled connection: other keys keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_duplicates_never_hold_pooled_connections_behind_the_row_lock() {
    let Some(url) = pg::database_url("waiting_duplicates_never_hold_pooled_connections") else {
        return;
    };
    let lock = Duration::from_millis(200);
    let (store, table) = setup_with(&url, lock, 4, |store| {
        store.with_operation_timeout(Duration::from_secs(2))
    })
    .await;
    let effects = Effects {
        pool: None,
        table: table.clone(),
        step: Duration::from_secs(2),
    };
    let impatient = self::app(
        IdempotencyLayer::transactional(store.clone()).with_wait_timeout(Duration::ZERO),
        effects.clone(),
    );
    let app = app(IdempotencyLayer::transactional(store), effects);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "order-held-1", None).await }
    });
    sleep(lock * 2).await;
    // Past the lock's expiry the row is still held: "in progress" at once,
    // not a statement waiting for the owner's commit.
    let started = Instant::now();
    let in_progress = send(&impatient, "order-held-1", None).await;
    assert!(
        in_progress.1.contains("idempotency_in_progress"),
        "{in_progress:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let duplicates: Vec<_> = (0..40)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, "order-held-1", None).await })
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    // The pool has 4 connections, one held by the handler's transaction.
    let started = Instant::now();
    let other = send(&app, "order-other-1", None).await;
    assert_eq!(other.0, StatusCode::CREATED, "{}", other.1);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let first = first.await.unwrap();
    for duplicate in duplicates {
        let duplicate = duplicate.await.unwrap();
        assert!(
            duplicate == (StatusCode::CREATED, first.1.clone(), true)
                || duplicate.1.contains("idempotency_in_progress"),
            "{duplicate:?}"
        );
    }
    assert_eq!(count(&url, &table, "order-held-1", "charge").await, 1);
}

/// With the opt-out, a dropped future cuts the handler inside its
/// transaction: the connection is closed (never pooled mid-transaction), the
/// charge is rolled back, and the next request on the one-connection pool
/// starts clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_transaction_is_rolled_back_and_its_connection_never_pooled() {
    let Some(url) = pg::database_url("a_cut_transaction_is_rolled_back") else {
        return;
    };
    let (store, table) = setup(&url, Duration::from_secs(10), 1).await;
    let effects = Effects {
        pool: None,
        table: table.clone(),
        step: Duration::ZERO,
    };
    let layer = IdempotencyLayer::transactional(store).with_cancel_on_drop(true);
    let app = app(layer, effects);
    let cut = timeout(
        Duration::from_millis(500),
        send(&app, "order-cut-1", Some("hang")),
    )
    .await;
    assert!(cut.is_err(), "the caller hung up mid-transaction");
    // The same one connection would otherwise carry the cut transaction on.
    let next = timeout(PATIENCE, async {
        loop {
            let next = send(&app, "order-next-1", None).await;
            if next.0 != StatusCode::SERVICE_UNAVAILABLE {
                return next;
            }
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(next.0, StatusCode::CREATED, "{}", next.1);
    assert_eq!(count(&url, &table, "order-cut-1", "charge").await, 0);
    assert_eq!(count(&url, &table, "order-next-1", "order").await, 1);
    let idle_in_transaction: i64 = pg::connect(&url)
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' \
             AND query LIKE '%' || $1 || '%'",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(idle_in_transaction, 0);
}

/// A caller that hangs up, on PostgreSQL, in both modes: at once (during the
/// claim) or between the charge and the order. The retry replays the first
/// run; one charge, one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_hanging_up_never_repeats_an_effect() {
    let Some(url) = pg::database_url("a_caller_hanging_up_never_repeats_an_effect") else {
        return;
    };
    let step = Duration::from_millis(300);
    for transactional in [false, true] {
        let (store, table) = setup(&url, Duration::from_secs(2), 8).await;
        let pool = (!transactional).then(|| pg::pool(pg::pg_config(&url), 4));
        let effects = Effects {
            pool,
            table: table.clone(),
            step,
        };
        let layer = match transactional {
            true => IdempotencyLayer::transactional(store),
            false => IdempotencyLayer::new(store),
        };
        let in_flight = layer.in_flight();
        let app = app(layer, effects);
        for (i, cut) in [Duration::from_millis(1), step / 2].into_iter().enumerate() {
            let key = format!("order-hangup-{i}");
            let cut_short = timeout(cut, send(&app, &key, None)).await;
            assert!(cut_short.is_err(), "hung up before the answer");
            let retry = send(&app, &key, None).await;
            assert_eq!(retry.0, StatusCode::CREATED, "{}", retry.1);
            timeout(PATIENCE, in_flight.idle()).await.unwrap();
            let counts = (
                count(&url, &table, &key, "charge").await,
                count(&url, &table, &key, "order").await,
            );
            assert_eq!(
                counts,
                (1, 1),
                "transactional={transactional}, cut at {cut:?}"
            );
            assert!(send(&app, &key, None).await.2, "replayed");
        }
    }
}

/// Transactional mode's round trips on a warm connection: the claim with the
/// transaction's `BEGIN` in one, the completion and the commit in another, and
/// the handler's own statements. A replay costs one round trip before the
/// answer and a `ROLLBACK` after it the first time an instance reads the
/// record (the instance that recorded it too), then none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_round_trips_fresh_two_replay_one_before_the_answer() {
    let Some(url) = pg::database_url("transactional_round_trips") else {
        return;
    };
    // Two instances on one table, one pooled connection each: a statement still
    // under way in the background (a replay's rollback) holds it.
    let instance = |table: Option<&str>| {
        let pool = pg::pool(pg::pg_config(&url), 1);
        let store = PostgresStore::builder(pool.clone())
            .with_table(
                table
                    .map_or_else(|| pg::unique_table("exactly_once"), str::to_owned)
                    .parse()
                    .unwrap(),
            )
            .with_lock_timeout(Duration::from_secs(10))
            .with_listener(pg::pg_config(&url))
            .build();
        (store, pool)
    };
    let (store, pool) = instance(None);
    store.migrate().await.unwrap();
    let (other, other_pool) = instance(Some(store.table().split_once('.').unwrap().1));
    let effects = Effects {
        pool: None,
        table: effects_table(&url).await,
        step: Duration::ZERO,
    };
    let other_app = app(
        IdempotencyLayer::transactional(other.clone()),
        effects.clone(),
    );
    let app = app(IdempotencyLayer::transactional(store.clone()), effects);
    // Listening (the near cache is used only then), and nothing left under way.
    let settled = |store: &PostgresStore, pool: &deadpool_postgres::Pool| {
        let (store, pool) = (store.clone(), pool.clone());
        async move {
            timeout(PATIENCE, async {
                while !store.is_listening() || pool.status().available != 1 {
                    sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("listening, with the connection back in the pool");
            store.round_trips()
        }
    };
    for i in 0..2 {
        send(&app, &format!("order-warm-{i}"), None).await; // prepares on the one connection
    }
    let before = settled(&store, &pool).await;
    assert_eq!(
        send(&app, "order-trips-1", None).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        settled(&store, &pool).await - before,
        2,
        "fresh: BEGIN+claim, UPDATE+COMMIT"
    );
    // Completions are not kept near (most keys are never retried): the
    // recording instance reads the record once too, then answers near.
    let before = settled(&store, &pool).await;
    assert!(send(&app, "order-trips-1", None).await.2);
    assert_eq!(
        settled(&store, &pool).await - before,
        2,
        "recorded here: read once, and its rollback"
    );
    let before = settled(&store, &pool).await;
    assert!(send(&app, "order-trips-1", None).await.2);
    assert_eq!(
        settled(&store, &pool).await - before,
        0,
        "read here: answered near"
    );

    send(&other_app, "order-warm-0", None).await; // prepares, and starts the listener
    let before = settled(&other, &other_pool).await;
    assert!(send(&other_app, "order-trips-1", None).await.2);
    // The replay's answer needs one, the rollback after it one more.
    assert_eq!(settled(&other, &other_pool).await - before, 2);
    let before = settled(&other, &other_pool).await;
    assert!(send(&other_app, "order-trips-1", None).await.2);
    assert_eq!(
        settled(&other, &other_pool).await - before,
        0,
        "read once: answered near"
    );
}

/// Transactional mode, a response over the record limit: the writes commit
/// (the effects are real), marked unavailable; the caller gets the whole
/// body; a retry is `410` and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_response_over_the_record_limit_commits_and_is_never_run_again() {
    let Some(url) = pg::database_url("transactional_response_over_the_record_limit") else {
        return;
    };
    let (store, table) = setup(&url, Duration::from_secs(10), 4).await;
    let effects = Effects {
        pool: None,
        table: table.clone(),
        step: Duration::ZERO,
    };
    // The handler's body (`{"order":"..."}`) is over a 4-byte limit.
    let layer = IdempotencyLayer::transactional(store).with_record_limit(4);
    let app = app(layer, effects);
    let first = send(&app, "order-big-1", None).await;
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(first.1, r#"{"order":"order-big-1"}"#, "delivered whole");
    let retry = send(&app, "order-big-1", None).await;
    assert_eq!(retry.0, StatusCode::GONE, "{}", retry.1);
    assert_eq!(count(&url, &table, "order-big-1", "charge").await, 1);
    assert_eq!(count(&url, &table, "order-big-1", "order").await, 1);
}

/// Load shedding in transactional mode: the shed claim's transaction is rolled
/// back (its row lock gone) and its key released, so the retry claims and
/// runs it once, and the running handler is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_transactional_claim_is_rolled_back_and_its_key_freed() {
    let Some(url) = pg::database_url("a_shed_transactional_claim_is_rolled_back") else {
        return;
    };
    let (store, table) = setup(&url, Duration::from_secs(10), 4).await;
    let effects = Effects {
        pool: None,
        table: table.clone(),
        step: Duration::from_millis(600),
    };
    let layer = IdempotencyLayer::transactional(store.clone())
        .with_max_in_flight(NonZeroUsize::new(1).unwrap());
    let in_flight = layer.in_flight();
    let app = app(layer, effects);
    let slow = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "order-shed-slow", None).await }
    });
    while in_flight.count() < 1 {
        sleep(Duration::from_millis(5)).await;
    }
    let shed = send(&app, "order-shed-next", None).await;
    assert_eq!(shed.0, StatusCode::SERVICE_UNAVAILABLE, "{}", shed.1);
    assert!(shed.1.contains("overloaded"), "{}", shed.1);
    assert_eq!(slow.await.unwrap().0, StatusCode::CREATED);
    let retry = send(&app, "order-shed-next", None).await;
    assert_eq!(
        (retry.0, retry.2),
        (StatusCode::CREATED, false),
        "{}",
        retry.1
    );
    for key in ["order-shed-slow", "order-shed-next"] {
        assert_eq!(count(&url, &table, key, "charge").await, 1, "{key}");
        assert_eq!(count(&url, &table, key, "order").await, 1, "{key}");
    }
}
