//! The checkout in recovery points: `POST /v1/phased-orders`, behind a layer
//! built with `IdempotencyLayer::phased`, runs the order as three phases,
//! each recorded when it finishes, so that a retry after a crash resumes
//! after the last finished one instead of running the handler again:
//!
//! 1. `order`: writes the order, pending (a local phase);
//! 2. `charge`: charges the customer (a foreign phase: the processor gets
//!    the phase's own downstream key, so a repeat of the call, its output
//!    lost in a crash, is a replay there);
//! 3. `paid`: marks the order paid and enqueues its receipt email (local).
//!
//! On the PostgreSQL store a local phase's writes and its recovery point
//! commit in one transaction (`Phases::local`), so the writes need no key of
//! their own: a second run of the phase is impossible, and would fail the
//! unique index rather than write twice. With records in Redis and rows in
//! PostgreSQL (`Phases::run`), the writes commit before their recovery point:
//! a crash between the two runs the phase again, and each row's downstream
//! key makes the second write return the first row (counted in `writes`).
//!
//! `GET /v1/phased-orders` lists the orders with their status, `GET
//! /v1/emails` the receipt outbox. `CHECKOUT_PAUSE_MS` adds checkpoints
//! inside and between the phases (`before-order`, `order-written`, `ordered`,
//! `charge-sent`, `charged`, `paid-written`, `paid`), where the crash tests
//! kill the process.

use super::ledger::Ledger;
use super::{checkpoint, error, validate, AppState, UNIT_PRICE};
use axum::extract::{Extension, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;
use tower_idempotency::engine::{PhaseError, Phases};
use tower_idempotency::Scope;

pub(super) async fn create_phased_order(
    State(state): State<AppState>,
    request: Request,
) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    let (Some(merchant), Some(phases)) = (
        parts.extensions.get::<Scope>().cloned(),
        parts.extensions.get::<Phases>().cloned(),
    ) else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable").into_response();
    };
    let Ok(body) = axum::body::to_bytes(body, 64 * 1024).await else {
        return error(StatusCode::BAD_REQUEST, "invalid_body").into_response();
    };
    let Some((sku, qty)) = validate(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_body").into_response();
    };
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match phased_order(&state, &phases, merchant.as_str(), key, &sku, qty).await {
        Ok(order) => {
            let id = order["id"].as_str().unwrap_or_default();
            let location =
                HeaderValue::try_from(format!("/v1/phased-orders/{id}")).expect("ids are ASCII");
            (
                StatusCode::CREATED,
                [(header::LOCATION, location)],
                Json(order),
            )
                .into_response()
        }
        Err(failed) => failed.into_response(),
    }
}

/// Why the order stopped: the phase that failed and how.
enum Failed {
    Ledger(PhaseError<String>),
    Payment(PhaseError<String>),
}

impl IntoResponse for Failed {
    fn into_response(self) -> axum::response::Response {
        let (status, code) = match self {
            Self::Payment(PhaseError::Phase(_)) => (StatusCode::BAD_GATEWAY, "payment_failed"),
            Self::Ledger(PhaseError::Phase(_)) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "ledger_unavailable")
            }
            // Not recorded (or the claim was taken over): nothing is kept,
            // and the retry resumes after the last recorded phase.
            _ => (
                StatusCode::SERVICE_UNAVAILABLE,
                "recovery_point_unavailable",
            ),
        };
        error(status, code).into_response()
    }
}

async fn phased_order(
    state: &AppState,
    phases: &Phases,
    merchant: &str,
    key: &str,
    sku: &str,
    qty: u64,
) -> Result<serde_json::Value, Failed> {
    let (ledger, pause) = (&state.ledger, state.options.pause);
    checkpoint(pause, "before-order", key).await;
    let order: String = match ledger {
        Ledger::Memory(_) => {
            phases
                .run("order", || async {
                    let id = ledger.memory_pending_order(merchant, sku, qty);
                    checkpoint(pause, "order-written", key).await;
                    id.ok_or_else(|| "no memory ledger".to_owned())
                })
                .await
        }
        #[cfg(feature = "postgres")]
        Ledger::Postgres(pool) | Ledger::PostgresOwnCommits(pool) => {
            let order_key = phases.downstream_key("order");
            let insert = "INSERT INTO checkout_phased_orders (merchant, sku, qty, order_key) \
                          VALUES ($1, $2, $3, $4)";
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&merchant, &sku, &(qty as i32), &order_key.as_str()];
            let statements = Statements::new(insert, "checkout_phased_orders", "order_key", "ord_");
            postgres_phase(phases, pool, "order", &statements, &params, pause, key).await
        }
    }
    .map_err(Failed::Ledger)?;
    checkpoint(pause, "ordered", key).await;

    let processor = state.options.processor.as_ref();
    let charge: String = phases
        .foreign("charge", |charge_key| async move {
            let charged = match processor {
                Some(processor) => {
                    let description = format!("{qty} x {sku}");
                    let amount = qty * UNIT_PRICE;
                    let charged = processor.charge(&charge_key, merchant, amount, &description);
                    charged.await.map_err(|e| format!("{e:?}"))?
                }
                None => {
                    let writer = ledger.own_commits();
                    let charged = ledger.charge(&writer, charge_key.as_str(), merchant, sku, qty);
                    charged.await.map_err(|e| format!("{e:?}"))?
                }
            };
            checkpoint(pause, "charge-sent", key).await;
            Ok(charged)
        })
        .await
        .map_err(Failed::Payment)?;
    checkpoint(pause, "charged", key).await;

    let receipt: String = match ledger {
        Ledger::Memory(_) => {
            phases
                .run("paid", || async {
                    let id = ledger.memory_paid(merchant, &order, &charge);
                    checkpoint(pause, "paid-written", key).await;
                    id.ok_or_else(|| "no memory ledger".to_owned())
                })
                .await
        }
        #[cfg(feature = "postgres")]
        Ledger::Postgres(pool) | Ledger::PostgresOwnCommits(pool) => {
            let email_key = phases.downstream_key("receipt");
            let number: i64 = order.trim_start_matches("ord_").parse().unwrap_or(0);
            let insert = "WITH paid AS ( \
                              UPDATE checkout_phased_orders SET status = 'paid', charge = $2 \
                              WHERE id = $1 RETURNING merchant) \
                          INSERT INTO checkout_emails (merchant, order_id, kind, email_key) \
                          SELECT merchant, $3, 'receipt', $4 FROM paid";
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&number, &charge, &order, &email_key.as_str()];
            let statements = Statements::new(insert, "checkout_emails", "email_key", "em_");
            postgres_phase(phases, pool, "paid", &statements, &params, pause, key).await
        }
    }
    .map_err(Failed::Ledger)?;
    checkpoint(pause, "paid", key).await;
    Ok(json!({
        "id": order, "status": "paid", "charge": charge, "receipt": receipt,
        "sku": sku, "qty": qty, "currency": "USD",
    }))
}

/// A phase's one statement, as it runs in the phase's own transaction and as
/// it runs committed on its own (then keyed, a second write returning the
/// first row).
#[cfg(feature = "postgres")]
struct Statements {
    local: String,
    own_commit: String,
}

#[cfg(feature = "postgres")]
impl Statements {
    /// `insert` into `table`, answering the row's id as `prefix` and six
    /// digits; committed on its own, keyed by `key_column`, a second write
    /// counts itself and returns the first row.
    fn new(insert: &str, table: &str, key_column: &str, prefix: &str) -> Self {
        let id = format!("RETURNING '{prefix}' || lpad(id::text, 6, '0')");
        Self {
            local: format!("{insert} {id}"),
            own_commit: format!(
                "{insert} ON CONFLICT ({key_column}) DO UPDATE \
                 SET writes = {table}.writes + 1 {id}"
            ),
        }
    }
}

/// Runs phase `name` as a local phase (the PostgreSQL store: the write and
/// its recovery point commit together), else (records in Redis) as a plain
/// phase whose write commits first, keyed.
#[cfg(feature = "postgres")]
async fn postgres_phase(
    phases: &Phases,
    pool: &deadpool_postgres::Pool,
    name: &str,
    statements: &Statements,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    pause: std::time::Duration,
    key: &str,
) -> Result<String, PhaseError<String>> {
    let written = format!("{name}-written");
    let local = phases
        .local(name, |client| async move {
            let row = client.query_one(statements.local.as_str(), params).await;
            let id: String = row.map_err(|e| e.to_string())?.get(0);
            checkpoint(pause, &written, key).await;
            Ok(id)
        })
        .await;
    let Err(PhaseError::Unsupported) = local else {
        return local;
    };
    let written = format!("{name}-written");
    phases
        .run(name, || async move {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            let row = client
                .query_one(statements.own_commit.as_str(), params)
                .await;
            let id: String = row.map_err(|e| e.to_string())?.get(0);
            checkpoint(pause, &written, key).await;
            Ok(id)
        })
        .await
}

pub(super) async fn list_phased_orders(
    State(state): State<AppState>,
    Extension(merchant): Extension<Scope>,
) -> axum::response::Response {
    match state.ledger.phased_orders(merchant.as_str()).await {
        Ok(orders) => Json(json!({ "orders": orders })).into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable").into_response(),
    }
}

pub(super) async fn list_emails(
    State(state): State<AppState>,
    Extension(merchant): Extension<Scope>,
) -> axum::response::Response {
    match state.ledger.emails(merchant.as_str()).await {
        Ok(emails) => Json(json!({ "emails": emails })).into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "ledger_unavailable").into_response(),
    }
}
