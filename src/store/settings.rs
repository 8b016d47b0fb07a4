//! The timings every store's builder sets, clamped in one place, and the
//! one operation timeout every call to a backend runs under.
//!
//! Record stores and job stores (`lease/store`, a floor above) share them, so
//! a duration means the same on every store and no builder clamps it its own
//! way.

use super::{StoreError, Timings};
use crate::limits;
use std::future::Future;
use std::time::Duration;

/// The default tombstone window: a week past the retention. Clients retry
/// for days (queues drained after an outage, weekend batch jobs, retry
/// schedules of up to three days), and a tombstone costs a few dozen bytes,
/// so a week covers them with room to spare (`docs/idempotency.md`).
pub(crate) const DEFAULT_TOMBSTONE: Duration = Duration::from_secs(7 * 24 * 3600);

/// A store's durations, each clamped as it is set ([`limits`]).
///
/// The job stores take the lock timeout as their lease and have no
/// retention; the in-process stores have no operation timeout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    retention: Duration,
    /// How long a tombstone outlives the retention; zero: none.
    tombstone: Duration,
    lock_timeout: Duration,
    operation_timeout: Duration,
}

impl Settings {
    /// The record stores' defaults: 24 h retention, 7 days of tombstones
    /// after it, 10 s locks, 5 s operations.
    pub(crate) const RECORDS: Self = Self {
        retention: Duration::from_secs(24 * 3600),
        tombstone: DEFAULT_TOMBSTONE,
        lock_timeout: Duration::from_secs(10),
        operation_timeout: Duration::from_secs(5),
    };

    /// The job stores' defaults: 45 s leases, 5 s operations.
    #[cfg_attr(not(feature = "leases"), allow(dead_code))]
    pub(crate) const JOBS: Self = Self {
        lock_timeout: Duration::from_secs(45),
        ..Self::RECORDS
    };

    /// How long a completed record is kept: between 100 ms and 100 years.
    pub(crate) fn set_retention(&mut self, retention: Duration) {
        self.retention = limits::clamp(retention, limits::SHORTEST_RETENTION);
    }

    /// How long a tombstone outlives the retention: zero (no tombstones) to
    /// 100 years.
    pub(crate) fn set_tombstone(&mut self, tombstone: Duration) {
        self.tombstone = limits::clamp(tombstone, Duration::ZERO);
    }

    /// How long a claim (or a job's lease) holds without an extension: between
    /// 100 ms and 100 years, so it never expires between two heartbeats.
    pub(crate) fn set_lock_timeout(&mut self, lock_timeout: Duration) {
        self.lock_timeout = limits::clamp(lock_timeout, limits::SHORTEST_LOCK);
    }

    /// The longest one operation may take: at most 100 years.
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn set_operation_timeout(&mut self, timeout: Duration) {
        self.operation_timeout = limits::clamp(timeout, Duration::ZERO);
    }

    pub(crate) fn retention(&self) -> Duration {
        self.retention
    }

    pub(crate) fn tombstone(&self) -> Duration {
        self.tombstone
    }

    pub(crate) fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    /// What a record store tells the layer ([`Store::timings`](super::Store::timings)).
    pub(crate) fn timings(&self) -> Timings {
        let timings = Timings::new(self.lock_timeout).with_retention(self.retention);
        match self.tombstone.is_zero() {
            true => timings,
            false => timings.with_tombstone(self.tombstone),
        }
    }

    /// Runs `op` within the operation timeout, so that a hung backend fails
    /// in bounded time (the layer's `503`) and never hangs a request;
    /// `operation` names what timed out in the error ("PostgreSQL operation").
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub(crate) async fn timed<T, E: TimedOut>(
        &self,
        operation: &str,
        op: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let limit = self.operation_timeout;
        match tokio::time::timeout(limit, op).await {
            Ok(result) => result,
            Err(_) => Err(E::timed_out(format!(
                "{operation} timed out after {limit:?}"
            ))),
        }
    }
}

/// An error an operation that ran out of time fails with: the backend's
/// failure, carrying `message`.
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
pub(crate) trait TimedOut {
    fn timed_out(message: String) -> Self;
}

impl TimedOut for StoreError {
    fn timed_out(message: String) -> Self {
        StoreError::Backend(message.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_is_clamped_to_the_rule() {
        let mut settings = Settings::RECORDS;
        settings.set_retention(Duration::ZERO);
        settings.set_lock_timeout(Duration::ZERO);
        settings.set_operation_timeout(Duration::MAX);
        settings.set_tombstone(Duration::MAX);
        assert_eq!(settings.tombstone(), limits::FOREVER);
        settings.set_tombstone(Duration::ZERO);
        assert_eq!(settings.timings().tombstone, None);
        assert_eq!(settings.retention(), limits::SHORTEST_RETENTION);
        assert_eq!(settings.lock_timeout(), limits::SHORTEST_LOCK);
        assert_eq!(settings.operation_timeout(), limits::FOREVER);
        settings.set_retention(Duration::MAX);
        settings.set_lock_timeout(Duration::MAX);
        settings.set_operation_timeout(Duration::ZERO);
        assert_eq!(settings.retention(), limits::FOREVER);
        assert_eq!(settings.lock_timeout(), limits::FOREVER);
        assert_eq!(settings.operation_timeout(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_operation_past_its_timeout_fails_naming_it() {
        let mut settings = Settings::RECORDS;
        settings.set_operation_timeout(Duration::from_secs(1));
        let slow = settings.timed("Test operation", async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<_, StoreError>(())
        });
        match slow.await {
            Err(StoreError::Backend(e)) => {
                assert_eq!(e.to_string(), "Test operation timed out after 1s");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        let quick = settings.timed("Test operation", async { Ok::<_, StoreError>(7) });
        assert_eq!(quick.await.unwrap(), 7);
    }
}
