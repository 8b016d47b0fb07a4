//! The in-process harness of the layer tests: a counting handler, requests
//! through `oneshot`, and replies read whole with the assertions they share.
#![allow(dead_code)]

use axum::body::Body;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::fmt::Debug;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower::{Service, ServiceExt};
use tower_idempotency::body::ResponseBody;

/// What the layered service answers.
pub type Answer = Response<ResponseBody<Body>>;

/// How many times the inner handler ran.
#[derive(Clone, Default)]
pub struct Runs(pub Arc<AtomicUsize>);

impl Runs {
    pub fn get(&self) -> usize {
        self.0.load(SeqCst)
    }
}

/// The inner service: counts its runs, then answers `respond(request, run number)`.
pub fn handler<F, Fut, E>(
    runs: &Runs,
    respond: F,
) -> tower::util::ServiceFn<impl Fn(Request<Body>) -> Fut + Clone>
where
    F: Fn(Request<Body>, usize) -> Fut + Clone,
    Fut: Future<Output = Result<Response<Body>, E>>,
{
    let runs = runs.0.clone();
    tower::service_fn(move |req| respond(req, runs.fetch_add(1, SeqCst) + 1))
}

/// `req` with header `name` set to `value`.
pub fn with_header(mut req: Request<Body>, name: &'static str, value: &str) -> Request<Body> {
    let value = HeaderValue::from_str(value).unwrap();
    req.headers_mut().insert(name, value);
    req
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        match self.headers.get("idempotent-replayed") {
            None => false,
            Some(v) if v == "true" => true,
            Some(v) => panic!("Idempotent-Replayed: {v:?}"),
        }
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// A refusal: `status`, `application/json`, `{"code": code, "message": "..."}`.
    #[track_caller]
    pub fn assert_refusal(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.headers[CONTENT_TYPE], "application/json", "{self:?}");
        let json = self.json();
        assert_eq!(json["code"], code, "{self:?}");
        let message = json["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty(), "{self:?}");
        assert!(!self.replayed(), "a refusal is not a replay: {self:?}");
    }

    /// `status` and `{"code": code, ...}` (any content type and message).
    #[track_caller]
    pub fn assert_code(&self, status: StatusCode, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.json()["code"], code, "{self:?}");
    }

    /// The handler's own `201 {"order":run}`, or its replay.
    #[track_caller]
    pub fn assert_order(&self, run: usize, replayed: bool) {
        assert_eq!(self.status, StatusCode::CREATED, "{self:?}");
        assert_eq!(self.text(), format!(r#"{{"order":{run}}}"#), "{self:?}");
        assert_eq!(self.replayed(), replayed, "{self:?}");
    }
}

/// Sends `req` through a clone of `svc` and reads the reply whole.
pub async fn send<S>(svc: &S, req: Request<Body>) -> Reply
where
    S: Service<Request<Body>, Response = Answer> + Clone,
    S::Error: Debug,
{
    let (parts, body) = svc.clone().oneshot(req).await.unwrap().into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}
