//! A worker's lease on `PostgresJobStore` is heartbeated as a running claim
//! is kept alive: a stall of the worker's connections of nine tenths of the
//! lease, beginning as a heartbeat is sent, does not let another start steal
//! the job.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::{sleep, Instant};
use tower_idempotency::lease::store::PostgresJobStore;
use tower_idempotency::lease::store::{JobReader, JobStatus, JobStore, StartJob, StartOutcome};
use tower_idempotency::Lease;
use tower_idempotency_tests::support::pg;
use tower_idempotency_tests::support::proxy::{Proxy, StallState};

const LEASE: Duration = Duration::from_secs(2);

fn start(owner: &str) -> StartJob<'_> {
    StartJob {
        tenant: "acme",
        kind: "report",
        key: "keep-alive:2026-01",
        owner,
        budget: None,
        cost: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_of_nine_tenths_of_the_lease_keeps_the_workers_lease() {
    let Some(url) = pg::database_url("keep_alive_lease_pg") else {
        return;
    };
    let table = pg::unique_table("keep_alive_jobs");
    let competitor = PostgresJobStore::builder(pg::pool(pg::pg_config(&url), 4))
        .with_table(table.parse().unwrap())
        .with_lease(LEASE)
        .build();
    competitor.migrate().await.expect("migrate");
    let proxy = Proxy::start(pg::server_addr(&url).await).await;
    let owner = PostgresJobStore::builder(pg::pool(pg::pg_config_at(&url, proxy.port), 2))
        .with_table(table.parse().unwrap())
        .with_lease(LEASE)
        .build();
    let StartOutcome::Created(job, grant) = owner.start(&start("worker")).await.unwrap() else {
        panic!("expected a new job");
    };
    let (started, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let worker = Lease::new(Arc::new(owner), grant).spawn_worker({
        let (started, gate) = (started.clone(), gate.clone());
        move |_| async move {
            started.notify_one();
            gate.notified().await;
            Ok(Bytes::from_static(b"artifact"))
        }
    });
    // The first heartbeat marked it running: the next is what stalls.
    started.notified().await;
    proxy.freeze_at_next_request(LEASE * 9 / 10);
    let armed = Instant::now();
    let mut ended = None;
    loop {
        match competitor.start(&start("thief")).await.unwrap() {
            StartOutcome::Joined(_) => {}
            other => panic!("the live lease was taken over: {other:?}"),
        }
        match ended {
            None if proxy.stall_state() == StallState::Ended => ended = Some(Instant::now()),
            Some(at) if at.elapsed() > LEASE / 2 => break,
            _ => {}
        }
        assert!(armed.elapsed() < LEASE * 3, "no heartbeat was sent");
        sleep(Duration::from_millis(20)).await;
    }
    gate.notify_one();
    worker.await.unwrap();
    let job = competitor.job("acme", &job.id).await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Complete);
}
