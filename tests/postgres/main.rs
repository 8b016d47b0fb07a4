//! `PostgresStore` and `PostgresJobStore` against a real server: the store
//! conformance suites, outages, several processes on one
//! database, and the soak. They fail, not skip, when `REQUIRE_POSTGRES=1`
//! (as `scripts/test` sets) and no server answers. One test binary; each
//! module is the file of the same name.
#![cfg(feature = "postgres")]

// Helpers the modules below share, declared once.
mod support;

#[cfg(feature = "test-util")]
#[path = "cancel_pg/main.rs"]
mod cancel_pg;
#[path = "faults_pg.rs"]
mod faults_pg;
#[cfg(all(feature = "leases", feature = "test-util"))]
#[path = "postgres_job_store.rs"]
mod postgres_job_store;
#[path = "postgres_processes.rs"]
mod postgres_processes;
#[cfg(feature = "test-util")]
#[path = "postgres_store/main.rs"]
mod postgres_store;
#[path = "soak.rs"]
mod soak;

#[path = "keep_alive_pg.rs"]
mod keep_alive_pg;

#[cfg(feature = "leases")]
#[path = "keep_alive_lease_pg.rs"]
mod keep_alive_lease_pg;
#[cfg(feature = "test-util")]
#[path = "stalls/postgres.rs"]
mod stalls;
