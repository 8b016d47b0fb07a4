//! Waiting for a request in progress: `LISTEN`/`NOTIFY` wake-ups (see
//! `store::waiters` for the re-checks).
//!
//! `complete` and `release` send `pg_notify(channel, key_id)` in a statement of
//! their own after their write (see `Sql::notify`). One dedicated connection per store (not a pooled one: deadpool's
//! connection tasks drop notifications) LISTENs on the store's channel.

use super::Inner;
use crate::store::waiters::{reconnect_pause, RECONNECT_FIRST};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
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

impl Inner {
    /// Starts the listener task if the store has a listener configuration and no
    /// task runs (for instance because the runtime that ran it shut down).
    pub(super) fn ensure_listener(self: &Arc<Self>) {
        let Some(connect) = self.config.listener.clone() else {
            return;
        };
        self.waits.ensure_listener(|| {
            let listen_sql = self.sql.listen.clone();
            listen(Arc::downgrade(self), connect, listen_sql)
        });
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
                    if id == super::sql::PURGED {
                        if let Some(cache) = &inner.near_cache {
                            cache.clear();
                        }
                        continue;
                    }
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
        reconnect_pause(&mut backoff).await;
    }
}

fn set_listening(inner: &Weak<Inner>, on: bool) {
    if let Some(inner) = inner.upgrade() {
        // Purges announced while not listening were missed: forget everything.
        if let Some(cache) = &inner.near_cache {
            cache.clear();
        }
        inner.waits.listening.store(on, Ordering::Release);
    }
}
