//! Records held per scope, for [`MemoryStoreBuilder::with_scope_quota`](super::MemoryStoreBuilder::with_scope_quota).

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::num::NonZeroUsize;

/// How many records each scope holds, and the most it may.
///
/// Lock order: a `records` shard may be held while this map is locked (a new
/// record is admitted under its shard lock), never the other way round.
pub(super) struct ScopeQuota {
    quota: usize,
    /// Only scopes holding at least one record have an entry.
    held: DashMap<Box<[u8]>, usize>,
}

impl ScopeQuota {
    pub(super) fn new(quota: NonZeroUsize) -> Self {
        Self {
            quota: quota.get(),
            held: DashMap::new(),
        }
    }

    /// The most records a scope may hold.
    pub(super) fn quota(&self) -> usize {
        self.quota
    }

    /// Whether `scope` may hold one more record.
    pub(super) fn has_room(&self, scope: &[u8]) -> bool {
        self.held(scope) < self.quota
    }

    /// Counts one more record of `scope`; `false` (nothing counted) when the
    /// scope is at its quota.
    pub(super) fn admit(&self, scope: &[u8]) -> bool {
        let room = |held: &mut usize| {
            let admitted = *held < self.quota;
            *held += usize::from(admitted);
            admitted
        };
        // The common case without allocating the scope's copy.
        if let Some(mut held) = self.held.get_mut(scope) {
            return room(&mut held);
        }
        match self.held.entry(scope.into()) {
            Entry::Occupied(mut held) => room(held.get_mut()),
            Entry::Vacant(vacant) => {
                let mut held = 0;
                let admitted = room(&mut held);
                if admitted {
                    vacant.insert(held);
                }
                admitted
            }
        }
    }

    /// Counts one record of `scope` fewer.
    pub(super) fn forget(&self, scope: &[u8]) {
        if let Some(mut held) = self.held.get_mut(scope) {
            *held = held.saturating_sub(1);
        }
        // A scope that holds nothing takes no memory.
        self.held.remove_if(scope, |_, held| *held == 0);
    }

    /// Scopes with an entry: those holding at least one record.
    #[cfg(test)]
    pub(super) fn scopes(&self) -> usize {
        self.held.len()
    }

    /// Records `scope` holds now.
    pub(super) fn held(&self, scope: &[u8]) -> usize {
        self.held.get(scope).map_or(0, |held| *held)
    }
}
