//! `MemoryStore`'s recovery points: a second map, by record id, of each
//! request's recorded phase outputs.
//!
//! A crash here is the process's, which takes the map with it: phases only
//! let a retry resume within one process (after a handler's error, a panic,
//! a stalled claim taken over). Checked and written under the record's shard
//! lock, so a takeover (which needs its write lock) cannot come in between.

use super::record::{saturate, Id, Nanos};
use super::{MemoryStore, MemoryStoreError};
use crate::fingerprint::LocalDigest;
use crate::store::phases::{check_phase, phases_of_another_request};
use crate::store::{FencingToken, PhaseRecord, PhaseStore, RecordKey, RecordedPhases, StoreError};
use bytes::Bytes;
use std::sync::atomic::Ordering;

/// One request's recorded phases.
pub(super) struct Phased {
    pub(super) key: RecordKey,
    /// The request that recorded them: another request of the key sees none.
    local: LocalDigest,
    outputs: RecordedPhases,
    /// Kept until then (the lock timeout plus the retention plus the
    /// tombstone window from the last record), unless the record completes
    /// first.
    pub(super) deadline: Nanos,
}

/// How long a request's phases are kept from its last record or heartbeat.
fn phases_kept(settings: &crate::store::settings::Settings) -> std::time::Duration {
    settings
        .lock_timeout()
        .saturating_add(settings.retention())
        .saturating_add(settings.tombstone())
}

impl MemoryStore {
    /// Renews the unexpired phases of `key`'s request `local`, under its
    /// claim's record lock (a heartbeat).
    pub(super) fn keep_phases(&self, id: &Id, key: &RecordKey, local: LocalDigest, now: Nanos) {
        if let Some(mut p) = self.shared.phases.get_mut(id) {
            if p.key == *key && p.local == local && p.deadline > now {
                let kept = now.saturating_add(saturate(phases_kept(&self.shared.settings)));
                p.deadline = p.deadline.max(kept);
            }
        }
    }

    /// The claim `token` holds of `key`: its request's local digest.
    fn owner<T>(
        &self,
        key: &RecordKey,
        token: FencingToken,
        then: impl FnOnce(LocalDigest) -> T,
    ) -> Result<T, StoreError> {
        let id = self.shared.ids.of(key);
        let record = self.shared.records.get(&id);
        match record {
            Some(r) if r.token == token && r.in_progress().is_some() && r.is_record_of(key) => {
                // Still under the record's read lock.
                Ok(then(r.local()))
            }
            _ => Err(StoreError::ClaimLost),
        }
    }
}

impl PhaseStore for MemoryStore {
    async fn phases(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<RecordedPhases, StoreError> {
        let id = self.shared.ids.of(key);
        let now = self.now();
        self.owner(key, token, |local| match self.shared.phases.get(&id) {
            Some(p) if p.key == *key && p.local == local && p.deadline > now => p.outputs.clone(),
            _ => RecordedPhases::new(),
        })
    }

    async fn record_phase(
        &self,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        output: Bytes,
    ) -> Result<PhaseRecord, StoreError> {
        check_phase(phase, &output)?;
        let id = self.shared.ids.of(key);
        let settings = &self.shared.settings;
        let keep = phases_kept(settings);
        let now = self.now();
        let deadline = now.saturating_add(saturate(keep));
        // The store's capacity bounds the requests with phases too: a new
        // one first drops what has expired, then is refused if still full
        // (released requests nobody retries keep theirs until they expire).
        let phases = &self.shared.phases;
        if !phases.contains_key(&id) && phases.len() >= self.shared.capacity {
            phases.retain(|_, p| p.deadline > now);
            if phases.len() >= self.shared.capacity {
                return Err(StoreError::Backend(Box::new(MemoryStoreError::Full)));
            }
        }
        let recorded = self.owner(key, token, |local| {
            self.shared.phased.store(true, Ordering::Relaxed);
            let mut entry = self.shared.phases.entry(id).or_insert_with(|| Phased {
                key: key.clone(),
                local,
                outputs: RecordedPhases::new(),
                deadline,
            });
            if entry.key != *key || entry.local != local {
                // Another request's (or another key's with this id): kept for
                // its retry until it expires.
                if entry.deadline > now {
                    return Err(phases_of_another_request());
                }
                *entry = Phased {
                    key: key.clone(),
                    local,
                    outputs: RecordedPhases::new(),
                    deadline,
                };
            }
            if let Some(first) = entry.outputs.get(phase) {
                return Ok(PhaseRecord::AlreadyRecorded(first.clone()));
            }
            entry.outputs.insert(phase, output);
            entry.deadline = deadline;
            Ok(PhaseRecord::Recorded)
        })??;
        Ok(recorded)
    }
}
