//! `POST /reports/start`, behind the lease layer, and the built-in worker.

use super::answers::{invalid_body, Answer};
use super::{AppState, Worker};
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use std::time::Duration;
use tower_idempotency::Lease;
use tower_idempotency::Scope;

#[derive(Deserialize)]
struct StartBody {
    report_type: String,
    period: String,
}

/// Runs behind the lease layer, only for a start that created or stole the
/// job: it decides what starts the work. Any 2xx becomes the layer's `202`.
pub(super) async fn start_report(
    State(state): State<AppState>,
    Extension(tenant): Extension<Scope>,
    Extension(lease): Extension<Lease>,
    body: Bytes,
) -> Answer {
    // The key extractor already checked these fields; a refusal fails the job.
    let start: StartBody =
        serde_json::from_slice(&body).map_err(|_| invalid_body("{\"report_type\", \"period\"}"))?;
    match state.worker {
        Worker::Off => {}
        Worker::BuiltIn { chunk_delay } => {
            let (failure, gate) = (state.provider_failure, state.provider_gate.clone());
            lease.spawn_worker(move |lease| async move {
                if let Some(gate) = gate {
                    gate.acquire().await.map_err(|_| "provider_gone")?.forget();
                }
                if let Some(failure) = failure {
                    // The provider call: an error, or no answer before our timeout.
                    tokio::time::sleep(chunk_delay).await;
                    return Err(failure.code().to_owned());
                }
                simulated_model(lease, tenant, start.report_type, start.period, chunk_delay).await
            });
        }
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

/// A stand-in for a model: streams a few numbered chunks into the job's
/// cursor, then returns their concatenation as the artifact.
async fn simulated_model(
    lease: Lease,
    tenant: Scope,
    report_type: String,
    period: String,
    chunk_delay: Duration,
) -> Result<Bytes, String> {
    let title = report_type.replace('_', " ");
    let chunks = [
        format!("# {title} report: {} / {period}\n\n", tenant.as_str()),
        "## Summary\nUsage is steady; two seats went unused all month.\n\n".to_owned(),
        "## Signals\n- support tickets: 3 (down from 5)\n- logins: 412\n\n".to_owned(),
        "## Risks\nThe renewal owner changed; confirm the contact.\n\n".to_owned(),
        "## Next steps\nBook a check-in before the renewal date.\n".to_owned(),
    ];
    let mut text = String::new();
    for (seq, chunk) in chunks.iter().enumerate() {
        tokio::time::sleep(chunk_delay).await;
        lease
            .append(seq as u64, chunk.clone())
            .await
            .map_err(|e| e.code().to_owned())?;
        text.push_str(chunk);
    }
    Ok(text.into())
}
