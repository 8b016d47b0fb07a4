//! The reports demo's budgets over loopback HTTP, against every job store:
//! completed and live jobs count, failed ones don't, joining is free, the
//! operator reset makes room, concurrent starts cannot overshoot. The harness
//! is `tests/reports/mod.rs`.

#[macro_use]
mod reports;

use reports::*;
use serde_json::json;
use tower_idempotency::store::jobs::Budget;

for_each_store! {
    #[tokio::test] budget_counts_live_and_complete_jobs_not_failed_ones_and_reset_makes_room,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] concurrent_starts_cannot_overshoot_the_allowance,
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
