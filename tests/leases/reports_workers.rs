//! The worker side of the reports demo over loopback HTTP, against every job
//! store: numbered appends, the built-in worker, and the stale sweep that
//! gives every abandoned job an ending. The harness is `reports/mod.rs`.

use crate::reports;

use reports::app::Worker;
use reports::*;
use serde_json::json;
use std::time::Duration;
use tower_idempotency::lease::store::AnyJobStore;

for_each_store! {
    #[tokio::test] appends_are_numbered_a_repeat_is_a_no_op_and_a_gap_is_409,
    #[tokio::test] built_in_worker_completes_the_job_and_the_artifact_is_the_cursor,
    #[tokio::test] the_stale_sweep_fails_an_abandoned_job_and_the_next_start_creates_anew,
}

// The worker side.

async fn appends_are_numbered_a_repeat_is_a_no_op_and_a_gap_is_409(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    let first = app.append("acme", &job, "w1", token, 0, "one ").await;
    assert_eq!(first.status, 200, "{}", text(&first));
    assert_eq!(first.json()["added"], true);
    assert_eq!(first.json()["next_seq"], 1);
    let repeat = app.append("acme", &job, "w1", token, 0, "one ").await;
    assert_eq!(repeat.status, 200);
    assert_eq!(repeat.json()["added"], false);
    assert_eq!(repeat.json()["duplicate"], true);
    assert_eq!(repeat.json()["next_seq"], 1);
    let gap = app.append("acme", &job, "w1", token, 2, "three").await;
    assert_eq!(gap.status, 409, "{}", text(&gap));
    assert_eq!(gap.code(), "sequence_gap");
    assert_eq!(gap.json()["expected"], 1);
    let second = app.append("acme", &job, "w1", token, 1, "two").await;
    assert_eq!(second.json()["next_seq"], 2);
    let cursor = app.get("acme", &format!("/reports/{job}/cursor")).await;
    assert_eq!(
        cursor.json()["chunks"],
        json!([{"seq": 0, "data": "one "}, {"seq": 1, "data": "two"}])
    );
    assert_eq!(app.job("acme", &job).await["cursor_len"], 7);

    // Writes without a lease: refused as a stale lease is (the caller does
    // not hold it), never as a malformed request.
    let path = format!("/reports/{job}/append");
    let no_worker = app
        .client
        .post_json(
            &path,
            &[("authorization", "Bearer acme"), ("x-lease-token", "1")],
            "{}",
        )
        .await;
    assert_eq!(no_worker.status, 409);
    assert_eq!(no_worker.code(), "lease_lost");
    let no_token = app
        .client
        .post_json(
            &path,
            &[("authorization", "Bearer acme"), ("x-worker-id", "w1")],
            "{}",
        )
        .await;
    assert_eq!(no_token.status, 409);
    assert_eq!(no_token.code(), "lease_lost");
    for (end, headers) in [
        ("finalize", vec![]),
        ("finalize", vec![("x-worker-id", "w1")]),
        ("fail", vec![("x-lease-token", "1")]),
        (
            "finalize",
            vec![("x-worker-id", "w1"), ("x-lease-token", "one")],
        ),
    ] {
        let mut headers = headers;
        headers.push(("authorization", "Bearer acme"));
        let refused = app
            .client
            .post_json(&format!("/reports/{job}/{end}"), &headers, "")
            .await;
        assert_eq!(
            (refused.status.as_u16(), refused.code().as_str()),
            (409, "not_owner")
        );
        assert_eq!(refused.json()["detail"], "not_owner");
    }
    let bad_body = app
        .worker("acme", &job, "append", "w1", token, r#"{"seq":-1}"#)
        .await;
    assert_eq!(bad_body.status, 400);
    assert_eq!(bad_body.code(), "invalid_body");
    let unknown = app.append("acme", "job_nope", "w1", token, 0, "x").await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.code(), "unknown_job");

    // Finalize with an empty body: the artifact is the cursor.
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200);
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"one two");
    // After the ending nothing more is written, and nobody can acquire it.
    let late = app.append("acme", &job, "w1", token, 2, "three").await;
    assert_eq!(late.code(), "lease_lost");
    let acquire = app.acquire("acme", &job, "w2").await;
    assert_eq!(acquire.status, 409);
    assert_eq!(acquire.json()["status"], "complete");
}

// The built-in worker.

async fn built_in_worker_completes_the_job_and_the_artifact_is_the_cursor(backend: Backend) {
    let app = demo_with(
        &backend,
        Opts {
            worker: Worker::BuiltIn {
                chunk_delay: Duration::from_millis(20),
            },
            ..Opts::default()
        },
    )
    .await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    // Follow it live from the start, as the chat panel would.
    let events = parse_sse(&app.events("acme", &job, None).await.body);
    assert_eq!(chunk_ids(&events), [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4)]);
    assert_eq!(events.last().unwrap().event, "done");
    let streamed: String = events
        .iter()
        .filter(|e| e.event == "message")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();

    let body = app.wait_for_status("acme", &job, "complete").await;
    assert_eq!(body["next_seq"], 5);
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(artifact.status, 200);
    let cursor = app.get("acme", &format!("/reports/{job}/cursor")).await;
    let concatenated: String = cursor.json()["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["data"].as_str().unwrap())
        .collect();
    assert_eq!(String::from_utf8_lossy(&artifact.body), concatenated);
    assert_eq!(streamed, concatenated);
    assert!(concatenated.starts_with("# customer health report: acme / 2026-08"));
    assert_eq!(body["cursor_len"], concatenated.len());

    let again = app.start("acme", &health("2026-08")).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["artifact_id"], body["artifact_id"]);
    assert_eq!(app.created(), 1);
}

// Every job reaches an ending.

async fn the_stale_sweep_fails_an_abandoned_job_and_the_next_start_creates_anew(backend: Backend) {
    let app = demo_with(
        &backend,
        Opts {
            lease: SHORT_LEASE,
            ..Opts::default()
        },
    )
    .await;
    let store = AnyJobStore::new(app.store.clone());
    let sweeper = app::spawn_stale_sweep(store, Duration::from_millis(100));
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let body = app.wait_for_status("acme", &job, "failed").await;
    assert_eq!(body["error_code"], "stale");
    let acquire = app.acquire("acme", &job, "w1").await;
    assert_eq!(acquire.status, 409, "an ended job is left alone");
    let next = app.start_id("acme", &health("2026-08"), 200).await;
    assert_ne!(next, job, "a failed job is not revived: a new one starts");
    sweeper.abort();
}
