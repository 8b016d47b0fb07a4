//! The operators' router (feature `admin`) over HTTP: a key's state as JSON
//! in each of its states, a release fenced by the token (`200`, then `404`;
//! `409` for a token that does not own the record, whose owner then still
//! completes), `401` without an actor, `400` for a bad key or body.

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_idempotency::admin::{self, Actor};
use tower_idempotency::fingerprint::Fingerprint;
use tower_idempotency::store::{Begin, Completion, RecordKey, Store, StoredResponse};
use tower_idempotency::{IdempotencyKey, MemoryStore, Scope};

fn app(store: MemoryStore) -> axum::Router {
    axum::Router::new()
        .nest("/admin", admin::router(store))
        .layer(axum::Extension(Actor::new("ops-test")))
}

async fn call(app: &axum::Router, request: Request<Body>) -> (StatusCode, Value) {
    let answer = app.clone().oneshot(request).await.unwrap();
    let status = answer.status();
    let bytes = answer.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn release(path: &str, token: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(format!(r#"{{"token": {token}}}"#)))
        .unwrap()
}

fn key(scope: &str, key: &str) -> RecordKey {
    RecordKey::new(
        Scope::new(scope),
        IdempotencyKey::parse(key.as_bytes()).unwrap(),
    )
}

async fn claim(store: &MemoryStore, key: &RecordKey) -> i64 {
    match store
        .begin(key, &Fingerprint::from_bytes([5; 32]).into())
        .await
        .unwrap()
    {
        Begin::Claimed(claim) => claim.token.get(),
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test]
async fn the_admin_router_inspects_and_releases_over_http_fenced_by_the_token() {
    let lock = std::time::Duration::from_millis(400);
    let store = MemoryStore::builder().with_lock_timeout(lock).build();
    let app = app(store.clone());
    let path = "/admin/keys/acme/order-00000001";

    let (status, state) = call(&app, get(path)).await;
    assert_eq!(
        (status, state["state"].as_str()),
        (StatusCode::OK, Some("absent"))
    );

    let stuck = key("acme", "order-00000001");
    let token = claim(&store, &stuck).await;
    let (status, state) = call(&app, get(path)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state["state"], "in_progress");
    assert_eq!(state["token"], token);
    assert_eq!(state["attempt"], 1);
    let since = state["since_unix_ms"].as_u64().unwrap();
    assert!(state["lock_expires_unix_ms"].as_u64().unwrap() > since);
    // Another scope never sees acme's key.
    let (_, other) = call(&app, get("/admin/keys/globex/order-00000001")).await;
    assert_eq!(other["state"], "absent");

    // A token that does not own the claim: 409, and nothing changed.
    let (status, body) = call(
        &app,
        release(&format!("{path}/release"), &(token + 7).to_string()),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_owner"))
    );
    assert_eq!(call(&app, get(path)).await.1["state"], "in_progress");
    // The owner's token, its lock fresh: the owner is alive, 409.
    let (status, body) = call(
        &app,
        release(&format!("{path}/release"), &token.to_string()),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("owner_alive"))
    );

    // Nine tenths of the lock later, unextended: released.
    tokio::time::sleep(lock - lock / 20).await;
    let (status, body) = call(
        &app,
        release(&format!("{path}/release"), &token.to_string()),
    )
    .await;
    assert_eq!(
        (status, body["released"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    assert_eq!(call(&app, get(path)).await.1["state"], "absent");
    let (status, _) = call(
        &app,
        release(&format!("{path}/release"), &token.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Claimable again; completed, it shows its status and size, and no
    // token releases it.
    let token = claim(&store, &stuck).await;
    let response = StoredResponse {
        status: StatusCode::CREATED,
        headers: Vec::new(),
        body: bytes::Bytes::from_static(b"created"),
    };
    store
        .complete(
            &stuck,
            tower_idempotency::store::FencingToken::new(token),
            Completion::Response(response),
        )
        .await
        .unwrap();
    let (_, state) = call(&app, get(path)).await;
    assert_eq!(state["state"], "completed");
    assert_eq!(
        (state["status"].as_u64(), state["body_bytes"].as_u64()),
        (Some(201), Some(7))
    );
    assert!(state["expires_unix_ms"].as_u64().unwrap() > since);
    let (status, _) = call(
        &app,
        release(&format!("{path}/release"), &token.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);

    // Refusals before the store is asked.
    let (status, _) = call(&app, get("/admin/keys/acme/bad")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = call(&app, release(&format!("{path}/release"), "\"seven\"")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let anonymous = admin::router(store.clone());
    let answer = anonymous
        .oneshot(get("/keys/acme/order-00000001"))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
}
