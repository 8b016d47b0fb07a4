//! PostgreSQL killed and restarted under load. Alone in its binary: it stops
//! the server every other PostgreSQL test uses, and cargo runs test binaries
//! one after another, so no other test sees the outage. It fails, not skips,
//! when `REQUIRE_POSTGRES=1` (as `scripts/test` sets) and no server answers.
#![cfg(feature = "postgres")]

mod faults_pg_restart;
