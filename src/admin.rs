//! An axum [`Router`] for operators (feature `admin`): inspect a key, release
//! a claim whose owner is known dead. Mount it behind the application's own
//! admin authentication, which says who asks by putting an [`Actor`] in the
//! request's extensions; a request without one is answered `401`.
//!
//! - `GET /keys/{scope}/{key}` answers the key's state as JSON (see
//!   [`Inspect::inspect`]): `{"state": "absent"}`, `{"state": "in_progress",
//!   "token", "attempt", "since_unix_ms", "lock_expires_unix_ms"}`,
//!   `{"state": "completed", "status", "body_bytes", "expires_unix_ms"}`,
//!   `{"state": "unavailable", "expires_unix_ms"}` or `{"state": "tombstone",
//!   "expires_unix_ms"}`.
//! - `POST /keys/{scope}/{key}/release` with `{"token": <token>}` (the token
//!   the inspection showed) releases the claim ([`Inspect::release_stuck`]):
//!   `200` released, `409` with `not_owner` (the token does not own the
//!   record: it completed, or a new claim holds it) or `owner_alive` (more
//!   than a tenth of its lock is left: the owner may be alive), `404`
//!   the key has no record. Every attempt is
//!   logged at `WARN` with the actor ([`audit`](crate::store::inspect::audit)).
//!
//! A key that is not a valid `Idempotency-Key` is answered `400`, a store
//! failure `503`.
//!
//! ```
//! use axum::body::Body;
//! use http::{Request, StatusCode};
//! use http_body_util::BodyExt;
//! use std::time::Duration;
//! use tower::ServiceExt;
//! use tower_idempotency::admin::{self, Actor};
//! use tower_idempotency::store::{Begin, RecordKey, Store};
//! use tower_idempotency::{fingerprint::Fingerprint, IdempotencyKey, MemoryStore, Scope};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // A one-second lock, to watch a dead owner's claim become releasable.
//! let store = MemoryStore::builder().with_lock_timeout(Duration::from_secs(1)).build();
//! let key = RecordKey::new(Scope::new("acme"), IdempotencyKey::parse(b"order-0001").unwrap());
//! let Ok(Begin::Claimed(claim)) = store.begin(&key, &Fingerprint::from_bytes([7; 32]).into()).await else {
//!     unreachable!()
//! };
//!
//! // The application's admin auth sets the actor; here, a fixed one.
//! let app = axum::Router::new()
//!     .nest("/admin/idempotency", admin::router(store.clone()))
//!     .layer(axum::Extension(Actor::new("alice@ops")));
//!
//! let get = Request::get("/admin/idempotency/keys/acme/order-0001").body(Body::empty()).unwrap();
//! let answer = app.clone().oneshot(get).await.unwrap();
//! assert_eq!(answer.status(), StatusCode::OK);
//! let state: serde_json::Value =
//!     serde_json::from_slice(&answer.into_body().collect().await.unwrap().to_bytes()).unwrap();
//! assert_eq!(state["state"], "in_progress");
//! assert_eq!(state["token"], claim.token.get());
//!
//! let release = || {
//!     Request::post("/admin/idempotency/keys/acme/order-0001/release")
//!         .header("content-type", "application/json")
//!         .body(Body::from(format!(r#"{{"token": {}}}"#, state["token"])))
//!         .unwrap()
//! };
//! // Its lock is fresh: as far as anyone can tell, its owner is alive.
//! assert_eq!(app.clone().oneshot(release()).await.unwrap().status(), StatusCode::CONFLICT);
//! // Nine tenths of the lock later, unextended: its owner missed its beats.
//! tokio::time::sleep(Duration::from_millis(950)).await;
//! assert_eq!(app.oneshot(release()).await.unwrap().status(), StatusCode::OK);
//! # }
//! ```

use crate::store::inspect::{Inspect, KeyState, Release};
use crate::store::{FencingToken, RecordKey};
use crate::{IdempotencyKey, Scope};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Who asks: set by the application's admin authentication (as a request
/// extension) and written into the audit event of every release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor(Arc<str>);

impl Actor {
    /// An actor named `name` (a user, a service account).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self(name.into())
    }

    /// The actor's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The operators' routes over `store` (see the [module](self)).
pub fn router<S: Inspect>(store: S) -> Router {
    Router::new()
        .route("/keys/{scope}/{key}", get(inspect::<S>))
        .route("/keys/{scope}/{key}/release", post(release::<S>))
        .with_state(Arc::new(store))
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn error(status: StatusCode, error: &str) -> Response {
    answer(status, json!({ "error": error }))
}

/// The record key of a path; `None` for a key that is not a valid
/// `Idempotency-Key` (answered [`invalid_key`]).
fn record_key(scope: String, key: &str) -> Option<RecordKey> {
    let key = IdempotencyKey::parse(key.as_bytes())?;
    Some(RecordKey::new(Scope::new(scope), key))
}

fn invalid_key() -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_key")
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn state_json(state: &KeyState) -> Value {
    match state {
        KeyState::InProgress(claim) => json!({
            "state": "in_progress",
            "token": claim.token.get(),
            "attempt": claim.attempt,
            "since_unix_ms": unix_ms(claim.since),
            "lock_expires_unix_ms": unix_ms(claim.lock_expires),
        }),
        KeyState::Completed {
            status,
            body_bytes,
            expires,
        } => json!({
            "state": "completed",
            "status": status.as_u16(),
            "body_bytes": body_bytes,
            "expires_unix_ms": unix_ms(*expires),
        }),
        KeyState::Unavailable { expires } => json!({
            "state": "unavailable",
            "expires_unix_ms": unix_ms(*expires),
        }),
        KeyState::Tombstone { expires } => json!({
            "state": "tombstone",
            "expires_unix_ms": unix_ms(*expires),
        }),
        // `Absent`, and states a later version adds, shown by name only.
        _ => json!({ "state": "absent" }),
    }
}

async fn inspect<S: Inspect>(
    State(store): State<Arc<S>>,
    actor: Option<Extension<Actor>>,
    Path((scope, key)): Path<(String, String)>,
) -> Response {
    if actor.is_none() {
        return error(StatusCode::UNAUTHORIZED, "no_actor");
    }
    let Some(key) = record_key(scope, &key) else {
        return invalid_key();
    };
    match store.inspect(&key).await {
        Ok(state) => answer(StatusCode::OK, state_json(&state)),
        Err(e) => {
            tracing::warn!(error = %e, "an inspection failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable")
        }
    }
}

async fn release<S: Inspect>(
    State(store): State<Arc<S>>,
    actor: Option<Extension<Actor>>,
    Path((scope, key)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    let Some(Extension(actor)) = actor else {
        return error(StatusCode::UNAUTHORIZED, "no_actor");
    };
    let Some(key) = record_key(scope, &key) else {
        return invalid_key();
    };
    let Some(token) = body.get("token").and_then(Value::as_i64) else {
        return error(StatusCode::BAD_REQUEST, "token_required");
    };
    match store
        .release_stuck(&key, FencingToken::new(token), actor.as_str())
        .await
    {
        Ok(Release::Released) => answer(StatusCode::OK, json!({ "released": true })),
        Ok(Release::NotOwner) => error(StatusCode::CONFLICT, "not_owner"),
        Ok(Release::OwnerAlive) => error(StatusCode::CONFLICT, "owner_alive"),
        Ok(_) => error(StatusCode::NOT_FOUND, "absent"),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
    }
}
