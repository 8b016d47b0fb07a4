//! Tracing spans and events for every decision, and (feature `metrics`) counters
//! and a latency histogram per outcome.
//!
//! Each request the layers decide runs in a span (`idempotency` or `lease`) with
//! the scope, a keyed hash of the key (never the key itself, nor an unkeyed
//! digest a log reader could match against guesses; see
//! [`set_key_hash_secret`]) and the outcome, and ends with one event at `DEBUG` (`WARN`
//! for store errors). With the `metrics` feature, the `metrics` crate's facade
//! receives `tower_idempotency_requests_total{layer, outcome}` and
//! `tower_idempotency_request_duration_seconds{layer, outcome}`.
//!
//! The `outcome` of `layer="idempotency"`: `claimed` (ran and recorded),
//! `released` (ran, not recorded: an error, a panic, a status the record policy
//! declines), `replayed`, `reused` (409 key reuse), `in_progress` (409),
//! `unavailable` (ran, response not recordable; 410 to retries), `expired`
//! (410: ran before, its record expired and only its tombstone is left),
//! `store_error` (503), `over_quota` (429, the scope at its store quota),
//! `shed` (503, over `with_max_in_flight`) and `rejected` (no scope, a bad key,
//! a body too large or too slow). Of `layer="lease"`: `created`, `joined`,
//! `stolen`, `completed`, `budget_exhausted`, `start_failed`, `store_error`
//! and `rejected`.

use highway::{HighwayHash, HighwayHasher, Key};
#[cfg(test)]
use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use std::time::Duration;

/// What the idempotency layer did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Outcome {
    /// Claimed the key, ran the handler and recorded its response.
    Claimed,
    /// Ran the handler and released the key (response not recorded, error, body failure).
    Released,
    /// Replayed a recorded response.
    Replayed,
    /// `409 idempotency_key_reuse`.
    Reused,
    /// `409 idempotency_in_progress`.
    InProgress,
    /// `503`: the store failed.
    StoreError,
    /// Refused before any decision: no scope, bad key, body too large or too slow.
    Rejected,
    /// Ran, but its response could not be recorded (`410` to retries).
    Unavailable,
    /// `410 idempotency_key_expired`: ran before, only its tombstone is left.
    Expired,
    /// `429 idempotency_quota_exceeded`: the scope is at its store quota.
    OverQuota,
    /// `503 overloaded`: shed at the layer's cap on claimed handlers.
    Shed,
}

impl Outcome {
    /// The label used in events and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Released => "released",
            Self::Replayed => "replayed",
            Self::Reused => "reused",
            Self::InProgress => "in_progress",
            Self::StoreError => "store_error",
            Self::Rejected => "rejected",
            Self::Unavailable => "unavailable",
            Self::Expired => "expired",
            Self::OverQuota => "over_quota",
            Self::Shed => "shed",
        }
    }
}

/// What a layer's events and metrics label a decision with.
pub(crate) trait Label: Copy {
    fn as_str(self) -> &'static str;
    /// Store failures are warned, the rest logged at `DEBUG`.
    fn is_store_error(self) -> bool;
}

impl Label for Outcome {
    fn as_str(self) -> &'static str {
        Outcome::as_str(self)
    }

    fn is_store_error(self) -> bool {
        self == Self::StoreError
    }
}

/// Runs a decision and emits its closing event and metrics.
pub(crate) fn observed<F, T, O>(layer: &'static str, decision: F) -> Observed<F>
where
    F: std::future::Future<Output = (T, O)>,
    O: Label,
{
    Observed {
        decision,
        layer,
        started: timed().then(tokio::time::Instant::now),
    }
}

/// Whether anyone can receive a duration: the `metrics` feature, or a tracing
/// subscriber at `WARN` or below (store errors are warned with theirs). Without
/// one, the two clock reads per request are skipped.
fn timed() -> bool {
    cfg!(feature = "metrics") || tracing::level_enabled!(tracing::Level::WARN)
}

pin_project_lite::pin_project! {
    /// The future of [`observed`]: a struct rather than an `async fn`, which
    /// would keep a second copy of the (large) decision future in its state.
    pub(crate) struct Observed<F> {
        #[pin]
        decision: F,
        layer: &'static str,
        // `None` when nobody receives durations (see `timed`).
        started: Option<tokio::time::Instant>,
    }
}

impl<F, T, O> std::future::Future for Observed<F>
where
    F: std::future::Future<Output = (T, O)>,
    O: Label,
{
    type Output = T;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let this = self.project();
        let (answer, outcome) = std::task::ready!(this.decision.poll(cx));
        finish(
            this.layer,
            outcome,
            this.started.map(|started| started.elapsed()),
        );
        std::task::Poll::Ready(answer)
    }
}

/// The secret of `key_hash`: drawn at random once per process, unless
/// [`set_key_hash_secret`] chose one first.
static KEY_HASH_SECRET: OnceLock<Key> = OnceLock::new();

/// Makes the `key_hash` of logged decisions the same in every process that
/// sets the same `secret`, so logs of several instances can be correlated by
/// key. Without it each process draws a random secret: a `key_hash` then
/// tells keys apart within one process's logs only.
///
/// The hash is keyed so that a log reader cannot recover a short or guessable
/// key by hashing candidates; keep the secret as secret as the keys. Call it
/// at start-up, before the first request: it returns `false` (and changes
/// nothing) once a secret is in use.
pub fn set_key_hash_secret(secret: [u8; 32]) -> bool {
    let lanes = std::array::from_fn(|i| {
        u64::from_le_bytes(secret[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    });
    KEY_HASH_SECRET.set(Key(lanes)).is_ok()
}

/// A short, stable id of a key for logs: 16 hex digits of a keyed hash
/// (HighwayHash), never reversible by hashing guesses without the secret.
pub(crate) fn key_hash(key: &str) -> String {
    let secret = KEY_HASH_SECRET.get_or_init(crate::fingerprint::random_key);
    keyed_hash(secret, key)
}

fn keyed_hash(secret: &Key, key: &str) -> String {
    let mut hasher = HighwayHasher::new(*secret);
    hasher.append(key.as_bytes());
    format!("{:016x}", hasher.finalize64())
}

/// Emits the request's closing event and metrics. `elapsed` is `None` when the
/// decision was not timed: the event then has no `micros` field rather than a
/// false zero (for example, events forwarded to `log` without a subscriber).
pub(crate) fn finish(layer: &'static str, outcome: impl Label, elapsed: Option<Duration>) {
    let span = tracing::Span::current();
    span.record("outcome", outcome.as_str());
    let micros = elapsed.map(|elapsed| elapsed.as_micros() as u64);
    if outcome.is_store_error() {
        tracing::warn!(
            layer,
            outcome = outcome.as_str(),
            micros,
            "store unavailable"
        );
    } else {
        tracing::debug!(layer, outcome = outcome.as_str(), micros, "decided");
    }
    #[cfg(feature = "metrics")]
    {
        let labels = [("layer", layer), ("outcome", outcome.as_str())];
        metrics::counter!("tower_idempotency_requests_total", &labels).increment(1);
        if let Some(elapsed) = elapsed {
            metrics::histogram!("tower_idempotency_request_duration_seconds", &labels)
                .record(elapsed.as_secs_f64());
        }
    }
}

/// Expired records a `PurgeTask` deleted.
pub(crate) fn purged(deleted: u64) {
    tracing::debug!(deleted, "expired idempotency records purged");
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_idempotency_purged_records_total").increment(deleted);
}

/// A request without a scope at the lease layer: at `DEBUG` every time, and
/// once per process at `WARN` with the likely cause, since a layer mounted
/// outside the auth layer answers every valid caller `401`. (The idempotency
/// layer warns once per route, in its own module.)
#[cfg(feature = "leases")]
pub(crate) fn no_scope(layer: &'static str) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            layer,
            "a request reached the layer without a scope and was answered 401; if \
             authenticated requests get this too, the layer runs before the \
             authentication that sets the scope: add it inside (after) your auth \
             layer (in axum, the layer added later is the outer one)"
        );
    }
    tracing::debug!(layer, "no scope: 401 unauthorized");
}

/// Records the scope and key hash on the current span, if anyone listens.
pub(crate) fn identify(scope: &str, key: &str) {
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("scope", scope);
        span.record("key_hash", key_hash(key).as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hashes_are_keyed_stable_and_not_the_unkeyed_digest() {
        let (a, b) = (Key([1, 2, 3, 4]), Key([5, 6, 7, 8]));
        assert_eq!(keyed_hash(&a, "order-0001"), keyed_hash(&a, "order-0001"));
        assert_ne!(keyed_hash(&a, "order-0001"), keyed_hash(&a, "order-0002"));
        assert_ne!(keyed_hash(&a, "order-0001"), keyed_hash(&b, "order-0001"));
        assert_eq!(keyed_hash(&a, "k").len(), 16);
        let unkeyed: String = Sha256::digest(b"order-0001")[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_ne!(key_hash("order-0001"), unkeyed);
    }
}
