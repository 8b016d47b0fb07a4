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
    insert_expired(&sql, &table, 2500).await;
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

/// Around a store: the largest batch and how many batches `PurgeTask` ran.
#[derive(Clone)]
struct Batches {
    inner: PostgresStore,
    largest: Arc<std::sync::atomic::AtomicU64>,
    count: Arc<AtomicUsize>,
}

impl Maintenance for Batches {
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        self.inner.purge_expired().await
    }

    async fn purge_expired_batch(&self, limit: std::num::NonZeroU32) -> Result<u64, StoreError> {
        let deleted = self.inner.purge_expired_batch(limit).await?;
        self.largest.fetch_max(deleted, Ordering::SeqCst);
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(deleted)
    }

    async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        self.inner.purge_scope(scope).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_task_empties_a_large_backlog_in_bounded_batches_beside_live_requests() {
    let Some(url) = pg::database_url("purge_task_empties_a_large_backlog") else {
        return;
    };
    let table = pg::unique_table("purge_task");
    // No tombstones: the backlog is deleted outright.
    let store = pg::store(&url, &table, |s| s.with_tombstone(Duration::ZERO)).await;
    let sql = pg::connect(&url).await;
    insert_expired(&sql, &table, 200_000).await;
    let watched = Batches {
        inner: store.clone(),
        largest: Arc::default(),
        count: Arc::default(),
    };
    let batch = 5000;
    let purge = tower_idempotency::store::purge::PurgeTask::new(watched.clone())
        .every(Duration::from_millis(20))
        .with_jitter(0.5)
        .with_batch_size(std::num::NonZeroU32::new(batch).unwrap())
        .spawn()
        .unwrap();
    let count = format!("SELECT count(*) FROM public.{table} WHERE scope = 's'");
    let deadline = Instant::now() + Duration::from_secs(50);
    let mut live = 0;
    loop {
        // A claim and its completion on a live key, beside the purge.
        let started = Instant::now();
        let key = fresh_key();
        let token = claim(&store, &key, "a").await;
        store
            .complete(&key, token, Completion::Response(response(b"live")))
            .await
            .unwrap();
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "a live request took {took:?}"
        );
        live += 1;
        let left: i64 = sql.query_one(&count, &[]).await.unwrap().get(0);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} expired rows left");
    }
    let deleted = purge.shutdown().await;
    assert_eq!(
        deleted, 200_000,
        "only the expired rows; {live} live ones kept"
    );
    let largest = watched.largest.load(Ordering::SeqCst);
    assert!(largest <= u64::from(batch), "a batch of {largest} rows");
    assert!(watched.count.load(Ordering::SeqCst) >= 40);
    let kept: i64 = sql
        .query_one(&format!("SELECT count(*) FROM public.{table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, live);
}

/// The soak: a million expired records, inserted in one statement, emptied by
/// `PurgeTask` in batches of at most 10 000 while live requests keep coming:
/// each claim, completion and replay answers within 2 s (a generous bound on
/// a busy 2-core machine: a batch never blocks a live row), and only expired
/// rows go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_task_empties_a_million_expired_records_while_live_requests_answer() {
    let Some(url) = pg::database_url("purge_task_empties_a_million_expired_records") else {
        return;
    };
    const ROWS: i64 = 1_000_000;
    let table = pg::unique_table("purge_soak");
    // No tombstones: every expired row goes (with them, the same batches
    // would turn the rows into tombstones, tested beside).
    let store = pg::store(&url, &table, |s| s.with_tombstone(Duration::ZERO)).await;
    let sql = pg::connect(&url).await;
    let started = Instant::now();
    insert_expired(&sql, &table, ROWS).await;
    let inserted = started.elapsed();
    let watched = Batches {
        inner: store.clone(),
        largest: Arc::default(),
        count: Arc::default(),
    };
    let batch = 10_000;
    let purge = tower_idempotency::store::purge::PurgeTask::new(watched.clone())
        .every(Duration::from_millis(10))
        .with_jitter(0.5)
        .with_batch_size(std::num::NonZeroU32::new(batch).unwrap())
        .spawn()
        .unwrap();
    let count = format!("SELECT count(*) FROM public.{table} WHERE scope = 's'");
    let bound = Duration::from_secs(2);
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut live, mut slowest) = (0, Duration::ZERO);
    loop {
        for _ in 0..10 {
            let key = fresh_key();
            let timed = Instant::now();
            let token = claim(&store, &key, "a").await;
            slowest = slowest.max(timed.elapsed());
            let timed = Instant::now();
            store
                .complete(&key, token, Completion::Response(response(b"live")))
                .await
                .unwrap();
            slowest = slowest.max(timed.elapsed());
            let timed = Instant::now();
            assert!(matches!(
                store.begin(&key, &fingerprint("a")).await,
                Ok(Begin::Replay(_))
            ));
            slowest = slowest.max(timed.elapsed());
            assert!(slowest < bound, "a live call took {slowest:?}");
            live += 1;
        }
        let left: i64 = sql.query_one(&count, &[]).await.unwrap().get(0);
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} expired rows left");
    }
    let deleted = purge.shutdown().await;
    eprintln!(
        "soak: {ROWS} rows inserted in {inserted:?}, purged in {:?} by {} batches; \
         {live} live requests, the slowest call {slowest:?}",
        started.elapsed() - inserted,
        watched.count.load(Ordering::SeqCst),
    );
    assert_eq!(
        deleted, ROWS as u64,
        "only the expired rows; {live} live ones kept"
    );
    let largest = watched.largest.load(Ordering::SeqCst);
    assert!(largest <= u64::from(batch), "a batch of {largest} rows");
    assert!(watched.count.load(Ordering::SeqCst) as i64 >= ROWS / i64::from(batch));
    let kept: i64 = sql
        .query_one(&format!("SELECT count(*) FROM public.{table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, live);
    sql.batch_execute(&format!("DROP TABLE public.{table}"))
        .await
        .unwrap();
}

/// `rows` completed records of `table`, expired a second ago, in one statement.
/// A purge reduces completed rows past their retention to tombstones (no
/// response, `expires_at` moved by the window), in batches, and deletes the
/// tombstones in batches too once their own window has passed on the
/// database's clock; a tombstone answers its key's requests meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_reduces_expired_records_to_tombstones_then_deletes_them_in_batches() {
    let Some(url) = pg::database_url("purge_reduces_expired_records_to_tombstones") else {
        return;
    };
    let table = pg::unique_table("purge_tomb");
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 1))
        .with_table(table.parse().unwrap())
        .with_tombstone(Duration::from_secs(3600))
        .build();
    store.migrate().await.unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), 0); // warms the statement cache
    let sql = pg::connect(&url).await;
    insert_expired(&sql, &table, 2500).await;
    let before = store.round_trips();
    assert_eq!(store.purge_expired().await.unwrap(), 2500);
    assert_eq!(
        store.round_trips() - before,
        3,
        "batches of 1000, 1000 and 500"
    );
    let row = sql
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE state = 'expired' AND status IS NULL \
                         AND headers IS NULL AND body IS NULL), \
                        bool_and(expires_at - now() > interval '59 minutes')::int \
                 FROM public.{table}"
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i32>(1)), (2500, 1));
    // Nothing left to reduce, and the tombstones are not expired yet.
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    let key = RecordKey::new(
        Scope::new("s"),
        tower_idempotency::IdempotencyKey::parse(b"key-1000").unwrap(),
    );
    assert!(matches!(
        store.begin(&key, &fingerprint("a")).await,
        Ok(Begin::KeyReused)
    ));
    // Their window passes.
    sql.execute(
        &format!("UPDATE public.{table} SET expires_at = now() - interval '1 second'"),
        &[],
    )
    .await
    .unwrap();
    let before = store.round_trips();
    assert_eq!(store.purge_expired().await.unwrap(), 2500);
    assert_eq!(
        store.round_trips() - before,
        3,
        "batches of 1000, 1000 and 500"
    );
    let left: i64 = sql
        .query_one(&format!("SELECT count(*) FROM public.{table}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    assert!(matches!(
        store.begin(&key, &fingerprint("a")).await,
        Ok(Begin::Claimed(_))
    ));
}

/// What a tombstone costs: the table's size (heap, indexes, TOAST) with
/// 100 000 tombstones, less its size empty, per tombstone, after a `VACUUM
/// FULL` so that no dead row versions count; and the average row size.
/// Printed for `docs/benchmarks.md` (`--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_row_costs_under_300_bytes() {
    let Some(url) = pg::database_url("a_tombstone_row_costs_under_300_bytes") else {
        return;
    };
    let table = pg::unique_table("tomb_size");
    let store = pg::store(&url, &table, |s| {
        s.with_tombstone(Duration::from_secs(3600))
    })
    .await;
    let sql = pg::connect(&url).await;
    let size = format!("SELECT pg_total_relation_size('public.{table}')");
    sql.batch_execute(&format!("VACUUM FULL public.{table}"))
        .await
        .unwrap();
    let empty: i64 = sql.query_one(&size, &[]).await.unwrap().get(0);
    // Keys and fingerprints as the layer writes them: a UUID, a SHA-256.
    let n = 100_000i64;
    sql.execute(
        &format!(
            "INSERT INTO public.{table} \
             (scope, key, fingerprint, token, state, expires_at, status, headers, body) \
             SELECT 'tenant-0001', gen_random_uuid()::text, sha256(i::text::bytea), i, \
                    'completed', now() - interval '1 second', 201, '', 'a response body' \
             FROM generate_series(1, $1::bigint) AS i"
        ),
        &[&n],
    )
    .await
    .unwrap();
    assert_eq!(store.purge_expired().await.unwrap(), n as u64);
    sql.batch_execute(&format!("VACUUM FULL public.{table}"))
        .await
        .unwrap();
    let full: i64 = sql.query_one(&size, &[]).await.unwrap().get(0);
    let row: f64 = sql
        .query_one(
            &format!("SELECT avg(pg_column_size(t.*))::float8 FROM public.{table} AS t"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let per_tombstone = (full - empty) / n;
    println!(
        "PostgreSQL: {per_tombstone} bytes per tombstone (table, indexes and TOAST: \
         {empty} bytes empty, {full} with {n}); average row {row:.0} bytes"
    );
    assert!(per_tombstone < 300, "{per_tombstone} bytes per tombstone");
}

async fn insert_expired(sql: &tokio_postgres::Client, table: &str, rows: i64) {
    let insert = format!(
        "INSERT INTO public.{table} \
         (scope, key, fingerprint, token, state, expires_at, status, headers, body) \
         SELECT 's', 'key-' || i, '\\x00', i, 'completed', now() - interval '1 second', \
                201, '', '' \
         FROM generate_series(1, $1::bigint) AS i"
    );
    sql.execute(&insert, &[&rows]).await.unwrap();
}
