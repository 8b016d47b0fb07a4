//! `LeaseLayer` and its job stores: the layer, `MemoryJobStore`'s conformance
//! suite, and the reports demo (budgets, readers, workers, the binary). One
//! test binary; each module is the file of the same name.

// Helpers the modules below share, declared once.
mod http;
#[cfg(feature = "postgres")]
mod support;

/// The reports demo's test harness, shared by the `reports_*` modules.
#[macro_use]
mod reports;

#[path = "lease_layer.rs"]
mod lease_layer;
// The job store conformance suite is behind `test-util`.
#[cfg(feature = "test-util")]
#[path = "memory_job_store.rs"]
mod memory_job_store;
#[path = "reports_binary.rs"]
mod reports_binary;
#[path = "reports_budget.rs"]
mod reports_budget;
#[path = "reports_demo.rs"]
mod reports_demo;
#[path = "reports_readers.rs"]
mod reports_readers;
#[path = "reports_workers.rs"]
mod reports_workers;
