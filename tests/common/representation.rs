//! The headers that describe a recorded body's bytes are replayed with them,
//! as a scenario any store runs: a handler (or a gateway passing an
//! upstream's answer on) that answers gzip bytes with `Content-Encoding: gzip`
//! must be replayed with that header, or the retrying client cannot read the
//! answer it paid for.
#![allow(dead_code)]

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http::header::{CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_TYPE, LOCATION};
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tower::{Layer, ServiceExt};
use tower_idempotency::idempotency::IDEMPOTENT_REPLAYED;
use tower_idempotency::{store::Store, IdempotencyLayer, Scope};

const ORDER: &[u8] = br#"{"id":"ord_1","amount":1200,"currency":"EUR"}"#;

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::new(6));
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

fn request(key: &str) -> Request<Full<Bytes>> {
    let mut request = Request::post("/v1/orders")
        .header("idempotency-key", key)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(br#"{"sku":"A","qty":1}"#)))
        .unwrap();
    request
        .extensions_mut()
        .insert(Scope::new("representation"));
    request
}

/// A key no other run of this scenario uses, on a store that may outlive it.
fn unique_key(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{nanos}-{n}", std::process::id())
}

/// For the default allow-list and for one naming neither `content-type` nor
/// `content-encoding`: the first answer and its replay carry the same gzip
/// bytes, the same `content-encoding`, `content-type` and `content-language`,
/// and the handler ran once.
pub async fn a_gzip_answer_replays_with_its_content_encoding<S: Store + Clone>(store: S) {
    let allow_lists: [Option<Vec<HeaderName>>; 2] = [None, Some(vec![LOCATION])];
    for allow_list in allow_lists {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let handler = tower::service_fn(move |_req: Request<Full<Bytes>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let response = Response::builder()
                    .status(StatusCode::CREATED)
                    .header(CONTENT_TYPE, "application/json")
                    .header(CONTENT_ENCODING, "gzip")
                    .header(CONTENT_LANGUAGE, "fr")
                    .header(LOCATION, "/v1/orders/ord_1")
                    .body(Full::new(Bytes::from(gzip(ORDER))))
                    .unwrap();
                Ok::<_, Infallible>(response)
            }
        });
        let mut layer = IdempotencyLayer::new(store.clone());
        if let Some(list) = &allow_list {
            layer = layer.with_replayed_headers(list.clone());
        }
        let service = layer.layer(handler);
        let key = unique_key("gzip");

        let first = service.clone().oneshot(request(&key)).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        let first_headers = first.headers().clone();
        let first_body = first.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(gunzip(&first_body), ORDER);

        let replay = service.clone().oneshot(request(&key)).await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        let replay_headers = replay.headers().clone();
        let replay_body = replay.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(replay_body, first_body, "the same bytes ({allow_list:?})");
        for name in [CONTENT_ENCODING, CONTENT_TYPE, CONTENT_LANGUAGE] {
            let values: Vec<_> = replay_headers.get_all(&name).iter().collect();
            assert_eq!(
                values,
                first_headers.get_all(&name).iter().collect::<Vec<_>>(),
                "{name} describes the replayed bytes ({allow_list:?})"
            );
        }
        assert_eq!(gunzip(&replay_body), ORDER, "the retry can read it");
        // The allow-list still governs the rest.
        assert_eq!(replay_headers[LOCATION], "/v1/orders/ord_1");
    }
}
