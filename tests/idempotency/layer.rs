//! `IdempotencyLayer` in process, through `tower::ServiceExt::oneshot`: the
//! answers it gives — refusals, methods, replays, fingerprints, scopes, cache
//! policy, store failure, error formats. Release paths, body limits and
//! concurrency are in `layer_failures.rs`.
//!
//! Test names state the rule they defend (docs/security.md lists them by threat).
//! Every refusal is checked by `Reply::assert_refusal`: status, content type
//! `application/json`, a `code` and a non-empty `message`.

use tower_idempotency_tests::oneshot;

use oneshot::*;

use axum::body::Body;
use http::header::{CONTENT_TYPE, ETAG, LINK, LOCATION, RETRY_AFTER, SET_COOKIE};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroUsize;
use std::time::Duration;
use tower::{Layer, Service};
use tower_idempotency::idempotency::IDEMPOTENT_REPLAYED;
use tower_idempotency::{
    ErrorFormat, IdempotencyLayer, KeyCodes, KeyReuseStatus, MemoryStore, RecordPolicy,
    RecordSuccess, Refusal, Scope, ScopeExtractor,
};

const KEY: &str = "order-7f3a9c2e";
const ORDER: &str = r#"{"sku":"A-1","qty":2,"ship":{"city":"Lyon","zip":"69001"}}"#;

/// `201 {"order":N}` (N = the run), or the status named by an `x-status` request header.
async fn order(req: Request<Body>, run: usize) -> Result<Response<Body>, Infallible> {
    let status = req
        .headers()
        .get("x-status")
        .map_or(201, |v| v.to_str().unwrap().parse::<u16>().unwrap());
    Ok(Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(format!(r#"{{"order":{run}}}"#)))
        .unwrap())
}

/// `layer` over the `order` handler.
fn orders<E: ScopeExtractor, P: RecordPolicy>(
    layer: IdempotencyLayer<E, P>,
) -> (
    impl Service<
            Request<Body>,
            Response = Answer,
            Error = Infallible,
            Future = impl Future<Output = Result<Answer, Infallible>> + Send,
        > + Clone,
    Runs,
) {
    let runs = Runs::default();
    (layer.layer(handler(&runs, order)), runs)
}

fn default_orders() -> (
    impl Service<
            Request<Body>,
            Response = Answer,
            Error = Infallible,
            Future = impl Future<Output = Result<Answer, Infallible>> + Send,
        > + Clone,
    Runs,
) {
    orders(IdempotencyLayer::new(MemoryStore::new()))
}

/// A request by `merchant_1` (its auth layer inserted the `Scope`), JSON body.
fn request(method: Method, uri: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header(CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    let mut req = builder.body(Body::from(body.to_owned())).unwrap();
    req.extensions_mut().insert(Scope::new("merchant_1"));
    req
}

fn post(key: Option<&str>, body: &str) -> Request<Body> {
    request(Method::POST, "/v1/orders", key, body)
}

fn with_scope(mut req: Request<Body>, scope: &str) -> Request<Body> {
    req.extensions_mut().insert(Scope::new(scope));
    req
}

fn unscoped(mut req: Request<Body>) -> Request<Body> {
    req.extensions_mut().remove::<Scope>();
    req
}

// Status mapping: the key header.

/// Every way a key header can be wrong, with the `reason` it is refused with.
fn bad_key_headers(too_long: &str) -> Vec<(&'static str, Vec<&[u8]>, &'static str)> {
    let (required, invalid, repeated) = ("missing", "invalid", "repeated");
    vec![
        ("missing", vec![], required),
        ("empty", vec![b""], invalid),
        ("space", vec![b"order 7f3a9c2e"], invalid),
        ("7 bytes", vec![b"1234567"], invalid),
        ("129 bytes", vec![too_long.as_bytes()], invalid),
        (
            "non-ASCII",
            vec!["order-\u{e9}7f3a9c2e".as_bytes()],
            invalid,
        ),
        ("non-UTF-8", vec![b"order-\xff7f3a9c2e"], invalid),
        // Tab is the only control byte a `HeaderValue` admits.
        ("control byte", vec![b"order-7f3a\t9c2e"], invalid),
        (
            "two headers",
            vec![KEY.as_bytes(), KEY.as_bytes()],
            repeated,
        ),
        (
            "comma list",
            vec![b"order-7f3a9c2e, order-8b1d0f4a"],
            repeated,
        ),
        (
            "comma list, no space",
            vec![b"order-7f3a9c2e,order-8b1d0f4a"],
            repeated,
        ),
        ("unterminated sf-string", vec![b"\"order-7f3a9c2e"], invalid),
        ("sf-string of 7", vec![b"\"1234567\""], invalid),
        (
            "sf-string with escape",
            vec![b"\"order-\\\"7f3a9c2e\""],
            invalid,
        ),
    ]
}

fn bad_key_request(values: &[&[u8]]) -> Request<Body> {
    let mut req = post(None, ORDER);
    for value in values {
        let value = HeaderValue::from_bytes(value).unwrap();
        req.headers_mut().append("idempotency-key", value);
    }
    req
}

/// The key contract's one code for every key problem, the problem in `reason`.
#[tokio::test]
async fn missing_empty_malformed_or_repeated_key_is_400_and_never_runs() {
    let (svc, runs) = default_orders();
    let too_long = "a".repeat(129);
    for (case, values, reason) in bad_key_headers(&too_long) {
        let reply = send(&svc, bad_key_request(&values)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{case}");
        reply.assert_refusal(StatusCode::BAD_REQUEST, "idempotency_key_required");
        assert_eq!(reply.json()["reason"], reason, "{case}");
    }
    assert_eq!(runs.get(), 0, "no refused request reached the handler");

    // The bounds themselves are accepted: 8 and 128 bytes, every allowed symbol.
    for (i, key) in ["12345678".to_owned(), "a".repeat(128), "A.b_C-9.z".into()]
        .iter()
        .enumerate()
    {
        send(&svc, post(Some(key), ORDER))
            .await
            .assert_order(i + 1, false);
    }
}

/// `KeyCodes::Distinct`: a code per key problem; problem details: a `type`
/// per key problem, whichever codes are sent.
#[tokio::test]
async fn key_problems_have_distinct_codes_on_request_and_distinct_problem_types() {
    let too_long = "a".repeat(129);
    let (distinct, runs) =
        orders(IdempotencyLayer::new(MemoryStore::new()).with_key_codes(KeyCodes::Distinct));
    let (problems, _) =
        orders(IdempotencyLayer::new(MemoryStore::new()).with_error_format(ErrorFormat::Problem));
    for (case, values, reason) in bad_key_headers(&too_long) {
        let code = match reason {
            "missing" => "idempotency_key_required",
            "invalid" => "idempotency_key_invalid",
            _ => "idempotency_key_repeated",
        };
        let reply = send(&distinct, bad_key_request(&values)).await;
        reply.assert_refusal(StatusCode::BAD_REQUEST, code);
        assert_eq!(reply.json()["reason"], reason, "{case}");

        let problem = send(&problems, bad_key_request(&values)).await.json();
        assert_eq!(problem["code"], "idempotency_key_required", "{case}");
        assert_eq!(problem["reason"], reason, "{case}");
        let variant = match reason {
            "missing" => Refusal::KeyRequired,
            "invalid" => Refusal::KeyInvalid,
            _ => Refusal::KeyRepeated,
        };
        assert_eq!(problem["type"], variant.problem_type(), "{case}");
        assert!(problem["type"]
            .as_str()
            .unwrap()
            .ends_with(&format!("#variant.{variant:?}")));
    }
    assert_eq!(runs.get(), 0);
}

#[tokio::test]
async fn sf_string_key_is_the_same_record_as_its_token_form() {
    let (svc, runs) = default_orders();
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    let quoted = format!("\"{KEY}\"");
    send(&svc, post(Some(&quoted), ORDER))
        .await
        .assert_order(1, true);
    // And the other way round, on a fresh key.
    send(&svc, post(Some("\"order-quoted-1\""), ORDER))
        .await
        .assert_order(2, false);
    send(&svc, post(Some("order-quoted-1"), ORDER))
        .await
        .assert_order(2, true);
    assert_eq!(runs.get(), 2);
}

#[tokio::test]
async fn scope_comes_from_authentication_no_scope_is_401_before_the_key_is_checked() {
    let (svc, runs) = default_orders();
    for req in [
        unscoped(post(Some(KEY), ORDER)),
        unscoped(post(None, ORDER)),
        unscoped(post(Some("bad key"), ORDER)),
        with_scope(post(Some(KEY), ORDER), ""),
    ] {
        send(&svc, req)
            .await
            .assert_refusal(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    assert_eq!(runs.get(), 0);
    // Nothing was claimed by the refused requests.
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
}

#[tokio::test]
async fn custom_key_header_name_replaces_idempotency_key() {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_header_name(HeaderName::from_static("x-request-key"));
    let (svc, runs) = orders(layer);
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_refusal(StatusCode::BAD_REQUEST, "idempotency_key_required");
    let custom = || with_header(post(None, ORDER), "x-request-key", KEY);
    send(&svc, custom()).await.assert_order(1, false);
    send(&svc, custom()).await.assert_order(1, true);
    assert_eq!(runs.get(), 1);
}

// Methods.

#[tokio::test]
async fn get_put_delete_pass_through_untouched_by_default() {
    let (svc, runs) = default_orders();
    let mut expected = 0;
    for method in [Method::GET, Method::PUT, Method::DELETE] {
        // With a key (twice) and with neither key nor scope: the handler runs each time.
        for req in [
            request(method.clone(), "/v1/orders", Some(KEY), ORDER),
            request(method.clone(), "/v1/orders", Some(KEY), ORDER),
            unscoped(request(method.clone(), "/v1/orders", None, ORDER)),
        ] {
            expected += 1;
            send(&svc, req).await.assert_order(expected, false);
        }
    }
    assert_eq!(runs.get(), 9);
}

#[tokio::test]
async fn with_methods_chooses_the_guarded_methods() {
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_methods([Method::PUT]);
    let (svc, runs) = orders(layer);
    let put = |key| request(Method::PUT, "/v1/orders/1", key, ORDER);
    send(&svc, put(None))
        .await
        .assert_refusal(StatusCode::BAD_REQUEST, "idempotency_key_required");
    send(&svc, put(Some(KEY))).await.assert_order(1, false);
    send(&svc, put(Some(KEY))).await.assert_order(1, true);
    // POST is no longer guarded: no key needed, never replayed.
    send(&svc, post(None, ORDER)).await.assert_order(2, false);
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(3, false);
    assert_eq!(runs.get(), 3);
}

// Replay.

/// `201` with allow-listed headers (two `link` values) and two that must not replay.
async fn rich(_req: Request<Body>, run: usize) -> Result<Response<Body>, Infallible> {
    Ok(Response::builder()
        .status(StatusCode::CREATED)
        .header(CONTENT_TYPE, "application/vnd.acme.order+json")
        .header(LOCATION, format!("/v1/orders/ord_{run}"))
        .header(ETAG, format!("\"v{run}\""))
        .header(LINK, "</v1/orders/ord_0>; rel=\"prev\"")
        .header(LINK, "</v1/orders?page=2>; rel=\"next\"")
        .header("x-request-id", format!("req-{run}"))
        .header(SET_COOKIE, format!("session=s{run}; HttpOnly"))
        .body(Body::from(format!(r#"{{"id":"ord_{run}"}}"#)))
        .unwrap())
}

#[tokio::test]
async fn replay_stored_status_and_allow_listed_headers_exactly_never_cookies() {
    let runs = Runs::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(handler(&runs, rich));
    let first = send(&svc, post(Some(KEY), ORDER)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        !first.replayed(),
        "the original answer is not marked replayed"
    );
    // The original answer keeps every header the handler set.
    assert_eq!(first.headers["x-request-id"], "req-1");
    assert_eq!(first.headers[SET_COOKIE], "session=s1; HttpOnly");

    let replay = send(&svc, post(Some(KEY), ORDER)).await;
    assert_eq!(runs.get(), 1, "the handler ran once");
    assert_eq!(
        replay.status,
        StatusCode::CREATED,
        "201 is replayed as 201, not 200"
    );
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.headers[IDEMPOTENT_REPLAYED], "true");
    for name in [CONTENT_TYPE, LOCATION, ETAG] {
        assert_eq!(replay.headers.get_all(&name).iter().count(), 1, "{name}");
        assert_eq!(replay.headers[&name], first.headers[&name], "{name}");
    }
    let links: Vec<_> = replay.headers.get_all(LINK).iter().collect();
    assert_eq!(
        links,
        [
            "</v1/orders/ord_0>; rel=\"prev\"",
            "</v1/orders?page=2>; rel=\"next\""
        ],
        "every link value, in order"
    );
    assert!(replay.headers.get(SET_COOKIE).is_none(), "{replay:?}");
    assert!(replay.headers.get("x-request-id").is_none(), "{replay:?}");
}

#[tokio::test]
async fn replay_from_an_allow_list_never_cookies_even_when_listed() {
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_replayed_headers([
        SET_COOKIE,
        CONTENT_TYPE,
        HeaderName::from_static("x-request-id"),
    ]);
    let svc = layer.layer(handler(&runs, rich));
    let first = send(&svc, post(Some(KEY), ORDER)).await;
    assert_eq!(first.headers[SET_COOKIE], "session=s1; HttpOnly");
    let replay = send(&svc, post(Some(KEY), ORDER)).await;
    assert!(replay.replayed());
    assert_eq!(runs.get(), 1);
    assert_eq!(
        replay.headers["x-request-id"], "req-1",
        "the custom list applies"
    );
    assert_eq!(
        replay.headers[CONTENT_TYPE],
        "application/vnd.acme.order+json"
    );
    assert!(replay.headers.get(LOCATION).is_none(), "no longer listed");
    assert!(replay.headers.get(SET_COOKIE).is_none(), "{replay:?}");
}

// Fingerprint.

#[tokio::test]
async fn json_is_canonicalised_per_rfc8785_recursively_key_order_and_whitespace_ignored() {
    let (svc, runs) = default_orders();
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    let reordered = "{ \"ship\" : {\"zip\": \"69001\",\n \"city\":\"Lyon\"},\n\t\"qty\": 2,  \"sku\": \"A-1\" }";
    send(&svc, post(Some(KEY), reordered))
        .await
        .assert_order(1, true);
    let charset = with_header(
        post(Some(KEY), reordered),
        "content-type",
        "application/json; charset=utf-8",
    );
    send(&svc, charset).await.assert_order(1, true);
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn key_reuse_with_a_changed_value_is_409_and_the_record_is_kept() {
    let (svc, runs) = default_orders();
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    let changed_qty = ORDER.replace(r#""qty":2"#, r#""qty":3"#);
    let changed_deep = ORDER.replace("Lyon", "Paris");
    for body in [&changed_qty, &changed_deep, "{}", ""] {
        send(&svc, post(Some(KEY), body))
            .await
            .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    }
    // The refusals did not overwrite the record.
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, true);
    assert_eq!(runs.get(), 1);
}

/// A number is its literal: `2.0` is refused by a handler reading `qty` as an
/// integer, so it is another request, not a replay of `2`.
#[tokio::test]
async fn key_reuse_with_a_respelled_number_is_409_and_the_handler_ran_once() {
    let (svc, runs) = default_orders();
    send(&svc, post(Some(KEY), r#"{"qty":2}"#))
        .await
        .assert_order(1, false);
    send(&svc, post(Some(KEY), r#"{"qty":2.0}"#))
        .await
        .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    // Key order and whitespace still do not count.
    send(&svc, post(Some(KEY), "{ \"qty\" : 2 }"))
        .await
        .assert_order(1, true);
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn key_reuse_on_another_path_query_or_method_is_409() {
    let (svc, runs) = default_orders();
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    for req in [
        request(Method::POST, "/v1/orders?coupon=X", Some(KEY), ORDER),
        request(Method::POST, "/v1/refunds", Some(KEY), ORDER),
        request(Method::PATCH, "/v1/orders", Some(KEY), ORDER),
    ] {
        send(&svc, req)
            .await
            .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    }
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn key_reuse_status_can_be_422_as_the_ietf_draft_says() {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_key_reuse_status(KeyReuseStatus::UnprocessableEntity);
    let (svc, runs) = orders(layer);
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    send(&svc, post(Some(KEY), r#"{"sku":"B-2"}"#))
        .await
        .assert_refusal(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reuse");
    assert_eq!(runs.get(), 1);
}

#[tokio::test]
async fn the_body_is_always_part_of_the_fingerprint_raw_bytes_when_not_json() {
    let (svc, runs) = default_orders();
    let text = |key, body| with_header(post(Some(key), body), "content-type", "text/plain");
    send(&svc, text(KEY, r#"{"a":1,"b":2}"#))
        .await
        .assert_order(1, false);
    send(&svc, text(KEY, r#"{"a":1,"b":2}"#))
        .await
        .assert_order(1, true);
    send(&svc, text(KEY, r#"{"b":2,"a":1}"#))
        .await
        .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    send(&svc, text(KEY, r#"{"a":1, "b":2}"#))
        .await
        .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    // No content type at all: still the bytes.
    let mut bare = post(Some("order-bare-0001"), "hello");
    bare.headers_mut().remove(CONTENT_TYPE);
    send(&svc, bare).await.assert_order(2, false);
    let mut other = post(Some("order-bare-0001"), "hellO");
    other.headers_mut().remove(CONTENT_TYPE);
    send(&svc, other)
        .await
        .assert_refusal(StatusCode::CONFLICT, "idempotency_key_reuse");
    assert_eq!(runs.get(), 2);
}

// Scope.

#[tokio::test]
async fn uniqueness_is_scope_and_key_no_cross_tenant_replay() {
    let (svc, runs) = default_orders();
    let as_merchant = |scope| with_scope(post(Some(KEY), ORDER), scope);
    send(&svc, as_merchant("merchant_1"))
        .await
        .assert_order(1, false);
    send(&svc, as_merchant("merchant_2"))
        .await
        .assert_order(2, false);
    assert_eq!(runs.get(), 2, "both tenants' requests ran");
    send(&svc, as_merchant("merchant_2"))
        .await
        .assert_order(2, true);
    send(&svc, as_merchant("merchant_1"))
        .await
        .assert_order(1, true);
    assert_eq!(runs.get(), 2);
}

// Record policy.

#[tokio::test]
async fn cache_only_what_the_policy_says_201_by_default_everything_else_frees_the_key() {
    let (svc, runs) = default_orders();
    let mut run = 0;
    for status in [200, 202, 400, 409, 500, 503] {
        let key = format!("order-status-{status}");
        let answering = || with_header(post(Some(&key), ORDER), "x-status", &status.to_string());
        for _ in 0..2 {
            run += 1;
            let reply = send(&svc, answering()).await;
            assert_eq!(reply.status.as_u16(), status);
            assert_eq!(reply.text(), format!(r#"{{"order":{run}}}"#));
            assert!(!reply.replayed(), "{status} must not be replayed");
        }
        // The key is free: a corrected request runs, and its 201 is recorded.
        run += 1;
        send(&svc, post(Some(&key), ORDER))
            .await
            .assert_order(run, false);
        send(&svc, post(Some(&key), ORDER))
            .await
            .assert_order(run, true);
    }
    assert_eq!(runs.get(), run);
}

#[tokio::test]
async fn cache_success_policy_records_200_but_not_500() {
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_record_policy(RecordSuccess);
    let (svc, runs) = orders(layer);
    let ok = || with_header(post(Some(KEY), ORDER), "x-status", "200");
    let first = send(&svc, ok()).await;
    let replay = send(&svc, ok()).await;
    assert_eq!(
        (first.status, replay.status),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!((first.replayed(), replay.replayed()), (false, true));
    assert_eq!(replay.body, first.body);
    let failing = || with_header(post(Some("order-fails-01"), ORDER), "x-status", "500");
    assert!(!send(&svc, failing()).await.replayed());
    assert!(!send(&svc, failing()).await.replayed());
    assert_eq!(runs.get(), 3);
}

#[tokio::test]
async fn closure_record_policy_decides_what_is_recorded() {
    let accepted_only = |parts: &http::response::Parts| parts.status == StatusCode::ACCEPTED;
    let layer = IdempotencyLayer::new(MemoryStore::new()).with_record_policy(accepted_only);
    let (svc, runs) = orders(layer);
    let accepted = || with_header(post(Some(KEY), ORDER), "x-status", "202");
    assert!(!send(&svc, accepted()).await.replayed());
    let replay = send(&svc, accepted()).await;
    assert_eq!(replay.status, StatusCode::ACCEPTED);
    assert!(replay.replayed());
    // 201 is not what this policy records.
    send(&svc, post(Some("order-created-1"), ORDER))
        .await
        .assert_order(2, false);
    send(&svc, post(Some("order-created-1"), ORDER))
        .await
        .assert_order(3, false);
    assert_eq!(runs.get(), 3);
}

// Store failure and refusal formats.

#[tokio::test]
async fn store_failure_is_503_with_retry_after_and_nothing_runs() {
    // A store with room for one record, filled by a first order: it refuses
    // every new key as full.
    let full = || {
        MemoryStore::builder()
            .with_capacity(NonZeroUsize::MIN)
            .build()
    };
    const FILLER: &str = "order-filler-0001";
    let (svc, runs) = orders(IdempotencyLayer::new(full()));
    send(&svc, post(Some(FILLER), ORDER))
        .await
        .assert_order(1, false);
    let reply = send(&svc, post(Some(KEY), ORDER)).await;
    reply.assert_refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "idempotency_store_unavailable",
    );
    assert_eq!(reply.headers[RETRY_AFTER], "1");
    let layer = IdempotencyLayer::new(full()).with_retry_after(Duration::from_millis(2500));
    let (svc2, runs2) = orders(layer);
    send(&svc2, post(Some(FILLER), ORDER))
        .await
        .assert_order(1, false);
    let reply = send(&svc2, post(Some(KEY), ORDER)).await;
    reply.assert_refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "idempotency_store_unavailable",
    );
    assert_eq!(
        reply.headers[RETRY_AFTER], "3",
        "rounded up to whole seconds"
    );
    assert_eq!(
        runs.get() + runs2.get(),
        2,
        "the handler ran for the fillers only"
    );
}

#[tokio::test]
async fn problem_format_refusals_are_rfc9457_problem_details() {
    let layer = IdempotencyLayer::new(MemoryStore::new())
        .with_error_format(ErrorFormat::Problem)
        .with_key_reuse_status(KeyReuseStatus::UnprocessableEntity);
    let (svc, runs) = orders(layer);
    send(&svc, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    let cases = [
        (
            post(None, ORDER),
            400,
            "Bad Request",
            "idempotency_key_required",
        ),
        (
            unscoped(post(Some(KEY), ORDER)),
            401,
            "Unauthorized",
            "unauthorized",
        ),
        (
            post(Some(KEY), "{}"),
            422,
            "Unprocessable Entity",
            "idempotency_key_reuse",
        ),
    ];
    for (req, status, title, code) in cases {
        let reply = send(&svc, req).await;
        assert_eq!(reply.status.as_u16(), status, "{reply:?}");
        assert_eq!(reply.headers[CONTENT_TYPE], "application/problem+json");
        let problem = reply.json();
        assert!(
            problem["type"].as_str().is_some_and(|t| !t.is_empty()),
            "{problem}"
        );
        assert_eq!(problem["title"], title, "{problem}");
        assert_eq!(problem["status"], status, "{problem}");
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{problem}"
        );
        assert_eq!(problem["code"], code, "{problem}");
    }
    assert_eq!(runs.get(), 1);
}

/// Every refusal carries its typed `Refused` in the response extensions, and
/// one hook shapes every refusal the layer sends: the application's envelope,
/// not a re-parse of the default JSON.
#[tokio::test]
async fn refusals_are_typed_in_extensions_and_shaped_by_one_hook() {
    use bytes::Bytes;
    use tower::ServiceExt;
    use tower_idempotency::{Refusal, Refused};

    let hooked = IdempotencyLayer::new(MemoryStore::new()).with_refusal_response(
        |refused: &Refused, default: Response<Bytes>| {
            let (mut parts, _) = default.into_parts();
            parts.status = StatusCode::IM_A_TEAPOT;
            parts
                .headers
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            Response::from_parts(
                parts,
                Bytes::from(format!("no: {}", refused.refusal.code())),
            )
        },
    );
    let (shaped, runs) = orders(hooked);
    let (plain, _) = default_orders();
    send(&plain, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    send(&shaped, post(Some(KEY), ORDER))
        .await
        .assert_order(1, false);
    let cases = || {
        [
            (unscoped(post(Some(KEY), ORDER)), Refusal::Unauthorized),
            (post(None, ORDER), Refusal::KeyRequired),
            (post(Some(KEY), "{}"), Refusal::KeyReused),
        ]
    };
    // The default answer: JSON, with the typed refusal beside it.
    for (req, refusal) in cases() {
        let res = plain.clone().oneshot(req).await.unwrap();
        let refused = *res.extensions().get::<Refused>().expect("typed refusal");
        assert_eq!((refused.refusal, refused.status), (refusal, res.status()));
        assert_eq!(refused.retry_after, None);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/json");
    }
    // Through the hook: its status and body, the typed refusal still there.
    for (req, refusal) in cases() {
        let res = shaped.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::IM_A_TEAPOT);
        let refused = *res.extensions().get::<Refused>().unwrap();
        assert_eq!(refused.refusal, refusal);
        let body = http_body_util::BodyExt::collect(res.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(body, format!("no: {}", refusal.code()));
    }
    assert_eq!(runs.get(), 1, "no refusal ran the handler");
}

#[test]
fn the_service_hands_back_its_inner_service() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let mut svc = layer.layer(7u32);
    *svc.get_mut() += 1;
    assert_eq!(*svc.get_ref(), 8);
    assert_eq!(svc.into_inner(), 8);
}

#[tokio::test]
async fn a_gzip_answer_replays_with_its_content_encoding_whatever_the_allow_list() {
    tower_idempotency_tests::representation::a_gzip_answer_replays_with_its_content_encoding(
        MemoryStore::new(),
    )
    .await;
}
