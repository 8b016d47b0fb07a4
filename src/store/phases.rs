//! Recovery points: the recorded outputs of a claimed request's finished
//! phases, so that a retry resumes after the last one instead of running
//! the whole handler again.
//!
//! A phase output belongs to the claim's request, not to its token: it is
//! kept with the fingerprint of the request that recorded it, survives a
//! release and a takeover of the claim, and is read back by the next claim
//! of the same request (same scope, key and fingerprint). A claim of another
//! request under the key (after a release) sees none of it and records none
//! of its own ([`PhasesOfAnotherRequest`]) until they expire: they are kept
//! for the store's lock timeout plus its retention plus its tombstone window
//! from the request's last record (each record, and each `extend` of its
//! live claim, renews them all), deleted
//! when the request completes, and deleted with their scope.

use super::{FencingToken, RecordKey, StoreError};
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// The largest phase output a store records, in bytes: a recovery point is
/// an id or a small document, never a response body.
pub const MAX_PHASE_OUTPUT: usize = 64 * 1024;

/// The longest phase name, in bytes.
pub const MAX_PHASE_NAME: usize = 128;

/// A phase output over [`MAX_PHASE_OUTPUT`], refused (inside
/// [`StoreError::Backend`]) before anything is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseOutputTooLarge {
    /// The output's length in bytes.
    pub len: usize,
}

impl fmt::Display for PhaseOutputTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a phase output of {} bytes is over the limit of {MAX_PHASE_OUTPUT}",
            self.len
        )
    }
}

impl std::error::Error for PhaseOutputTooLarge {}

/// A phase name that is empty, longer than [`MAX_PHASE_NAME`] or holds a
/// control character, refused (inside [`StoreError::Backend`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidPhaseName;

impl fmt::Display for InvalidPhaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a phase name must be 1 to {MAX_PHASE_NAME} bytes without control characters"
        )
    }
}

impl std::error::Error for InvalidPhaseName {}

/// A phase record refused (inside [`StoreError::Backend`]) because another
/// request under the key (another body, released or taken over) has
/// recovery points there that have not expired: they are kept for that
/// request's retry, never replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhasesOfAnotherRequest;

impl fmt::Display for PhasesOfAnotherRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("another request under this key has recovery points that have not expired")
    }
}

impl std::error::Error for PhasesOfAnotherRequest {}

pub(crate) fn phases_of_another_request() -> StoreError {
    StoreError::Backend(Box::new(PhasesOfAnotherRequest))
}

/// Checks what every store refuses: a bad name, an output over the limit.
pub(crate) fn check_phase(phase: &str, output: &[u8]) -> Result<(), StoreError> {
    check_name(phase)?;
    if output.len() > MAX_PHASE_OUTPUT {
        return Err(StoreError::Backend(Box::new(PhaseOutputTooLarge {
            len: output.len(),
        })));
    }
    Ok(())
}

pub(crate) fn check_name(phase: &str) -> Result<(), StoreError> {
    let valid =
        !phase.is_empty() && phase.len() <= MAX_PHASE_NAME && !phase.chars().any(char::is_control);
    match valid {
        true => Ok(()),
        false => Err(StoreError::Backend(Box::new(InvalidPhaseName))),
    }
}

/// The phases a request has recorded, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedPhases(Vec<(String, Bytes)>);

impl RecordedPhases {
    /// No phase recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// The output of `phase`, if it was recorded.
    pub fn get(&self, phase: &str) -> Option<&Bytes> {
        self.0
            .iter()
            .find(|(name, _)| name == phase)
            .map(|(_, o)| o)
    }

    /// Adds `phase` unless it is there; its first output stands.
    pub fn insert(&mut self, phase: &str, output: Bytes) {
        if self.get(phase).is_none() {
            self.0.push((phase.to_owned(), output));
        }
    }

    /// How many phases are recorded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The phases, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.0.iter().map(|(name, output)| (name.as_str(), output))
    }
}

impl FromIterator<(String, Bytes)> for RecordedPhases {
    fn from_iter<I: IntoIterator<Item = (String, Bytes)>>(iter: I) -> Self {
        let mut phases = Self::new();
        for (name, output) in iter {
            phases.insert(&name, output);
        }
        phases
    }
}

/// What [`PhaseStore::record_phase`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PhaseRecord {
    /// The output is now the phase's recovery point.
    Recorded,
    /// The request had recorded this phase already: its first output stands
    /// (returned here) and the new one was not written.
    AlreadyRecorded(Bytes),
}

/// Recovery points of claimed requests, for
/// [`Phases`](crate::engine::Phases): the handle the layer
/// ([`IdempotencyLayer::phased`](crate::IdempotencyLayer::phased)) and the
/// engine ([`Engine::phased`](crate::engine::Engine::phased)) give a
/// claimed run. Split from [`Store`](super::Store) by caller, as
/// [`Maintenance`](super::Maintenance) is; implemented with `async fn`s.
///
/// Both methods are fenced by the claim's token: a token that no longer
/// owns the record (taken over, released, completed) fails with
/// [`StoreError::ClaimLost`] and changes nothing. A phase is recorded at
/// most once per request: a second record of it is refused
/// ([`PhaseRecord::AlreadyRecorded`]), never overwriting the first.
pub trait PhaseStore: super::Store {
    /// The phases recorded by the request `token` holds the claim of (by any
    /// earlier claim of that same request).
    fn phases(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<RecordedPhases, StoreError>> + Send;

    /// Records `output` as `phase`'s recovery point, if `token` still owns
    /// the claim and the request has not recorded `phase` yet. An output over
    /// [`MAX_PHASE_OUTPUT`] fails with [`PhaseOutputTooLarge`], a bad name
    /// with [`InvalidPhaseName`], a request whose key holds unexpired phases
    /// of another request with [`PhasesOfAnotherRequest`] (all inside
    /// [`StoreError::Backend`]). Renews the expiry of all the request's
    /// phases.
    fn record_phase(
        &self,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        output: Bytes,
    ) -> impl Future<Output = Result<PhaseRecord, StoreError>> + Send;
}

impl<T: PhaseStore + ?Sized> PhaseStore for Arc<T> {
    fn phases(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> impl Future<Output = Result<RecordedPhases, StoreError>> + Send {
        (**self).phases(key, token)
    }

    fn record_phase(
        &self,
        key: &RecordKey,
        token: FencingToken,
        phase: &str,
        output: Bytes,
    ) -> impl Future<Output = Result<PhaseRecord, StoreError>> + Send {
        (**self).record_phase(key, token, phase, output)
    }
}
