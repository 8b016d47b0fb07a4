//! `RedisStore` across real processes: two server processes on one Cluster,
//! 200 concurrent duplicates of one request between them run once.
//!
//! The test binary re-runs itself as the server: `redis_child_server` returns
//! at once unless `TOWER_IDEMPOTENCY_TEST_REDIS_SERVER` is set, and otherwise
//! serves an axum app with the layer over `RedisStore` on the Cluster, whose
//! handler counts its side effect with `INCR` on the standalone server (so the
//! parent counts side effects where the store cannot touch them).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency_tests::support::child::ChildServer;
use tower_idempotency_tests::support::redis as r;

const SERVER_ENV: &str = "TOWER_IDEMPOTENCY_TEST_REDIS_SERVER";

/// Not a test: the server process. Returns at once in a normal test run.
#[test]
fn redis_child_server() {
    let Ok(prefix) = std::env::var(SERVER_ENV) else {
        return;
    };
    tower_idempotency_tests::support::child::run_until_parent_exits(serve(prefix));
}

#[derive(Clone)]
struct Effects(redis::aio::MultiplexedConnection);

async fn serve(prefix: String) {
    let nodes: Vec<String> = std::env::var("REDIS_CLUSTER_URLS")
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let store = tower_idempotency::RedisStore::builder()
        .with_prefix(prefix.parse().unwrap())
        .connect_cluster(&nodes)
        .await
        .expect("connect");
    let effects = r::connection(&std::env::var("REDIS_URL").unwrap()).await;
    let router = Router::new()
        .route("/orders", post(create_order))
        .route_layer(IdempotencyLayer::new(store).with_wait_timeout(Duration::from_secs(10)))
        .with_state(Effects(effects));
    tower_idempotency_tests::support::child::serve(router).await;
}

async fn create_order(
    State(Effects(mut effects)): State<Effects>,
    headers: HeaderMap,
) -> (StatusCode, String) {
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let prefix = std::env::var(SERVER_ENV).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n: i64 = redis::cmd("INCR")
        .arg(format!("{prefix}:effects:{key}"))
        .query_async(&mut effects)
        .await
        .expect("side effect");
    (
        StatusCode::CREATED,
        format!(r#"{{"order":{n},"pid":{}}}"#, std::process::id()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_server_processes_on_one_cluster_run_200_concurrent_duplicates_once() {
    let (Some(url), Some(_)) = (r::url("200 duplicates"), r::cluster("200 duplicates")) else {
        return;
    };
    let prefix = r::unique_prefix("two-processes");
    let env = [(SERVER_ENV, prefix.clone())];
    let servers = [
        ChildServer::spawn(module_path!(), "redis_child_server", &env),
        ChildServer::spawn(module_path!(), "redis_child_server", &env),
    ];
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let key = "order-two-processes-1";
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (client, addr) = (client.clone(), servers[i % 2].addr);
            tokio::spawn(async move {
                let request = hyper::Request::post(format!("http://{addr}/orders"))
                    .header("idempotency-key", key)
                    .header("x-tenant", "tenant")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(br#"{"sku":"A-1","qty":2}"#)))
                    .unwrap();
                let response = client.request(request).await.expect("HTTP request");
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, body)
            })
        })
        .collect();
    let mut bodies = Vec::new();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body:?}");
        bodies.push(body);
    }
    let mut effects = r::connection(&url).await;
    let runs: i64 = redis::cmd("GET")
        .arg(format!("{prefix}:effects:{key}"))
        .query_async(&mut effects)
        .await
        .unwrap();
    assert_eq!(runs, 1, "exactly one side effect");
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "every answer is the same order"
    );
}
