//! The reports demo over a real loopback HTTP server, against every job
//! store: every row of the start decision table in `docs/leases.md` and its
//! six closing checks.
//! Readers (cursor, SSE, attempts) are in `reports_readers.rs`, the worker
//! side in `reports_workers.rs`, keys and budgets in `reports_budget.rs`, the
//! example as a process in `reports_binary.rs`; the harness is
//! `reports/mod.rs`.

use crate::reports;

use bytes::Bytes;
use reports::script::{run_script, Transport};
use reports::*;
use serde_json::{json, Value};
use std::time::Duration;
use tower_idempotency::lease::store::{
    AnyJobStore, Appended, ArtifactLookup, JobReader, JobStore, LeaseError, LeaseGrant, StartJob,
    StartOutcome,
};

for_each_store! {
    #[tokio::test] matrix_no_row_creates_the_job_200_created_with_location,
    #[tokio::test] matrix_live_lease_joins_the_same_job,
    #[tokio::test] matrix_complete_job_answers_its_artifact_id,
    #[tokio::test] matrix_expired_lease_is_stolen_same_job,
    #[tokio::test] matrix_body_naming_another_tenant_is_403_tenant_mismatch,
    #[tokio::test] matrix_heartbeat_from_another_worker_is_409_lease_lost,
    #[tokio::test] matrix_append_after_expiry_is_409_lease_lost,
    #[tokio::test] matrix_finalize_from_a_dead_owner_is_409_not_owner,
    #[tokio::test] matrix_other_tenants_artifact_is_403_tenant_mismatch,
    #[tokio::test] check_1_two_starts_with_one_key_return_one_job,
    #[tokio::test] check_2_a_live_lease_rejects_a_foreign_finalize_with_409,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] check_3_an_expired_lease_is_stolen_once_by_50_concurrent_starts,
    #[tokio::test] check_4_a_reconnect_reads_the_cursor_and_inserts_nothing,
    #[tokio::test] check_5_download_checks_the_session_tenant,
    #[tokio::test] check_6_the_http_path_behaves_as_the_in_process_one,
    #[tokio::test] keyed_start_twice_is_one_job_one_provider_call_and_one_answer,
    #[tokio::test] keyed_start_with_a_failing_provider_fails_the_job_and_returns_its_tokens,
}

/// `POST /reports` with an `Idempotency-Key` (the job-row flow): a duplicate
/// with the same key gets the same `202` byte for byte and starts nothing;
/// the client is answered at once and reads the job while the work runs.
async fn keyed_start_twice_is_one_job_one_provider_call_and_one_answer(backend: Backend) {
    let opts = Opts {
        worker: app::Worker::BuiltIn {
            chunk_delay: Duration::from_millis(100),
        },
        ..Opts::default()
    };
    let app = demo_with(&backend, opts).await;
    let headers = [
        ("authorization", "Bearer acme"),
        ("idempotency-key", "report-key-0001"),
    ];
    let started = std::time::Instant::now();
    let first = app
        .client
        .post_json("/reports", &headers, &health("2026-08"))
        .await;
    assert_eq!(first.status, 202, "{}", text(&first));
    // Answered before the work (five chunks of 100 ms) is done.
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let again = app
        .client
        .post_json("/reports", &headers, &health("2026-08"))
        .await;
    assert_eq!(again.status, 202);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["location"], first.headers["location"]);
    assert_eq!(app.created(), 1, "one job, one provider call");
    let job_id = first.json()["job_id"].as_str().unwrap().to_owned();
    assert_ne!(app.job("acme", &job_id).await["status"], "complete");
    let done = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let job = app.job("acme", &job_id).await;
            if job["status"] == "complete" {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the job completes");
    assert_eq!(done["attempt"], 1);
    // A key is required on this route; a new key for the same report joins it.
    let keyless = app
        .client
        .post_json(
            "/reports",
            &[("authorization", "Bearer acme")],
            &health("2026-08"),
        )
        .await;
    assert_eq!(
        (keyless.status.as_u16(), keyless.code().as_str()),
        (400, "idempotency_key_required")
    );
    assert_eq!(app.created(), 1);
}

/// A provider failure under a token cap: the job fails `provider_5xx`, a retry
/// with the key replays the same `202`, and the tokens are back for a new report.
async fn keyed_start_with_a_failing_provider_fails_the_job_and_returns_its_tokens(
    backend: Backend,
) {
    let opts = Opts {
        worker: app::Worker::BuiltIn {
            chunk_delay: Duration::from_millis(20),
        },
        token_cap: Some(1500),
        provider_failure: Some(app::ProviderFailure::Status5xx),
        ..Opts::default()
    };
    let app = demo_with(&backend, opts).await;
    let keyed = |key: &'static str| [("authorization", "Bearer acme"), ("idempotency-key", key)];
    let first = app
        .client
        .post_json("/reports", &keyed("report-key-0002"), &health("2026-08"))
        .await;
    assert_eq!(first.status, 202, "{}", text(&first));
    let job_id = first.json()["job_id"].as_str().unwrap().to_owned();
    let failed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let job = app.job("acme", &job_id).await;
            if job["status"] == "failed" {
                return job;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the job fails");
    assert_eq!(failed["error_code"], "provider_5xx");
    let retry = app
        .client
        .post_json("/reports", &keyed("report-key-0002"), &health("2026-08"))
        .await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    let other = app
        .client
        .post_json("/reports", &keyed("report-key-0003"), &health("2026-09"))
        .await;
    assert_eq!(
        other.status,
        202,
        "the failed job's 1200 tokens came back: {}",
        text(&other)
    );
    assert_eq!(app.created(), 2);
}

// The decision matrix, row by row.

async fn matrix_no_row_creates_the_job_200_created_with_location(backend: Backend) {
    let app = demo(&backend).await;
    let reply = app.start("acme", &health("2026-08")).await;
    assert_eq!(reply.status, 200, "{}", text(&reply));
    let body = reply.json();
    assert_eq!(body["created"], true);
    assert_eq!(body["status"], "queued");
    let job = body["job_id"].as_str().unwrap();
    assert_eq!(location(&reply), format!("/reports/{job}"));
    // The Location is where the job is read.
    let read = app.get("acme", &location(&reply)).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["job_id"], job);
    assert_eq!(read.json()["next_seq"], 0);
    assert_eq!(read.json()["cursor_len"], 0);
    assert_eq!(app.created(), 1);
}

async fn matrix_live_lease_joins_the_same_job(backend: Backend) {
    let app = demo(&backend).await;
    let first = app.start_id("acme", &health("2026-08"), 200).await;
    let again = app.start("acme", &health("2026-08")).await;
    assert_eq!(again.status, 200, "{}", text(&again));
    assert_eq!(again.json()["join"], true);
    assert_eq!(again.json()["job_id"], first.as_str());
    assert_eq!(location(&again), format!("/reports/{first}"));
    // A worker holding the lease: still a join, and the status says running.
    app.acquire_token("acme", &first, "w1").await;
    let third = app.start("acme", &health("2026-08")).await;
    assert_eq!(third.status, 200);
    assert_eq!(third.json()["join"], true);
    assert_eq!(third.json()["status"], "running");
    assert_eq!(third.json()["job_id"], first.as_str());
    assert_eq!(app.created(), 1);
}

async fn matrix_complete_job_answers_its_artifact_id(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    app.append("acme", &job, "w1", token, 0, "# Report\n").await;
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let artifact_id = done.json()["artifact_id"].as_str().unwrap().to_owned();

    let again = app.start("acme", &health("2026-08")).await;
    assert_eq!(again.status, 200, "{}", text(&again));
    assert_eq!(again.json()["status"], "complete");
    assert_eq!(again.json()["job_id"], job.as_str());
    assert_eq!(again.json()["artifact_id"], artifact_id.as_str());
    assert_eq!(app.created(), 1);
}

async fn matrix_expired_lease_is_stolen_same_job(backend: Backend) {
    let app = demo_with(
        &backend,
        Opts {
            lease: SHORT_LEASE,
            ..Opts::default()
        },
    )
    .await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let stolen = app.start("acme", &health("2026-08")).await;
    assert_eq!(stolen.status, 200, "{}", text(&stolen));
    assert_eq!(stolen.json()["stolen"], true);
    assert_eq!(stolen.json()["job_id"], job.as_str());
    assert_eq!(location(&stolen), format!("/reports/{job}"));
    assert_eq!(app.created(), 1);
}

async fn matrix_body_naming_another_tenant_is_403_tenant_mismatch(backend: Backend) {
    let app = demo(&backend).await;
    let body = json!({
        "report_type": "customer_health",
        "period": "2026-08",
        "claimed_tenant_id": "acme",
    });
    let reply = app.start("globex", &body.to_string()).await;
    assert_eq!(reply.status, 403, "{}", text(&reply));
    assert_eq!(reply.code(), "tenant_mismatch");
    assert_eq!(app.starts(), 0, "refused before the store is touched");
    // Claiming yourself is fine: evidence, never authority.
    let body = json!({
        "report_type": "customer_health",
        "period": "2026-08",
        "claimed_tenant_id": "globex",
    });
    assert!(started(&app.start("globex", &body.to_string()).await));
}

async fn matrix_heartbeat_from_another_worker_is_409_lease_lost(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    let foreign = app.worker("acme", &job, "heartbeat", "w2", token, "").await;
    assert_eq!(foreign.status, 409, "{}", text(&foreign));
    assert_eq!(foreign.code(), "lease_lost");
    let stale_token = app
        .worker("acme", &job, "heartbeat", "w1", token - 1, "")
        .await;
    assert_eq!(stale_token.status, 409);
    assert_eq!(stale_token.code(), "lease_lost");
    // The owner's heartbeat still works: the foreign one changed nothing.
    let own = app.worker("acme", &job, "heartbeat", "w1", token, "").await;
    assert_eq!(own.status, 200, "{}", text(&own));
    assert_eq!(own.json()["status"], "running");
    // Another worker cannot acquire a live lease either.
    let taken = app.acquire("acme", &job, "w2").await;
    assert_eq!(taken.status, 409);
    assert_eq!(taken.code(), "not_available");
}

async fn matrix_append_after_expiry_is_409_lease_lost(backend: Backend) {
    let app = demo_with(
        &backend,
        Opts {
            lease: SHORT_LEASE,
            ..Opts::default()
        },
    )
    .await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let late = app.append("acme", &job, "w1", token, 0, "too late").await;
    assert_eq!(late.status, 409, "{}", text(&late));
    assert_eq!(late.code(), "lease_lost");
    let beat = app.worker("acme", &job, "heartbeat", "w1", token, "").await;
    assert_eq!(beat.status, 409);
    assert_eq!(beat.code(), "lease_lost");
    assert_eq!(app.job("acme", &job).await["cursor_len"], 0);
}

async fn matrix_finalize_from_a_dead_owner_is_409_not_owner(backend: Backend) {
    let app = demo_with(
        &backend,
        Opts {
            lease: SHORT_LEASE,
            ..Opts::default()
        },
    )
    .await;
    // Taken over by another worker's acquire.
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let dead = app.acquire_token("acme", &job, "w1").await;
    let partial = app.append("acme", &job, "w1", dead, 0, "w1's draft").await;
    assert_eq!(partial.status, 200);
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let alive = app.acquire_token("acme", &job, "w2").await;
    assert!(alive > dead, "a takeover issues a higher token");
    let corpse = app.worker("acme", &job, "finalize", "w1", dead, "").await;
    assert_eq!(corpse.status, 409, "{}", text(&corpse));
    assert_eq!(corpse.code(), "not_owner");
    let corpse_fail = app
        .worker("acme", &job, "fail", "w1", dead, r#"{"code":"oops"}"#)
        .await;
    assert_eq!(corpse_fail.status, 409);
    assert_eq!(corpse_fail.code(), "not_owner");
    // The dead owner's partial cursor is gone; the live owner's result stands.
    assert_eq!(app.job("acme", &job).await["cursor_len"], 0);
    let own = app
        .append("acme", &job, "w2", alive, 0, "w2's report")
        .await;
    assert_eq!(own.status, 200, "{}", text(&own));
    let done = app.worker("acme", &job, "finalize", "w2", alive, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"w2's report");

    // Taken over by a start that stole the expired lease.
    let job = app.start_id("acme", &health("2026-09"), 200).await;
    let dead = app.acquire_token("acme", &job, "w1").await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let stolen = app.start("acme", &health("2026-09")).await;
    assert_eq!(stolen.json()["stolen"], true, "{}", text(&stolen));
    let corpse = app.worker("acme", &job, "finalize", "w1", dead, "").await;
    assert_eq!(corpse.status, 409);
    assert_eq!(corpse.code(), "not_owner");
}

async fn matrix_other_tenants_artifact_is_403_tenant_mismatch(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let artifact = format!("/reports/{job}/artifact");
    let not_ready = app.get("acme", &artifact).await;
    assert_eq!(not_ready.status, 409, "{}", text(&not_ready));
    assert_eq!(not_ready.code(), "not_ready");
    let token = app.acquire_token("acme", &job, "w1").await;
    let done = app
        .worker("acme", &job, "finalize", "w1", token, "the report")
        .await;
    assert_eq!(done.status, 200, "{}", text(&done));

    let theirs = app.get("globex", &artifact).await;
    assert_eq!(theirs.status, 403, "{}", text(&theirs));
    assert_eq!(theirs.code(), "tenant_mismatch");
    let ours = app.get("acme", &artifact).await;
    assert_eq!(ours.status, 200);
    assert_eq!(&ours.body[..], b"the report");
    let unknown = app.get("acme", "/reports/job_nope/artifact").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.code(), "unknown_job");
}

// The six closing checks.

async fn check_1_two_starts_with_one_key_return_one_job(backend: Backend) {
    let app = demo(&backend).await;
    let aug = health("2026-08");
    let (a, b) = tokio::join!(app.start("acme", &aug), app.start("acme", &aug));
    assert_eq!(a.json()["job_id"], b.json()["job_id"]);
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (200, 200));
    let mut flags =
        [a.json(), b.json()].map(|body| (body["created"] == true, body["join"] == true));
    flags.sort();
    assert_eq!(
        flags,
        [(false, true), (true, false)],
        "one creates, one joins"
    );
    assert_eq!(app.created(), 1);
}

async fn check_2_a_live_lease_rejects_a_foreign_finalize_with_409(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    // The layer's own lease (token 1, owner reports-api), before any worker.
    let foreign = app
        .worker("acme", &job, "finalize", "w2", 1, "forged")
        .await;
    assert_eq!(foreign.status, 409, "{}", text(&foreign));
    assert_eq!(foreign.code(), "not_owner");
    // A worker's live lease.
    let token = app.acquire_token("acme", &job, "w1").await;
    for (worker, token) in [("w2", token), ("w2", token + 1), ("w1", token + 1)] {
        let forged = app
            .worker("acme", &job, "finalize", worker, token, "forged")
            .await;
        assert_eq!(forged.status, 409, "{worker}/{token}: {}", text(&forged));
        assert_eq!(forged.code(), "not_owner");
    }
    let body = app.job("acme", &job).await;
    assert_eq!(body["status"], "running");
    assert!(body.get("artifact_id").is_none());
    let ok = app
        .worker("acme", &job, "finalize", "w1", token, "real")
        .await;
    assert_eq!(ok.status, 200, "{}", text(&ok));
}

async fn check_3_an_expired_lease_is_stolen_once_by_50_concurrent_starts(backend: Backend) {
    // The stolen lease must outlive the 50 requests, so they can join it.
    let lease = Duration::from_secs(5);
    let app = demo_with(
        &backend,
        Opts {
            lease,
            ..Opts::default()
        },
    )
    .await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    tokio::time::sleep(lease + Duration::from_millis(200)).await;

    let replies = app.start_all("acme", vec![health("2026-08"); 50]).await;
    let stolen = replies
        .iter()
        .filter(|r| r.status == 200 && r.json()["stolen"] == true)
        .count();
    let joined = replies
        .iter()
        .filter(|r| r.status == 200 && r.json()["join"] == true)
        .count();
    assert_eq!(stolen, 1, "stolen exactly once");
    assert_eq!(joined, 49, "the rest join the thief's lease");
    for reply in &replies {
        assert_eq!(reply.json()["job_id"], job.as_str());
    }
    assert_eq!(app.created(), 1);
    assert_eq!(app.starts(), 51);
}

async fn check_4_a_reconnect_reads_the_cursor_and_inserts_nothing(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    for (seq, chunk) in ["alpha ", "beta ", "gamma ", "delta "].iter().enumerate() {
        let reply = app
            .append("acme", &job, "w1", token, seq as u64, chunk)
            .await;
        assert_eq!(reply.status, 200, "{}", text(&reply));
    }
    let (starts, created) = (app.starts(), app.created());

    // By sequence number, within the attempt the reader's chunks came from.
    let body = app.cursor("acme", &job, "?attempt=1&from_seq=2").await;
    assert_eq!(
        body["chunks"],
        json!([{"seq": 2, "data": "gamma "}, {"seq": 3, "data": "delta "}])
    );
    assert_eq!(body["next_seq"], 4);
    assert_eq!(body["status"], "running");
    assert_eq!(
        (&body["attempt"], &body["reset"]),
        (&json!(1), &json!(false))
    );
    // By byte offset: "alpha beta " is 11 bytes; 13 is inside "gamma ".
    let body = app.cursor("acme", &job, "?attempt=1&offset=13").await;
    assert_eq!(
        body["chunks"],
        json!([
            {"seq": 2, "offset": 13, "data": "mma "},
            {"seq": 3, "offset": 17, "data": "delta "},
        ])
    );
    assert_eq!(body["next_offset"], 23);
    assert_eq!(body["next_seq"], 4);
    let both = app
        .get(
            "acme",
            &format!("/reports/{job}/cursor?attempt=1&offset=1&from_seq=1"),
        )
        .await;
    assert_eq!(both.status, 400);
    assert_eq!(both.code(), "invalid_query");

    // As server-sent events, resuming after chunk 1 of attempt 1 while the job
    // is still running.
    let stream = app.follow("acme", &job, Some("1-1"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.append_ok("acme", &job, "w1", token, 4, "epsilon").await;
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let reply = stream.await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers.get("content-type").unwrap(),
        "text/event-stream"
    );
    let events = parse_sse(&reply.body);
    assert_eq!(chunk_ids(&events), [(1, 2), (1, 3), (1, 4)]);
    assert_eq!(
        events[2].data,
        json!({"attempt": 1, "seq": 4, "data": "epsilon"})
    );
    let last = events.last().unwrap();
    assert_eq!(last.event, "done");
    assert_eq!(last.data["artifact_id"], done.json()["artifact_id"]);

    assert_eq!(app.starts(), starts, "reading never calls start");
    assert_eq!(app.created(), created, "reading never inserts a job");
}

async fn check_5_download_checks_the_session_tenant(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    app.append("acme", &job, "w1", token, 0, "secret").await;
    app.worker("acme", &job, "finalize", "w1", token, "").await;

    assert_eq!(
        app.get("acme", &format!("/reports/{job}/artifact"))
            .await
            .status,
        200
    );
    let download = app.get("globex", &format!("/reports/{job}/artifact")).await;
    assert_eq!(download.status, 403);
    assert_eq!(download.code(), "tenant_mismatch");
    assert!(!String::from_utf8_lossy(&download.body).contains("secret"));
    // Every other reader of another tenant's job: 404, as if it did not exist.
    for path in ["", "/cursor", "/events"] {
        let reply = app.get("globex", &format!("/reports/{job}{path}")).await;
        assert_eq!(reply.status, 404, "{path}: {}", text(&reply));
        assert_eq!(reply.code(), "unknown_job");
    }
    // And the worker side: another tenant's session cannot touch the job.
    let acquire = app.acquire("globex", &job, "w9").await;
    assert_eq!(acquire.status, 404);
    let finalize = app
        .worker("globex", &job, "finalize", "w1", token, "x")
        .await;
    assert_eq!(finalize.status, 404);
    // Without a session: 401.
    let anonymous = app
        .client
        .get(&format!("/reports/{job}/artifact"), &[])
        .await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.code(), "unauthorized");
}

async fn check_6_the_http_path_behaves_as_the_in_process_one(backend: Backend) {
    let opts = Opts::default();
    let over_http = demo_with(&backend, Opts::default()).await;
    let in_process = app::router(
        AnyJobStore::new(counting(&backend, opts.lease).await),
        config(&opts),
    );

    let http_answers = run_script(&Transport::Http(over_http.client.clone())).await;
    let local_answers = run_script(&Transport::InProcess(in_process)).await;
    assert_eq!(http_answers.len(), local_answers.len());
    for (i, (http, local)) in http_answers.iter().zip(&local_answers).enumerate() {
        assert_eq!(http, local, "step {i}: HTTP and in-process answers differ");
    }

    // And both agree with the job store called directly for the same sequence.
    let store = backend.store(LONG_LEASE).await;
    let start = StartJob {
        tenant: "acme",
        kind: "report",
        key: "customer_health:2026-08",
        owner: "reports-api",
        budget: None,
        cost: 1,
    };
    let codes: Vec<u16> = http_answers.iter().map(|(status, ..)| *status).collect();
    let code_of = |i: usize| -> String {
        serde_json::from_str::<Value>(&http_answers[i].1).unwrap()["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let Ok(StartOutcome::Created(job, _)) = store.start(&start).await else {
        panic!("created")
    };
    assert_eq!(codes[0], 200);
    assert!(matches!(
        store.start(&start).await,
        Ok(StartOutcome::Joined(_))
    ));
    assert_eq!(codes[1], 200);
    assert_eq!(store.job("globex", &job.id).await.unwrap(), None);
    assert_eq!(codes[5], 404);
    assert!(matches!(
        store.artifact("acme", &job.id).await.unwrap(),
        ArtifactLookup::NotReady(_)
    ));
    assert_eq!((codes[6], code_of(6).as_str()), (409, "not_ready"));
    let w1 = store
        .acquire(&job.id, "w1")
        .await
        .unwrap()
        .expect("acquired");
    assert_eq!(codes[7], 200);
    assert!(store.acquire(&job.id, "w2").await.unwrap().is_none());
    assert_eq!((codes[8], code_of(8).as_str()), (409, "not_available"));
    let foreign = LeaseGrant {
        owner: "w2".into(),
        ..w1.clone()
    };
    let e = store.heartbeat(&foreign).await.unwrap_err();
    assert_eq!((codes[9], code_of(9).as_str()), (409, e.code()));
    assert_eq!(
        store.append(&w1, 0, Bytes::from("one ")).await.unwrap(),
        Appended::Added { next_seq: 1 }
    );
    assert_eq!(
        store.append(&w1, 0, Bytes::from("one ")).await.unwrap(),
        Appended::Duplicate { next_seq: 1 }
    );
    assert_eq!(codes[10..12], [200, 200]);
    let gap = store
        .append(&w1, 2, Bytes::from("three"))
        .await
        .unwrap_err();
    assert!(matches!(gap, LeaseError::SequenceGap { expected: 1 }));
    assert_eq!((codes[12], code_of(12).as_str()), (409, gap.code()));
    store.append(&w1, 1, Bytes::from("two")).await.unwrap();
    let e = store
        .finalize(&foreign, Bytes::from("x"))
        .await
        .unwrap_err();
    assert_eq!((codes[14], code_of(14).as_str()), (409, e.code()));
    store.finalize(&w1, Bytes::from("one two")).await.unwrap();
    assert_eq!(codes[15], 200);
    assert!(matches!(
        store.start(&start).await,
        Ok(StartOutcome::Completed(_))
    ));
    assert_eq!(codes[16], 200);
    assert_eq!(
        store.artifact("globex", &job.id).await.unwrap(),
        ArtifactLookup::OtherTenant
    );
    assert_eq!((codes[19], code_of(19).as_str()), (403, "tenant_mismatch"));
    assert_eq!(
        store.artifact("acme", &job.id).await.unwrap(),
        ArtifactLookup::Found(Bytes::from("one two"))
    );
    assert_eq!(http_answers[20], (200, "one two".into(), String::new()));
}
