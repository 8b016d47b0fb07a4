//! [`MemoryStoreBuilder`]: a [`MemoryStore`](super::MemoryStore)'s
//! configuration, consumed by `build` (beside the store it makes).

use crate::store::settings::Settings;
use std::num::NonZeroUsize;
use std::time::Duration;

/// The default [`MemoryStoreBuilder::with_capacity`].
const DEFAULT_CAPACITY: NonZeroUsize = NonZeroUsize::new(1_000_000).unwrap();

/// The configuration of a [`MemoryStore`](super::MemoryStore), from
/// [`MemoryStore::builder`](super::MemoryStore::builder): every option is set
/// here, and [`build`](Self::build) makes the store.
///
/// A clone of a builder builds a second store of its own, sharing no records
/// with the first.
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
///
/// const CAPACITY: NonZeroUsize = NonZeroUsize::new(10_000).unwrap();
///
/// let store = MemoryStore::builder()
///     .with_lock_timeout(Duration::from_secs(30))
///     .with_capacity(CAPACITY)
///     .build();
/// assert!(store.is_empty());
/// ```
#[must_use = "a builder does nothing until `build` makes the store"]
#[derive(Clone)]
pub struct MemoryStoreBuilder {
    pub(super) settings: Settings,
    pub(super) capacity: NonZeroUsize,
    pub(super) scope_quota: Option<NonZeroUsize>,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        Self {
            settings: Settings::RECORDS,
            capacity: DEFAULT_CAPACITY,
            scope_quota: None,
        }
    }
}

impl std::fmt::Debug for MemoryStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStoreBuilder")
            .field("retention", &self.settings.retention())
            .field("tombstone", &self.settings.tombstone())
            .field("lock_timeout", &self.settings.lock_timeout())
            .field("capacity", &self.capacity)
            .field("scope_quota", &self.scope_quota)
            .finish()
    }
}

impl MemoryStoreBuilder {
    /// How long a completed response is replayed (default 24 h). Clamped to
    /// between 100 ms and 100 years (`Duration::MAX` means "forever": 100 years).
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.settings.set_retention(retention);
        self
    }

    /// How long a completed key's tombstone outlives its retention (default
    /// 7 days): its scope, key and local digest, packed without the response
    /// (about a hundred bytes with its map slot). Until it expires, a retry of
    /// the same request is refused (`410 idempotency_key_expired`) instead of
    /// running again, and another request under the key is key reuse.
    /// `Duration::ZERO` keeps no tombstones: the key is free once the retention
    /// has passed. Tombstones count against the
    /// [capacity](Self::with_capacity) and the [scope quota](Self::with_scope_quota)
    /// like records. At most 100 years.
    pub fn with_tombstone(mut self, tombstone: Duration) -> Self {
        self.settings.set_tombstone(tombstone);
        self
    }

    /// How long a claim holds its key unless it is extended (default 10 s).
    ///
    /// The layer extends a claim every twentieth of this while its handler
    /// runs, so it bounds how long a *dead* owner blocks its key (a claim left
    /// behind by a process that stopped), not how long a handler may take.
    ///
    /// Clamped to between 100 ms and 100 years.
    pub fn with_lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.settings.set_lock_timeout(lock_timeout);
        self
    }

    /// The most records held at once, in progress or completed (default 1 000 000).
    ///
    /// A full store refuses new keys with
    /// [`MemoryStoreError::Full`](crate::store::MemoryStoreError::Full) (inside
    /// [`StoreError::Backend`](crate::store::StoreError::Backend)) (`503`) until
    /// records expire; see [`with_scope_quota`](Self::with_scope_quota) for
    /// keeping one scope from filling it.
    ///
    /// Never zero (a store that refuses every key), so a `NonZeroUsize`:
    /// `NonZeroUsize::new(100_000).unwrap()` in a `const`, checked when
    /// compiling, or `NonZeroUsize::try_from(n)?` for a number read at startup.
    pub fn with_capacity(mut self, capacity: NonZeroUsize) -> Self {
        self.capacity = capacity;
        self
    }

    /// The most records one scope (tenant) holds at once, in progress or
    /// completed (default: no quota, only the capacity).
    ///
    /// A scope at its quota is refused new keys with
    /// [`StoreError::QuotaExceeded`](crate::store::StoreError::QuotaExceeded) (the
    /// layer answers `429 idempotency_quota_exceeded`) until its own records
    /// expire or are purged; its replays and every other scope are
    /// unaffected. Without a quota, one scope sending fresh keys can fill the
    /// whole capacity and lock every other scope out for the retention period.
    ///
    /// Sizing: a scope needs about its peak rate of new keys times the
    /// retention (100 new orders a minute kept 24 h: 144 000). With capacity
    /// `c` and quota `q`, at least `c / q` scopes can reach their quota before
    /// the store is full, so choose `q` no larger than `c` divided by the
    /// number of scopes that must keep working when others misbehave.
    /// Counting costs one more map update per new or removed record.
    ///
    /// Never zero (every new key refused), so a `NonZeroUsize`, as for
    /// [`with_capacity`](Self::with_capacity).
    pub fn with_scope_quota(mut self, quota: NonZeroUsize) -> Self {
        self.scope_quota = Some(quota);
        self
    }
}
