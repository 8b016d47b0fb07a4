//! Waiting: `NOTIFY` across instances, rechecks, and the lock's expiry on the database's clock.

use super::*;
use tower_idempotency::store::Completion;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_notify_from_another_instance() {
    let Some(url) = pg::database_url("waiters_are_woken_by_notify_from_another_instance") else {
        return;
    };
    let table = pg::unique_table("notify");
    let waiting = Arc::new(pg::store(&url, &table, |s| s).await);
    // The completing instance has its own pool and no listener.
    let completing = PostgresStore::builder(pg::pool(pg::pg_config(&url), 2))
        .with_table(table.parse().unwrap())
        .build();
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
        .complete(&key, token, Completion::Response(response(b"done")))
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
    let store = Arc::new(
        PostgresStore::builder(pg::pool(pg::pg_config(&url), 4))
            .with_table(table.parse().unwrap())
            .build(),
    );
    store.migrate().await.unwrap();
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    let waiter = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { store.wait(&key, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .complete(&key, token, Completion::Response(response(b"done")))
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
    // Unshared, 1000 waiters would send 1000 first checks and ~4000 re-checks.
    assert!(queries <= 50, "{queries} queries");
    assert_eq!(store.watched_keys(), 0);
}

/// Memory over time: two thousand waiters on fifty keys held in progress,
/// half giving up at their own timeout and half dropped mid-wait by their
/// caller, leave no registration behind, round after round: the waiting
/// side holds an entry per key some caller waits on now, never per key
/// ever waited on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_or_are_dropped_leave_no_registration_behind() {
    let Some(url) = pg::database_url("waiters_that_give_up_or_are_dropped") else {
        return;
    };
    let store = Arc::new(pg::store(&url, &pg::unique_table("waiters_soak"), |s| s).await);
    for round in 0..4 {
        let keys: Vec<_> = (0..50).map(|_| fresh_key()).collect();
        for key in &keys {
            claim(&store, key, "a").await;
        }
        let waiters: Vec<_> = (0..2000)
            .map(|i| {
                let (store, key) = (store.clone(), keys[i % keys.len()].clone());
                tokio::spawn(async move {
                    if i % 2 == 0 {
                        // Gives up at its own timeout.
                        store.wait(&key, Duration::from_millis(50)).await.unwrap();
                    } else {
                        // Dropped by its caller mid-wait.
                        let wait = store.wait(&key, Duration::from_secs(30));
                        let _ = tokio::time::timeout(Duration::from_millis(20), wait).await;
                    }
                })
            })
            .collect();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(store.watched_keys(), 0, "round {round}: registrations left");
    }
}
