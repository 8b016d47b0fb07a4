//! `LeaseLayer` in-process: what the layer itself guarantees around the handler,
//! and `Lease::spawn_worker` bringing every job to an ending.

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::convert::Infallible;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{service_fn, Layer, ServiceExt};
use tower_idempotency::lease::store::MemoryJobStore;
use tower_idempotency::lease::store::{JobReader, JobStatus, JobStore};
use tower_idempotency::Scope;
use tower_idempotency::{lease::JsonJobKey, Lease, LeaseLayer};

fn start_request(tenant: Option<&str>, body: &str) -> Request<Body> {
    let mut req = Request::post("/reports/start")
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap();
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(Scope::new(tenant));
    }
    req
}

async fn answer(
    res: Response<impl http_body::Body<Error = impl std::fmt::Debug>>,
) -> (StatusCode, serde_json::Value) {
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

const AUGUST: &str = r#"{"report_type":"customer_health","period":"2026-08"}"#;

fn layer(store: &MemoryJobStore) -> LeaseLayer<JsonJobKey> {
    LeaseLayer::new(
        store.clone(),
        "report".parse().unwrap(),
        JsonJobKey::new(["report_type", "period"]),
    )
    .with_location_prefix("/reports/")
    .with_owner("test-worker")
}

async fn job_status(
    store: &MemoryJobStore,
    tenant: &str,
    job_id: &str,
) -> (JobStatus, Option<String>) {
    let job = store
        .job(tenant, job_id)
        .await
        .unwrap()
        .expect("job exists");
    (job.status, job.error_code)
}

#[tokio::test]
async fn created_then_joined_and_the_handler_ran_once_with_a_lease() {
    let store = MemoryJobStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let svc = layer(&store).layer(service_fn(move |req: Request<Body>| {
        let lease = req.extensions().get::<Lease>().cloned();
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            assert_eq!(
                lease.expect("a Lease in the extensions").owner(),
                "test-worker"
            );
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }
    }));
    let (s1, first) = answer(
        svc.clone()
            .oneshot(start_request(Some("acme"), AUGUST))
            .await
            .unwrap(),
    )
    .await;
    let res = svc
        .clone()
        .oneshot(start_request(Some("acme"), AUGUST))
        .await
        .unwrap();
    let location = res.headers()["location"].to_str().unwrap().to_owned();
    let (s2, second) = answer(res).await;
    assert_eq!(
        (s1, first["created"].as_bool()),
        (StatusCode::ACCEPTED, Some(true))
    );
    assert_eq!((s2, second["join"].as_bool()), (StatusCode::OK, Some(true)));
    assert_eq!(first["job_id"], second["job_id"]);
    assert_eq!(
        location,
        format!("/reports/{}", first["job_id"].as_str().unwrap())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn refusals_before_any_job_is_touched() {
    let store = MemoryJobStore::new();
    let svc = layer(&store)
        .with_body_limit(64)
        .layer(service_fn(|_req: Request<Body>| async {
            panic!("the handler must not run");
            #[allow(unreachable_code)]
            Ok::<Response<Body>, Infallible>(Response::new(Body::empty()))
        }));
    let cases = [
        (None, AUGUST, StatusCode::UNAUTHORIZED, "unauthorized"),
        (
            Some("acme"),
            r#"{"report_type":"customer_health"}"#,
            StatusCode::BAD_REQUEST,
            "invalid_job_key",
        ),
        (
            Some("acme"),
            r#"{"report_type":"a:b","period":"2026-08"}"#,
            StatusCode::BAD_REQUEST,
            "invalid_job_key",
        ),
        (
            Some("acme"),
            &*format!(
                r#"{{"report_type":"{}","period":"2026-08"}}"#,
                "x".repeat(80)
            ),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ];
    for (tenant, body, status, code) in cases {
        let (got, json) = answer(
            svc.clone()
                .oneshot(start_request(tenant, body))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((got, json["code"].as_str()), (status, Some(code)), "{body}");
    }
}

/// The lease layer's refusals pass through the application's hook, typed,
/// budget exhaustion with its own `Retry-After`; the default body names the
/// body limit.
#[tokio::test]
async fn refusals_are_shaped_by_the_hook_with_what_was_refused() {
    use tower_idempotency::lease::store::Budget;
    use tower_idempotency::{Refusal, Refused};
    let store = MemoryJobStore::new();
    let hooked = layer(&store)
        .with_body_limit(64)
        .with_budget(Budget::per_day(NonZeroU64::new(1).unwrap()))
        .with_refusal_response(|refused: &Refused, default: Response<Bytes>| {
            let (mut parts, _) = default.into_parts();
            parts
                .headers
                .insert("x-refused", refused.refusal.code().parse().unwrap());
            Response::from_parts(parts, Bytes::from_static(b"refused"))
        });
    let svc = hooked.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    let res = svc
        .clone()
        .oneshot(start_request(None, AUGUST))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(res.headers()["x-refused"], "unauthorized");
    assert_eq!(
        res.extensions().get::<Refused>().unwrap().refusal,
        Refusal::Unauthorized
    );
    assert_eq!(
        &res.into_body().collect().await.unwrap().to_bytes()[..],
        b"refused"
    );

    svc.clone()
        .oneshot(start_request(Some("acme"), AUGUST))
        .await
        .unwrap();
    let september = r#"{"report_type":"customer_health","period":"2026-09"}"#;
    let res = svc
        .clone()
        .oneshot(start_request(Some("acme"), september))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["x-refused"], "budget_exhausted");
    let refused = *res.extensions().get::<Refused>().unwrap();
    assert_eq!(refused.refusal, Refusal::BudgetExhausted);
    let after = refused.retry_after.expect("until the budget resets");
    assert_eq!(
        res.headers()["retry-after"],
        after.as_secs().to_string().as_str()
    );

    let plain = layer(&store)
        .with_body_limit(64)
        .layer(service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }));
    let big = format!(
        r#"{{"report_type":"{}","period":"2026-08"}}"#,
        "x".repeat(80)
    );
    let (status, json) = answer(
        plain
            .oneshot(start_request(Some("acme"), &big))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        json["message"].as_str().unwrap().contains("64 bytes"),
        "{json}"
    );
}

#[tokio::test]
async fn a_body_claiming_another_tenant_is_403_and_tenants_never_share_a_job() {
    let store = MemoryJobStore::new();
    let key = JsonJobKey::new(["report_type", "period"]).with_claimed_tenant("claimed_tenant_id");
    let svc = LeaseLayer::new(store.clone(), "report".parse().unwrap(), key).layer(service_fn(
        |_req: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) },
    ));
    let claims_acme =
        r#"{"report_type":"customer_health","period":"2026-08","claimed_tenant_id":"acme"}"#;
    let (status, json) = answer(
        svc.clone()
            .oneshot(start_request(Some("globex"), claims_acme))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, json["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("tenant_mismatch"))
    );
    let (_, acme) = answer(
        svc.clone()
            .oneshot(start_request(Some("acme"), claims_acme))
            .await
            .unwrap(),
    )
    .await;
    let (_, globex) = answer(
        svc.clone()
            .oneshot(start_request(Some("globex"), AUGUST))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (acme["created"].as_bool(), globex["created"].as_bool()),
        (Some(true), Some(true))
    );
    assert_ne!(acme["job_id"], globex["job_id"]);
}

/// Tenant `org:acme` keyed by period and tenant `org` keyed by report type and
/// period would both be `org:acme:2026-08` as one joined string.
#[tokio::test]
async fn tenants_whose_joined_keys_coincide_get_their_own_jobs() {
    let store = MemoryJobStore::new();
    let ok = || {
        service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        })
    };
    let by_period = LeaseLayer::new(
        store.clone(),
        "report".parse().unwrap(),
        JsonJobKey::new(["period"]),
    )
    .layer(ok());
    let by_type = layer(&store).layer(ok());
    let with_closure = LeaseLayer::new(
        store.clone(),
        "report".parse().unwrap(),
        |_: &Scope, _: &http::request::Parts, _: &Bytes| Ok("acme:2026-08".to_owned()),
    )
    .layer(ok());
    let start = |svc: tower::util::BoxCloneService<Request<Body>, _, Infallible>,
                 tenant: &'static str,
                 body: &'static str| async move {
        answer(
            svc.oneshot(start_request(Some(tenant), body))
                .await
                .unwrap(),
        )
        .await
    };
    let (status, first) = start(
        tower::util::BoxCloneService::new(by_period),
        "org:acme",
        r#"{"period":"2026-08"}"#,
    )
    .await;
    assert_eq!(
        (status, first["created"].as_bool()),
        (StatusCode::ACCEPTED, Some(true))
    );
    let mut own_job = None;
    for svc in [
        tower::util::BoxCloneService::new(by_type),
        tower::util::BoxCloneService::new(with_closure),
    ] {
        let (status, other) =
            start(svc, "org", r#"{"report_type":"acme","period":"2026-08"}"#).await;
        assert!(status.is_success(), "{other}");
        assert_ne!(
            other["job_id"], first["job_id"],
            "another tenant joined org:acme's job"
        );
        // The closure's key is the same as the fields' within "org": it joins org's job.
        let job_id = other["job_id"].as_str().unwrap().to_owned();
        assert_eq!(*own_job.get_or_insert_with(|| job_id.clone()), job_id);
        let job = store.job("org", &job_id).await.unwrap().unwrap();
        assert_eq!(
            (job.tenant.as_str(), job.key.as_str()),
            ("org", "acme:2026-08")
        );
        let first_id = first["job_id"].as_str().unwrap();
        assert_eq!(store.job("org", first_id).await.unwrap(), None);
    }
}

/// Two layers on one store, keyed by the same fields, on two routes.
#[tokio::test]
async fn two_layers_of_different_kinds_never_join_each_other() {
    let store = MemoryJobStore::new();
    let month = || JsonJobKey::new(["month"]);
    let ok = || {
        service_fn(|_req: Request<Body>| async {
            Ok::<_, Infallible>(Response::new(Body::empty()))
        })
    };
    let exports = LeaseLayer::new(store.clone(), "export".parse().unwrap(), month())
        .with_location_prefix("/exports/")
        .layer(ok());
    let imports = LeaseLayer::new(store.clone(), "import".parse().unwrap(), month())
        .with_location_prefix("/imports/")
        .layer(ok());
    let body = r#"{"month":"2026-08"}"#;
    let export = exports
        .clone()
        .oneshot(start_request(Some("acme"), body))
        .await
        .unwrap();
    let import = imports
        .clone()
        .oneshot(start_request(Some("acme"), body))
        .await
        .unwrap();
    let location = |res: &Response<_>| res.headers()["location"].to_str().unwrap().to_owned();
    assert!(location(&export).starts_with("/exports/job_"));
    assert!(location(&import).starts_with("/imports/job_"));
    let (export, import) = (answer(export).await, answer(import).await);
    assert_eq!(
        (export.0, import.0),
        (StatusCode::ACCEPTED, StatusCode::ACCEPTED)
    );
    assert_ne!(export.1["job_id"], import.1["job_id"]);
    let again = exports
        .oneshot(start_request(Some("acme"), body))
        .await
        .unwrap();
    assert!(location(&again).starts_with("/exports/job_"));
    assert_eq!(answer(again).await.1["job_id"], export.1["job_id"]);
}

#[test]
fn a_layer_needs_a_kind() {
    use tower_idempotency::{lease::JobKind, ConfigError};
    assert_eq!("".parse::<JobKind>(), Err(ConfigError::EmptyJobKind));
}

#[tokio::test]
async fn a_handler_that_refuses_or_errors_ends_the_job() {
    let store = MemoryJobStore::new();
    let svc = layer(&store).layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .status(500)
                .body(Body::from("no capacity"))
                .unwrap(),
        )
    }));
    let res = svc
        .oneshot(start_request(Some("acme"), AUGUST))
        .await
        .unwrap();
    assert_eq!(res.status(), 500, "the handler's refusal is passed through");
    // The job failed, so the next start creates a new one instead of joining a dead job.
    let svc = layer(&store).layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    let (status, json) = answer(
        svc.oneshot(start_request(Some("acme"), AUGUST))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, json["created"].as_bool()),
        (StatusCode::ACCEPTED, Some(true))
    );

    let err_store = MemoryJobStore::new();
    let svc = layer(&err_store).layer(service_fn(|req: Request<Body>| async move {
        let lease = req.extensions().get::<Lease>().unwrap().clone();
        Err::<Response<Body>, _>(lease.job_id().to_owned())
    }));
    let job_id = svc
        .oneshot(start_request(Some("acme"), AUGUST))
        .await
        .unwrap_err();
    assert_eq!(
        job_status(&err_store, "acme", &job_id).await,
        (JobStatus::Failed, Some("start_failed".into()))
    );
}

#[tokio::test]
async fn a_panicking_start_handler_fails_the_job() {
    let store = MemoryJobStore::new();
    let svc = layer(&store).layer(service_fn(|_req: Request<Body>| async {
        panic!("boom");
        #[allow(unreachable_code)]
        Ok::<Response<Body>, Infallible>(Response::new(Body::empty()))
    }));
    let joined = tokio::spawn(svc.oneshot(start_request(Some("acme"), AUGUST))).await;
    assert!(joined.unwrap_err().is_panic());
    let svc = layer(&store).layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    // Eventually (the failure is recorded in the background) a new start creates a new job.
    let mut created = false;
    for _ in 0..100 {
        let (_, json) = answer(
            svc.clone()
                .oneshot(start_request(Some("acme"), AUGUST))
                .await
                .unwrap(),
        )
        .await;
        if json["created"].as_bool() == Some(true) {
            created = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        created,
        "the panicked job was failed and did not block the key"
    );
}

async fn spawned_worker_outcome(
    work: impl FnOnce(
            Lease,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Bytes, String>> + Send>>
        + Send
        + 'static,
) -> (JobStatus, Option<String>, Option<String>) {
    let store = MemoryJobStore::new();
    let work = Arc::new(std::sync::Mutex::new(Some(work)));
    let handles = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (w, h) = (work.clone(), handles.clone());
    let svc = layer(&store).layer(service_fn(move |req: Request<Body>| {
        let lease = req.extensions().get::<Lease>().unwrap().clone();
        let work = w.lock().unwrap().take().unwrap();
        h.lock().unwrap().push(lease.spawn_worker(work));
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    }));
    let (_, json) = answer(
        svc.oneshot(start_request(Some("acme"), AUGUST))
            .await
            .unwrap(),
    )
    .await;
    let handle = handles.lock().unwrap().pop().unwrap();
    tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .unwrap()
        .unwrap();
    let job = store
        .job("acme", json["job_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    (job.status, job.error_code, job.artifact_id)
}

#[tokio::test]
async fn spawn_worker_finalizes_fails_or_records_a_panic() {
    let (status, _, artifact) = spawned_worker_outcome(|lease| {
        Box::pin(async move {
            lease
                .append(0, "part 1 ")
                .await
                .map_err(|e| e.to_string())?;
            lease.append(1, "part 2").await.map_err(|e| e.to_string())?;
            Ok(Bytes::from_static(b"part 1 part 2"))
        })
    })
    .await;
    assert_eq!(status, JobStatus::Complete);
    assert!(artifact.is_some());

    let (status, code, _) =
        spawned_worker_outcome(|_lease| Box::pin(async { Err("provider_5xx".to_owned()) })).await;
    assert_eq!(
        (status, code.as_deref()),
        (JobStatus::Failed, Some("provider_5xx"))
    );

    let (status, code, _) = spawned_worker_outcome(|_lease| {
        Box::pin(async {
            panic!("model crashed");
        })
    })
    .await;
    assert_eq!(
        (status, code.as_deref()),
        (JobStatus::Failed, Some("worker_panicked"))
    );
}

#[tokio::test]
async fn a_worker_whose_job_ended_elsewhere_is_cancelled_and_writes_nothing() {
    let store = MemoryJobStore::builder()
        .with_lease(Duration::from_millis(300))
        .build();
    let wrote = Arc::new(AtomicUsize::new(0));
    let starter_lease = Arc::new(std::sync::Mutex::new(None::<Lease>));
    let worker = Arc::new(std::sync::Mutex::new(None));
    let (flag, keep, keep_worker) = (wrote.clone(), starter_lease.clone(), worker.clone());
    let svc = layer(&store).layer(service_fn(move |req: Request<Body>| {
        let lease = req.extensions().get::<Lease>().unwrap().clone();
        *keep.lock().unwrap() = Some(lease.clone());
        let flag = flag.clone();
        *keep_worker.lock().unwrap() = Some(lease.spawn_worker(move |_lease| async move {
            // Stuck far longer than the lease; its heartbeat loop must notice the job ended.
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.fetch_add(1, Ordering::SeqCst);
            Ok(Bytes::from_static(b"stale"))
        }));
        async { Ok::<_, Infallible>(Response::new(Body::empty())) }
    }));
    let (_, json) = answer(
        svc.oneshot(start_request(Some("acme"), AUGUST))
            .await
            .unwrap(),
    )
    .await;
    let job_id = json["job_id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        store.acquire(&job_id, "other").await.unwrap().is_none(),
        "a live, heartbeated lease is not handed over"
    );
    let lease = starter_lease.lock().unwrap().clone().unwrap();
    lease.fail("operator_cancelled").await.unwrap();
    let handle = worker.lock().unwrap().take().unwrap();
    // The work sleeps 5 s; a worker that ends within 3 s was cancelled by its heartbeat loop.
    tokio::time::timeout(Duration::from_secs(3), handle)
        .await
        .expect("the worker stopped once its job ended")
        .unwrap();
    assert_eq!(wrote.load(Ordering::SeqCst), 0, "the work was cancelled");
    assert_eq!(
        job_status(&store, "acme", &job_id).await,
        (JobStatus::Failed, Some("operator_cancelled".into()))
    );
}

/// The layer starts jobs for POST only: on `get(read).post(start)`, a GET or
/// HEAD reaches its handler without a lease and starts nothing.
#[tokio::test]
async fn get_and_head_never_start_jobs() {
    use axum::routing::get;
    use axum::Router;
    let store = MemoryJobStore::new();
    let started = Arc::new(AtomicUsize::new(0));
    let handler = {
        let started = started.clone();
        move |lease: Option<axum::Extension<Lease>>| {
            let started = started.clone();
            async move {
                if lease.is_some() {
                    started.fetch_add(1, Ordering::SeqCst);
                }
                StatusCode::OK
            }
        }
    };
    let app = Router::new().route(
        "/reports/start",
        get(handler.clone()).post(handler).layer(layer(&store)),
    );
    for method in [http::Method::GET, http::Method::HEAD] {
        let mut req = start_request(Some("acme"), AUGUST);
        *req.method_mut() = method.clone();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{method}");
        assert!(!res.headers().contains_key("location"), "{method}");
    }
    assert_eq!(started.load(Ordering::SeqCst), 0);
    let res = app
        .clone()
        .oneshot(start_request(Some("acme"), AUGUST))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED);
    assert_eq!(started.load(Ordering::SeqCst), 1);
}
