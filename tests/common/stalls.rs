//! The stall-at-every-phase harness the PostgreSQL and Redis stall tests
//! share.
//!
//! Instance A reaches the store through a TCP proxy that freezes (bytes held,
//! connections open: a hung server, a lost network) at one phase of a
//! request; instance B, on the same table or keyspace, reaches it directly
//! and retries the same request during and after the stall. Each phase is
//! reached deterministically: the claim by freezing before A sends anything,
//! the handler by a handler that signals it started and waits on a gate, the
//! completion (or commit) by a response body that freezes the proxy when the
//! layer reads it, the wait by freezing once A's store has a waiter.
//!
//! What must hold, for every stall length: every answer is the handler's
//! `201`, `409 idempotency_in_progress` or `503 idempotency_store_unavailable`;
//! within a lock (plus a slack) after the thaw a retry replays or runs; and
//! the handler's effect happened exactly once, every `2xx` for the key having
//! the same body. A live plain-mode owner is promised to survive stalls up to
//! half its lock only: past that (while its handler runs or its completion is
//! sent) a takeover and a second effect are its documented limit, and what
//! must still hold is fencing (the record is the last run's, so no
//! acknowledged completion is overwritten or lost, and every replay is the
//! same).

mod verdict;

use crate::support::proxy::Proxy;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, timeout, Instant};
use tower::util::BoxCloneService;
use tower::{Layer, ServiceExt};
use tower_idempotency::{
    body::{BoxError, ResponseBody},
    IdempotencyLayer, Scope,
};
use verdict::{Answer, Observed, Who};

/// The stores' lock: short, so a case takes a few seconds.
pub const LOCK: Duration = Duration::from_secs(1);
/// Instance A's store operation timeout: shorter than the lock.
pub const OPERATION: Duration = Duration::from_millis(300);
/// The stall lengths, as fractions of the lock.
pub const STALLS: [f64; 5] = [0.1, 0.5, 0.9, 1.1, 1.5];
/// A claim written at the thaw (a `begin` that timed out in A and ran when
/// the bytes went through) holds its key for a lock; this covers a waiter's
/// re-check and the retry's round trips on top.
const SLACK: Duration = Duration::from_secs(1);
/// How long A's handler has run when its store stalls, in the handler and
/// completion phases: longer than a lock, so its claim lives on the
/// heartbeat's extensions (and not on a multiple of a third of the lock).
const HEALTHY: Duration = Duration::from_millis(1200);
/// The longest any one request may take to be answered.
const PATIENCE: Duration = Duration::from_secs(15);
/// B's retries wait this long for a request in progress, then try again.
const B_WAIT: Duration = Duration::from_millis(200);
const B_PAUSE: Duration = Duration::from_millis(50);

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where A is when its store stalls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Sending `begin` (in transactional mode, the claim with the
    /// transaction's `BEGIN` and row lock, pipelined in one round trip).
    Claim,
    /// Running its handler (plain mode: its heartbeat's `extend`s stall;
    /// transactional: its open transaction, after its write).
    Handler,
    /// Sending `complete` (transactional: the completion and `COMMIT`).
    Complete,
    /// Waiting, as a duplicate, for B's request in progress.
    Wait,
}

// Redis has no transactional mode.
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Transactional,
}

/// The handler's effect in transactional mode, written through the
/// request's transaction: `(extensions, key, run)`.
pub type Write =
    Arc<dyn Fn(&http::Extensions, String, usize) -> BoxFuture<Result<(), String>> + Send + Sync>;
/// How many effects committed for a key.
pub type Count = Arc<dyn Fn(String) -> BoxFuture<usize> + Send + Sync>;

/// One case's instances, made by the store's module: A's layer on a store
/// behind `proxy`, B's on a store reached directly.
pub struct World {
    pub proxy: Arc<Proxy>,
    pub a: IdempotencyLayer,
    pub b: IdempotencyLayer,
    /// Whether A's store has a waiter registered now.
    pub a_waiting: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Transactional mode: the effect is a row, counted in SQL.
    pub effect: Option<(Write, Count)>,
}

/// What the handlers of one case share.
struct Ctx {
    key: String,
    phase: Phase,
    stall: Duration,
    proxy: Arc<Proxy>,
    write: Option<Write>,
    /// Who started each run of the case's key (run `n` is `runs[n - 1]`).
    runs: Mutex<Vec<Who>>,
    /// The held run (A's in `Handler`, B's in `Wait`) started.
    started: Notify,
    gate: watch::Sender<bool>,
    hold_armed: AtomicBool,
    freeze_armed: AtomicBool,
}

/// A response body that freezes the proxy when the layer first reads it, so
/// the next thing A sends (the completion) stalls.
struct StallBody {
    data: Option<Bytes>,
    freeze: Option<(Arc<Proxy>, Duration)>,
}

impl http_body::Body for StallBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some((proxy, stall)) = this.freeze.take() {
            drop(proxy.freeze_for(stall));
        }
        Poll::Ready(this.data.take().map(|data| Ok(Frame::data(data))))
    }
}

type Svc = BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<StallBody>>, BoxError>;

fn handler(
    ctx: Arc<Ctx>,
    who: Who,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<StallBody>,
    Error = BoxError,
    Future = impl Future<Output = Result<Response<StallBody>, BoxError>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |req: Request<Full<Bytes>>| {
        let ctx = ctx.clone();
        async move {
            let created = |body: String, freeze| {
                let body = StallBody {
                    data: Some(body.into()),
                    freeze,
                };
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap()
            };
            if req.headers()["idempotency-key"] != ctx.key.as_str() {
                return Ok(created("{}".into(), None)); // a warm-up
            }
            let run = {
                let mut runs = ctx.runs.lock().unwrap();
                runs.push(who);
                runs.len()
            };
            if let Some(write) = &ctx.write {
                write(req.extensions(), ctx.key.clone(), run).await?;
            }
            let holder = match ctx.phase {
                Phase::Handler => Some(Who::A),
                Phase::Wait => Some(Who::B),
                _ => None,
            };
            if holder == Some(who) && ctx.hold_armed.swap(false, Ordering::SeqCst) {
                ctx.started.notify_one();
                let _ = ctx.gate.subscribe().wait_for(|open| *open).await;
            }
            let freeze = ctx.phase == Phase::Complete
                && who == Who::A
                && ctx.freeze_armed.swap(false, Ordering::SeqCst);
            if freeze {
                // A slow handler: its claim is an extension's, not a fresh one.
                sleep(HEALTHY).await;
            }
            let freeze = freeze.then(|| (ctx.proxy.clone(), ctx.stall));
            Ok(created(
                format!(r#"{{"run":{run},"by":"{who:?}"}}"#),
                freeze,
            ))
        }
    })
}

async fn send(svc: Svc, who: Who, key: &str) -> Answer {
    let mut req = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"sku":"A-1"}"#)))
        .unwrap();
    req.extensions_mut().insert(Scope::new("tenant"));
    let mut answer = Answer {
        who,
        status: None,
        code: String::new(),
        replayed: false,
        body: String::new(),
    };
    let response = match timeout(PATIENCE, svc.oneshot(req)).await {
        Err(_) => {
            answer.code = format!("no answer in {PATIENCE:?}");
            return answer;
        }
        Ok(Err(error)) => {
            answer.code = format!("handler error: {error}");
            return answer;
        }
        Ok(Ok(response)) => response,
    };
    answer.status = Some(response.status());
    answer.replayed = response.headers().contains_key("idempotent-replayed");
    match response.into_body().collect().await {
        Ok(body) => answer.body = String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        Err(error) => answer.code = format!("body failed: {error}"),
    }
    if !answer.created() {
        let json: serde_json::Value = serde_json::from_str(&answer.body).unwrap_or_default();
        answer.code = json["code"].as_str().unwrap_or(&answer.code).to_owned();
    }
    answer
}

/// One case's result: a line of the report, and what it violated.
pub struct Verdict {
    pub line: String,
    pub violations: Vec<String>,
}

/// Runs every stall length of `phase` at once, each on a world of its own
/// from `make`, prints a line per case, and fails listing every violation.
pub async fn run_phase<F, Fut>(store: &str, mode: Mode, phase: Phase, mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = World>,
{
    let mut cases = Vec::new();
    for fraction in STALLS {
        let world = make().await;
        cases.push(tokio::spawn(run_case(mode, phase, fraction, world)));
    }
    let mut failed = Vec::new();
    for case in cases {
        let verdict = case.await.expect("the case did not panic");
        let status = if verdict.violations.is_empty() {
            "ok".to_owned()
        } else {
            format!("FAIL: {}", verdict.violations.join("; "))
        };
        eprintln!(
            "stalls | {store} | {mode:?} | {phase:?} | {} | {status}",
            verdict.line
        );
        if !verdict.violations.is_empty() {
            failed.push(format!(
                "{}: {}",
                verdict.line,
                verdict.violations.join("; ")
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{store} {mode:?}, stalls at {phase:?}:\n{}",
        failed.join("\n")
    );
}

async fn run_case(mode: Mode, phase: Phase, fraction: f64, world: World) -> Verdict {
    let stall = LOCK.mul_f64(fraction);
    let key = format!("stall-{phase:?}-{:03}", (fraction * 100.0).round() as u32);
    let (write, count) = match world.effect {
        Some((write, count)) => (Some(write), Some(count)),
        None => (None, None),
    };
    let ctx = Arc::new(Ctx {
        key: key.clone(),
        phase,
        stall,
        proxy: world.proxy.clone(),
        write,
        runs: Mutex::default(),
        started: Notify::new(),
        gate: watch::channel(false).0,
        hold_armed: AtomicBool::new(true),
        freeze_armed: AtomicBool::new(true),
    });
    let a: Svc = BoxCloneService::new(world.a.layer(handler(ctx.clone(), Who::A)));
    let b: Svc = BoxCloneService::new(
        world
            .b
            .with_wait_timeout(B_WAIT)
            .layer(handler(ctx.clone(), Who::B)),
    );
    let proxy = world.proxy;
    // Connections open and statements prepared, as on a server in service.
    for svc in [a.clone(), b.clone()] {
        let warm = send(svc, Who::A, &format!("warm-{key}")).await;
        assert!(warm.created(), "{key}: warm-up {warm:?}");
    }
    // The warm-ups' notifications reach A's listener before anything is
    // held, so that the first reply after a thaw answers what A sent.
    let mut replies = proxy.replies();
    loop {
        sleep(Duration::from_millis(50)).await;
        let now = proxy.replies();
        if now == replies {
            break;
        }
        replies = now;
    }

    let mut answers = Vec::new();
    let mut violations = Vec::new();
    let mut replies_at_freeze = 0;
    let a_first = match phase {
        Phase::Claim => {
            replies_at_freeze = proxy.replies();
            drop(proxy.freeze_for(stall));
            spawn_send(&a, Who::A, &key)
        }
        Phase::Handler => {
            let first = spawn_send(&a, Who::A, &key);
            started(&ctx, &key).await;
            // Longer than a lock already: the claim lives on its extensions.
            sleep(HEALTHY).await;
            drop(proxy.freeze_for(stall));
            let (proxy, ctx) = (proxy.clone(), ctx.clone());
            // The handler runs through the stall and a lock past it, which
            // its claim survives only if the extensions resume.
            tokio::spawn(async move {
                proxy.until_frozen(false).await;
                sleep(LOCK).await;
                ctx.gate.send_replace(true);
            });
            first
        }
        Phase::Complete => {
            let first = spawn_send(&a, Who::A, &key);
            let frozen = timeout(PATIENCE, proxy.until_frozen(true)).await;
            frozen.unwrap_or_else(|_| panic!("{key}: A's handler never answered"));
            first
        }
        Phase::Wait => {
            let owner = spawn_send(&b, Who::B, &key);
            started(&ctx, &key).await;
            let first = spawn_send(&a, Who::A, &key);
            let began = Instant::now();
            while !(world.a_waiting)() {
                assert!(began.elapsed() < PATIENCE, "{key}: A never waited");
                sleep(Duration::from_millis(2)).await;
            }
            // Past the waiter's first check (a round trip), well before its
            // first re-check (250 ms).
            sleep(Duration::from_millis(20)).await;
            drop(proxy.freeze_for(stall));
            // B completes while A's store is frozen: its wake-up is held.
            ctx.gate.send_replace(true);
            answers.push(owner.await.unwrap());
            first
        }
    };
    let thaw_at = Arc::new(Mutex::new(None::<Instant>));
    {
        let (proxy, thaw_at) = (proxy.clone(), thaw_at.clone());
        tokio::spawn(async move {
            proxy.until_frozen(false).await;
            *thaw_at.lock().unwrap() = Some(Instant::now());
        });
    }
    let thawed = || *thaw_at.lock().unwrap();
    // After a stalled claim B starts at the thaw, once A has answered, so
    // that A's late `begin` reaches the store first.
    let a_first = if phase == Phase::Claim {
        proxy.until_frozen(false).await;
        // The held `begin` answered (a reply passed the proxy).
        let waited = Instant::now();
        while proxy.replies() == replies_at_freeze && waited.elapsed() < LOCK {
            sleep(Duration::from_millis(1)).await;
        }
        answers.push(a_first.await.unwrap());
        None
    } else {
        Some(a_first)
    };

    // B retries until one of its requests sent after the thaw is answered 2xx.
    let started = Instant::now();
    let free_after = loop {
        let sent_after = thawed();
        let answer = send(b.clone(), Who::B, &key).await;
        let created = answer.created();
        answers.push(answer);
        if let Some(thaw) = sent_after {
            if created {
                break Some(thaw.elapsed());
            }
            if thaw.elapsed() > LOCK + SLACK {
                break None;
            }
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{key}: the proxy never thawed"
        );
        sleep(B_PAUSE).await;
    };
    if free_after.is_none() {
        violations.push(format!(
            "stuck: still in progress {:?} after the thaw",
            LOCK + SLACK
        ));
    }
    if let Some(first) = a_first {
        answers.push(first.await.unwrap());
    }
    // Both instances now answer it (A's pool and listener came back).
    let finals = [
        send(a.clone(), Who::A, &key).await,
        send(b.clone(), Who::B, &key).await,
    ];
    let runs = ctx.runs.lock().unwrap().clone();
    let effects = match &count {
        Some(count) => count(key.clone()).await,
        None => runs.len(),
    };
    let observed = Observed {
        answers,
        finals,
        runs,
        effects,
        free_after,
    };
    // A live plain-mode owner is promised to survive stalls up to half its lock.
    let strict = !(mode == Mode::Plain && matches!(phase, Phase::Handler | Phase::Complete))
        || fraction <= 0.5;
    violations.extend(observed.violations(strict));
    Verdict {
        line: observed.line(fraction),
        violations,
    }
}

async fn started(ctx: &Ctx, key: &str) {
    let started = timeout(PATIENCE, ctx.started.notified()).await;
    started.unwrap_or_else(|_| panic!("{key}: the held handler never started"));
}

fn spawn_send(svc: &Svc, who: Who, key: &str) -> tokio::task::JoinHandle<Answer> {
    let (svc, key) = (svc.clone(), key.to_owned());
    tokio::spawn(async move { send(svc, who, &key).await })
}
