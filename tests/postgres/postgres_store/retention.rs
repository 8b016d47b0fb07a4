//! Retention: batched purges, and large binary bodies.

use super::*;
use tower_idempotency::store::Completion;
use tower_idempotency::store::Maintenance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_expired_records_in_batches_of_1000() {
    let Some(url) = pg::database_url("purge_deletes_expired_records_in_batches") else {
        return;
    };
    let table = pg::unique_table("purge");
    // One connection, so the purge statement is prepared once.
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 1))
        .with_table(table.parse().unwrap())
        .build();
    store.migrate().await.unwrap();
    let live = fresh_key();
    let token = claim(&store, &live, "a").await;
    store
        .complete(&live, token, Completion::Response(response(b"kept")))
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
    store
        .complete(&key, token, Completion::Response(stored.clone()))
        .await
        .unwrap();
    match store.begin(&key, &fingerprint("a")).await.unwrap() {
        Begin::Replay(replayed) => assert_eq!(*replayed, stored),
        other => panic!("expected a replay, got {other:?}"),
    }
}
