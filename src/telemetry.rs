//! Tracing spans and events for every decision, and (feature `metrics`) counters
//! and a latency histogram per outcome.
//!
//! Each request the layers decide runs in a span (`idempotency` or `lease`) with
//! the scope, a keyed hash of the key (never the key itself, nor an unkeyed
//! digest a log reader could match against guesses; see
//! [`set_key_hash_secret`]) and the outcome, and ends with one event at `DEBUG` (`WARN`
//! for store errors). With the `metrics` feature, the `metrics` crate's facade
//! receives `tower_idempotency_requests_total{layer, outcome}` and
//! `tower_idempotency_request_duration_seconds{layer, outcome}`, and gauges:
//! `tower_idempotency_claims_in_flight` (claimed handlers running),
//! `tower_idempotency_waiting_duplicates` (duplicates waiting for a request
//! in progress), `tower_idempotency_near_cache_entries` and `..._bytes` (what
//! the shared stores' near caches hold), `tower_idempotency_near_cache_hit_ratio`
//! (with `tower_idempotency_near_cache_lookups_total{result}`, `hit` or
//! `miss`), and `tower_idempotency_store_call_duration_seconds{operation}`,
//! a histogram of every store call the layers make (`begin`, `complete`,
//! `extend`, `release`, `wait`, `begin_in_transaction`, `open`, `commit`).
//!
//! The `outcome` of `layer="idempotency"`: `claimed` (ran and recorded),
//! `released` (ran, not recorded: an error, a panic, a status the record policy
//! declines), `replayed`, `key_reused` (409 key reuse), `in_progress` (409),
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
    KeyReused,
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
            Self::KeyReused => "key_reused",
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

/// A request's span, made by `make` (a `DEBUG` span) only when a subscriber
/// may want spans at that level: otherwise `Span::none()`, which, unlike a
/// disabled span, costs nothing to make, enter or drop.
pub(crate) fn request_span(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if tracing::level_enabled!(tracing::Level::DEBUG) {
        make()
    } else {
        tracing::Span::none()
    }
}

/// `future`, boxed, inside `span` when anyone receives the span. A disabled
/// span (no subscriber wants it) would still be entered and left at every
/// poll, and with tracing's `log` feature (axum's default) checked against
/// the logger each time, for nothing: on a replay that was a fifth of the
/// layer's own work.
pub(crate) fn boxed_in_span<F>(
    future: F,
    span: tracing::Span,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = F::Output> + Send>>
where
    F: std::future::Future + Send + 'static,
{
    if span.is_disabled() {
        Box::pin(future)
    } else {
        Box::pin(tracing::Instrument::instrument(future, span))
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
    let secret = KEY_HASH_SECRET.get_or_init(crate::random::hash_key);
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

/// Describes every metric the crate emits to the installed recorder, and
/// registers its gauges at zero, so that an exporter shows them (and a
/// dashboard finds them) before the first request moves one. Call it once,
/// after installing the recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "tower_idempotency_requests_total",
        "Requests decided, by layer and outcome"
    );
    describe_histogram!(
        "tower_idempotency_request_duration_seconds",
        Unit::Seconds,
        "Time to decide a request, by layer and outcome"
    );
    describe_counter!(
        "tower_idempotency_purged_records_total",
        "Expired records a PurgeTask deleted"
    );
    describe_histogram!(
        "tower_idempotency_store_call_duration_seconds",
        Unit::Seconds,
        "Store call latency, by operation"
    );
    describe_counter!(
        "tower_idempotency_near_cache_lookups_total",
        "Near cache lookups, by result (hit, miss)"
    );
    for (name, help) in [
        (
            "tower_idempotency_claims_in_flight",
            "Claimed handlers running",
        ),
        (
            "tower_idempotency_waiting_duplicates",
            "Duplicates waiting for a request in progress",
        ),
        (
            "tower_idempotency_near_cache_entries",
            "Completed records the near caches hold",
        ),
        (
            "tower_idempotency_near_cache_hit_ratio",
            "Near cache hits per lookup, since the process started",
        ),
    ] {
        describe_gauge!(name, help);
        metrics::gauge!(name).increment(0.0);
    }
    describe_gauge!(
        "tower_idempotency_near_cache_bytes",
        Unit::Bytes,
        "Bytes the near caches hold"
    );
    metrics::gauge!("tower_idempotency_near_cache_bytes").increment(0.0);
}

/// Gauges beside the counters (feature `metrics`; no-ops without it), each
/// moved by deltas so that several layers and stores in one process add up.
pub(crate) mod gauges {
    #[cfg(all(feature = "metrics", any(feature = "postgres", feature = "redis")))]
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Claimed handlers running now (`tower_idempotency_claims_in_flight`).
    pub(crate) fn claims_in_flight(delta: f64) {
        #[cfg(feature = "metrics")]
        metrics::gauge!("tower_idempotency_claims_in_flight").increment(delta);
        let _ = delta;
    }

    /// Duplicates waiting for a request in progress
    /// (`tower_idempotency_waiting_duplicates`).
    pub(crate) fn waiting_duplicates(delta: f64) {
        #[cfg(feature = "metrics")]
        metrics::gauge!("tower_idempotency_waiting_duplicates").increment(delta);
        let _ = delta;
    }

    /// Entries and bytes the near caches hold
    /// (`tower_idempotency_near_cache_entries`, `..._bytes`).
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn near_cache(entries: f64, bytes: f64) {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!("tower_idempotency_near_cache_entries").increment(entries);
            metrics::gauge!("tower_idempotency_near_cache_bytes").increment(bytes);
        }
        let _ = (entries, bytes);
    }

    #[cfg(all(feature = "metrics", any(feature = "postgres", feature = "redis")))]
    static LOOKUPS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

    /// A near cache lookup: counted by `result` (`hit`, `miss`) in
    /// `tower_idempotency_near_cache_lookups_total`, and the process's hit
    /// ratio so far in `tower_idempotency_near_cache_hit_ratio`.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn near_cache_lookup(hit: bool) {
        #[cfg(feature = "metrics")]
        {
            let result = if hit { "hit" } else { "miss" };
            metrics::counter!("tower_idempotency_near_cache_lookups_total", "result" => result)
                .increment(1);
            LOOKUPS[usize::from(hit)].fetch_add(1, Ordering::Relaxed);
            let hits = LOOKUPS[1].load(Ordering::Relaxed) as f64;
            let all = hits + LOOKUPS[0].load(Ordering::Relaxed) as f64;
            metrics::gauge!("tower_idempotency_near_cache_hit_ratio").set(hits / all);
        }
        let _ = hit;
    }

    /// One store call's duration, by operation
    /// (`tower_idempotency_store_call_duration_seconds{operation}`).
    #[cfg(feature = "metrics")]
    pub(crate) fn store_call(operation: &'static str, elapsed: std::time::Duration) {
        metrics::histogram!("tower_idempotency_store_call_duration_seconds", "operation" => operation)
            .record(elapsed.as_secs_f64());
    }
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
