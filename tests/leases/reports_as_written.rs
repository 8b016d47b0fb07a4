//! The start table's own test module, assertion for assertion, against the
//! reports demo running as users run it (a separate process with its built-in
//! worker, driven by a real HTTP client): a second start joins the first
//! one's job, both answered `200`; a body naming another tenant is `403` with
//! `detail: tenant_mismatch`; a finalize from a caller without the live lease
//! is `409` with `detail: not_owner`. In memory, and on PostgreSQL.
//!
//! Each check sends exactly what such a client sends: the session's bearer
//! token and the JSON body, nothing else (no worker headers on the finalize).

use crate::reports_binary::{start, Server};
use tower_idempotency_tests::http::{HttpClient, Reply};

const START: &str = "/reports/start";

/// The demo as `cargo run --example reports --features leases` starts it.
fn demo(env: &[(&str, &str)]) -> Server {
    let mut env = env.to_vec();
    env.push(("REPORT_WORKER", "on"));
    start(&env)
}

async fn post(client: &HttpClient, path: &str, tenant: &str, body: &str) -> Reply {
    let auth = format!("Bearer {tenant}");
    client
        .post_json(path, &[("authorization", &auth)], body)
        .await
}

async fn test_second_start_joins_same_job(client: &HttpClient) {
    let body = r#"{"report_type": "customer_health", "period": "2026-08"}"#;
    let a = post(client, START, "tenant_a", body).await;
    let b = post(client, START, "tenant_a", body).await;
    assert!(a.status == 200 && b.status == 200, "{a:?} {b:?}");
    assert_eq!(a.json()["job_id"], b.json()["job_id"]);
    assert_eq!(b.json().get("join"), Some(&serde_json::Value::Bool(true)));
}

async fn test_body_tenant_cannot_override_session(client: &HttpClient) {
    let body = r#"{"report_type": "customer_health", "period": "2026-08", "claimed_tenant_id": "tenant_a"}"#;
    let res = post(client, START, "tenant_b", body).await;
    assert_eq!(res.status, 403);
    assert_eq!(res.json()["detail"], "tenant_mismatch");
}

async fn test_foreign_finalize_is_409(client: &HttpClient) {
    let body = r#"{"report_type": "customer_health", "period": "2026-08"}"#;
    let start = post(client, START, "tenant_a", body).await;
    let job_id = start.json()["job_id"].as_str().unwrap().to_owned();
    let res = post(
        client,
        &format!("/reports/{job_id}/finalize"),
        "tenant_a",
        "",
    )
    .await;
    assert_eq!(res.status, 409);
    assert_eq!(res.json()["detail"], "not_owner");
}

/// The three checks in the module's order, against one running demo.
async fn run_the_module(server: &Server) {
    let client = HttpClient::new(server.addr);
    test_second_start_joins_same_job(&client).await;
    test_body_tenant_cannot_override_session(&client).await;
    test_foreign_finalize_is_409(&client).await;
}

#[tokio::test]
async fn the_start_tables_module_passes_against_the_demo_in_memory() {
    run_the_module(&demo(&[])).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn the_start_tables_module_passes_against_the_demo_on_postgres() {
    use tower_idempotency_tests::support;
    let Some(url) = support::pg::database_url("the start table's module on PostgreSQL") else {
        return;
    };
    let table = support::pg::unique_table("reports_as_written");
    let server = demo(&[
        ("DATABASE_URL", url.as_str()),
        ("REPORT_JOBS_TABLE", table.as_str()),
    ]);
    run_the_module(&server).await;
}
