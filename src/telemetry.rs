//! Tracing spans and events for every decision, and (feature `metrics`) counters
//! and a latency histogram per outcome.
//!
//! Each request the layers decide runs in a span (`idempotency` or `lease`) with
//! the scope, a hash of the key (never the key itself: it may be guessable or
//! carry meaning) and the outcome, and ends with one event at `DEBUG` (`WARN`
//! for store errors). With the `metrics` feature, the `metrics` crate's facade
//! receives `tower_idempotency_requests_total{layer, outcome}` and
//! `tower_idempotency_request_duration_seconds{layer, outcome}`.

use sha2::{Digest, Sha256};
use std::time::Duration;

/// What the idempotency layer did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
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

impl From<crate::Refusal> for Outcome {
    fn from(refusal: crate::Refusal) -> Self {
        use crate::Refusal;
        match refusal {
            Refusal::KeyReuse => Self::Reused,
            Refusal::InProgress => Self::InProgress,
            Refusal::StoreUnavailable => Self::StoreError,
            Refusal::HandlerFailed => Self::Released,
            Refusal::ResponseUnavailable => Self::Unavailable,
            _ => Self::Rejected,
        }
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

/// A short, stable, non-reversible id of a key for logs: 16 hex digits of SHA-256.
pub(crate) fn key_hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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

/// Records the scope and key hash on the current span, if anyone listens.
pub(crate) fn identify(scope: &str, key: &str) {
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("scope", scope);
        span.record("key_hash", key_hash(key).as_str());
    }
}
