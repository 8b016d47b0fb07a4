//! `RedisStore` against real servers: the store conformance suite on a
//! standalone server and on a Cluster, outages, restarts and network cuts,
//! server processes sharing one Cluster, and a primary killed under load.
//! They fail, not skip, when `REQUIRE_REDIS=1` (as `scripts/test` sets) and
//! the servers are not given. One test binary; each module is the file of
//! the same name.
#![cfg(feature = "redis")]

// Helpers the modules below share, declared once.
mod support;

#[cfg(feature = "test-util")]
#[path = "cancel_redis.rs"]
mod cancel_redis;
#[cfg(feature = "test-util")]
#[path = "redis_eviction.rs"]
mod redis_eviction;
#[path = "redis_failover.rs"]
mod redis_failover;
#[cfg(feature = "test-util")]
#[path = "redis_near_cache.rs"]
mod redis_near_cache;
#[path = "redis_processes.rs"]
mod redis_processes;
#[cfg(feature = "test-util")]
#[path = "redis_store.rs"]
mod redis_store;

#[path = "keep_alive_redis.rs"]
mod keep_alive_redis;
#[cfg(feature = "test-util")]
#[path = "stalls/redis.rs"]
mod stalls;
