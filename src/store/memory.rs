use super::{Begin, FencingToken, RecordKey, Store, StoreError, StoredResponse};
use crate::fingerprint::ExactDigest;
use crate::{Fingerprint, RequestFingerprint, Scope};
use async_trait::async_trait;
use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Expired records examined per `begin`: bounded work on the request path.
const EVICTIONS_PER_CALL: usize = 8;
/// Expired records examined when the store is full before it answers "full".
const EVICTIONS_WHEN_FULL: usize = 1024;
/// The least time between two whole-map sweeps of a full store.
const FULL_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Recorded bodies up to this size are copied into a buffer of their exact
/// length: a handler's body often sits in a larger allocation (a `String`
/// grown by pushes), whose slack would otherwise be retained for the whole
/// retention period. Larger bodies are kept as they are (no copy).
const COMPACT_BODY_MAX: usize = 1024;

/// An in-process store on a sharded concurrent map.
///
/// Claims are atomic per key (one shard lock held across check and insert);
/// waiters are woken by notification when a claim completes, is released, or is
/// taken over. Expired records are evicted in bounded steps on every claim, in
/// expiry order, and memory is bounded by [`with_capacity`](Self::with_capacity):
/// when the store is full of unexpired records, `begin` fails with
/// [`StoreError::CapacityExceeded`] and the layer answers `503`, rather than
/// forgetting a record it promised to keep.
///
/// Records live as long as the process: use `PostgresStore` when several
/// instances serve the same clients or when replays must survive a restart.
///
/// Clones share the same records.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
///
/// let store = MemoryStore::new()
///     .with_retention(Duration::from_secs(24 * 3600))
///     .with_lock_timeout(Duration::from_secs(60))
///     .with_capacity(100_000);
/// assert_eq!(store.len(), 0);
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    records: DashMap<RecordKey, Record>,
    live: AtomicUsize,
    next_token: AtomicI64,
    retention: Duration,
    lock_timeout: Duration,
    capacity: usize,
    // Retention is fixed per store, so completions queue in deadline order.
    // Claims are not queued: almost all are completed or released within the
    // request, and queueing each one would hold memory for released claims
    // until their lock expired. Abandoned claims are swept when the store is full.
    retention_deadlines: Mutex<VecDeque<Deadline>>,
    /// When the store last swept the whole map for expired records.
    last_full_sweep: Mutex<Option<Instant>>,
}

struct Deadline {
    at: Instant,
    key: RecordKey,
    token: FencingToken,
}

struct Record {
    fingerprint: Fingerprint,
    /// The claiming request's exact digest: a byte-identical retry matches it
    /// without computing its fingerprint.
    exact: ExactDigest,
    token: FencingToken,
    /// Lock expiry while in progress, retention expiry once completed.
    deadline: Instant,
    state: State,
}

enum State {
    InProgress(Arc<Notify>),
    Completed(Arc<StoredResponse>),
}

impl Record {
    /// The answer to a request with this record's fingerprint.
    fn decision(&self) -> Begin {
        match &self.state {
            State::Completed(response) => Begin::Replay(response.clone()),
            State::InProgress(_) => Begin::InProgress,
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .field("retention", &self.shared.retention)
            .field("lock_timeout", &self.shared.lock_timeout)
            .field("capacity", &self.shared.capacity)
            .finish()
    }
}

impl MemoryStore {
    /// A store retaining records for 24 hours, locking claims for 60 seconds,
    /// holding at most one million records.
    pub fn new() -> Self {
        Self::build(
            Duration::from_secs(24 * 3600),
            Duration::from_secs(60),
            1_000_000,
        )
    }

    fn build(retention: Duration, lock_timeout: Duration, capacity: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                records: DashMap::new(),
                live: AtomicUsize::new(0),
                next_token: AtomicI64::new(1),
                retention,
                lock_timeout,
                capacity,
                retention_deadlines: Mutex::new(VecDeque::new()),
                last_full_sweep: Mutex::new(None),
            }),
        }
    }

    fn reconfigure(self, f: impl FnOnce(&mut (Duration, Duration, usize))) -> Self {
        let s = &self.shared;
        let mut cfg = (s.retention, s.lock_timeout, s.capacity);
        f(&mut cfg);
        assert!(
            s.records.is_empty(),
            "configure a MemoryStore before using it"
        );
        Self::build(cfg.0, cfg.1, cfg.2)
    }

    /// How long a completed response is replayed (default 24 h).
    pub fn with_retention(self, retention: Duration) -> Self {
        self.reconfigure(|c| c.0 = retention)
    }

    /// How long a claim holds its key before a retry may take it over (default 60 s).
    ///
    /// Set it above the slowest handler's latency (for example your `TimeoutLayer`):
    /// a claim older than this is presumed dead, and a retry runs the request again.
    pub fn with_lock_timeout(self, lock_timeout: Duration) -> Self {
        self.reconfigure(|c| c.1 = lock_timeout)
    }

    /// The most records held at once, in progress or completed (default 1 000 000).
    pub fn with_capacity(self, capacity: usize) -> Self {
        self.reconfigure(|c| c.2 = capacity)
    }

    /// Records currently held, including expired ones not yet evicted.
    pub fn len(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn new_claim(
        &self,
        fingerprint: Fingerprint,
        exact: ExactDigest,
        now: Instant,
    ) -> (Record, FencingToken) {
        let token = FencingToken(self.shared.next_token.fetch_add(1, Ordering::Relaxed));
        let record = Record {
            fingerprint,
            exact,
            token,
            deadline: now + self.shared.lock_timeout,
            state: State::InProgress(Arc::new(Notify::new())),
        };
        (record, token)
    }

    fn push_deadline(queue: &Mutex<VecDeque<Deadline>>, deadline: Deadline) {
        lock(queue).push_back(deadline);
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
        let mut swept = 0;
        self.shared.records.retain(|_, r| {
            let keep = r.deadline > now;
            if !keep {
                swept += 1;
                if let State::InProgress(done) = &r.state {
                    done.notify_waiters();
                }
            }
            keep
        });
        self.shared.live.fetch_sub(swept, Ordering::Relaxed);
    }

    /// Evicts up to `budget` expired completed records, oldest first.
    fn evict(&self, now: Instant, budget: usize) {
        let queue = &self.shared.retention_deadlines;
        for _ in 0..budget {
            let due = {
                let mut q = lock(queue);
                let due = match q.front() {
                    Some(d) if d.at <= now => q.pop_front(),
                    _ => None,
                };
                // A queue never shrinks by itself: after a burst its buffer
                // would stay at the peak size for good.
                let (len, capacity) = (q.len(), q.capacity());
                if due.is_some() && capacity > 1024 && len < capacity / 4 {
                    q.shrink_to(len * 2);
                }
                due
            };
            let Some(due) = due else { break };
            // Only the completion this entry was queued for, and only once expired.
            let removed = self
                .shared
                .records
                .remove_if(&due.key, |_, r| r.token == due.token && r.deadline <= now);
            if removed.is_some() {
                self.shared.live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// The same response in as little memory as it can be kept: the header list
/// without spare capacity, a small body in a buffer of its exact length.
fn compact(mut response: StoredResponse) -> StoredResponse {
    response.headers.shrink_to_fit();
    if response.body.len() <= COMPACT_BODY_MAX {
        response.body = Bytes::copy_from_slice(&response.body);
    }
    response
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The queues hold plain data; a panic elsewhere cannot leave them inconsistent.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait]
impl Store for MemoryStore {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        let now = Instant::now();
        self.evict(now, EVICTIONS_PER_CALL);
        if self.len() >= self.shared.capacity && !self.shared.records.contains_key(key) {
            self.evict(now, EVICTIONS_WHEN_FULL);
            if self.len() >= self.shared.capacity {
                self.sweep_when_full(now);
            }
            if self.len() >= self.shared.capacity {
                return Err(StoreError::CapacityExceeded);
            }
        }
        let exact = request.exact();
        // A live record is decided from what its shard's read lock shows, without
        // cloning the key. A retry's exact digest matches and settles it; only
        // other bytes need the canonical fingerprint, computed after the lock is
        // dropped so no shard waits on a canonicalisation.
        let live = self.shared.records.get(key).and_then(|record| {
            (record.deadline > now)
                .then(|| (record.exact == exact, record.fingerprint, record.decision()))
        });
        if let Some((same_bytes, fingerprint, decision)) = live {
            let same = same_bytes || fingerprint == *request.fingerprint();
            return Ok(if same { decision } else { Begin::Mismatch });
        }
        // A claim persists the fingerprint: computed before taking the write lock,
        // where the record is examined again.
        let fingerprint = *request.fingerprint();
        let decision = match self.shared.records.entry(key.clone()) {
            Entry::Vacant(vacant) => {
                let (record, token) = self.new_claim(fingerprint, exact, now);
                vacant.insert(record);
                self.shared.live.fetch_add(1, Ordering::Relaxed);
                Begin::Claimed(token)
            }
            Entry::Occupied(mut occupied) => {
                let record = occupied.get_mut();
                if record.deadline <= now {
                    // Expired: a completed record past retention, or a dead claim.
                    let (fresh, token) = self.new_claim(fingerprint, exact, now);
                    let old = std::mem::replace(record, fresh);
                    if let State::InProgress(done) = old.state {
                        done.notify_waiters();
                    }
                    Begin::Claimed(token)
                } else if record.exact == exact || record.fingerprint == fingerprint {
                    record.decision()
                } else {
                    Begin::Mismatch
                }
            }
        };
        Ok(decision)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut record = match self.shared.records.get_mut(key) {
            Some(r) if r.token == token && matches!(r.state, State::InProgress(_)) => r,
            _ => return Err(StoreError::ClaimLost),
        };
        let deadline = now + self.shared.retention;
        record.deadline = deadline;
        let response = compact(response);
        let old = std::mem::replace(&mut record.state, State::Completed(Arc::new(response)));
        drop(record);
        if let State::InProgress(done) = old {
            done.notify_waiters();
        }
        Self::push_deadline(
            &self.shared.retention_deadlines,
            Deadline {
                at: deadline,
                key: key.clone(),
                token,
            },
        );
        Ok(())
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        let removed = self.shared.records.remove_if(key, |_, r| {
            r.token == token && matches!(r.state, State::InProgress(_))
        });
        if let Some((_, record)) = removed {
            self.shared.live.fetch_sub(1, Ordering::Relaxed);
            if let State::InProgress(done) = record.state {
                done.notify_waiters();
            }
        }
        Ok(())
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        let in_progress = |r: &Record| match &r.state {
            State::InProgress(done) => Some((done.clone(), r.token, r.deadline)),
            State::Completed(_) => None,
        };
        let Some((done, token, lock_deadline)) =
            self.shared.records.get(key).and_then(|r| in_progress(&r))
        else {
            return Ok(());
        };
        let notified = done.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // A change between the read above and `enable` would otherwise be missed.
        let unchanged = self
            .shared
            .records
            .get(key)
            .is_some_and(|r| r.token == token && matches!(r.state, State::InProgress(_)));
        if !unchanged {
            return Ok(());
        }
        let until = (Instant::now() + timeout).min(lock_deadline);
        let _ = tokio::time::timeout_at(until, notified).await;
        Ok(())
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        let now = Instant::now();
        let mut purged = 0;
        self.shared.records.retain(|_, r| {
            let keep = r.deadline > now;
            if !keep {
                purged += 1;
                if let State::InProgress(done) = &r.state {
                    done.notify_waiters();
                }
            }
            keep
        });
        self.shared
            .live
            .fetch_sub(purged as usize, Ordering::Relaxed);
        Ok(purged)
    }

    async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        let mut purged = 0;
        self.shared.records.retain(|key, r| {
            let keep = key.scope() != scope;
            if !keep {
                purged += 1;
                if let State::InProgress(done) = &r.state {
                    done.notify_waiters();
                }
            }
            keep
        });
        self.shared
            .live
            .fetch_sub(purged as usize, Ordering::Relaxed);
        Ok(purged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdempotencyKey;
    use http::{HeaderValue, Method, StatusCode};

    /// The point of the exact digest: a byte-identical retry is answered without
    /// canonicalising its body; other bytes still are compared canonically.
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
        let Ok(Begin::Claimed(token)) = store.begin(&record, &first).await else {
            panic!("claim");
        };
        assert!(
            first.fingerprint_computed(),
            "a claim persists the fingerprint"
        );
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from_static(b"done"),
        };
        store.complete(&record, token, response).await.unwrap();

        let retry = request(br#"{"a":1,"b":2}"#);
        assert!(matches!(
            store.begin(&record, &retry).await,
            Ok(Begin::Replay(_))
        ));
        assert!(!retry.fingerprint_computed());

        let reordered = request(br#"{"b":2,"a":1}"#);
        assert!(matches!(
            store.begin(&record, &reordered).await,
            Ok(Begin::Replay(_))
        ));
        assert!(reordered.fingerprint_computed());

        let other = request(br#"{"b":3,"a":1}"#);
        assert!(matches!(
            store.begin(&record, &other).await,
            Ok(Begin::Mismatch)
        ));
    }
}
