//! Looking at one key, and freeing a key whose owner is known dead: what an
//! operator does when a client reports a key that answers `409
//! idempotency_in_progress` long after its request died.
//!
//! [`Inspect::inspect`] reads a key's state within its scope (a record of
//! another scope is never shown: the scope is part of the record's
//! identity). [`Inspect::release_stuck`] frees a claim still in progress,
//! fenced by the token the inspection showed: a token that no longer owns
//! the record (the claim completed, or was taken over by a new claim) is
//! refused, so an operator acting on a stale inspection never cuts off
//! the request that holds the key now; nor is a claim whose lock its owner
//! keeps fresh released (its keep-alive beats many times per lock). Every
//! release attempt is logged at
//! `WARN` with who asked, the scope and the key's keyed hash (never the key).
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::store::inspect::{Inspect, KeyState, Release};
//! use tower_idempotency::store::{Begin, RecordKey, Store};
//! use tower_idempotency::{fingerprint::Fingerprint, IdempotencyKey, MemoryStore, Scope};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStore::builder().with_lock_timeout(Duration::from_secs(1)).build();
//! let key = RecordKey::new(Scope::new("acme"), IdempotencyKey::parse(b"order-0001").unwrap());
//! let request = Fingerprint::from_bytes([7; 32]).into();
//! let Ok(Begin::Claimed(_)) = store.begin(&key, &request).await else { unreachable!() };
//!
//! // The claiming process crashed; the operator looks, then releases.
//! let KeyState::InProgress(claim) = store.inspect(&key).await.unwrap() else { unreachable!() };
//! assert_eq!(claim.attempt, 1);
//! // Right after the claim its lock is fresh: as far as anyone can tell, alive.
//! let early = store.release_stuck(&key, claim.token, "alice@ops").await.unwrap();
//! assert_eq!(early, Release::OwnerAlive);
//! // Nine tenths of a lock without a keep-alive beat: its owner is gone.
//! tokio::time::sleep(Duration::from_millis(950)).await;
//! let released = store.release_stuck(&key, claim.token, "alice@ops").await.unwrap();
//! assert_eq!(released, Release::Released);
//! assert_eq!(store.inspect(&key).await.unwrap(), KeyState::Absent);
//! // The same token again: the claim is gone.
//! let again = store.release_stuck(&key, claim.token, "alice@ops").await.unwrap();
//! assert_eq!(again, Release::Absent);
//! # }
//! ```

use super::{FencingToken, RecordKey, StoreError};
use http::StatusCode;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

/// A key's state, as [`Inspect::inspect`] reads it. Times are on the
/// store's clock (the database's or server's for the shared stores).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyState {
    /// No record: never claimed, released, or completed and past its
    /// retention and its tombstone window.
    Absent,
    /// A claim whose request has not completed. Its lock may have run out
    /// (`lock_expires` in the past): the next request of the key takes it over.
    InProgress(InProgress),
    /// Completed with a response that retries replay.
    Completed {
        /// The recorded status.
        status: StatusCode,
        /// The recorded body's size in bytes.
        body_bytes: u64,
        /// When the record expires.
        expires: SystemTime,
    },
    /// Completed without a replayable response (`410` to retries).
    Unavailable {
        /// When the record expires.
        expires: SystemTime,
    },
    /// Ran before and its record expired: only its tombstone is left, and a
    /// retry is refused `410 idempotency_key_expired` (another body under the
    /// key is key reuse) until the tombstone expires too.
    Tombstone {
        /// When the tombstone expires and the key is free.
        expires: SystemTime,
    },
}

/// A claim in progress, as [`KeyState::InProgress`] shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InProgress {
    /// The claim's token: what [`Inspect::release_stuck`] is fenced by.
    pub token: FencingToken,
    /// 1, or one more than the claim this one took over.
    pub attempt: u32,
    /// When the claim was made.
    pub since: SystemTime,
    /// When its lock runs out unless its owner extends it.
    pub lock_expires: SystemTime,
}

impl InProgress {
    /// A claim's state (for stores written outside this crate).
    pub fn new(
        token: FencingToken,
        attempt: u32,
        since: SystemTime,
        lock_expires: SystemTime,
    ) -> Self {
        Self {
            token,
            attempt,
            since,
            lock_expires,
        }
    }
}

/// What [`Inspect::release_stuck`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Release {
    /// The claim was released: the next request of the key runs.
    Released,
    /// The key has a record the token does not own (a newer claim, or a
    /// completed record): nothing changed.
    NotOwner,
    /// The key has no record: nothing to release.
    Absent,
    /// The token owns the claim, but more than a tenth of its lock is left:
    /// its owner may be alive (a claim's keep-alive extends it twenty times
    /// per lock and rides out stalls of up to nine tenths of it), so nothing
    /// changed. A dead owner's claim becomes releasable once nine tenths of
    /// its lock have run down without an extension.
    OwnerAlive,
}

impl Release {
    /// The label of the audit event.
    fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotOwner => "not_owner",
            Self::Absent => "absent",
            Self::OwnerAlive => "owner_alive",
        }
    }
}

/// Reading one key's state and releasing a stuck claim: called by an
/// operator (through the `admin` module's router, feature `admin`, or code
/// of the application's own), never by the layer.
/// Implemented with `async fn`s, as [`Store`](super::Store) is.
pub trait Inspect: Send + Sync + 'static {
    /// The state of `key` (within its scope only).
    fn inspect(&self, key: &RecordKey)
        -> impl Future<Output = Result<KeyState, StoreError>> + Send;

    /// Releases `key`'s claim if `token` still owns it, it is in progress,
    /// and at most a tenth of its lock is left (its owner missed the
    /// keep-alive beats it would have survived a stall with: otherwise
    /// [`Release::OwnerAlive`]); `actor` (who asked) goes into the `WARN`
    /// audit event every call emits (see [`audit`]). For a claim whose owner
    /// is known dead, a little before its lock runs out and the next request
    /// would take the key over anyway; what it adds is the operator's say,
    /// the audit event, and a waiter woken at once.
    fn release_stuck(
        &self,
        key: &RecordKey,
        token: FencingToken,
        actor: &str,
    ) -> impl Future<Output = Result<Release, StoreError>> + Send;
}

impl<T: Inspect + ?Sized> Inspect for Arc<T> {
    fn inspect(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<KeyState, StoreError>> + Send {
        (**self).inspect(key)
    }

    fn release_stuck(
        &self,
        key: &RecordKey,
        token: FencingToken,
        actor: &str,
    ) -> impl Future<Output = Result<Release, StoreError>> + Send {
        (**self).release_stuck(key, token, actor)
    }
}

/// The audit event of a release attempt, at `WARN` (target
/// `tower_idempotency::audit`): `actor`, `scope`, `key_hash` (the keyed
/// hash the request spans carry, see
/// [`set_key_hash_secret`](crate::telemetry::set_key_hash_secret)), `token`
/// and `outcome` (`released`, `not_owner`, `absent` or `error`). Stores
/// implementing [`Inspect`] call it from `release_stuck`.
pub fn audit(
    actor: &str,
    key: &RecordKey,
    token: FencingToken,
    outcome: &Result<Release, StoreError>,
) {
    let key_hash = crate::telemetry::key_hash(key.key().as_str());
    let outcome = match outcome {
        Ok(release) => release.as_str(),
        Err(_) => "error",
    };
    tracing::warn!(
        target: "tower_idempotency::audit",
        actor,
        scope = key.scope().as_str(),
        key_hash = key_hash.as_str(),
        token = token.0,
        outcome,
        "operator release of an idempotency key"
    );
}
