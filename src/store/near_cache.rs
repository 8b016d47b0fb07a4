//! A bounded near cache of completed records, in front of a shared store.
//!
//! A completed record never changes until it expires or is purged, so the
//! answer `begin` gives for it (replay, "used with another request",
//! "response unavailable") can be given again from this process's memory:
//! once this instance has read a record, its further retries here cost no
//! round trip. Records are kept when read, not when written: most keys are
//! never retried, and keeping every completion would make each request pay
//! for the few that are. Every entry ends at the earlier of its record's expiry (measured
//! from before the store set it, so never after it) and a short time to live,
//! so that a purge whose notification this instance missed cannot outlive
//! that TTL. `purge_scope` drops a scope's entries here at once; the stores
//! tell their other instances through the wake-up channel they already run.

use super::{Begin, RecordKey, StoredResponse};
use crate::telemetry::gauges;
use crate::Scope;
use dashmap::DashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The near cache of a shared store: how much it keeps, and for how long.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::NearCache;
///
/// let cache = NearCache::new(32 << 20).with_ttl(Duration::from_secs(5));
/// # let _ = cache;
/// let off = NearCache::disabled();
/// # let _ = off;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NearCache {
    max_bytes: usize,
    ttl: Duration,
}

impl NearCache {
    /// Keeps at most `max_bytes` of recorded responses (bodies and headers,
    /// plus a fixed overhead per entry); the oldest entries go first. A
    /// response larger than an eighth of it is never kept.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            ttl: DEFAULT_TTL,
        }
    }

    /// No near cache: every `begin` asks the store.
    pub fn disabled() -> Self {
        Self::new(0)
    }

    /// The longest an entry is trusted (default 10 s): the bound on how long a
    /// purge this instance was not told of can go unnoticed here.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.max_bytes > 0 && !self.ttl.is_zero()
    }
}

impl Default for NearCache {
    /// 16 MiB, entries trusted for 10 s.
    fn default() -> Self {
        Self::new(16 << 20)
    }
}

const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// What an entry costs beyond its response's bytes (key, maps, queue).
const ENTRY_OVERHEAD: usize = 160;

/// A completed record's answer, as `begin` would give it.
#[derive(Clone, Debug)]
pub(crate) enum Completed {
    Response(Arc<StoredResponse>),
    Unavailable,
}

struct Entry {
    fingerprint: [u8; 32],
    completed: Completed,
    expires: Instant,
    bytes: usize,
    /// Which insertion this is: the queue's stale positions are skipped.
    generation: u64,
}

/// The entries of one store (and its clones).
pub(crate) struct Cache {
    config: NearCache,
    entries: DashMap<RecordKey, Entry>,
    /// Insertion order, for eviction. Positions of entries replaced, expired
    /// or purged stay until they reach the front or the queue is compacted,
    /// which keeps it within [`queue_bound`] of the live entries.
    order: Mutex<VecDeque<(RecordKey, u64)>>,
    /// The last generation handed out.
    generation: AtomicU64,
    bytes: AtomicUsize,
    /// How many entries there are (never fewer: counted before they are
    /// visible), so that the queue's bound costs no walk of the map.
    live: AtomicUsize,
    /// Moves on every purge: an answer read before a purge is not kept after it.
    epoch: AtomicU64,
}

/// The most positions the eviction queue keeps for `live` entries: past it,
/// the stale ones are dropped. A compaction leaves at most one per entry, so
/// it runs at most once per `live + QUEUE_SLACK` inserts: amortized constant.
fn queue_bound(live: usize) -> usize {
    2 * live + QUEUE_SLACK
}

/// Stale positions tolerated whatever the number of entries, so that a few
/// hot entries do not compact the queue on every insert.
const QUEUE_SLACK: usize = 64;

/// A dropped store's entries leave the process's gauges.
impl Drop for Cache {
    fn drop(&mut self) {
        let (bytes, live) = (*self.bytes.get_mut(), *self.live.get_mut());
        gauges::near_cache(-(live as f64), -(bytes as f64));
    }
}

impl Cache {
    pub(crate) fn new(config: NearCache) -> Option<Self> {
        config.is_enabled().then(|| Self {
            config,
            entries: DashMap::new(),
            order: Mutex::new(VecDeque::new()),
            generation: AtomicU64::new(0),
            bytes: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
        })
    }

    /// Taken before asking the store: pass it to [`insert`](Self::insert).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The recorded answer for `key` and a request with `fingerprint`, if an
    /// unexpired entry has it.
    pub(crate) fn get(&self, key: &RecordKey, fingerprint: &[u8; 32]) -> Option<Begin> {
        let Some(entry) = self.entries.get(key) else {
            gauges::near_cache_lookup(false);
            return None;
        };
        if entry.expires <= Instant::now() {
            drop(entry);
            self.remove_if(key, |entry| entry.expires <= Instant::now());
            gauges::near_cache_lookup(false);
            return None;
        }
        gauges::near_cache_lookup(true);
        Some(
            match (&entry.fingerprint == fingerprint, &entry.completed) {
                (false, _) => Begin::KeyReused,
                (true, Completed::Response(stored)) => Begin::Replay(stored.clone()),
                (true, Completed::Unavailable) => Begin::ResponseUnavailable,
            },
        )
    }

    /// Keeps `key`'s completed record until `expires` (the record's own expiry,
    /// or earlier) or the cache's TTL, whichever comes first; not if a purge
    /// ran since `epoch` was taken (the answer may be of a purged record).
    pub(crate) fn insert(
        &self,
        key: &RecordKey,
        fingerprint: [u8; 32],
        completed: Completed,
        expires: Instant,
        epoch: u64,
    ) {
        let bytes = ENTRY_OVERHEAD
            + key.scope().as_str().len()
            + key.key().as_str().len()
            + match &completed {
                Completed::Response(stored) => {
                    stored.body.len()
                        + stored
                            .headers
                            .iter()
                            .map(|(name, value)| name.as_str().len() + value.len())
                            .sum::<usize>()
                }
                Completed::Unavailable => 0,
            };
        let expires = expires.min(Instant::now() + self.config.ttl);
        if bytes > self.config.max_bytes / 8 || expires <= Instant::now() {
            return;
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Entry {
            fingerprint,
            completed,
            expires,
            bytes,
            generation,
        };
        // Counted before it is visible: whoever replaces or removes it then
        // subtracts what was already added, so the counts never go below zero.
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        self.live.fetch_add(1, Ordering::AcqRel);
        gauges::near_cache(1.0, bytes as f64);
        if let Some(old) = self.entries.insert(key.clone(), entry) {
            self.bytes.fetch_sub(old.bytes, Ordering::AcqRel);
            self.live.fetch_sub(1, Ordering::AcqRel);
            gauges::near_cache(-1.0, -(old.bytes as f64));
        }
        // A purge that began meanwhile may have missed this entry: drop it.
        if self.epoch() != epoch {
            self.remove_if(key, |entry| entry.generation == generation);
            return;
        }
        // Queued only once it is in the map, so that a compaction never drops
        // the position of an entry still being inserted.
        let mut queue = self.order.lock().expect("not poisoned");
        queue.push_back((key.clone(), generation));
        // Oldest first, until the entries fit again.
        while self.bytes.load(Ordering::Acquire) > self.config.max_bytes {
            let Some((key, generation)) = queue.pop_front() else {
                break;
            };
            self.remove_if(&key, |entry| entry.generation == generation);
        }
        // Replaced, expired and purged entries leave their positions behind:
        // hot keys re-read after their TTL would grow the queue forever.
        if queue.len() > queue_bound(self.live.load(Ordering::Acquire)) {
            queue.retain(|(key, generation)| {
                self.entries
                    .get(key)
                    .is_some_and(|entry| entry.generation == *generation)
            });
        }
    }

    /// Drops every entry of `scope`: `purge_scope` ran here or elsewhere.
    pub(crate) fn purge_scope(&self, scope: &Scope) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let (mut freed, mut removed) = (0, 0);
        self.entries.retain(|key, entry| {
            let keep = key.scope() != scope;
            if !keep {
                freed += entry.bytes;
                removed += 1;
            }
            keep
        });
        self.bytes.fetch_sub(freed, Ordering::AcqRel);
        self.live.fetch_sub(removed, Ordering::AcqRel);
        gauges::near_cache(-(removed as f64), -(freed as f64));
    }

    /// Drops every entry: a purge whose scope is unknown here.
    pub(crate) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let (mut freed, mut removed) = (0, 0);
        self.entries.retain(|_, entry| {
            freed += entry.bytes;
            removed += 1;
            false
        });
        self.bytes.fetch_sub(freed, Ordering::AcqRel);
        self.live.fetch_sub(removed, Ordering::AcqRel);
        gauges::near_cache(-(removed as f64), -(freed as f64));
    }

    fn remove_if(&self, key: &RecordKey, condition: impl FnOnce(&Entry) -> bool) {
        if let Some((_, entry)) = self.entries.remove_if(key, |_, entry| condition(entry)) {
            self.bytes.fetch_sub(entry.bytes, Ordering::AcqRel);
            self.live.fetch_sub(1, Ordering::AcqRel);
            gauges::near_cache(-1.0, -(entry.bytes as f64));
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// How many positions the eviction queue holds, live and stale.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.order.lock().expect("not poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::StatusCode;

    fn response(body: &'static str) -> Completed {
        Completed::Response(Arc::new(StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from_static(body.as_bytes()),
        }))
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test(start_paused = true)]
    async fn a_cached_record_answers_as_begin_would_until_its_expiry_or_the_ttl() {
        let cache = Cache::new(NearCache::new(1 << 20).with_ttl(Duration::from_secs(5))).unwrap();
        let key = RecordKey::for_test("acme", "order-0001");
        let other = RecordKey::for_test("globex", "order-0001");
        cache.insert(&key, [1; 32], response("{}"), later(), 0);
        assert!(matches!(cache.get(&key, &[1; 32]), Some(Begin::Replay(_))));
        assert!(matches!(cache.get(&key, &[2; 32]), Some(Begin::KeyReused)));
        assert!(cache.get(&other, &[1; 32]).is_none(), "never across scopes");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(cache.get(&key, &[1; 32]).is_none(), "the TTL bounds it");
        assert_eq!(cache.bytes(), 0);

        let soon = Instant::now() + Duration::from_secs(1);
        cache.insert(&key, [1; 32], Completed::Unavailable, soon, 0);
        assert!(matches!(
            cache.get(&key, &[1; 32]),
            Some(Begin::ResponseUnavailable)
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            cache.get(&key, &[1; 32]).is_none(),
            "the record's expiry bounds it"
        );
    }

    #[tokio::test]
    async fn entries_stay_within_the_byte_bound_and_the_oldest_go_first() {
        let cache = Cache::new(NearCache::new(64 * 1024)).unwrap();
        for i in 0..10_000 {
            let key = RecordKey::for_test("acme", &format!("order-{i:06}"));
            cache.insert(&key, [0; 32], response("a response body"), later(), 0);
            assert!(cache.bytes() <= 64 * 1024);
        }
        let newest = RecordKey::for_test("acme", "order-009999");
        let oldest = RecordKey::for_test("acme", "order-000000");
        assert!(cache.get(&newest, &[0; 32]).is_some());
        assert!(cache.get(&oldest, &[0; 32]).is_none());
        assert!(cache.queued() <= 2 * cache.entries.len() + 64);
        let huge = Completed::Response(Arc::new(StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from(vec![0; 16 * 1024]),
        }));
        cache.insert(&oldest, [0; 32], huge, later(), 0);
        assert!(
            cache.get(&oldest, &[0; 32]).is_none(),
            "over an eighth: not kept"
        );
    }

    #[test]
    fn concurrent_inserts_of_one_key_keep_the_byte_count_exact() {
        let cache = Arc::new(Cache::new(NearCache::new(1 << 20)).unwrap());
        let key = RecordKey::for_test("acme", "order-0001");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (cache, key) = (cache.clone(), key.clone());
                std::thread::spawn(move || {
                    for i in 0..100_000 {
                        let epoch = cache.epoch();
                        cache.insert(&key, [0; 32], response("{}"), later(), epoch);
                        if i % 100 == 0 {
                            cache.purge_scope(key.scope());
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        cache.insert(&key, [0; 32], response("{}"), later(), cache.epoch());
        assert!(cache.get(&key, &[0; 32]).is_some());
        let one = cache.entries.get(&key).unwrap().bytes;
        assert_eq!(cache.bytes(), one);
        assert_eq!(cache.live.load(Ordering::Acquire), 1);
        assert!(cache.queued() <= 2 + 64);
    }

    /// After an insert, the queue holds at most two positions per live entry
    /// plus 64 (spelled out here, not taken from the code under test), and the
    /// entries stay within their byte bound.
    fn assert_bounded(cache: &Cache, max_bytes: usize, step: usize) {
        let (queued, live) = (cache.queued(), cache.entries.len());
        assert!(
            queued <= 2 * live + 64,
            "step {step}: {queued} queued positions for {live} live entries"
        );
        assert!(
            cache.bytes() <= max_bytes,
            "step {step}: over the byte bound"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hot_keys_re_read_after_their_ttl_keep_the_queue_bounded() {
        // Each replay after the TTL is a miss, a store read and a re-insert;
        // the bytes never come near the bound, so eviction never runs.
        let max_bytes = 1 << 20;
        let cache = Cache::new(NearCache::new(max_bytes).with_ttl(Duration::from_secs(1))).unwrap();
        let keys: Vec<_> = (0..8)
            .map(|i| RecordKey::for_test("acme", &format!("order-{i:04}")))
            .collect();
        for round in 0..12_500 {
            for key in &keys {
                assert!(cache.get(key, &[0; 32]).is_none(), "expired");
                cache.insert(key, [0; 32], response("{}"), later(), cache.epoch());
                assert_bounded(&cache, max_bytes, round);
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!(cache.queued() <= 2 * keys.len() + 64);
    }

    #[tokio::test]
    async fn re_inserting_one_key_keeps_the_queue_bounded() {
        let max_bytes = 1 << 20;
        let cache = Cache::new(NearCache::new(max_bytes)).unwrap();
        let key = RecordKey::for_test("acme", "order-0001");
        for i in 0..100_000 {
            cache.insert(&key, [0; 32], response("{}"), later(), cache.epoch());
            assert_bounded(&cache, max_bytes, i);
        }
        assert_eq!(cache.entries.len(), 1);
        assert!(cache.queued() <= 2 + 64);
        assert!(matches!(cache.get(&key, &[0; 32]), Some(Begin::Replay(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn many_distinct_keys_keep_the_queue_bounded() {
        // Each key is read back once after its TTL and so dropped by `get`,
        // about a thousand live at a time, far below the byte bound.
        let max_bytes = 1 << 20;
        let cache = Cache::new(NearCache::new(max_bytes).with_ttl(Duration::from_secs(1))).unwrap();
        let key = |i: usize| RecordKey::for_test("acme", &format!("order-{i:08}"));
        for i in 0..200_000 {
            cache.insert(&key(i), [0; 32], response("{}"), later(), cache.epoch());
            assert_bounded(&cache, max_bytes, i);
            if let Some(old) = i.checked_sub(1_500) {
                assert!(cache.get(&key(old), &[0; 32]).is_none(), "expired");
            }
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // Under byte pressure too: eviction and expiry together.
        let small = 64 * 1024;
        let cache = Cache::new(NearCache::new(small).with_ttl(Duration::from_secs(1))).unwrap();
        for i in 0..200_000 {
            cache.insert(&key(i), [0; 32], response("{}"), later(), cache.epoch());
            assert_bounded(&cache, small, i);
            if let Some(old) = i.checked_sub(100) {
                cache.get(&key(old), &[0; 32]);
            }
            tokio::time::advance(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn mixed_inserts_reads_expiries_and_purges_keep_the_queue_bounded() {
        let max_bytes = 32 * 1024;
        let cache =
            Cache::new(NearCache::new(max_bytes).with_ttl(Duration::from_millis(50))).unwrap();
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            // xorshift64: a fixed sequence, the same on every run.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let scopes = ["acme", "globex", "initech"];
        for step in 0..200_000 {
            let roll = next();
            let scope = scopes[(roll >> 8) as usize % scopes.len()];
            // Mostly a few hot keys, sometimes one of many.
            let id = if roll % 4 == 0 {
                (roll >> 16) % 100_000
            } else {
                (roll >> 16) % 16
            };
            let key = RecordKey::for_test(scope, &format!("order-{id:06}"));
            match roll % 100 {
                0..=44 => {
                    if cache.get(&key, &[0; 32]).is_none() {
                        cache.insert(&key, [0; 32], response("{}"), later(), cache.epoch());
                    }
                }
                45..=89 => cache.insert(&key, [0; 32], response("{}"), later(), cache.epoch()),
                90..=97 => tokio::time::advance(Duration::from_millis(roll % 20)).await,
                98 => cache.purge_scope(key.scope()),
                _ => {
                    // A purge that begins while the store is being asked.
                    let epoch = cache.epoch();
                    cache.purge_scope(key.scope());
                    cache.insert(&key, [0; 32], response("{}"), later(), epoch);
                    assert!(cache.get(&key, &[0; 32]).is_none());
                }
            }
            assert!(
                cache.bytes() <= max_bytes,
                "step {step}: over the byte bound"
            );
            if roll % 100 >= 45 && roll % 100 <= 89 {
                assert_bounded(&cache, max_bytes, step);
            }
        }
    }

    #[tokio::test]
    async fn purging_a_scope_drops_its_entries_only() {
        let cache = Cache::new(NearCache::default()).unwrap();
        let (a, b) = (
            RecordKey::for_test("acme", "order-0001"),
            RecordKey::for_test("globex", "order-0001"),
        );
        let epoch = cache.epoch();
        cache.insert(&a, [0; 32], response("a"), later(), epoch);
        cache.insert(&b, [0; 32], response("b"), later(), epoch);
        cache.purge_scope(a.scope());
        // An answer read before the purge is not kept after it.
        cache.insert(&a, [0; 32], response("a"), later(), epoch);
        assert!(cache.get(&a, &[0; 32]).is_none());
        assert!(cache.get(&a, &[0; 32]).is_none());
        assert!(cache.get(&b, &[0; 32]).is_some());
        cache.clear();
        assert!(cache.get(&b, &[0; 32]).is_none());
        assert_eq!(cache.bytes(), 0);
        assert!(Cache::new(NearCache::disabled()).is_none());
    }
}
