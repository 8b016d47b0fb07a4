//! Schema: concurrent migrations, and identifier validation.

use super::*;
use tower_idempotency::store::{Completion, SqlIdentifier};
use tower_idempotency::ConfigError;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_safe_from_many_instances_at_once() {
    let Some(url) = pg::database_url("migrate_is_idempotent_and_safe_from_many_instances") else {
        return;
    };
    let schema = pg::unique_table("schema");
    let table = "idempotency_records";
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 1))
                .with_schema(schema.parse().unwrap())
                .with_table(table.parse().unwrap())
                .build();
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().expect("concurrent migrate");
    }
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 1))
        .with_schema(schema.parse().unwrap())
        .with_table(table.parse().unwrap())
        .build();
    store.migrate().await.expect("migrate again");
    assert_eq!(store.table(), format!("{schema}.{table}"));
    let key = fresh_key();
    let token = claim(&store, &key, "a").await;
    store
        .complete(&key, token, Completion::Response(response(b"ok")))
        .await
        .unwrap();
}

/// The records table as the first release created it (before versions were
/// recorded), holding a claim whose owner died an hour ago.
const FIRST_RELEASE_RECORDS: &str = r#"
CREATE SEQUENCE "public"."{t}_token_seq" AS bigint;
CREATE TABLE "public"."{t}" (
    scope       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    token       bigint      NOT NULL,
    state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    status      smallint,
    headers     bytea,
    body        bytea,
    PRIMARY KEY (scope, key),
    CHECK ((state = 'completed') = (status IS NOT NULL AND headers IS NOT NULL AND body IS NOT NULL))
);
CREATE INDEX "{t}_expires_at_idx" ON "public"."{t}" (expires_at);
"#;

/// A claim left by a release without takeover columns is upgraded as a
/// first attempt: taking it over reports attempt 2, its token and its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_dead_claim_of_the_first_release_to_a_first_attempt() {
    let Some(url) = pg::database_url("migrate_upgrades_a_dead_claim_to_a_first_attempt") else {
        return;
    };
    let table = pg::unique_table("records_upgrade");
    let client = pg::connect(&url).await;
    client
        .batch_execute(&FIRST_RELEASE_RECORDS.replace("{t}", &table))
        .await
        .expect("first release schema");
    let key = fresh_key();
    let fp = fingerprint("a");
    let dead_began: std::time::SystemTime = client
        .query_one(
            &format!(
                r#"INSERT INTO "public"."{table}"
                   (scope, key, fingerprint, token, state, created_at, expires_at)
                   VALUES ($1, $2, $3, 41, 'in_progress', now() - interval '1 hour',
                           now() - interval '59 minutes')
                   RETURNING created_at"#
            ),
            &[
                &key.scope().as_str(),
                &key.key().as_str(),
                &fp.fingerprint().as_bytes().as_slice(),
            ],
        )
        .await
        .unwrap()
        .get(0);
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 2))
        .with_table(table.parse().unwrap())
        .build();
    store.migrate().await.expect("upgrade");
    store.migrate().await.expect("upgrade is idempotent");

    let Begin::Claimed(claim) = store.begin(&key, &fp).await.unwrap() else {
        panic!("the dead claim is taken over");
    };
    let takeover = claim.takeover.expect("a takeover");
    assert_eq!(takeover.attempt, 2);
    assert_eq!(takeover.previous_token, FencingToken::new(41));
    assert_eq!(takeover.previous_began, dead_began);
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM public.tower_idempotency_migrations WHERE table_name = $1 \
             ORDER BY version",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        versions,
        [1, 2, 3, 4, 5, 6],
        "adopted as version 1, upgraded by 2, 3, 4, 5 (the phases table) and 6 (the claim function)"
    );
}

#[test]
fn identifiers_are_validated_as_plain_lower_case_names() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _guard = runtime.enter();
    // Building a pool does not connect.
    let pool = || pg::pool(pg::pg_config("postgres://nobody@127.0.0.1:1/none"), 1);
    let long = "a".repeat(63);
    for good in ["idempotency_records", "_t", "t1", "select", long.as_str()] {
        PostgresStore::builder(pool())
            .with_table(good.parse().unwrap())
            .with_schema(good.parse().unwrap())
            .build();
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
    // Refused as an error where the name is made, before any builder sees it.
    for name in bad {
        assert_eq!(
            name.parse::<SqlIdentifier>(),
            Err(ConfigError::SqlIdentifier(name.to_owned())),
            "{name:?} was accepted"
        );
    }
}
