//! `purge_scope` while a request of that scope runs: after it returns, no
//! record of the scope exists or is committed later, in plain and in
//! transactional mode; `purge_expired` never deletes a running claim.

use super::*;
use tokio::sync::{oneshot, Notify};

/// A layer over `store` (transactional or plain) whose handler says when it
/// started, then waits for `gate` before answering 201 with the tenant's data.
fn gated_service(
    store: &PostgresStore,
    transactional: bool,
    started: Arc<Notify>,
    gate: Arc<tokio::sync::Mutex<Option<oneshot::Receiver<()>>>>,
    runs: Arc<AtomicUsize>,
) -> OrderService {
    let layer = match transactional {
        true => IdempotencyLayer::transactional(store.clone()),
        false => IdempotencyLayer::new(store.clone()),
    };
    let service =
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(move |_req: Request<Full<Bytes>>| {
                let (started, gate) = (started.clone(), gate.clone());
                runs.fetch_add(1, Ordering::SeqCst);
                async move {
                    started.notify_one();
                    let gate = gate.lock().await.take();
                    if let Some(gate) = gate {
                        let _ = gate.await;
                    }
                    let response = Response::builder()
                        .status(StatusCode::CREATED)
                        .body(Full::new(Bytes::from_static(b"the erased tenant's data")))
                        .unwrap();
                    Ok::<_, Infallible>(response)
                }
            });
    BoxCloneService::new(service)
}

fn tenant_request(scope: &Scope, key: &str) -> Request<Full<Bytes>> {
    let mut request = order_request(key);
    request.extensions_mut().insert(scope.clone());
    request
}

/// Waits until `purge` has returned or a session of the database waits for an
/// advisory lock (the purge queued behind the running request).
async fn until_returned_or_waiting(
    sql: &tokio_postgres::Client,
    purge: &tokio::task::JoinHandle<u64>,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if purge.is_finished() {
            return;
        }
        let waiting: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the purge neither ran nor waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn purge_while_a_handler_runs(transactional: bool) {
    let Some(url) = pg::database_url("purge_scope_while_a_handler_runs") else {
        return;
    };
    let table = pg::unique_table("purge_running");
    let store = pg::store(&url, &table, |s| s).await;
    let sql = pg::connect(&url).await;
    let scope = Scope::new(pg::unique_table("erased"));
    let (started, runs) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    let (release, gate) = oneshot::channel();
    let gate = Arc::new(tokio::sync::Mutex::new(Some(gate)));
    let service = gated_service(&store, transactional, started.clone(), gate, runs.clone());
    let key = format!("order-{}", pg::unique_table("k"));

    let first = tokio::spawn(service.clone().oneshot(tenant_request(&scope, &key)));
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the handler started");
    let purge = {
        let (store, scope) = (store.clone(), scope.clone());
        tokio::spawn(async move {
            use tower_idempotency::store::Maintenance;
            store.purge_scope(&scope).await.expect("purge_scope")
        })
    };
    until_returned_or_waiting(&sql, &purge).await;
    release.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    assert!(first.status().is_success() || first.status().is_server_error());
    tokio::time::timeout(Duration::from_secs(20), purge)
        .await
        .expect("the purge returned")
        .unwrap();

    // After the purge: no row of the scope, and its request runs anew.
    let rows: i64 = sql
        .query_one(
            &format!(r#"SELECT count(*) FROM "{table}" WHERE scope = $1"#),
            &[&scope.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "a record of the purged scope outlived the purge");
    let retry = service.oneshot(tenant_request(&scope, &key)).await.unwrap();
    assert!(
        !retry.headers().contains_key("idempotent-replayed"),
        "the purged tenant's response was replayed"
    );
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_purge_scope_while_a_handler_runs_leaves_no_record() {
    purge_while_a_handler_runs(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_purge_scope_while_a_handler_runs_leaves_no_record() {
    purge_while_a_handler_runs(true).await;
}

/// A transactional claim past its lock is still its handler's (the
/// transaction is its proof of life): `purge_expired` leaves it, and the
/// handler's record commits and replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_expired_never_deletes_a_running_transactional_claim() {
    use tower_idempotency::store::Maintenance;
    let Some(url) = pg::database_url("purge_expired_never_deletes_a_running_claim") else {
        return;
    };
    let lock = Duration::from_millis(300);
    let store = pg::store(&url, &pg::unique_table("purge_live"), |s| {
        s.with_lock_timeout(lock)
    })
    .await;
    let scope = Scope::new(pg::unique_table("tenant"));
    let (started, runs) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    // One claim made fresh, one that takes over a claim left past its lock.
    for taken_over in [false, true] {
        let key = format!("order-{}", pg::unique_table("k"));
        if taken_over {
            let record = RecordKey::new(
                scope.clone(),
                tower_idempotency::IdempotencyKey::parse(key.as_bytes()).unwrap(),
            );
            let _ = store.begin(&record, &fingerprint("dead owner")).await;
            tokio::time::sleep(lock + Duration::from_millis(100)).await;
        }
        let (release, gate) = oneshot::channel();
        let gate = Arc::new(tokio::sync::Mutex::new(Some(gate)));
        let service = gated_service(&store, true, started.clone(), gate, runs.clone());
        let first = tokio::spawn(service.clone().oneshot(tenant_request(&scope, &key)));
        tokio::time::timeout(Duration::from_secs(20), started.notified())
            .await
            .expect("the handler started");
        tokio::time::sleep(lock + Duration::from_millis(100)).await;
        store.purge_expired().await.expect("purge_expired");
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
        let retry = service.oneshot(tenant_request(&scope, &key)).await.unwrap();
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
