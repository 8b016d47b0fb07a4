//! A tonic-web gRPC-Web service behind `IdempotencyLayer`: a retried
//! `orders.v1.Orders/CreateOrder` call replays the first call's response.
//!
//! No protoc and no build script: the messages are hand-written with
//! `#[derive(prost::Message)]`, and the service is a plain `tower::Service`
//! that hands the one method to `tonic::server::Grpc::unary` with
//! `tonic_prost::ProstCodec` — what tonic's codegen would generate. The
//! equivalent `.proto`:
//!
//! ```proto
//! package orders.v1;
//! service Orders { rpc CreateOrder(CreateOrderRequest) returns (Order); }
//! message CreateOrderRequest { string sku = 1; uint32 qty = 2; }
//! message Order { string id = 1; string sku = 2; uint32 qty = 3; }
//! ```
//!
//! The stack, outermost first:
//!
//! 1. `IdempotencyLayer`: sees the gRPC-Web request as sent (HTTP/1.1 POST,
//!    `content-type: application/grpc-web+proto`), and answers its refusals
//!    as gRPC-Web trailers-only responses through its refusal hook
//!    (`with_refusal_response(refusal_as_grpc_status)`): gRPC-Web clients see
//!    `UNAUTHENTICATED`, `INVALID_ARGUMENT`, `ABORTED` (in progress, with
//!    `retry-after`), `FAILED_PRECONDITION` (key reused), `UNAVAILABLE`
//!    (store down), decided from the typed [`Refused`], never by parsing a
//!    JSON body.
//!
//!    The body is not JSON, so
//!    it is fingerprinted as raw bytes: the 5-byte frame header and the
//!    protobuf message. The key travels as metadata, which gRPC-Web sends as
//!    the `idempotency-key` header; the tenant comes from `authorization`
//!    metadata through `.with_scope(...)`. It records a response only when it
//!    is HTTP 200 without `grpc-status` in the headers: tonic puts an error
//!    status there (a trailers-only response), and a success's `grpc-status: 0`
//!    travels in the body's trailer frame, which is recorded and replayed with
//!    the message.
//! 2. `tonic_web::GrpcWebLayer`: gRPC-Web ⇄ gRPC translation.
//! 3. `OrdersServer`: the gRPC service.
//!
//! ```sh
//! cargo run -p tower-idempotency-grpc-web
//! # a CreateOrder call by hand: frame = 0x00, u32 length, protobuf bytes
//! printf '\x00\x00\x00\x00\x07\x0a\x03A-1\x10\x02' > /tmp/req.bin   # sku "A-1", qty 2
//! for i in 1 2; do curl -s -X POST localhost:3004/orders.v1.Orders/CreateOrder \
//!   -H 'content-type: application/grpc-web+proto' -H 'x-grpc-web: 1' \
//!   -H 'authorization: Bearer acme' -H 'idempotency-key: order-0001' \
//!   --data-binary @/tmp/req.bin -D - -o /dev/null; done   # the second has idempotent-replayed: true
//! ```
//!
//! Env: `BIND` (default `127.0.0.1:3004`).

use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::Router;
use bytes::Bytes;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::{Request, Status};
use tower::{Service, ServiceBuilder};
use tower_idempotency::store::purge::PurgeTask;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Refusal, Refused, Scope};

/// `orders.v1.CreateOrderRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateOrderRequest {
    #[prost(string, tag = "1")]
    pub sku: String,
    #[prost(uint32, tag = "2")]
    pub qty: u32,
}

/// `orders.v1.Order`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Order {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub sku: String,
    #[prost(uint32, tag = "3")]
    pub qty: u32,
}

/// The path of the one method.
pub const CREATE_ORDER: &str = "/orders.v1.Orders/CreateOrder";

/// The gRPC service without codegen: routes by path to `Grpc::unary`.
#[derive(Clone, Default)]
pub struct OrdersServer {
    created: Arc<AtomicU64>,
}

impl OrdersServer {
    /// A server counting the orders it creates in `created`.
    pub fn new(created: Arc<AtomicU64>) -> Self {
        Self { created }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl Service<http::Request<tonic::body::Body>> for OrdersServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != CREATE_ORDER {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        let created = self.created.clone();
        // `UnaryService` is implemented for any tower service from
        // `tonic::Request<M>` to `tonic::Response<R>` with `Status` errors.
        let method = tower::service_fn(move |req: Request<CreateOrderRequest>| {
            let created = created.clone();
            async move {
                let CreateOrderRequest { sku, qty } = req.into_inner();
                if sku.is_empty() || qty == 0 {
                    return Err(Status::invalid_argument("sku and qty > 0 are required"));
                }
                let n = created.fetch_add(1, Ordering::SeqCst) + 1;
                let id = format!("ord_{n:04}");
                Ok(tonic::Response::new(Order { id, sku, qty }))
            }
        });
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<Order, CreateOrderRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(method, req).await)
        })
    }
}

/// `authorization: Bearer <tenant>` metadata is the scope (a real service
/// verifies a token here).
fn tenant_from_metadata(parts: &http::request::Parts) -> Option<Scope> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let tenant = value.strip_prefix("Bearer ")?;
    (!tenant.is_empty()).then(|| Scope::new(tenant))
}

/// Records a response only if it is HTTP 200 and not a trailers-only error.
fn grpc_success(parts: &http::response::Parts) -> bool {
    parts.status == StatusCode::OK && !parts.headers.contains_key("grpc-status")
}

/// The whole stack as an axum router; `created` counts the orders created.
pub fn app(created: Arc<AtomicU64>) -> Router {
    app_with_store(MemoryStore::new(), created)
}

/// [`app`] on `store`, which the caller keeps (for its purge task).
pub fn app_with_store(store: MemoryStore, created: Arc<AtomicU64>) -> Router {
    let grpc_web = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(store)
                .with_scope(tenant_from_metadata)
                .with_record_policy(grpc_success)
                .with_refusal_response(refusal_as_grpc_status),
        )
        .layer(tonic_web::GrpcWebLayer::new())
        .service(OrdersServer::new(created));
    Router::new().fallback_service(grpc_web)
}

/// Answers the layer's refusals as gRPC-Web trailers-only responses, from the
/// typed refusal (the default JSON answer is dropped).
fn refusal_as_grpc_status(refused: &Refused, _json: Response<Bytes>) -> Response<Bytes> {
    let grpc_status = match refused.refusal {
        Refusal::Unauthorized => tonic::Code::Unauthenticated,
        Refusal::KeyRequired | Refusal::BodyUnreadable => tonic::Code::InvalidArgument,
        Refusal::PayloadTooLarge | Refusal::QuotaExceeded => tonic::Code::ResourceExhausted,
        Refusal::BodyTimeout => tonic::Code::DeadlineExceeded,
        Refusal::InProgress => tonic::Code::Aborted,
        Refusal::KeyReused | Refusal::ResponseUnavailable | Refusal::KeyExpired => {
            tonic::Code::FailedPrecondition
        }
        Refusal::StoreUnavailable | Refusal::Overloaded => tonic::Code::Unavailable,
        Refusal::HandlerFailed => tonic::Code::Internal,
        _ => tonic::Code::Unknown,
    };
    let code = refused.refusal.code();
    // grpc-message is percent-encoded; the layer's messages are plain ASCII without '%'.
    let message = format!("{code}: {}", refused.refusal.message());
    let mut answer = Response::new(Bytes::new());
    let headers = answer.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc-web+proto"),
    );
    headers.insert("grpc-status", HeaderValue::from(grpc_status as i32));
    if let Ok(message) = HeaderValue::from_str(&message) {
        headers.insert("grpc-message", message);
    }
    if let Some(after) = refused.retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(after.as_secs()));
    }
    answer
}

/// A gRPC-Web data frame: flag 0, big-endian length, the message.
pub fn frame(message: &impl prost::Message) -> Bytes {
    let payload = message.encode_to_vec();
    let mut framed = Vec::with_capacity(5 + payload.len());
    framed.push(0);
    framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(&payload);
    framed.into()
}

/// Splits a gRPC-Web response body into its message (first data frame) and
/// its trailers (the frame flagged 0x80, as `name:value` lines).
pub fn unframe<M: prost::Message + Default>(mut body: &[u8]) -> (Option<M>, Vec<(String, String)>) {
    let (mut message, mut trailers) = (None, Vec::new());
    while body.len() >= 5 {
        let flag = body[0];
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let (payload, rest) = body[5..].split_at(len.min(body.len() - 5));
        if flag & 0x80 != 0 {
            for line in String::from_utf8_lossy(payload).split("\r\n") {
                if let Some((name, value)) = line.split_once(':') {
                    trailers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
                }
            }
        } else if message.is_none() {
            message = M::decode(payload).ok();
        }
        body = rest;
    }
    (message, trailers)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3004".into());
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    let store = MemoryStore::new();
    // Expired records leave memory in the background, not only when a claim
    // happens by; stopped at shutdown.
    let purge = PurgeTask::new(store.clone()).spawn()?;
    axum::serve(listener, app_with_store(store, Arc::default()))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    purge.shutdown().await;
    Ok(())
}
