//! Where the checkout demo keeps its charges and orders: in the process with
//! the memory store, in PostgreSQL (written inside the idempotency layer's
//! transaction) with the PostgreSQL store, so that every instance, and a
//! restarted one, sees the same rows.
//!
//! Written outside that transaction (plain mode, or records kept in Redis),
//! each row commits on its own, before the record: a handler run again after
//! a crash must not write it twice. So each row carries the request's
//! downstream key for it, under a unique index, and a second write of it
//! returns the first row (`ON CONFLICT ... DO UPDATE ... RETURNING`).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The demo's charges and orders.
#[derive(Clone)]
pub enum Ledger {
    /// In this process only.
    Memory(Arc<MemoryLedger>),
    /// In PostgreSQL tables `checkout_charges` and `checkout_orders`,
    /// written in the layer's transaction.
    #[cfg(feature = "postgres")]
    Postgres(deadpool_postgres::Pool),
    /// The same tables, each write committed on its own.
    #[cfg(feature = "postgres")]
    PostgresOwnCommits(deadpool_postgres::Pool),
}

/// Why a write failed (the handler answers `500`; nothing is recorded).
#[derive(Debug)]
pub struct LedgerError(#[allow(dead_code)] String);

/// Where a handler writes: nowhere special in memory, the request's
/// transaction on PostgreSQL, or the pool (a commit per write).
pub enum Writer {
    Memory,
    #[cfg(feature = "postgres")]
    Transaction(tower_idempotency::PostgresTransaction),
    #[cfg(feature = "postgres")]
    Pool(deadpool_postgres::Pool),
}

#[cfg(feature = "postgres")]
impl Writer {
    async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, LedgerError> {
        let failed = |e: &dyn std::fmt::Display| LedgerError(e.to_string());
        match self {
            Self::Transaction(tx) => {
                let client = tx.client().await.map_err(|e| failed(&e))?;
                client.query_one(sql, params).await.map_err(|e| failed(&e))
            }
            Self::Pool(pool) => {
                let client = pool.get().await.map_err(|e| failed(&e))?;
                client.query_one(sql, params).await.map_err(|e| failed(&e))
            }
            Self::Memory => Err(LedgerError("writer and ledger disagree".into())),
        }
    }
}

impl Writer {
    /// The writer the layer gave this request, if the ledger needs one.
    pub fn of(ledger: &Ledger, extensions: &http::Extensions) -> Option<Self> {
        let _ = extensions;
        match ledger {
            Ledger::Memory(_) => Some(Self::Memory),
            #[cfg(feature = "postgres")]
            Ledger::Postgres(_) => extensions
                .get::<tower_idempotency::PostgresTransaction>()
                .cloned()
                .map(Self::Transaction),
            #[cfg(feature = "postgres")]
            Ledger::PostgresOwnCommits(pool) => Some(Self::Pool(pool.clone())),
        }
    }
}

impl Ledger {
    /// A writer that commits each write on its own (the phased route's
    /// charge without a processor, outside any transaction).
    pub fn own_commits(&self) -> Writer {
        match self {
            Self::Memory(_) => Writer::Memory,
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) | Self::PostgresOwnCommits(pool) => Writer::Pool(pool.clone()),
        }
    }

    /// A ledger in this process.
    pub fn memory() -> Self {
        Self::Memory(Arc::default())
    }

    /// Records a charge of the simulated payment network under `key` (its
    /// downstream key); returns its id, the first one's for a key charged
    /// before.
    pub async fn charge(
        &self,
        writer: &Writer,
        key: &str,
        merchant: &str,
        sku: &str,
        qty: u64,
    ) -> Result<String, LedgerError> {
        let _ = key;
        match (self, writer) {
            (Self::Memory(ledger), Writer::Memory) => Ok(ledger.push(
                Table::Charges,
                merchant,
                |id| json!({ "id": format!("ch_{id:06}"), "sku": sku, "qty": qty }),
            )),
            #[cfg(feature = "postgres")]
            (Self::Memory(_), _) => Err(LedgerError("writer and ledger disagree".into())),
            #[cfg(feature = "postgres")]
            _ => {
                let row = writer
                    .query_one(
                        "INSERT INTO checkout_charges (merchant, sku, qty, charge_key) \
                         VALUES ($1, $2, $3, $4) \
                         ON CONFLICT (charge_key) DO UPDATE SET charge_key = EXCLUDED.charge_key \
                         RETURNING 'ch_' || lpad(id::text, 6, '0')",
                        &[&merchant, &sku, &(qty as i32), &key],
                    )
                    .await?;
                Ok(row.get(0))
            }
        }
    }

    /// Writes the order paid by `charge` under `key` (its downstream key);
    /// returns it as JSON, the first one for a key written before.
    pub async fn order(
        &self,
        writer: &Writer,
        key: &str,
        merchant: &str,
        charge: &str,
        sku: &str,
        qty: u64,
    ) -> Result<Value, LedgerError> {
        let _ = key;
        match (self, writer) {
            (Self::Memory(ledger), Writer::Memory) => {
                let mut order = Value::Null;
                ledger.push(Table::Orders, merchant, |id| {
                    order = json!({
                        "id": format!("ord_{id:06}"), "charge": charge,
                        "sku": sku, "qty": qty, "currency": "USD",
                    });
                    order.clone()
                });
                Ok(order)
            }
            #[cfg(feature = "postgres")]
            (Self::Memory(_), _) => Err(LedgerError("writer and ledger disagree".into())),
            #[cfg(feature = "postgres")]
            _ => {
                let row = writer
                    .query_one(
                        "INSERT INTO checkout_orders (merchant, charge, sku, qty, order_key) \
                         VALUES ($1, $2, $3, $4, $5) \
                         ON CONFLICT (order_key) DO UPDATE SET order_key = EXCLUDED.order_key \
                         RETURNING 'ord_' || lpad(id::text, 6, '0'), charge, sku, qty",
                        &[&merchant, &charge, &sku, &(qty as i32), &key],
                    )
                    .await?;
                let (id, charge, sku, qty) = (
                    row.get::<_, String>(0),
                    row.get::<_, String>(1),
                    row.get::<_, String>(2),
                    row.get::<_, i32>(3),
                );
                Ok(json!({
                    "id": id, "charge": charge, "sku": sku, "qty": qty, "currency": "USD",
                }))
            }
        }
    }

    /// The merchant's charges, oldest first.
    pub async fn charges(&self, merchant: &str) -> Result<Vec<Value>, LedgerError> {
        self.list(Table::Charges, merchant).await
    }

    /// The merchant's orders, oldest first.
    pub async fn orders(&self, merchant: &str) -> Result<Vec<Value>, LedgerError> {
        self.list(Table::Orders, merchant).await
    }

    async fn list(&self, table: Table, merchant: &str) -> Result<Vec<Value>, LedgerError> {
        match self {
            Self::Memory(ledger) => Ok(ledger.list(table, merchant)),
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) | Self::PostgresOwnCommits(pool) => {
                let client = pool.get().await.map_err(|e| LedgerError(e.to_string()))?;
                let sql = match table {
                    Table::Charges => {
                        "SELECT json_build_object('id', 'ch_' || lpad(id::text, 6, '0'), \
                         'sku', sku, 'qty', qty)::text FROM checkout_charges \
                         WHERE merchant = $1 ORDER BY id"
                    }
                    Table::Orders => {
                        "SELECT json_build_object('id', 'ord_' || lpad(id::text, 6, '0'), \
                         'charge', charge, 'sku', sku, 'qty', qty, 'currency', 'USD')::text \
                         FROM checkout_orders WHERE merchant = $1 ORDER BY id"
                    }
                    Table::PhasedOrders => {
                        "SELECT json_build_object('id', 'ord_' || lpad(id::text, 6, '0'), \
                         'status', status, 'charge', charge, 'sku', sku, 'qty', qty, \
                         'currency', 'USD')::text \
                         FROM checkout_phased_orders WHERE merchant = $1 ORDER BY id"
                    }
                    Table::Emails => {
                        "SELECT json_build_object('id', 'em_' || lpad(id::text, 6, '0'), \
                         'order', order_id, 'kind', kind)::text \
                         FROM checkout_emails WHERE merchant = $1 ORDER BY id"
                    }
                };
                let rows = client
                    .query(sql, &[&merchant])
                    .await
                    .map_err(|e| LedgerError(e.to_string()))?;
                Ok(rows
                    .iter()
                    .map(|row| serde_json::from_str(row.get(0)).expect("JSON from PostgreSQL"))
                    .collect())
            }
        }
    }

    /// The phased route's orders of the merchant, oldest first.
    pub async fn phased_orders(&self, merchant: &str) -> Result<Vec<Value>, LedgerError> {
        self.list(Table::PhasedOrders, merchant).await
    }

    /// The phased route's receipt emails of the merchant, oldest first.
    pub async fn emails(&self, merchant: &str) -> Result<Vec<Value>, LedgerError> {
        self.list(Table::Emails, merchant).await
    }

    /// In memory: writes a pending order; returns its id.
    pub fn memory_pending_order(&self, merchant: &str, sku: &str, qty: u64) -> Option<String> {
        let ledger = match self {
            Self::Memory(ledger) => ledger,
            #[cfg(feature = "postgres")]
            _ => return None,
        };
        Some(ledger.push(Table::PhasedOrders, merchant, |id| {
            json!({
                "id": format!("ord_{id:06}"), "status": "pending", "charge": null,
                "sku": sku, "qty": qty, "currency": "USD",
            })
        }))
    }

    /// In memory: marks the order paid by `charge` and enqueues its
    /// receipt; returns the email's id.
    pub fn memory_paid(&self, merchant: &str, order: &str, charge: &str) -> Option<String> {
        let ledger = match self {
            Self::Memory(ledger) => ledger,
            #[cfg(feature = "postgres")]
            _ => return None,
        };
        ledger.update(Table::PhasedOrders, merchant, order, |row| {
            row["status"] = json!("paid");
            row["charge"] = json!(charge);
        });
        Some(ledger.push(
            Table::Emails,
            merchant,
            |id| json!({ "id": format!("em_{id:06}"), "order": order, "kind": "receipt" }),
        ))
    }

    /// Creates the PostgreSQL tables if missing (safe from many instances at once).
    #[cfg(feature = "postgres")]
    pub async fn migrate(pool: &deadpool_postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        tx.batch_execute(
            "SELECT pg_advisory_xact_lock(7363); \
             CREATE TABLE IF NOT EXISTS checkout_charges ( \
                 id bigserial PRIMARY KEY, merchant text NOT NULL, sku text NOT NULL, \
                 qty integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now()); \
             CREATE TABLE IF NOT EXISTS checkout_orders ( \
                 id bigserial PRIMARY KEY, merchant text NOT NULL, charge text NOT NULL, \
                 sku text NOT NULL, qty integer NOT NULL, \
                 created_at timestamptz NOT NULL DEFAULT now()); \
             CREATE INDEX IF NOT EXISTS checkout_charges_merchant ON checkout_charges (merchant); \
             CREATE INDEX IF NOT EXISTS checkout_orders_merchant ON checkout_orders (merchant); \
             ALTER TABLE checkout_charges ADD COLUMN IF NOT EXISTS charge_key text; \
             ALTER TABLE checkout_orders ADD COLUMN IF NOT EXISTS order_key text; \
             CREATE UNIQUE INDEX IF NOT EXISTS checkout_charges_key ON checkout_charges (charge_key); \
             CREATE UNIQUE INDEX IF NOT EXISTS checkout_orders_key ON checkout_orders (order_key); \
             CREATE TABLE IF NOT EXISTS checkout_phased_orders ( \
                 id bigserial PRIMARY KEY, merchant text NOT NULL, sku text NOT NULL, \
                 qty integer NOT NULL, status text NOT NULL DEFAULT 'pending', charge text, \
                 order_key text NOT NULL UNIQUE, writes integer NOT NULL DEFAULT 1, \
                 created_at timestamptz NOT NULL DEFAULT now()); \
             CREATE TABLE IF NOT EXISTS checkout_emails ( \
                 id bigserial PRIMARY KEY, merchant text NOT NULL, order_id text NOT NULL, \
                 kind text NOT NULL, email_key text NOT NULL UNIQUE, \
                 writes integer NOT NULL DEFAULT 1, \
                 created_at timestamptz NOT NULL DEFAULT now()); \
             CREATE INDEX IF NOT EXISTS checkout_phased_orders_merchant \
                 ON checkout_phased_orders (merchant); \
             CREATE INDEX IF NOT EXISTS checkout_emails_merchant ON checkout_emails (merchant);",
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Table {
    Charges,
    Orders,
    /// The phased route's orders (`phased.rs`), which it marks paid.
    PhasedOrders,
    /// Its outbox of receipt emails.
    Emails,
}

/// Charges and orders per merchant, in this process.
#[derive(Default)]
pub struct MemoryLedger {
    tables: Mutex<[Rows; 4]>,
}

#[derive(Default)]
struct Rows {
    next_id: u64,
    by_merchant: HashMap<String, Vec<Value>>,
}

impl MemoryLedger {
    fn push(&self, table: Table, merchant: &str, row: impl FnOnce(u64) -> Value) -> String {
        let mut tables = self.tables.lock().unwrap();
        let rows = &mut tables[table as usize];
        rows.next_id += 1;
        let row = row(rows.next_id);
        let id = row["id"].as_str().unwrap_or_default().to_owned();
        rows.by_merchant
            .entry(merchant.to_owned())
            .or_default()
            .push(row);
        id
    }

    /// Changes the row `id` of `merchant` in `table`; returns it changed.
    fn update(&self, table: Table, merchant: &str, id: &str, f: impl FnOnce(&mut Value)) -> Value {
        let mut tables = self.tables.lock().unwrap();
        let rows = tables[table as usize]
            .by_merchant
            .entry(merchant.to_owned());
        let row = rows.or_default().iter_mut().find(|row| row["id"] == id);
        row.map(|row| {
            f(row);
            row.clone()
        })
        .unwrap_or(Value::Null)
    }

    fn list(&self, table: Table, merchant: &str) -> Vec<Value> {
        let tables = self.tables.lock().unwrap();
        let rows = &tables[table as usize];
        rows.by_merchant.get(merchant).cloned().unwrap_or_default()
    }

    fn total(&self, table: Table) -> usize {
        let tables = self.tables.lock().unwrap();
        tables[table as usize]
            .by_merchant
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Charges made so far, across merchants (the tests count with it).
    #[allow(dead_code)]
    pub fn charges_total(&self) -> usize {
        self.total(Table::Charges)
    }

    /// Orders written so far, across merchants (the tests count with it).
    #[allow(dead_code)]
    pub fn orders_total(&self) -> usize {
        self.total(Table::Orders)
    }
}
