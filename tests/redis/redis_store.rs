//! `RedisStore` on a standalone server and on a Cluster: the conformance
//! suite on both, round trips through the layer, scopes over every shard,
//! 1000 waiters on one key, and outages: a network cut, a hung server, a
//! restarted server.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::store::conformance::{fingerprint, record, response, Durations};
use tower_idempotency::store::Claim;
use tower_idempotency::store::Completion;
use tower_idempotency::{
    store::{Begin, Store, StoreError},
    IdempotencyLayer, RedisStore,
};
use tower_idempotency_tests::support::proxy::Proxy;
use tower_idempotency_tests::support::redis as r;

mod standalone {
    use super::*;

    async fn redis_store(d: Durations) -> Option<RedisStore> {
        let url = r::url("redis_store conformance")?;
        Some(
            r::standalone(&url, |s| {
                s.with_lock_timeout(d.lock)
                    .with_retention(d.retention)
                    .with_tombstone(d.tombstone)
            })
            .await,
        )
    }

    tower_idempotency::store_conformance_tests!(redis_store, expires_by_itself);
    tower_idempotency::store_conformance_tests!(inspect: redis_store);
    tower_idempotency::engine_conformance_tests!(redis_store);
    tower_idempotency::phase_store_conformance_tests!(redis_store);
}

mod cluster {
    use super::*;

    async fn redis_cluster_store(d: Durations) -> Option<RedisStore> {
        let nodes = r::cluster("redis_cluster_store conformance")?;
        Some(
            r::on_cluster(&nodes, |s| {
                s.with_lock_timeout(d.lock)
                    .with_retention(d.retention)
                    .with_tombstone(d.tombstone)
            })
            .await,
        )
    }

    tower_idempotency::store_conformance_tests!(redis_cluster_store, expires_by_itself);
    tower_idempotency::store_conformance_tests!(inspect: redis_cluster_store);
    tower_idempotency::engine_conformance_tests!(redis_cluster_store);
    tower_idempotency::phase_store_conformance_tests!(redis_cluster_store);
}

type App = tower::util::BoxCloneService<
    Request<Full<Bytes>>,
    Response<tower_idempotency::body::ResponseBody<Full<Bytes>>>,
    Infallible,
>;

/// The layer over `store`, its handler counting runs and answering 201.
fn app(store: RedisStore, runs: Arc<AtomicUsize>) -> App {
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store).with_wait_timeout(Duration::from_secs(5)))
        .service_fn(move |_req: Request<_>| {
            let runs = runs.clone();
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(format!(r#"{{"order":{n}}}"#))))
                        .unwrap(),
                )
            }
        });
    tower::util::BoxCloneService::new(service)
}

fn order(key: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"sku":"A","qty":1}"#)))
        .unwrap();
    request
        .extensions_mut()
        .insert(tower_idempotency::Scope::new("tenant"));
    request
}

async fn send(app: &App, key: &str) -> (StatusCode, Bytes) {
    let response = app.clone().oneshot(order(key)).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// A fresh request costs two round trips, a replay one the first time an
/// instance reads the record (the one that completed it too), and none
/// afterwards (its near cache answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_request_costs_two_round_trips_and_a_replay_one_on_both_deployments() {
    let (Some(url), Some(nodes)) = (r::url("round trips"), r::cluster("round trips")) else {
        return;
    };
    let (standalone, cluster) = (
        r::standalone(&url, |s| s).await,
        r::on_cluster(&nodes, |s| s).await,
    );
    // Another instance of each store (the same prefix).
    let node_urls: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let others = (
        RedisStore::builder()
            .with_prefix(standalone.prefix().parse().unwrap())
            .connect(&url)
            .await
            .unwrap(),
        RedisStore::builder()
            .with_prefix(cluster.prefix().parse().unwrap())
            .connect_cluster(&node_urls)
            .await
            .unwrap(),
    );
    for (store, other) in [(standalone, others.0), (cluster, others.1)] {
        let app = app(store.clone(), Arc::new(AtomicUsize::new(0)));
        let other_app = app_on(other.clone());
        // Loads the scripts (a first call may need SCRIPT LOAD) and starts
        // the subscribers, without which nothing is answered near.
        send(&app, "warm-up-0001").await;
        send(&other_app, "warm-up-0001").await;
        for s in [&store, &other] {
            let until = Instant::now() + Duration::from_secs(5);
            while !s.is_listening() {
                assert!(Instant::now() < until, "the subscriber never connected");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let trips = |s: &RedisStore| s.round_trips();
        let before = trips(&store);
        assert_eq!(send(&app, "fresh-00001").await.0, StatusCode::CREATED);
        let fresh = trips(&store) - before;
        let before = trips(&other);
        assert_eq!(send(&other_app, "fresh-00001").await.0, StatusCode::CREATED);
        let first_read = trips(&other) - before;
        // The completing instance reads the record once too: completions are
        // not kept near.
        let before = trips(&store);
        assert_eq!(send(&app, "fresh-00001").await.0, StatusCode::CREATED);
        let completed_here = trips(&store) - before;
        let before = (trips(&store), trips(&other));
        assert_eq!(send(&app, "fresh-00001").await.0, StatusCode::CREATED);
        assert_eq!(send(&other_app, "fresh-00001").await.0, StatusCode::CREATED);
        let near = (trips(&store) - before.0, trips(&other) - before.1);
        assert_eq!(
            (fresh, first_read, completed_here, near),
            (2, 1, 1, (0, 0)),
            "{store:?}"
        );
    }
}

/// The layer over `store`, its handler answering 201 with no body.
fn app_on(store: RedisStore) -> App {
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store))
        .service_fn(|_req: Request<_>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        });
    tower::util::BoxCloneService::new(service)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_spread_over_every_primary_and_each_replays_only_its_own() {
    let Some(nodes) = r::cluster("scopes over every shard") else {
        return;
    };
    let store = r::on_cluster(&nodes, |s| s).await;
    let key = record("scope-0", "order-000001");
    for i in 0..300 {
        let key = record(&format!("tenant-{i}"), key.key().as_str());
        let Begin::Claimed(Claim { token, .. }) =
            store.begin(&key, &fingerprint("a")).await.unwrap()
        else {
            panic!("fresh key of tenant {i}");
        };
        let body: &'static [u8] = Box::leak(format!("tenant-{i}").into_bytes().into_boxed_slice());
        store
            .complete(&key, token, Completion::Response(response(body)))
            .await
            .unwrap();
    }
    for i in 0..300 {
        let key = record(&format!("tenant-{i}"), key.key().as_str());
        match store.begin(&key, &fingerprint("a")).await.unwrap() {
            Begin::Replay(stored) => assert_eq!(stored.body, format!("tenant-{i}")),
            other => panic!("tenant {i}: {other:?}"),
        }
    }
    // Every primary holds records of this store.
    let mut primaries = 0;
    for url in &nodes {
        let mut conn = r::connection(url).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        let role: String = redis::from_redis_value(role[0].clone()).unwrap();
        if role != "master" {
            continue;
        }
        primaries += 1;
        let (_, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(0)
            .arg("MATCH")
            .arg(format!("{}:*", store.prefix()))
            .arg("COUNT")
            .arg(100_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!keys.is_empty(), "primary {url} holds none of 300 scopes");
    }
    assert_eq!(primaries, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_waiters_on_one_key_share_their_checks_and_wake_on_completion() {
    let Some(nodes) = r::cluster("1000 waiters") else {
        return;
    };
    let store = r::on_cluster(&nodes, |s| s).await;
    store.start_listener();
    let until = Instant::now() + Duration::from_secs(5);
    while !store.is_listening() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.is_listening());
    let key = record("tenant", "order-waited-01");
    let Begin::Claimed(Claim { token, .. }) = store.begin(&key, &fingerprint("a")).await.unwrap()
    else {
        panic!("fresh key");
    };
    let before = store.round_trips();
    let waiters: Vec<_> = (0..1000)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                store.wait(&key, Duration::from_secs(10)).await.unwrap();
                Instant::now()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(store.watched_keys(), 1);
    let completed = Instant::now();
    store
        .complete(&key, token, Completion::Response(response(b"done")))
        .await
        .unwrap();
    let mut latest = completed;
    for waiter in waiters {
        latest = latest.max(waiter.await.unwrap());
    }
    let woken_in = latest - completed;
    // 1.5 s of waiting: a few coalesced checks (each waiter's first check may
    // need one that started after it registered), not one loop per waiter.
    let checks = store.round_trips() - before - 1;
    assert!(checks <= 30, "{checks} checks for 1000 waiters");
    assert!(
        woken_in < Duration::from_millis(200),
        "woken after {woken_in:?}"
    );
    assert!(store.notifications_received() >= 1);
    eprintln!("1000 waiters: {checks} checks, all woken {woken_in:?} after the completion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_cut_or_a_hung_server_is_a_503_in_bounded_time_and_recovers() {
    let Some(url) = r::url("network cut") else {
        return;
    };
    let target = format!("127.0.0.1:{}", r::port(&url)).parse().unwrap();
    let proxy = Proxy::start(target).await;
    let through = format!("redis://127.0.0.1:{}", proxy.port);
    let store = r::standalone(&through, |s| {
        s.with_operation_timeout(Duration::from_millis(500))
    })
    .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(store.clone(), runs.clone());
    assert_eq!(send(&app, "before-cut-01").await.0, StatusCode::CREATED);
    for (name, cut) in [("frozen", true), ("down", false)] {
        if cut {
            proxy.set_frozen(true);
        } else {
            proxy.set_up(false);
        }
        let runs_before = runs.load(Ordering::SeqCst);
        let started = Instant::now();
        let (status, _) = send(&app, &format!("during-{name}-1")).await;
        let took = started.elapsed();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{name}");
        assert!(
            took < Duration::from_millis(1500),
            "{name}: 503 after {took:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            runs_before,
            "{name}: the handler ran"
        );
        proxy.set_frozen(false);
        proxy.set_up(true);
        // Recovers without a restart of the application.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, _) = send(&app, &format!("after-{name}-01")).await;
            if status == StatusCode::CREATED {
                break;
            }
            assert!(Instant::now() < until, "{name}: no recovery, last {status}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_a_503_while_down_and_serves_again_without_an_app_restart() {
    if r::url("server restart").is_none() {
        return;
    }
    let mut server = r::OwnServer::start();
    let store = r::standalone(&server.url(), |s| {
        s.with_operation_timeout(Duration::from_millis(800))
    })
    .await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(store.clone(), runs.clone());
    assert_eq!(send(&app, "before-restart").await.0, StatusCode::CREATED);
    server.kill();
    let (status, _) = send(&app, "while-down-001").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    server.restart();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _) = send(&app, "after-restart1").await;
        if status == StatusCode::CREATED {
            break;
        }
        assert!(Instant::now() < until, "no recovery, last {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A store error is never "run anyway": the failed key did not run.
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unreachable_server_fails_to_connect_quickly() {
    let started = Instant::now();
    let error = RedisStore::connect("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Backend(_)));
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A clone of a builder is a second configuration: each connect makes a
/// store of its own, with its own timings and (under another prefix) its own
/// records; a clone of a store is the same store.
#[tokio::test]
async fn a_cloned_builder_connects_a_store_of_its_own() {
    let Some(url) = r::url("a cloned builder") else {
        return;
    };
    let builder = RedisStore::builder().with_prefix(r::unique_prefix("a").parse().unwrap());
    let other = builder
        .clone()
        .with_prefix(r::unique_prefix("b").parse().unwrap())
        .with_retention(Duration::from_secs(60));
    let a = builder.connect(&url).await.unwrap();
    let b = other.connect(&url).await.unwrap();
    assert_eq!(a.timings().retention, Some(Duration::from_secs(24 * 3600)));
    assert_eq!(b.timings().retention, Some(Duration::from_secs(60)));
    let (key, fp) = (record("s", "key-0000001"), fingerprint("a"));
    assert!(matches!(a.begin(&key, &fp).await, Ok(Begin::Claimed(_))));
    assert!(matches!(b.begin(&key, &fp).await, Ok(Begin::Claimed(_))));
    assert!(matches!(
        a.clone().begin(&key, &fp).await,
        Ok(Begin::InProgress)
    ));
}

#[test]
fn a_prefix_with_braces_is_refused() {
    use tower_idempotency::{store::RedisPrefix, ConfigError};
    assert_eq!(
        "a{b}".parse::<RedisPrefix>(),
        Err(ConfigError::RedisPrefix("a{b}".into()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_never_runs_an_operation_when_the_store_is_cut_off() {
    use tower_idempotency::engine::{Engine, EngineError, Identity, Outcome};
    let Some(url) = r::url("engine outage") else {
        return;
    };
    let target = format!("127.0.0.1:{}", r::port(&url)).parse().unwrap();
    let proxy = Proxy::start(target).await;
    let through = format!("redis://127.0.0.1:{}", proxy.port);
    let store = r::standalone(&through, |s| {
        s.with_operation_timeout(Duration::from_millis(500))
    })
    .await;
    let engine = Engine::new(store);
    let scope = tower_idempotency::Scope::new("consumer");
    let key = tower_idempotency::IdempotencyKey::parse(b"message-cut-1").unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let operation = |runs: Arc<AtomicUsize>| {
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from_static(b"effect"))
        }
    };
    proxy.set_frozen(true);
    let started = Instant::now();
    let answer = engine
        .run_bytes(&scope, &key, Identity::Bytes(b"m"), operation(runs.clone()))
        .await;
    assert!(
        matches!(answer, Err(EngineError::Store(StoreError::Backend(_)))),
        "{answer:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran without the store");
    proxy.set_frozen(false);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match engine
            .run_bytes(&scope, &key, Identity::Bytes(b"m"), operation(runs.clone()))
            .await
        {
            Ok(Outcome::Executed(_)) => break,
            other => {
                assert!(Instant::now() < until, "no recovery: {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_record_naming_another_scope_is_refused_not_replayed() {
    use sha2::{Digest, Sha256};
    let Some(url) = r::url("forged record") else {
        return;
    };
    let store = r::standalone(&url, |s| s).await;
    let key = record("tenant-a", "order-forged-1");
    // What a digest collision of two scopes would leave: tenant-a's record
    // name holding tenant-b's completed record.
    let digest = Sha256::digest(b"tenant-a");
    let tag: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("{}:{{{tag}}}:r:order-forged-1", store.prefix());
    let mut conn = r::connection(&url).await;
    let fp = fingerprint("a");
    let _: () = redis::cmd("HSET")
        .arg(&name)
        .arg(&[
            "sc",
            "tenant-b",
            "k",
            "order-forged-1",
            "tok",
            "1",
            "st",
            "c",
        ])
        .arg("fp")
        .arg(&fp.fingerprint().as_bytes()[..])
        .arg(&["status", "201", "hd", "", "bd", "tenant-b's order"])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        matches!(store.begin(&key, &fp).await, Err(StoreError::Backend(_))),
        "another scope's record must never be replayed"
    );
}

/// A claim's key outlives its lock (so its owner's late `extend` or
/// `complete` still finds it): its waiters still return when the lock runs
/// out, not at their timeout, and the next `begin` takes the key over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_returns_when_a_dead_owners_lock_runs_out_though_its_key_is_kept() {
    let Some(url) = r::url("waiter after a dead owner") else {
        return;
    };
    let lock = Duration::from_millis(400);
    let store = r::standalone(&url, |s| {
        s.with_lock_timeout(lock)
            .with_retention(Duration::from_secs(3600))
    })
    .await;
    let key = record("tenant", "dead-owner-001");
    let fp = fingerprint("a");
    let Begin::Claimed(Claim { token: dead, .. }) = store.begin(&key, &fp).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    let started = Instant::now();
    store.wait(&key, Duration::from_secs(30)).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= lock - Duration::from_millis(50) && waited < Duration::from_secs(5),
        "waited {waited:?}"
    );
    let Begin::Claimed(Claim { token: fresh, .. }) = store.begin(&key, &fp).await.unwrap() else {
        panic!("the expired claim is taken over");
    };
    assert!(fresh > dead);
    assert!(matches!(
        store.extend(&key, dead).await,
        Err(StoreError::ClaimLost)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_answer_replays_with_its_content_encoding_whatever_the_allow_list() {
    let Some(url) = r::url("a_gzip_answer_replays_with_its_content_encoding") else {
        return;
    };
    let store = r::standalone(&url, |s| s).await;
    tower_idempotency_tests::representation::a_gzip_answer_replays_with_its_content_encoding(store)
        .await;
}

/// A completed record leaves a tombstone key beside it (the fingerprint and
/// the scope in a short string with its own TTL): `MEMORY USAGE` of it is
/// printed for `docs/benchmarks.md` (`--nocapture`). Past the retention it
/// answers `Expired` while the record (and its response) is gone, and
/// `purge_scope` erases it with the scope's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_is_a_small_key_of_its_own_and_is_erased_with_its_scope() {
    let Some(url) = r::url("tombstone key") else {
        return;
    };
    let prefix = r::unique_prefix("tomb");
    let store = RedisStore::builder()
        .with_prefix(prefix.parse().unwrap())
        .with_retention(Duration::from_millis(500))
        .with_tombstone(Duration::from_secs(3600))
        .connect(&url)
        .await
        .unwrap();
    // A key as clients send them (a UUID) and a response of a kilobyte.
    let key = record("tenant-0001", "0b7c8f3e-7d2a-4c1e-9f65-2a1d3c4b5e6f");
    let fp = fingerprint("charge 42");
    let Begin::Claimed(Claim { token, .. }) = store.begin(&key, &fp).await.unwrap() else {
        panic!("fresh key");
    };
    let mut stored = response(b"");
    stored.body = Bytes::from(vec![b'x'; 1024]);
    store
        .complete(&key, token, Completion::Response(stored))
        .await
        .unwrap();
    let mut conn = r::connection(&url).await;
    let names: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let named = |part: &str| names.iter().find(|n| n.contains(part)).cloned().unwrap();
    let (record_name, tombstone_name) = (named(":r:"), named(":x:"));
    let usage = |name: String| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(name)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap()
        }
    };
    let record_bytes = usage(record_name).await;
    let tombstone_bytes = usage(tombstone_name.clone()).await;
    println!(
        "Redis: {tombstone_bytes} bytes per tombstone key of {} bytes (MEMORY USAGE; the \
         record beside it, with a 1 KiB response: {record_bytes} bytes)",
        tombstone_name.len()
    );
    // Beyond its name: the fingerprint, the scope, and Redis's own overhead.
    let overhead = tombstone_bytes - tombstone_name.len() as i64;
    assert!(overhead < 128, "{overhead} bytes beside the name");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&tombstone_name)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        ttl > 3_500_000,
        "kept for the retention and the window: {ttl} ms"
    );

    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(matches!(store.begin(&key, &fp).await, Ok(Begin::Expired)));
    let scope = tower_idempotency::Scope::new("tenant-0001");
    let purged = tower_idempotency::store::Maintenance::purge_scope(&store, &scope).await;
    assert_eq!(purged.unwrap(), 1);
    assert!(matches!(
        store.begin(&key, &fp).await,
        Ok(Begin::Claimed(_))
    ));
}

/// What a phase costs on Redis, by the store's counter (warm): an operation
/// of a phased engine that uses no phases costs what an unphased one does
/// (`begin`, `complete`); its first phase adds the read of the recorded
/// phases and each phase one script call that records it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phase_costs_one_round_trip() {
    let Some(url) = r::url("phase cost") else {
        return;
    };
    let store = r::standalone(&url, |s| s).await;
    let engine = tower_idempotency::engine::Engine::phased(store.clone());
    let count = || store.round_trips();
    let trips = tower_idempotency_tests::phase_cost::report("Redis", &engine, count).await;
    assert_eq!(trips, [2, 4, 6], "0, 1 and 3 phases");
}
