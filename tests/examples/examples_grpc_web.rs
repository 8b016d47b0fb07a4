//! `examples/grpc_web/`: the tonic-web service behind the layer, driven with
//! hand-built gRPC-Web frames over loopback HTTP/1.1, in-process and as a process;
//! and the same service as native gRPC (HTTP trailers), in process.

// The example's own source (an example is no crate to depend on): what
// users run is what these tests drive.
#[allow(dead_code)]
#[path = "../../examples/grpc_web/src/main.rs"]
mod example;
use tower_idempotency_tests::http;

use bytes::Bytes;
use example::{frame, unframe, CreateOrderRequest, Order, CREATE_ORDER};
use http::{serve, HttpClient, Reply};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

async fn mounted() -> (HttpClient, Arc<AtomicU64>) {
    let created = Arc::new(AtomicU64::new(0));
    let addr = serve(example::app(created.clone())).await;
    (HttpClient::new(addr), created)
}

async fn call(client: &HttpClient, headers: &[(&str, &str)], body: Bytes) -> Reply {
    let mut all = vec![
        ("content-type", "application/grpc-web+proto"),
        ("x-grpc-web", "1"),
    ];
    all.extend_from_slice(headers);
    client
        .send(::http::Method::POST, CREATE_ORDER, &all, body)
        .await
}

fn grpc_status(reply: &Reply) -> String {
    if let Some(status) = reply.headers.get("grpc-status") {
        return status.to_str().unwrap().to_owned();
    }
    let (_, trailers) = unframe::<Order>(&reply.body);
    trailers
        .into_iter()
        .find(|(name, _)| name == "grpc-status")
        .map(|(_, value)| value)
        .expect("a grpc-status in the headers or the trailer frame")
}

fn order(sku: &str, qty: u32) -> Bytes {
    frame(&CreateOrderRequest {
        sku: sku.into(),
        qty,
    })
}

const ACME: (&str, &str) = ("authorization", "Bearer acme");

#[tokio::test]
async fn a_retried_call_replays_the_same_frames_and_creates_one_order() {
    let (client, created) = mounted().await;
    let headers = [ACME, ("idempotency-key", "order-0001")];
    let first = call(&client, &headers, order("A-1", 2)).await;
    let retry = call(&client, &headers, order("A-1", 2)).await;
    assert_eq!((first.status.as_u16(), retry.status.as_u16()), (200, 200));
    assert_eq!(grpc_status(&first), "0");
    assert!(!first.replayed() && retry.replayed());
    assert_eq!(
        first.body, retry.body,
        "message and trailer frame, byte for byte"
    );
    assert_eq!(
        retry.headers["content-type"], "application/grpc-web+proto",
        "the content type is replayed"
    );
    let (reply, trailers) = unframe::<Order>(&retry.body);
    let reply = reply.expect("an Order message");
    assert_eq!(
        (reply.id.as_str(), reply.sku.as_str(), reply.qty),
        ("ord_0001", "A-1", 2)
    );
    assert!(trailers.contains(&("grpc-status".into(), "0".into())));
    assert_eq!(created.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn bodies_are_fingerprinted_as_bytes() {
    let (client, created) = mounted().await;
    let headers = [ACME, ("idempotency-key", "order-0002")];
    assert_eq!(
        grpc_status(&call(&client, &headers, order("A-1", 2)).await),
        "0"
    );
    // Another message under the same key: refused as FAILED_PRECONDITION (9).
    let other = call(&client, &headers, order("A-1", 3)).await;
    assert_eq!(grpc_status(&other), "9");
    let message = other.headers["grpc-message"].to_str().unwrap();
    assert!(message.starts_with("idempotency_key_reuse"), "{message}");
    // The same message with its fields in another order is other bytes: protobuf
    // is not canonicalised, so a retry must resend the exact bytes (any
    // deterministic encoder does).
    let mut reordered = vec![0, 0, 0, 0, 7, 0x10, 2, 0x0a, 3];
    reordered.extend_from_slice(b"A-1");
    let reordered = call(&client, &headers, reordered.into()).await;
    assert_eq!(grpc_status(&reordered), "9");
    assert_eq!(created.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn errors_are_not_recorded_and_refusals_speak_grpc() {
    let (client, created) = mounted().await;
    let headers = [ACME, ("idempotency-key", "order-0003")];
    // INVALID_ARGUMENT from the handler: a trailers-only answer, not recorded...
    let invalid = call(&client, &headers, order("A-1", 0)).await;
    assert_eq!(grpc_status(&invalid), "3");
    // ...so the key is free for the corrected call.
    let fixed = call(&client, &headers, order("A-1", 1)).await;
    assert_eq!(grpc_status(&fixed), "0");
    assert!(!fixed.replayed());
    assert_eq!(created.load(Ordering::SeqCst), 1);

    // The layer's refusals, translated: UNAUTHENTICATED (16) and INVALID_ARGUMENT (3).
    let anonymous = call(
        &client,
        &[("idempotency-key", "order-0004")],
        order("A-1", 1),
    )
    .await;
    assert_eq!(anonymous.status, 200);
    assert_eq!(grpc_status(&anonymous), "16");
    let no_key = call(&client, &[ACME], order("A-1", 1)).await;
    assert_eq!(grpc_status(&no_key), "3");
    assert!(no_key.headers["grpc-message"]
        .to_str()
        .unwrap()
        .starts_with("idempotency_key_required"));
    // An unknown method is tonic's UNIMPLEMENTED (12), untouched.
    let unknown = client
        .send(
            ::http::Method::POST,
            "/orders.v1.Orders/Nope",
            &[
                ("content-type", "application/grpc-web+proto"),
                ACME,
                ("idempotency-key", "order-0005"),
            ],
            order("A-1", 1),
        )
        .await;
    assert_eq!(grpc_status(&unknown), "12");
    assert_eq!(created.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_binary_serves_grpc_web_and_replays() {
    let running = http::RunningExample::start("grpc_web", &[]);
    let addr = running.addr;
    let client = HttpClient::new(addr);
    let headers = [ACME, ("idempotency-key", "order-0001")];
    let first = call(&client, &headers, order("B-2", 1)).await;
    let retry = call(&client, &headers, order("B-2", 1)).await;
    assert_eq!(grpc_status(&first), "0");
    assert!(retry.replayed());
    assert_eq!(first.body, retry.body);
}

/// Native gRPC (the same service without the gRPC-Web translation) ends its
/// answer with HTTP trailers (`grpc-status: 0`): the first caller gets them,
/// and since a record cannot carry them a retry is refused (`410`) rather
/// than given the message without its status; the order is created once.
/// In process; over a real HTTP/2 connection in the test after it.
#[tokio::test]
async fn native_grpc_keeps_its_trailers_and_is_never_replayed_without_them() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let created = Arc::new(AtomicU64::new(0));
    let svc = native_orders(&created);
    let request = || {
        let mut req = ::http::Request::post(CREATE_ORDER)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("idempotency-key", "order-native-1")
            .body(axum::body::Body::from(order("A-1", 2)))
            .unwrap();
        req.extensions_mut()
            .insert(tower_idempotency::Scope::new("acme"));
        req
    };
    let first = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), ::http::StatusCode::OK);
    assert!(!first.headers().contains_key("grpc-status"));
    let first = first.into_body().collect().await.unwrap();
    let trailers = first
        .trailers()
        .cloned()
        .expect("the trailers reach the caller");
    assert_eq!(trailers["grpc-status"], "0");
    let (reply, _) = unframe::<Order>(&first.to_bytes());
    assert_eq!(reply.expect("an Order message").id, "ord_0001");
    for _ in 0..2 {
        let retry = svc.clone().oneshot(request()).await.unwrap();
        assert_eq!(retry.status(), ::http::StatusCode::GONE);
    }
    assert_eq!(created.load(Ordering::SeqCst), 1);
}

/// The example's orders service as native gRPC (no gRPC-Web translation)
/// behind the layer, recording a success: `200` without `grpc-status` in
/// its head (the status comes in the trailers).
fn native_orders(
    created: &Arc<AtomicU64>,
) -> impl tower::Service<
    ::http::Request<axum::body::Body>,
    Response = ::http::Response<tower_idempotency::body::ResponseBody<tonic::body::Body>>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    use tower::Layer;
    let grpc_success = |head: &::http::response::Parts| {
        head.status == ::http::StatusCode::OK && !head.headers.contains_key("grpc-status")
    };
    let server = tower::ServiceBuilder::new()
        .map_request(|req: ::http::Request<axum::body::Body>| req.map(tonic::body::Body::new))
        .service(example::OrdersServer::new(created.clone()));
    tower_idempotency::IdempotencyLayer::new(tower_idempotency::MemoryStore::new())
        .with_record_policy(grpc_success)
        .layer(server)
}

/// Native gRPC over a real HTTP/2 connection on loopback (hyper's HTTP/2
/// server and client, as tonic's transport uses them): the first caller
/// gets its `grpc-status: 0` trailers, and a retry with the key never gets
/// the answer without them (`410`), the order created once.
#[tokio::test]
async fn native_grpc_over_http2_keeps_its_trailers_and_is_never_replayed_without_them() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let created = Arc::new(AtomicU64::new(0));
    let svc = tower::ServiceBuilder::new()
        // The tenant, as an auth layer in front would put it.
        .map_request(|mut req: ::http::Request<hyper::body::Incoming>| {
            req.extensions_mut()
                .insert(tower_idempotency::Scope::new("acme"));
            req.map(axum::body::Body::new)
        })
        .service(native_orders(&created));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (io, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(io), service)
                    .await;
            });
        }
    });
    let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    let (mut sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = || {
        ::http::Request::post(format!("http://{addr}{CREATE_ORDER}"))
            .version(::http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("idempotency-key", "order-native-h2-1")
            .body(Full::new(order("A-1", 2)))
            .unwrap()
    };
    let first = sender.send_request(request()).await.unwrap();
    assert_eq!(first.version(), ::http::Version::HTTP_2);
    assert_eq!(first.status(), ::http::StatusCode::OK);
    let first = first.into_body().collect().await.unwrap();
    let trailers = first
        .trailers()
        .cloned()
        .expect("the trailers cross HTTP/2");
    assert_eq!(trailers["grpc-status"], "0");
    let (reply, _) = unframe::<Order>(&first.to_bytes());
    assert_eq!(reply.expect("an Order message").id, "ord_0001");
    for _ in 0..2 {
        let retry = sender.send_request(request()).await.unwrap();
        assert_eq!(retry.status(), ::http::StatusCode::GONE);
    }
    assert_eq!(created.load(Ordering::SeqCst), 1);
}
