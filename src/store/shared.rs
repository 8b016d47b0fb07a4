//! What the stores shared by many instances (PostgreSQL, Redis) keep alike
//! around their own statements: the settings, the waiters and their listener
//! state, the near cache, and the counters; and the builder setters that configure them.

use super::near_cache::{Cache, NearCache};
use super::settings::Settings;
use super::waiters::{reconnect_pause, Waits, RECONNECT_FIRST};
use super::{Begin, RecordKey, StoreError};
use crate::fingerprint::RequestFingerprint;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The part of a shared store that is not its statements.
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    pub(crate) waits: Waits,
    /// Completed records this instance read (see [`NearCache`]).
    pub(crate) near_cache: Option<Cache>,
    round_trips: AtomicU64,
    notifications: AtomicU64,
}

impl Shared {
    pub(crate) fn new(settings: Settings, near_cache: NearCache) -> Self {
        Self {
            settings,
            waits: Waits::default(),
            near_cache: Cache::new(near_cache),
            round_trips: AtomicU64::new(0),
            notifications: AtomicU64::new(0),
        }
    }

    pub(crate) fn count_round_trips(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
    }

    /// The near cache, while purges on other instances reach this one (the
    /// listener is connected).
    pub(crate) fn near(&self) -> Option<&Cache> {
        let cache = self.near_cache.as_ref()?;
        self.waits
            .listening
            .load(Ordering::Acquire)
            .then_some(cache)
    }

    /// The near cache's epoch before a read (see [`Cache::insert`]).
    pub(crate) fn near_epoch(&self) -> u64 {
        self.near_cache.as_ref().map_or(0, Cache::epoch)
    }

    /// What `begin` answers from memory for `fingerprint` (the canonical one:
    /// only it is comparable across instances), with no round trip.
    pub(crate) fn known(&self, key: &RecordKey, fingerprint: &[u8; 32]) -> Option<Begin> {
        self.near().and_then(|cache| cache.get(key, fingerprint))
    }

    /// A message on the store's channel: `purged` forgets the near cache,
    /// any other is the id of a record whose waiters wake.
    fn received(&self, id: &str, purged: &str) {
        self.notifications.fetch_add(1, Ordering::Relaxed);
        if id == purged {
            if let Some(cache) = &self.near_cache {
                cache.clear();
            }
            return;
        }
        self.waits.dispatch(id);
    }

    fn set_listening(&self, on: bool) {
        // Purges announced while not listening were missed: forget everything.
        if let Some(cache) = &self.near_cache {
            cache.clear();
        }
        self.waits.listening.store(on, Ordering::Release);
    }

    /// The timing fields of a store's or builder's `Debug`.
    pub(crate) fn timing_fields<'c, 'a, 'b>(
        settings: &Settings,
        f: &'c mut fmt::DebugStruct<'a, 'b>,
    ) -> &'c mut fmt::DebugStruct<'a, 'b> {
        f.field("retention", &settings.retention())
            .field("tombstone", &settings.tombstone())
            .field("lock_timeout", &settings.lock_timeout())
            .field("operation_timeout", &settings.operation_timeout())
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn notifications(&self) -> u64 {
        self.notifications.load(Ordering::Relaxed)
    }
}

/// A shared store's `Inner`: its [`Shared`], and the listener it starts.
pub(crate) trait Listens: Deref<Target = Shared> {
    /// Starts the listener task unless one runs (or none is configured).
    fn ensure_listener(self: &Arc<Self>);
}

/// `begin` on a shared store: the listener is started, and a record the near
/// cache knows for the canonical fingerprint (only it is comparable across
/// instances) is answered with no round trip; `ask` asks the backend.
pub(crate) async fn begin<'r, I: Listens, F>(
    inner: &Arc<I>,
    key: &RecordKey,
    request: &'r RequestFingerprint<'_>,
    ask: impl FnOnce(&'r [u8; 32]) -> F,
) -> Result<Begin, StoreError>
where
    F: Future<Output = Result<Begin, StoreError>>,
{
    inner.ensure_listener();
    let fingerprint = request.fingerprint().as_bytes();
    if let Some(known) = inner.known(key, fingerprint) {
        return Ok(known);
    }
    ask(fingerprint).await
}

/// `wait` on a shared store: for record `id`, woken by the listener (started
/// here) and re-checking `lock_remaining` on a backoff.
pub(crate) async fn wait<I: Listens, F>(
    inner: &Arc<I>,
    id: String,
    timeout: Duration,
    lock_remaining: impl Fn() -> F,
) -> Result<(), StoreError>
where
    F: Future<Output = Result<Option<Duration>, StoreError>>,
{
    inner.ensure_listener();
    inner.waits.wait(id, timeout, lock_remaining).await
}

/// A store's `Inner`, holding its [`Shared`] in field `shared`, reads as
/// the [`Shared`] it embeds: `inner.settings`, `inner.near()`.
macro_rules! embeds_shared {
    ($inner:ty) => {
        impl ::std::ops::Deref for $inner {
            type Target = $crate::store::shared::Shared;

            fn deref(&self) -> &Self::Target {
                &self.shared
            }
        }
    };
}
pub(crate) use embeds_shared;

/// A listener connection's messages (record ids, or the purge marker).
pub(crate) trait Messages {
    /// The next message; `None` once the connection is gone.
    fn next(&mut self) -> impl Future<Output = Option<String>> + Send;
}

/// The listener task of a shared store: `connect` opens a connection and
/// subscribes (`None` when it failed), its messages are handed to the store,
/// and a lost connection is reopened after a backoff. Ends once the store is
/// dropped.
pub(crate) async fn listen<I, C, M>(inner: Weak<I>, purged: &str, mut connect: impl FnMut(&I) -> C)
where
    I: Deref<Target = Shared>,
    C: Future<Output = Option<M>>,
    M: Messages,
{
    let mut backoff = RECONNECT_FIRST;
    loop {
        let Some(connecting) = inner.upgrade().map(|inner| connect(&inner)) else {
            return;
        };
        if let Some(mut messages) = connecting.await {
            backoff = RECONNECT_FIRST;
            set_listening(&inner, true);
            while let Some(id) = messages.next().await {
                let Some(inner) = inner.upgrade() else { return };
                inner.received(&id, purged);
            }
            // Messages sent while reconnecting are lost; waiters' re-checks
            // notice those completions within a second.
            set_listening(&inner, false);
        }
        if inner.strong_count() == 0 {
            return;
        }
        reconnect_pause(&mut backoff).await;
    }
}

fn set_listening<I: Deref<Target = Shared>>(inner: &Weak<I>, on: bool) {
    if let Some(inner) = inner.upgrade() {
        inner.set_listening(on);
    }
}

/// The counters and listener hooks both shared stores expose to tests and
/// benchmarks (feature `test-util`), on `$store` whose `inner` holds a
/// [`Shared`] and an `ensure_listener`.
#[cfg(feature = "test-util")]
macro_rules! shared_instrumentation {
    ($store:ty, $listener:literal) => {
        // Kept off the store's documentation page, where they would come before
        // what users call: test machinery, listed here.
        #[doc(hidden)]
        impl $store {
            /// Statements, commands and scripts sent to the backend so far
            /// (preparations or script loads that missed a cache count too).
            /// For tests of the round-trip budget.
            pub fn round_trips(&self) -> u64 {
                self.inner.shared.round_trips()
            }

            #[doc = concat!("Wake-up messages the ", $listener, " received.")]
            pub fn notifications_received(&self) -> u64 {
                self.inner.shared.notifications()
            }

            #[doc = concat!("Whether the ", $listener, " connection is up and listening.")]
            pub fn is_listening(&self) -> bool {
                let listening = &self.inner.shared.waits.listening;
                listening.load(::std::sync::atomic::Ordering::Acquire)
            }

            #[doc = concat!("Starts the ", $listener, " (it otherwise starts with the first operation).")]
            pub fn start_listener(&self) {
                $crate::store::shared::Listens::ensure_listener(&self.inner);
            }

            /// Keys that waiters in this process are waiting on.
            pub fn watched_keys(&self) -> usize {
                self.inner.shared.waits.watched_keys()
            }
        }
    };
}
#[cfg(feature = "test-util")]
pub(crate) use shared_instrumentation;

/// The builder setters of the settings and near cache both shared stores
/// have, in a builder with `settings: Settings` and `config.near_cache`.
/// `$clock` is whose clock times records, `$operation` what an operation's
/// time includes, `$listener` what carries purges to this instance.
macro_rules! shared_setters {
    (clock: $clock:literal, operation: $operation:literal, listener: $listener:literal) => {
        /// How long a completed response is replayed (default 24 h), from its
        #[doc = concat!("completion on ", $clock, " clock.")]
        ///
        /// Clamped to between 100 ms and 100 years (`Duration::MAX` means
        /// "forever": 100 years).
        pub fn with_retention(mut self, retention: ::std::time::Duration) -> Self {
            self.settings.set_retention(retention);
            self
        }

        /// How long a completed key's tombstone outlives its retention (default
        #[doc = concat!("7 days), on ", $clock, " clock: its scope, key and")]
        /// fingerprint, without the response. Until it expires, a retry of the
        /// same request is refused (`410 idempotency_key_expired`) instead of
        /// running again, and another request under the key is key reuse.
        /// `Duration::ZERO` keeps no tombstones: the key is free once the
        /// retention has passed.
        ///
        /// At most 100 years.
        pub fn with_tombstone(mut self, tombstone: ::std::time::Duration) -> Self {
            self.settings.set_tombstone(tombstone);
            self
        }

        /// How long a claim holds its key unless it is extended (default 10 s), on
        #[doc = concat!($clock, " clock.")]
        ///
        /// The layer extends a claim every twentieth of this while its handler
        /// runs, so it bounds how long a *dead* owner (a crashed process, a
        /// lost network) blocks its key, not how long a handler may take. A
        /// store stall of up to 9/10 of this, less one round trip, is survived
        /// by a running claim: extensions go out every 1/20 of it, each
        /// time-boxed to a third of the claim's remaining life (counted from
        /// the last successful extension's sending) and retried at once when
        /// it fails or times out (`docs/idempotency.md`, *Locks and
        /// retention*, derives the bound).
        ///
        /// Clamped to between 100 ms and 100 years.
        pub fn with_lock_timeout(mut self, lock_timeout: ::std::time::Duration) -> Self {
            self.settings.set_lock_timeout(lock_timeout);
            self
        }

        #[doc = concat!("The longest one operation may take (default 5 s), ", $operation, ";")]
        /// slower ones fail with
        /// [`StoreError::Backend`](crate::store::StoreError::Backend). At most
        /// 100 years.
        pub fn with_operation_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.settings.set_operation_timeout(timeout);
            self
        }

        /// The near cache of completed records (default: 16 MiB, entries trusted
        /// for 10 s; [`NearCache::disabled`](crate::store::NearCache::disabled)
        /// turns it off).
        ///
        /// A retry of a record this instance already read from the backend
        /// is then answered from memory, with no round trip. Records are kept
        /// when read, not when written: most keys are never retried, and
        /// keeping each completion would cost every request for the few that
        /// are. It is used only while the
        #[doc = concat!($listener, " is connected, because that is how a")]
        /// [`purge_scope`](crate::store::Maintenance::purge_scope) on another
        /// instance reaches this one: while it is not, every `begin` asks the
        /// backend.
        pub fn with_near_cache(mut self, near_cache: crate::store::NearCache) -> Self {
            self.config.near_cache = near_cache;
            self
        }
    };
}
pub(crate) use shared_setters;
