//! Every decision is observable: a span per request with the scope, the key's
//! hash (never the key) and the outcome; with `metrics`, a counter and a
//! latency histogram per outcome.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Scope};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// Collects every field recorded on spans and events, as text.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<HashMap<u64, HashMap<String, String>>>>,
    events: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.spans.lock().unwrap().insert(id.into_u64(), fields);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut spans = self.spans.lock().unwrap();
        values.record(&mut Fields(spans.entry(id.into_u64()).or_default()));
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let meta = event.metadata();
        fields.insert("@level".to_owned(), meta.level().to_string());
        fields.insert("@target".to_owned(), meta.target().to_owned());
        if let Some(span) = ctx.event_span(event) {
            if let Some(span_fields) = self.spans.lock().unwrap().get(&span.id().into_u64()) {
                for (k, v) in span_fields {
                    fields
                        .entry(format!("span.{k}"))
                        .or_insert_with(|| v.clone());
                }
            }
        }
        self.events.lock().unwrap().push(fields);
    }
}

fn request(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    let mut req = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    req.extensions_mut().insert(Scope::new("merchant_7"));
    req
}

#[tokio::test]
async fn every_decision_is_traced_with_scope_key_hash_and_outcome_never_the_key() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service_fn(
        |req: Request<Full<Bytes>>| async move {
            let status = if req.headers().contains_key("x-fail") {
                500
            } else {
                201
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        },
    ));
    let secret_key = "secret-key-0123456789";
    svc.clone()
        .oneshot(request(secret_key, "{}"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(request(secret_key, "{}"))
        .await
        .unwrap();
    svc.clone()
        .oneshot(request(secret_key, r#"{"other":1}"#))
        .await
        .unwrap();
    let mut failing = request("failing-key-0001", "{}");
    failing.headers_mut().insert("x-fail", "1".parse().unwrap());
    svc.clone().oneshot(failing).await.unwrap();
    svc.clone().oneshot(request("bad", "{}")).await.unwrap();

    let events = capture.events.lock().unwrap().clone();
    let outcomes: Vec<&str> = events
        .iter()
        .filter_map(|e| e.get("outcome").map(String::as_str))
        .collect();
    assert_eq!(
        outcomes,
        ["claimed", "replayed", "key_reused", "released", "rejected"]
    );
    let first = &events[0];
    assert_eq!(first["span.scope"], "merchant_7");
    assert_eq!(first["span.key_hash"].len(), 16);
    assert_eq!(first["layer"], "idempotency");
    assert_eq!(
        events[1]["span.key_hash"], first["span.key_hash"],
        "the same key hashes alike"
    );
    for event in &events {
        for value in event.values() {
            assert!(
                !value.contains(secret_key),
                "the key itself is never logged: {event:?}"
            );
        }
    }
}

/// A layer mounted outside the auth layer answers everyone `401`: the first
/// such request on each route is warned with the likely cause and the fix,
/// later ones only at `DEBUG`.
#[tokio::test]
async fn a_missing_scope_is_warned_once_per_route_with_its_likely_cause() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service_fn(
        |_req: Request<Full<Bytes>>| async move {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        },
    ));
    for path in ["/v1/orders", "/v1/orders", "/v1/refunds"] {
        let mut req = request("order-no-scope-1", "{}");
        req.extensions_mut().remove::<Scope>();
        *req.uri_mut() = path.parse().unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), http::StatusCode::UNAUTHORIZED);
    }
    let events = capture.events.lock().unwrap();
    let warned: Vec<_> = events
        .iter()
        .filter(|e| {
            e.get("message")
                .is_some_and(|m| m.contains("no Scope in the request extensions"))
        })
        .collect();
    let paths: Vec<&str> = warned.iter().map(|e| e["path"].as_str()).collect();
    assert_eq!(paths, ["/v1/orders", "/v1/refunds"], "{events:#?}");
    let message = &warned[0]["message"];
    assert!(
        message.contains("mount the layer inside (after)"),
        "{message}"
    );
    assert!(message.contains(".with_scope("), "{message}");
    let noted = events
        .iter()
        .filter(|e| e.get("message").is_some_and(|m| m.contains("no scope")))
        .count();
    assert_eq!(noted, 3);
}

/// The default policy records only `201`: a handler answering `200` runs on
/// every retry. The first such answer on a route is warned, naming the status
/// and the option that records it; a `201` is not.
#[tokio::test]
async fn a_2xx_the_policy_does_not_record_is_warned_once_per_route() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service_fn(
        |req: Request<Full<Bytes>>| async move {
            let status = req.headers()["x-status"].to_str().unwrap().parse::<u16>();
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status.unwrap())
                    .body(Full::new(Bytes::new()))
                    .unwrap(),
            )
        },
    ));
    let sends = [
        ("/v1/orders", "order-200-0001", 200),
        ("/v1/orders", "order-200-0002", 200),
        ("/v1/orders", "order-201-0001", 201),
        ("/v1/orders", "order-422-0001", 422),
        ("/v1/refunds", "order-200-0003", 200),
    ];
    for (path, key, status) in sends {
        let mut req = request(key, "{}");
        *req.uri_mut() = path.parse().unwrap();
        req.headers_mut().insert("x-status", status.into());
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), status);
    }
    let events = capture.events.lock().unwrap();
    let warned: Vec<_> = events
        .iter()
        .filter(|e| {
            e.get("message")
                .is_some_and(|m| m.contains("the record policy does not record"))
        })
        .collect();
    let seen: Vec<(&str, &str)> = warned
        .iter()
        .map(|e| (e["path"].as_str(), e["status"].as_str()))
        .collect();
    assert_eq!(seen, [("/v1/orders", "200"), ("/v1/refunds", "200")]);
    let message = &warned[0]["message"];
    assert!(message.contains("200 OK"), "{message}");
    assert!(
        message.contains(".with_record_policy(RecordSuccess)"),
        "{message}"
    );
}

/// An operator's release is audited at `WARN`: who asked, the scope, the
/// key's keyed hash (the one the request spans carry, never the key) and
/// the outcome; a refused release (a stale token) is audited too.
#[tokio::test]
async fn an_operator_release_is_audited_at_warn_with_actor_scope_and_key_hash_never_the_key() {
    use tower_idempotency::fingerprint::Fingerprint;
    use tower_idempotency::store::{Begin, Inspect, RecordKey, Release, Store};
    use tower_idempotency::IdempotencyKey;

    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    // A short lock: the stuck claim below becomes releasable (its owner
    // missed nine tenths of a lock of keep-alive beats) within the test.
    let lock = std::time::Duration::from_millis(200);
    let store = MemoryStore::builder().with_lock_timeout(lock).build();
    let secret_key = "stuck-key-0123456789";
    // A request through the layer, for the key hash its span carries.
    let svc = IdempotencyLayer::new(store.clone()).layer(service_fn(
        |_req: Request<Full<Bytes>>| async move {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        },
    ));
    svc.oneshot(request(secret_key, "{}")).await.unwrap();
    let span_hash = capture.events.lock().unwrap()[0]["span.key_hash"].clone();

    let key = RecordKey::new(
        Scope::new("merchant_8"),
        IdempotencyKey::parse(secret_key.as_bytes()).unwrap(),
    );
    let Ok(Begin::Claimed(claim)) = store
        .begin(&key, &Fingerprint::from_bytes([3; 32]).into())
        .await
    else {
        panic!("claim");
    };
    capture.events.lock().unwrap().clear();
    let stale = tower_idempotency::store::FencingToken::new(claim.token.get() + 1);
    assert_eq!(
        store.release_stuck(&key, stale, "bob@ops").await.unwrap(),
        Release::NotOwner
    );
    tokio::time::sleep(lock - lock / 20).await;
    assert_eq!(
        store
            .release_stuck(&key, claim.token, "alice@ops")
            .await
            .unwrap(),
        Release::Released
    );

    let events = capture.events.lock().unwrap().clone();
    let audits: Vec<_> = events
        .iter()
        .filter(|e| e["@target"] == "tower_idempotency::audit")
        .collect();
    assert_eq!(audits.len(), 2, "{events:?}");
    for (audit, (actor, outcome)) in audits
        .iter()
        .zip([("bob@ops", "not_owner"), ("alice@ops", "released")])
    {
        assert_eq!(audit["@level"], "WARN");
        assert_eq!(audit["actor"], actor);
        assert_eq!(audit["outcome"], outcome);
        assert_eq!(audit["scope"], "merchant_8");
        assert_eq!(audit["key_hash"], span_hash, "the spans' keyed hash");
    }
    for event in &events {
        for value in event.values() {
            assert!(
                !value.contains(secret_key),
                "the key is never logged: {event:?}"
            );
        }
    }
}
