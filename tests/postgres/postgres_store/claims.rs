//! Atomic claims under concurrency: two pools, and a rival committing after the snapshot.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_is_one_atomic_insert_across_two_pools_300_concurrent_begins() {
    let Some(url) = pg::database_url("claim_is_one_atomic_insert_across_two_pools") else {
        return;
    };
    let table = pg::unique_table("two_pools");
    let first = pg::store(&url, &table, |s| s).await;
    // A second, independent pool on the same table, as another app instance has.
    let second = PostgresStore::builder(pg::pool(pg::pg_config(&url), 16))
        .with_table(table.parse().unwrap())
        .build();
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

/// Runs `begin` while `tx` holds a conflicting change, commits `tx` once `begin`
/// waits on it, and checks that `begin` ran its statement again and answered
/// `InProgress`.
async fn begin_decides_after_the_rival_commits(
    store: &Arc<PostgresStore>,
    key: &RecordKey,
    observer: &tokio_postgres::Client,
    table: &str,
    tx: tokio_postgres::Transaction<'_>,
) {
    let retries = store.begin_retries();
    let pending = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { store.begin(&key, &fingerprint("a")).await })
    };
    until_blocked_on(observer, table).await;
    tx.commit().await.unwrap();
    let decided = pending.await.unwrap().expect("begin");
    assert!(matches!(decided, Begin::InProgress), "got {decided:?}");
    assert!(
        store.begin_retries() > retries,
        "begin ran its statement again"
    );
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
    begin_decides_after_the_rival_commits(&store, &key, &observer, &table, tx).await;

    // 2. A takeover: the rival takes over an expired record and holds its
    // commit. `begin` skips the locked row instead of waiting behind it (a
    // transactional owner holds its row the same way) and answers at once.
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
    let started = Instant::now();
    let decided = store.begin(&key2, &fingerprint("a")).await.expect("begin");
    assert!(matches!(decided, Begin::InProgress), "got {decided:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    tx.commit().await.unwrap();
    let decided = store.begin(&key2, &fingerprint("a")).await.expect("begin");
    assert!(
        matches!(decided, Begin::InProgress),
        "the rival's live claim: {decided:?}"
    );
}
