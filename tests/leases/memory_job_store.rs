//! The job store conformance suite against `MemoryJobStore`, and against it
//! behind an `AnyJobStore`.

use std::time::Duration;
use tower_idempotency::lease::store::MemoryJobStore;

async fn memory_job_store(lease: Duration) -> Option<MemoryJobStore> {
    Some(MemoryJobStore::builder().with_lease(lease).build())
}

tower_idempotency::job_store_conformance_tests!(memory_job_store);

/// The same suite through `AnyJobStore`, which must hand every call and its
/// arguments to the store behind it as they are.
mod any_job_store {
    use std::time::Duration;
    use tower_idempotency::lease::store::AnyJobStore;

    async fn any_memory_job_store(lease: Duration) -> Option<AnyJobStore> {
        super::memory_job_store(lease).await.map(AnyJobStore::new)
    }

    tower_idempotency::job_store_conformance_tests!(any_memory_job_store);
}

/// A clone of a builder is a second configuration: each `build` makes a
/// store of its own, with its own lease and its own jobs; a clone of a store
/// is the same store.
#[tokio::test]
async fn a_cloned_builder_builds_a_job_store_of_its_own() {
    use tower_idempotency::lease::store::conformance::start;
    use tower_idempotency::lease::store::{JobReader, JobStore, StartOutcome};
    let builder = MemoryJobStore::builder();
    let short = builder.clone().with_lease(Duration::from_secs(1));
    let (a, b) = (builder.build(), short.build());
    assert_eq!(a.lease_duration(), Duration::from_secs(45));
    assert_eq!(b.lease_duration(), Duration::from_secs(1));
    let StartOutcome::Created(job, _) = start(&a, "acme", "2026-01", "w1", None).await else {
        panic!("a new job");
    };
    assert!(b.job("acme", &job.id).await.unwrap().is_none());
    assert!(matches!(
        start(&b, "acme", "2026-01", "w2", None).await,
        StartOutcome::Created(..)
    ));
    assert!(matches!(
        start(&a.clone(), "acme", "2026-01", "w3", None).await,
        StartOutcome::Joined(_)
    ));
}
