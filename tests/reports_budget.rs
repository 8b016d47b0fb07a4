//! The reports demo's keys and budgets over loopback HTTP, against every job
//! store: what is one job and what is two; completed and live jobs count
//! against the allowance, failed ones don't, joining is free, the operator
//! reset makes room, concurrent starts cannot overshoot. The harness is
//! `tests/reports/mod.rs`.

#[macro_use]
mod reports;

use reports::*;
use serde_json::json;
use tower_idempotency::store::jobs::Budget;

for_each_store! {
    #[tokio::test] unknown_report_type_and_malformed_period_are_400,
    #[tokio::test] august_and_september_are_two_jobs,
    #[tokio::test] two_tenants_with_the_same_report_and_period_are_two_jobs,
    #[tokio::test] budget_counts_live_and_complete_jobs_not_failed_ones_and_reset_makes_room,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] concurrent_starts_cannot_overshoot_the_allowance,
}

// Keys: what is one job and what is two.

async fn unknown_report_type_and_malformed_period_are_400(backend: Backend) {
    let app = demo(&backend).await;
    let reply = app.start("acme", &report("weather", "2026-08")).await;
    assert_eq!(reply.status, 400, "{}", text(&reply));
    assert_eq!(reply.code(), "unknown_report_type");
    for period in [
        "2026-8",
        "2026-13",
        "2026-00",
        "26-08",
        "2026/08",
        "2026-08-01",
    ] {
        let reply = app.start("acme", &health(period)).await;
        assert_eq!(reply.status, 400, "{period}: {}", text(&reply));
        assert_eq!(reply.code(), "invalid_period", "{period}");
    }
    let missing = app
        .start("acme", r#"{"report_type":"customer_health"}"#)
        .await;
    assert_eq!(missing.status, 400);
    assert_eq!(missing.code(), "invalid_job_key");
    let not_json = app.start("acme", "report please").await;
    assert_eq!(not_json.status, 400);
    assert_eq!(app.starts(), 0, "refused before the store is touched");
    // The other known type works.
    assert_eq!(
        app.start("acme", &report("usage_summary", "2026-08"))
            .await
            .status,
        202
    );
    // No session: 401 before anything else.
    let anonymous = app.client.post_json(START, &[], &health("2026-08")).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.code(), "unauthorized");
    let bad_token = app
        .client
        .post_json(
            START,
            &[("authorization", "Bearer a b")],
            &health("2026-08"),
        )
        .await;
    assert_eq!(bad_token.status, 401);
}

async fn august_and_september_are_two_jobs(backend: Backend) {
    let app = demo(&backend).await;
    let august = app.start_id("acme", &health("2026-08"), 202).await;
    let september = app.start_id("acme", &health("2026-09"), 202).await;
    assert_ne!(august, september);
    let usage = app
        .start_id("acme", &report("usage_summary", "2026-08"), 202)
        .await;
    assert_ne!(usage, august, "another report type is another job");
    assert_eq!(app.created(), 3);
}

async fn two_tenants_with_the_same_report_and_period_are_two_jobs(backend: Backend) {
    let app = demo(&backend).await;
    let acme = app.start_id("acme", &health("2026-08"), 202).await;
    let globex = app.start_id("globex", &health("2026-08"), 202).await;
    assert_ne!(acme, globex);
    assert_eq!(app.job("acme", &acme).await["job_id"], acme.as_str());
    assert_eq!(
        app.get("acme", &format!("/reports/{globex}")).await.status,
        404
    );
}

// Budgets.

async fn budget_counts_live_and_complete_jobs_not_failed_ones_and_reset_makes_room(
    backend: Backend,
) {
    let app = demo_with(
        &backend,
        Opts {
            budget: Some(Budget::per_month(2)),
            ..Opts::default()
        },
    )
    .await;
    let jan = app.start_id("acme", &health("2026-01"), 202).await;
    let feb = app.start_id("acme", &health("2026-02"), 202).await;
    let over = app.start("acme", &health("2026-03")).await;
    assert_eq!(over.status, 429, "{}", text(&over));
    assert_eq!(over.code(), "budget_exhausted");
    // Joining is free.
    let join = app.start("acme", &health("2026-02")).await;
    assert_eq!(join.status, 200);
    assert_eq!(join.json()["join"], true);
    // Budgets are per tenant.
    app.start_id("globex", &health("2026-03"), 202).await;

    // A failed job gives its place back.
    let token = app.acquire_token("acme", &jan, "w1").await;
    let failed = app
        .worker(
            "acme",
            &jan,
            "fail",
            "w1",
            token,
            r#"{"code":"model_error"}"#,
        )
        .await;
    assert_eq!(failed.status, 200, "{}", text(&failed));
    assert_eq!(failed.json()["status"], "failed");
    let job = app.job("acme", &jan).await;
    assert_eq!(job["error_code"], "model_error");
    let mar = app.start_id("acme", &health("2026-03"), 202).await;
    assert_eq!(app.start("acme", &health("2026-04")).await.status, 429);

    // A completed job keeps counting.
    let token = app.acquire_token("acme", &feb, "w1").await;
    let done = app
        .worker("acme", &feb, "finalize", "w1", token, "feb")
        .await;
    assert_eq!(done.status, 200);
    assert_eq!(app.start("acme", &health("2026-04")).await.status, 429);
    // Asking for the completed report again is free.
    assert_eq!(app.start("acme", &health("2026-02")).await.status, 200);

    // The operator reset: admin token only.
    let reset = json!({ "tenant": "acme" }).to_string();
    let anonymous = app
        .client
        .post_json("/admin/budget/reset", &[], &reset)
        .await;
    assert_eq!(anonymous.status, 401);
    let tenant = app
        .client
        .post_json(
            "/admin/budget/reset",
            &[("authorization", "Bearer acme")],
            &reset,
        )
        .await;
    assert_eq!(tenant.status, 403);
    assert_eq!(tenant.code(), "forbidden");
    let admin = app
        .client
        .post_json(
            "/admin/budget/reset",
            &[("authorization", "Bearer admin")],
            &reset,
        )
        .await;
    assert_eq!(admin.status, 200, "{}", text(&admin));
    assert_eq!(admin.json()["tenant"], "acme");
    assert_eq!(
        admin.json()["reset"],
        3,
        "january (failed), february, march"
    );
    app.start_id("acme", &health("2026-04"), 202).await;
    app.start_id("acme", &health("2026-05"), 202).await;
    assert_eq!(app.start("acme", &health("2026-06")).await.status, 429);
    // Nothing was deleted: the reset jobs still read and join as before.
    assert_eq!(app.job("acme", &mar).await["status"], "queued");
    assert_eq!(
        app.start("acme", &health("2026-03")).await.json()["join"],
        true
    );
}

async fn concurrent_starts_cannot_overshoot_the_allowance(backend: Backend) {
    let app = demo_with(
        &backend,
        Opts {
            budget: Some(Budget::per_month(2)),
            ..Opts::default()
        },
    )
    .await;
    let bodies = (1..=12).map(|m| health(&format!("2025-{m:02}"))).collect();
    let replies = app.start_all("acme", bodies).await;
    let accepted = replies.iter().filter(|r| r.status == 202).count();
    let refused = replies
        .iter()
        .filter(|r| r.status == 429 && r.code() == "budget_exhausted")
        .count();
    assert_eq!((accepted, refused), (2, 10));
}
