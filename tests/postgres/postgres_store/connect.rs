//! The one-line start: `PostgresStore::connect(url)` and
//! `PostgresStore::builder_from_url(url)`, with the driver crates named
//! through the crate's re-exports.

use super::*;
use tower_idempotency::postgres::tokio_postgres::types::ToSql;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_starts_from_a_url_and_runs_a_transactional_handler() {
    let Some(url) = pg::database_url("a_store_starts_from_a_url") else {
        return;
    };
    let store = PostgresStore::connect(&url).await.expect("connect");
    assert_eq!(store.table(), "public.idempotency_records");

    let store = PostgresStore::builder_from_url(&url)
        .expect("the URL parses")
        .with_table(pg::unique_table("from_url").parse().unwrap())
        .build();
    store.migrate().await.expect("migrate");
    // The listener comes with it, on the same database.
    store.start_listener();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !store.is_listening() {
        assert!(Instant::now() < deadline, "the listener never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::transactional(store.clone()))
        .service_fn(move |req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            let tx = req.extensions().get::<PostgresTransaction>().cloned();
            async move {
                let client = tx.expect("transactional").client().await.expect("client");
                let sku: &(dyn ToSql + Sync) = &"A-1";
                let row = client.query_one("SELECT $1::text", &[sku]).await.unwrap();
                let body = Bytes::from(row.get::<_, String>(0));
                let response = Response::builder().status(StatusCode::CREATED);
                Ok::<_, Infallible>(response.body(Full::new(body)).unwrap())
            }
        });
    let key = format!("order-{}", pg::unique_table("k"));
    for replayed in [false, true] {
        let answer = service.clone().oneshot(order_request(&key)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED);
        assert_eq!(
            answer.headers().contains_key("idempotent-replayed"),
            replayed
        );
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, Bytes::from_static(b"A-1"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A URL that does not parse, or a server that does not answer, fails
/// `connect` at once rather than the first request.
#[tokio::test]
async fn connect_fails_on_a_bad_url_or_a_database_that_does_not_answer() {
    let bad = PostgresStore::connect("postgres://app@localhost:not-a-port/app").await;
    assert!(matches!(bad, Err(StoreError::Backend(_))), "{bad:?}");
    assert!(PostgresStore::builder_from_url("postgres://app@localhost:not-a-port/app").is_err());

    // A loopback port nothing listens on: refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://app@127.0.0.1:{port}/app");
    let down = tokio::time::timeout(Duration::from_secs(30), PostgresStore::connect(&url))
        .await
        .expect("bounded by the store's timeouts");
    assert!(matches!(down, Err(StoreError::Backend(_))), "{down:?}");
}
