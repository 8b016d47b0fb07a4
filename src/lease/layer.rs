use super::config::{LeaseConfig, LeaseSettings, StartedStatus};
use super::key::{JobCost, JobKeyExtractor};
use super::kind::JobKind;
use super::service::LeaseService;
use crate::lease::store::{Budget, JobStore};
use crate::options::Options;
use crate::response::{ErrorFormat, RefusalResponse};
use crate::scope::{FromExtension, Scope, ScopeExtractor};
use http::Method;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// Applies [`LeaseService`]: one live job per natural key; duplicates join it.
///
/// See the [module documentation](crate::lease) for the flow and an example.
#[derive(Clone)]
pub struct LeaseLayer<K, E = FromExtension<Scope>> {
    pub(crate) config: LeaseConfig<K, E>,
}

impl<K: JobKeyExtractor> LeaseLayer<K> {
    /// A layer over `store` for jobs of one `kind`, keyed by `key` within the
    /// tenant from a [`Scope`] request extension.
    ///
    /// A job is identified by `(tenant, kind, key)`, three separate fields. The
    /// kind keeps two layers apart that share a store (say `/exports` and
    /// `/imports`, both keyed by a month): give each route its own, e.g.
    /// `"export".parse()?` and `"import".parse()?`; a [`JobKind`] is never
    /// empty. Leases are granted to `"{hostname}-{pid}"`
    /// unless [`with_owner`](Self::with_owner) names the worker; job locations
    /// are `/jobs/{job_id}` unless [`with_location_prefix`](Self::with_location_prefix).
    pub fn new(store: impl JobStore, kind: JobKind, key: K) -> Self {
        let kind = kind.into();
        Self {
            config: LeaseConfig {
                key,
                scope: FromExtension::new(),
                settings: LeaseSettings {
                    store: Arc::new(store),
                    kind,
                    owner: default_owner().into(),
                    budget: None,
                    cost: None,
                    location_prefix: "/jobs/".into(),
                    started_status: StartedStatus::default(),
                    options: lease_options(),
                },
            },
        }
    }
}

/// POST, and start bodies of at most 64 KiB.
fn lease_options() -> Options {
    let mut options = Options::new(vec![Method::POST]);
    options.set_body_limit(64 * 1024);
    options
}

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
    format!("{host}-{}", std::process::id())
}

impl<K, E> LeaseLayer<K, E> {
    /// Where the tenant comes from (default: a [`Scope`] request extension).
    pub fn with_scope<E2: ScopeExtractor>(self, scope: E2) -> LeaseLayer<K, E2> {
        let LeaseConfig { key, settings, .. } = self.config;
        LeaseLayer {
            config: LeaseConfig {
                key,
                scope,
                settings,
            },
        }
    }

    /// The methods that start jobs (default POST); others pass through to the
    /// inner service untouched, so `get(read).post(start).layer(lease)` never
    /// starts a job from a `GET` or `HEAD`.
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.options.set_methods(methods);
        self
    }

    /// The worker identity new leases are granted to.
    pub fn with_owner(mut self, owner: impl Into<Arc<str>>) -> Self {
        self.config.owner = owner.into();
        self
    }

    /// Limits what each tenant starts per period; over it → `429
    /// budget_exhausted` (with `Retry-After` and `resets_at`, when the period
    /// resets) before anything starts. Joining a job is free. Each job costs 1
    /// unless [`with_cost`](Self::with_cost) estimates it.
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.config.budget = Some(budget);
        self
    }

    /// Estimates each start's cost against the budget, in its units (e.g.
    /// model tokens): reserved atomically with the job's creation (so
    /// concurrent starts cannot overshoot, across processes on PostgreSQL),
    /// kept once the job completes, returned if it fails.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::request::Parts;
    /// use std::num::NonZeroU64;
    /// use tower_idempotency::{LeaseLayer, lease::JsonJobKey};
    /// use tower_idempotency::lease::store::{Budget, MemoryJobStore};
    /// use tower_idempotency::Scope;
    ///
    /// // 50 000 tokens per tenant and day; a report's estimate by its type.
    /// const TOKENS_PER_DAY: NonZeroU64 = NonZeroU64::new(50_000).unwrap();
    /// let key = JsonJobKey::new(["type", "period"]);
    /// let layer = LeaseLayer::new(MemoryJobStore::new(), "report".parse()?, key)
    ///     .with_budget(Budget::per_day(TOKENS_PER_DAY))
    ///     .with_cost(|_: &Scope, _: &Parts, body: &Bytes| {
    ///         if body.windows(6).any(|w| w == b"health") { 12_000 } else { 3_000 }
    ///     });
    /// # let _ = layer;
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    pub fn with_cost(mut self, cost: impl JobCost) -> Self {
        self.config.cost = Some(Arc::new(cost));
        self
    }

    /// The largest start body buffered (default 64 KiB) → else `413`.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.config.options.set_body_limit(bytes);
        self
    }

    /// How long the start body may take to arrive (default: no limit) → else `408`.
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        self.config.options.set_body_timeout(timeout);
        self
    }

    /// The path prefix of the `Location` to poll; the job id is appended
    /// (default `/jobs/`).
    pub fn with_location_prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.config.location_prefix = prefix.into();
        self
    }

    /// The status of a start that created (or stole) the job: `202 Accepted`
    /// (default: the work runs after the answer, poll its `Location`), or
    /// `200 OK` / `201 Created` for an API whose contract says so. The body
    /// flags what happened either way (`"created": true` or
    /// `"stolen": true`); joins and complete jobs stay `200`.
    ///
    /// ```
    /// use tower_idempotency::lease::{JsonJobKey, StartedStatus};
    /// use tower_idempotency::lease::store::MemoryJobStore;
    /// use tower_idempotency::LeaseLayer;
    ///
    /// // Every start answers 200; the body's `created`/`join` says which.
    /// let layer = LeaseLayer::new(MemoryJobStore::new(), "report".parse()?, JsonJobKey::new(["period"]))
    ///     .with_started_status(StartedStatus::Ok);
    /// # let _ = layer;
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    pub fn with_started_status(mut self, status: StartedStatus) -> Self {
        self.config.started_status = status;
        self
    }

    /// Plain JSON refusals (default) or RFC 9457 problem details.
    pub fn with_error_format(mut self, format: ErrorFormat) -> Self {
        self.config.options.set_error_format(format);
        self
    }

    /// Builds refusals the application's way, as
    /// [`IdempotencyLayer::with_refusal_response`](crate::IdempotencyLayer::with_refusal_response)
    /// does: every refusal of this layer (`401`, `408`, `413`, `400`,
    /// `429 budget_exhausted`, `503 job_store_unavailable`) passes through it.
    pub fn with_refusal_response(mut self, respond: impl RefusalResponse) -> Self {
        self.config.options.set_refusal_response(respond);
        self
    }
}

impl<S, K: Clone, E: Clone> Layer<S> for LeaseLayer<K, E> {
    type Service = LeaseService<S, K, E>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaseService::new(inner, Arc::new(self.config.clone()))
    }
}

impl<K, E> std::fmt::Debug for LeaseLayer<K, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLayer")
            .field("kind", &self.config.kind)
            .field("owner", &self.config.owner)
            .field("budget", &self.config.budget)
            .field("location_prefix", &self.config.location_prefix)
            .field("started_status", &self.config.started_status)
            .finish_non_exhaustive()
    }
}
