//! `PostgresStore` and `PostgresJobStore` against a real server: the store
//! conformance suites, outages, several processes on one
//! database, and the soak. They fail, not skip, when `REQUIRE_POSTGRES=1`
//! (as `scripts/test` sets) and no server answers. One test binary; each
//! module is the file (or folder) of the same name beside this one.
#![cfg(feature = "postgres")]

// The helpers they share are the tests package's library
// (`tower_idempotency_tests`, in tests/common/).

#[cfg(feature = "test-util")]
mod cancel_pg;
mod faults_pg;
#[cfg(all(feature = "leases", feature = "test-util"))]
mod postgres_job_store;
mod postgres_processes;
#[cfg(feature = "test-util")]
mod postgres_store;
mod soak;

mod keep_alive_pg;

#[cfg(feature = "leases")]
mod keep_alive_lease_pg;
#[cfg(feature = "test-util")]
mod stalls;
