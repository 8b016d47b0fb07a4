//! The application instances and their clients. Each instance host serves
//! HTTP/1.1 (hyper over turmoil TCP) through the real `IdempotencyLayer` on a
//! `RemoteStore`, over a handler whose effect is an entry in the ledger.
//! Clients send keyed requests to either instance, hang up at random
//! points (the connection is dropped mid-request), and retry.

use super::checker::{Attempt, Effect, Outcome, Purge};
use super::wire::RemoteStore;
use super::{now_ms, Rng, Shared, LOCK};
use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_idempotency::{engine, IdempotencyLayer, Scope};
use turmoil::net::{TcpListener, TcpStream};

const PORT: u16 = 80;
/// How long a duplicate waits for the request in progress.
const WAIT: Duration = Duration::from_millis(300);
pub const TENANTS: [&str; 2] = ["tenant-a", "tenant-b"];
/// Both tenants use the same key names: a record of one must never answer the other.
pub const KEYS: usize = 5;
const OPS_PER_CLIENT: usize = 6;
const ATTEMPTS: usize = 6;
/// Of an instance's maintenance calls, the share that erases a tenant
/// (`purge_scope`); the rest are `purge_expired`.
const PURGE_SCOPE_PERCENT: u64 = 15;

/// The body of a request: the item it orders (named by its key) and a
/// variant (another variant under the same key is another request).
#[derive(Deserialize)]
struct Order {
    item: String,
    v: u8,
}

/// The instance host's software.
pub async fn serve_instance(name: &'static str, seed: u64, shared: Shared) -> turmoil::Result {
    let rng = Arc::new(Mutex::new(Rng::new(seed)));
    let shared_for_maintenance = shared.clone();
    let handler = tower::service_fn(move |req: Request<Body>| {
        handle(name, rng.clone(), shared.effects.clone(), req)
    });
    let service = IdempotencyLayer::new(RemoteStore)
        .with_wait_timeout(WAIT)
        .layer(handler);
    let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
    tokio::task::spawn_local(maintain(name, seed, shared_for_maintenance));
    loop {
        let (stream, _) = listener.accept().await?;
        let service = service.clone();
        tokio::task::spawn_local(async move {
            let http = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let mut req = req.map(Body::new);
                // The auth layer's part: the tenant becomes the request's scope.
                if let Some(tenant) = req.headers().get("x-tenant").cloned() {
                    let tenant = tenant.to_str().unwrap_or_default().to_owned();
                    req.extensions_mut().insert(Scope::new(tenant));
                }
                service.clone().oneshot(req)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .serve_connection(TokioIo::new(stream), http)
                .await;
        });
    }
}

/// Works a little, makes its effect (one ledger entry), works some more,
/// and answers `201` naming the tenant, key, variant and effect; or, now and
/// then, fails before any effect with a `500` (the layer releases the key).
async fn handle(
    name: &'static str,
    rng: Arc<Mutex<Rng>>,
    effects: Arc<Mutex<Vec<Effect>>>,
    req: Request<Body>,
) -> Result<Response<Body>, Infallible> {
    let tenant = req
        .extensions()
        .get::<Scope>()
        .expect("scoped")
        .as_str()
        .to_owned();
    let key = req.headers()["idempotency-key"]
        .to_str()
        .unwrap()
        .to_owned();
    let token = req
        .extensions()
        .get::<engine::Attempt>()
        .expect("a claimed run")
        .token()
        .get();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let order: Order = serde_json::from_slice(&body).expect("an order");
    let lock = LOCK.as_millis() as u64;
    let (fails, before, after) = {
        let mut rng = rng.lock().unwrap();
        // Most handlers answer well within a heartbeat; some outlast the lock.
        let after = match rng.chance(25) {
            true => rng.range(lock / 4, lock + lock / 2),
            false => rng.range(0, 40),
        };
        (rng.chance(8), rng.range(0, 30), after)
    };
    tokio::time::sleep(Duration::from_millis(before)).await;
    if fails {
        let failed = Response::builder().status(500).body(Body::from("failed"));
        return Ok(failed.unwrap());
    }
    let effect = {
        let mut effects = effects.lock().unwrap();
        let n = effects.len();
        effects.push(Effect {
            n,
            tenant: tenant.clone(),
            key: key.clone(),
            v: order.v,
            item: order.item.clone(),
            by: name,
            at: now_ms(),
            token,
        });
        n
    };
    tokio::time::sleep(Duration::from_millis(after)).await;
    let answer = serde_json::json!({
        "tenant": tenant, "key": key, "v": order.v, "item": order.item, "by": name, "effect": effect,
    });
    let created = Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Body::from(answer.to_string()));
    Ok(created.unwrap())
}

/// The application's maintenance on one instance, as it would schedule it:
/// now and then `purge_expired`, and now and then a tenant erased with
/// `purge_scope`, at seeded random points while the clients run, each
/// recorded with when it was invoked and what its caller heard.
async fn maintain(name: &'static str, seed: u64, shared: Shared) {
    // Its own stream, so that the handlers' draws are not shifted.
    let mut rng = Rng::new(seed ^ 0x00C0_FFEE);
    let instance = super::INSTANCES.iter().position(|&i| i == name).unwrap() as u64;
    for n in 0.. {
        tokio::time::sleep(Duration::from_millis(rng.range(300, 2_000))).await;
        if shared.clients_done.load(Ordering::SeqCst) >= super::CLIENTS {
            return;
        }
        let scope = rng
            .chance(PURGE_SCOPE_PERCENT)
            .then(|| TENANTS[rng.below(2) as usize]);
        let id = (instance << 32) | n;
        let invoked = now_ms();
        let returned = RemoteStore.purge(id, scope).await;
        shared.purges.lock().unwrap().push(Purge {
            id,
            by: name,
            scope,
            invoked,
            ended: now_ms(),
            removed: returned.map_err(|e| e.to_string()),
        });
    }
}

/// One request as a client sends it.
#[derive(Clone)]
pub struct Sent {
    pub tenant: &'static str,
    pub key: String,
    pub v: u8,
    /// The same order with its fields in the other order: the same request.
    pub reordered: bool,
}

impl Sent {
    fn body(&self) -> String {
        let item = format!("item-{}", self.key);
        match self.reordered {
            false => format!(r#"{{"item":"{item}","v":{}}}"#, self.v),
            true => format!(r#"{{ "v": {}, "item": "{item}" }}"#, self.v),
        }
    }
}

/// Sends `sent` to `instance` and reads the whole answer; dropped, it hangs up.
async fn send(instance: &str, sent: &Sent) -> Result<(StatusCode, bool, Bytes), String> {
    let stream = TcpStream::connect((instance, PORT))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let request = Request::post("/v1/orders")
        .header("host", instance)
        .header("content-type", "application/json")
        .header("idempotency-key", &sent.key)
        .header("x-tenant", sent.tenant)
        .body(Full::new(Bytes::from(sent.body())))
        .unwrap();
    let exchange = async {
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let replayed = parts.headers.contains_key("idempotent-replayed");
        Ok::<_, hyper::Error>((parts.status, replayed, body.collect().await?.to_bytes()))
    };
    // The connection is driven here, so that dropping this future closes it.
    tokio::pin!(connection);
    tokio::select! {
        biased;
        answer = exchange => answer.map_err(|e| format!("exchange: {e}")),
        ended = &mut connection => Err(format!("connection ended: {ended:?}")),
    }
}

/// Sends `sent` once, hanging up after `patience`, and records the attempt.
async fn attempt(
    shared: &Shared,
    client: &str,
    op: usize,
    instance: &'static str,
    sent: &Sent,
    patience: Duration,
) -> Outcome {
    let invoked = now_ms();
    let outcome = match tokio::time::timeout(patience, send(instance, sent)).await {
        Err(_) => Outcome::Info("hung up".into()),
        Ok(Err(e)) => Outcome::Info(e),
        Ok(Ok((status, replayed, body))) => Outcome::Answer {
            status: status.as_u16(),
            replayed,
            body,
        },
    };
    shared.history.lock().unwrap().push(Attempt {
        client: client.to_owned(),
        op,
        instance,
        tenant: sent.tenant,
        key: sent.key.clone(),
        v: sent.v,
        invoked,
        ended: now_ms(),
        outcome: outcome.clone(),
    });
    outcome
}

/// Whether a client stops retrying after this answer: an answer it can act
/// on (`2xx`, key reuse, response unavailable), not one that asks it to retry.
fn settled(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Answer { status, .. } => {
            let refusal = *status == 409 && !is_in_progress(outcome);
            (200..300).contains(status) || refusal || *status == 410
        }
        Outcome::Info(_) => false,
    }
}

fn is_in_progress(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Answer { status: 409, body, .. }
        if body.windows(11).any(|w| w == b"in_progress"))
}

/// A client: a few keyed requests, each retried until settled.
pub async fn client(name: String, seed: u64, shared: Shared) -> turmoil::Result {
    let mut rng = Rng::new(seed);
    for op in 0..OPS_PER_CLIENT {
        let sent = Sent {
            tenant: TENANTS[rng.below(2) as usize],
            key: format!("order-key-{}", rng.below(KEYS as u64)),
            v: u8::from(rng.chance(12)),
            reordered: rng.chance(50),
        };
        for _ in 0..ATTEMPTS {
            let instance = super::INSTANCES[rng.below(2) as usize];
            let patience = match rng.chance(30) {
                true => Duration::from_millis(rng.range(5, 600)),
                false => Duration::from_secs(5),
            };
            if settled(&attempt(&shared, &name, op, instance, &sent, patience).await) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.range(10, 300))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.range(0, 100))).await;
    }
    shared.clients_done.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// After every client is done and every fault has ended, and long enough
/// for any claim left behind to expire: asks each request that was
/// answered `2xx` once more, through each instance, so that its replay is
/// checked with the network healthy.
pub async fn auditor(clients: usize, quiet_after: u64, shared: Shared) -> turmoil::Result {
    while shared.clients_done.load(Ordering::SeqCst) < clients || now_ms() < quiet_after {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answered = super::checker::acknowledged(&shared.history.lock().unwrap());
    for (i, sent) in answered.into_iter().enumerate() {
        for instance in super::INSTANCES {
            for _ in 0..ATTEMPTS {
                let patience = Duration::from_secs(5);
                let outcome = attempt(&shared, "auditor", i, instance, &sent, patience).await;
                if settled(&outcome) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Ok(())
}
