//! `canonicalize_json` on arbitrary bytes: never panics; when it succeeds the
//! output is valid JSON with the same value, canonicalising it again changes
//! nothing, it equals an independent serialisation of the parsed value (keys
//! sorted by UTF-16 code units, minimal escapes, no whitespace), and the
//! request fingerprint of the input equals that of the output. When it fails,
//! the fingerprint is the one of the raw bytes.
#![no_main]

use http::{HeaderValue, Method};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower_idempotency::fingerprint::canonicalize_json;
use tower_idempotency::{Fingerprint, IdempotencyKey};

/// The same value with every number as a double (canonical numbers are doubles).
fn as_doubles(value: Value) -> Value {
    match value {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(as_doubles).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, as_doubles(v))).collect())
        }
        other => other,
    }
}

/// JCS of a parsed value, written independently of the crate (numbers aside:
/// a lone number goes through `canonicalize_json`, whose number form the RFC
/// vectors and property tests check).
fn reference(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let text = n.to_string();
            let canonical = canonicalize_json(text.as_bytes()).expect("a number canonicalises");
            out.push_str(std::str::from_utf8(&canonical).unwrap());
        }
        Value::String(s) => escape(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reference(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                escape(k, out);
                out.push(':');
                reference(v, out);
            }
            out.push('}');
        }
    }
}

fn escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

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
    match canonicalize_json(data) {
        Ok(out) => {
            let again = canonicalize_json(&out).expect("canonical output canonicalises");
            assert_eq!(again, out, "canonicalisation is idempotent");
            let parsed_out: Value = serde_json::from_slice(&out).expect("output is JSON");
            let parsed_in: Value = serde_json::from_slice(data).expect("accepted input is JSON");
            let mut expected = String::new();
            reference(&parsed_in, &mut expected);
            assert_eq!(
                std::str::from_utf8(&out).expect("canonical output is UTF-8"),
                expected,
                "differs from the reference serialisation"
            );
            assert_eq!(as_doubles(parsed_in), as_doubles(parsed_out), "same value");
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
            assert_eq!(
                fp(&json, data),
                fp(&text, data),
                "raw bytes when not canonical"
            );
        }
    }
});
