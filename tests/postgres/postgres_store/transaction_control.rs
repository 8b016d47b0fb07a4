//! A transactional handler that tries to end the layer's transaction itself
//! (`ROLLBACK` or `COMMIT`, then more writes) must never get its request run
//! twice: the transaction's handle refuses transaction control.

use super::*;
use tokio::sync::{oneshot, Notify};

struct Shop {
    service: OrderService,
    sql: tokio_postgres::Client,
    orders: String,
    started: Arc<Notify>,
}

/// A transactional layer whose handler sends `control` through its
/// transaction, then (if that was accepted) writes an order and, on its first
/// run, waits for `gate` before answering 201.
async fn shop(
    url: &str,
    control: &'static str,
    lock: Duration,
    gate: oneshot::Receiver<()>,
) -> Shop {
    let table = pg::unique_table("control");
    let store = pg::store(url, &table, |s| s.with_lock_timeout(lock)).await;
    let sql = pg::connect(url).await;
    let orders = format!("{table}_orders");
    sql.batch_execute(&format!(r#"CREATE TABLE "{orders}" (key text NOT NULL)"#))
        .await
        .unwrap();
    let started = Arc::new(Notify::new());
    let gate = Arc::new(tokio::sync::Mutex::new(Some(gate)));
    let service = {
        let (orders, started) = (orders.clone(), started.clone());
        ServiceBuilder::new()
            .layer(IdempotencyLayer::transactional(store))
            .service_fn(move |req: Request<Full<Bytes>>| {
                let tx = req.extensions().get::<PostgresTransaction>().cloned();
                let (orders, started, gate) = (orders.clone(), started.clone(), gate.clone());
                async move {
                    let status = async {
                        let tx = tx.ok_or("no transaction")?;
                        let client = tx.client().await.map_err(|e| e.to_string())?;
                        client
                            .batch_execute(control)
                            .await
                            .map_err(|e| e.to_string())?;
                        let insert = format!(r#"INSERT INTO "{orders}" (key) VALUES ('order')"#);
                        client
                            .execute(&insert, &[])
                            .await
                            .map_err(|e| e.to_string())?;
                        drop(client);
                        started.notify_one();
                        let gate = gate.lock().await.take();
                        if let Some(gate) = gate {
                            let _ = gate.await;
                        }
                        Ok::<_, String>(StatusCode::CREATED)
                    }
                    .await
                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    let response = Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::from_static(b"order")))
                        .unwrap();
                    Ok::<_, Infallible>(response)
                }
            })
    };
    Shop {
        service: BoxCloneService::new(service),
        sql,
        orders,
        started,
    }
}

/// The first request runs its handler up to the gate (if its control
/// statement was accepted); after `pause`, a retry of the same request
/// arrives; then the first is let go. At most one order, ever.
async fn control_then_retry(control: &'static str, lock: Duration, pause: Duration) {
    let Some(url) = pg::database_url("a_handler_ending_the_transaction") else {
        return;
    };
    let (release, gate) = oneshot::channel();
    let shop = shop(&url, control, lock, gate).await;
    let key = format!("order-{}", pg::unique_table("k"));
    let first = tokio::spawn(shop.service.clone().oneshot(order_request(&key)));
    let reached_gate = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            _ = shop.started.notified() => true,
            // Refused: the first request is answered without reaching the gate.
            _ = async { while !first.is_finished() { tokio::time::sleep(Duration::from_millis(10)).await } } => false,
        }
    })
    .await
    .expect("the first request ran");
    if reached_gate {
        tokio::time::sleep(pause).await;
    }
    let retry = shop
        .service
        .clone()
        .oneshot(order_request(&key))
        .await
        .unwrap();
    let _ = release.send(());
    let first = first.await.unwrap().unwrap();
    let orders: i64 = shop
        .sql
        .query_one(&format!(r#"SELECT count(*) FROM "{}""#, shop.orders), &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        orders <= 1,
        "{control} in the handler: {orders} orders (answers {} and {})",
        first.status(),
        retry.status()
    );
    // Refused: nothing of the request committed, and nothing was recorded.
    assert_eq!(orders, 0);
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(retry.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sending_rollback_never_runs_twice() {
    control_then_retry("ROLLBACK", Duration::from_secs(10), Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sending_commit_never_runs_twice() {
    // The retry comes after the claim's lock ran out.
    let lock = Duration::from_millis(300);
    control_then_retry("COMMIT", lock, lock + Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_control_in_any_spelling_is_refused() {
    for control in [
        "rollback",
        "  /* a comment */ ABORT",
        "SELECT 1; commit work",
        "END TRANSACTION",
        "-- end\nROLLBACK AND CHAIN",
        "PREPARE TRANSACTION 'x'",
        "START TRANSACTION",
        "BEGIN",
    ] {
        control_then_retry(control, Duration::from_secs(10), Duration::ZERO).await;
    }
}

/// Savepoints, and the words of transaction control inside strings,
/// comments and identifiers, are the handler's to use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoints_and_quoted_words_are_allowed() {
    let Some(url) = pg::database_url("savepoints_and_quoted_words_are_allowed") else {
        return;
    };
    let (release, gate) = oneshot::channel();
    release.send(()).unwrap();
    let control = "SAVEPOINT a; ROLLBACK TO SAVEPOINT a; RELEASE SAVEPOINT a; \
                   SELECT 'x;commit', E'\\'; rollback', $q$ ; COMMIT $q$, \"end\" \
                   FROM (SELECT 1 AS \"end\") t /* ; ABORT */; -- ; COMMIT";
    let shop = shop(&url, control, Duration::from_secs(10), gate).await;
    let key = format!("order-{}", pg::unique_table("k"));
    let first = shop
        .service
        .clone()
        .oneshot(order_request(&key))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = shop
        .service
        .clone()
        .oneshot(order_request(&key))
        .await
        .unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let orders: i64 = shop
        .sql
        .query_one(&format!(r#"SELECT count(*) FROM "{}""#, shop.orders), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);
}
