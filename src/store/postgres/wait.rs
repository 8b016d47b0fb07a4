//! Waiting for a request in progress: `LISTEN`/`NOTIFY` wake-ups (see
//! `store::waiters` for the re-checks).
//!
//! `complete` and `release` send `pg_notify(channel, key_id)` in a statement of
//! their own after their write (see `Sql::notify`). One dedicated connection per store (not a pooled one: deadpool's
//! connection tasks drop notifications) LISTENs on the store's channel.

use super::Inner;
use crate::store::shared;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
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
            shared::listen(Arc::downgrade(self), super::sql::PURGED, move |_| {
                let (connect, listen_sql) = (connect.clone(), listen_sql.clone());
                async move {
                    let (client, notifications) = connect().await.ok()?;
                    client.batch_execute(&listen_sql).await.ok()?;
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
    _client: tokio_postgres::Client,
    notifications: mpsc::UnboundedReceiver<String>,
}

impl shared::Messages for Notifications {
    fn next(&mut self) -> impl Future<Output = Option<String>> + Send {
        self.notifications.recv()
    }
}
