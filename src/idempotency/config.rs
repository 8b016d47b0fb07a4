//! The layer's configuration, shared by its services, and the names of the
//! headers it reads and writes.

use crate::downstream::DownstreamSecret;
use crate::options::Options;
use crate::run::in_flight::InFlight;
use crate::store::erased::SharedStore;
use http::{HeaderName, HeaderValue};
use std::num::NonZeroUsize;
use std::time::Duration;

/// The `Idempotency-Key` header name.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Added to every replayed response: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Added to every recorded answer and its replays: how many seconds the
/// store keeps a key's record after its first response was recorded
/// ([`Timings::retention`](crate::store::Timings::retention), whole seconds). See
/// [`IdempotencyLayer::with_retention_header`](crate::IdempotencyLayer::with_retention_header).
pub const IDEMPOTENCY_KEY_RETENTION: HeaderName =
    HeaderName::from_static("idempotency-key-retention");
/// Added to a claimed request's `2xx` answer that the
/// [`RecordPolicy`](crate::RecordPolicy) did not record:
/// `Idempotency-Status: not-recorded`. Its key was released, so a retry runs
/// the handler again: the default policy records only `201 Created`, and a
/// handler answering `200` is unprotected until the layer is given
/// [`RecordSuccess`](crate::RecordSuccess) or a policy of its own. Never on
/// a recorded answer, a replay or a refusal.
pub const IDEMPOTENCY_STATUS: HeaderName = HeaderName::from_static("idempotency-status");

#[derive(Clone)]
pub(crate) struct Config<E, P> {
    pub(crate) scope: E,
    pub(crate) policy: P,
    /// Everything else: what changing the scope or the policy's type keeps.
    pub(crate) settings: Settings,
}

#[derive(Clone)]
pub(crate) struct Settings {
    /// The store, and whether handlers run in its transactions.
    pub(crate) store: SharedStore,
    pub(crate) header: HeaderName,
    pub(crate) options: Options,
    pub(crate) record_limit: usize,
    pub(crate) wait_timeout: Duration,
    /// The allow-list, without the headers always recorded with the body
    /// (`answer::REPRESENTATION_HEADERS`), `set-cookie`, or repeats.
    pub(crate) replayed_headers: Vec<HeaderName>,
    /// `Idempotency-Key-Retention`'s value, if it is sent.
    pub(crate) retention_header: Option<HeaderValue>,
    pub(crate) cancel_on_drop: bool,
    pub(crate) in_flight: InFlight,
    pub(crate) max_in_flight: Option<NonZeroUsize>,
    /// Keys the derivation of each claimed request's `DownstreamKeys`.
    pub(crate) downstream_secret: Option<DownstreamSecret>,
}

impl<E, P> std::ops::Deref for Config<E, P> {
    type Target = Settings;

    fn deref(&self) -> &Settings {
        &self.settings
    }
}

impl<E, P> std::ops::DerefMut for Config<E, P> {
    fn deref_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

impl<E, P> std::fmt::Debug for Config<E, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}
