//! The job store conformance suite against `MemoryJobStore`.

mod job_conformance;

use std::time::Duration;
use tower_idempotency::store::MemoryJobStore;

async fn memory_job_store(lease: Duration) -> Option<MemoryJobStore> {
    Some(MemoryJobStore::new().with_lease(lease))
}

job_store_conformance_tests!(memory_job_store);
