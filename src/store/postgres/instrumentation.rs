//! Counters and hooks for tests and benchmarks of `PostgresStore` (feature
//! `test-util`): round-trip budgets, single-flight sharing, the listener.
//! Not needed to use the store, and not covered by semver.

use super::PostgresStore;
use crate::store::shared::shared_instrumentation;
use std::sync::atomic::Ordering;

// Kept off the store's documentation page, where they would come before
// what users call: test machinery, listed here.
#[doc(hidden)]
impl PostgresStore {
    /// The text of the `begin` and `complete` statements, for benchmarks that
    /// replay them elsewhere (pgbench).
    pub fn begin_and_complete_sql(&self) -> (&str, &str) {
        (&self.inner.sql.begin, &self.inner.sql.complete)
    }

    /// How often `begin` re-ran its statement after a concurrent commit.
    pub fn begin_retries(&self) -> u64 {
        self.inner.stats.begin_retries.load(Ordering::Relaxed)
    }

    /// `begin` calls that waited for a concurrent identical call's query.
    pub fn begins_followed(&self) -> u64 {
        self.inner.stats.begins_followed.load(Ordering::Relaxed)
    }

    /// `begin` calls answered by a concurrent identical call's query.
    pub fn begins_shared(&self) -> u64 {
        self.inner.stats.begins_shared.load(Ordering::Relaxed)
    }

    /// `begin` queries still taking followers (waiting for a pooled connection).
    pub fn begins_open(&self) -> usize {
        self.inner.flights.open()
    }

    /// Keys this instance's waiters hold registered on the listener's
    /// session (one per key, shared by its waiters).
    pub fn registered_keys(&self) -> usize {
        self.inner.registered_keys()
    }
}

shared_instrumentation!(PostgresStore, "listener");
