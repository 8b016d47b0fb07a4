mod builder;
mod deadlines;
mod packed;
mod phases;
mod quota;
mod record;

pub use builder::MemoryStoreBuilder;

use super::inspect::{self, InProgress, Inspect, KeyState, Release};
use super::settings::Settings;
use super::{Begin, Completion, FencingToken, Maintenance, RecordKey, Store, StoreError, Timings};
use crate::{fingerprint::RequestFingerprint, Scope};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use deadlines::{Deadline, Deadlines};
use quota::ScopeQuota;
use record::{Answer, BuildIdHasher, Claim, Clock, Cold, Id, Ids, Nanos, Record, State};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Expired records examined per `begin`: bounded work on the request path.
const EVICTIONS_PER_CALL: usize = 8;
/// Expired records examined when the store is full before it answers "full".
const EVICTIONS_WHEN_FULL: usize = 1024;
/// The least time between two whole-map sweeps of a full store.
const FULL_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

thread_local! {
    /// The last claim this thread made: its store (the address of the shared
    /// state), token and id, so that the completion, which follows on the same
    /// thread, finds the record without hashing the key again.
    static LAST_CLAIM: Cell<Option<(usize, FencingToken, Id)>> = const { Cell::new(None) };
}

/// An in-process store on a sharded concurrent map.
///
/// Claims are atomic per key (one shard lock held across check and insert);
/// waiters are woken by notification when a claim completes, is released, or is
/// taken over. Expired records are evicted in bounded steps on every claim, in
/// expiry order, and memory is bounded by
/// [`with_capacity`](MemoryStoreBuilder::with_capacity): when the store is
/// full of unexpired records, `begin` fails with [`MemoryStoreError::Full`]
/// (inside [`StoreError::Backend`]) and the layer answers `503`, rather than
/// forgetting a record it promised to keep. A completed record past its
/// retention leaves a tombstone (its identity and digest, packed without the
/// response) for [`with_tombstone`](MemoryStoreBuilder::with_tombstone), which
/// counts against the capacity too. So do recovery points
/// ([`PhaseStore`](crate::store::PhaseStore)): at most as many requests as
/// the capacity keep phases, and a new request's first phase is refused with
/// [`MemoryStoreError::Full`] while they are all unexpired.
///
/// One tenant cannot lock the others out: with
/// [`with_scope_quota`](MemoryStoreBuilder::with_scope_quota) a scope that
/// holds its quota of records is refused new keys
/// ([`StoreError::QuotaExceeded`], `429`) while every other scope keeps
/// claiming.
///
/// Records live as long as the process: use `PostgresStore` when several
/// instances serve the same clients or when replays must survive a restart.
/// Because they never leave it, a record keeps the request's
/// [`local`](RequestFingerprint::local) digest (the canonical form under a
/// per-process key), not its SHA-256 [`Fingerprint`](crate::fingerprint::Fingerprint): the
/// same requests match, without the SHA-256. A request given as a fingerprint
/// computed elsewhere (`RequestFingerprint::from(Fingerprint)`) therefore
/// matches only records claimed the same way.
///
/// Clones share the same records. A store is configured before it exists,
/// by its [`builder`](Self::builder):
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
///
/// // Neither may be zero, checked when compiling.
/// const CAPACITY: NonZeroUsize = NonZeroUsize::new(100_000).unwrap();
/// const SCOPE_QUOTA: NonZeroUsize = NonZeroUsize::new(10_000).unwrap();
///
/// let store = MemoryStore::builder()
///     .with_retention(Duration::from_secs(24 * 3600))
///     .with_lock_timeout(Duration::from_secs(60))
///     .with_capacity(CAPACITY)
///     .with_scope_quota(SCOPE_QUOTA)
///     .build();
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    records: DashMap<Id, Record, BuildIdHasher>,
    ids: Ids,
    clock: Clock,
    live: AtomicUsize,
    next_token: AtomicI64,
    settings: Settings,
    capacity: usize,
    /// Records held per scope, when a quota is set.
    scope_quota: Option<ScopeQuota>,
    // Retention is fixed per store, so completions queue in deadline order.
    // Claims are not queued: almost all are completed or released within the
    // request, and queueing each one would hold memory for released claims
    // until their lock expired. Abandoned claims are swept when the store is full.
    retention_deadlines: Deadlines,
    /// Tombstones' deadlines, in order too: the window is fixed per store,
    /// and records become tombstones in the order their retention ends.
    tombstone_deadlines: Deadlines,
    /// When the store last swept the whole map for expired records.
    last_full_sweep: Mutex<Option<Instant>>,
    /// Recovery points of claimed requests (see `PhaseStore`), by record id.
    phases: DashMap<Id, phases::Phased, BuildIdHasher>,
    /// Set once a phase is recorded: until then a completion has none to drop.
    phased: std::sync::atomic::AtomicBool,
}

impl MemoryStoreBuilder {
    /// The store, configured: a new one at every call, sharing nothing with
    /// the stores built before it.
    pub fn build(self) -> MemoryStore {
        MemoryStore::of(self)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.shared;
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .field("retention", &s.settings.retention())
            .field("tombstone", &s.settings.tombstone())
            .field("lock_timeout", &s.settings.lock_timeout())
            .field("capacity", &s.capacity)
            .field(
                "scope_quota",
                &s.scope_quota.as_ref().map(ScopeQuota::quota),
            )
            .finish()
    }
}

impl MemoryStore {
    /// A store retaining records for 24 hours, locking claims for 10 seconds (extended while their handler runs),
    /// holding at most one million records.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A [`MemoryStoreBuilder`] with the defaults of [`new`](Self::new), to
    /// configure the store before it exists.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    fn of(builder: MemoryStoreBuilder) -> Self {
        Self {
            shared: Arc::new(Shared {
                records: DashMap::default(),
                ids: Ids::new(),
                clock: Clock::new(),
                live: AtomicUsize::new(0),
                next_token: AtomicI64::new(1),
                settings: builder.settings,
                capacity: builder.capacity.get(),
                scope_quota: builder.scope_quota.map(ScopeQuota::new),
                retention_deadlines: Deadlines::new(),
                tombstone_deadlines: Deadlines::new(),
                last_full_sweep: Mutex::new(None),
                phases: DashMap::default(),
                phased: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Records the scope holds now, including expired ones not yet evicted:
    /// counted as it changes with a quota, found by a scan of the whole store
    /// without one.
    pub fn scope_len(&self, scope: &Scope) -> usize {
        let scope = scope.as_str().as_bytes();
        match &self.shared.scope_quota {
            Some(quota) => quota.held(scope),
            None => self
                .shared
                .records
                .iter()
                .filter(|r| r.scope() == scope)
                .count(),
        }
    }

    /// Records currently held, including expired ones not yet evicted.
    pub fn len(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now(&self) -> Nanos {
        self.shared.clock.at(Instant::now())
    }

    /// A new claim of `key`, locked until the lock timeout from `now`; a
    /// takeover of `previous` (the expired claim of `key` it replaces), if any.
    fn new_claim(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
        now: Nanos,
        previous: Option<&Record>,
    ) -> (Record, super::Claim) {
        let token = FencingToken(self.shared.next_token.fetch_add(1, Ordering::Relaxed));
        let taken_over = previous.and_then(|r| Some((r.token, r.claim_of(key)?)));
        let claim = match taken_over {
            None => super::Claim::first(token),
            Some((previous, claim)) => super::Claim::takeover(
                token,
                claim.attempt.saturating_add(1),
                previous,
                self.shared.clock.wall(claim.began),
            ),
        };
        let record = Record {
            exact: request.exact(),
            token,
            deadline: now.saturating_add(record::saturate(self.shared.settings.lock_timeout())),
            state: Claim::state(key.clone(), request.local(), claim.attempt(), now),
        };
        (record, claim)
    }

    /// Notes that this thread just claimed `id` with `token`.
    fn remember_claim(&self, token: FencingToken, id: Id) {
        let store = Arc::as_ptr(&self.shared) as usize;
        let _ = LAST_CLAIM.try_with(|last| last.set(Some((store, token, id))));
    }

    /// The id of the claim `token` holds: remembered when this thread
    /// made the claim, as it almost always did (the handler runs in the
    /// claiming task), else hashed again.
    fn claimed_id(&self, token: FencingToken) -> Option<Id> {
        let store = Arc::as_ptr(&self.shared) as usize;
        let last = LAST_CLAIM.try_with(Cell::get).ok().flatten();
        last.filter(|&(s, t, _)| s == store && t == token)
            .map(|(_, _, id)| id)
    }

    /// Completes the claim `token` holds with the state `completed` makes of it.
    fn finish(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completed: impl FnOnce(&Claim) -> State,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let holds =
            |r: &Record| r.token == token && r.in_progress().is_some() && r.is_record_of(key);
        // A remembered id is only taken when its record is this claim (the
        // record of `key`, which lives at `key`'s id); anything else, such as
        // a token of a dropped store that had the same address, is looked up
        // again by the key's own id.
        let remembered = self.claimed_id(token).and_then(|id| {
            let record = self.shared.records.get_mut(&id).filter(|r| holds(r))?;
            Some((id, record))
        });
        let (id, mut record) = match remembered {
            Some(found) => found,
            None => {
                let id = self.shared.ids.of(key);
                match self.shared.records.get_mut(&id) {
                    Some(r) if holds(&r) => (id, r),
                    _ => return Err(StoreError::ClaimLost),
                }
            }
        };
        let deadline = now.saturating_add(record::saturate(self.shared.settings.retention()));
        let completed = match record.in_progress().map(|c| &**c) {
            Some(Cold::Claim(claim)) => completed(claim),
            _ => unreachable!("checked above"),
        };
        record.deadline = deadline;
        let old = std::mem::replace(&mut record.state, completed);
        drop(record);
        if let State::Cold(claim) = old {
            claim.notify();
        }
        self.shared
            .retention_deadlines
            .push(Deadline { at: deadline, id });
        // Answered from the record from now on: its recovery points are done.
        if self.shared.phased.load(Ordering::Relaxed) {
            self.shared.phases.remove(&id);
        }
        Ok(())
    }

    /// Removes every record `remove` selects, waking the waiters of removed
    /// claims; returns how many were removed.
    fn remove_all(&self, mut remove: impl FnMut(&Id, &mut Record) -> bool) -> usize {
        let mut removed = 0;
        self.shared.records.retain(|id, r| {
            let keep = !remove(id, r);
            if !keep {
                removed += 1;
                self.forget_scope(r);
                r.notify_if_claim();
            }
            keep
        });
        self.shared.live.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Removes every expired record (abandoned claims included), at most once
    /// a second: the full store's last resort before refusing a new key.
    fn sweep_when_full(&self, now: Instant) {
        {
            let mut last = lock(&self.shared.last_full_sweep);
            if last.is_some_and(|at| now.duration_since(at) < FULL_SWEEP_INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        let now = self.shared.clock.at(now);
        self.expire_all(now);
    }

    /// Removes every expired record, and turns completed ones past their
    /// retention into tombstones; returns how many it removed or turned.
    fn expire_all(&self, now: Nanos) -> usize {
        let mut entombed = Vec::new();
        let removed = self.remove_all(|&id, r| {
            if r.deadline > now {
                return false;
            }
            match self.entomb(r, now) {
                Some(at) => {
                    entombed.push(Deadline { at, id });
                    false
                }
                None => true,
            }
        });
        entombed.sort_unstable_by_key(|d| d.at);
        let turned = entombed.len();
        self.shared.tombstone_deadlines.extend(entombed);
        removed + turned
    }

    /// Turns `record`, past its deadline, into its tombstone if it is a
    /// completed record whose tombstone window has not passed too; returns the
    /// tombstone's deadline (to queue once the shard lock is released).
    fn entomb(&self, record: &mut Record, now: Nanos) -> Option<Nanos> {
        let window = self.shared.settings.tombstone();
        if window.is_zero() {
            return None;
        }
        // The window counts from the retention's end, whenever this runs.
        let until = record.deadline.saturating_add(record::saturate(window));
        if until <= now {
            return None;
        }
        record.state = State::Packed(record.tombstone()?);
        record.deadline = until;
        Some(until)
    }

    /// How `inspect` shows a completed `record` past its retention that no
    /// one has turned into its tombstone yet: as the tombstone it would be.
    fn tombstone_state(&self, record: &Record, now: Nanos) -> KeyState {
        let window = self.shared.settings.tombstone();
        let until = record.deadline.saturating_add(record::saturate(window));
        match !window.is_zero() && until > now {
            true => KeyState::Tombstone {
                expires: self.shared.clock.wall(until),
            },
            false => KeyState::Absent,
        }
    }

    /// Evicts up to `budget` expired completed records and as many expired
    /// tombstones, oldest first; a completed record within its tombstone
    /// window becomes its tombstone.
    fn evict(&self, now: Nanos, budget: usize) {
        self.evict_from(&self.shared.retention_deadlines, now, budget);
        self.evict_from(&self.shared.tombstone_deadlines, now, budget);
    }

    fn evict_from(&self, queue: &Deadlines, now: Nanos, budget: usize) {
        for _ in 0..budget {
            let Some(due) = queue.pop_due(now) else { break };
            let entombed = match self.shared.records.get_mut(&due.id) {
                Some(mut r) if r.deadline <= now => self.entomb(&mut r, now),
                _ => None,
            };
            if let Some(at) = entombed {
                self.shared
                    .tombstone_deadlines
                    .push(Deadline { at, id: due.id });
                continue;
            }
            // Only once expired: a record of the same key completed later is kept.
            let removed = self
                .shared
                .records
                .remove_if(&due.id, |_, r| r.deadline <= now);
            if let Some((_, record)) = removed {
                self.removed(&record);
            }
        }
    }

    /// Accounts for a record taken out of the map, and wakes its waiters.
    fn removed(&self, record: &Record) {
        self.shared.live.fetch_sub(1, Ordering::Relaxed);
        self.forget_scope(record);
        record.notify_if_claim();
    }

    fn forget_scope(&self, record: &Record) {
        if let Some(quota) = &self.shared.scope_quota {
            quota.forget(record.scope());
        }
    }

    /// Whether a new record `id` of `scope` would exceed its quota, after
    /// evicting what has expired (as a full store does).
    fn over_scope_quota(&self, scope: &[u8], id: &Id, now: Nanos, instant: Instant) -> bool {
        let Some(quota) = &self.shared.scope_quota else {
            return false;
        };
        // A record the key already has is decided as usual (a replay, say).
        if quota.has_room(scope) || self.shared.records.contains_key(id) {
            return false;
        }
        self.evict(now, EVICTIONS_WHEN_FULL);
        if !quota.has_room(scope) {
            self.sweep_when_full(instant);
        }
        !quota.has_room(scope)
    }
}

/// Another identity holds the record's id: refused rather than answered from
/// (or overwriting) the other identity's record. See [`record::Id`].
fn id_collision() -> StoreError {
    StoreError::Backend("two idempotency keys share one MemoryStore id".into())
}

/// The `Begin` for an answer read under the shard lock (decoded after it).
fn begin_of(answer: Answer) -> Begin {
    match answer {
        Answer::Packed(packed) => Begin::Replay(Arc::new(packed::unpack(&packed))),
        Answer::Replay(response) => Begin::Replay(response),
        Answer::InProgress => Begin::InProgress,
        Answer::Unavailable => Begin::ResponseUnavailable,
        Answer::Expired => Begin::Expired,
        Answer::KeyReused => Begin::KeyReused,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The queues hold plain data; a panic elsewhere cannot leave them inconsistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `MemoryStore`'s own failure, inside [`StoreError::Backend`] (the layer
/// answers `503`).
///
/// ```
/// use tower_idempotency::store::{MemoryStoreError, StoreError};
///
/// fn is_full(error: &StoreError) -> bool {
///     matches!(error, StoreError::Backend(e) if matches!(e.downcast_ref(), Some(MemoryStoreError::Full)))
/// }
/// # let _ = is_full;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryStoreError {
    /// The store holds as many records as its capacity allows and none of
    /// them has expired.
    Full,
}

impl std::fmt::Display for MemoryStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full => f.write_str("the idempotency store is full"),
        }
    }
}

impl std::error::Error for MemoryStoreError {}

impl Store for MemoryStore {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        let instant = Instant::now();
        let now = self.shared.clock.at(instant);
        self.evict(now, EVICTIONS_PER_CALL);
        let id = self.shared.ids.of(key);
        let records = &self.shared.records;
        if self.len() >= self.shared.capacity && !records.contains_key(&id) {
            self.evict(now, EVICTIONS_WHEN_FULL);
            if self.len() >= self.shared.capacity {
                self.sweep_when_full(instant);
            }
            if self.len() >= self.shared.capacity {
                return Err(StoreError::Backend(Box::new(MemoryStoreError::Full)));
            }
        }
        let scope = key.scope().as_str().as_bytes();
        if self.over_scope_quota(scope, &id, now, instant) {
            return Err(StoreError::QuotaExceeded);
        }
        let exact = request.exact();
        // A live record is decided from what its shard's read lock shows, without
        // cloning the key. A retry's exact digest matches and settles it; only
        // other bytes need the canonical (local) digest, computed after the lock
        // is dropped so no shard waits on a canonicalisation.
        let live = records.get(&id).and_then(|r| {
            (r.deadline > now).then(|| {
                let stored = (r.exact != exact).then(|| r.local());
                (r.is_record_of(key), stored, r.answer())
            })
        });
        if let Some((ours, stored, answer)) = live {
            if !ours {
                return Err(id_collision());
            }
            let same = stored.is_none_or(|stored| stored == request.local());
            return Ok(if same {
                begin_of(answer)
            } else {
                Begin::KeyReused
            });
        }
        // A claim keeps the local digest: computed before taking the write lock,
        // where the record is examined again.
        let local = request.local();
        let answer = match records.entry(id) {
            Entry::Vacant(vacant) => {
                // Counted under the shard lock, so no two new keys of a scope
                // at its quota minus one both get in.
                if let Some(quota) = &self.shared.scope_quota {
                    if !quota.admit(scope) {
                        return Err(StoreError::QuotaExceeded);
                    }
                }
                let (record, claim) = self.new_claim(key, request, now, None);
                // Counted before the shard lock is released: a purge that
                // removes the new claim at once then subtracts it after this
                // addition, and `len()` never wraps below zero in between.
                let _inserted = vacant.insert(record);
                self.shared.live.fetch_add(1, Ordering::Relaxed);
                self.remember_claim(claim.token, id);
                return Ok(Begin::Claimed(claim));
            }
            Entry::Occupied(mut occupied) => {
                let record = occupied.get_mut();
                // A completed record past its retention leaves its tombstone,
                // decided below as a live record.
                let entombed = (record.deadline <= now)
                    .then(|| self.entomb(record, now))
                    .flatten();
                if record.deadline <= now {
                    // Expired: a completed record past retention, or a dead claim
                    // (of this key, or of another key with its id: both are free).
                    let other_scope = record.scope() != scope;
                    if let Some(quota) = self.shared.scope_quota.as_ref().filter(|_| other_scope) {
                        if !quota.admit(scope) {
                            return Err(StoreError::QuotaExceeded);
                        }
                    }
                    // A dead claim of this key is taken over; anything else
                    // expired leaves the key free.
                    let (fresh, claim) = self.new_claim(key, request, now, Some(record));
                    let old = std::mem::replace(record, fresh);
                    drop(occupied);
                    if other_scope {
                        self.forget_scope(&old);
                    }
                    old.notify_if_claim();
                    self.remember_claim(claim.token, id);
                    return Ok(Begin::Claimed(claim));
                }
                let answer = if !record.is_record_of(key) {
                    Err(id_collision())
                } else if record.exact == exact || record.local() == local {
                    Ok(record.answer())
                } else {
                    Ok(Answer::KeyReused)
                };
                drop(occupied);
                if let Some(at) = entombed {
                    self.shared.tombstone_deadlines.push(Deadline { at, id });
                }
                answer?
            }
        };
        Ok(begin_of(answer))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        match completion {
            Completion::Response(response) => {
                self.finish(key, token, |claim| record::completed(claim, response))
            }
            Completion::Unavailable => self.finish(key, token, record::unavailable),
        }
    }

    fn timings(&self) -> Timings {
        self.shared.settings.timings()
    }

    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let now = self.now();
        let id = self.shared.ids.of(key);
        match self.shared.records.get_mut(&id) {
            // Still this claim's token: nobody took it over, even if its lock ran out.
            Some(mut r) if r.token == token && r.in_progress().is_some() && r.is_record_of(key) => {
                r.deadline =
                    now.saturating_add(record::saturate(self.shared.settings.lock_timeout()));
                // A live claim's recovery points live on with it.
                if self.shared.phased.load(Ordering::Relaxed) {
                    self.keep_phases(&id, key, r.local(), now);
                }
                Ok(())
            }
            _ => Err(StoreError::ClaimLost),
        }
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let id = self.shared.ids.of(key);
        let removed = self.shared.records.remove_if(&id, |_, r| {
            r.token == token && r.in_progress().is_some() && r.is_record_of(key)
        });
        if let Some((_, record)) = removed {
            self.removed(&record);
        }
        Ok(())
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        let id = self.shared.ids.of(key);
        let records = &self.shared.records;
        let in_progress = |r: &Record| {
            r.in_progress()
                .filter(|_| r.is_record_of(key))
                .map(|claim| (claim.clone(), r.token, r.deadline))
        };
        let Some((claim, token, lock_deadline)) = records.get(&id).and_then(|r| in_progress(&r))
        else {
            return Ok(());
        };
        let Cold::Claim(Claim { done, .. }) = &*claim else {
            unreachable!("in_progress returns claims")
        };
        let notified = done.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // A change between the read above and `enable` would otherwise be missed.
        let unchanged = records
            .get(&id)
            .is_some_and(|r| r.token == token && r.in_progress().is_some());
        if !unchanged {
            return Ok(());
        }
        let lock_deadline = self.shared.clock.instant(lock_deadline);
        // An unbounded timeout (`Duration::MAX`) waits until the lock expires.
        let until = Instant::now()
            .checked_add(timeout)
            .map_or(lock_deadline, |t| t.min(lock_deadline));
        let _ = tokio::time::timeout_at(until, notified).await;
        Ok(())
    }
}

impl Maintenance for MemoryStore {
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = self.now();
        self.shared.phases.retain(|_, p| p.deadline > now);
        Ok(self.expire_all(now) as u64)
    }

    async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        let removed = self.remove_all(|_, r| r.is_in_scope(scope)) as u64;
        // After the records: a phase is recorded under its claim's record
        // lock, so none of the scope can be recorded past this point.
        self.shared.phases.retain(|_, p| p.key.scope() != scope);
        Ok(removed)
    }
}

impl Inspect for MemoryStore {
    async fn inspect(&self, key: &RecordKey) -> Result<KeyState, StoreError> {
        let now = self.now();
        let id = self.shared.ids.of(key);
        let Some(record) = self.shared.records.get(&id) else {
            return Ok(KeyState::Absent);
        };
        // Another identity with this id is not this key's record.
        if !record.is_record_of(key) {
            return Ok(KeyState::Absent);
        }
        let clock = &self.shared.clock;
        let expires = clock.wall(record.deadline);
        // A claim past its lock is still shown: it is what blocks the key
        // until the next request takes it over.
        let state = match &record.state {
            State::Cold(cold) => match &**cold {
                Cold::Claim(claim) => KeyState::InProgress(InProgress::new(
                    record.token,
                    claim.attempt,
                    clock.wall(claim.began),
                    expires,
                )),
                _ if record.deadline <= now => self.tombstone_state(&record, now),
                Cold::Large(large) => KeyState::Completed {
                    status: large.response().status,
                    body_bytes: large.response().body.len() as u64,
                    expires,
                },
                Cold::Unavailable(..) => KeyState::Unavailable { expires },
            },
            State::Packed(packed) if packed::is_tombstone(packed) => match record.deadline > now {
                true => KeyState::Tombstone { expires },
                false => KeyState::Absent,
            },
            State::Packed(_) if record.deadline <= now => self.tombstone_state(&record, now),
            State::Packed(packed) => {
                let response = packed::unpack(packed);
                KeyState::Completed {
                    status: response.status,
                    body_bytes: response.body.len() as u64,
                    expires,
                }
            }
        };
        Ok(state)
    }

    async fn release_stuck(
        &self,
        key: &RecordKey,
        token: FencingToken,
        actor: &str,
    ) -> Result<Release, StoreError> {
        let now = self.now();
        let id = self.shared.ids.of(key);
        // Decided and removed under the shard's lock: no claim slips in between.
        let outcome = match self.shared.records.entry(id) {
            Entry::Vacant(_) => Release::Absent,
            Entry::Occupied(occupied) => {
                let record = occupied.get();
                if !record.is_record_of(key) {
                    Release::Absent
                } else if record.token == token
                    && record.in_progress().is_some()
                    && record.deadline.saturating_sub(now)
                        > record::saturate(self.shared.settings.lock_timeout() / 10)
                {
                    Release::OwnerAlive
                } else if record.token == token && record.in_progress().is_some() {
                    let (_, record) = occupied.remove_entry();
                    self.removed(&record);
                    Release::Released
                } else if record.in_progress().is_some() || record.deadline > now {
                    Release::NotOwner
                } else {
                    Release::Absent
                }
            }
        };
        let outcome = Ok(outcome);
        inspect::audit(actor, key, token, &outcome);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Claim, Completion, StoredResponse};
    use crate::IdempotencyKey;
    use bytes::Bytes;
    use http::{HeaderValue, Method, StatusCode};

    fn response() -> StoredResponse {
        StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from_static(b"done"),
        }
    }

    /// Memory over time: a hundred thousand scopes that each claim a key and
    /// then release it, complete it and let it expire, or are purged, leave
    /// no record and no quota entry behind; the counts stay bounded by the
    /// records held at any moment, whatever the number of scopes seen.
    #[tokio::test(start_paused = true)]
    async fn scopes_that_come_and_go_leave_no_quota_entries_behind() {
        let retention = std::time::Duration::from_secs(60);
        let store = MemoryStore::builder()
            .with_retention(retention)
            .with_tombstone(std::time::Duration::ZERO)
            .with_scope_quota(std::num::NonZeroUsize::new(2).unwrap())
            .build();
        let fp = RequestFingerprint::from(crate::fingerprint::Fingerprint::from_bytes([9; 32]));
        let quota = || store.shared.scope_quota.as_ref().unwrap();
        for round in 0..10 {
            for i in 0..10_000 {
                let scope = format!("tenant-{round}-{i}");
                let key = RecordKey::for_test(&scope, "key-0000001");
                let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&key, &fp).await else {
                    panic!("claim");
                };
                match i % 3 {
                    0 => store.release(&key, token).await.unwrap(),
                    1 => store
                        .complete(&key, token, Completion::Response(response()))
                        .await
                        .unwrap(),
                    _ => {
                        let scope = crate::Scope::new(scope.as_str());
                        store.purge_scope(&scope).await.unwrap();
                    }
                }
                // Bounded by what is held now, never by the scopes seen.
                assert!(quota().scopes() <= store.len(), "round {round}, scope {i}");
                assert!(store.len() <= 10_000);
            }
            tokio::time::advance(retention + std::time::Duration::from_secs(1)).await;
            store.purge_expired().await.unwrap();
            assert_eq!((store.len(), quota().scopes()), (0, 0), "round {round}");
        }
    }

    /// What a tombstone costs: its map slot, one buffer of its digest and
    /// identity (the response is freed), and its deadline in the queue.
    /// Printed for `docs/benchmarks.md` (`--nocapture`).
    #[tokio::test(start_paused = true)]
    async fn a_tombstone_keeps_its_slot_and_a_buffer_of_its_identity_only() {
        let day = std::time::Duration::from_secs(24 * 3600);
        let store = MemoryStore::builder()
            .with_retention(day)
            .with_tombstone(7 * day)
            .build();
        // A key as clients send them (a UUID).
        let key = RecordKey::for_test("tenant-0001", "0b7c8f3e-7d2a-4c1e-9f65-2a1d3c4b5e6f");
        let fp = RequestFingerprint::from(crate::fingerprint::Fingerprint::from_bytes([3; 32]));
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&key, &fp).await else {
            panic!("claim");
        };
        let mut big = response();
        big.body = Bytes::from(vec![b'x'; 900]);
        store
            .complete(&key, token, Completion::Response(big))
            .await
            .unwrap();
        tokio::time::advance(day + std::time::Duration::from_secs(1)).await;
        assert_eq!(store.purge_expired().await.unwrap(), 1);
        let id = store.shared.ids.of(&key);
        let buffer = match &store.shared.records.get(&id).unwrap().state {
            State::Packed(packed) if packed::is_tombstone(packed) => packed.len(),
            _ => panic!("a tombstone"),
        };
        assert_eq!(buffer, 16 + 1 + "tenant-0001".len() + 1 + 36);
        assert_eq!(store.shared.tombstone_deadlines.len(), 1);
        // An `Arc<[u8]>`'s allocation: two counts, then the bytes.
        let bytes = std::mem::size_of::<(Id, Record)>()
            + 2 * std::mem::size_of::<usize>()
            + buffer
            + std::mem::size_of::<Deadline>();
        println!(
            "MemoryStore: {bytes} bytes per tombstone (slot {}, buffer {}, queue entry {})",
            std::mem::size_of::<(Id, Record)>(),
            2 * std::mem::size_of::<usize>() + buffer,
            std::mem::size_of::<Deadline>()
        );
        assert!(bytes < 200, "{bytes} bytes");
        assert!(matches!(store.begin(&key, &fp).await, Ok(Begin::Expired)));
    }

    /// The id a thread remembers from its last claim is only a shortcut: a
    /// completion of another claim, of another store, or of a store that
    /// reuses a dropped one's address (and so its remembered token), is found
    /// by its key; a remembered token never completes another key's record.
    #[tokio::test]
    async fn a_remembered_claim_never_stands_in_for_another() {
        let fp = RequestFingerprint::from(crate::fingerprint::Fingerprint::from_bytes([7; 32]));
        let (x, y) = (
            RecordKey::for_test("s", "key-x-0001"),
            RecordKey::for_test("s", "key-y-0001"),
        );
        let old = MemoryStore::new();
        let Ok(Begin::Claimed(Claim {
            token: old_token, ..
        })) = old.begin(&x, &fp).await
        else {
            panic!("claim");
        };
        let old_address = Arc::as_ptr(&old.shared) as usize;
        drop(old);
        // Often at the dropped store's address, with the same first token.
        let store = MemoryStore::new();
        let reused = Arc::as_ptr(&store.shared) as usize == old_address;
        let other = store.clone();
        let claimed_elsewhere = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                let fp =
                    RequestFingerprint::from(crate::fingerprint::Fingerprint::from_bytes([7; 32]));
                let y = RecordKey::for_test("s", "key-y-0001");
                match other.begin(&y, &fp).await {
                    Ok(Begin::Claimed(claim)) => claim.token,
                    _ => panic!("claim"),
                }
            })
        });
        let token = claimed_elsewhere.join().unwrap();
        assert_eq!(
            token, old_token,
            "both stores' first token (reused address: {reused})"
        );
        // This thread remembers the old store's claim of `x` with this token.
        assert!(matches!(
            store
                .complete(&x, token, Completion::Response(response()))
                .await,
            Err(StoreError::ClaimLost)
        ));
        store
            .complete(&y, token, Completion::Response(response()))
            .await
            .unwrap();
        assert!(matches!(store.begin(&y, &fp).await, Ok(Begin::Replay(_))));

        // Claimed here, then completed with the token but another key.
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&x, &fp).await else {
            panic!("claim");
        };
        let z = RecordKey::for_test("s", "key-z-0001");
        assert!(matches!(
            store
                .complete(&z, token, Completion::Response(response()))
                .await,
            Err(StoreError::ClaimLost)
        ));
        store
            .complete(&x, token, Completion::Response(response()))
            .await
            .unwrap();
        assert!(matches!(store.begin(&x, &fp).await, Ok(Begin::Replay(_))));
    }

    /// The point of the exact digest: a byte-identical retry is answered without
    /// canonicalising its body; other bytes still are compared canonically, by
    /// the local digest, and no request's SHA-256 fingerprint is computed.
    #[tokio::test]
    async fn byte_identical_retries_skip_the_fingerprint() {
        let store = MemoryStore::new();
        let key = IdempotencyKey::parse(b"order-0001").unwrap();
        let record = RecordKey::new(Scope::new("acme"), key.clone());
        let json = HeaderValue::from_static("application/json");
        let request = |body: &'static [u8]| {
            RequestFingerprint::new(&Method::POST, "/v1/orders", &key, "acme", Some(&json), body)
        };
        let first = request(br#"{"a":1,"b":2}"#);
        let Ok(Begin::Claimed(Claim { token, .. })) = store.begin(&record, &first).await else {
            panic!("claim");
        };
        assert!(first.local_computed(), "a claim keeps the local digest");
        // Records never leave the process: no SHA-256 fingerprint on any path.
        assert!(!first.fingerprint_computed());
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from_static(b"done"),
        };
        store
            .complete(&record, token, Completion::Response(response))
            .await
            .unwrap();

        let retry = request(br#"{"a":1,"b":2}"#);
        assert!(matches!(
            store.begin(&record, &retry).await,
            Ok(Begin::Replay(_))
        ));
        assert!(!retry.local_computed());

        let reordered = request(br#"{"b":2,"a":1}"#);
        assert!(matches!(
            store.begin(&record, &reordered).await,
            Ok(Begin::Replay(_))
        ));
        assert!(reordered.local_computed());

        let other = request(br#"{"b":3,"a":1}"#);
        assert!(matches!(
            store.begin(&record, &other).await,
            Ok(Begin::KeyReused)
        ));
        for request in [&first, &retry, &reordered, &other] {
            assert!(!request.fingerprint_computed());
        }
    }
}
