//! A queue consumer that writes each effect once, although its queue
//! delivers messages at least once: duplicates, redeliveries with their
//! fields in another order, and, after a crash, everything again.
//!
//! ```sh
//! cargo run --example consumer
//! # with PostgreSQL, the effect and its record commit together:
//! DATABASE_URL=postgres://postgres@127.0.0.1/postgres cargo run --example consumer --features postgres
//! ```
//!
//! The queue is in the process: `CONSUMER_MESSAGES` messages (default 20),
//! delivered in a shuffled order, a third of them twice, the second copy with
//! its JSON fields reordered. A restarted consumer gets every message again,
//! as a broker redelivers unacknowledged ones. Each message runs through
//! [`Engine::run_bytes`] under its id; the effect is a ledger entry: in memory,
//! or with `DATABASE_URL` (feature `postgres`) a row of `consumer_effects`
//! written inside the engine's transaction, so a consumer killed anywhere
//! leaves either the effect and its record, or neither.
//!
//! `CONSUMER_TABLES` (default `consumer`) names the PostgreSQL tables
//! `<name>_records` and `<name>_effects`.
//!
//! `CONSUMER_SLOW_MS` (default 0) pauses after each effect is written and
//! before it commits: the moment a crash test kills the process.
//!
//! `PROCESSOR_URL` (where `cargo run --example processor` listens) makes each
//! message charge its amount at that card processor before its effect is
//! written, under the run's downstream key as the processor's
//! `Idempotency-Key`: a message redelivered after a crash between the charge
//! and the record runs again and sends the same key, and the processor
//! answers with the first charge. That holds even on the memory store, whose
//! records a restart forgets: the key is derived from the scope and the
//! message's key alone.
//!
//! `CONSUMER_PHASED=1` (with `DATABASE_URL`) runs each message in recovery
//! points instead of one transaction (`Engine::phased`): the charge is a
//! foreign phase, under its own downstream key (`phase:charge`), and the
//! effect a local phase, its row and its recovery point committed together.
//! A message redelivered after a crash resumes after its last recorded
//! phase: a charge recorded before the crash is not sent again. It prints
//! `charge recorded for message N` and pauses `CONSUMER_SLOW_MS` once the
//! charge phase is recorded, the second moment a crash test kills it; a
//! message whose crashed run still holds its key is delivered again later,
//! as a broker redelivers an unacknowledged message. With `REDIS_URL` too
//! (feature `redis`) the records and recovery points are in Redis and each
//! effect a plain phase, its row (`<name>_keyed_effects`) committed first
//! under its message's id; `CONSUMER_TABLES` is then the Redis keys' prefix
//! too.
//!
//! Prints `charged message N` (`charged message N: replayed by the
//! processor` for a charge made before) and `effect written for message N`
//! as it goes, and at the end `messages M, deliveries D, effects E`.

#[allow(dead_code)] // the checkout demo's client: only charges are used here
#[path = "checkout/payments.rs"]
mod payments;

use bytes::Bytes;
use payments::Processor;
use std::time::Duration;
use tower_idempotency::engine::{Engine, Identity, Outcome, RunContext};
use tower_idempotency::{IdempotencyKey, MemoryStore, Scope};

/// One delivery: the message id and its body as the broker sent it.
struct Delivery {
    id: u64,
    body: String,
}

/// At-least-once delivery of `n` messages: shuffled, a third delivered twice
/// (the copy with its fields reordered).
fn deliveries(n: u64) -> Vec<Delivery> {
    let mut out = Vec::new();
    for id in 1..=n {
        let amount = 100 * id;
        out.push(Delivery {
            id,
            body: format!(
                r#"{{"id":{id},"account":"acct-{}","amount":{amount}}}"#,
                id % 3
            ),
        });
        if id % 3 == 0 {
            out.push(Delivery {
                id,
                body: format!(
                    r#"{{ "amount": {amount}, "id": {id}, "account": "acct-{}" }}"#,
                    id % 3
                ),
            });
        }
    }
    // A fixed shuffle, so every run (and every restart) sees the same order.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..out.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.swap(i, (state % (i as u64 + 1)) as usize);
    }
    out
}

/// Where effects go.
#[derive(Clone)]
enum Ledger {
    Memory(std::sync::Arc<std::sync::Mutex<Vec<u64>>>),
    /// The pool, and the effects table's name.
    #[cfg(feature = "postgres")]
    Postgres(deadpool_postgres::Pool, String),
    /// The same, each effect committed on its own under its message's id
    /// (records in Redis: no transaction holds both).
    #[cfg(feature = "postgres")]
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Keyed(deadpool_postgres::Pool, String),
}

impl Ledger {
    /// Writes the effect of message `id`: inside the engine's transaction on
    /// PostgreSQL.
    async fn write(&self, context: &RunContext, id: u64, amount: i64) -> Result<(), String> {
        let _ = (context, amount);
        match self {
            Self::Memory(effects) => effects.lock().unwrap().push(id),
            #[cfg(feature = "postgres")]
            Self::Postgres(_, table) => {
                let tx = context
                    .get::<tower_idempotency::PostgresTransaction>()
                    .ok_or("no transaction")?;
                let client = tx.client().await.map_err(|e| e.to_string())?;
                client
                    .execute(
                        &format!("INSERT INTO {table} (message_id, amount) VALUES ($1, $2)"),
                        &[&(id as i64), &amount],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            #[cfg(feature = "postgres")]
            Self::Keyed(..) => return Err("keyed effects are written in phases".into()),
        }
        Ok(())
    }

    /// Writes the effect of message `id` as the local phase `effect`: its
    /// row and its recovery point commit together (PostgreSQL only).
    #[cfg(feature = "postgres")]
    async fn write_phase(
        &self,
        phases: &tower_idempotency::engine::Phases,
        id: u64,
        amount: i64,
        slow: Duration,
    ) -> Result<(), String> {
        let table = match self {
            Self::Postgres(_, table) => table,
            Self::Keyed(pool, table) => return keyed(phases, pool, table, id, amount, slow).await,
            Self::Memory(_) => return Err("phases need PostgreSQL".into()),
        };
        let insert = format!("INSERT INTO {table} (message_id, amount) VALUES ($1, $2)");
        let written = phases.local("effect", |client| async move {
            let inserted = client.execute(&insert, &[&(id as i64), &amount]).await;
            inserted.map_err(|e| e.to_string())?;
            println!("effect written for message {id}");
            tokio::time::sleep(slow).await;
            Ok::<_, String>(())
        });
        written.await.map_err(|e| e.to_string())
    }

    async fn effects(&self) -> Result<u64, String> {
        match self {
            Self::Memory(effects) => Ok(effects.lock().unwrap().len() as u64),
            #[cfg(feature = "postgres")]
            Self::Postgres(pool, table) | Self::Keyed(pool, table) => {
                let client = pool.get().await.map_err(|e| e.to_string())?;
                let row = client
                    .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(row.get::<_, i64>(0) as u64)
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str, default: u64| -> Result<u64, String> {
        std::env::var(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name} must be a number"))
        })
    };
    let messages = env("CONSUMER_MESSAGES", 20)?;
    let slow = Duration::from_millis(env("CONSUMER_SLOW_MS", 0)?);
    let processor = std::env::var("PROCESSOR_URL")
        .ok()
        .map(|url| Processor::new(&url));
    let (engine, ledger, store) = from_env().await?;
    println!("idempotency store: {store}");
    let scope = Scope::new("consumer");
    let mut queue = deliveries(messages);
    let delivered = queue.len();
    let mut redelivered = Vec::new();
    while !queue.is_empty() {
        for delivery in std::mem::take(&mut queue) {
            let key = IdempotencyKey::parse(format!("message-{:06}", delivery.id).as_bytes())
                .ok_or("a valid key")?;
            let id = delivery.id;
            let body: serde_json::Value = serde_json::from_str(&delivery.body)?;
            let amount = body["amount"].as_i64().ok_or("an amount")?;
            let account = body["account"].as_str().ok_or("an account")?.to_owned();
            let (ledger, processor) = (ledger.clone(), processor.clone());
            let operation = move |context: RunContext| async move {
                if let Some(phases) = context.phases() {
                    return phased(&phases, &ledger, processor, id, &account, amount, slow).await;
                }
                if let Some(processor) = processor {
                    // The same key on every run of this message, whichever store.
                    let key = context.downstream_keys().key_for(payments::CARD_PROCESSOR);
                    charge(&processor, &key, id, &account, amount).await?;
                }
                ledger.write(&context, id, amount).await?;
                println!("effect written for message {id}");
                tokio::time::sleep(slow).await;
                Ok::<_, String>(Bytes::from(format!("effect of message {id}")))
            };
            let identity = Identity::Json(delivery.body.as_bytes());
            match engine.run_bytes(&scope, &key, identity, operation).await {
                Ok(Outcome::Executed(_)) => {}
                // A crashed run still holds the key: delivered again later.
                Ok(Outcome::InProgress) => {
                    println!("message {id} in progress elsewhere: delivered again later");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    redelivered.push(delivery);
                }
                Ok(Outcome::Replayed(_)) => println!("message {id} delivered again: not run again"),
                Ok(other) => return Err(format!("message {id}: {other:?}").into()),
                Err(error) => return Err(format!("message {id}: {error}").into()),
            }
        }
        queue = std::mem::take(&mut redelivered);
    }
    let effects = ledger.effects().await?;
    println!("messages {messages}, deliveries {delivered}, effects {effects}");
    Ok(())
}

/// The effect of message `id` as the plain phase `effect` (records in
/// Redis): its row commits first, keyed by the message's id, so a run of the
/// phase again after a crash before its record writes no second row (it
/// counts the write in `writes`).
#[cfg(feature = "postgres")]
async fn keyed(
    phases: &tower_idempotency::engine::Phases,
    pool: &deadpool_postgres::Pool,
    table: &str,
    id: u64,
    amount: i64,
    slow: Duration,
) -> Result<(), String> {
    let insert = format!(
        "INSERT INTO {table} (message_id, amount) VALUES ($1, $2) \
         ON CONFLICT (message_id) DO UPDATE SET writes = {table}.writes + 1"
    );
    let written = phases.run("effect", || async {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        let inserted = client.execute(&insert, &[&(id as i64), &amount]).await;
        inserted.map_err(|e| e.to_string())?;
        println!("effect written for message {id}");
        tokio::time::sleep(slow).await;
        Ok::<_, String>(())
    });
    written.await.map_err(|e| e.to_string())
}

/// Charges message `id` at the processor under `key`, saying whether the
/// processor made the charge now or replayed the one it made before.
async fn charge(
    processor: &Processor,
    key: &tower_idempotency::downstream::DownstreamKey,
    id: u64,
    account: &str,
    amount: i64,
) -> Result<String, String> {
    let description = format!("message {id}");
    let charged = processor
        .charge_once(key, account, amount as u64, &description)
        .await
        .map_err(|e| format!("the processor: {e:?}"))?;
    match charged.replayed {
        true => println!("charged message {id}: replayed by the processor"),
        false => println!("charged message {id}"),
    }
    Ok(charged.id)
}

/// Message `id` in recovery points: the charge (foreign), then the effect
/// (local); each recorded phase is skipped when the message comes again.
async fn phased(
    phases: &tower_idempotency::engine::Phases,
    ledger: &Ledger,
    processor: Option<Processor>,
    id: u64,
    account: &str,
    amount: i64,
    slow: Duration,
) -> Result<Bytes, String> {
    if let Some(processor) = processor {
        let charged = phases.foreign("charge", |key| async move {
            charge(&processor, &key, id, account, amount).await
        });
        let charge: String = charged.await.map_err(|e| e.to_string())?;
        println!("charge recorded for message {id}: {charge}");
        tokio::time::sleep(slow).await;
    }
    #[cfg(feature = "postgres")]
    ledger.write_phase(phases, id, amount, slow).await?;
    #[cfg(not(feature = "postgres"))]
    let _ = (ledger, amount, slow);
    Ok(Bytes::from(format!("effect of message {id}")))
}

/// PostgreSQL when built with `--features postgres` and `DATABASE_URL` is set
/// (effects and records in one transaction); memory otherwise.
async fn from_env() -> Result<(Engine, Ledger, &'static str), Box<dyn std::error::Error>> {
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("DATABASE_URL") {
        use deadpool_postgres::{Manager, Pool, Runtime};
        let tables = std::env::var("CONSUMER_TABLES").unwrap_or_else(|_| "consumer".into());
        let valid = !tables.is_empty()
            && tables.len() <= 40
            && tables
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return Err("CONSUMER_TABLES must be up to 40 of [a-z0-9_]".into());
        }
        let effects = format!("{tables}_effects");
        let mut config: tokio_postgres::Config = url.parse()?;
        config.connect_timeout(Duration::from_secs(3));
        let pool = Pool::builder(Manager::new(config.clone(), tokio_postgres::NoTls))
            .max_size(4)
            .runtime(Runtime::Tokio1)
            .build()?;
        let store = tower_idempotency::PostgresStore::builder(pool.clone())
            .with_table(format!("{tables}_records").parse()?)
            .with_lock_timeout(Duration::from_secs(2))
            .with_listener(config)
            .build();
        store.migrate().await?;
        pool.get()
            .await?
            .batch_execute(&format!(
                // No unique constraint: an effect written twice would show as two rows.
                "CREATE TABLE IF NOT EXISTS {effects} (
                     message_id bigint NOT NULL,
                     amount bigint NOT NULL,
                     at timestamptz NOT NULL DEFAULT now()
                 )"
            ))
            .await?;
        let phased = std::env::var("CONSUMER_PHASED").as_deref() == Ok("1");
        #[cfg(feature = "redis")]
        if let (true, Ok(redis)) = (phased, std::env::var("REDIS_URL")) {
            let keyed = format!("{tables}_keyed_effects");
            pool.get()
                .await?
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {keyed} (
                         message_id bigint PRIMARY KEY,
                         amount bigint NOT NULL,
                         writes integer NOT NULL DEFAULT 1
                     )"
                ))
                .await?;
            // The tables' name keeps this consumer's keys apart, as its tables.
            let store = tower_idempotency::RedisStore::builder()
                .with_prefix(tables.parse()?)
                .with_lock_timeout(Duration::from_secs(2))
                .connect(&redis)
                .await?;
            let ledger = Ledger::Keyed(pool, keyed);
            return Ok((Engine::phased(store), ledger, "redis, phased"));
        }
        let ledger = Ledger::Postgres(pool, effects);
        if phased {
            return Ok((Engine::phased(store), ledger, "postgres, phased"));
        }
        return Ok((Engine::transactional(store), ledger, "postgres"));
    }
    let engine = Engine::new(MemoryStore::new());
    Ok((engine, Ledger::Memory(Default::default()), "memory"))
}
