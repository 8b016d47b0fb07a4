//! The operator side: `POST /admin/budget/reset`.

use super::answers::{error, invalid_body, store_unavailable, Answer};
use super::auth::{bearer, is_tenant_token};
use super::AppState;
use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use tower_idempotency::lease::store::{BudgetPeriod, JobMaintenance};

#[derive(Deserialize)]
pub(super) struct ResetBody {
    tenant: String,
}

/// Gives `tenant` its allowance for the current month back: its jobs so far
/// this month stop counting. Nothing is deleted.
pub(super) async fn reset_budget(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<ResetBody>, JsonRejection>,
) -> Answer {
    let token = bearer(&headers).ok_or_else(|| {
        error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send Authorization: Bearer <admin token>",
        )
    })?;
    if !constant_time_eq(token.as_bytes(), state.admin_token.as_bytes()) {
        return Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this endpoint needs the admin token",
        ));
    }
    let tenant = body
        .ok()
        .map(|Json(body)| body.tenant)
        .filter(|tenant| is_tenant_token(tenant))
        .ok_or_else(|| invalid_body("{\"tenant\": <tenant id>}"))?;
    let reset = state
        .store
        .reset_budget(&tenant, BudgetPeriod::Month)
        .await
        .map_err(store_unavailable)?;
    Ok(Json(json!({ "tenant": tenant, "period": "month", "reset": reset })).into_response())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
