//! The reports demo's keys and budgets over loopback HTTP, against every job
//! store: what is one job and what is two; completed and live jobs count
//! against the allowance, failed ones don't, joining is free, the operator
//! reset makes room, concurrent starts cannot overshoot. The harness is
//! `reports/mod.rs`.

use crate::reports;
use std::num::NonZeroU64;

use reports::*;
use serde_json::json;
use tower_idempotency::lease::store::Budget;

for_each_store! {
    #[tokio::test] unknown_report_type_and_malformed_period_are_400,
    #[tokio::test] august_and_september_are_two_jobs,
    #[tokio::test] two_tenants_with_the_same_report_and_period_are_two_jobs,
    #[tokio::test] budget_counts_live_and_complete_jobs_not_failed_ones_and_reset_makes_room,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] concurrent_starts_cannot_overshoot_the_allowance,
    #[tokio::test] a_token_cap_reserves_each_reports_estimate_and_429_says_when_it_resets,
    #[tokio::test] a_failed_providers_job_returns_its_tokens,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] concurrent_weighted_starts_cannot_overshoot_the_cap,
    #[tokio::test] an_expired_job_is_not_acquired_past_the_allowance,
}

/// `REPORT_ALLOWANCE=1`: January's job expires unswept and stops counting,
/// so February's is admitted; a worker then asking for January is refused
/// while February holds the month's one job, and only one report completes.
async fn an_expired_job_is_not_acquired_past_the_allowance(backend: Backend) {
    let opts = Opts {
        lease: SHORT_LEASE,
        budget: Some(Budget::per_month(NonZeroU64::new(1).unwrap())),
        ..Opts::default()
    };
    let app = demo_with(&backend, opts).await;
    let tenant = "acme";
    let jan = app.start_id(tenant, &health("2026-01"), 200).await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let feb = app.start_id(tenant, &health("2026-02"), 200).await;
    let feb_token = app.acquire_token(tenant, &feb, "w-feb").await;
    let revived = app.acquire(tenant, &jan, "w-jan").await;
    // February's lease is only extended by its heartbeats: live now, it was
    // live when January was asked for.
    let feb_live = app
        .worker(tenant, &feb, "heartbeat", "w-feb", feb_token, "")
        .await;
    if feb_live.status == 200 {
        assert_eq!(revived.status, 409, "{}", text(&revived));
        assert_eq!(revived.code(), "not_available");
    }
    let mut completed = Vec::new();
    if revived.status == 200 {
        let token = revived.json()["token"].as_i64().unwrap();
        let done = app
            .worker(tenant, &jan, "finalize", "w-jan", token, "jan")
            .await;
        if done.status == 200 {
            completed.push("2026-01");
        }
    }
    let done = app
        .worker(tenant, &feb, "finalize", "w-feb", feb_token, "feb")
        .await;
    if done.status == 200 {
        completed.push("2026-02");
    }
    assert!(
        completed.len() <= 1,
        "an allowance of 1 completed {completed:?}"
    );
}

/// `REPORT_TOKEN_CAP=2000`: a health report reserves 1200 tokens, a usage
/// summary 800; a start that would go past the cap is `429` with when the
/// day resets.
async fn a_token_cap_reserves_each_reports_estimate_and_429_says_when_it_resets(backend: Backend) {
    let opts = Opts {
        token_cap: Some(2000),
        ..Opts::default()
    };
    let app = demo_with(&backend, opts).await;
    let tenant = "acme";
    app.start_id(tenant, &health("2026-08"), 200).await;
    app.start_id(tenant, &report("usage_summary", "2026-08"), 200)
        .await;
    // Joining is free, even at the cap.
    assert_eq!(app.start(tenant, &health("2026-08")).await.status, 200);
    let refused = app.start(tenant, &report("usage_summary", "2026-09")).await;
    assert_eq!(refused.status, 429, "{}", text(&refused));
    assert_eq!(refused.code(), "budget_exhausted");
    let body = refused.json();
    let retry_after: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry_after), "{retry_after}");
    assert_eq!(body["retry_after"].as_u64(), Some(retry_after));
    let resets_at = body["resets_at"].as_str().unwrap();
    assert!(
        resets_at.ends_with("T00:00:00Z") && resets_at.len() == 20,
        "{resets_at}"
    );
    assert_eq!(body["retry"], "tomorrow", "a daily envelope: {body}");
    // The keyed job-row route refuses the same way, with a key: `429
    // budget_exhausted`, come back tomorrow; nothing is recorded for the key.
    let keyed = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "over-the-cap-0001"),
    ];
    let over = app
        .client
        .post_json("/reports", &keyed, &report("usage_summary", "2026-10"))
        .await;
    assert_eq!(over.status, 429, "{}", text(&over));
    assert_eq!(
        (over.json()["code"].as_str(), over.json()["retry"].as_str()),
        (Some("budget_exhausted"), Some("tomorrow"))
    );
    // Another tenant has its own envelope.
    app.start_id("globex", &health("2026-09"), 200).await;
}

/// `REPORT_PROVIDER_FAIL=5xx`: the job fails `provider_5xx` and its tokens
/// return, so the tenant can start another report within the cap.
async fn a_failed_providers_job_returns_its_tokens(backend: Backend) {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let opts = Opts {
        token_cap: Some(1500),
        worker: app::Worker::BuiltIn {
            chunk_delay: std::time::Duration::from_millis(20),
        },
        provider_failure: Some(app::ProviderFailure::Status5xx),
        // The provider answers only once the second start was refused, so the
        // refusal never races the failure.
        provider_gate: Some(gate.clone()),
        ..Opts::default()
    };
    let app = demo_with(&backend, opts).await;
    let tenant = "acme";
    let job = app.start_id(tenant, &health("2026-08"), 200).await;
    // While it runs, its 1200 tokens are reserved: no room for a second.
    assert_eq!(app.start(tenant, &health("2026-09")).await.status, 429);
    gate.add_permits(1);
    let failed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let job = app.job(tenant, &job).await;
            if job["status"] == "failed" {
                return job;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the job fails");
    assert_eq!(failed["error_code"], "provider_5xx");
    app.start_id(tenant, &health("2026-09"), 200).await;
}

/// Twenty concurrent starts of 800 tokens under a cap of 4000: exactly five
/// are accepted, whatever the interleaving (one decision per start).
async fn concurrent_weighted_starts_cannot_overshoot_the_cap(backend: Backend) {
    let opts = Opts {
        token_cap: Some(4000),
        ..Opts::default()
    };
    let app = demo_with(&backend, opts).await;
    let tenant = "acme";
    let bodies = (1..=12)
        .flat_map(|month| {
            ["2025", "2024"].map(|year| report("usage_summary", &format!("{year}-{month:02}")))
        })
        .take(20)
        .collect();
    let replies = app.start_all(tenant, bodies).await;
    let accepted = replies.iter().filter(|r| started(r)).count();
    let refused = replies.iter().filter(|r| r.status == 429).count();
    assert_eq!((accepted, refused), (5, 15));
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
    assert!(started(
        &app.start("acme", &report("usage_summary", "2026-08")).await
    ));
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
    let august = app.start_id("acme", &health("2026-08"), 200).await;
    let september = app.start_id("acme", &health("2026-09"), 200).await;
    assert_ne!(august, september);
    let usage = app
        .start_id("acme", &report("usage_summary", "2026-08"), 200)
        .await;
    assert_ne!(usage, august, "another report type is another job");
    assert_eq!(app.created(), 3);
}

async fn two_tenants_with_the_same_report_and_period_are_two_jobs(backend: Backend) {
    let app = demo(&backend).await;
    let acme = app.start_id("acme", &health("2026-08"), 200).await;
    let globex = app.start_id("globex", &health("2026-08"), 200).await;
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
            budget: Some(Budget::per_month(NonZeroU64::new(2).unwrap())),
            ..Opts::default()
        },
    )
    .await;
    let jan = app.start_id("acme", &health("2026-01"), 200).await;
    let feb = app.start_id("acme", &health("2026-02"), 200).await;
    let over = app.start("acme", &health("2026-03")).await;
    assert_eq!(over.status, 429, "{}", text(&over));
    assert_eq!(over.code(), "budget_exhausted");
    assert_eq!(over.json()["retry"], "next_month");
    // Joining is free.
    let join = app.start("acme", &health("2026-02")).await;
    assert_eq!(join.status, 200);
    assert_eq!(join.json()["join"], true);
    // Budgets are per tenant.
    app.start_id("globex", &health("2026-03"), 200).await;

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
    let mar = app.start_id("acme", &health("2026-03"), 200).await;
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
    app.start_id("acme", &health("2026-04"), 200).await;
    app.start_id("acme", &health("2026-05"), 200).await;
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
            budget: Some(Budget::per_month(NonZeroU64::new(2).unwrap())),
            ..Opts::default()
        },
    )
    .await;
    let bodies = (1..=12).map(|m| health(&format!("2025-{m:02}"))).collect();
    let replies = app.start_all("acme", bodies).await;
    let accepted = replies.iter().filter(|r| started(r)).count();
    let refused = replies
        .iter()
        .filter(|r| r.status == 429 && r.code() == "budget_exhausted")
        .count();
    assert_eq!((accepted, refused), (2, 10));
}
