//! Handlers that do what a real `POST /orders` does, to put the layer's cost
//! next to a handler's: `json` deserialises the order into typed structs and
//! answers with a serialised one (axum's `Json` extractor and response);
//! `insert` also writes the order to PostgreSQL in one statement.

use crate::Handler;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The order in [`crate::json_body`].
#[derive(Deserialize)]
pub struct Order {
    /// ISO currency code.
    pub currency: String,
    /// Customer id.
    pub customer: String,
    /// Order lines.
    pub items: Vec<Item>,
}

/// One order line.
#[derive(Deserialize)]
pub struct Item {
    /// Stock-keeping unit.
    pub sku: String,
    /// Quantity.
    pub qty: u32,
    /// Unit price.
    pub price: f64,
    /// Free text.
    pub note: String,
}

/// What the handlers answer.
#[derive(Serialize)]
pub struct Created {
    id: String,
    customer: String,
    lines: usize,
    total: f64,
}

/// What a realistic handler needs: the run counter, and a pool for `insert`.
pub struct Realistic {
    /// Counts the runs.
    pub handler: Arc<Handler>,
    /// `Some` for the `insert` handler.
    pub pool: Option<deadpool_postgres::Pool>,
}

/// The table `insert` writes to.
pub const ORDERS_TABLE: &str = "bench_orders";

/// Creates [`ORDERS_TABLE`] (empty).
pub async fn prepare_orders_table(pool: &deadpool_postgres::Pool) {
    let client = pool.get().await.expect("connection");
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (id bigserial PRIMARY KEY, customer text NOT NULL, currency text NOT NULL, lines int NOT NULL, total float8 NOT NULL, created_at timestamptz NOT NULL DEFAULT now()); TRUNCATE {ORDERS_TABLE}"
        ))
        .await
        .expect("orders table");
}

async fn create_order(
    State(state): State<Arc<Realistic>>,
    Json(order): Json<Order>,
) -> Result<(StatusCode, Json<Created>), StatusCode> {
    let n = state.handler.count_run();
    let total = order
        .items
        .iter()
        .map(|item| f64::from(item.qty) * item.price)
        .sum();
    let id = match &state.pool {
        None => format!("ord_{n:08}"),
        Some(pool) => {
            let client = pool
                .get()
                .await
                .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
            let statement = client
                .prepare_cached(&format!(
                    "INSERT INTO {ORDERS_TABLE} (customer, currency, lines, total) VALUES ($1, $2, $3, $4) RETURNING id"
                ))
                .await
                .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
            let row = client
                .query_one(
                    &statement,
                    &[
                        &order.customer,
                        &order.currency,
                        &(order.items.len() as i32),
                        &total,
                    ],
                )
                .await
                .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
            format!("ord_{:08}", row.get::<_, i64>(0))
        }
    };
    let created = Created {
        id,
        customer: order.customer,
        lines: order.items.len(),
        total,
    };
    Ok((StatusCode::CREATED, Json(created)))
}

/// The realistic handler on [`crate::ORDERS`], without a layer.
pub fn app(state: Arc<Realistic>) -> Router {
    Router::new()
        .route(crate::ORDERS, post(create_order))
        .with_state(state)
}
