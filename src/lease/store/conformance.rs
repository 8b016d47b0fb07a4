//! The [`JobStore`] conformance suite (features `test-util` and `leases`): the
//! start decision table of `docs/leases.md` and the fenced worker writes at
//! the store level, as checks any job store can run.
//!
//! A test file supplies `async fn(lease: Duration) -> Option<S>` (`None`
//! skips) and invokes
//! [`job_store_conformance_tests!`](self::job_store_conformance_tests), which
//! writes one `#[tokio::test]` per check (the test crate needs `tokio` with the
//! `macros` and `rt-multi-thread` features). Each check is also a public
//! `async fn` of this module taking the store, kept out of the
//! documentation's item lists (the macro's source names every one). Not
//! covered by semver.

// Exported at the crate root, as `#[macro_export]` requires, and documented
// here, beside the checks it runs, rather than at the top of the crate's page.
#[doc(inline)]
pub use crate::job_store_conformance_tests;

use crate::lease::store::{
    Appended, ArtifactLookup, Budget, BudgetPeriod, JobMaintenance, JobReader, JobStatus, JobStore,
    LeaseError, LeaseGrant, StartJob, StartOutcome,
};
use bytes::Bytes;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

/// The suite covers every caller's trait of a job store.
pub trait FullJobStore: JobStore + JobReader + JobMaintenance {}

impl<T: JobStore + JobReader + JobMaintenance> FullJobStore for T {}

/// Nothing expires during a test.
pub const LONG: Duration = Duration::from_secs(60);
/// Short enough to watch a lease expire.
pub const SHORT: Duration = Duration::from_millis(400);
/// `Duration::MAX`, a natural way to say "a lease that never runs out".
pub const FOREVER: Duration = Duration::MAX;

/// Helper: unique.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Helper: start.
pub async fn start<S: JobStore + ?Sized>(
    store: &S,
    tenant: &str,
    key: &str,
    owner: &str,
    budget: Option<Budget>,
) -> StartOutcome {
    start_kind(store, tenant, "report", key, owner, budget).await
}

/// Helper: start kind.
pub async fn start_kind<S: JobStore + ?Sized>(
    store: &S,
    tenant: &str,
    kind: &str,
    key: &str,
    owner: &str,
    budget: Option<Budget>,
) -> StartOutcome {
    store
        .start(&StartJob {
            tenant,
            kind,
            key,
            owner,
            budget,
            cost: 1,
        })
        .await
        .expect("start")
}

/// Pairs of `(tenant, key)` that a store keyed by `tenant + sep + key` would
/// merge, for every separator a tenant or a key might contain (not NUL, which
/// PostgreSQL text cannot hold).
fn colliding_identities(base: &str) -> Vec<[(String, String); 2]> {
    ["：", ":", "/", "|", "\u{1f}", " ", ".", "::", "", "\n"]
        .iter()
        .map(|sep| {
            [
                (format!("{base}{sep}acme"), "2026-08".to_owned()),
                (base.to_owned(), format!("acme{sep}2026-08")),
            ]
        })
        .collect()
}

/// A job belongs to exactly one `(tenant, kind, key)`: no choice of separators
/// makes a second tenant join, steal, read or finalize the first one's job.
#[doc(hidden)]
pub async fn tenants_never_share_a_job_whatever_the_separators<S: FullJobStore>(store: S) {
    let base = unique("org");
    for [(tenant_a, key_a), (tenant_b, key_b)] in colliding_identities(&base) {
        let first = created(&store, &tenant_a, &key_a).await;
        let second = match start(&store, &tenant_b, &key_b, "worker-b", None).await {
            StartOutcome::Created(job, grant) => {
                assert_eq!(
                    (job.tenant.as_str(), job.key.as_str()),
                    (&*tenant_b, &*key_b)
                );
                grant
            }
            other => panic!("{tenant_b:?}/{key_b:?} met {tenant_a:?}/{key_a:?}: {other:?}"),
        };
        assert_ne!(first.job_id, second.job_id);
        store
            .finalize(&first, Bytes::from_static(b"a's report"))
            .await
            .unwrap();
        // The other tenant sees nothing of the first one's job...
        assert_eq!(store.job(&tenant_b, &first.job_id).await.unwrap(), None);
        assert_eq!(
            store.artifact(&tenant_b, &first.job_id).await.unwrap(),
            ArtifactLookup::OtherTenant
        );
        // ...and its own start still joins its own job, not the completed one.
        match start(&store, &tenant_b, &key_b, "worker-c", None).await {
            StartOutcome::Joined(job) => assert_eq!(job.id, second.job_id),
            other => panic!("expected to join its own job, got {other:?}"),
        }
    }
}

/// An expired lease is taken over only by a start of the same tenant, kind and key.
#[doc(hidden)]
pub async fn an_expired_job_is_never_stolen_by_another_tenant<S: FullJobStore>(store: S) {
    let lease = store.lease_duration();
    let base = unique("org");
    let pairs = colliding_identities(&base);
    let mut firsts = Vec::new();
    for [(tenant_a, key_a), _] in &pairs {
        firsts.push(created(&store, tenant_a, key_a).await);
    }
    expire(lease).await;
    for ([_, (tenant_b, key_b)], first) in pairs.iter().zip(&firsts) {
        match start(&store, tenant_b, key_b, "thief", None).await {
            StartOutcome::Created(job, grant) => {
                assert_ne!(job.id, first.job_id);
                assert_eq!(job.attempt, 1);
                assert_eq!(grant.owner, "thief");
            }
            other => panic!("{tenant_b:?}/{key_b:?} took over another tenant's job: {other:?}"),
        }
    }
    // The first tenant's own retry is the one that takes its job over.
    let [(tenant_a, key_a), _] = &pairs[0];
    match start(&store, tenant_a, key_a, "rescuer", None).await {
        StartOutcome::Stolen(job, _) => assert_eq!(job.id, firsts[0].job_id),
        other => panic!("expected Stolen, got {other:?}"),
    }
}

/// Retention: ended jobs go with their chunks and artifacts, unfinished ones
/// stay, and a purged key starts afresh.
#[doc(hidden)]
pub async fn purge_finished_removes_ended_jobs_only<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let done = created(&store, &tenant, "r:2026-01").await;
    store
        .append(&done, 0, Bytes::from_static(b"part"))
        .await
        .unwrap();
    store
        .finalize(&done, Bytes::from_static(b"report"))
        .await
        .unwrap();
    let failed = created(&store, &tenant, "r:2026-02").await;
    store.fail(&failed, "provider_5xx").await.unwrap();
    let running = created(&store, &tenant, "r:2026-03").await;
    // Nothing ended an hour ago.
    assert_eq!(
        store
            .purge_finished(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert!(store.purge_finished(Duration::ZERO).await.unwrap() >= 2);
    assert_eq!(store.job(&tenant, &done.job_id).await.unwrap(), None);
    assert_eq!(store.job(&tenant, &failed.job_id).await.unwrap(), None);
    assert_eq!(store.chunks(&tenant, &done.job_id, 0).await.unwrap(), None);
    assert_eq!(
        store.artifact(&tenant, &done.job_id).await.unwrap(),
        ArtifactLookup::Unknown
    );
    assert!(store.job(&tenant, &running.job_id).await.unwrap().is_some());
    match start(&store, &tenant, "r:2026-01", "w", None).await {
        StartOutcome::Created(job, _) => assert_ne!(job.id, done.job_id),
        other => panic!("a purged key starts afresh, got {other:?}"),
    }
    match start(&store, &tenant, "r:2026-03", "w", None).await {
        StartOutcome::Joined(job) => assert_eq!(job.id, running.job_id),
        other => panic!("the running job stays, got {other:?}"),
    }
}

/// Erasure: every job of one tenant goes, in flight or ended; its worker can
/// no longer write; other tenants keep theirs.
#[doc(hidden)]
pub async fn purge_tenant_erases_one_tenants_jobs_only<S: FullJobStore>(store: S) {
    let (gone, kept) = (unique("erased"), unique("kept"));
    let done = created(&store, &gone, "r:2026-01").await;
    store
        .finalize(&done, Bytes::from_static(b"x"))
        .await
        .unwrap();
    let running = created(&store, &gone, "r:2026-02").await;
    let other = created(&store, &kept, "r:2026-01").await;
    assert_eq!(store.purge_tenant(&gone).await.unwrap(), 2);
    assert_eq!(store.job(&gone, &done.job_id).await.unwrap(), None);
    assert_eq!(store.job(&gone, &running.job_id).await.unwrap(), None);
    assert!(matches!(
        store.append(&running, 0, Bytes::from_static(b"late")).await,
        Err(LeaseError::UnknownJob | LeaseError::LeaseLost)
    ));
    assert!(store.job(&kept, &other.job_id).await.unwrap().is_some());
    assert_eq!(store.purge_tenant(&gone).await.unwrap(), 0);
}

/// Weighted budgets: each start reserves its cost, over the allowance is
/// refused with when the period resets, a failed job returns its cost and a
/// completed one keeps it.
#[doc(hidden)]
pub async fn weighted_budget_reserves_costs_and_failure_returns_them<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let budget = Some(Budget::per_day(NonZeroU64::new(1000).unwrap()));
    let start_cost = |key: &'static str, cost: u64| {
        let tenant = tenant.clone();
        let store = &store;
        async move {
            store
                .start(&StartJob {
                    tenant: &tenant,
                    kind: "report",
                    key,
                    owner: "w",
                    budget,
                    cost,
                })
                .await
                .unwrap()
        }
    };
    let StartOutcome::Created(job, first) = start_cost("r:1", 600).await else {
        panic!("first")
    };
    assert_eq!(job.cost, 600);
    match start_cost("r:2", 600).await {
        StartOutcome::BudgetExhausted(reset) => {
            assert!(reset.at.ends_with("T00:00:00Z"), "{}", reset.at);
            assert!(
                reset.after <= Duration::from_secs(86_400),
                "{:?}",
                reset.after
            );
        }
        other => panic!("600 + 600 > 1000, got {other:?}"),
    }
    let StartOutcome::Created(_, small) = start_cost("r:3", 400).await else {
        panic!("600 + 400 fits")
    };
    store.fail(&first, "provider_5xx").await.unwrap();
    let StartOutcome::Created(_, second) = start_cost("r:2", 600).await else {
        panic!("the failed job's 600 came back")
    };
    store
        .finalize(&small, Bytes::from_static(b"x"))
        .await
        .unwrap();
    store
        .finalize(&second, Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert!(matches!(
        start_cost("r:4", 1).await,
        StartOutcome::BudgetExhausted(_)
    ));
}

/// Two kinds (two layers on one store) with the same key are two jobs.
#[doc(hidden)]
pub async fn kinds_are_separate_jobs<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let export = match start_kind(&store, &tenant, "export", "2026-08", "w", None).await {
        StartOutcome::Created(job, _) => job,
        other => panic!("expected Created, got {other:?}"),
    };
    assert_eq!(export.kind, "export");
    match start_kind(&store, &tenant, "import", "2026-08", "w", None).await {
        StartOutcome::Created(job, _) => {
            assert_ne!(job.id, export.id);
            assert_eq!(job.kind, "import");
        }
        other => panic!("a second kind joined the first one's job: {other:?}"),
    }
    // A kind and key whose concatenations coincide are still separate.
    match start_kind(&store, &tenant, "exp", "ort:2026-08", "w", None).await {
        StartOutcome::Created(job, _) => assert_ne!(job.id, export.id),
        other => panic!("expected Created, got {other:?}"),
    }
    match start_kind(&store, &tenant, "export", "2026-08", "w", None).await {
        StartOutcome::Joined(job) => assert_eq!(job.id, export.id),
        other => panic!("expected Joined, got {other:?}"),
    }
}

/// Helper: created.
pub async fn created<S: JobStore + ?Sized>(store: &S, tenant: &str, key: &str) -> LeaseGrant {
    match start(store, tenant, key, "worker-a", None).await {
        StartOutcome::Created(job, grant) => {
            assert_eq!(job.status, JobStatus::Queued);
            assert_eq!(grant.job_id, job.id);
            grant
        }
        other => panic!("expected Created, got {other:?}"),
    }
}

async fn expire(lease: Duration) {
    tokio::time::sleep(lease + Duration::from_millis(250)).await;
}

/// Conformance check: second start joins the same job.
#[doc(hidden)]
pub async fn second_start_joins_the_same_job<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "customer_health:2026-08").await;
    match start(&store, &tenant, "customer_health:2026-08", "worker-b", None).await {
        StartOutcome::Joined(job) => {
            assert_eq!(job.id, grant.job_id, "a join returns the existing job id");
            assert_eq!(job.lease_owner.as_deref(), Some("worker-a"));
        }
        other => panic!("expected Joined, got {other:?}"),
    }
}

/// Conformance check: a lease of `Duration::MAX` means forever: starting
/// neither panics nor overflows, and the job stays joined.
#[doc(hidden)]
pub async fn a_lease_of_duration_max_means_forever_and_never_panics<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "report:2026-08").await;
    match start(&store, &tenant, "report:2026-08", "worker-b", None).await {
        StartOutcome::Joined(job) => assert_eq!(job.id, grant.job_id),
        other => panic!("expected Joined, got {other:?}"),
    }
}

/// Conformance check: periods and tenants are separate jobs.
#[doc(hidden)]
pub async fn periods_and_tenants_are_separate_jobs<S: FullJobStore>(store: S) {
    let (acme, globex) = (unique("acme"), unique("globex"));
    let aug = created(&store, &acme, "customer_health:2026-08").await;
    let sep = created(&store, &acme, "customer_health:2026-09").await;
    let other = created(&store, &globex, "customer_health:2026-08").await;
    assert_ne!(aug.job_id, sep.job_id);
    assert_ne!(aug.job_id, other.job_id);
}

/// Conformance check: finalize completes once and start returns the artifact.
#[doc(hidden)]
pub async fn finalize_completes_once_and_start_returns_the_artifact<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    assert!(matches!(
        store.artifact(&tenant, &grant.job_id).await.unwrap(),
        ArtifactLookup::NotReady(JobStatus::Queued)
    ));
    let artifact_id = store
        .finalize(&grant, Bytes::from_static(b"report v1"))
        .await
        .unwrap();
    // A retried finalize by the same owner answers the same and stores nothing new.
    let again = store
        .finalize(&grant, Bytes::from_static(b"report v2"))
        .await
        .unwrap();
    assert_eq!(artifact_id, again);
    match start(&store, &tenant, "r:2026-08", "worker-b", None).await {
        StartOutcome::Completed(job) => {
            assert_eq!(job.id, grant.job_id);
            assert_eq!(job.status, JobStatus::Complete);
            assert_eq!(job.artifact_id.as_deref(), Some(artifact_id.as_str()));
        }
        other => panic!("expected Completed, got {other:?}"),
    }
    assert_eq!(
        store.artifact(&tenant, &grant.job_id).await.unwrap(),
        ArtifactLookup::Found(Bytes::from_static(b"report v1"))
    );
    assert_eq!(
        store.artifact("someone-else", &grant.job_id).await.unwrap(),
        ArtifactLookup::OtherTenant
    );
    assert_eq!(
        store.artifact(&tenant, "job_does_not_exist").await.unwrap(),
        ArtifactLookup::Unknown
    );
}

/// Conformance check: readers see only their tenants jobs.
#[doc(hidden)]
pub async fn readers_see_only_their_tenants_jobs<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    store
        .append(&grant, 0, Bytes::from_static(b"secret"))
        .await
        .unwrap();
    assert!(store.job(&tenant, &grant.job_id).await.unwrap().is_some());
    assert!(store.job("globex", &grant.job_id).await.unwrap().is_none());
    assert!(store
        .chunks("globex", &grant.job_id, 0)
        .await
        .unwrap()
        .is_none());
}

/// Conformance check: appends are numbered repeats are noops gaps refused.
#[doc(hidden)]
pub async fn appends_are_numbered_repeats_are_noops_gaps_refused<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    let add = |seq: u64, data: &'static [u8]| store.append(&grant, seq, Bytes::from_static(data));
    assert_eq!(add(0, b"a").await.unwrap(), Appended::Added { next_seq: 1 });
    assert_eq!(
        add(1, b"bb").await.unwrap(),
        Appended::Added { next_seq: 2 }
    );
    assert_eq!(
        add(1, b"XX").await.unwrap(),
        Appended::Duplicate { next_seq: 2 }
    );
    assert!(matches!(
        add(3, b"d").await,
        Err(LeaseError::SequenceGap { expected: 2 })
    ));
    assert_eq!(
        add(2, b"ccc").await.unwrap(),
        Appended::Added { next_seq: 3 }
    );
    let job = store.job(&tenant, &grant.job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.next_seq, job.cursor_len, job.status),
        (3, 6, JobStatus::Running)
    );
    let tail = store
        .chunks(&tenant, &grant.job_id, 1)
        .await
        .unwrap()
        .unwrap();
    let tail: Vec<(u64, &[u8])> = tail.iter().map(|c| (c.seq, &c.data[..])).collect();
    assert_eq!(tail, vec![(1, &b"bb"[..]), (2, &b"ccc"[..])]);
}

/// Conformance check: a foreign worker cannot write.
#[doc(hidden)]
pub async fn a_foreign_worker_cannot_write<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    let foreign = LeaseGrant {
        owner: "worker-z".into(),
        ..grant.clone()
    };
    assert!(matches!(
        store.heartbeat(&foreign).await,
        Err(LeaseError::LeaseLost)
    ));
    assert!(matches!(
        store.append(&foreign, 0, Bytes::from_static(b"x")).await,
        Err(LeaseError::LeaseLost)
    ));
    assert!(matches!(
        store.finalize(&foreign, Bytes::from_static(b"x")).await,
        Err(LeaseError::NotOwner)
    ));
    let forged = LeaseGrant {
        token: crate::store::FencingToken::new(grant.token.get() + 1_000),
        ..grant.clone()
    };
    assert!(matches!(
        store.finalize(&forged, Bytes::from_static(b"x")).await,
        Err(LeaseError::NotOwner)
    ));
    assert!(matches!(
        store.fail(&forged, "x").await,
        Err(LeaseError::NotOwner)
    ));
    // The owner is unaffected.
    store.heartbeat(&grant).await.unwrap();
    store
        .finalize(&grant, Bytes::from_static(b"ok"))
        .await
        .unwrap();
}

/// Conformance check: acquire hands over queued jobs only.
#[doc(hidden)]
pub async fn acquire_hands_over_queued_jobs_only<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    let worker = store
        .acquire(&grant.job_id, "external-1")
        .await
        .unwrap()
        .expect("queued job");
    assert!(worker.token > grant.token);
    let job = store.job(&tenant, &grant.job_id).await.unwrap().unwrap();
    assert_eq!(
        job.attempt, 1,
        "handing a queued job to a worker is not a takeover"
    );
    assert_eq!(
        store
            .job(&tenant, &grant.job_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        JobStatus::Running
    );
    // Running under a live lease: nobody else gets it, and the starter's token is fenced.
    assert!(store
        .acquire(&grant.job_id, "external-2")
        .await
        .unwrap()
        .is_none());
    assert!(matches!(
        store.heartbeat(&grant).await,
        Err(LeaseError::LeaseLost)
    ));
    store
        .finalize(&worker, Bytes::from_static(b"done"))
        .await
        .unwrap();
    // A worker that picks up a finished job does nothing.
    assert!(store
        .acquire(&grant.job_id, "external-3")
        .await
        .unwrap()
        .is_none());
    assert!(store
        .acquire("job_unknown", "external-3")
        .await
        .unwrap()
        .is_none());
}

/// Conformance check: failed jobs end and a new start creates a new job.
#[doc(hidden)]
pub async fn failed_jobs_end_and_a_new_start_creates_a_new_job<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    store.fail(&grant, "provider_5xx").await.unwrap();
    let job = store.job(&tenant, &grant.job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.status, job.error_code.as_deref()),
        (JobStatus::Failed, Some("provider_5xx"))
    );
    assert!(matches!(
        store.heartbeat(&grant).await,
        Err(LeaseError::LeaseLost)
    ));
    assert!(store.acquire(&grant.job_id, "w").await.unwrap().is_none());
    let retry = created(&store, &tenant, "r:2026-08").await;
    assert_ne!(retry.job_id, grant.job_id);
}

/// Needs a store with [`SHORT`] leases.
#[doc(hidden)]
pub async fn heartbeat_keeps_a_lease_alive<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    for _ in 0..4 {
        tokio::time::sleep(SHORT / 3).await;
        store.heartbeat(&grant).await.unwrap();
    }
    // Well past one lease length since start, yet still live: a join, not a steal.
    assert!(matches!(
        start(&store, &tenant, "r:2026-08", "worker-b", None).await,
        StartOutcome::Joined(_)
    ));
}

/// Needs a store with [`SHORT`] leases.
#[doc(hidden)]
pub async fn expired_lease_is_stolen_once_and_the_dead_owner_is_fenced<S: FullJobStore>(store: S) {
    let store = Arc::new(store);
    let tenant = unique("acme");
    let dead = created(&*store, &tenant, "r:2026-08").await;
    store
        .append(&dead, 0, Bytes::from_static(b"partial"))
        .await
        .unwrap();
    expire(SHORT).await;
    assert!(matches!(
        store.append(&dead, 1, Bytes::from_static(b"late")).await,
        Err(LeaseError::LeaseLost)
    ));
    assert!(matches!(
        store.heartbeat(&dead).await,
        Err(LeaseError::LeaseLost)
    ));
    let starts: Vec<_> = (0..50)
        .map(|i| {
            let (store, tenant) = (store.clone(), tenant.clone());
            tokio::spawn(async move {
                start(&*store, &tenant, "r:2026-08", &format!("worker-{i}"), None).await
            })
        })
        .collect();
    let mut stolen = Vec::new();
    for task in starts {
        match task.await.unwrap() {
            StartOutcome::Stolen(job, grant) => stolen.push((job, grant)),
            StartOutcome::Joined(job) => assert_eq!(job.id, dead.job_id),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(stolen.len(), 1, "stolen once, never twice");
    let (job, thief) = stolen.pop().unwrap();
    assert_eq!(job.id, dead.job_id, "the job keeps its id");
    assert_eq!(job.attempt, 2, "a takeover starts the second attempt");
    assert_eq!(
        (job.next_seq, job.cursor_len),
        (0, 0),
        "the dead worker's cursor is dropped"
    );
    assert!(thief.token > dead.token);
    assert!(matches!(
        store
            .finalize(&dead, Bytes::from_static(b"stale pdf"))
            .await,
        Err(LeaseError::NotOwner)
    ));
    store
        .finalize(&thief, Bytes::from_static(b"fresh pdf"))
        .await
        .unwrap();
    assert_eq!(
        store.artifact(&tenant, &job.id).await.unwrap(),
        ArtifactLookup::Found(Bytes::from_static(b"fresh pdf"))
    );
}

/// Needs a store with [`SHORT`] leases.
#[doc(hidden)]
pub async fn a_queued_job_is_handed_over_as_the_same_attempt_even_after_expiry<S: FullJobStore>(
    store: S,
) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    expire(SHORT).await;
    let worker = store
        .acquire(&grant.job_id, "w1")
        .await
        .unwrap()
        .expect("queued: available");
    assert!(worker.token > grant.token);
    let job = store.job(&tenant, &grant.job_id).await.unwrap().unwrap();
    assert_eq!((job.status, job.attempt), (JobStatus::Running, 1));
}

/// Needs a store with [`SHORT`] leases.
#[doc(hidden)]
pub async fn an_expired_running_job_is_acquired_as_a_new_attempt<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let grant = created(&store, &tenant, "r:2026-08").await;
    let first = store.acquire(&grant.job_id, "w1").await.unwrap().unwrap();
    store
        .append(&first, 0, Bytes::from_static(b"w1-0"))
        .await
        .unwrap();
    store
        .append(&first, 1, Bytes::from_static(b"w1-1"))
        .await
        .unwrap();
    expire(SHORT).await;
    let second = store
        .acquire(&grant.job_id, "w2")
        .await
        .unwrap()
        .expect("expired: available");
    assert!(second.token > first.token);
    let job = store.job(&tenant, &grant.job_id).await.unwrap().unwrap();
    assert_eq!((job.attempt, job.next_seq, job.cursor_len), (2, 0, 0));
    store
        .append(&second, 0, Bytes::from_static(b"w2-0"))
        .await
        .unwrap();
    store
        .append(&second, 1, Bytes::from_static(b"w2-1"))
        .await
        .unwrap();
    store
        .append(&second, 2, Bytes::from_static(b"w2-2"))
        .await
        .unwrap();
    // A reader that had w1's chunks 0 and 1 sees the attempt change, never a splice.
    let tail = store
        .chunks(&tenant, &grant.job_id, 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tail.len(), 1);
    assert_eq!((tail[0].attempt, &tail[0].data[..]), (2, &b"w2-2"[..]));
    assert!(matches!(
        store.append(&first, 2, Bytes::from_static(b"w1-2")).await,
        Err(LeaseError::LeaseLost)
    ));
}

/// Needs a store with [`SHORT`] leases.
#[doc(hidden)]
pub async fn stale_sweep_fails_abandoned_jobs_only<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let abandoned = created(&store, &tenant, "r:2026-07").await;
    expire(SHORT).await;
    let live = created(&store, &tenant, "r:2026-08").await;
    assert!(store.sweep_stale().await.unwrap() >= 1);
    let job = store
        .job(&tenant, &abandoned.job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (job.status, job.error_code.as_deref()),
        (JobStatus::Failed, Some("stale"))
    );
    assert_eq!(
        store
            .job(&tenant, &live.job_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        JobStatus::Queued
    );
    // A worker that picks the swept job up does nothing.
    assert!(store
        .acquire(&abandoned.job_id, "late-worker")
        .await
        .unwrap()
        .is_none());
    assert!(matches!(
        store.finalize(&abandoned, Bytes::from_static(b"x")).await,
        Err(LeaseError::NotOwner)
    ));
}

/// Needs a store with [`SHORT`] leases.
#[doc(hidden)]
pub async fn budget_counts_delivered_and_live_jobs_only<S: FullJobStore>(store: S) {
    let tenant = unique("acme");
    let budget = Some(Budget::per_month(NonZeroU64::new(2).unwrap()));
    let start_b = |key: &'static str| start(&store, &tenant, key, "w", budget);
    let StartOutcome::Created(_, done) = start_b("r:2026-01").await else {
        panic!("first")
    };
    store
        .finalize(&done, Bytes::from_static(b"x"))
        .await
        .unwrap();
    let StartOutcome::Created(_, live) = start_b("r:2026-02").await else {
        panic!("second")
    };
    assert!(matches!(
        start_b("r:2026-03").await,
        StartOutcome::BudgetExhausted(_)
    ));
    // Joining and reading a completed job are free.
    assert!(matches!(
        start_b("r:2026-02").await,
        StartOutcome::Joined(_)
    ));
    assert!(matches!(
        start_b("r:2026-01").await,
        StartOutcome::Completed(_)
    ));
    // A failed job gives its slot back.
    store.fail(&live, "provider_timeout").await.unwrap();
    let StartOutcome::Created(_, stalls) = start_b("r:2026-03").await else {
        panic!("third")
    };
    assert!(matches!(
        start_b("r:2026-04").await,
        StartOutcome::BudgetExhausted(_)
    ));
    // A stale in-flight job (lease expired, nobody behind it) does not count.
    store.heartbeat(&stalls).await.unwrap();
    expire(SHORT).await;
    let StartOutcome::Created(_, _) = start_b("r:2026-04").await else {
        panic!("fourth")
    };
    assert!(matches!(
        start_b("r:2026-05").await,
        StartOutcome::BudgetExhausted(_)
    ));
    // The operator reset gives the allowance back without deleting anything.
    assert!(
        store
            .reset_budget(&tenant, BudgetPeriod::Month)
            .await
            .unwrap()
            >= 2
    );
    assert!(matches!(
        start_b("r:2026-05").await,
        StartOutcome::Created(..)
    ));
    assert!(store.job(&tenant, &done.job_id).await.unwrap().is_some());
}

/// Needs a store with [`SHORT`] leases.
///
/// An expired job no longer counts, so another start takes its place in the
/// budget; a worker's `acquire` then revives it only if the budget still has
/// room, whether the job was queued (a hand-over) or running (a takeover).
/// Never two completed jobs under `per_month(1)`.
#[doc(hidden)]
pub async fn acquire_revives_an_expired_job_only_within_the_budget<S: FullJobStore>(store: S) {
    let budget = Some(Budget::per_month(NonZeroU64::new(1).unwrap()));
    // One tenant whose job A is still queued, one whose A a worker was running.
    let (queued, running) = (unique("acme"), unique("globex"));
    let mut expired = Vec::new();
    for (tenant, picked_up) in [(&queued, false), (&running, true)] {
        let StartOutcome::Created(_, a) = start(&store, tenant, "r:2026-01", "api", budget).await
        else {
            panic!("A is the month's one job")
        };
        if picked_up {
            store
                .acquire(&a.job_id, "w1")
                .await
                .unwrap()
                .expect("queued");
        }
        expired.push((tenant, a));
    }
    expire(SHORT).await;
    for (tenant, a) in expired {
        // A's lease expired and nobody swept it: it no longer counts, B is admitted.
        let StartOutcome::Created(_, b) = start(&store, tenant, "r:2026-02", "api", budget).await
        else {
            panic!("an expired job does not count: B is admitted")
        };
        let revived = store.acquire(&a.job_id, "w2").await.unwrap();
        // B's lease is only extended by a heartbeat: live now, it was live
        // when A was asked for, and held the month's one unit.
        if store.heartbeat(&b).await.is_ok() {
            assert!(
                revived.is_none(),
                "{tenant}: acquire revived A while B holds the budget"
            );
        }
        let mut completed = Vec::new();
        if let Some(worker) = &revived {
            if store
                .finalize(worker, Bytes::from_static(b"a"))
                .await
                .is_ok()
            {
                completed.push("A");
            }
        }
        if store.finalize(&b, Bytes::from_static(b"b")).await.is_ok() {
            completed.push("B");
        }
        assert!(
            completed.len() <= 1,
            "{tenant}: per_month(1) completed {completed:?}"
        );
        // With one delivered, A stays where it is: nothing revives it this month.
        if !completed.is_empty() {
            assert!(store.acquire(&a.job_id, "w3").await.unwrap().is_none());
        }
    }
    // With room in the budget, an expired job is acquired, and counts again.
    let tenant = unique("initech");
    let StartOutcome::Created(_, a) = start(&store, &tenant, "r:2026-01", "api", budget).await
    else {
        panic!("A is the month's one job")
    };
    expire(SHORT).await;
    let worker = store
        .acquire(&a.job_id, "w1")
        .await
        .unwrap()
        .expect("the budget has room: A is handed over");
    store
        .finalize(&worker, Bytes::from_static(b"a"))
        .await
        .unwrap();
    assert!(matches!(
        start(&store, &tenant, "r:2026-02", "api", budget).await,
        StartOutcome::BudgetExhausted(_)
    ));
}

/// Conformance check: concurrent starts cannot overshoot the budget.
#[doc(hidden)]
pub async fn concurrent_starts_cannot_overshoot_the_budget<S: FullJobStore>(store: S) {
    let store = Arc::new(store);
    let tenant = unique("acme");
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (store, tenant) = (store.clone(), tenant.clone());
            tokio::spawn(async move {
                let key = format!("r:period-{i}");
                start(
                    &*store,
                    &tenant,
                    &key,
                    "w",
                    Some(Budget::per_month(NonZeroU64::new(2).unwrap())),
                )
                .await
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        match task.await.unwrap() {
            StartOutcome::Created(..) => created += 1,
            StartOutcome::BudgetExhausted(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(created, 2);
}

/// Generates one `#[tokio::test]` per conformance check for a job store factory
/// (see the [module documentation](crate::lease::store::conformance)).
#[doc(hidden)]
#[macro_export]
macro_rules! job_store_conformance_tests {
    ($factory:path) => {
        $crate::job_store_conformance_tests!(@tests $factory, LONG:
            second_start_joins_the_same_job,
            periods_and_tenants_are_separate_jobs,
            finalize_completes_once_and_start_returns_the_artifact,
            readers_see_only_their_tenants_jobs,
            appends_are_numbered_repeats_are_noops_gaps_refused,
            a_foreign_worker_cannot_write,
            acquire_hands_over_queued_jobs_only,
            failed_jobs_end_and_a_new_start_creates_a_new_job,
            concurrent_starts_cannot_overshoot_the_budget,
            tenants_never_share_a_job_whatever_the_separators,
            kinds_are_separate_jobs,
            purge_finished_removes_ended_jobs_only,
            purge_tenant_erases_one_tenants_jobs_only,
            weighted_budget_reserves_costs_and_failure_returns_them,
        );
        $crate::job_store_conformance_tests!(@tests $factory, SHORT:
            heartbeat_keeps_a_lease_alive,
            expired_lease_is_stolen_once_and_the_dead_owner_is_fenced,
            an_expired_running_job_is_acquired_as_a_new_attempt,
            a_queued_job_is_handed_over_as_the_same_attempt_even_after_expiry,
            stale_sweep_fails_abandoned_jobs_only,
            budget_counts_delivered_and_live_jobs_only,
            acquire_revives_an_expired_job_only_within_the_budget,
            an_expired_job_is_never_stolen_by_another_tenant,
        );
        $crate::job_store_conformance_tests!(@tests $factory, FOREVER:
            a_lease_of_duration_max_means_forever_and_never_panics,
        );
    };
    (@tests $factory:path, $lease:ident: $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(store) = $factory($crate::lease::store::conformance::$lease).await {
                    $crate::lease::store::conformance::$name(store).await;
                }
            }
        )*
    };
}
