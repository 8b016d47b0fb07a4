//! Counters for tests and benchmarks of `RedisStore` (feature `test-util`).
//! Not needed to use the store, and not covered by semver.

use super::RedisStore;
use crate::store::shared::shared_instrumentation;

shared_instrumentation!(RedisStore, "subscriber");
