//! Waiting for a request in progress: LISTEN/NOTIFY wake-ups plus coalesced,
//! backed-off re-checks.
//!
//! `complete` and `release` send `pg_notify(channel, key_id)` in their own
//! statement. One dedicated connection per store (not a pooled one: deadpool's
//! connection tasks drop notifications) LISTENs on the store's channel and wakes
//! the waiters of that key in this process through a `Notify`.
//!
//! A notification can be lost (the listener reconnecting, or not yet listening
//! when the first wait starts), so waiters also re-check the record on a backoff
//! of 250 ms, 500 ms, then every second. Re-checks are coalesced per key: a waiter
//! reuses a check that started within the last 250 ms (or, for its first check,
//! one that started after it registered), so any number of waiters on one key
//! issue at most about four queries a second between them.

use super::{backend, Inner};
use crate::store::StoreError;
use dashmap::DashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

/// The first re-check interval, and how fresh a shared re-check must be.
pub(super) const RECHECK_FIRST: Duration = Duration::from_millis(250);
/// The longest interval between re-checks.
pub(super) const RECHECK_MAX: Duration = Duration::from_secs(1);
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Opens the listener connection; notifications' payloads arrive on the receiver,
/// which closes when the connection does.
pub(super) type ListenerConnect = Arc<
    dyn Fn() -> BoxFuture<
            Result<
                (tokio_postgres::Client, mpsc::UnboundedReceiver<String>),
                tokio_postgres::Error,
            >,
        > + Send
        + Sync,
>;

pub(super) fn listener_connect<T>(config: tokio_postgres::Config, tls: T) -> ListenerConnect
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    Arc::new(move || {
        let (config, tls) = (config.clone(), tls.clone());
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                // Drives the connection (including the LISTEN's reply) and forwards
                // notifications; ends when the connection fails or the client is dropped.
                while let Some(message) =
                    std::future::poll_fn(|cx| connection.poll_message(cx)).await
                {
                    match message {
                        Ok(AsyncMessage::Notification(n)) => {
                            if tx.send(n.payload().to_owned()).is_err() {
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            });
            Ok((client, rx))
        })
    })
}

/// The waiting side of one store.
#[derive(Default)]
pub(super) struct Waits {
    watches: DashMap<String, Arc<Watch>>,
    pub(super) listening: AtomicBool,
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
pub(super) struct Watch {
    pub(super) notify: Notify,
    last_check: tokio::sync::Mutex<Option<Check>>,
}

#[derive(Clone)]
pub(super) struct Check {
    /// When the query was sent: its answer describes the record at or after this.
    pub(super) started: Instant,
    /// When the answer arrived: the database measured `outcome` before this.
    pub(super) finished: Instant,
    /// The lock's remaining time, if the key is still in progress.
    pub(super) outcome: Result<Option<Duration>, Arc<str>>,
}

/// A waiter's registration; the last one out removes the key's entry.
pub(super) struct Registration<'a> {
    waits: &'a Waits,
    id: String,
    pub(super) watch: Arc<Watch>,
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
    pub(super) fn register(&self, id: String) -> Registration<'_> {
        let watch = self.watches.entry(id.clone()).or_default().clone();
        Registration {
            waits: self,
            id,
            watch,
        }
    }

    fn dispatch(&self, id: &str) {
        if let Some(watch) = self.watches.get(id) {
            watch.notify.notify_waiters();
        }
    }

    /// Keys with waiters in this process.
    #[cfg(feature = "test-util")]
    pub(super) fn watched_keys(&self) -> usize {
        self.watches.len()
    }
}

impl Inner {
    /// Starts the listener task if the store has a listener configuration and no
    /// task runs (for instance because the runtime that ran it shut down).
    pub(super) fn ensure_listener(self: &Arc<Self>) {
        if self.waits.listening.load(Ordering::Acquire) {
            return;
        }
        let Some(connect) = self.config.listener.clone() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut task) = self.waits.listener_task.lock() else {
            return;
        };
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let listen_sql = self.sql.listen.clone();
        let spawned = runtime.spawn(listen(Arc::downgrade(self), connect, listen_sql));
        *task = Some(spawned.abort_handle());
    }

    /// A re-check shared by the key's waiters: reuses a check that started at or
    /// after `fresh_after`, otherwise queries the lock's remaining time. Returns
    /// when the answer arrived, and the remaining time the database measured
    /// before that (so `arrived + remaining` is at or just after the expiry).
    pub(super) async fn shared_check(
        &self,
        watch: &Watch,
        fresh_after: Instant,
        query: impl Future<Output = Result<Option<Duration>, StoreError>>,
    ) -> Result<(Instant, Option<Duration>), StoreError> {
        let mut last = watch.last_check.lock().await;
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
        let remaining = check.outcome.map_err(|message| backend(&*message))?;
        Ok((check.finished, remaining))
    }
}

async fn listen(inner: Weak<Inner>, connect: ListenerConnect, listen_sql: String) {
    let mut backoff = RECONNECT_FIRST;
    loop {
        if let Ok((client, mut notifications)) = connect().await {
            if client.batch_execute(&listen_sql).await.is_ok() {
                backoff = RECONNECT_FIRST;
                set_listening(&inner, true);
                while let Some(id) = notifications.recv().await {
                    let Some(inner) = inner.upgrade() else { return };
                    inner.stats.notifications.fetch_add(1, Ordering::Relaxed);
                    inner.waits.dispatch(&id);
                }
                // Notifications sent while reconnecting are lost; waiters' re-checks
                // notice those completions within a second.
                set_listening(&inner, false);
            }
        }
        if inner.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RECONNECT_MAX);
    }
}

fn set_listening(inner: &Weak<Inner>, on: bool) {
    if let Some(inner) = inner.upgrade() {
        inner.waits.listening.store(on, Ordering::Release);
    }
}
