//! Every fault at every poll: one request (or engine run) whose `n`-th poll,
//! counted across everything it drives — the handler before its effect, the
//! response body, and every call of the store (`Faulty`) — panics or fails,
//! for `n = 0, 1, 2, ...` until a run passes every poll without the fault
//! firing. After each run the promise is checked: the effect happened at
//! most once, an answer the caller received whole replays byte for byte, the
//! caller is never told "not processed" once the effect happened, no key is
//! stuck past its lock, and a retry ends with exactly one effect.
//!
//! Cancellation at every poll is `cancel`'s; this adds the faults the design
//! does not expect: a panicking or failing handler, body or store.
#![allow(dead_code)]

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tower_idempotency::fingerprint::RequestFingerprint;
use tower_idempotency::store::{
    Begin, Completion, FencingToken, Maintenance, RecordKey, RecordTransaction, Store, StoreError,
    Timings, TransactionalStore,
};
use tower_idempotency::Scope;

/// What is injected at the chosen poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `panic!` inside the poll.
    Panic,
    /// The poll answers an error: `StoreError::Backend` from a store call,
    /// `Err` from the handler, an error frame from the body.
    Error,
}

/// One run's fault: at which poll, of what kind, and where it fired.
#[derive(Debug)]
pub struct Plan {
    polls: AtomicUsize,
    target: usize,
    fault: Fault,
    /// Counts only the polls of this site, when set.
    only: Option<&'static str>,
    fired: Mutex<Option<&'static str>>,
}

impl Plan {
    /// The fault `fault` at the `target`-th poll (from 0).
    pub fn new(target: usize, fault: Fault) -> Arc<Self> {
        Arc::new(Self {
            polls: AtomicUsize::new(0),
            target,
            fault,
            only: None,
            fired: Mutex::new(None),
        })
    }

    /// The fault `fault` at the first poll of `site` (a store call's name:
    /// `begin`, `complete`, `extend`, `release`, `wait`, ...), once.
    pub fn at_first(site: &'static str, fault: Fault) -> Arc<Self> {
        Arc::new(Self {
            polls: AtomicUsize::new(0),
            target: 0,
            fault,
            only: Some(site),
            fired: Mutex::new(None),
        })
    }

    /// A plan that never fires.
    pub fn none() -> Arc<Self> {
        Self::new(usize::MAX, Fault::Error)
    }

    /// Counts one poll at `site`: the fault to inject there, if this is the one.
    pub fn tick(&self, site: &'static str) -> Option<Fault> {
        if self.only.is_some_and(|only| only != site) {
            return None;
        }
        if self.polls.fetch_add(1, Ordering::SeqCst) != self.target {
            return None;
        }
        *self.fired.lock().unwrap() = Some(site);
        if self.fault == Fault::Panic {
            panic!("injected panic at poll {} ({site})", self.target);
        }
        Some(self.fault)
    }

    /// Where the fault fired, if it did.
    pub fn fired(&self) -> Option<&'static str> {
        *self.fired.lock().unwrap()
    }
}

fn injected() -> StoreError {
    StoreError::Backend("injected store error".into())
}

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// `future`, with a fault check before each of its polls.
fn faulty<'a, T: Send + 'a>(
    plan: Arc<Plan>,
    site: &'static str,
    future: impl Future<Output = Result<T, StoreError>> + Send + 'a,
) -> BoxFuture<'a, Result<T, StoreError>> {
    let mut future = Box::pin(future);
    Box::pin(std::future::poll_fn(move |cx| {
        if plan.tick(site).is_some() {
            return Poll::Ready(Err(injected()));
        }
        future.as_mut().poll(cx)
    }))
}

/// A store whose every call runs through the plan.
#[derive(Clone)]
pub struct Faulty<S> {
    pub inner: S,
    pub plan: Arc<Plan>,
}

impl<S: Store> Store for Faulty<S> {
    async fn begin(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<Begin, StoreError> {
        faulty(self.plan.clone(), "begin", self.inner.begin(key, request)).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: FencingToken,
        completion: Completion,
    ) -> Result<(), StoreError> {
        let call = self.inner.complete(key, token, completion);
        faulty(self.plan.clone(), "complete", call).await
    }

    async fn extend(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        faulty(self.plan.clone(), "extend", self.inner.extend(key, token)).await
    }

    async fn release(&self, key: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        faulty(self.plan.clone(), "release", self.inner.release(key, token)).await
    }

    async fn wait(&self, key: &RecordKey, timeout: Duration) -> Result<(), StoreError> {
        faulty(self.plan.clone(), "wait", self.inner.wait(key, timeout)).await
    }

    fn timings(&self) -> Timings {
        self.inner.timings()
    }
}

impl<S: Maintenance> Maintenance for Faulty<S> {
    async fn purge_expired(&self) -> Result<u64, StoreError> {
        faulty(
            self.plan.clone(),
            "purge_expired",
            self.inner.purge_expired(),
        )
        .await
    }

    async fn purge_scope(&self, scope: &Scope) -> Result<u64, StoreError> {
        faulty(
            self.plan.clone(),
            "purge_scope",
            self.inner.purge_scope(scope),
        )
        .await
    }
}

impl<S: TransactionalStore> TransactionalStore for Faulty<S> {
    type Transaction = FaultyTransaction<S::Transaction>;

    async fn begin_in_transaction(
        &self,
        key: &RecordKey,
        request: &RequestFingerprint<'_>,
    ) -> Result<(Begin, Option<Self::Transaction>), StoreError> {
        let plan = self.plan.clone();
        let call = self.inner.begin_in_transaction(key, request);
        let (begin, tx) = faulty(self.plan.clone(), "begin_in_transaction", call).await?;
        Ok((begin, tx.map(|inner| FaultyTransaction { inner, plan })))
    }

    async fn open(
        &self,
        key: &RecordKey,
        token: FencingToken,
    ) -> Result<Self::Transaction, StoreError> {
        let inner = faulty(self.plan.clone(), "open", self.inner.open(key, token)).await?;
        Ok(FaultyTransaction {
            inner,
            plan: self.plan.clone(),
        })
    }
}

/// A store transaction whose commit and rollback run through the plan.
pub struct FaultyTransaction<T> {
    inner: T,
    plan: Arc<Plan>,
}

impl<T: RecordTransaction> RecordTransaction for FaultyTransaction<T> {
    fn share(&self, extensions: &mut http::Extensions) {
        self.inner.share(extensions);
    }

    fn holds_claim(&self) -> bool {
        self.inner.holds_claim()
    }

    async fn commit(self, completion: Completion) -> Result<(), StoreError> {
        faulty(self.plan, "commit", self.inner.commit(completion)).await
    }

    async fn rollback(self) {
        let call = self.inner.rollback();
        // An error has nothing to say here: only a panic is injected.
        let _ = faulty(self.plan, "rollback", async move {
            call.await;
            Ok(())
        })
        .await;
    }
}

/// Yields once (a `Pending`, woken at once), counting both polls.
pub async fn point(plan: &Plan, site: &'static str) -> Result<(), Fault> {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if let Some(fault) = plan.tick(site) {
            return Poll::Ready(Err(fault));
        }
        if yielded {
            return Poll::Ready(Ok(()));
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// The handler's answer body: `{"charge":1}` in two frames, each poll
/// counted; `trickled` answers `Pending` before each frame (the layer then
/// records the rest in a task of its own), otherwise every frame is ready.
pub struct FaultyBody {
    plan: Arc<Plan>,
    frames: Vec<Bytes>,
    trickled: bool,
    waited: bool,
    trailers: Option<HeaderMap>,
}

/// The bytes `FaultyBody` produces.
pub const BODY: &[u8] = br#"{"charge":1}"#;

impl FaultyBody {
    pub fn new(plan: Arc<Plan>, trickled: bool) -> Self {
        Self {
            plan,
            frames: vec![
                Bytes::from_static(&BODY[..10]),
                Bytes::from_static(&BODY[10..]),
            ],
            trickled,
            waited: false,
            trailers: None,
        }
    }
}

impl Body for FaultyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.plan.tick("body").is_some() {
            return Poll::Ready(Some(Err(std::io::Error::other("injected body error"))));
        }
        if self.frames.is_empty() {
            return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
        }
        if self.trickled && !self.waited {
            self.waited = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.waited = false;
        let frame = self.frames.remove(0);
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }
}

/// Effects per key, counted in this process (or the caller's own backend).
pub trait Effects: Send + Sync {
    /// How many times the effect of `key` happened (committed).
    fn count(&self, key: &str) -> impl Future<Output = usize> + Send;

    /// The backend's own invariants broken (a pooled connection left inside
    /// a transaction, say).
    fn violations(&self) -> impl Future<Output = Vec<String>> + Send {
        async { Vec::new() }
    }
}

/// The handler's (or operation's) effect for a key: given the request's
/// extensions (where a transactional store put its transaction).
pub type Effect = Arc<dyn Fn(http::Extensions, String) -> BoxFuture<'static, ()> + Send + Sync>;

/// Effects counted in this process.
#[derive(Clone, Default)]
pub struct Counted(pub Arc<Mutex<HashMap<String, usize>>>);

impl Counted {
    pub fn apply(&self, key: &str) {
        *self.0.lock().unwrap().entry(key.to_owned()).or_default() += 1;
    }
}

impl Effects for Counted {
    async fn count(&self, key: &str) -> usize {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

impl Counted {
    /// Its effect: counted in this process.
    pub fn effect(&self) -> Effect {
        let counted = self.clone();
        Arc::new(move |_, key| {
            counted.apply(&key);
            Box::pin(async {})
        })
    }
}

/// What the caller of one request saw.
#[derive(Debug)]
pub enum Seen {
    /// The service future panicked (a server drops the connection).
    Panicked,
    /// The service answered `Err` (the handler's error, passed on).
    Failed,
    /// An answer: its status, `code`, and its body or the error reading it.
    Answer(StatusCode, String, Result<Bytes, String>),
}

/// A fresh key, never used before in this process.
pub fn fresh_key(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The request the scenarios send for `key`.
pub fn request(key: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":1}"#)))
        .unwrap();
    request.extensions_mut().insert(Scope::new("acme"));
    request
}

/// Sends `request` through `call` on a task of its own, so that a panic is
/// seen as the server sees it, and reads the answer whole.
pub async fn send<F, B>(call: F) -> Seen
where
    F: Future<Output = Result<Response<B>, std::io::Error>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    let task = tokio::spawn(async move {
        let response = match call.await {
            Ok(response) => response,
            Err(_) => return Seen::Failed,
        };
        let status = response.status();
        let body = response.into_body().collect().await;
        let body = body.map(|b| b.to_bytes()).map_err(|e| e.to_string());
        let code = body
            .as_ref()
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        Seen::Answer(status, code, body)
    });
    match tokio::time::timeout(Duration::from_secs(20), task).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(join)) if join.is_panic() => Seen::Panicked,
        Ok(Err(join)) => panic!("the request task ended: {join}"),
        Err(_) => panic!("the request did not answer within 20 s"),
    }
}

/// The codes that tell a caller nothing ran (or nothing was recorded), so
/// that it may run the request again elsewhere.
const NOT_PROCESSED: [&str; 3] = [
    "idempotency_store_unavailable",
    "internal_error",
    "overloaded",
];

/// The checks after one faulty run: `seen` is what its caller saw, `retry`
/// sends the same request through a service without faults.
pub async fn check<R, RF>(
    what: &str,
    key: &str,
    seen: &Seen,
    effects: &impl Effects,
    lock: Duration,
    mut retry: R,
) where
    R: FnMut() -> RF,
    RF: Future<Output = Seen>,
{
    let after = effects.count(key).await;
    assert!(after <= 1, "{what}: the effect happened {after} times");
    let broken = effects.violations().await;
    assert!(broken.is_empty(), "{what}: {}", broken.join("; "));
    if let Seen::Answer(status, code, body) = seen {
        if after == 1 && NOT_PROCESSED.contains(&code.as_str()) {
            panic!("{what}: the effect happened, but the caller was told {status} {code}");
        }
        // A success read whole is the effect's answer; a success whose body
        // then failed told the caller nothing (in transactional mode, its
        // writes were rolled back).
        if let (true, Ok(_)) = (status.is_success(), body) {
            assert_eq!(after, 1, "{what}: {status} without the effect");
        }
    }
    // Retry until the key is not in progress, within the lock and some slack.
    let deadline = tokio::time::Instant::now() + lock + Duration::from_secs(3);
    let answer = loop {
        let again = retry().await;
        match &again {
            Seen::Answer(StatusCode::CONFLICT, code, _) if code == "idempotency_in_progress" => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: the key is still in progress 3 s after its lock ran out"
                );
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            _ => break again,
        }
    };
    let count = effects.count(key).await;
    assert_eq!(
        count, 1,
        "{what}: after a retry ({answer:?}) the effect happened {count} times"
    );
    match (&answer, seen) {
        (Seen::Answer(StatusCode::CREATED, _, Ok(body)), _) if body.as_ref() == BODY => {}
        (Seen::Answer(StatusCode::GONE, code, _), _)
            if code == "idempotency_response_unavailable" =>
        {
            if let Seen::Answer(status, _, Ok(body)) = seen {
                assert!(
                    !(status.is_success() && body.as_ref() == BODY),
                    "{what}: the caller got the whole answer, a retry gets 410"
                );
            }
        }
        _ => panic!("{what}: the retry after the fault got {answer:?} (the caller saw {seen:?})"),
    }
    if let Seen::Answer(status, _, Ok(body)) = seen {
        if status.is_success() {
            assert!(
                matches!(&answer, Seen::Answer(s, _, Ok(b)) if s == status && b == body),
                "{what}: the caller got {status} {body:?}, a retry {answer:?}"
            );
        }
    }
}

/// Runs `run(plan)` for every poll `n` and both faults, until a run passes
/// every poll without the fault firing; `run` sends one request under the
/// plan and checks it. Returns how many poll points the path has.
pub async fn at_every_poll<F, Fut>(what: &str, mut run: F) -> usize
where
    F: FnMut(Arc<Plan>, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut points = 0;
    for fault in [Fault::Panic, Fault::Error] {
        for n in 0..=400 {
            let plan = Plan::new(n, fault);
            run(plan.clone(), format!("{what}, {fault:?} at poll {n}")).await;
            if plan.fired().is_none() {
                eprintln!("{what}: {fault:?} injected at each of {n} polls");
                points = points.max(n);
                break;
            }
            assert!(n < 400, "{what}: more than 400 polls");
        }
    }
    points
}

/// The handler the layer scenarios guard: two counted polls (the fault may
/// land on either), then its effect, then `201` with a `FaultyBody`. Faults
/// are injected only before the effect: a handler that fails after its
/// effect in plain mode broke its own contract (its failure frees the key).
pub fn handler(
    effect: Effect,
    plan: Arc<Plan>,
    trickled: bool,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<FaultyBody>,
    Error = std::io::Error,
    Future = impl Future<Output = Result<Response<FaultyBody>, std::io::Error>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let (effect, plan) = (effect.clone(), plan.clone());
        async move {
            let key = req.headers()["idempotency-key"]
                .to_str()
                .unwrap()
                .to_owned();
            for _ in 0..2 {
                if point(&plan, "handler").await.is_err() {
                    return Err(std::io::Error::other("injected handler error"));
                }
            }
            effect(req.extensions().clone(), key).await;
            let mut response = Response::new(FaultyBody::new(plan, trickled));
            *response.status_mut() = StatusCode::CREATED;
            Ok(response)
        }
    })
}

/// One faulty request through `IdempotencyLayer::new(Faulty(inner))`, its
/// claimed work settled, then checked with retries through a layer without
/// faults over the same store.
pub async fn layer_run<S: Store + Clone>(
    what: &str,
    inner: S,
    plan: Arc<Plan>,
    trickled: bool,
    lock: Duration,
) {
    use tower::{Layer, ServiceExt};
    use tower_idempotency::IdempotencyLayer;
    let effects = Counted::default();
    let key = fresh_key("fault");
    let faulty = Faulty {
        inner: inner.clone(),
        plan: plan.clone(),
    };
    let layer = IdempotencyLayer::new(faulty).with_wait_timeout(Duration::ZERO);
    let in_flight = layer.in_flight();
    let service = layer.layer(handler(effects.effect(), plan, trickled));
    let seen = send(service.oneshot(request(&key))).await;
    settle(what, &in_flight).await;
    let clean = IdempotencyLayer::new(inner)
        .with_wait_timeout(Duration::ZERO)
        .layer(handler(effects.effect(), Plan::none(), trickled));
    let retry = || send(clean.clone().oneshot(request(&key)));
    check(what, &key, &seen, &effects, lock, retry).await;
}

/// [`layer_run`] in transactional mode.
pub async fn transactional_run<S: TransactionalStore + Clone>(
    what: &str,
    inner: S,
    plan: Arc<Plan>,
    trickled: bool,
    lock: Duration,
    effect: Effect,
    effects: &impl Effects,
) {
    use tower::{Layer, ServiceExt};
    use tower_idempotency::IdempotencyLayer;
    let key = fresh_key("fault-tx");
    let faulty = Faulty {
        inner: inner.clone(),
        plan: plan.clone(),
    };
    let layer = IdempotencyLayer::transactional(faulty).with_wait_timeout(Duration::ZERO);
    let in_flight = layer.in_flight();
    let service = layer.layer(handler(effect.clone(), plan, trickled));
    let seen = send(service.oneshot(request(&key))).await;
    settle(what, &in_flight).await;
    let clean = IdempotencyLayer::transactional(inner)
        .with_wait_timeout(Duration::ZERO)
        .layer(handler(effect, Plan::none(), trickled));
    let retry = || send(clean.clone().oneshot(request(&key)));
    check(what, &key, &seen, effects, lock, retry).await;
}

/// The claimed work a run left behind finished (or was given up).
async fn settle(what: &str, in_flight: &tower_idempotency::InFlight) {
    let idle = tokio::time::timeout(Duration::from_secs(10), in_flight.idle()).await;
    assert!(
        idle.is_ok(),
        "{what}: claimed work still running 10 s after the answer"
    );
}

/// An engine operation's effect for a key, given its run's context (where a
/// transactional engine put its transaction).
pub type EngineEffect = Arc<
    dyn Fn(&tower_idempotency::engine::RunContext, String) -> BoxFuture<'static, ()> + Send + Sync,
>;

/// One faulty `Engine::run_bytes` on a plain engine over `Faulty(inner)`,
/// its effect counted in this process: [`engine_run_with`].
pub async fn engine_run<S: Store + Clone>(what: &str, inner: S, plan: Arc<Plan>, lock: Duration) {
    use tower_idempotency::engine::Engine;
    let effects = Counted::default();
    let counted = effects.clone();
    let effect: EngineEffect = Arc::new(move |_, key| {
        counted.apply(&key);
        Box::pin(async {})
    });
    let faulty = Engine::new(Faulty {
        inner: inner.clone(),
        plan: plan.clone(),
    });
    let clean = Engine::new(inner);
    engine_run_with(what, faulty, clean, plan, lock, effect, &effects).await;
}

/// One faulty `Engine::run_bytes` through `faulty` (an engine over a
/// `Faulty` store of `plan`): the operation polls twice (counted), then has
/// its effect and returns [`BODY`]; checked as [`layer_run`] is, with
/// retries through `clean` (the same store without faults), an outcome
/// read as the HTTP answer it stands for.
pub async fn engine_run_with(
    what: &str,
    faulty: tower_idempotency::engine::Engine,
    clean: tower_idempotency::engine::Engine,
    plan: Arc<Plan>,
    lock: Duration,
    effect: EngineEffect,
    effects: &impl Effects,
) {
    use tower_idempotency::engine::{Engine, Identity};
    let key = fresh_key("fault-engine");
    let faulty = faulty.with_wait_timeout(Duration::ZERO);
    let clean = clean.with_wait_timeout(Duration::ZERO);
    let run = |engine: Engine, plan: Arc<Plan>| {
        let (effect, key) = (effect.clone(), key.clone());
        async move {
            let id = tower_idempotency::IdempotencyKey::parse(key.as_bytes()).unwrap();
            let scope = Scope::new("jobs");
            let operation = move |context| async move {
                for _ in 0..2 {
                    if point(&plan, "operation").await.is_err() {
                        return Err(std::io::Error::other("injected operation error"));
                    }
                }
                effect(&context, key).await;
                Ok(Bytes::from_static(BODY))
            };
            let task = tokio::spawn(async move {
                engine
                    .run_bytes(&scope, &id, Identity::Bytes(b"m"), operation)
                    .await
            });
            engine_seen(tokio::time::timeout(Duration::from_secs(20), task).await)
        }
    };
    let seen = run(faulty.clone(), plan).await;
    settle(what, &faulty.in_flight()).await;
    let retry = || run(clean.clone(), Plan::none());
    check(what, &key, &seen, effects, lock, retry).await;
}

type EngineAnswer = Result<
    tower_idempotency::engine::Outcome<Bytes>,
    tower_idempotency::engine::EngineError<std::io::Error>,
>;

/// An engine outcome as the HTTP answer it stands for.
fn engine_seen(
    result: Result<Result<EngineAnswer, tokio::task::JoinError>, tokio::time::error::Elapsed>,
) -> Seen {
    use tower_idempotency::engine::{EngineError, Outcome};
    let answer =
        |status: StatusCode, code: &str| Seen::Answer(status, code.into(), Ok(Bytes::new()));
    match result.expect("the engine run did not end within 20 s") {
        Err(join) if join.is_panic() => Seen::Panicked,
        Err(join) => panic!("the engine task ended: {join}"),
        Ok(Ok(Outcome::Executed(b) | Outcome::Replayed(b))) => {
            Seen::Answer(StatusCode::CREATED, String::new(), Ok(b))
        }
        Ok(Ok(Outcome::InProgress)) => answer(StatusCode::CONFLICT, "idempotency_in_progress"),
        Ok(Ok(Outcome::Failed)) => answer(StatusCode::GONE, "idempotency_response_unavailable"),
        Ok(Ok(other)) => panic!("unexpected outcome {other:?}"),
        Ok(Err(EngineError::Store(_))) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_store_unavailable",
        ),
        Ok(Err(EngineError::OutcomeUnknown(_))) => answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency_outcome_unknown",
        ),
        Ok(Err(EngineError::Panicked)) => {
            answer(StatusCode::INTERNAL_SERVER_ERROR, "internal_error")
        }
        Ok(Err(EngineError::Operation(_))) => Seen::Failed,
        Ok(Err(other)) => panic!("unexpected engine error {other}"),
    }
}
