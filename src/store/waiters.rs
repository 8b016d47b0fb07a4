//! Waiting for a request in progress in a shared store: wake-ups pushed by the
//! store (PostgreSQL `NOTIFY`, Redis pub/sub) plus coalesced, backed-off
//! re-checks.
//!
//! `complete` and `release` publish the record's id. One connection per store
//! receives those messages and wakes the waiters of that key in this process
//! through a `Notify`.
//!
//! A message can be lost (the receiving connection reconnecting, or not yet
//! subscribed when the first wait starts), so waiters also re-check the record
//! on a backoff of 250 ms, 500 ms, then every second. Re-checks are coalesced per
//! key: a waiter reuses a check that started within the last 250 ms (or, for its
//! first check, one that started after it registered), so any number of waiters
//! on one key issue at most about four queries a second between them.

use crate::store::StoreError;
use dashmap::DashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// The first re-check interval, and how fresh a shared re-check must be.
pub(crate) const RECHECK_FIRST: Duration = Duration::from_millis(250);
/// The longest interval between re-checks.
pub(crate) const RECHECK_MAX: Duration = Duration::from_secs(1);
/// Reconnection backoff of the connection that receives wake-ups.
pub(crate) const RECONNECT_FIRST: Duration = Duration::from_millis(100);
pub(crate) const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The waiting side of one store.
#[derive(Default)]
pub(crate) struct Waits {
    watches: DashMap<String, Arc<Watch>>,
    /// Whether the receiving connection is up and subscribed.
    pub(crate) listening: AtomicBool,
    listener_task: Mutex<Option<AbortHandle>>,
}

impl Drop for Waits {
    fn drop(&mut self) {
        let task = self.listener_task.get_mut().map(Option::take);
        if let Ok(Some(task)) = task {
            task.abort();
        }
    }
}

/// Waiters of one key in this process.
#[derive(Default)]
pub(crate) struct Watch {
    notify: Notify,
    last_check: tokio::sync::Mutex<Option<Check>>,
}

#[derive(Clone)]
struct Check {
    /// When the query was sent: its answer describes the record at or after this.
    started: Instant,
    /// When the answer arrived: the store measured `outcome` before this.
    finished: Instant,
    /// The lock's remaining time, if the key is still in progress.
    outcome: Result<Option<Duration>, Arc<str>>,
}

/// A waiter's registration; the last one out removes the key's entry.
struct Registration<'a> {
    waits: &'a Waits,
    id: String,
    watch: Arc<Watch>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        // The map and this registration hold the only references: nobody else waits.
        self.waits.watches.remove_if(&self.id, |_, watch| {
            Arc::ptr_eq(watch, &self.watch) && Arc::strong_count(watch) == 2
        });
    }
}

impl Waits {
    fn register(&self, id: String) -> Registration<'_> {
        let watch = self.watches.entry(id.clone()).or_default().clone();
        Registration {
            waits: self,
            id,
            watch,
        }
    }

    /// Wakes the waiters of record `id` in this process.
    pub(crate) fn dispatch(&self, id: &str) {
        if let Some(watch) = self.watches.get(id) {
            watch.notify.notify_waiters();
        }
    }

    /// Keys with waiters in this process.
    #[cfg(feature = "test-util")]
    pub(crate) fn watched_keys(&self) -> usize {
        self.watches.len()
    }

    /// Runs the receiving task `start` makes, unless one runs already (it
    /// stops when its runtime shuts down; the next wait starts another).
    pub(crate) fn ensure_listener<F>(&self, start: impl FnOnce() -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if self.listening.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut task) = self.listener_task.lock() else {
            return;
        };
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        *task = Some(runtime.spawn(start()).abort_handle());
    }

    /// Waits until record `id` is no longer in progress, its lock ran out, or
    /// `timeout` elapsed. `lock_remaining` asks the store how long the lock
    /// has left (`None`: not in progress), as a duration on the store's clock.
    pub(crate) async fn wait<Q, F>(
        &self,
        id: String,
        timeout: Duration,
        lock_remaining: Q,
    ) -> Result<(), StoreError>
    where
        Q: Fn() -> F,
        F: Future<Output = Result<Option<Duration>, StoreError>>,
    {
        let registration = self.register(id);
        let watch = &registration.watch;
        let notified = watch.notify.notified();
        tokio::pin!(notified);
        // Registered before the first check: a completion after the check started
        // wakes this waiter, one before it is seen by the check.
        notified.as_mut().enable();
        let registered = Instant::now();
        let (answered, remaining) = watch.shared_check(registered, lock_remaining()).await?;
        let Some(remaining) = remaining else {
            return Ok(());
        };
        // Not past the lock's expiry, as a duration the store measured (at most a
        // network delay after it, never before it: `begin` then takes the claim over).
        let deadline = (registered + timeout).min(answered + remaining);
        let mut backoff = RECHECK_FIRST;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            let next = (now + backoff).min(deadline);
            if tokio::time::timeout_at(next, notified.as_mut())
                .await
                .is_ok()
            {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            // Shared with every waiter of this key that re-checks within 250 ms.
            let fresh_after = now.checked_sub(RECHECK_FIRST).unwrap_or(now);
            let (_, remaining) = watch.shared_check(fresh_after, lock_remaining()).await?;
            if remaining.is_none() {
                watch.notify.notify_waiters();
                return Ok(());
            }
            backoff = (backoff * 2).min(RECHECK_MAX);
        }
    }
}

impl Watch {
    /// A re-check shared by the key's waiters: reuses a check that started at or
    /// after `fresh_after`, otherwise runs `query`. Returns when the answer
    /// arrived, and the remaining time the store measured before that (so
    /// `arrived + remaining` is at or just after the expiry).
    async fn shared_check(
        &self,
        fresh_after: Instant,
        query: impl Future<Output = Result<Option<Duration>, StoreError>>,
    ) -> Result<(Instant, Option<Duration>), StoreError> {
        let mut last = self.last_check.lock().await;
        let check = match &*last {
            Some(check) if check.started >= fresh_after => check.clone(),
            _ => {
                let started = Instant::now();
                let outcome = query.await.map_err(|e| Arc::<str>::from(e.to_string()));
                let finished = Instant::now();
                let check = Check {
                    started,
                    finished,
                    outcome,
                };
                *last = Some(check.clone());
                check
            }
        };
        drop(last);
        let remaining = check
            .outcome
            .map_err(|message| StoreError::Backend(message.to_string().into()))?;
        Ok((check.finished, remaining))
    }
}

/// Sleeps for `backoff` and doubles it, up to [`RECONNECT_MAX`].
pub(crate) async fn reconnect_pause(backoff: &mut Duration) {
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(RECONNECT_MAX);
}
