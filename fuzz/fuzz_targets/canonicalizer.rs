//! `canonicalize_json` on arbitrary bytes: never panics; when it succeeds the
//! output is valid JSON holding exactly the input's values (numbers compared as
//! their literal text, so no respelling of a number can hide), canonicalising
//! it again changes nothing, it equals an independent canonical writer's text
//! for the independently parsed input, and the request fingerprint of the input
//! equals that of the output. When it fails, the fingerprint is the one of the
//! raw bytes, and the independent parser refuses the input too.
#![no_main]

#[path = "../../tests/common/exact_json.rs"]
mod exact_json;

use http::{HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use tower_idempotency::fingerprint::canonicalize_json;
use tower_idempotency::{IdempotencyKey, fingerprint::Fingerprint};

/// serde_json's nesting limit (127 levels), which the crate keeps.
const MAX_DEPTH: usize = 127;

/// Whether `json` has a whitespace byte outside its string literals.
fn whitespace_outside_strings(json: &[u8]) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            return true;
        }
    }
    false
}

fuzz_target!(|data: &[u8]| {
    let key = IdempotencyKey::parse(b"fuzz-key-0001").unwrap();
    let json = HeaderValue::from_static("application/json");
    let text = HeaderValue::from_static("text/plain");
    let fp = |ct: &HeaderValue, body: &[u8]| {
        Fingerprint::compute(&Method::POST, "/v1/orders", &key, "tenant", Some(ct), body)
    };
    let model = exact_json::parse(data, MAX_DEPTH);
    match canonicalize_json(data) {
        Ok(out) => {
            let again = canonicalize_json(&out).expect("canonical output canonicalises");
            assert_eq!(again, out, "canonicalisation is idempotent");
            let model = model.expect("accepted input is JSON to the independent parser");
            assert_eq!(
                exact_json::parse(&out, MAX_DEPTH).as_ref(),
                Some(&model),
                "the canonical text holds exactly the input's values"
            );
            assert_eq!(
                std::str::from_utf8(&out).expect("canonical output is UTF-8"),
                exact_json::canonical(&model),
                "differs from the independent canonical writer"
            );
            assert!(
                !whitespace_outside_strings(&out),
                "insignificant whitespace in {out:?}"
            );
            assert_eq!(
                fp(&json, data),
                fp(&json, &out),
                "fingerprint of the canonical form"
            );
        }
        Err(_) => {
            assert!(
                model.is_none(),
                "refused JSON the independent parser accepts"
            );
            assert_eq!(
                fp(&json, data),
                fp(&text, data),
                "raw bytes when not canonical"
            );
        }
    }
});

