//! The job store conformance suite against `MemoryJobStore`.

use std::time::Duration;
use tower_idempotency::lease::store::MemoryJobStore;

async fn memory_job_store(lease: Duration) -> Option<MemoryJobStore> {
    Some(MemoryJobStore::new().with_lease(lease))
}

tower_idempotency::job_store_conformance_tests!(memory_job_store);

#[test]
#[should_panic(expected = "before cloning or using it")]
fn a_cloned_memory_job_store_cannot_be_configured_apart() {
    let store = tower_idempotency::lease::store::MemoryJobStore::new();
    let _handle = store.clone();
    let _ = store.with_lease(std::time::Duration::from_secs(1));
}
