//! Single flight: concurrent identical begins share one query.

use super::*;
use tower_idempotency::store::Completion;

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
    let store = PostgresStore::builder(pool.clone())
        .with_table(pg::unique_table("flight").parse().unwrap())
        .build();
    store.migrate().await.unwrap();
    let token = claim(&store, key, "a").await;
    store
        .complete(key, token, Completion::Response(response(b"done")))
        .await
        .unwrap();
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

/// The store's queries, followed begins and shared answers so far.
fn counters(store: &PostgresStore) -> (u64, u64, u64) {
    (
        store.round_trips(),
        store.begins_followed(),
        store.begins_shared(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_begins_for_a_completed_key_share_one_query() {
    let Some(url) = pg::database_url("a_thousand_concurrent_begins_share_one_query") else {
        return;
    };
    let key = fresh_key();
    let (store, pool) = one_connection_store(&url, &key).await;
    let (queries, followed, shared) = counters(&store);
    // Every begin waits for the pool's one connection: the first leads, 999 follow.
    let held = pool.get().await.unwrap();
    let begins = spawn_begins(&store, &key, "a", 1000);
    until("999 begins follow the first", || {
        store.begins_followed() - followed == 999
    })
    .await;
    assert_eq!(store.begins_open(), 1);
    drop(held);
    let mut first: Option<Arc<tower_idempotency::store::StoredResponse>> = None;
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
        assert!(matches!(begin.await.unwrap(), Ok(Begin::KeyReused)));
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
        .complete(&key, token, Completion::Response(response(b"done")))
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
    let (queries, followed, shared) = counters(&store);
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
    let proxy =
        tower_idempotency_tests::support::proxy::Proxy::start(pg::server_addr(&url).await).await;
    let pool = pg::pool(pg::pg_config_at(&url, proxy.port), 1);
    let store = PostgresStore::builder(pool.clone())
        .with_table(table.parse().unwrap())
        .build();
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    store
        .complete(&key, token, Completion::Response(response(b"done")))
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
