//! `PostgresStore` against a real PostgreSQL: the store conformance suite, plus
//! concurrency across pools, the layer end to end, round trips, migrations,
//! waiting, retention and outages.
//!
//! Without `DATABASE_URL` the database tests skip loudly; with
//! `REQUIRE_POSTGRES=1` (CI, `./scripts/test`) they fail instead.
#![cfg(feature = "postgres")]

use tower_idempotency::store::conformance;
use tower_idempotency::store::Claim;
use tower_idempotency_tests::support;

mod claims;
mod connect;
mod layer;
mod lock_claims;
mod near_cache;
mod outages;
mod phases;
mod purge_running;
mod retention;
mod schema;
mod single_flight;
mod transaction_control;
mod waiting;

use bytes::Bytes;
use conformance::{fingerprint, record, response, Durations};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::pg;
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::{
    body::ResponseBody,
    engine::Attempt,
    store::{Begin, FencingToken, RecordKey, Store, StoreError},
    IdempotencyLayer, PostgresStore, PostgresTransaction, Scope,
};

async fn postgres_store(d: Durations) -> Option<PostgresStore> {
    let url = pg::database_url("postgres_store conformance")?;
    let table = pg::unique_table("conformance");
    let store = pg::store(&url, &table, |s| {
        s.with_lock_timeout(d.lock)
            .with_retention(d.retention)
            .with_tombstone(d.tombstone)
    })
    .await;
    Some(store)
}

tower_idempotency::store_conformance_tests!(postgres_store);
tower_idempotency::store_conformance_tests!(inspect: postgres_store);
tower_idempotency::engine_conformance_tests!(postgres_store);
tower_idempotency::phase_store_conformance_tests!(postgres_store);

/// A layer over a handler of `Full` bodies, boxed.
type OrderService =
    BoxCloneService<Request<Full<Bytes>>, Response<ResponseBody<Full<Bytes>>>, Infallible>;

/// A key in a scope of its own.
fn fresh_key() -> RecordKey {
    record(&pg::unique_table("tenant"), "key-00000001")
}

async fn claim(store: &PostgresStore, key: &RecordKey, body: &str) -> FencingToken {
    match store.begin(key, &fingerprint(body)).await.expect("begin") {
        Begin::Claimed(Claim { token, .. }) => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn order_request(key: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"sku":"A-1","qty":2}"#)))
        .unwrap();
    request.extensions_mut().insert(Scope::new("tenant"));
    request
}

async fn error_code(response: Response<impl http_body::Body>) -> String {
    let Ok(collected) = response.into_body().collect().await else {
        panic!("refusal body");
    };
    let json: serde_json::Value = serde_json::from_slice(&collected.to_bytes()).unwrap();
    json["code"].as_str().unwrap_or_default().to_owned()
}

async fn until_listening(store: &PostgresStore) {
    store.start_listener();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.is_listening() {
        assert!(Instant::now() < deadline, "the listener never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
