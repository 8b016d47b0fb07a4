//! One migration mechanism for every PostgreSQL store of the crate: numbered
//! migrations per table, recorded in `<schema>.tower_idempotency_migrations`,
//! applied in order under one advisory lock, in one transaction.
//!
//! A database from before the version table existed is adopted: migration 1
//! of each table is written with `IF NOT EXISTS`, so it finds the table there
//! and records it; later migrations then upgrade it in place.

use deadpool_postgres::Object;
use tokio_postgres::Error;

/// Advisory lock every store's `migrate` takes (ASCII "tower_id"): concurrent
/// migrations of any store, from any instance, run one after another.
pub(super) const MIGRATE_LOCK: i64 = 0x746f_7765_725f_6964;

/// The version table, in the store's schema.
pub(super) const VERSIONS: &str = "tower_idempotency_migrations";

/// Applies the migrations of `table` (in `schema`) that its version table has
/// not recorded, in order; returns how many ran. `migrations[i]` is version
/// `i + 1`.
pub(crate) async fn apply(
    client: &mut Object,
    schema: &str,
    table: &str,
    migrations: &[String],
) -> Result<usize, Error> {
    let tx = client.transaction().await?;
    // The schema and version table are created under the lock too: two first
    // migrations into a fresh schema never race on CREATE SCHEMA. The schema
    // only when missing (`CREATE SCHEMA IF NOT EXISTS` would still need the
    // CREATE privilege on the database).
    tx.batch_execute(&format!(
        r#"SELECT pg_advisory_xact_lock({MIGRATE_LOCK});
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = '{schema}') THEN
        CREATE SCHEMA "{schema}";
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS "{schema}"."{VERSIONS}" (
    table_name text        NOT NULL,
    version    integer     NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (table_name, version)
);"#
    ))
    .await?;
    let applied: i32 = tx
        .query_one(
            &format!(
                r#"SELECT coalesce(max(version), 0) FROM "{schema}"."{VERSIONS}" WHERE table_name = $1"#
            ),
            &[&table],
        )
        .await?
        .get(0);
    let pending = migrations.iter().enumerate().skip(applied.max(0) as usize);
    let mut ran = 0;
    for (index, migration) in pending {
        tx.batch_execute(migration).await?;
        let version = index as i32 + 1;
        tx.execute(
            &format!(
                r#"INSERT INTO "{schema}"."{VERSIONS}" (table_name, version) VALUES ($1, $2)"#
            ),
            &[&table, &version],
        )
        .await?;
        ran += 1;
    }
    tx.commit().await?;
    Ok(ran)
}
