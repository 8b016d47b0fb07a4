//! The near cache: a replay of a record this instance completed or read costs
//! no round trip, never outlives the record, and a purge on any instance
//! reaches every instance's cache.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;
use tower_idempotency::store::NearCache;

/// Two instances on one table, both listening.
async fn two_instances(url: &str, retention: Duration) -> (PostgresStore, PostgresStore) {
    let table = pg::unique_table("near");
    // One connection each, so that one `begin` prepares its statement for good.
    let instance = || {
        PostgresStore::builder(pg::pool(pg::pg_config(url), 1))
            .with_table(table.parse().unwrap())
            .with_retention(retention)
            .with_listener(pg::pg_config(url))
            .build()
    };
    let (a, b) = (instance(), instance());
    a.migrate().await.unwrap();
    until_listening(&a).await;
    until_listening(&b).await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_keys_retries_reach_the_database_once_per_instance() {
    let Some(url) = pg::database_url("near_cache_hot_key") else {
        return;
    };
    let (a, b) = two_instances(&url, Duration::from_secs(60)).await;
    let key = fresh_key();
    let token = claim(&a, &key, "order").await;
    a.complete(&key, token, Completion::Response(response(b"created")))
        .await
        .unwrap();
    // Even the instance that completed it reads it once (completions are not
    // kept near: most keys are never retried), then answers near.
    let before = a.round_trips();
    for _ in 0..100 {
        assert!(matches!(
            a.begin(&key, &fingerprint("order")).await,
            Ok(Begin::Replay(_))
        ));
    }
    assert_eq!(a.round_trips() - before, 1, "completed here: read once");
    // Another instance reads it once, then answers near (its pool of one
    // connection prepared `begin` first).
    let _ = b.begin(&fresh_key(), &fingerprint("warm")).await.unwrap();
    let before = b.round_trips();
    for _ in 0..100 {
        assert!(matches!(
            b.begin(&key, &fingerprint("order")).await,
            Ok(Begin::Replay(_))
        ));
    }
    assert_eq!(b.round_trips() - before, 1, "read once");
    // Another request under the key is refused near as well.
    let before = b.round_trips();
    assert!(matches!(
        b.begin(&key, &fingerprint("another")).await,
        Ok(Begin::KeyReused)
    ));
    assert_eq!(b.round_trips() - before, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_on_one_instance_reaches_the_near_cache_of_every_instance() {
    let Some(url) = pg::database_url("near_cache_purge") else {
        return;
    };
    let (a, b) = two_instances(&url, Duration::from_secs(60)).await;
    let key = fresh_key();
    let token = claim(&a, &key, "order").await;
    a.complete(&key, token, Completion::Response(response(b"created")))
        .await
        .unwrap();
    assert!(matches!(
        b.begin(&key, &fingerprint("order")).await,
        Ok(Begin::Replay(_))
    ));
    a.purge_scope(key.scope()).await.unwrap();
    // Here at once.
    assert!(matches!(
        a.begin(&key, &fingerprint("order")).await,
        Ok(Begin::Claimed(_))
    ));
    // There once the notification arrived: the key then answers "in progress"
    // (a's new claim), never the purged record.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match b.begin(&key, &fingerprint("order")).await.unwrap() {
            Begin::InProgress => break,
            Begin::Replay(_) => assert!(Instant::now() < deadline, "the purge never arrived"),
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_near_record_never_outlives_its_retention() {
    let Some(url) = pg::database_url("near_cache_retention") else {
        return;
    };
    let (a, _b) = two_instances(&url, Duration::from_millis(300)).await;
    let key = fresh_key();
    let token = claim(&a, &key, "order").await;
    a.complete(&key, token, Completion::Response(response(b"created")))
        .await
        .unwrap();
    assert!(matches!(
        a.begin(&key, &fingerprint("order")).await,
        Ok(Begin::Replay(_))
    ));
    tokio::time::sleep(Duration::from_millis(350)).await;
    // Past the retention: the database's tombstone answers, not the near copy.
    assert!(matches!(
        a.begin(&key, &fingerprint("order")).await,
        Ok(Begin::Expired)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_listener_or_disabled_every_begin_asks_the_database() {
    let Some(url) = pg::database_url("near_cache_off") else {
        return;
    };
    let table = pg::unique_table("near_off");
    let unheard = PostgresStore::builder(pg::pool(pg::pg_config(&url), 2))
        .with_table(table.parse().unwrap())
        .build();
    unheard.migrate().await.unwrap();
    let disabled = pg::store(&url, &table, |s| s.with_near_cache(NearCache::disabled())).await;
    until_listening(&disabled).await;
    for store in [&unheard, &disabled] {
        let key = fresh_key();
        let token = claim(store, &key, "order").await;
        store
            .complete(&key, token, Completion::Response(response(b"created")))
            .await
            .unwrap();
        let before = store.round_trips();
        for _ in 0..3 {
            assert!(matches!(
                store.begin(&key, &fingerprint("order")).await,
                Ok(Begin::Replay(_))
            ));
        }
        assert_eq!(store.round_trips() - before, 3);
    }
}
