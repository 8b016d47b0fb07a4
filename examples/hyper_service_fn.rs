//! Plain hyper 1, no framework: a `tower::service_fn` handler wrapped by
//! `IdempotencyLayer`, served per connection with `hyper::service::service_fn`,
//! `hyper::server::conn::http1` and `hyper_util::rt::TokioIo`.
//!
//! Two things differ from axum:
//!
//! - **The request body.** The layer buffers the body and hands the inner
//!   service a body made `From<Bytes>`; hyper's `Incoming` is not, so each
//!   request is read (within a limit) into a `Full<Bytes>` before the layer.
//!   (`axum::body::Body::new(incoming)` would also do, streaming, if axum is
//!   in your tree.)
//! - **The scope.** There is no auth layer here: `.with_scope(closure)` looks
//!   the `X-Api-Key` header up in a table of keys and returns the tenant, or
//!   `None`, which the layer answers with `401 unauthorized`.
//!
//! ```sh
//! cargo run --example hyper_service_fn
//! # another shell: the second POST is a replay
//! for i in 1 2; do curl -si -X POST localhost:3003/v1/orders -H 'X-Api-Key: key_acme' \
//!   -H 'Idempotency-Key: order-0001' -H 'Content-Type: application/json' -d '{"sku":"A-1"}'; echo; done
//! ```
//!
//! Env: `BIND` (default `127.0.0.1:3003`).

use bytes::Bytes;
use http::request::Parts;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_idempotency::{body::ResponseBody, IdempotencyLayer, MemoryStore, Scope};

/// The largest request body read (the layer's own limit is the same 1 MiB).
pub const MAX_BODY: usize = 1024 * 1024;

/// The body of every answer: the layer's, or one this file builds itself.
pub type AnswerBody = Either<ResponseBody<Full<Bytes>>, Full<Bytes>>;

/// API key → tenant. A real service would look keys up in a database.
pub fn api_keys() -> Arc<HashMap<String, String>> {
    Arc::new(HashMap::from([
        ("key_acme".to_owned(), "acme".to_owned()),
        ("key_globex".to_owned(), "globex".to_owned()),
    ]))
}

/// The handler wrapped by the layer: a tower `Service<Request<Full<Bytes>>>`.
pub fn service(
    keys: Arc<HashMap<String, String>>,
    orders: Arc<AtomicU64>,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<ResponseBody<Full<Bytes>>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    // The scope comes from a header-authenticated closure instead of an auth layer.
    let tenant_of = move |parts: &Parts| {
        let key = parts.headers.get("x-api-key")?.to_str().ok()?;
        keys.get(key).map(|tenant| Scope::new(tenant.as_str()))
    };
    ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()).with_scope(tenant_of))
        .service(tower::service_fn(move |req: Request<Full<Bytes>>| {
            handle(req, orders.clone())
        }))
}

async fn handle(
    req: Request<Full<Bytes>>,
    orders: Arc<AtomicU64>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/orders") => {
            let n = orders.fetch_add(1, Ordering::SeqCst) + 1;
            let request = req.into_body().collect().await?.to_bytes();
            let request: serde_json::Value =
                serde_json::from_slice(&request).unwrap_or(serde_json::Value::Null);
            let order = serde_json::json!({ "id": format!("ord_{n:04}"), "request": request });
            (StatusCode::CREATED, order.to_string())
        }
        // Not POST/PATCH: the layer let it through untouched, key or no key.
        (&Method::GET, "/health") => (StatusCode::OK, r#"{"status":"ok"}"#.to_owned()),
        _ => (StatusCode::NOT_FOUND, r#"{"code":"not_found"}"#.to_owned()),
    };
    Ok(Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response"))
}

/// Accepts connections on `listener` forever, each served by hyper's HTTP/1 connection.
pub async fn serve<S>(listener: TcpListener, service: S)
where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<ResponseBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let per_request = hyper::service::service_fn(move |req: Request<Incoming>| {
                let service = service.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    // hyper's `Incoming` is not `From<Bytes>`: read it (bounded) into `Full`.
                    let bytes = match Limited::new(body, MAX_BODY).collect().await {
                        Ok(collected) => collected.to_bytes(),
                        Err(_) => return Ok(refusal(StatusCode::PAYLOAD_TOO_LARGE)),
                    };
                    let req = Request::from_parts(parts, Full::new(bytes));
                    let response = service.oneshot(req).await?;
                    Ok::<_, Infallible>(response.map(Either::Left))
                }
            });
            // Errors here are the client's connection going away.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), per_request)
                .await;
        });
    }
}

fn refusal(status: StatusCode) -> Response<AnswerBody> {
    let body = r#"{"code":"payload_too_large","message":"the request body is larger than 1 MiB"}"#;
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Either::Right(Full::new(Bytes::from_static(
            body.as_bytes(),
        ))))
        .expect("a valid response")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3003".into());
    let listener = TcpListener::bind(&bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener, service(api_keys(), Arc::default())).await;
    Ok(())
}
