//! Counting the claimed runs still under way, so that an application can wait
//! for them before it exits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Counts the claimed handlers still running, so that a server can wait for
/// them before it exits.
///
/// Once a key is claimed, its handler runs to completion even if the caller
/// hangs up (see [`with_cancel_on_drop`](crate::IdempotencyLayer::with_cancel_on_drop)).
/// A server that stops accepting connections on `SIGTERM` should then wait for
/// [`idle`](Self::idle) before the runtime shuts down: a handler cut by the
/// process exit is exactly the half-done effect a retry must not repeat.
///
/// Clones count the same handlers; one `InFlight` may be shared by several
/// layers ([`with_in_flight`](crate::IdempotencyLayer::with_in_flight)).
///
/// ```
/// use tower_idempotency::{IdempotencyLayer, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = IdempotencyLayer::new(MemoryStore::new());
/// let in_flight = layer.in_flight();
/// // ... serve with `layer`, then on shutdown, after the server stopped:
/// in_flight.idle().await;
/// assert_eq!(in_flight.count(), 0);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct InFlight {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    count: AtomicUsize,
    idle: Notify,
}

impl InFlight {
    /// A counter of its own (layers start with one each).
    pub fn new() -> Self {
        Self::default()
    }

    /// Claimed handlers running now.
    pub fn count(&self) -> usize {
        self.shared.count.load(Ordering::Acquire)
    }

    /// Resolves once no claimed handler is running.
    pub async fn idle(&self) {
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            // Registered before the check: a handler ending in between wakes us.
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn enter(&self) -> Running {
        self.shared.count.fetch_add(1, Ordering::AcqRel);
        Running::new(self.shared.clone())
    }

    /// Counts one more, unless `max` are running already.
    pub(crate) fn try_enter(&self, max: usize) -> Option<Running> {
        self.shared
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Running::new(self.shared.clone()))
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("count", &self.count())
            .finish()
    }
}

/// One running claimed handler; counted until dropped.
pub(crate) struct Running(Arc<Shared>);

impl Running {
    fn new(shared: Arc<Shared>) -> Self {
        crate::telemetry::gauges::claims_in_flight(1.0);
        Self(shared)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        crate::telemetry::gauges::claims_in_flight(-1.0);
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
