//! Counters for tests and benchmarks of `RedisStore` (feature `test-util`).
//! Not needed to use the store, and not covered by semver.

use super::RedisStore;
use std::sync::atomic::Ordering;

// Kept off the store's documentation page, where they would come before
// what users call: test machinery, listed here.
#[doc(hidden)]
impl RedisStore {
    /// Commands and scripts sent to the server so far (a script the server
    /// had to load first counts once). For tests of the round-trip budget.
    pub fn round_trips(&self) -> u64 {
        self.inner.stats.round_trips.load(Ordering::Relaxed)
    }

    /// Wake-up messages the subscriber received.
    pub fn notifications_received(&self) -> u64 {
        self.inner.stats.notifications.load(Ordering::Relaxed)
    }

    /// Whether the subscriber connection is up and subscribed.
    pub fn is_listening(&self) -> bool {
        self.inner.waits.listening.load(Ordering::Acquire)
    }

    /// Starts the subscriber (it otherwise starts with the first operation).
    pub fn start_listener(&self) {
        self.inner.ensure_listener();
    }

    /// Keys that waiters in this process are waiting on.
    pub fn watched_keys(&self) -> usize {
        self.inner.waits.watched_keys()
    }
}
