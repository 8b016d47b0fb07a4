//! The whole `IdempotencyLayer` over a `MemoryStore` and a trivial handler, fed
//! arbitrary methods, paths, scopes, key headers, content types, extra headers,
//! bodies (in arbitrary chunks), handler statuses and failing response bodies.
//! Every request is sent one to three times in a row.
//!
//! Checked after every answer (the requests are sequential, so nothing is ever
//! legitimately in progress):
//! - no panic, and every answer is the handler's, a replay, or a known refusal;
//! - once a `(scope, key)` answered `201` from the handler, the handler never
//!   runs again for it, and every replay is identical (status, body, replayed
//!   headers), never carries `set-cookie`, and is marked `idempotent-replayed`;
//! - a replay only ever answers a `(scope, key)` that recorded a `201`;
//! - nothing is left in progress (`idempotency_in_progress` never appears);
//! - refused requests never reach the handler.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, Scope, body::BoxError};

const KEYS: [&str; 4] = ["order-0001", "order-0002", "abcdefgh", "A.b_C-9.z"];
const PATHS: [&str; 4] = ["/v1/orders", "/v1/orders?coupon=1", "/v1/refunds", "/"];
const TENANTS: [&str; 3] = ["tenant_a", "tenant_b", "tenant_c"];
const BODY_LIMIT: usize = 512;

#[derive(Arbitrary, Debug)]
enum MethodChoice {
    Post,
    Patch,
    Get,
    Put,
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum KeyChoice {
    Known(u8),
    Quoted(u8),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum ContentType {
    Json,
    JsonCharset,
    MergePatchJson,
    Text,
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Status {
    Created,
    Ok,
    BadRequest,
    ServerError,
    Raw(u16),
}

#[derive(Arbitrary, Debug)]
struct Req {
    method: MethodChoice,
    path: u8,
    /// 0: no scope; 1: an empty scope; otherwise a tenant.
    scope: u8,
    keys: Vec<KeyChoice>,
    content_type: Option<ContentType>,
    content_length: Option<u32>,
    extra: Vec<(Vec<u8>, Vec<u8>)>,
    body: Vec<u8>,
    chunk: u8,
    status: Status,
    /// The handler's response body fails after its first chunk.
    fail_body: bool,
    repeat: u8,
}

#[derive(Arbitrary, Debug)]
struct Input {
    requests: Vec<Req>,
}

/// A request body in chunks (no length), convertible from `Bytes` as the layer needs.
struct Chunks(VecDeque<Bytes>);

impl From<Bytes> for Chunks {
    fn from(bytes: Bytes) -> Self {
        Self(VecDeque::from([bytes]))
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// The handler's response body: whole, or failing after its first chunk.
struct Answer {
    data: Option<Bytes>,
    fail: bool,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.fail) {
            return Poll::Ready(Some(Err("upstream reset".into())));
        }
        Poll::Ready(None)
    }
}

type RecordId = (String, String);

#[derive(Clone, Debug, PartialEq)]
struct Seen {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    location: Option<HeaderValue>,
    body: Bytes,
}

/// The record a request names, if the layer applies to it and it is well formed.
fn record_id(method: &Method, scope: Option<&str>, headers: &HeaderMap) -> Option<RecordId> {
    if !matches!(*method, Method::POST | Method::PATCH) {
        return None;
    }
    let scope = scope.filter(|s| !s.is_empty())?;
    let key = IdempotencyKey::from_header_values(headers.get_all("idempotency-key"))?;
    Some((scope.to_owned(), key.as_str().to_owned()))
}

fn build(req: &Req) -> Option<(Request<Chunks>, Option<String>)> {
    let method = match &req.method {
        MethodChoice::Post => Method::POST,
        MethodChoice::Patch => Method::PATCH,
        MethodChoice::Get => Method::GET,
        MethodChoice::Put => Method::PUT,
        MethodChoice::Raw(raw) => Method::from_bytes(raw).ok()?,
    };
    let mut builder = Request::builder()
        .method(method)
        .uri(PATHS[usize::from(req.path) % PATHS.len()]);
    for key in req.keys.iter().take(3) {
        let value = match key {
            KeyChoice::Known(i) => HeaderValue::from_static(KEYS[usize::from(*i) % KEYS.len()]),
            KeyChoice::Quoted(i) => {
                HeaderValue::from_str(&format!("\"{}\"", KEYS[usize::from(*i) % KEYS.len()]))
                    .unwrap()
            }
            KeyChoice::Raw(raw) => HeaderValue::from_bytes(raw).ok()?,
        };
        builder = builder.header("idempotency-key", value);
    }
    if let Some(ct) = &req.content_type {
        let value = match ct {
            ContentType::Json => HeaderValue::from_static("application/json"),
            ContentType::JsonCharset => HeaderValue::from_static("application/json; charset=utf-8"),
            ContentType::MergePatchJson => HeaderValue::from_static("application/merge-patch+json"),
            ContentType::Text => HeaderValue::from_static("text/plain"),
            ContentType::Raw(raw) => HeaderValue::from_bytes(raw).ok()?,
        };
        builder = builder.header(CONTENT_TYPE, value);
    }
    if let Some(len) = req.content_length {
        builder = builder.header(CONTENT_LENGTH, len);
    }
    for (name, value) in req.extra.iter().take(4) {
        let name = HeaderName::from_bytes(name).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        if name == "idempotency-key"
            || name == CONTENT_LENGTH
            || name.as_str().starts_with("x-fuzz")
        {
            continue;
        }
        builder = builder.header(name, value);
    }
    let status = match req.status {
        Status::Created => 201,
        Status::Ok => 200,
        Status::BadRequest => 400,
        Status::ServerError => 500,
        Status::Raw(s) => s,
    };
    let status = StatusCode::from_u16(status).ok()?;
    builder = builder.header("x-fuzz-status", status.as_u16());
    if req.fail_body {
        builder = builder.header("x-fuzz-fail", "1");
    }
    let size = usize::from(req.chunk) + 1;
    let chunks = req.body.chunks(size).map(Bytes::copy_from_slice).collect();
    let mut request = builder.body(Chunks(chunks)).ok()?;
    let scope = match req.scope {
        0 => None,
        1 => Some(String::new()),
        n => Some(TENANTS[usize::from(n) % TENANTS.len()].to_owned()),
    };
    if let Some(scope) = &scope {
        request.extensions_mut().insert(Scope::new(scope.as_str()));
    }
    Some((request, scope))
}

fn copy(req: &Request<Chunks>) -> Request<Chunks> {
    let mut builder = Request::builder()
        .method(req.method().clone())
        .uri(req.uri().clone());
    for (name, value) in req.headers() {
        builder = builder.header(name, value);
    }
    let mut copy = builder
        .body(Chunks(req.body().0.iter().cloned().collect()))
        .unwrap();
    if let Some(scope) = req.extensions().get::<Scope>() {
        copy.extensions_mut().insert(scope.clone());
    }
    copy
}

fuzz_target!(|input: Input| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(run(input));
});

async fn run(input: Input) {
    // Runs per record id (or per "" for requests the layer does not apply to).
    let runs: Arc<Mutex<HashMap<RecordId, usize>>> = Arc::default();
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |req: Request<Chunks>| {
            let runs = runs.clone();
            async move {
                let scope = req
                    .extensions()
                    .get::<Scope>()
                    .map(|s| s.as_str().to_owned());
                let id =
                    record_id(req.method(), scope.as_deref(), req.headers()).unwrap_or_default();
                let run = {
                    let mut runs = runs.lock().unwrap();
                    let n = runs.entry(id).or_default();
                    *n += 1;
                    *n
                };
                let status: u16 = req.headers()["x-fuzz-status"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                let fail = req.headers().contains_key("x-fuzz-fail");
                let len = req.into_body().collect().await.unwrap().to_bytes().len();
                let response = Response::builder()
                    .status(status)
                    .header(CONTENT_TYPE, "application/json")
                    .header(LOCATION, format!("/orders/{run}"))
                    .header(SET_COOKIE, format!("session={run}"))
                    .header("x-fuzz-handler", "1")
                    .body(Answer {
                        data: Some(Bytes::from(format!(r#"{{"run":{run},"len":{len}}}"#))),
                        fail,
                    })
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        })
    };
    let service = IdempotencyLayer::new(MemoryStore::new())
        .with_body_limit(BODY_LIMIT)
        .with_wait_timeout(Duration::ZERO)
        .layer(handler);
    let mut recorded: HashMap<RecordId, Seen> = HashMap::new();

    for req in input.requests.iter().take(8) {
        let Some((request, scope)) = build(req) else {
            continue;
        };
        let id = record_id(request.method(), scope.as_deref(), request.headers());
        let guarded = matches!(*request.method(), Method::POST | Method::PATCH);
        for _ in 0..=(req.repeat % 3) {
            let runs_before = runs
                .lock()
                .unwrap()
                .get(&id.clone().unwrap_or_default())
                .copied();
            let response = service.clone().oneshot(copy(&request)).await.unwrap();
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map(|c| c.to_bytes());
            let runs_after = runs
                .lock()
                .unwrap()
                .get(&id.clone().unwrap_or_default())
                .copied();
            let ran = runs_after != runs_before;
            let from_handler = parts.headers.contains_key("x-fuzz-handler");
            let replayed = parts
                .headers
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            assert_eq!(ran, from_handler, "a handler answer iff the handler ran");
            assert!(!(from_handler && replayed));

            if !guarded {
                assert!(
                    from_handler && !replayed,
                    "other methods pass through: {parts:?}"
                );
                continue;
            }
            if replayed {
                let id = id.as_ref().expect("a replay answers a well-formed request");
                let seen = recorded.get(id).expect("a replay of a recorded 201");
                let now = Seen {
                    status: parts.status,
                    content_type: parts.headers.get(CONTENT_TYPE).cloned(),
                    location: parts.headers.get(LOCATION).cloned(),
                    body: body.expect("a replay's body never fails"),
                };
                assert_eq!(&now, seen, "a replay is identical to the original");
                assert!(
                    parts.headers.get(SET_COOKIE).is_none(),
                    "cookies never replay"
                );
                continue;
            }
            if from_handler {
                let id = id
                    .clone()
                    .expect("the handler only runs for well-formed requests");
                assert!(
                    !recorded.contains_key(&id),
                    "the handler ran again for a recorded 201: {id:?}"
                );
                match body {
                    Ok(body) if parts.status == StatusCode::CREATED => {
                        assert!(!req.fail_body);
                        let seen = Seen {
                            status: parts.status,
                            content_type: parts.headers.get(CONTENT_TYPE).cloned(),
                            location: parts.headers.get(LOCATION).cloned(),
                            body,
                        };
                        recorded.insert(id, seen);
                    }
                    Ok(_) => assert!(!req.fail_body),
                    Err(error) => {
                        assert!(req.fail_body, "{error}");
                    }
                }
                continue;
            }
            // A refusal by the layer.
            let body = body.expect("a refusal's body never fails");
            let json: serde_json::Value = serde_json::from_slice(&body).expect("refusals are JSON");
            let code = json["code"].as_str().expect("refusals have a code");
            match (parts.status.as_u16(), code) {
                (401, "unauthorized") => assert!(scope.as_deref().is_none_or(str::is_empty)),
                (400, "idempotency_key_required") => assert!(id.is_none()),
                (413, "payload_too_large") => assert!(
                    req.body.len() > BODY_LIMIT
                        || req.content_length.is_some_and(|l| l as usize > BODY_LIMIT)
                ),
                (409, "idempotency_key_reuse") => {
                    assert!(id.as_ref().is_some_and(|id| recorded.contains_key(id)))
                }
                other => {
                    panic!("unexpected refusal {other:?}: nothing is in progress, the store is up")
                }
            }
        }
    }
}
