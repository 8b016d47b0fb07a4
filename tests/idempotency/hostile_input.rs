//! Hostile input against `IdempotencyLayer` over a `MemoryStore`, one test per
//! attack. Already proven elsewhere, and not repeated here:
//!
//! - a declared `Content-Length` over the limit answers 413 before reading:
//!   `layer_failures::declared_content_length_over_the_limit_is_413_before_reading_the_body`;
//! - a five-chunk trickle past `with_body_timeout` answers 408:
//!   `layer_failures::body_trickling_past_the_body_timeout_is_408`;
//! - 100 000 nested arrays neither overflow the stack nor stop replays:
//!   `layer_failures::json_nested_100000_deep_does_not_overflow_the_stack_and_replays`;
//! - sample malformed keys (é, 0xff, tab, two equal headers, comma lists) are 400:
//!   `layer::missing_empty_malformed_or_repeated_key_is_400_and_never_runs`;
//! - a full store answers 503 at the store level:
//!   `memory_store::capacity_bounds_memory_and_fails_closed_when_full`.
//!
//! Memory is measured with a counting global allocator that counts per thread:
//! the memory tests run on a current-thread runtime, so every allocation of the
//! layer and the store under test is counted, and no other test's.

use tower_idempotency_tests::oneshot;

use oneshot::*;

use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{sleep, Instant};
use tower::{Layer, Service, ServiceExt};
use tower_idempotency::fingerprint::canonicalize_json;
use tower_idempotency::{
    fingerprint::Fingerprint, IdempotencyKey, IdempotencyLayer, MemoryStore, Scope, MAX_KEY_LEN,
};

// ---------------------------------------------------------------------------
// A per-thread counting allocator
// ---------------------------------------------------------------------------

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed on this thread.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    let _ = LIVE.try_with(|live| live.set(live.get() + delta));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Live heap bytes allocated by this thread.
fn live_bytes() -> isize {
    LIVE.with(Cell::get)
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const KEY: &str = "order-7f3a9c2e";
const MIB: usize = 1024 * 1024;

/// `201 {"order":run}`, or the status of an `x-status` request header; the
/// handler also keeps the bytes it received.
#[derive(Clone, Default)]
struct Orders {
    runs: Runs,
    seen: Arc<Mutex<Vec<Bytes>>>,
    /// Keep nothing: for the memory measurements.
    forgetful: bool,
}

impl Orders {
    fn forgetful() -> Self {
        Self {
            forgetful: true,
            ..Self::default()
        }
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
    > + Clone
           + Send
           + 'static {
        let (runs, seen, forgetful) = (self.runs.0.clone(), self.seen.clone(), self.forgetful);
        tower::service_fn(move |req: Request<Body>| {
            let run = runs.fetch_add(1, SeqCst) + 1;
            let seen = seen.clone();
            async move {
                let status = req
                    .headers()
                    .get("x-status")
                    .map_or(201, |v| v.to_str().unwrap().parse::<u16>().unwrap());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                if !forgetful {
                    seen.lock().unwrap().push(body);
                }
                Ok(Response::builder()
                    .status(status)
                    .header(CONTENT_TYPE, "application/json")
                    .body(Body::from(format!(r#"{{"order":{run}}}"#)))
                    .unwrap())
            }
        })
    }
}

fn post_to(key: &str, content_type: &str, body: impl Into<Body>) -> Request<Body> {
    let mut req = Request::post("/v1/orders")
        .header(CONTENT_TYPE, content_type)
        .header("idempotency-key", key)
        .body(body.into())
        .unwrap();
    req.extensions_mut().insert(Scope::new("merchant_1"));
    req
}

fn post(key: &str, body: impl Into<Body>) -> Request<Body> {
    post_to(key, "application/json", body)
}

/// A streamed body (no length) of `total` bytes in `chunk`-byte frames, one
/// frame every `every` (or at once), counting the bytes it was polled for.
struct Counted {
    left: usize,
    chunk: Bytes,
    every: Option<Duration>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    polled: Arc<AtomicUsize>,
}

fn counted(total: usize, chunk: usize, every: Option<Duration>) -> (Body, Arc<AtomicUsize>) {
    let polled = Arc::new(AtomicUsize::new(0));
    let body = Counted {
        left: total,
        chunk: Bytes::from(vec![b'x'; chunk]),
        every,
        pause: None,
        polled: polled.clone(),
    };
    (Body::new(body), polled)
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if let Some(every) = self.every {
            let pause = self.pause.get_or_insert_with(|| Box::pin(sleep(every)));
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pause = None;
        }
        let n = self.chunk.len().min(self.left);
        self.left -= n;
        self.polled.fetch_add(n, SeqCst);
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..n)))))
    }
}

// ---------------------------------------------------------------------------
// Size and time
// ---------------------------------------------------------------------------

#[tokio::test]
async fn ten_megabyte_streamed_body_is_413_after_reading_little_more_than_the_limit() {
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    let (body, polled) = counted(10 * MIB, 64 * 1024, None);
    let req = post(KEY, body);
    assert!(req.headers().get(CONTENT_LENGTH).is_none());
    let before = live_bytes();
    send(&svc, req)
        .await
        .assert_code(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    let polled = polled.load(SeqCst);
    assert!(
        polled <= MIB + 64 * 1024,
        "read {polled} bytes of a 10 MiB body with a 1 MiB limit"
    );
    assert!(
        live_bytes() - before < MIB as isize,
        "nothing of it is kept"
    );
    assert_eq!(orders.runs.get(), 0);
    // The key was never claimed: the same key with a small body runs.
    send(&svc, post(KEY, "{}")).await.assert_order(1, false);
}

#[tokio::test]
async fn ten_megabyte_declared_body_is_413_without_reading_a_byte() {
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    let (body, polled) = counted(10 * MIB, 64 * 1024, None);
    let mut req = post(KEY, body);
    req.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(10 * MIB));
    send(&svc, req)
        .await
        .assert_code(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(polled.load(SeqCst), 0, "refused on the declared length");
    assert_eq!(orders.runs.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_body_trickling_forever_is_cut_at_the_body_timeout() {
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new())
        .with_body_timeout(Duration::from_secs(2))
        .layer(orders.service());
    // One byte every 100 ms, for (virtually) ever: a slowloris under the size limit.
    let (body, polled) = counted(usize::MAX, 1, Some(Duration::from_millis(100)));
    let started = Instant::now();
    send(&svc, post(KEY, body))
        .await
        .assert_code(StatusCode::REQUEST_TIMEOUT, "request_timeout");
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "cut at the timeout"
    );
    assert!(polled.load(SeqCst) <= 20, "{}", polled.load(SeqCst));
    assert_eq!(orders.runs.get(), 0);
    send(&svc, post(KEY, "{}")).await.assert_order(1, false);
}

#[tokio::test(start_paused = true)]
async fn without_a_body_timeout_a_trickle_is_waited_for_so_set_one() {
    // The default has no body timeout: the layer waits as long as the body
    // keeps coming. Bound it with `with_body_timeout` or the server's own read
    // timeout (docs/security.md).
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    let (body, polled) = counted(usize::MAX, 1, Some(Duration::from_secs(1)));
    let pending = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post(KEY, body)).await }
    });
    sleep(Duration::from_secs(3600)).await;
    assert!(!pending.is_finished(), "still reading after an hour");
    assert!(polled.load(SeqCst) >= 3599);
    pending.abort();
    assert_eq!(orders.runs.get(), 0);
}

// ---------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------

#[test]
fn nesting_100000_deep_objects_fingerprint_as_raw_bytes_on_a_small_stack() {
    // serde_json stops at 128 levels, so canonicalisation never recurses deeper,
    // whatever the input: it even fits a 256 KiB thread stack in a debug build.
    let depth = 100_000;
    let objects = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    let mixed = format!("{}{}", r#"[{"a":"#.repeat(depth), "}]".repeat(depth));
    let unclosed = "[".repeat(depth);
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            let key = IdempotencyKey::parse(KEY.as_bytes()).unwrap();
            let json = HeaderValue::from_static("application/json");
            let text = HeaderValue::from_static("text/plain");
            for body in [&objects, &mixed, &unclosed] {
                assert!(canonicalize_json(body.as_bytes()).is_err());
                let fp = |ct| {
                    Fingerprint::compute(
                        &http::Method::POST,
                        "/v1/orders",
                        &key,
                        "merchant_1",
                        Some(ct),
                        body.as_bytes(),
                    )
                };
                assert_eq!(fp(&json), fp(&text), "hashed as raw bytes");
            }
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
}

#[tokio::test]
async fn json_past_the_depth_limit_is_whitespace_sensitive_within_it_is_not() {
    // Find the deepest nesting that is still canonicalised.
    let nested = |depth: usize, gap: &str| {
        format!(
            "{}{gap}1{gap}{}",
            r#"{"a":"#.repeat(depth),
            "}".repeat(depth)
        )
    };
    let limit = (1..1000)
        .take_while(|&d| canonicalize_json(nested(d, "").as_bytes()).is_ok())
        .last()
        .unwrap();
    assert!(
        (100..=128).contains(&limit),
        "canonicalised up to {limit} levels"
    );
    eprintln!("JSON is canonicalised up to {limit} levels of nesting");
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    // At the limit: spacing is insignificant, a retry with other spacing replays.
    send(&svc, post("order-depth-ok", nested(limit, "")))
        .await
        .assert_order(1, false);
    send(&svc, post("order-depth-ok", nested(limit, " \n ")))
        .await
        .assert_order(1, true);
    // One level deeper: raw bytes, so other spacing is another request.
    send(&svc, post("order-depth-raw", nested(limit + 1, "")))
        .await
        .assert_order(2, false);
    send(&svc, post("order-depth-raw", nested(limit + 1, "")))
        .await
        .assert_order(2, true);
    send(&svc, post("order-depth-raw", nested(limit + 1, " ")))
        .await
        .assert_code(StatusCode::CONFLICT, "idempotency_key_reuse");
    assert_eq!(orders.runs.get(), 2);
}

#[tokio::test]
async fn duplicate_json_keys_are_fingerprinted_as_raw_bytes_deterministically() {
    // Decision (docs/idempotency.md, docs/security.md): a body with duplicate
    // keys is not canonicalised (neither first- nor last-wins), so its exact
    // bytes are the request. Handlers disagree on duplicates; the fingerprint
    // never hides a value one of them might read.
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    let (a1_a2, a2_a1) = (r#"{"a":1,"a":2}"#, r#"{"a":2,"a":1}"#);
    assert!(canonicalize_json(a1_a2.as_bytes()).is_err());

    send(&svc, post("order-dup-0001", a1_a2))
        .await
        .assert_order(1, false);
    send(&svc, post("order-dup-0001", a1_a2))
        .await
        .assert_order(1, true);
    // The other order is another request under the same key...
    send(&svc, post("order-dup-0001", a2_a1))
        .await
        .assert_code(StatusCode::CONFLICT, "idempotency_key_reuse");
    // ...and so are other spacing and a last-wins reading of the same body.
    for body in [r#"{"a":1, "a":2}"#, r#"{"a":2}"#] {
        send(&svc, post("order-dup-0001", body))
            .await
            .assert_code(StatusCode::CONFLICT, "idempotency_key_reuse");
    }
    // The other order under its own key replays itself.
    send(&svc, post("order-dup-0002", a2_a1))
        .await
        .assert_order(2, false);
    send(&svc, post("order-dup-0002", a2_a1))
        .await
        .assert_order(2, true);
    // Nested duplicates too.
    let nested = r#"{"x":{"k":true,"k":false}}"#;
    send(&svc, post("order-dup-0003", nested))
        .await
        .assert_order(3, false);
    send(&svc, post("order-dup-0003", nested))
        .await
        .assert_order(3, true);
    assert_eq!(orders.runs.get(), 3);
    let seen = orders.seen.lock().unwrap().clone();
    assert_eq!(seen, [a1_a2, a2_a1, nested], "handlers get the exact bytes");
}

#[tokio::test]
async fn bodies_a_handler_can_tell_apart_are_never_one_request() {
    // Each pair parses, through serde_json into integers or decimals (or as
    // raw text), into values a handler can tell apart, though the IEEE 754
    // doubles RFC 8785 would compare are equal; numbers count as written. The
    // second body under the first one's key is another request (409), never
    // the first one's replay.
    let pairs = [
        (
            r#"{"amount":9007199254740992}"#,
            r#"{"amount":9007199254740993}"#,
        ),
        (
            r#"{"id":12345678901234567890}"#,
            r#"{"id":12345678901234567891}"#,
        ),
        (r#"{"rate":0.1}"#, r#"{"rate":0.10000000000000001}"#),
        (r#"{"x":0}"#, r#"{"x":1e-400}"#),
        (r#"{"x":0}"#, r#"{"x":-0}"#),
        (r#"{"x":0.0}"#, r#"{"x":-0.0}"#),
        (r#"{"qty":2}"#, r#"{"qty":2.0}"#),
        (r#"{"price":1.5}"#, r#"{"price":1.50}"#),
        (
            r#"{"amount":9007199254740993}"#,
            r#"{"amount":90071992547409930e-1}"#,
        ),
        (r#"{"a":1}"#, r#"{"a":1}garbage"#),
        (r#"{"a":1}"#, r#"{"a":1} {"a":1}"#),
    ];
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    for (i, (first, second)) in pairs.iter().enumerate() {
        let key = format!("order-exact-{i:04}");
        send(&svc, post(&key, *first))
            .await
            .assert_order(i + 1, false);
        send(&svc, post(&key, *second))
            .await
            .assert_code(StatusCode::CONFLICT, "idempotency_key_reuse");
        send(&svc, post(&key, *first))
            .await
            .assert_order(i + 1, true);
    }
    assert_eq!(orders.runs.get(), pairs.len());
    // Key order, whitespace and string escapes stay one request.
    for (i, same) in [
        r#"{ "amount": 9007199254740993 }"#,
        r#"{"\u0061mount":9007199254740993}"#,
    ]
    .iter()
    .enumerate()
    {
        let key = format!("order-same-{i:04}");
        send(&svc, post(&key, r#"{"amount":9007199254740993}"#))
            .await
            .assert_order(pairs.len() + i + 1, false);
        send(&svc, post(&key, *same))
            .await
            .assert_order(pairs.len() + i + 1, true);
    }
}

#[tokio::test]
async fn invalid_utf8_and_lone_surrogates_are_fingerprinted_as_raw_bytes() {
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    let cases: [(&str, &[u8], &[u8]); 5] = [
        // (key, body, the same body spelled differently)
        ("order-utf8-0001", b"{\"a\":\"\xff\"}", b"{ \"a\":\"\xff\"}"),
        (
            "order-utf8-0002",
            b"{\"a\":\"\xed\xa0\x80\"}",
            b"{\"a\": \"\xed\xa0\x80\"}",
        ),
        (
            "order-surr-0001",
            br#"{"a":"\ud800"}"#,
            br#"{"a":"\uD800"}"#,
        ),
        (
            "order-surr-0002",
            br#"{"a":"\udc00\ud800"}"#,
            br#"{"a":"\uDC00\ud800"}"#,
        ),
        ("order-surr-0003", br#"{"\udfff":1}"#, br#"{"\udfff": 1}"#),
    ];
    for (i, (key, body, respelled)) in cases.into_iter().enumerate() {
        assert!(canonicalize_json(body).is_err(), "{key}");
        let run = i + 1;
        send(&svc, post(key, Bytes::from_static(body)))
            .await
            .assert_order(run, false);
        send(&svc, post(key, Bytes::from_static(body)))
            .await
            .assert_order(run, true);
        // Raw bytes: a spelling the canonical form would have merged is another request.
        send(&svc, post(key, Bytes::from_static(respelled)))
            .await
            .assert_code(StatusCode::CONFLICT, "idempotency_key_reuse");
    }
    // A valid surrogate pair is an ordinary character: escaped or raw, one request.
    send(&svc, post("order-pair-0001", r#"{"a":"\ud83d\ude00"}"#))
        .await
        .assert_order(6, false);
    send(&svc, post("order-pair-0001", "{\"a\":\"\u{1f600}\"}"))
        .await
        .assert_order(6, true);
    assert_eq!(orders.runs.get(), 6);
}

#[tokio::test]
async fn other_headers_and_the_content_type_are_not_part_of_the_fingerprint() {
    // Only method, path and query, key, scope and body are. The content type
    // chooses how the body is hashed (canonical JSON or raw bytes), so a text
    // body equal to the canonical form of an earlier JSON body is the same
    // request; other headers (Accept, Accept-Language, ...) never count: a
    // retry gets the first answer's representation. docs/security.md.
    let orders = Orders::default();
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(orders.service());
    send(&svc, post(KEY, r#"{ "b": 2, "a": 1 }"#))
        .await
        .assert_order(1, false);
    send(&svc, post_to(KEY, "text/plain", r#"{"a":1,"b":2}"#))
        .await
        .assert_order(1, true);
    let mut other_accept = post(KEY, r#"{"a":1,"b":2}"#);
    other_accept
        .headers_mut()
        .insert("accept", HeaderValue::from_static("application/xml"));
    send(&svc, other_accept).await.assert_order(1, true);
    // But the same text body in its original spelling is not canonicalised.
    send(&svc, post_to(KEY, "text/plain", r#"{ "b": 2, "a": 1 }"#))
        .await
        .assert_code(StatusCode::CONFLICT, "idempotency_key_reuse");
    assert_eq!(orders.runs.get(), 1);
}

/// Regression test for a crash the `canonicalizer` fuzz target (`fuzz/`)
/// found in the single-pass canonicaliser (`src/fingerprint.rs`,
/// `FastCanonical::number`, since fixed): a number whose exponent does not fit
/// an `i32` overflowed `first = exponent + digits - 1`, a panic with overflow
/// checks (debug builds, tests, release builds that enable them) before any
/// claim. It must be refused as not canonicalisable (out of double range) and
/// hashed as raw bytes.
#[test]
fn fuzz_crash_number_with_an_exponent_beyond_i32_is_raw_bytes_not_a_panic() {
    let key = IdempotencyKey::parse(KEY.as_bytes()).unwrap();
    let json = HeaderValue::from_static("application/json");
    let text = HeaderValue::from_static("text/plain");
    for body in [
        &b"1e4007379511"[..],
        b"[1e2147483647]",
        b"{\"a\":-1.5E99999999999}",
        b"[0.1e-99999999999]",
    ] {
        let result = std::panic::catch_unwind(|| canonicalize_json(body));
        let Ok(result) = result else {
            panic!(
                "canonicalize_json panicked on {:?}",
                String::from_utf8_lossy(body)
            );
        };
        let fp = |ct| {
            Fingerprint::compute(
                &http::Method::POST,
                "/v1/orders",
                &key,
                "merchant_1",
                Some(ct),
                body,
            )
        };
        if result.is_err() {
            assert_eq!(fp(&json), fp(&text), "raw bytes");
        }
    }
}

// ---------------------------------------------------------------------------
// The key header
// ---------------------------------------------------------------------------

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

#[tokio::test]
async fn every_byte_outside_the_key_alphabet_is_400_anywhere_in_the_key() {
    let orders = Orders::default();
    let store = MemoryStore::new();
    let svc = IdempotencyLayer::new(store.clone()).layer(orders.service());
    let mut through_layer = 0;
    for b in 0..=255u8 {
        for at in [0, 4, 9] {
            let mut key = b"order-0001".to_vec();
            key.insert(at, b);
            let parsed = IdempotencyKey::parse(&key);
            assert_eq!(parsed.is_some(), is_key_byte(b), "byte {b:#04x} at {at}");
            let mut quoted = b"\"order-0001\"".to_vec();
            quoted.insert(at + 1, b);
            assert_eq!(IdempotencyKey::parse(&quoted).is_some(), is_key_byte(b));
            if is_key_byte(b) {
                continue;
            }
            // Every value an HTTP parser can hand over (not NUL, CR, LF, ...).
            let Ok(value) = HeaderValue::from_bytes(&key) else {
                continue;
            };
            let mut req = post(KEY, "{}");
            req.headers_mut().insert("idempotency-key", value);
            // A comma makes the value a list of keys (RFC 9110, section 5.3).
            let reason = match b {
                b',' => "repeated",
                _ => "invalid",
            };
            let reply = send(&svc, req).await;
            reply.assert_code(StatusCode::BAD_REQUEST, "idempotency_key_required");
            assert_eq!(reply.json()["reason"], reason, "byte {b:#04x} at {at}");
            through_layer += 1;
        }
    }
    // 0x09, 0x20..=0x7e outside the alphabet, and 0x80..=0xff, at three places.
    assert_eq!(through_layer, 3 * (1 + 95 - 65 + 128));
    assert_eq!(orders.runs.get(), 0);
    assert!(store.is_empty(), "nothing was claimed");
    // A 64 KiB key is refused as quickly as a short one.
    let mut req = post(KEY, "{}");
    let huge = "a".repeat(64 * 1024);
    req.headers_mut()
        .insert("idempotency-key", HeaderValue::from_str(&huge).unwrap());
    let reply = send(&svc, req).await;
    reply.assert_code(StatusCode::BAD_REQUEST, "idempotency_key_required");
    assert_eq!(reply.json()["reason"], "invalid");
    assert!(IdempotencyKey::parse(&[b'a'; MAX_KEY_LEN + 1]).is_none());
}

#[tokio::test]
async fn two_idempotency_key_headers_are_400_whatever_their_values() {
    let orders = Orders::default();
    let store = MemoryStore::new();
    let svc = IdempotencyLayer::new(store.clone()).layer(orders.service());
    let pairs: [(&[u8], &[u8]); 6] = [
        (b"order-0001", b"order-0002"),
        (b"order-0002", b"order-0001"),
        (b"order-0001", b""),
        (b"", b"order-0001"),
        (b"order-0001", b"not a key"),
        (b"order-0001", b"\"order-0001\""),
    ];
    for (first, second) in pairs {
        let mut req = post(KEY, "{}");
        req.headers_mut().remove("idempotency-key");
        req.headers_mut()
            .append("idempotency-key", HeaderValue::from_bytes(first).unwrap());
        req.headers_mut()
            .append("idempotency-key", HeaderValue::from_bytes(second).unwrap());
        let reply = send(&svc, req).await;
        reply.assert_code(StatusCode::BAD_REQUEST, "idempotency_key_required");
        assert_eq!(reply.json()["reason"], "repeated");
    }
    assert_eq!(orders.runs.get(), 0);
    assert!(store.is_empty(), "neither value was claimed");
}

// ---------------------------------------------------------------------------
// Many distinct keys: memory bounded by the capacity
// ---------------------------------------------------------------------------

const CAPACITY: usize = 100_000;

fn key_of(i: usize) -> String {
    format!("flood-{i:010}")
}

/// Sends requests for keys `range` (handler status `status`), returning how
/// many answers had each status.
async fn flood<S>(
    svc: &S,
    range: std::ops::Range<usize>,
    status: u16,
) -> std::collections::BTreeMap<u16, usize>
where
    S: Service<Request<Body>, Response = Answer, Error = Infallible> + Clone,
{
    let mut answers = std::collections::BTreeMap::new();
    for i in range {
        let mut req = post(&key_of(i), "{}");
        if status != 201 {
            req.headers_mut()
                .insert("x-status", HeaderValue::from(status));
        }
        let answer = svc.clone().oneshot(req).await.unwrap();
        *answers.entry(answer.status().as_u16()).or_default() += 1;
    }
    answers
}

#[tokio::test(start_paused = true)]
async fn a_million_distinct_keys_memory_stays_bounded_by_the_capacity() {
    let retention = Duration::from_secs(600);
    let store = MemoryStore::builder()
        .with_capacity(NonZeroUsize::new(CAPACITY).unwrap())
        .with_retention(retention)
        // After the retention the key is free: what this test is about.
        .with_tombstone(Duration::ZERO)
        .with_lock_timeout(Duration::from_secs(30))
        .build();
    let orders = Orders::forgetful();
    let svc = IdempotencyLayer::new(store.clone()).layer(orders.service());
    // Warm up (runtime, map shards), then measure from here.
    flood(&svc, 0..1, 201).await;
    let baseline = live_bytes();

    // Fill the store: every key runs once and is recorded.
    let filled = flood(&svc, 1..CAPACITY, 201).await;
    assert_eq!(filled[&201], CAPACITY - 1);
    assert_eq!(store.len(), CAPACITY);
    let full = live_bytes() - baseline;
    let per_record = full / CAPACITY as isize;

    // 900 000 more distinct keys: a clear 503, nothing runs, no memory grows.
    let refused = flood(&svc, CAPACITY..1_000_000, 201).await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[&503], 900_000);
    let mut probe = post(&key_of(1_000_000), "{}");
    probe.headers_mut().remove("x-status");
    send(&svc, probe).await.assert_code(
        StatusCode::SERVICE_UNAVAILABLE,
        "idempotency_store_unavailable",
    );
    assert_eq!(orders.runs.get(), CAPACITY);
    let after_flood = live_bytes() - baseline;
    assert!(
        after_flood <= full + full / 20,
        "memory grew from {full} to {after_flood} bytes while refusing"
    );

    // Existing keys still replay.
    for i in [0, 1, CAPACITY / 2, CAPACITY - 1] {
        send(&svc, post(&key_of(i), "{}"))
            .await
            .assert_order(i + 1, true);
    }

    // Past the retention the old records are evicted as new keys arrive.
    tokio::time::advance(retention + Duration::from_secs(1)).await;
    let second = flood(&svc, 2_000_000..2_000_000 + CAPACITY - 1, 201).await;
    assert_eq!(second[&201], CAPACITY - 1, "{second:?}");
    assert!(store.len() <= CAPACITY, "{}", store.len());
    // An evicted key is free again (a new request), not replayed.
    send(&svc, post(&key_of(CAPACITY / 2), "{}"))
        .await
        .assert_order(2 * CAPACITY, false);
    let after_turnover = live_bytes() - baseline;
    assert!(
        after_turnover <= full + full / 10,
        "memory after a full turnover: {after_turnover} bytes, full store: {full}"
    );
    eprintln!(
        "MemoryStore: {per_record} bytes per record ({full} for {CAPACITY}); \
         after 900k refusals {after_flood}; after turnover {after_turnover}"
    );
}

/// Regression test for a bug this file found (fixed in `src/store/memory.rs`):
/// every claim used to push its lock deadline onto `MemoryStore`'s eviction
/// queue, and `release` removed the record but not that entry (nor the `Arc`s
/// of scope and key it held). An entry left the queue only after the lock
/// timeout, so a flood of distinct keys that the handler answered with
/// something not recorded (a 400, a 422) held about 120 bytes per request for
/// the lock timeout, however small the capacity: 122 MB for one million
/// released claims while the store held no record at all.
#[tokio::test(start_paused = true)]
async fn a_million_released_claims_memory_stays_bounded_by_the_capacity() {
    let store = MemoryStore::builder()
        .with_capacity(NonZeroUsize::new(CAPACITY).unwrap())
        .with_lock_timeout(Duration::from_secs(60))
        .build();
    let orders = Orders::forgetful();
    let svc = IdempotencyLayer::new(store.clone()).layer(orders.service());
    flood(&svc, 0..1, 400).await;
    let baseline = live_bytes();
    let mut peak = 0;
    // A million distinct keys in a minute, each answered 400 by the handler.
    for batch in 0..10 {
        let answers = flood(&svc, 1 + batch * 100_000..1 + (batch + 1) * 100_000, 400).await;
        assert_eq!(answers[&400], 100_000);
        tokio::time::advance(Duration::from_secs(5)).await;
        peak = peak.max(live_bytes() - baseline);
    }
    assert_eq!(store.len(), 0, "every claim was released");
    eprintln!("MemoryStore: {peak} bytes at most while releasing a million claims");
    // The store holds no record: its bookkeeping must stay near empty (it was
    // 122 MB before the fix; a full store of 201 records is ~48 MB).
    let bound = 1024 * 1024;
    assert!(
        peak <= bound,
        "the store holds no record but {peak} bytes (bound {bound}): \
         released claims' lock deadlines are kept until the lock timeout"
    );
}

// ---------------------------------------------------------------------------
// Configuration read from the environment or a file
// ---------------------------------------------------------------------------

/// Strings an operator's environment or a tenant-supplied setting may hold.
fn hostile_strings() -> Vec<String> {
    let mut values: Vec<String> = [
        "",
        " ",
        "\0",
        "\0hidden",
        "{tag}",
        "a{b}c",
        "jobs; DROP TABLE users; --",
        "\"quoted\"",
        "Users{0}",
        "r\u{e9}sum\u{e9}",
        "\u{202e}gnp.exe",
        "\r\nSET x 1",
        "a b",
        "%s%n",
        "../../etc/passwd",
        "\u{ff}",
    ]
    .map(str::to_owned)
    .into();
    values.push("x".repeat(100_000));
    values.push("\u{1F600}".repeat(1_000));
    values
}

/// Every hostile value is an `Err` from the type that validates it, never a
/// panic: table and schema names, Redis prefixes, job kinds, downstream
/// secrets and key reuse statuses. Before, the builders panicked on the
/// first three, and the layer accepted any status.
#[test]
fn hostile_configuration_is_an_err_never_a_panic() {
    use tower_idempotency::downstream::{DownstreamSecret, MIN_SECRET_LEN};
    use tower_idempotency::{ConfigError, KeyReuseStatus};

    for value in hostile_strings() {
        #[cfg(feature = "postgres")]
        {
            use tower_idempotency::store::SqlIdentifier;
            let refused = value.parse::<SqlIdentifier>();
            assert_eq!(refused, Err(ConfigError::SqlIdentifier(value.clone())));
            // The message quotes the name escaped: no control byte reaches a log.
            let shown = refused.unwrap_err().to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
        #[cfg(feature = "redis")]
        {
            use tower_idempotency::store::RedisPrefix;
            let refused = RedisPrefix::try_from(value.as_str());
            assert_eq!(refused, Err(ConfigError::RedisPrefix(value.clone())));
            let shown = refused.unwrap_err().to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
        #[cfg(feature = "leases")]
        {
            // Any non-empty kind is a kind: stores compare it as its own field.
            use tower_idempotency::lease::JobKind;
            match JobKind::try_from(value.clone()) {
                Ok(kind) => assert_eq!(kind.as_str(), value),
                Err(refused) => {
                    assert!(value.is_empty(), "{value:?}");
                    assert_eq!(refused, ConfigError::EmptyJobKind);
                }
            }
        }
        match DownstreamSecret::new(&value) {
            Ok(_) => assert!(value.len() >= MIN_SECRET_LEN),
            Err(refused) => {
                let expected = ConfigError::ShortSecret {
                    len: value.len(),
                    min: MIN_SECRET_LEN,
                };
                assert_eq!(refused, expected);
                // A short secret is still a secret: its length is shown, never its bytes.
                let shown = format!("{refused} {refused:?}");
                assert!(value.len() < 3 || !shown.contains(&value), "{shown}");
            }
        }
    }
    // Only the two statuses the draft allows are a key reuse status.
    for code in 100..=999u16 {
        let status = StatusCode::from_u16(code).unwrap();
        match KeyReuseStatus::try_from(status) {
            Ok(reuse) => assert_eq!(StatusCode::from(reuse), status),
            Err(refused) => {
                assert_eq!(refused, ConfigError::KeyReuseStatus(status));
                assert!(code != 409 && code != 422, "{code}");
            }
        }
    }
    assert!(KeyReuseStatus::try_from(StatusCode::CONFLICT).is_ok());
    assert!(KeyReuseStatus::try_from(StatusCode::UNPROCESSABLE_ENTITY).is_ok());
}
