use super::answer::REPRESENTATION_HEADERS;
use super::config::{Config, Settings, IDEMPOTENCY_KEY};
use super::service::IdempotencyService;
use crate::downstream::DownstreamSecret;
use crate::limits;
use crate::options::Options;
use crate::policy::{RecordCreated, RecordPolicy};
use crate::response::{ErrorFormat, KeyCodes, KeyReuseStatus, RefusalResponse};
use crate::run::in_flight::InFlight;
use crate::scope::{FromExtension, Scope, ScopeExtractor};
use crate::store::erased::{ErasedStore, SharedStore};
use crate::store::{PhaseStore, Store, TransactionalStore};
use http::header::{HeaderName, ETAG, LINK, LOCATION, SET_COOKIE};
use http::{HeaderValue, Method};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// The default [`IdempotencyLayer::with_record_limit`]: 1 MiB.
const DEFAULT_RECORD_LIMIT: usize = 1024 * 1024;

/// Applies [`IdempotencyService`] to a service: retries with the same
/// `Idempotency-Key` replay the first response instead of running again.
///
/// See the [module documentation](crate::idempotency) for the flow and an example.
#[derive(Clone)]
pub struct IdempotencyLayer<E = FromExtension<Scope>, P = RecordCreated> {
    /// Shared, so that `layer` (which axum may call per request) is an `Arc`
    /// clone; the builder methods copy it only if the layer was cloned.
    pub(crate) config: Arc<Config<E, P>>,
}

impl IdempotencyLayer {
    /// A layer over `store` with the contract's defaults: POST and PATCH,
    /// header `Idempotency-Key`, scope from a [`Scope`] request extension,
    /// `201` responses recorded, 1 MiB body limit, 5 s wait for a request in
    /// progress, and `location`, `etag`, `link` replayed besides the headers
    /// that describe the body (see [`with_replayed_headers`](Self::with_replayed_headers)).
    pub fn new(store: impl Store) -> Self {
        Self::with_store(SharedStore::plain(store))
    }

    /// Like [`new`](Self::new), and each claimed handler runs inside a
    /// transaction of `store` that also records its response: the handler's
    /// writes and the record commit together or not at all.
    ///
    /// With `PostgresStore` (feature `postgres`) the handler finds a
    /// `PostgresTransaction` in its request extensions (`Extension<PostgresTransaction>`
    /// in axum). A response the record policy does not record, an error, a
    /// panic, a process killed before the commit: each rolls the handler's
    /// writes back and frees the key, so the retry runs once on a clean slate.
    /// See `docs/idempotency.md` for the guarantees and their limits.
    pub fn transactional(store: impl TransactionalStore) -> Self {
        Self::with_store(SharedStore::transactional(store))
    }

    /// Like [`new`](Self::new), and each claimed handler finds
    /// [`Phases`](crate::engine::Phases) in its request extensions
    /// (`Extension<Phases>` in axum): recovery points, so that a retry after
    /// a failed, panicked or dead run resumes after its last finished phase
    /// instead of running the whole handler again. See "Recovery points
    /// (phases)" in `docs/idempotency.md`.
    ///
    /// Not in transactional mode, where the whole request is one
    /// transaction: a crash rolls everything back, and the retry starts over
    /// on a clean slate.
    pub fn phased(store: impl PhaseStore) -> Self {
        Self::with_store(SharedStore::phased(store))
    }

    fn with_store(store: SharedStore) -> Self {
        Self {
            config: Arc::new(Config {
                scope: FromExtension::new(),
                policy: RecordCreated,
                settings: Settings {
                    retention_header: retention_header(&**store.store()),
                    store,
                    header: IDEMPOTENCY_KEY,
                    options: Options::new(vec![Method::POST, Method::PATCH]),
                    record_limit: DEFAULT_RECORD_LIMIT,
                    wait_timeout: Duration::from_secs(5),
                    replayed_headers: vec![LOCATION, ETAG, LINK],
                    cancel_on_drop: false,
                    in_flight: InFlight::new(),
                    max_in_flight: None,
                    downstream_secret: None,
                },
            }),
        }
    }
}

/// The store's retention in whole seconds (rounded down: the record is kept
/// at least that long), or nothing for a store that does not say.
fn retention_header(store: &dyn ErasedStore) -> Option<HeaderValue> {
    store
        .timings()
        .retention
        .map(|retention| HeaderValue::from(retention.as_secs()))
}

impl<E: Clone, P: Clone> IdempotencyLayer<E, P> {
    fn config_mut(&mut self) -> &mut Config<E, P> {
        Arc::make_mut(&mut self.config)
    }

    /// Reads the key from another header than `Idempotency-Key`.
    pub fn with_header_name(mut self, header: HeaderName) -> Self {
        self.config_mut().header = header;
        self
    }

    /// The methods the layer applies to (default POST and PATCH); others pass through.
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config_mut().options.set_methods(methods);
        self
    }

    /// Where the scope (tenant) of a request comes from.
    pub fn with_scope<E2: ScopeExtractor>(self, scope: E2) -> IdempotencyLayer<E2, P> {
        self.replace_parts(|_, policy| (scope, policy))
    }

    /// Which responses are recorded (default: `201 Created` only).
    pub fn with_record_policy<P2: RecordPolicy>(self, policy: P2) -> IdempotencyLayer<E, P2> {
        self.replace_parts(|scope, _| (scope, policy))
    }

    fn replace_parts<E2, P2>(self, f: impl FnOnce(E, P) -> (E2, P2)) -> IdempotencyLayer<E2, P2> {
        let config = Arc::try_unwrap(self.config).unwrap_or_else(|shared| (*shared).clone());
        let (scope, policy) = f(config.scope, config.policy);
        IdempotencyLayer {
            config: Arc::new(Config {
                scope,
                policy,
                settings: config.settings,
            }),
        }
    }

    /// The largest request body buffered, in bytes (default 1 MiB); larger ones get `413`.
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.config_mut().options.set_body_limit(bytes);
        self
    }

    /// The largest response recorded, in bytes (default 1 MiB, as the request
    /// limit). A recorded response streams to the caller as it is produced
    /// while a copy is kept; one over the limit is still delivered in full,
    /// but not kept: the key is completed as "response unavailable" (a retry
    /// gets `410 idempotency_response_unavailable`, never a second run). The
    /// copy is held in memory until recorded, and a replay is served from
    /// memory, so this bounds both per request.
    pub fn with_record_limit(mut self, bytes: usize) -> Self {
        self.config_mut().record_limit = bytes;
        self
    }

    /// How long the whole request body may take to arrive (default: no limit);
    /// slower ones get `408 request_timeout`.
    pub fn with_body_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().options.set_body_timeout(timeout);
        self
    }

    /// How long a duplicate waits for the first request to finish before it gets
    /// `409 idempotency_in_progress` (default 5 s, timed from the store's first
    /// "in progress" answer; zero answers at once).
    ///
    /// At most 100 years (`Duration::MAX`: as long as the first request runs).
    pub fn with_wait_timeout(mut self, timeout: Duration) -> Self {
        self.config_mut().wait_timeout = limits::clamp(timeout, Duration::ZERO);
        self
    }

    /// The response headers recorded and replayed besides those that describe
    /// the body's bytes (default `location`, `etag`, `link`). `set-cookie` is
    /// never recorded, even if listed: a replay may reach another session of
    /// the same tenant.
    ///
    /// The headers that describe the bytes are always recorded with them,
    /// whatever this list says: `content-type`, `content-encoding`,
    /// `content-language`, `content-range`, `content-digest`, `repr-digest`
    /// and `digest`. Without them a replay would carry bytes its client cannot
    /// read, such as a handler's gzip body without its `content-encoding`.
    pub fn with_replayed_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let mut listed: Vec<HeaderName> = Vec::new();
        for header in headers {
            // Each name once: every value of a name is recorded by its first mention.
            if header != SET_COOKIE
                && !REPRESENTATION_HEADERS.contains(&header)
                && !listed.contains(&header)
            {
                listed.push(header);
            }
        }
        self.config_mut().replayed_headers = listed;
        self
    }

    /// Whether dropping the response future cancels a claimed handler
    /// (default `false`).
    ///
    /// By default, once a key is claimed the handler runs to completion: its
    /// first poll runs in place, and a handler that has to wait is handed to a
    /// task of its own (spawned on the current tokio runtime) before the
    /// caller's future can be dropped. A client that
    /// hangs up, a proxy that times out or an outer `TimeoutLayer` stops
    /// waiting for the answer, not the handler. Its response is recorded as
    /// usual, and the retry waits for it and replays it. Refusals, replays and
    /// requests the layer does not apply to never spawn.
    ///
    /// `true` restores plain tower semantics, where dropping the future drops
    /// the handler wherever it is awaiting, and the claim is released so that a
    /// retry runs it again. Choose it only for handlers that are safe to cut
    /// between any two awaits (a handler with a single effect at its very end,
    /// or one whose effects are all in a transaction that a cut rolls back),
    /// or that must not outlive their caller.
    pub fn with_cancel_on_drop(mut self, cancel: bool) -> Self {
        self.config_mut().cancel_on_drop = cancel;
        self
    }

    /// The claimed handlers running now, as a handle to wait for at shutdown.
    /// Every service this layer builds counts into it.
    pub fn in_flight(&self) -> InFlight {
        self.config.in_flight.clone()
    }

    /// Counts this layer's claimed handlers into `in_flight` (shared with other
    /// layers, so one handle waits for all of them).
    pub fn with_in_flight(mut self, in_flight: InFlight) -> Self {
        self.config_mut().in_flight = in_flight;
        self
    }

    /// Sheds load: at most `max` claimed handlers run at once (default: no
    /// cap). A request that claims its key while `max` are running is answered
    /// `503 overloaded` with `Retry-After`, its handler is not called and its
    /// key is released at once, so the retry runs normally once there is room.
    ///
    /// The cap applies after the store's decision: replays, refusals and waits
    /// for a request in progress are answered as usual under load (retries of
    /// completed requests are what an overloaded server should still serve).
    /// It counts what [`in_flight`](Self::in_flight) counts: claimed handlers,
    /// and responses still being recorded after their head was sent, across
    /// every layer sharing that [`InFlight`].
    ///
    /// Never zero (every claim shed), so a `NonZeroUsize`:
    /// `NonZeroUsize::new(256).unwrap()` in a `const`, checked when
    /// compiling, or `NonZeroUsize::try_from(n)?` for a number read at startup.
    pub fn with_max_in_flight(mut self, max: NonZeroUsize) -> Self {
        self.config_mut().max_in_flight = Some(max);
        self
    }

    /// Whether recorded answers carry `Idempotency-Key-Retention: <seconds>`
    /// (default `true`): the first response the record policy records and
    /// every replay of it say how long the store keeps the key's record after
    /// that first response (the store's [`retention`](crate::store::Timings::retention), in
    /// whole seconds; a store that does not say sends none). A client can
    /// retry under the same key within that time without agreeing with the
    /// server's clock. The value is the same on every answer, so a replay
    /// still matches its first answer; it is never stored in the record.
    /// Refusals and responses the policy does not record never carry it.
    pub fn with_retention_header(mut self, send: bool) -> Self {
        let config = self.config_mut();
        config.retention_header = match send {
            true => retention_header(&**config.store.store()),
            false => None,
        };
        self
    }

    /// Derives the [`DownstreamKeys`](crate::downstream::DownstreamKeys) that every
    /// claimed request finds in its extensions with HMAC-SHA-256 keyed by
    /// `secret` (default: SHA-256, no secret). Every instance, and every
    /// [`Engine`](crate::engine::Engine) whose keys must agree with this layer's,
    /// needs the same secret; changing it changes every downstream key (see
    /// [`DownstreamSecret`]).
    pub fn with_downstream_secret(mut self, secret: DownstreamSecret) -> Self {
        self.config_mut().downstream_secret = Some(secret);
        self
    }

    /// Plain JSON refusals (default) or RFC 9457 `application/problem+json`.
    pub fn with_error_format(mut self, format: ErrorFormat) -> Self {
        self.config_mut().options.set_error_format(format);
        self
    }

    /// Builds refusals the application's way: `respond(&refused, default)`
    /// returns the answer to send instead of `default`, the layer's JSON one
    /// (tower-governor's `error_handler`, for idempotency refusals).
    ///
    /// Every refusal passes through it: a gRPC status, an HTML page or the
    /// application's own error envelope, without parsing the default body.
    /// [`Refused`](crate::Refused) says what was refused, with which status and
    /// when to retry; it stays in the sent response's extensions too.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::{Layer, ServiceExt};
    /// use tower_idempotency::{IdempotencyLayer, MemoryStore, Refused, Scope};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::new(MemoryStore::new()).with_refusal_response(
    ///     |refused: &Refused, default: Response<Bytes>| {
    ///         let (mut parts, _) = default.into_parts();
    ///         parts.headers.insert("content-type", "text/plain".parse().unwrap());
    ///         let text = format!("{}: {}", refused.refusal.code(), refused.refusal.message());
    ///         Response::from_parts(parts, Bytes::from(text))
    ///     },
    /// );
    /// let svc = layer.layer(tower::service_fn(|_req: Request<Full<Bytes>>| async {
    ///     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
    /// }));
    /// let mut req = Request::post("/v1/orders").body(Full::new(Bytes::new())).unwrap();
    /// req.extensions_mut().insert(Scope::new("acme"));
    /// let res = svc.oneshot(req).await.unwrap();
    /// assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    /// assert_eq!(res.headers()["content-type"], "text/plain");
    /// # }
    /// ```
    pub fn with_refusal_response(mut self, respond: impl RefusalResponse) -> Self {
        self.config_mut().options.set_refusal_response(respond);
        self
    }

    /// The `code` of a missing, malformed or repeated key: one shared
    /// `idempotency_key_required` (default, [`KeyCodes::Shared`]), the key
    /// contract's code, or one each ([`KeyCodes::Distinct`]:
    /// `idempotency_key_invalid`, `idempotency_key_repeated`). Either way
    /// the body's `reason` member (`missing`, `invalid`, `repeated`) says
    /// which, and the hook of
    /// [`with_refusal_response`](Self::with_refusal_response) sees the
    /// [`Refusal`](crate::Refusal) itself.
    pub fn with_key_codes(mut self, codes: KeyCodes) -> Self {
        self.config_mut().options.responder.key_codes = codes;
        self
    }

    /// The status for a key reused with another request:
    /// [`Conflict`](KeyReuseStatus::Conflict) (`409`, default) or
    /// [`UnprocessableEntity`](KeyReuseStatus::UnprocessableEntity) (`422`),
    /// the two the IETF `Idempotency-Key` draft allows. A status read from
    /// configuration converts with `KeyReuseStatus::try_from(status)?`.
    pub fn with_key_reuse_status(mut self, status: KeyReuseStatus) -> Self {
        self.config_mut().options.responder.reuse_status = status;
        self
    }

    /// The `Retry-After` sent with `idempotency_in_progress`,
    /// `idempotency_store_unavailable` and `overloaded` (default 1 s, rounded
    /// up to whole seconds).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.config_mut().options.responder.retry_after = limits::clamp(after, Duration::ZERO);
        self
    }
}

impl<S, E: Clone, P: Clone> Layer<S> for IdempotencyLayer<E, P> {
    type Service = IdempotencyService<S, E, P>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.config.clone())
    }
}

impl<E, P> std::fmt::Debug for IdempotencyLayer<E, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("header", &self.config.header)
            .field("methods", &self.config.options.methods)
            .field("body_limit", &self.config.options.body_limit)
            .field("wait_timeout", &self.config.wait_timeout)
            .finish_non_exhaustive()
    }
}
