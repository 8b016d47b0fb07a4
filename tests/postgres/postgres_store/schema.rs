//! Schema: concurrent migrations, and identifier validation.

use super::*;
use tower_idempotency::store::Completion;

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
    store
        .complete(&key, token, Completion::Response(response(b"ok")))
        .await
        .unwrap();
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
