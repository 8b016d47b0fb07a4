//! `LeaseLayer` and its job stores: the layer, `MemoryJobStore`'s conformance
//! suite, and the reports demo (budgets, readers, workers, the binary). One
//! test binary; each module is the file (or folder) of the same name beside
//! this one.

// The helpers they share are the tests package's library
// (`tower_idempotency_tests`, in tests/common/).

/// The reports demo's test harness, shared by the `reports_*` modules.
#[macro_use]
mod reports;

mod lease_layer;
// The job store conformance suite is behind `test-util`.
#[cfg(feature = "test-util")]
mod memory_job_store;
mod reports_as_written;
mod reports_binary;
mod reports_budget;
mod reports_demo;
mod reports_readers;
mod reports_workers;
