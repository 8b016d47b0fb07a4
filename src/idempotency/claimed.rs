//! What keeps a claimed handler's effects single: it runs to completion
//! whatever the caller does, its claim is kept alive while it runs, and the
//! application can wait for the ones still running before it exits.

use crate::store::{FencingToken, RecordKey, Store, StoreError};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
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
        Running(self.shared.clone())
    }

    /// Counts one more, unless `max` are running already.
    pub(crate) fn try_enter(&self, max: usize) -> Option<Running> {
        self.shared
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Running(self.shared.clone()))
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

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// How often a running claim is extended: a third of the lock, so two
/// extensions in a row may fail (a slow store) before the lock runs out.
fn heartbeat_interval(lock_timeout: Duration) -> Duration {
    (lock_timeout / 3).max(Duration::from_millis(1))
}

/// Extends the claim at a fraction of its lock until it finds the claim gone.
async fn heartbeat(store: Arc<dyn Store>, record: RecordKey, token: FencingToken) {
    let interval = heartbeat_interval(store.lock_timeout());
    loop {
        tokio::time::sleep(interval).await;
        match store.extend(&record, token).await {
            Ok(()) => {}
            Err(StoreError::ClaimLost) => {
                // Its completion is fenced by the same token and will be refused.
                tracing::warn!("the claim was lost while its handler ran");
                return;
            }
            // A store hiccup: the next beat tries again before the lock runs out.
            Err(error) => tracing::warn!(%error, "extending a running claim failed"),
        }
    }
}

pin_project! {
    /// Runs `work` while a heartbeat keeps its claim alive. The heartbeat is
    /// made (and boxed) only once the work has to wait: most work finishes on
    /// its first poll, and then never pays for it.
    pub(crate) struct KeptAlive<W> {
        #[pin]
        work: W,
        heartbeat: Heartbeat,
    }
}

enum Heartbeat {
    /// Not started: what it needs.
    Ready(Arc<dyn Store>, RecordKey, FencingToken),
    Beating(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// It stopped (the claim was lost), or is being started.
    Stopped,
}

/// `work`, with its claim extended while it runs.
pub(crate) fn kept_alive<W: Future>(
    work: W,
    store: Arc<dyn Store>,
    record: RecordKey,
    token: FencingToken,
) -> KeptAlive<W> {
    KeptAlive {
        work,
        heartbeat: Heartbeat::Ready(store, record, token),
    }
}

impl<W: Future> Future for KeptAlive<W> {
    type Output = W::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<W::Output> {
        let this = self.project();
        if let Poll::Ready(output) = this.work.poll(cx) {
            return Poll::Ready(output);
        }
        if let Heartbeat::Ready(..) = this.heartbeat {
            if let Heartbeat::Ready(store, record, token) =
                std::mem::replace(this.heartbeat, Heartbeat::Stopped)
            {
                *this.heartbeat = Heartbeat::Beating(Box::pin(heartbeat(store, record, token)));
            }
        }
        if let Heartbeat::Beating(beat) = this.heartbeat {
            if beat.as_mut().poll(cx).is_ready() {
                *this.heartbeat = Heartbeat::Stopped;
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_are_a_third_of_the_lock_and_never_zero() {
        assert_eq!(
            heartbeat_interval(Duration::from_secs(9)),
            Duration::from_secs(3)
        );
        assert_eq!(heartbeat_interval(Duration::ZERO), Duration::from_millis(1));
        let _ = heartbeat_interval(Duration::MAX);
    }

    #[tokio::test]
    async fn idle_waits_for_every_running_handler() {
        let in_flight = InFlight::new();
        let (a, b) = (in_flight.enter(), in_flight.enter());
        assert_eq!(in_flight.count(), 2);
        let waiter = tokio::spawn({
            let in_flight = in_flight.clone();
            async move { in_flight.idle().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.unwrap();
        assert_eq!(in_flight.count(), 0);
    }
}
