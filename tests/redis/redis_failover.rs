//! A Cluster primary killed (SIGKILL) under load, with `with_replica_acks`:
//! no key ever runs twice, 503s are allowed while the replica takes over,
//! and the same store serves again afterwards without a restart.
//!
//! Runs on the second Cluster `scripts/test` starts, which no other test uses.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::{IdempotencyLayer, Scope};
use tower_idempotency_tests::support::redis as r;

/// The port of a primary of the Cluster `nodes` belong to, as any node that
/// answers sees it.
async fn a_primary(nodes: &[String]) -> u16 {
    for node in nodes {
        let Ok(client) = redis::Client::open(node.as_str()) else {
            continue;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let Ok(listing) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async::<String>(&mut conn)
            .await
        else {
            continue;
        };
        let primary = listing
            .lines()
            .find(|line| {
                line.split(' ')
                    .nth(2)
                    .is_some_and(|f| f.contains("master") && !f.contains("fail"))
            })
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|addr| addr.split('@').next()?.rsplit_once(':')?.1.parse().ok());
        if let Some(port) = primary {
            return port;
        }
    }
    panic!("no node of {nodes:?} answers")
}

fn kill_node(port: u16) {
    let dir = std::env::var("TEST_REDIS_DIR").expect("TEST_REDIS_DIR (set by scripts/test)");
    let pid = std::fs::read_to_string(format!("{dir}/{port}/pid")).expect("the node's pid file");
    let status = std::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Starts a killed node again as it was started; it rejoins as a replica.
fn restart_node(port: u16) {
    let dir = std::env::var("TEST_REDIS_DIR").unwrap();
    let cmd = std::fs::read_to_string(format!("{dir}/{port}/cmd")).unwrap();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} --daemonize yes"))
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_never_makes_a_key_run_twice_with_replica_acks() {
    let Some(nodes) = r::failover_cluster("failover") else {
        return;
    };
    let store = r::on_cluster(&nodes, |s| {
        s.with_replica_acks(1, Duration::from_millis(500))
            .with_lock_timeout(Duration::from_secs(15))
            .with_operation_timeout(Duration::from_secs(2))
    })
    .await;
    let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let app = {
        let runs = runs.clone();
        ServiceBuilder::new()
            .layer(IdempotencyLayer::new(store.clone()).with_wait_timeout(Duration::from_secs(2)))
            .service_fn(move |req: Request<Full<Bytes>>| {
                let runs = runs.clone();
                async move {
                    let key = req.headers()["idempotency-key"]
                        .to_str()
                        .unwrap()
                        .to_owned();
                    let n = {
                        let mut runs = runs.lock().unwrap();
                        let n = runs.entry(key.clone()).or_default();
                        *n += 1;
                        *n
                    };
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(StatusCode::CREATED)
                            .body(Full::new(Bytes::from(format!("{key} run {n}"))))
                            .unwrap(),
                    )
                }
            })
    };
    let send = move |key: String| {
        let app = app.clone();
        async move {
            let mut request = Request::post("/orders")
                .header("idempotency-key", &key)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            request
                .extensions_mut()
                .insert(Scope::new(format!("tenant-{}", &key[4..7])));
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            (
                status,
                response.into_body().collect().await.unwrap().to_bytes(),
            )
        }
    };
    // 32 clients, each retrying its keys until answered, then replaying them.
    let started = Instant::now();
    let clients: Vec<_> = (0..32)
        .map(|c| {
            let send = send.clone();
            tokio::spawn(async move {
                let (mut answers, mut unavailable) = (Vec::new(), 0);
                for k in 0..40 {
                    let key = format!("key-{c:03}-{k:04}");
                    let first = loop {
                        let (status, body) = send(key.clone()).await;
                        match status {
                            StatusCode::CREATED => break body,
                            StatusCode::SERVICE_UNAVAILABLE | StatusCode::CONFLICT => {
                                unavailable += 1;
                                assert!(started.elapsed() < Duration::from_secs(90), "no recovery");
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            other => panic!("{key}: {other} {body:?}"),
                        }
                    };
                    answers.push((key, first));
                }
                (answers, unavailable)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let victim = a_primary(&nodes).await;
    kill_node(victim);
    let killed_at = started.elapsed();
    // Its replica takes over within a few seconds, alone: claims wait for an
    // acknowledgement no replica can give (503) until the killed node is
    // back, as an orchestrator would bring it, and rejoins as the replica.
    tokio::time::sleep(Duration::from_secs(4)).await;
    restart_node(victim);
    let mut refused = 0;
    let mut answers = Vec::new();
    for client in clients {
        let (a, u) = client.await.unwrap();
        answers.extend(a);
        refused += u;
    }
    // Every key answered replays its first answer, after the failover too
    // (a completion the failover interrupted is being recorded again).
    for (key, first) in &answers {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = send(key.clone()).await;
            if status == StatusCode::CREATED {
                assert_eq!(&body, first, "{key}");
                break;
            }
            assert!(Instant::now() < until, "{key}: {status} {body:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let runs = runs.lock().unwrap();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "keys run more than once: {twice:?}");
    assert_eq!(runs.len(), 32 * 40);
    eprintln!(
        "killed primary :{victim} at {killed_at:?}; {} keys each ran once; {refused} 503/409 answers during the failover; done in {:?}",
        runs.len(),
        started.elapsed()
    );
}
