//! The readers of the reports demo over loopback HTTP, against every job
//! store: the cursor and server-sent events, resuming within an attempt, and
//! a takeover's new attempt, which readers are told about and never splice
//! into what they already had. The harness is `reports/mod.rs`.

use crate::reports;

use reports::*;
use serde_json::json;
use std::time::Duration;

for_each_store! {
    #[tokio::test] events_resume_after_last_event_id_and_end_with_done_or_failed,
    #[tokio::test] resume_positions_carry_their_attempt,
    #[tokio::test] a_takeover_never_splices_two_attempts_by_cursor_or_sse,
    #[tokio::test] a_start_that_steals_the_job_resets_its_readers,
    #[tokio::test] handing_a_queued_job_to_a_worker_is_not_a_new_attempt_even_after_the_starters_lease_expired,
}

async fn events_resume_after_last_event_id_and_end_with_done_or_failed(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    for (seq, chunk) in ["a\n", "b\r\n", "c \"quoted\"", "d"].iter().enumerate() {
        app.append_ok("acme", &job, "w1", token, seq as u64, chunk)
            .await;
    }
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    let artifact_id = done.json()["artifact_id"].clone();

    let all = parse_sse(&app.events("acme", &job, None).await.body);
    assert_eq!(chunk_ids(&all), [(1, 0), (1, 1), (1, 2), (1, 3)]);
    let streamed: String = all
        .iter()
        .filter(|e| e.event == "message")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();
    assert_eq!(
        streamed, "a\nb\r\nc \"quoted\"d",
        "chunks survive the event framing"
    );

    let resumed = parse_sse(&app.events("acme", &job, Some("1-1")).await.body);
    assert_eq!(chunk_ids(&resumed), [(1, 2), (1, 3)]);
    let last = resumed.last().unwrap();
    assert_eq!(last.event, "done");
    assert_eq!(last.id, None, "the ending does not move Last-Event-ID");
    assert_eq!(last.data["status"], "complete");
    assert_eq!(last.data["attempt"], 1);
    assert_eq!(last.data["artifact_id"], artifact_id);

    let at_end = parse_sse(&app.events("acme", &job, Some("1-3")).await.body);
    assert_eq!(event_names(&at_end), ["done"]);

    let path = format!("/reports/{job}/events?attempt=1&from_seq=3");
    let query = app.events_at("acme", &path, None).await;
    assert_eq!(chunk_ids(&parse_sse(&query.body)), [(1, 3)]);
    let bad = app.events("acme", &job, Some("nope")).await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.code(), "invalid_last_event_id");

    // A failed job ends its stream with `failed`.
    let other = app.start_id("acme", &health("2026-09"), 200).await;
    let token = app.acquire_token("acme", &other, "w1").await;
    app.append_ok("acme", &other, "w1", token, 0, "partial")
        .await;
    let fail = r#"{"code":"model_error"}"#;
    let failed = app.worker("acme", &other, "fail", "w1", token, fail).await;
    assert_eq!(failed.status, 200, "{}", text(&failed));
    let failed = parse_sse(&app.events("acme", &other, None).await.body);
    assert_eq!(chunk_ids(&failed), [(1, 0)]);
    let last = failed.last().unwrap();
    assert_eq!(last.event, "failed");
    assert_eq!(last.data["error_code"], "model_error");
}

/// A position (a sequence number, a byte offset, a `Last-Event-ID`) means
/// something only within the attempt whose chunks it counted: without one it
/// is refused, with a stale one the reader is reset.
async fn resume_positions_carry_their_attempt(backend: Backend) {
    let app = demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let token = app.acquire_token("acme", &job, "w1").await;
    app.append_ok("acme", &job, "w1", token, 0, "zero ").await;
    app.append_ok("acme", &job, "w1", token, 1, "one").await;
    let done = app.worker("acme", &job, "finalize", "w1", token, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));

    let read = app.job("acme", &job).await;
    assert_eq!(
        (&read["attempt"], &read["next_seq"]),
        (&json!(1), &json!(2))
    );

    // The cursor: from 0 needs no attempt; any later position does.
    let whole = app.cursor("acme", &job, "").await;
    assert_eq!(
        (&whole["attempt"], &whole["reset"], &whole["next_seq"]),
        (&json!(1), &json!(false), &json!(2))
    );
    assert_eq!(cursor_text(&whole), "zero one");
    assert_eq!(app.cursor("acme", &job, "?from_seq=0").await, whole);
    assert_eq!(app.cursor("acme", &job, "?attempt=1").await, whole);
    for query in ["?from_seq=1", "?offset=3"] {
        let reply = app
            .get("acme", &format!("/reports/{job}/cursor{query}"))
            .await;
        assert_eq!(reply.status, 400, "{query}: {}", text(&reply));
        assert_eq!(reply.code(), "attempt_required", "{query}");
    }
    for query in ["?attempt=one", "?attempt=-1&from_seq=1", "?from_seq=x"] {
        let reply = app
            .get("acme", &format!("/reports/{job}/cursor{query}"))
            .await;
        assert_eq!(reply.status, 400, "{query}: {}", text(&reply));
        assert_eq!(reply.code(), "invalid_query", "{query}");
    }
    // An attempt that is not the current one: reset, and the cursor from 0.
    let stale = app.cursor("acme", &job, "?attempt=7&from_seq=1").await;
    assert_eq!(
        (&stale["attempt"], &stale["reset"]),
        (&json!(1), &json!(true))
    );
    assert_eq!(stale["chunks"], whole["chunks"]);
    let stale = app.cursor("acme", &job, "?attempt=7&offset=3").await;
    assert_eq!(stale["reset"], true);
    assert_eq!(
        stale["chunks"],
        json!([{"seq": 0, "offset": 0, "data": "zero "}, {"seq": 1, "offset": 5, "data": "one"}])
    );
    assert_eq!(stale["next_offset"], 8);

    // Events: `Last-Event-ID` is ATTEMPT-SEQ; a bare number cannot say which
    // attempt it counted, so it is refused rather than guessed.
    for id in ["1", "1-", "-1", "x-1", "1-x", "1-2-3", "1 - 1"] {
        let reply = app.events("acme", &job, Some(id)).await;
        assert_eq!(reply.status, 400, "{id:?}: {}", text(&reply));
        assert_eq!(reply.code(), "invalid_last_event_id", "{id:?}");
    }
    let path = format!("/reports/{job}/events?from_seq=1");
    let reply = app.events_at("acme", &path, None).await;
    assert_eq!(reply.status, 400, "{}", text(&reply));
    assert_eq!(reply.code(), "attempt_required");
    // An empty Last-Event-ID is no position: the whole stream.
    let empty = parse_sse(&app.events("acme", &job, Some("")).await.body);
    assert_eq!(chunk_ids(&empty), [(1, 0), (1, 1)]);
    // Another attempt's position: reset, then the current attempt from 0.
    let stale = parse_sse(&app.events("acme", &job, Some("7-0")).await.body);
    assert_eq!(event_names(&stale), ["reset", "message", "message", "done"]);
    assert_eq!(stale[0].data["attempt"], 1);
    assert_eq!(stale[0].data["next_seq"], 0);
    assert_eq!(chunk_ids(&stale), [(1, 0), (1, 1)]);
    let path = format!("/reports/{job}/events?attempt=7&from_seq=1");
    let stale = parse_sse(&app.events_at("acme", &path, None).await.body);
    assert_eq!(event_names(&stale), ["reset", "message", "message", "done"]);
}

/// The splice: a reader holding w1's chunks 0 and 1 reads on from seq 2 after
/// w2 took over (attempt 2) and appended its own 0, 1 and 2. Comparing
/// sequence numbers alone would hand it w2's chunk 2 after w1's 0 and 1.
async fn a_takeover_never_splices_two_attempts_by_cursor_or_sse(backend: Backend) {
    let app = short_lease_demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let w1 = app.acquire_token("acme", &job, "w1").await;
    app.append_ok("acme", &job, "w1", w1, 0, "w1-0 ").await;
    app.append_ok("acme", &job, "w1", w1, 1, "w1-1 ").await;

    // The reader has w1's chunks 0 and 1, by cursor…
    let read = app.cursor("acme", &job, "").await;
    assert_eq!(
        (&read["attempt"], &read["next_seq"]),
        (&json!(1), &json!(2))
    );
    assert_eq!(cursor_text(&read), "w1-0 w1-1 ");
    // …and by SSE: one stream following from the start, one resumed after
    // w1's chunk 1, both across the takeover.
    let live = app.follow("acme", &job, None);
    let resumed = app.follow("acme", &job, Some("1-1"));
    tokio::time::sleep(Duration::from_millis(400)).await;

    // w1 stalls; its lease expires; w2 takes the job over.
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let w2 = app.acquire_token("acme", &job, "w2").await;
    assert!(w2 > w1, "a takeover issues a higher token");
    let taken = app.job("acme", &job).await;
    assert_eq!(
        (&taken["attempt"], &taken["next_seq"]),
        (&json!(2), &json!(0))
    );
    for seq in 0..3 {
        app.append_ok("acme", &job, "w2", w2, seq, &format!("w2-{seq} "))
            .await;
    }
    let late = app.append("acme", &job, "w1", w1, 2, "w1-2 ").await;
    assert_eq!(late.code(), "lease_lost", "{}", text(&late));

    // By cursor: resuming at seq 2 of attempt 1 is a reset to w2's cursor from 0.
    let next = app.cursor("acme", &job, "?attempt=1&from_seq=2").await;
    assert_eq!(
        (&next["attempt"], &next["reset"]),
        (&json!(2), &json!(true))
    );
    assert_eq!(
        next["chunks"],
        json!([
            {"seq": 0, "data": "w2-0 "},
            {"seq": 1, "data": "w2-1 "},
            {"seq": 2, "data": "w2-2 "},
        ]),
        "never w2's chunk 2 alone after w1's 0 and 1"
    );
    assert_eq!(next["next_seq"], 3);
    // By byte offset likewise: attempt 1's bytes count nothing in attempt 2.
    let by_offset = app.cursor("acme", &job, "?attempt=1&offset=10").await;
    assert_eq!(by_offset["reset"], true);
    assert_eq!(cursor_text(&by_offset), "w2-0 w2-1 w2-2 ");
    assert_eq!(by_offset["next_offset"], 15);
    // Within the current attempt, resuming is plain resuming.
    let tail = app.cursor("acme", &job, "?attempt=2&from_seq=2").await;
    assert_eq!(tail["reset"], false);
    assert_eq!(tail["chunks"], json!([{"seq": 2, "data": "w2-2 "}]));

    // By SSE: an EventSource reconnecting after the takeover with w1's id.
    let reconnected = app.follow("acme", &job, Some("1-1"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let done = app.worker("acme", &job, "finalize", "w2", w2, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"w2-0 w2-1 w2-2 ");

    let w2_ids = [(2, 0), (2, 1), (2, 2)];
    for (name, stream) in [("resumed", resumed), ("reconnected", reconnected)] {
        let events = parse_sse(&stream.await.unwrap().body);
        assert_eq!(
            event_names(&events),
            ["reset", "message", "message", "message", "done"],
            "{name}: {events:?}"
        );
        assert_eq!(
            events[0].data,
            json!({"job_id": job, "attempt": 2, "next_seq": 0})
        );
        assert_eq!(chunk_ids(&events), w2_ids, "{name}");
        assert_no_splice(name, &events, "w2-0 w2-1 w2-2 ");
    }
    let live = parse_sse(&live.await.unwrap().body);
    assert_no_splice("live", &live, "w2-0 w2-1 w2-2 ");
    if chunk_ids(&live).first() == Some(&(1, 0)) {
        // It had w1's chunks before the takeover (the usual timing).
        assert_eq!(
            event_names(&live),
            ["message", "message", "reset", "message", "message", "message", "done"]
        );
    }
}

/// A takeover by `POST /reports/start` (a steal) is a new attempt too.
async fn a_start_that_steals_the_job_resets_its_readers(backend: Backend) {
    let app = short_lease_demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    let w1 = app.acquire_token("acme", &job, "w1").await;
    app.append_ok("acme", &job, "w1", w1, 0, "old zero ").await;
    app.append_ok("acme", &job, "w1", w1, 1, "old one").await;
    let stream = app.follow("acme", &job, None);
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    let stolen = app.start("acme", &health("2026-08")).await;
    assert_eq!(stolen.json()["stolen"], true, "{}", text(&stolen));
    let read = app.job("acme", &job).await;
    assert_eq!(
        (&read["attempt"], &read["next_seq"]),
        (&json!(2), &json!(0))
    );
    let cursor = app.cursor("acme", &job, "?attempt=1&from_seq=2").await;
    assert_eq!(
        (&cursor["reset"], &cursor["chunks"]),
        (&json!(true), &json!([]))
    );
    assert_eq!(cursor["next_seq"], 0);

    // The thief's lease went to the API process (`reports-api`), the job is
    // queued again: a worker picks it up (a hand-off, still attempt 2).
    let w2 = app.acquire_token("acme", &job, "w2").await;
    assert_eq!(app.job("acme", &job).await["attempt"], 2);
    app.append_ok("acme", &job, "w2", w2, 0, "new").await;
    let done = app.worker("acme", &job, "finalize", "w2", w2, "").await;
    assert_eq!(done.status, 200, "{}", text(&done));

    let events = parse_sse(&stream.await.unwrap().body);
    assert_no_splice("live", &events, "new");
    let resets: Vec<_> = events.iter().filter(|e| e.event == "reset").collect();
    assert_eq!(resets.len(), 1, "{events:?}");
    assert_eq!(resets[0].data["attempt"], 2);
    let artifact = app.get("acme", &format!("/reports/{job}/artifact")).await;
    assert_eq!(&artifact.body[..], b"new");
}

/// `acquire` of a queued job is the hand-off from the API to a worker, not a
/// takeover (`docs/leases.md`; the conformance suite's
/// `acquire_hands_over_queued_jobs_only` checks it under a live lease): the
/// cursor is empty and nobody else wrote, so the attempt stays 1. Both stores
/// should agree whether or not the starter's lease expired first.
async fn handing_a_queued_job_to_a_worker_is_not_a_new_attempt_even_after_the_starters_lease_expired(
    backend: Backend,
) {
    let app = short_lease_demo(&backend).await;
    let job = app.start_id("acme", &health("2026-08"), 200).await;
    tokio::time::sleep(PAST_SHORT_LEASE).await;
    assert_eq!(app.job("acme", &job).await["status"], "queued");
    app.acquire_token("acme", &job, "w1").await;
    assert_eq!(app.job("acme", &job).await["attempt"], 1, "{backend:?}");
}

/// Checks a whole event stream: it is segments separated by `reset` events,
/// each one attempt's chunks with consecutive sequence numbers (from 0 after
/// a reset), attempts rising; the last segment is the artifact's text and
/// the stream ends with `done`.
fn assert_no_splice(name: &str, events: &[Sse], artifact: &str) {
    let mut segments: Vec<Vec<&Sse>> = vec![Vec::new()];
    for event in events {
        match event.event.as_str() {
            "reset" => segments.push(Vec::new()),
            "message" => segments.last_mut().unwrap().push(event),
            "done" => {}
            other => panic!("{name}: unexpected event {other}: {events:?}"),
        }
    }
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
    let mut previous_attempt = 0;
    for (i, segment) in segments.iter().enumerate() {
        let Some(first) = segment.first() else {
            continue;
        };
        let (attempt, start) = first.id.unwrap();
        assert!(
            attempt > previous_attempt,
            "{name}: attempts rise: {events:?}"
        );
        previous_attempt = attempt;
        if i > 0 {
            assert_eq!(start, 0, "{name}: a reset replays from 0: {events:?}");
        }
        for (k, chunk) in segment.iter().enumerate() {
            assert_eq!(
                chunk.id,
                Some((attempt, start + k as u64)),
                "{name}: one attempt per segment, no gaps: {events:?}"
            );
            assert_eq!(chunk.data["attempt"], attempt);
        }
    }
    let last: String = segments
        .last()
        .unwrap()
        .iter()
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();
    assert_eq!(
        last, artifact,
        "{name}: what the reader ends with: {events:?}"
    );
}
