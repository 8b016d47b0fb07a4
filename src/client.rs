//! Client side: one `Idempotency-Key` per logical operation, kept across
//! retries, and a retry policy that understands the layer's answers.
//!
//! A key names an *operation* ("pay order 42"), not an HTTP attempt: every
//! retry of the operation must carry the same key, or the server cannot tell a
//! retry from a new payment. Three pieces:
//!
//! - [`OperationKey`] — a fresh random key, generated once per operation and
//!   set on every attempt. Works with any client that exposes an
//!   [`http::HeaderMap`] (hyper, reqwest 0.12+, ureq 3, ...).
//! - [`IdempotencyKeyLayer`] — a tower layer that sets a fresh key on requests
//!   that have none (POST and PATCH by default). Put it **outside** the retry
//!   layer, so the key is chosen once, before the retry layer clones the request.
//! - `IdempotentRetry` (feature `client`) — a `tower::retry::Policy` that
//!   retries `409 idempotency_in_progress` after its `Retry-After`,
//!   `503` (such as `idempotency_store_unavailable`) and transport errors, a
//!   bounded number of times, and never retries `idempotency_key_reuse` or any
//!   other `4xx`. [`classify`] is the same decision as a plain function, for
//!   clients that are not tower services.
//!
//! # With tower
//!
//! ```
//! # #[cfg(feature = "client")]
//! # fn main() {
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tower::retry::RetryLayer;
//! use tower::ServiceBuilder;
//! use tower_idempotency::client::{IdempotencyKeyLayer, IdempotentRetry};
//!
//! let http_client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let client = ServiceBuilder::new()
//!     // Outermost: one key per call of the service, whatever the retries do.
//!     .layer(IdempotencyKeyLayer::new())
//!     // At most 4 attempts; `Retry-After` honoured up to 10 s.
//!     .layer(RetryLayer::new(IdempotentRetry::new(4)))
//!     .service(http_client);
//! # let _ = client;
//! # }
//! # #[cfg(not(feature = "client"))]
//! # fn main() {}
//! ```
//!
//! # With any client
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::client::{classify, OperationKey};
//!
//! # fn send(_: &http::HeaderMap) -> Result<http::Response<()>, ()> {
//! #     Ok(http::Response::builder().status(201).body(()).unwrap())
//! # }
//! let key = OperationKey::new(); // once per logical operation, never per attempt
//! for attempt in 1..=4 {
//!     let mut headers = http::HeaderMap::new();
//!     key.apply(&mut headers);
//!     let backoff = Duration::from_millis(100 << attempt);
//!     let wait = match send(&headers) {
//!         Ok(response) => {
//!             let answer = classify(response.status(), response.headers());
//!             if !answer.is_retryable() {
//!                 break; // a success (first run or replay), or a 4xx to fix
//!             }
//!             answer.retry_after().unwrap_or(backoff)
//!         }
//!         Err(_transport) => backoff,
//!     };
//!     # let _ = wait; break;
//!     // sleep(wait), then the next attempt, with the same key
//! }
//! ```

use crate::idempotency::IDEMPOTENCY_KEY;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, StatusCode};
use std::fmt;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// Makes keys for [`IdempotencyKeyLayer`]. Closures `Fn() -> String` implement it.
///
/// A key must be 8 to 128 characters `[A-Za-z0-9._-]` to be accepted by
/// [`IdempotencyLayer`](crate::IdempotencyLayer); a generator that returns
/// anything else makes the layer leave the request without a key (and the
/// server answer `400 idempotency_key_required`).
pub trait KeyGenerator: Clone + Send + Sync + 'static {
    /// A new key, never returned before.
    fn generate(&self) -> String;
}

impl<F> KeyGenerator for F
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    fn generate(&self) -> String {
        self()
    }
}

/// The default [`KeyGenerator`]: a random (version 4) UUID, as
/// [`OperationKey::new`] makes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RandomKey;

impl KeyGenerator for RandomKey {
    fn generate(&self) -> String {
        crate::random::uuid_v4()
    }
}

/// The key of one logical operation, to send on each of its attempts.
///
/// ```
/// use tower_idempotency::client::OperationKey;
///
/// let key = OperationKey::new();
/// let mut first = http::HeaderMap::new();
/// let mut retry = http::HeaderMap::new();
/// key.apply(&mut first);
/// key.apply(&mut retry);
/// assert_eq!(first["idempotency-key"], retry["idempotency-key"]);
/// assert_eq!(first["idempotency-key"], key.as_str());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OperationKey(HeaderValue);

impl OperationKey {
    /// A fresh key: a random (version 4) UUID, `8e03978e-40d5-43e8-bc93-6894a57f9324`,
    /// the form clients and the IETF draft's examples use (122 random bits from
    /// the operating system).
    pub fn new() -> Self {
        Self(
            HeaderValue::from_str(&crate::random::uuid_v4())
                .expect("hex digits are a valid header value"),
        )
    }

    /// A key you chose (say, derived from your own operation id); `None` unless
    /// it is 8 to 128 characters `[A-Za-z0-9._-]`.
    pub fn from_key(key: &str) -> Option<Self> {
        let parsed = crate::IdempotencyKey::parse(key.as_bytes())?;
        HeaderValue::from_str(parsed.as_str()).ok().map(Self)
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        self.0.to_str().expect("keys are ASCII")
    }

    /// The key as a header value.
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }

    /// Sets `Idempotency-Key` to this key, replacing any value already there.
    pub fn apply(&self, headers: &mut HeaderMap) {
        headers.insert(IDEMPOTENCY_KEY, self.0.clone());
    }
}

impl Default for OperationKey {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OperationKey").field(&self.as_str()).finish()
    }
}

impl fmt::Display for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sets a fresh `Idempotency-Key` on requests that have none: see
/// [`IdempotencyKeyService`].
///
/// Place it outside (before, in a `ServiceBuilder`) any retry layer: the key
/// is chosen once per call of the outer service, and every attempt the retry
/// layer makes is a clone of the request that already carries it. Placed
/// inside, each attempt would get a new key and the server could not recognise
/// the retries — `IdempotentRetry` (feature `client`) refuses to retry such
/// requests.
#[derive(Clone, Debug)]
pub struct IdempotencyKeyLayer<G = RandomKey> {
    config: Arc<KeyConfig<G>>,
}

#[derive(Debug)]
struct KeyConfig<G> {
    header: HeaderName,
    methods: Vec<Method>,
    generator: G,
}

impl IdempotencyKeyLayer {
    /// Random keys ([`RandomKey`]) in `Idempotency-Key`, on POST and PATCH.
    pub fn new() -> Self {
        Self::with_generator(RandomKey)
    }
}

impl Default for IdempotencyKeyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<G: KeyGenerator> IdempotencyKeyLayer<G> {
    /// Keys from `generator`, in `Idempotency-Key`, on POST and PATCH.
    pub fn with_generator(generator: G) -> Self {
        Self {
            config: Arc::new(KeyConfig {
                header: IDEMPOTENCY_KEY,
                methods: vec![Method::POST, Method::PATCH],
                generator,
            }),
        }
    }

    /// Writes the key to another header (match the server's
    /// `IdempotencyLayer::with_header_name`).
    pub fn with_header_name(self, header: HeaderName) -> Self {
        self.map_config(|c| KeyConfig { header, ..c })
    }

    /// The methods that get a key (default POST and PATCH).
    pub fn with_methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.map_config(|c| KeyConfig { methods, ..c })
    }

    fn map_config(self, f: impl FnOnce(KeyConfig<G>) -> KeyConfig<G>) -> Self {
        let config = Arc::try_unwrap(self.config).unwrap_or_else(|shared| KeyConfig {
            header: shared.header.clone(),
            methods: shared.methods.clone(),
            generator: shared.generator.clone(),
        });
        Self {
            config: Arc::new(f(config)),
        }
    }
}

impl<S, G> Layer<S> for IdempotencyKeyLayer<G> {
    type Service = IdempotencyKeyService<S, G>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyKeyService {
            inner,
            config: self.config.clone(),
        }
    }
}

/// Sets a fresh key on each request of the configured methods that carries
/// none; a key the caller set (one operation sent through several calls) is
/// kept. Built by [`IdempotencyKeyLayer`].
#[derive(Clone, Debug)]
pub struct IdempotencyKeyService<S, G = RandomKey> {
    inner: S,
    config: Arc<KeyConfig<G>>,
}

impl<S, G> IdempotencyKeyService<S, G> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, G, B> Service<Request<B>> for IdempotencyKeyService<S, G>
where
    S: Service<Request<B>>,
    G: KeyGenerator,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let config = &self.config;
        if config.methods.contains(req.method()) && !req.headers().contains_key(&config.header) {
            if let Ok(key) = HeaderValue::from_str(&config.generator.generate()) {
                req.headers_mut().insert(config.header.clone(), key);
            }
        }
        self.inner.call(req)
    }
}

/// How a client should treat a response from a server behind
/// [`IdempotencyLayer`](crate::IdempotencyLayer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Answer {
    /// Done: a success (first run or replay), or an error that a retry with
    /// the same request cannot fix (`409 idempotency_key_reuse`, `422`,
    /// `400`, `401`, other `4xx` and `5xx`).
    Final,
    /// `409 idempotency_in_progress`: the first attempt is still running;
    /// retry the same request (same key) after `retry_after` to get its
    /// response.
    InProgress {
        /// The server's `Retry-After`, in delay-seconds.
        retry_after: Option<Duration>,
    },
    /// `503`, such as `idempotency_store_unavailable` (the request was not
    /// run): retry the same request later.
    Unavailable {
        /// The server's `Retry-After`, in delay-seconds.
        retry_after: Option<Duration>,
    },
}

impl Answer {
    /// Whether the same request (same key) should be sent again.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, Self::Final)
    }

    /// The server's `Retry-After` for a retryable answer.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            Self::InProgress { retry_after } | Self::Unavailable { retry_after } => retry_after,
            Self::Final => None,
        }
    }
}

/// Classifies a response from its status and headers, without reading the body.
///
/// The layer's two `409`s are told apart by `Retry-After`: it is sent with
/// `idempotency_in_progress` (retry) and never with `idempotency_key_reuse`
/// (a different request under the same key: retrying cannot help). A `409`
/// without `Retry-After` is therefore final, as is any other `4xx`. Only the
/// delay-seconds form of `Retry-After` is read; an HTTP date counts as absent.
///
/// ```
/// use http::{HeaderMap, HeaderValue, StatusCode};
/// use std::time::Duration;
/// use tower_idempotency::client::{classify, Answer};
///
/// let mut retry_after = HeaderMap::new();
/// retry_after.insert("retry-after", HeaderValue::from_static("2"));
/// assert_eq!(
///     classify(StatusCode::CONFLICT, &retry_after),
///     Answer::InProgress { retry_after: Some(Duration::from_secs(2)) }
/// );
/// assert_eq!(classify(StatusCode::CONFLICT, &HeaderMap::new()), Answer::Final); // key reuse
/// assert_eq!(classify(StatusCode::UNPROCESSABLE_ENTITY, &retry_after), Answer::Final);
/// assert_eq!(
///     classify(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()),
///     Answer::Unavailable { retry_after: None }
/// );
/// assert_eq!(classify(StatusCode::CREATED, &HeaderMap::new()), Answer::Final);
/// ```
pub fn classify(status: StatusCode, headers: &HeaderMap) -> Answer {
    let retry_after = || {
        headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs)
    };
    match status {
        StatusCode::CONFLICT if headers.contains_key(RETRY_AFTER) => Answer::InProgress {
            retry_after: retry_after(),
        },
        StatusCode::SERVICE_UNAVAILABLE => Answer::Unavailable {
            retry_after: retry_after(),
        },
        _ => Answer::Final,
    }
}

#[cfg(feature = "client")]
pub use retry::IdempotentRetry;

#[cfg(feature = "client")]
mod retry {
    use super::{classify, Answer};
    use crate::idempotency::IDEMPOTENCY_KEY;
    use http::{HeaderName, Request, Response};
    use std::time::Duration;

    /// A [`tower::retry::Policy`] for requests that carry an idempotency key
    /// (feature `client`).
    ///
    /// Retries, up to `max_attempts` attempts in all (the first included):
    ///
    /// - `409` with `Retry-After` (`idempotency_in_progress`), after the
    ///   `Retry-After` delay (capped by [`with_max_retry_after`](Self::with_max_retry_after));
    /// - `503` (`idempotency_store_unavailable` or any other), after its
    ///   `Retry-After`, or the backoff when it has none;
    /// - transport errors (connection refused, reset, closed before the
    ///   response), after the backoff: with a key, an attempt whose answer was
    ///   lost is replayed, not run again.
    ///
    /// Never retried: successes, `409 idempotency_key_reuse` (no `Retry-After`),
    /// `422` and every other `4xx`, other `5xx`. Requests without the key header
    /// are never retried unless their method is idempotent by definition (GET,
    /// PUT, DELETE, ...): without a key a lost answer may mean the operation
    /// ran, and running it again is what keys exist to prevent.
    ///
    /// The backoff is exponential (default 100 ms doubling up to 5 s) with
    /// jitter between half and all of each step. The request body must be
    /// `Clone` (e.g. `Full<Bytes>`): the policy resends the same bytes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::client::IdempotentRetry;
    ///
    /// let policy = IdempotentRetry::new(5)
    ///     .with_backoff(Duration::from_millis(50), Duration::from_secs(2))
    ///     .with_max_retry_after(Duration::from_secs(5));
    /// # let _ = policy;
    /// ```
    #[derive(Clone, Debug)]
    pub struct IdempotentRetry {
        max_attempts: u32,
        attempts: u32,
        base_backoff: Duration,
        max_backoff: Duration,
        max_retry_after: Duration,
        header: HeaderName,
    }

    impl IdempotentRetry {
        /// At most `max_attempts` attempts per request, the first included
        /// (`1` never retries).
        pub fn new(max_attempts: u32) -> Self {
            Self {
                max_attempts: max_attempts.max(1),
                attempts: 0,
                base_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                max_retry_after: Duration::from_secs(10),
                header: IDEMPOTENCY_KEY,
            }
        }

        /// The backoff for errors and `503`s without `Retry-After`: `base`,
        /// doubling per attempt, capped at `max` (default 100 ms and 5 s).
        pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
            self.base_backoff = base;
            self.max_backoff = max.max(base);
            self
        }

        /// The longest `Retry-After` honoured (default 10 s): longer values
        /// are shortened to it, so a misconfigured server cannot park the
        /// client for an hour.
        pub fn with_max_retry_after(mut self, max: Duration) -> Self {
            self.max_retry_after = max;
            self
        }

        /// The key header to require on retried requests (default
        /// `Idempotency-Key`).
        pub fn with_header_name(mut self, header: HeaderName) -> Self {
            self.header = header;
            self
        }

        /// Attempts made so far for the request this policy instance follows.
        pub fn attempts(&self) -> u32 {
            self.attempts
        }

        fn backoff(&self) -> Duration {
            let step = self
                .base_backoff
                .saturating_mul(1 << self.attempts.saturating_sub(1).min(16))
                .min(self.max_backoff);
            // Jitter in [step/2, step], so clients that failed together spread out.
            let fraction =
                (u64::from_le_bytes(crate::random::bytes()) >> 11) as f64 / (1u64 << 53) as f64;
            step.mul_f64(0.5 + fraction / 2.0)
        }

        /// The delay before the next attempt, or `None` to stop.
        fn next_delay(&mut self, answer: Option<Answer>) -> Option<Duration> {
            self.attempts += 1;
            if self.attempts >= self.max_attempts {
                return None;
            }
            match answer {
                None => Some(self.backoff()),
                Some(answer) if !answer.is_retryable() => None,
                Some(answer) => Some(match answer.retry_after() {
                    Some(after) => after.min(self.max_retry_after),
                    None => self.backoff(),
                }),
            }
        }
    }

    impl<B, ResBody, E> tower::retry::Policy<Request<B>, Response<ResBody>, E> for IdempotentRetry
    where
        B: Clone,
    {
        type Future = tokio::time::Sleep;

        fn retry(
            &mut self,
            _req: &mut Request<B>,
            result: &mut Result<Response<ResBody>, E>,
        ) -> Option<Self::Future> {
            let answer = match result {
                Ok(response) => Some(classify(response.status(), response.headers())),
                Err(_) => None,
            };
            self.next_delay(answer).map(tokio::time::sleep)
        }

        fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
            let keyed = req.headers().contains_key(&self.header);
            (keyed || req.method().is_idempotent()).then(|| req.clone())
        }
    }
}
