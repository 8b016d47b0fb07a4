//! The one rule for every duration option: clamped where it is set, so that
//! no value can become a panic (an `Instant` overflow), a timestamp the
//! database refuses (and so a completion that fails and a retry that runs
//! again), or a lock so short that a live claim is taken over.

use std::time::Duration;

/// The longest any duration option is: longer ones, `Duration::MAX` ("forever")
/// included, mean 100 years.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The shortest lock timeout or lease: shorter ones would expire between two
/// heartbeats and let a duplicate take over a live claim.
pub(crate) const SHORTEST_LOCK: Duration = Duration::from_millis(100);

/// The shortest retention: a completed request answers its retries for at
/// least this long (zero would run every retry again).
pub(crate) const SHORTEST_RETENTION: Duration = Duration::from_millis(100);

/// `d` within `[min, FOREVER]`.
pub(crate) fn clamp(d: Duration, min: Duration) -> Duration {
    d.clamp(min, FOREVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_clamped_to_the_rule() {
        assert_eq!(clamp(Duration::MAX, Duration::ZERO), FOREVER);
        assert_eq!(clamp(Duration::ZERO, SHORTEST_LOCK), SHORTEST_LOCK);
        assert_eq!(
            clamp(Duration::from_secs(5), SHORTEST_LOCK),
            Duration::from_secs(5)
        );
        // A hundred years from now is a valid PostgreSQL timestamp and Instant.
        assert!(std::time::Instant::now().checked_add(FOREVER).is_some());
    }
}
