//! The subscriber: one pub/sub connection per store receives the record names that
//! `complete` and `release` publish, and wakes this process's waiters (see
//! `store::waiters` for the re-checks that cover lost messages).
//!
//! On a Cluster, `PUBLISH` reaches every node, so the subscriber listens on
//! any one of them, and moves to the next when that one fails.
//!
//! `purge_scope` publishes [`PURGED`] on the same channel: every instance
//! then forgets its near cache.

use super::Inner;
use crate::store::shared;
use futures_util::StreamExt;
use std::sync::Arc;

/// The message meaning "records were purged"; never a record's name (those
/// start with the prefix).
pub(super) const PURGED: &str = "purged";

impl shared::Listens for Inner {
    /// Starts the subscriber task unless one runs.
    fn ensure_listener(self: &Arc<Self>) {
        self.waits.ensure_listener(|| {
            // Each connection goes to the next node: one that failed is skipped.
            let mut node = 0usize;
            shared::listen(Arc::downgrade(self), PURGED, move |inner: &Inner| {
                let clients = &inner.subscribe_to;
                let client = clients[node % clients.len()].clone();
                let channel = inner.channel.clone();
                node += 1;
                async move {
                    let mut pubsub = client.get_async_pubsub().await.ok()?;
                    pubsub.subscribe(&channel).await.ok()?;
                    Some(Messages(pubsub.into_on_message()))
                }
            })
        });
    }
}

/// The subscriber's messages.
struct Messages(redis::aio::PubSubStream);

impl shared::Messages for Messages {
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Ok(id) = self.0.next().await?.get_payload::<String>() {
                return Some(id);
            }
        }
    }
}
