//! `RedisStore` against real servers: the store conformance suite on a
//! standalone server and on a Cluster, outages, restarts and network cuts,
//! server processes sharing one Cluster, and a primary killed under load.
//! They fail, not skip, when `REQUIRE_REDIS=1` (as `scripts/test` sets) and
//! the servers are not given. One test binary; each module is the file of
//! the same name beside this one.
#![cfg(feature = "redis")]

// The helpers they share are the tests package's library
// (`tower_idempotency_tests`, in tests/common/).

#[cfg(feature = "test-util")]
mod cancel_redis;
#[cfg(feature = "test-util")]
mod redis_eviction;
mod redis_failover;
mod redis_index;
#[cfg(feature = "test-util")]
mod redis_near_cache;
#[cfg(feature = "test-util")]
mod redis_phases;
mod redis_processes;
#[cfg(feature = "test-util")]
mod redis_store;

mod keep_alive_redis;
#[cfg(feature = "test-util")]
mod stalls;
