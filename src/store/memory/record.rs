//! What `MemoryStore` keeps per record, and how small it keeps it.
//!
//! The map is keyed by [`Id`], a 128-bit keyed hash of the record's scope and
//! key, so a slot holds no pointer to chase before the record is found; the
//! identity itself lives in the record's one allocation (the packed response,
//! or the claim), which is read anyway to answer, and is checked there. A slot
//! is 56 bytes: the id, the exact digest, the token, the deadline (nanoseconds
//! from the store's epoch rather than a 16-byte `Instant`) and one pointer.

use super::packed;
use crate::fingerprint::{ExactDigest, LocalDigest};
use crate::store::{FencingToken, RecordKey, StoredResponse};
use crate::Scope;
use highway::{HighwayHash, HighwayHasher, Key};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tokio::time::Instant;

/// A record's map key: a 128-bit HighwayHash of `(scope, key)` under a random
/// key chosen per store.
///
/// Nobody without the key can build two identities with one id, and by chance
/// two of them share one with probability 2^-128 per pair. The store still
/// compares the identity stored with the record before answering, so a shared
/// id can never replay one tenant's response to another: the second identity
/// is refused (`StoreError::Backend`) while the first one's record is live.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Id(u64, u64);

impl Hash for Id {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already a keyed hash: the map uses it as it is.
        state.write_u64(self.0);
    }
}

#[cfg(test)]
impl Id {
    /// An id made up for a test.
    pub(super) fn for_test(n: u64) -> Self {
        Id(n, !n)
    }
}

/// Hashes an [`Id`] to its first half.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `Id`; anything else still hashes (FNV-1a).
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type BuildIdHasher = BuildHasherDefault<IdHasher>;

/// Computes ids; the key is chosen at random per store.
pub(super) struct Ids(Key);

impl Ids {
    pub(super) fn new() -> Self {
        Self(crate::random::hash_key())
    }

    pub(super) fn of(&self, key: &RecordKey) -> Id {
        let (scope, key) = (key.scope().as_str(), key.key().as_str());
        let mut hasher = HighwayHasher::new(self.0);
        // The scope's length first: no two identities share an encoding.
        hasher.append(&(scope.len() as u64).to_le_bytes());
        hasher.append(scope.as_bytes());
        hasher.append(key.as_bytes());
        let [low, high] = hasher.finalize128();
        Id(low, high)
    }
}

/// Points in time as nanoseconds from the store's creation: 8 bytes per record
/// instead of an `Instant`'s 16, with the same resolution.
pub(super) struct Clock {
    epoch: Instant,
    /// The wall-clock time at `epoch`, for times the store reports.
    wall_epoch: SystemTime,
}

/// Nanoseconds from the store's epoch (negative before it).
pub(super) type Nanos = i64;

impl Clock {
    pub(super) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            wall_epoch: SystemTime::now(),
        }
    }

    /// `at` on the wall clock: the wall-clock time of the epoch plus `at`, so
    /// that times follow the store's (possibly paused, in tests) clock.
    pub(super) fn wall(&self, at: Nanos) -> SystemTime {
        let offset = Duration::from_nanos(at.unsigned_abs());
        let t = if at >= 0 {
            self.wall_epoch.checked_add(offset)
        } else {
            self.wall_epoch.checked_sub(offset)
        };
        t.unwrap_or(self.wall_epoch)
    }

    pub(super) fn at(&self, t: Instant) -> Nanos {
        if t >= self.epoch {
            saturate(t - self.epoch)
        } else {
            -saturate(self.epoch - t)
        }
    }

    pub(super) fn instant(&self, at: Nanos) -> Instant {
        let far = Duration::from_secs(100 * 365 * 24 * 3600);
        let offset = Duration::from_nanos(at.unsigned_abs());
        let t = if at >= 0 {
            self.epoch.checked_add(offset)
        } else {
            self.epoch.checked_sub(offset)
        };
        t.unwrap_or_else(|| Instant::now() + far)
    }
}

/// A duration in nanoseconds, saturated to what a deadline can hold.
pub(super) fn saturate(d: Duration) -> Nanos {
    Nanos::try_from(d.as_nanos()).unwrap_or(Nanos::MAX)
}

pub(super) struct Record {
    /// The claiming request's exact digest: a byte-identical retry matches it
    /// without computing its local digest.
    pub(super) exact: ExactDigest,
    pub(super) token: FencingToken,
    /// Lock expiry while in progress, retention expiry once completed.
    pub(super) deadline: Nanos,
    pub(super) state: State,
}

pub(super) enum State {
    /// A completed record whose response is packed with its identity and
    /// local digest (see [`packed`]): almost every completed record.
    Packed(Arc<[u8]>),
    /// A claim, or a completed record whose body is too large to copy.
    Cold(Arc<Cold>),
}

pub(super) enum Cold {
    Claim(Claim),
    Large(Large),
    /// Completed without a replayable response.
    Unavailable(RecordKey, LocalDigest),
}

pub(super) struct Claim {
    pub(super) key: RecordKey,
    /// The claiming request's [`RequestFingerprint::local`](crate::fingerprint::RequestFingerprint::local):
    /// records never leave the process, so no SHA-256 fingerprint is kept.
    pub(super) local: LocalDigest,
    /// 1, or one more than the claim this one took over.
    pub(super) attempt: u32,
    /// When the claim was made, on the store's clock.
    pub(super) began: Nanos,
    /// Woken when the claim completes, is released, or is taken over.
    pub(super) done: Notify,
}

pub(super) struct Large {
    key: RecordKey,
    local: LocalDigest,
    response: Arc<StoredResponse>,
}

/// What a live record with a matching digest answers, read under the
/// shard lock and turned into a [`Begin`](crate::store::Begin) after it.
pub(super) enum Answer {
    Packed(Arc<[u8]>),
    Replay(Arc<StoredResponse>),
    InProgress,
    Unavailable,
    /// A tombstone: ran before, its record expired.
    Expired,
    /// Another request's record.
    KeyReused,
}

impl Claim {
    /// The in-progress state of a new claim of `key`, its `attempt`, made at `began`.
    pub(super) fn state(key: RecordKey, local: LocalDigest, attempt: u32, began: Nanos) -> State {
        State::Cold(Arc::new(Cold::Claim(Claim {
            key,
            local,
            attempt,
            began,
            done: Notify::new(),
        })))
    }
}

impl Record {
    /// Whether this is the record of `key` (and not of another key with its id).
    pub(super) fn is_record_of(&self, key: &RecordKey) -> bool {
        match &self.state {
            State::Packed(packed) => packed::is_record_of(packed, key),
            State::Cold(cold) => cold.key() == key,
        }
    }

    pub(super) fn is_in_scope(&self, scope: &Scope) -> bool {
        match &self.state {
            State::Packed(packed) => packed::is_in_scope(packed, scope.as_str()),
            State::Cold(cold) => cold.key().scope() == scope,
        }
    }

    /// The scope this record belongs to.
    pub(super) fn scope(&self) -> &[u8] {
        match &self.state {
            State::Packed(packed) => packed::scope_of(packed),
            State::Cold(cold) => cold.key().scope().as_str().as_bytes(),
        }
    }

    /// The local digest of the request that claimed this record.
    pub(super) fn local(&self) -> LocalDigest {
        match &self.state {
            State::Packed(packed) => packed::local(packed),
            State::Cold(cold) => match &**cold {
                Cold::Claim(claim) => claim.local,
                Cold::Large(large) => large.local,
                Cold::Unavailable(_, local) => *local,
            },
        }
    }

    /// The claim, while the record is in progress.
    pub(super) fn in_progress(&self) -> Option<&Arc<Cold>> {
        match &self.state {
            State::Cold(cold) if matches!(**cold, Cold::Claim(_)) => Some(cold),
            _ => None,
        }
    }

    /// The claim of `key` this record holds, while it is in progress.
    pub(super) fn claim_of(&self, key: &RecordKey) -> Option<&Claim> {
        match self.in_progress().map(|cold| &**cold) {
            Some(Cold::Claim(claim)) if claim.key == *key => Some(claim),
            _ => None,
        }
    }

    /// The answer to a request with this record's digest.
    pub(super) fn answer(&self) -> Answer {
        match &self.state {
            State::Packed(packed) if packed::is_tombstone(packed) => Answer::Expired,
            State::Packed(packed) => Answer::Packed(packed.clone()),
            State::Cold(cold) => match &**cold {
                Cold::Claim(_) => Answer::InProgress,
                Cold::Large(large) => Answer::Replay(large.response.clone()),
                Cold::Unavailable(..) => Answer::Unavailable,
            },
        }
    }

    /// The tombstone this completed record leaves once its retention has
    /// passed: `None` for a claim, and for a tombstone already.
    pub(super) fn tombstone(&self) -> Option<Arc<[u8]>> {
        match &self.state {
            State::Packed(packed) if packed::is_tombstone(packed) => None,
            State::Packed(packed) => Some(packed::tombstone_of(packed)),
            State::Cold(cold) => match &**cold {
                Cold::Claim(_) => None,
                Cold::Large(large) => Some(packed::tombstone(&large.key, large.local)),
                Cold::Unavailable(key, local) => Some(packed::tombstone(key, *local)),
            },
        }
    }

    /// Wakes the waiters of a claim that is gone (removed or replaced).
    pub(super) fn notify_if_claim(&self) {
        if let Some(cold) = self.in_progress() {
            cold.notify();
        }
    }
}

impl Large {
    pub(super) fn response(&self) -> &StoredResponse {
        &self.response
    }
}

impl Cold {
    fn key(&self) -> &RecordKey {
        match self {
            Cold::Claim(claim) => &claim.key,
            Cold::Large(large) => &large.key,
            Cold::Unavailable(key, _) => key,
        }
    }

    /// Wakes a claim's waiters.
    pub(super) fn notify(&self) {
        if let Cold::Claim(claim) = self {
            claim.done.notify_waiters();
        }
    }
}

/// The completed state of `claim` without a replayable response.
pub(super) fn unavailable(claim: &Claim) -> State {
    State::Cold(Arc::new(Cold::Unavailable(claim.key.clone(), claim.local)))
}

/// The completed state of `claim` with `response`: packed in one buffer when it
/// is small, kept as it is (without spare header capacity) when it is large.
pub(super) fn completed(claim: &Claim, response: StoredResponse) -> State {
    match packed::pack(&claim.key, claim.local, response) {
        Ok(packed) => State::Packed(packed),
        Err(mut response) => {
            response.headers.shrink_to_fit();
            State::Cold(Arc::new(Cold::Large(Large {
                key: claim.key.clone(),
                local: claim.local,
                response: Arc::new(response),
            })))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_stay_small() {
        assert_eq!(std::mem::size_of::<State>(), 16);
        assert_eq!(std::mem::size_of::<Record>(), 40);
        assert_eq!(std::mem::size_of::<(Id, Record)>(), 56);
    }

    #[test]
    fn the_clock_round_trips_instants() {
        let clock = Clock::new();
        let later = clock.epoch + Duration::from_millis(1500);
        assert_eq!(clock.at(later), 1_500_000_000);
        assert_eq!(clock.instant(clock.at(later)), later);
        if let Some(earlier) = clock.epoch.checked_sub(Duration::from_secs(3)) {
            assert_eq!(clock.at(earlier), -3_000_000_000);
            assert_eq!(clock.instant(-3_000_000_000), earlier);
        }
        assert_eq!(saturate(Duration::MAX), Nanos::MAX);
        assert_eq!(
            clock.wall(1_500_000_000),
            clock.wall_epoch + Duration::from_millis(1500)
        );
        assert_eq!(
            clock.wall(-3_000_000_000) + Duration::from_secs(3),
            clock.wall_epoch
        );
    }

    #[test]
    fn ids_separate_scope_from_key() {
        let ids = Ids::new();
        let record = |scope: &str, key: &str| {
            RecordKey::new(
                Scope::new(scope),
                crate::IdempotencyKey::parse(key.as_bytes()).unwrap(),
            )
        };
        let a = ids.of(&record("ab", "cdefghijk"));
        assert_eq!(a, ids.of(&record("ab", "cdefghijk")));
        assert_ne!(a, ids.of(&record("abc", "defghijk")));
        assert_ne!(a, Ids::new().of(&record("ab", "cdefghijk")));
    }
}
