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
use crate::store::waiters::{reconnect_pause, RECONNECT_FIRST};
use futures_util::StreamExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// The message meaning "records were purged"; never a record's name (those
/// start with the prefix).
pub(super) const PURGED: &str = "purged";

impl Inner {
    /// Starts the subscriber task unless one runs.
    pub(super) fn ensure_listener(self: &Arc<Self>) {
        self.waits
            .ensure_listener(|| subscribe(Arc::downgrade(self)));
    }
}

async fn subscribe(inner: Weak<Inner>) {
    let mut backoff = RECONNECT_FIRST;
    let mut node = 0usize;
    loop {
        let Some((client, channel)) = inner.upgrade().map(|inner| {
            let clients = &inner.subscribe_to;
            (clients[node % clients.len()].clone(), inner.channel.clone())
        }) else {
            return;
        };
        if let Ok(mut pubsub) = client.get_async_pubsub().await {
            if pubsub.subscribe(&channel).await.is_ok() {
                backoff = RECONNECT_FIRST;
                set_listening(&inner, true);
                let mut messages = pubsub.on_message();
                while let Some(message) = messages.next().await {
                    let Some(inner) = inner.upgrade() else { return };
                    let Ok(id) = message.get_payload::<String>() else {
                        continue;
                    };
                    inner.stats.notifications.fetch_add(1, Ordering::Relaxed);
                    if id == PURGED {
                        if let Some(cache) = &inner.near_cache {
                            cache.clear();
                        }
                        continue;
                    }
                    inner.waits.dispatch(&id);
                }
                // Messages published while reconnecting are lost; waiters'
                // re-checks notice those completions within a second.
                set_listening(&inner, false);
            }
        }
        node += 1;
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
