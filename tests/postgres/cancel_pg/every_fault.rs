//! Every fault at every poll on PostgreSQL (tests/common/faults.rs): a
//! panic, then an error, at each poll of the handler, the response body and
//! every store call, on the plain and the transactional layer and the
//! engine; in transactional mode the effect is a row written through the
//! request's transaction, so a run that does not commit leaves none.

use super::{postgres, PgProbe, LOCK};
use std::sync::Arc;
use tower_idempotency::engine::Engine;
use tower_idempotency::PostgresTransaction;
use tower_idempotency_tests::faults::{
    at_every_poll, engine_run, engine_run_with, layer_run, transactional_run, Effect, Effects,
    EngineEffect, Faulty,
};

struct Rows<'a>(&'a PgProbe);

impl Effects for Rows<'_> {
    async fn count(&self, key: &str) -> usize {
        self.0.effects(key).await
    }

    async fn violations(&self) -> Vec<String> {
        use super::cases::Probe;
        self.0.violations().await
    }
}

/// The effect: `key`'s row, written through the request's transaction.
fn row_in_transaction(table: String) -> Effect {
    Arc::new(move |extensions, key| {
        let table = table.clone();
        Box::pin(async move {
            let tx = extensions.get::<PostgresTransaction>().unwrap().clone();
            let client = tx.client().await.unwrap();
            let sql = format!("INSERT INTO {table}_effects (key) VALUES ($1)");
            client.execute(&sql, &[&key]).await.unwrap();
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_layer_every_fault_at_every_poll() {
    let Some(h) = postgres().await else { return };
    for trickled in [false, true] {
        let what = format!("postgres plain layer (trickled {trickled})");
        at_every_poll(&what, |plan, what| {
            let store = h.store.clone();
            async move { layer_run(&what, store, plan, trickled, LOCK).await }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_layer_every_fault_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let effect = row_in_transaction(h.probe.table.clone());
    let rows = Rows(&h.probe);
    for trickled in [false, true] {
        let what = format!("postgres transactional layer (trickled {trickled})");
        at_every_poll(&what, |plan, what| {
            let (store, effect, rows) = (h.store.clone(), effect.clone(), &rows);
            async move { transactional_run(&what, store, plan, trickled, LOCK, effect, rows).await }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_every_fault_at_every_poll() {
    let Some(h) = postgres().await else { return };
    at_every_poll("postgres engine", |plan, what| {
        let store = h.store.clone();
        async move { engine_run(&what, store, plan, LOCK).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_engine_every_fault_at_every_poll() {
    let Some(h) = postgres().await else { return };
    let table = h.probe.table.clone();
    let effect: EngineEffect = Arc::new(move |context, key| {
        let tx: PostgresTransaction = context.get().unwrap();
        let table = table.clone();
        Box::pin(async move {
            let client = tx.client().await.unwrap();
            let sql = format!("INSERT INTO {table}_effects (key) VALUES ($1)");
            client.execute(&sql, &[&key]).await.unwrap();
        })
    });
    let rows = Rows(&h.probe);
    at_every_poll("postgres transactional engine", |plan, what| {
        let (store, effect, rows) = (h.store.clone(), effect.clone(), &rows);
        async move {
            let faulty = Engine::transactional(Faulty {
                inner: store.clone(),
                plan: plan.clone(),
            });
            let clean = Engine::transactional(store);
            engine_run_with(&what, faulty, clean, plan, LOCK, effect, rows).await
        }
    })
    .await;
}
