//! `DownstreamKeys` as handlers and operations get them: the layer's claimed
//! requests and the engine's runs see the keys `DownstreamKeys::new` derives
//! for their scope and key, the same on a run again after a release, on
//! another store, and between the layer and the engine; a secret changes them.
//! (After a crash, on shared stores: `checkout_processor` and
//! `exactly_once::processes`.)

use axum::body::Body;
use axum::extract::Extension;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower::ServiceExt;
use tower_idempotency::engine::{Engine, Identity, Outcome};
use tower_idempotency::{
    downstream::{DownstreamKeys, DownstreamSecret},
    IdempotencyKey, IdempotencyLayer, MemoryStore, Scope,
};

const NAME: &str = "card-processor";

fn expected(scope: &str, key: &str, secret: Option<&DownstreamSecret>) -> String {
    let keys = DownstreamKeys::new(
        Scope::new(scope),
        IdempotencyKey::parse(key.as_bytes()).unwrap(),
    );
    match secret {
        Some(secret) => keys.with_secret(secret.clone()),
        None => keys,
    }
    .key_for(NAME)
    .to_string()
}

fn secret() -> DownstreamSecret {
    DownstreamSecret::new("a downstream secret of 32 bytes.").unwrap()
}

/// `POST /charge` answers the downstream key it was given: `500` on its
/// first `fail_first` runs (not recorded: the key is released), then `201`.
fn app(layer: IdempotencyLayer, fail_first: usize) -> Router {
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = move |Extension(keys): Extension<DownstreamKeys>| {
        let run = runs.fetch_add(1, SeqCst);
        async move {
            let status = match run < fail_first {
                true => StatusCode::INTERNAL_SERVER_ERROR,
                false => StatusCode::CREATED,
            };
            (status, keys.key_for(NAME).to_string())
        }
    };
    Router::new()
        .route("/charge", post(handler))
        .route_layer(layer)
}

async fn send(app: &Router, scope: &str, key: &str) -> (StatusCode, String) {
    let mut request = Request::post("/charge")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap();
    request.extensions_mut().insert(Scope::new(scope));
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn a_claimed_request_gets_the_keys_of_its_scope_and_key_on_every_run() {
    let app = app(IdempotencyLayer::new(MemoryStore::new()), 1);
    let want = expected("acme", "order-0001", None);
    // A run that fails frees the key; the retry runs again with the same key.
    assert_eq!(
        send(&app, "acme", "order-0001").await,
        (StatusCode::INTERNAL_SERVER_ERROR, want.clone())
    );
    assert_eq!(
        send(&app, "acme", "order-0001").await,
        (StatusCode::CREATED, want.clone())
    );
    // Another tenant with the same client key: another downstream key.
    let (_, other) = send(&app, "globex", "order-0001").await;
    assert_eq!(other, expected("globex", "order-0001", None));
    assert_ne!(other, want);
}

#[tokio::test]
async fn another_store_and_the_engine_derive_the_same_keys() {
    let (a, b) = (
        app(IdempotencyLayer::new(MemoryStore::new()), 0),
        app(IdempotencyLayer::new(MemoryStore::new()), 0),
    );
    let from_a = send(&a, "acme", "order-0002").await.1;
    assert_eq!(from_a, send(&b, "acme", "order-0002").await.1);
    let engine = Engine::new(MemoryStore::new());
    let key = IdempotencyKey::parse(b"order-0002").unwrap();
    let run = |context: tower_idempotency::engine::RunContext| async move {
        Ok::<_, std::convert::Infallible>(Bytes::from(
            context.downstream_keys().key_for(NAME).to_string(),
        ))
    };
    let outcome = engine
        .run_bytes(&Scope::new("acme"), &key, Identity::Bytes(b"{}"), run)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Executed(Bytes::from(from_a)));
}

#[tokio::test]
async fn a_secret_keys_them_alike_on_the_layer_and_the_engine() {
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_downstream_secret(secret());
    let keyed = send(&app(layer, 0), "acme", "order-0003").await.1;
    assert_eq!(keyed, expected("acme", "order-0003", Some(&secret())));
    assert_ne!(keyed, expected("acme", "order-0003", None));
    assert!(keyed.starts_with("dk1h-"), "{keyed}");
    let engine = Engine::new(MemoryStore::new()).with_downstream_secret(secret());
    let key = IdempotencyKey::parse(b"order-0003").unwrap();
    let run = |context: tower_idempotency::engine::RunContext| async move {
        Ok::<_, std::convert::Infallible>(Bytes::from(
            context.downstream_keys().key_for(NAME).to_string(),
        ))
    };
    let outcome = engine
        .run_bytes(&Scope::new("acme"), &key, Identity::Bytes(b"{}"), run)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Executed(Bytes::from(keyed)));
}
