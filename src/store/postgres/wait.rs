//! Waiting for a request in progress: `LISTEN`/`NOTIFY` wake-ups (see
//! `store::waiters` for the re-checks).
//!
//! `complete` and `release` send `pg_notify(channel, key_id)` in a statement of
//! their own after their write (see `Sql::notify`). One dedicated connection per store (not a pooled one: deadpool's
//! connection tasks drop notifications) LISTENs on the store's channel.
//!
//! A transactional completion notifies only when the key has waiters: each
//! waiter first registers on its instance's listener session (the key's
//! waiters' lock, held shared while it waits), which the completion's record
//! statement tries exclusive. Registered before its first check, a waiter is
//! either seen by the completion (and woken) or sees the record itself: the
//! completion holds the lock from its record statement until its commit is
//! visible, so a registration in between fails and is tried again at once,
//! up to [`REGISTER_FOR`]. A waiter that cannot register (no listener
//! session) re-checks on its backoff, as it would after a lost wake-up.

use super::Inner;
use crate::store::shared;
use crate::store::RecordKey;
use dashmap::DashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

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

impl shared::Listens for Inner {
    /// Starts the listener task if the store has a listener configuration and no
    /// task runs (for instance because the runtime that ran it shut down).
    fn ensure_listener(self: &Arc<Self>) {
        let Some(connect) = self.config.listener.clone() else {
            return;
        };
        self.waits.ensure_listener(|| {
            let listen_sql = self.sql.listen.clone();
            let session = self.session.client.clone();
            shared::listen(Arc::downgrade(self), super::sql::PURGED, move |_| {
                let (connect, listen_sql) = (connect.clone(), listen_sql.clone());
                let session = session.clone();
                async move {
                    let (client, notifications) = connect().await.ok()?;
                    client.batch_execute(&listen_sql).await.ok()?;
                    let client = Arc::new(client);
                    if let Ok(mut current) = session.lock() {
                        *current = Some(client.clone());
                    }
                    Some(Notifications {
                        _client: client,
                        notifications,
                    })
                }
            })
        });
    }
}

/// The listener connection's notifications; the client keeps it open.
struct Notifications {
    _client: Arc<tokio_postgres::Client>,
    notifications: mpsc::UnboundedReceiver<String>,
}

impl shared::Messages for Notifications {
    fn next(&mut self) -> impl Future<Output = Option<String>> + Send {
        self.notifications.recv()
    }
}

/// How long a waiter tries to register while completions of its key hold
/// the waiters' lock (each only from its record statement to its commit's
/// visibility): after that it waits unregistered, re-checking on its backoff.
pub(super) const REGISTER_FOR: Duration = Duration::from_millis(250);

/// The most keys this instance holds registered at once. Each is an entry in
/// the server's shared lock table (sized by `max_locks_per_transaction`, 64
/// per connection by default, and shared by every session): many keys waited
/// on at once must not fill it for everyone. Waiters of keys past the cap
/// re-check on their backoff instead.
pub(super) const MAX_REGISTERED: usize = 1024;

/// The listener's latest session (its client), where waiters register, and
/// the keys registered there: a key's waiters in this process share one
/// registration.
#[derive(Default)]
pub(super) struct Session {
    client: Arc<Mutex<Option<Arc<tokio_postgres::Client>>>>,
    registered: Arc<Slots>,
    /// Registrations under way (see `register_waiter`).
    pending: Arc<AtomicUsize>,
}

/// Each waited key's registration: made by one of its waiters while the
/// others wait on the slot's lock, then shared.
type Slots = DashMap<RecordKey, Arc<tokio::sync::Mutex<Weak<Registered>>>>;

/// A key's registration on a listener session, shared by its waiters in
/// this process: undone when the last drops it (on that session; a session
/// that ended took it with it).
pub(super) struct Registered {
    client: Arc<tokio_postgres::Client>,
    unregister: String,
    key: RecordKey,
    registered: Arc<Slots>,
}

/// Drops `key`'s slot if it holds no registration and no waiter is making
/// one (a waiter that is will keep or drop it in turn).
fn vacate(registered: &Slots, key: &RecordKey) {
    registered.remove_if(key, |_, slot| {
        slot.try_lock().is_ok_and(|made| made.strong_count() == 0)
    });
}

/// Vacates a key's slot when dropped (see [`vacate`]).
struct Vacate<'a>(&'a Slots, &'a RecordKey);

impl Drop for Vacate<'_> {
    fn drop(&mut self) {
        vacate(self.0, self.1);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        vacate(&self.registered, &self.key);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, sql, key) = (
            self.client.clone(),
            self.unregister.clone(),
            self.key.clone(),
        );
        runtime.spawn(async move {
            let (scope, k) = (key.scope().as_str(), key.key().as_str());
            let _ = client.execute(sql.as_str(), &[&scope, &k]).await;
        });
    }
}

/// A registration under way, in its own task (see `register_waiter`).
struct Registration {
    client: Arc<tokio_postgres::Client>,
    register: String,
    unregister: String,
    key: RecordKey,
    registered: Arc<Slots>,
    _pending: Pending,
}

impl Registration {
    /// Tries until a completion of the key lets go of its waiters' lock, for
    /// at most [`REGISTER_FOR`]. Each statement is awaited to its answer:
    /// the session's lock is then either held by the returned registration
    /// or not taken.
    async fn run(self) -> Option<Arc<Registered>> {
        let (scope, k) = (self.key.scope().as_str(), self.key.key().as_str());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&scope, &k];
        let deadline = tokio::time::Instant::now() + REGISTER_FOR;
        let mut pause = Duration::from_millis(1);
        loop {
            let row = self
                .client
                .query_one(self.register.as_str(), &params)
                .await
                .ok()?;
            if row.try_get::<_, bool>(0).ok()? {
                return Some(Arc::new(Registered {
                    client: self.client.clone(),
                    unregister: self.unregister.clone(),
                    key: self.key.clone(),
                    registered: self.registered.clone(),
                }));
            }
            // A completion of the key is committing: its commit is visible
            // as soon as its lock is free.
            if tokio::time::Instant::now() + pause >= deadline {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(16));
        }
    }
}

/// Counts a registration under way until it ends.
struct Pending(Arc<AtomicUsize>);

impl Pending {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Inner {
    /// Registers a waiter of `key` on the listener's session (see the
    /// module's documentation), before its first check, or joins the key's
    /// registration; `None` when there is no session, or it failed, or
    /// completions held the key's waiters' lock for [`REGISTER_FOR`], or
    /// [`MAX_REGISTERED`] keys are registered or being registered.
    pub(super) async fn register_waiter(&self, key: &RecordKey) -> Option<Arc<Registered>> {
        let session = &self.session;
        let deadline = tokio::time::Instant::now() + REGISTER_FOR;
        let slot = match session.registered.get(key) {
            Some(slot) => slot.clone(),
            None if session.registered.len() >= MAX_REGISTERED => return None,
            None => session.registered.entry(key.clone()).or_default().clone(),
        };
        // However this ends (joined, registered, given up, or dropped at
        // any await), a slot left empty goes once its lock is free.
        let _vacate = Vacate(&session.registered, key);
        // The key's other waiters wait here for the one registering.
        let mut made = tokio::time::timeout_at(deadline, slot.lock()).await.ok()?;
        if let Some(joined) = made.upgrade() {
            return Some(joined);
        }
        let registered = self.registering(key, session, deadline).await?;
        *made = Arc::downgrade(&registered);
        Some(registered)
    }

    /// One registration of `key`, by the waiter holding its slot.
    async fn registering(
        &self,
        key: &RecordKey,
        session: &Session,
        deadline: tokio::time::Instant,
    ) -> Option<Arc<Registered>> {
        if !self.waits.listening.load(Ordering::Acquire)
            || session.pending.load(Ordering::Acquire) >= MAX_REGISTERED
        {
            return None;
        }
        let client = session.client.lock().ok()?.clone()?;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let registration = Registration {
            client,
            register: self.sql.register_waiter.clone(),
            unregister: self.sql.unregister_waiter.clone(),
            key: key.clone(),
            registered: session.registered.clone(),
            _pending: Pending::new(&session.pending),
        };
        // In a task of its own, run to its end: a statement sent and then
        // abandoned (this waiter dropped, or its patience out) could still
        // take the lock on the session, with nobody left to undo it. A
        // registration nobody receives any more is undone when dropped.
        let (sent, received) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            if let Some(made) = registration.run().await {
                let _ = sent.send(made);
            }
        });
        tokio::time::timeout_at(deadline, received).await.ok()?.ok()
    }

    /// Keys registered on the listener's session by this instance's waiters.
    #[cfg(feature = "test-util")]
    pub(super) fn registered_keys(&self) -> usize {
        self.session.registered.len()
    }
}
