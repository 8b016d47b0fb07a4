//! The layer end to end, and the round-trip budget.

use super::*;
use tower_idempotency::store::Completion;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_runs_the_handler_once_for_200_concurrent_identical_requests() {
    let Some(url) = pg::database_url("layer_runs_the_handler_once_for_200_concurrent") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("layer"), |s| s).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(move |_req: Request<Full<Bytes>>| {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .header("location", format!("/v1/orders/{n}"))
                    .body(Full::new(Bytes::from(format!(r#"{{"order":{n}}}"#))))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        });
    let key = format!("order-{}", pg::unique_table("k"));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (service, request) = (service.clone(), order_request(&key));
            tokio::spawn(async move { service.oneshot(request).await.unwrap() })
        })
        .collect();
    let (mut created, mut in_progress) = (0, 0);
    for task in tasks {
        let response = task.await.unwrap();
        match response.status() {
            StatusCode::CREATED => {
                assert_eq!(response.headers()["location"], "/v1/orders/1");
                let body = response.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, Bytes::from_static(br#"{"order":1}"#));
                created += 1;
            }
            StatusCode::CONFLICT => {
                assert_eq!(error_code(response).await, "idempotency_in_progress");
                in_progress += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran exactly once"
    );
    assert_eq!(created + in_progress, 200);
    assert!(created >= 1);
    eprintln!("{created} created or replayed, {in_progress} in progress");
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

/// The round-trip budget: fresh request = 2 (begin + complete), replay = 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_fresh_request_two_replay_one() {
    let Some(url) = pg::database_url("round_trips_fresh_request_two_replay_one") else {
        return;
    };
    let table = pg::unique_table("round_trips");
    // One connection, so its statement cache is warm after the first request.
    let store = PostgresStore::builder(pg::pool(pg::pg_config(&url), 1))
        .with_table(table.parse().unwrap())
        .build();
    store.migrate().await.unwrap();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(|_req: Request<Full<Bytes>>| async {
            let response = Response::builder()
                .status(StatusCode::CREATED)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            Ok::<_, Infallible>(response)
        });
    // Warm-up: prepares begin and complete on the pool's connection.
    let warm = service
        .clone()
        .oneshot(order_request("warm-up-key"))
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::CREATED);
    let warm = service
        .clone()
        .oneshot(order_request("warm-up-key"))
        .await
        .unwrap();
    assert_eq!(warm.headers()["idempotent-replayed"], "true");

    let before = store.round_trips();
    let fresh = service
        .clone()
        .oneshot(order_request("counted-key"))
        .await
        .unwrap();
    assert_eq!(fresh.status(), StatusCode::CREATED);
    let fresh_trips = store.round_trips() - before;

    let before = store.round_trips();
    let replay = service
        .clone()
        .oneshot(order_request("counted-key"))
        .await
        .unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let replay_trips = store.round_trips() - before;

    // A response the policy does not record: begin + release.
    let not_recorded = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(store.clone()))
        .service_fn(|_req: Request<Full<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
        });
    let warm = not_recorded
        .clone()
        .oneshot(order_request("warm-up-200"))
        .await
        .unwrap();
    assert_eq!(warm.status(), StatusCode::OK);
    let before = store.round_trips();
    let ok = not_recorded
        .oneshot(order_request("counted-200"))
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let released_trips = store.round_trips() - before;

    // Directly on the store: a mismatch and an in-progress answer are one each too.
    let key = fresh_key();
    claim(&store, &key, "a").await;
    let before = store.round_trips();
    assert!(matches!(
        store.begin(&key, &fingerprint("a")).await,
        Ok(Begin::InProgress)
    ));
    assert!(matches!(
        store.begin(&key, &fingerprint("b")).await,
        Ok(Begin::KeyReused)
    ));
    let decided_trips = store.round_trips() - before;

    eprintln!(
        "round trips: fresh {fresh_trips}, replay {replay_trips}, \
         not recorded {released_trips}, in progress + mismatch {decided_trips}"
    );
    assert_eq!(fresh_trips, 2, "fresh request = begin + complete");
    assert_eq!(replay_trips, 1, "replay = begin");
    assert_eq!(released_trips, 2, "not recorded = begin + release");
    assert_eq!(decided_trips, 2);
}

/// A replay, a mismatch and an in-progress answer write nothing: no row version,
/// no row lock, no token drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_is_a_read_no_row_write_lock_or_token() {
    let Some(url) = pg::database_url("replay_is_a_read_no_row_write_lock_or_token") else {
        return;
    };
    let table = pg::unique_table("read_only");
    let store = pg::store(&url, &table, |s| s).await;
    let observer = pg::connect(&url).await;
    let (done, running) = (fresh_key(), fresh_key());
    let token = claim(&store, &done, "a").await;
    store
        .complete(&done, token, Completion::Response(response(b"body")))
        .await
        .unwrap();
    claim(&store, &running, "a").await;

    let snapshot = || async {
        let row = observer
            .query_one(
                &format!(
                    "SELECT (SELECT array_agg(xmin::text || '/' || xmax::text ORDER BY scope) \
                             FROM public.{table}), \
                            (SELECT last_value FROM public.{table}_token_seq)"
                ),
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, Vec<String>>(0), row.get::<_, i64>(1))
    };
    let before = snapshot().await;
    for _ in 0..3 {
        assert!(matches!(
            store.begin(&done, &fingerprint("a")).await,
            Ok(Begin::Replay(_))
        ));
        assert!(matches!(
            store.begin(&done, &fingerprint("b")).await,
            Ok(Begin::KeyReused)
        ));
        assert!(matches!(
            store.begin(&running, &fingerprint("a")).await,
            Ok(Begin::InProgress)
        ));
    }
    assert_eq!(snapshot().await, before, "rows and sequence untouched");
}

/// Transactional mode: the handler finds its `Attempt` beside its
/// transaction. A first run is attempt 1; a run that takes over a claim left
/// in progress past its lock (by an owner that died before its handler's
/// transaction began) is attempt 2 and names the dead owner's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_handler_after_a_takeover_sees_its_attempt() {
    let Some(url) = pg::database_url("a_transactional_handler_after_a_takeover") else {
        return;
    };
    let lock = Duration::from_millis(300);
    let store = pg::store(&url, &pg::unique_table("attempt"), |s| {
        s.with_lock_timeout(lock)
    })
    .await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let service = {
        let seen = seen.clone();
        ServiceBuilder::new()
            .layer(IdempotencyLayer::transactional(store.clone()))
            .service_fn(move |req: Request<Full<Bytes>>| {
                let extensions = req.extensions();
                let in_transaction = extensions.get::<PostgresTransaction>().is_some();
                seen.lock()
                    .unwrap()
                    .push((extensions.get::<Attempt>().copied(), in_transaction));
                async move {
                    let response = Response::builder()
                        .status(StatusCode::CREATED)
                        .body(Full::new(Bytes::from_static(b"done")))
                        .unwrap();
                    Ok::<_, Infallible>(response)
                }
            })
    };

    let fresh = format!("order-{}", pg::unique_table("k"));
    let answer = service
        .clone()
        .oneshot(order_request(&fresh))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);

    let abandoned = format!("order-{}", pg::unique_table("k"));
    let record = RecordKey::new(
        Scope::new("tenant"),
        tower_idempotency::IdempotencyKey::parse(abandoned.as_bytes()).unwrap(),
    );
    let dead = claim(&store, &record, "whatever the dead owner sent").await;
    tokio::time::sleep(lock + Duration::from_millis(200)).await;
    let answer = service.oneshot(order_request(&abandoned)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);

    let seen = seen.lock().unwrap().clone();
    let [(Some(first), true), (Some(second), true)] = seen[..] else {
        panic!("two runs, each with its attempt and transaction: {seen:?}");
    };
    assert_eq!((first.number(), first.previous_token()), (1, None));
    assert_eq!(second.number(), 2);
    assert_eq!(second.previous_token(), Some(dead));
    assert!(second.token() > dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_answer_replays_with_its_content_encoding_whatever_the_allow_list() {
    let Some(url) = pg::database_url("a_gzip_answer_replays_with_its_content_encoding") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("encoding"), |s| s).await;
    tower_idempotency_tests::representation::a_gzip_answer_replays_with_its_content_encoding(store)
        .await;
}

/// Transactional mode: a `2xx` the record policy declines is rolled back, its
/// key released, and the answer says so (`Idempotency-Status: not-recorded`);
/// the retry runs the handler again. A recorded `201` carries no mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_2xx_the_policy_declines_is_marked_not_recorded() {
    let Some(url) = pg::database_url("a_transactional_2xx_the_policy_declines_is_marked") else {
        return;
    };
    let store = pg::store(&url, &pg::unique_table("not_recorded"), |s| s).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::transactional(store.clone()))
        .service_fn(move |req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            let status = match req.headers().contains_key("x-created") {
                true => StatusCode::CREATED,
                false => StatusCode::OK,
            };
            async move {
                let response = Response::builder().status(status);
                Ok::<_, Infallible>(response.body(Full::new(Bytes::from_static(b"{}"))).unwrap())
            }
        });
    let key = format!("refund-{}", pg::unique_table("k"));
    for run in 1..=2 {
        let answer = service.clone().oneshot(order_request(&key)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()["idempotency-status"], "not-recorded");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            run,
            "not recorded: it runs again"
        );
    }
    let mut created = order_request(&format!("order-{}", pg::unique_table("k")));
    created
        .headers_mut()
        .insert("x-created", "1".parse().unwrap());
    let answer = service.oneshot(created).await.unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert!(
        !answer.headers().contains_key("idempotency-status"),
        "{answer:?}"
    );
}
