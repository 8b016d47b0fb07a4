//! Outages: a store outage answers 503, and the service resumes when the database returns.

use super::*;
use tower_idempotency::store::Maintenance;

type OrderService =
    BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

fn counting_service(store: PostgresStore) -> (OrderService, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store))
        .service_fn(move |_req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        })
        .boxed_clone();
    (service, runs)
}

/// Needs no database: the pool points at a port nobody listens on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_answers_503_and_never_runs_the_handler() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = pg::pg_config_at("postgres://postgres@127.0.0.1/postgres", port);
    let store = PostgresStore::new(pg::pool(config, 4));
    assert!(matches!(store.migrate().await, Err(StoreError::Backend(_))));
    let (service, runs) = counting_service(store);
    let started = Instant::now();
    let answer = service
        .oneshot(order_request("outage-key-1"))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(answer).await, "idempotency_store_unavailable");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler did not run");
    assert!(started.elapsed() < Duration::from_secs(3), "failed fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_resumes_without_restart_when_the_database_returns() {
    let Some(url) = pg::database_url("service_resumes_without_restart") else {
        return;
    };
    let table = pg::unique_table("outage");
    pg::store(&url, &table, |s| s).await; // migrated directly
    let proxy =
        tower_idempotency_tests::support::proxy::Proxy::start(pg::server_addr(&url).await).await;
    let store = PostgresStore::builder(pg::pool(pg::pg_config_at(&url, proxy.port), 4))
        .with_table(table.parse().unwrap())
        .with_operation_timeout(Duration::from_secs(3))
        .build();
    let (service, runs) = counting_service(store.clone());

    let first = service
        .clone()
        .oneshot(order_request("resume-key-1"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    proxy.set_up(false);
    for key in ["resume-key-1", "resume-key-2", "resume-key-2"] {
        let started = Instant::now();
        let answer = service.clone().oneshot(order_request(key)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE, "{key}");
        assert_eq!(error_code(answer).await, "idempotency_store_unavailable");
        assert!(started.elapsed() < Duration::from_secs(4), "failed fast");
    }
    assert!(matches!(
        store.purge_expired().await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran during the outage"
    );

    proxy.set_up(true);
    let second = service
        .clone()
        .oneshot(order_request("resume-key-2"))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let replay = service
        .clone()
        .oneshot(order_request("resume-key-1"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
