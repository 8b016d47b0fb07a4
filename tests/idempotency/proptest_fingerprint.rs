//! Property tests of the request fingerprint and its canonical JSON (RFC 8785,
//! numbers kept as written), plus the published JCS test vectors.
//!
//! - Canonicalisation is deterministic and idempotent, and its output is JSON
//!   of the same value.
//! - Any permutation of object keys, any insignificant whitespace, and any
//!   equivalent spelling of a string (escapes) gives the same canonical bytes
//!   and the same fingerprint.
//! - A number is its literal: two bodies share a canonical form exactly when
//!   their numbers are written alike (`tests/common/exact_json.rs` is the
//!   independent model), so `2` is not `2.0`, `1.5` not `1.50`, `-0` not `0`,
//!   `100` not `1e2`, whatever their doubles.
//! - Changing any value, any key, the method, the path, the query, the
//!   idempotency key or the scope changes the fingerprint.
//! - Keys sort by UTF-16 code units and strings use the minimal escapes, checked
//!   against independent implementations written here.
//! - `tests/data/rfc8785/`: the published vectors (arrays, french, structures,
//!   unicode, values, weird) byte for byte, but for their numbers, which keep
//!   their literals; and the RFC's Appendix B numbers, each kept as written.
//!
//! The unit tests in `src/fingerprint/tests.rs` cover the RFC's section 3.2.2
//! and 3.2.3 examples inside the crate; these go through the public API.
//!
//! The seeds of past failures, re-run before any new case, are in
//! `tests/proptest-regressions/proptest_fingerprint.txt`: where proptest
//! looks for this file's, beside the binary's folder (`idempotency/main.rs`).

use tower_idempotency_tests::exact_json;

use http::{HeaderValue, Method};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;
use std::path::Path;
use tower_idempotency::fingerprint::canonicalize_json;
use tower_idempotency::{
    fingerprint::Fingerprint,
    store::{Begin, RecordKey, Store},
    IdempotencyKey, MemoryStore, Scope,
};

// ---------------------------------------------------------------------------
// Strategies and renderers
// ---------------------------------------------------------------------------

/// A JSON value whose numbers are doubles and integers, and whose strings are
/// any Unicode scalar values, control characters included.
fn json_value() -> impl Strategy<Value = Value> {
    let text = prop::collection::vec(any::<char>(), 0..8).prop_map(|c| c.into_iter().collect());
    let safe = -(1i64 << 53) + 1..(1i64 << 53);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        safe.prop_map(|n| Value::Number(n.into())),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Value::Number(Number::from_f64(f).unwrap())),
        text.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text.clone(), inner, 0..6)
                .prop_map(|m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A deterministic stream of choices driven by a proptest-chosen seed.
struct Choices(u64);

impl Choices {
    fn next(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Renders `value` as JSON text with shuffled keys, random insignificant
/// whitespace and random string escapes.
fn render(value: &Value, seed: u64) -> String {
    let mut out = String::new();
    render_into(value, &mut Choices(seed | 1), &mut out);
    out
}

fn space(c: &mut Choices, out: &mut String) {
    for _ in 0..c.next(3) {
        out.push([' ', '\n', '\t', '\r'][c.next(4) as usize]);
    }
}

fn render_into(value: &Value, c: &mut Choices, out: &mut String) {
    space(c, out);
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => render_number(n, out),
        Value::String(s) => render_string(s, c, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    space(c, out);
                    out.push(',');
                }
                render_into(item, c, out);
            }
            space(c, out);
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            // Fisher-Yates with the seeded choices.
            for i in (1..members.len()).rev() {
                members.swap(i, c.next(i as u64 + 1) as usize);
            }
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    space(c, out);
                    out.push(',');
                }
                space(c, out);
                render_string(k, c, out);
                space(c, out);
                out.push(':');
                render_into(v, c, out);
            }
            space(c, out);
            out.push('}');
        }
    }
    space(c, out);
}

/// A number as serde_json writes it: its literal is its value, so it is never
/// respelled (another spelling is another request).
fn render_number(n: &Number, out: &mut String) {
    out.push_str(&n.to_string());
}

fn render_string(s: &str, c: &mut Choices, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        let must_escape = matches!(ch, '"' | '\\') || (ch as u32) < 0x20;
        match (must_escape, c.next(4)) {
            (false, 0..=1) => out.push(ch),
            (true, 0) if ch == '"' => out.push_str("\\\""),
            (true, 0) if ch == '\\' => out.push_str("\\\\"),
            (true, 0) if ch == '\n' => out.push_str("\\n"),
            _ if ch == '/' && c.next(2) == 0 => out.push_str("\\/"),
            _ => {
                let mut units = [0u16; 2];
                for unit in ch.encode_utf16(&mut units) {
                    // Upper or lower case hex digits are the same escape.
                    if c.next(2) == 0 {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
        }
    }
    out.push('"');
}

fn json_fingerprint(body: &[u8]) -> Fingerprint {
    let key = IdempotencyKey::parse(b"order-7f3a9c2e").unwrap();
    let json = HeaderValue::from_static("application/json");
    Fingerprint::compute(
        &Method::POST,
        "/v1/orders",
        &key,
        "merchant_1",
        Some(&json),
        body,
    )
}

/// The number of leaves (scalars, empty arrays and empty objects) in `value`.
fn leaves(value: &Value) -> usize {
    match value {
        Value::Array(items) if !items.is_empty() => items.iter().map(leaves).sum(),
        Value::Object(map) if !map.is_empty() => map.values().map(leaves).sum(),
        _ => 1,
    }
}

/// `value` with its `n`th leaf changed to a different JSON value.
fn change_leaf(value: &mut Value, n: &mut usize) -> bool {
    match value {
        Value::Array(items) if !items.is_empty() => items.iter_mut().any(|v| change_leaf(v, n)),
        Value::Object(map) if !map.is_empty() => map.values_mut().any(|v| change_leaf(v, n)),
        leaf => {
            if *n > 0 {
                *n -= 1;
                return false;
            }
            *leaf = match leaf.take() {
                Value::Null => Value::Bool(false),
                Value::Bool(b) => Value::Bool(!b),
                Value::Number(x) => match x.as_i64() {
                    Some(i) => Value::Number((i + 1).into()),
                    None => {
                        let f = x.as_f64().unwrap();
                        let g = if f.abs() < 1e15 { f + 1.0 } else { f / 2.0 };
                        Value::Number(Number::from_f64(g).unwrap())
                    }
                },
                Value::String(s) => Value::String(s + "x"),
                Value::Array(_) => Value::Array(vec![Value::Null]),
                Value::Object(_) => Value::Array(Vec::new()),
            };
            true
        }
    }
}

/// Renames the `n`th object key (depth first) to one not already in its object.
fn rename_key(value: &mut Value, n: &mut usize) -> bool {
    match value {
        Value::Array(items) => items.iter_mut().any(|v| rename_key(v, n)),
        Value::Object(map) => {
            if *n < map.len() {
                let old = map.keys().nth(*n).unwrap().clone();
                let mut new = format!("{old}~");
                while map.contains_key(&new) {
                    new.push('~');
                }
                let v = map.remove(&old).unwrap();
                map.insert(new, v);
                return true;
            }
            *n -= map.len();
            map.values_mut().any(|v| rename_key(v, n))
        }
        _ => false,
    }
}

fn count_keys(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(count_keys).sum(),
        Value::Object(map) => map.len() + map.values().map(count_keys).sum::<usize>(),
        _ => 0,
    }
}

/// The same value with every number as a double (serde_json reads `5.0` back
/// as a double, `5` as an integer).
fn as_doubles(value: Value) -> Value {
    match value {
        Value::Number(n) => Value::Number(Number::from_f64(n.as_f64().unwrap()).unwrap()),
        Value::Array(items) => Value::Array(items.into_iter().map(as_doubles).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, as_doubles(v))).collect())
        }
        other => other,
    }
}

/// Minimal JCS string escaping, written independently of the crate (the
/// exact model's writer).
fn reference_escape(s: &str) -> String {
    let mut out = String::new();
    exact_json::escape(s, &mut out);
    out
}

/// A number as (negative, significant digits, exponent of the last digit):
/// digits around 2^53 and 10^17..10^25, and zeros, where doubles round.
fn exact_number() -> impl Strategy<Value = (bool, String, i32)> {
    let digits = prop_oneof![
        Just(String::new()),
        "[1-9]",
        "[1-9][0-9]{0,14}[1-9]",
        "900719925474099[0-9]",
        "[1-9][0-9]{15,25}",
    ];
    (any::<bool>(), digits, -340i32..330)
}

/// One of many spellings of the number: the decimal point anywhere, leading
/// and trailing zeros, an exponent or none.
fn spell((negative, digits, exponent): &(bool, String, i32), c: &mut Choices) -> String {
    let digits = if digits.is_empty() { "0" } else { digits };
    let mut out = String::new();
    if *negative {
        out.push('-');
    }
    let pad = c.next(3) as usize; // trailing zeros, compensated in the exponent
    let mantissa = format!("{digits}{}", "0".repeat(pad));
    let point = c.next(mantissa.len() as u64 + 1) as usize;
    // Zero's padding goes after the point: `00.0` is not JSON.
    let point = if digits == "0" { point.min(1) } else { point };
    let (int, frac) = mantissa.split_at(point);
    out.push_str(if int.is_empty() { "0" } else { int });
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    let e = i64::from(*exponent) - pad as i64 + frac.len() as i64;
    if e != 0 || c.next(2) == 0 {
        out.push_str(if c.next(2) == 0 { "e" } else { "E" });
        out.push_str(&e.to_string());
    }
    out
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn canonicalisation_is_deterministic_idempotent_and_keeps_the_value(
        value in json_value(),
        seed in any::<u64>(),
    ) {
        let text = render(&value, seed);
        let once = canonicalize_json(text.as_bytes()).expect("valid JSON canonicalises");
        prop_assert_eq!(&canonicalize_json(text.as_bytes()).unwrap(), &once, "deterministic");
        prop_assert_eq!(&canonicalize_json(&once).unwrap(), &once, "idempotent");
        let back: Value = serde_json::from_slice(&once).unwrap();
        prop_assert_eq!(as_doubles(back), as_doubles(value), "the canonical text holds the same value");
        let exact = exact_json::parse(text.as_bytes(), 127).expect("the model parses it");
        prop_assert_eq!(
            exact_json::parse(&once, 127),
            Some(exact.clone()),
            "the canonical text holds the same exact values"
        );
        prop_assert_eq!(
            std::str::from_utf8(&once).unwrap(),
            exact_json::canonical(&exact),
            "the independent canonical writer agrees"
        );
    }

    #[test]
    fn numbers_share_a_canonical_form_exactly_when_their_literals_are_equal(
        a in exact_number(),
        b in exact_number(),
        nudge in 0u8..4,
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
    ) {
        // Half the time b is a (the same value, mostly spelled another way), or
        // a one-unit change of a (9007199254740992 and ...993, 0 and -0).
        let mut b = b;
        if nudge < 2 {
            b = a.clone();
            if nudge == 1 {
                match b.1.pop() {
                    Some(last) if last < '9' => b.1.push((last as u8 + 1) as char),
                    Some(last) => { b.1.push(last); b.1.push('1'); b.2 -= 1; }
                    None => b.0 = !b.0,
                }
            }
        }
        let (ta, tb) = (spell(&a, &mut Choices(seed_a | 1)), spell(&b, &mut Choices(seed_b | 1)));
        let (ea, eb) = (exact_json::parse(ta.as_bytes(), 8), exact_json::parse(tb.as_bytes(), 8));
        let (ca, cb) = (canonicalize_json(ta.as_bytes()), canonicalize_json(tb.as_bytes()));
        // In double range exactly when the model accepts it.
        prop_assert_eq!(ca.is_ok(), ea.is_some(), "{}", ta);
        prop_assert_eq!(cb.is_ok(), eb.is_some(), "{}", tb);
        if let (Ok(ca), Ok(cb)) = (ca, cb) {
            prop_assert_eq!(std::str::from_utf8(&ca).unwrap(), ta.as_str(), "kept as written");
            prop_assert_eq!(ca == cb, ta == tb, "{} vs {}", ta, tb);
            let doc = |n: &str| format!(r#"{{"total":{n},"k":"v"}}"#);
            prop_assert_eq!(
                json_fingerprint(doc(&ta).as_bytes()) == json_fingerprint(doc(&tb).as_bytes()),
                ta == tb,
                "{} vs {} (the same value: {})", ta, tb, a == b
            );
        }
    }

    #[test]
    fn key_permutations_whitespace_and_string_escapes_give_the_same_fingerprint(
        value in json_value(),
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
    ) {
        let (a, b) = (render(&value, seed_a), render(&value, seed_b));
        let canonical = canonicalize_json(serde_json::to_string(&value).unwrap().as_bytes()).unwrap();
        prop_assert_eq!(&canonicalize_json(a.as_bytes()).unwrap(), &canonical, "{}", a);
        prop_assert_eq!(&canonicalize_json(b.as_bytes()).unwrap(), &canonical, "{}", b);
        prop_assert_eq!(json_fingerprint(a.as_bytes()), json_fingerprint(b.as_bytes()));
        prop_assert_eq!(json_fingerprint(a.as_bytes()), json_fingerprint(&canonical));
    }

    #[test]
    fn changing_any_value_changes_the_fingerprint(
        value in json_value(),
        which in any::<prop::sample::Index>(),
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
    ) {
        let mut changed = value.clone();
        let mut n = which.index(leaves(&value));
        prop_assert!(change_leaf(&mut changed, &mut n));
        prop_assert_ne!(
            json_fingerprint(render(&value, seed_a).as_bytes()),
            json_fingerprint(render(&changed, seed_b).as_bytes()),
            "{} vs {}", value, changed
        );
    }

    #[test]
    fn changing_any_key_changes_the_fingerprint(
        value in json_value(),
        which in any::<prop::sample::Index>(),
        seed_a in any::<u64>(),
        seed_b in any::<u64>(),
    ) {
        let keys = count_keys(&value);
        prop_assume!(keys > 0);
        let mut changed = value.clone();
        prop_assert!(rename_key(&mut changed, &mut which.index(keys)));
        prop_assert_ne!(
            json_fingerprint(render(&value, seed_a).as_bytes()),
            json_fingerprint(render(&changed, seed_b).as_bytes()),
            "{} vs {}", value, changed
        );
    }

    #[test]
    fn changing_method_path_query_key_or_scope_changes_the_fingerprint(
        body in json_value(),
        method in prop::sample::select(vec![Method::POST, Method::PATCH, Method::PUT, Method::DELETE]),
        other_method in prop::sample::select(vec![Method::POST, Method::PATCH, Method::PUT, Method::DELETE]),
        path in "/[a-z0-9/]{0,12}",
        segment in "[a-z0-9]{1,4}",
        query in "[a-z0-9=&]{0,8}",
        key in "[A-Za-z0-9._-]{8,40}",
        key_suffix in "[A-Za-z0-9._-]{1,4}",
        scope in "\\PC{1,12}",
        scope_suffix in "\\PC{1,4}",
    ) {
        let body = serde_json::to_vec(&body).unwrap();
        let json = HeaderValue::from_static("application/json");
        let fp = |m: &Method, pq: &str, k: &str, s: &str| {
            let k = IdempotencyKey::parse(k.as_bytes()).unwrap();
            Fingerprint::compute(m, pq, &k, s, Some(&json), &body)
        };
        let with_query = format!("{path}?{query}");
        let base = fp(&method, &with_query, &key, &scope);
        if other_method != method {
            prop_assert_ne!(base, fp(&other_method, &with_query, &key, &scope), "method");
        }
        prop_assert_ne!(base, fp(&method, &format!("{path}/{segment}?{query}"), &key, &scope), "path");
        prop_assert_ne!(base, fp(&method, &format!("{path}?{query}&{segment}"), &key, &scope), "query");
        prop_assert_ne!(base, fp(&method, &path, &key, &scope), "query dropped");
        let longer_key = format!("{key}{key_suffix}");
        prop_assume!(longer_key.len() <= 128);
        prop_assert_ne!(base, fp(&method, &with_query, &longer_key, &scope), "idempotency key");
        prop_assert_ne!(base, fp(&method, &with_query, &key, &format!("{scope}{scope_suffix}")), "scope");
        // A quoted (sf-string) key is the same key, so the same fingerprint.
        prop_assert_eq!(base, fp(&method, &with_query, &format!("\"{key}\""), &scope));
    }

    #[test]
    fn object_keys_sort_by_utf16_code_units(
        keys in prop::collection::btree_set(prop::collection::vec(any::<char>(), 0..6)
            .prop_map(|c| c.into_iter().collect::<String>()), 0..12),
    ) {
        let map: Map<String, Value> = keys.iter().map(|k| (k.clone(), Value::Null)).collect();
        let out = canonicalize_json(serde_json::to_string(&map).unwrap().as_bytes()).unwrap();
        let mut expected: Vec<&String> = keys.iter().collect();
        expected.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
        let text = format!(
            "{{{}}}",
            expected.iter().map(|k| format!("{}:null", reference_escape(k))).collect::<Vec<_>>().join(",")
        );
        prop_assert_eq!(String::from_utf8(out).unwrap(), text);
    }

    #[test]
    fn strings_use_the_minimal_escapes(s in prop::collection::vec(any::<char>(), 0..24)
        .prop_map(|c| c.into_iter().collect::<String>()), seed in any::<u64>()) {
        let mut spelled = String::new();
        render_string(&s, &mut Choices(seed | 1), &mut spelled);
        let out = canonicalize_json(spelled.as_bytes()).unwrap();
        prop_assert_eq!(String::from_utf8(out).unwrap(), reference_escape(&s));
    }

    #[test]
    fn any_double_is_kept_as_written(bits in any::<u64>()) {
        let f = f64::from_bits(bits);
        prop_assume!(f.is_finite());
        // Rust's spellings: `1e-7`, `1E-7`, `0.0000001` (`{:?}` is plain or
        // exponential by magnitude), all JSON numbers of the same double.
        let spellings = [format!("{f:e}"), format!("{f:E}"), format!("{f:?}")];
        for spelled in &spellings {
            let out = String::from_utf8(canonicalize_json(spelled.as_bytes()).unwrap()).unwrap();
            prop_assert_eq!(&out, spelled);
            let back: f64 = out.parse().unwrap();
            prop_assert!(back == f && back.is_sign_negative() == f.is_sign_negative(), "{}", out);
        }
        for (x, y) in [(0, 1), (0, 2), (1, 2)] {
            let (sx, sy) = (&spellings[x], &spellings[y]);
            prop_assert_eq!(json_fingerprint(sx.as_bytes()) == json_fingerprint(sy.as_bytes()), sx == sy);
        }
    }

    #[test]
    fn duplicate_keys_at_any_depth_are_hashed_as_raw_bytes(
        value in json_value(),
        key in "[a-z]{1,3}",
        first in json_value(),
        second in json_value(),
    ) {
        let inner = render(&value, 7);
        let a = serde_json::to_string(&first).unwrap();
        let b = serde_json::to_string(&second).unwrap();
        let doc = format!(r#"[{inner},{{"{key}":{a},"{key}":{b}}}]"#);
        prop_assert!(canonicalize_json(doc.as_bytes()).is_err());
        let text = HeaderValue::from_static("text/plain");
        let k = IdempotencyKey::parse(b"order-7f3a9c2e").unwrap();
        let raw = Fingerprint::compute(&Method::POST, "/v1/orders", &k, "merchant_1", Some(&text), doc.as_bytes());
        prop_assert_eq!(json_fingerprint(doc.as_bytes()), raw);
        prop_assert_eq!(json_fingerprint(doc.as_bytes()), json_fingerprint(doc.as_bytes()), "deterministic");
    }
}

/// The fingerprint by its definition, with the independent model
/// (`tests/common/exact_json.rs`) as the canonicaliser: SHA-256 over the
/// request line and the model's canonical text, or the raw bytes when the
/// model refuses the body.
fn model_fingerprint(body: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for part in ["POST", "/v1/orders", "order-7f3a9c2e", "merchant_1"] {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    match exact_json::parse(body, 128) {
        Some(exact) => hasher.update(exact_json::canonical(&exact).as_bytes()),
        None => hasher.update(body),
    }
    hasher.finalize().into()
}

/// Bodies at and next to the canonical text `canonical`: the text itself,
/// and with one space, one `\/` for a `/`, one `\u00e9` for an `é`, one
/// `\u0061` for an `a`, one more level of nesting, or cut short or followed
/// by more.
fn near_canonical(canonical: &str, c: &mut Choices) -> Vec<String> {
    let at = |c: &mut Choices| {
        let mut i = c.next(canonical.len() as u64 + 1) as usize;
        while !canonical.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let replace_one = |from: &str, to: &str, c: &mut Choices| {
        let places: Vec<usize> = canonical.match_indices(from).map(|(i, _)| i).collect();
        (!places.is_empty()).then(|| {
            let i = places[c.next(places.len() as u64) as usize];
            format!("{}{to}{}", &canonical[..i], &canonical[i + from.len()..])
        })
    };
    let space = at(c);
    let cut = at(c);
    let mut bodies = vec![
        canonical.to_string(),
        format!("{} {}", &canonical[..space], &canonical[space..]),
        format!("[{canonical}]"),
        format!(r#"{{"a":{canonical}}}"#),
        canonical[..cut].to_string(),
        format!("{canonical}x"),
        format!("{canonical},"),
    ];
    bodies.extend(replace_one("/", "\\/", c));
    bodies.extend(replace_one("é", "\\u00e9", c));
    bodies.extend(replace_one("a", "\\u0061", c));
    bodies
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever path computes it (the body hashed as it is when already
    /// canonical, the single-pass canonicaliser, serde_json's), the
    /// fingerprint is the model's.
    #[test]
    fn fingerprints_of_canonical_and_almost_canonical_bodies_are_the_models(
        value in json_value(),
        seed in any::<u64>(),
    ) {
        let text = render(&value, seed);
        let canonical = canonicalize_json(text.as_bytes()).expect("valid JSON canonicalises");
        let canonical = String::from_utf8(canonical).unwrap();
        // Still canonical, with places for each escape.
        let wrapped = format!(r#"{{"a/é":"é/a","b":{canonical}}}"#);
        // The same members, out of order.
        let swapped = format!(r#"{{"b":{canonical},"a/é":"é/a"}}"#);
        let mut bodies = near_canonical(&wrapped, &mut Choices(seed | 1));
        bodies.push(swapped);
        for body in bodies {
            prop_assert_eq!(
                *json_fingerprint(body.as_bytes()).as_bytes(),
                model_fingerprint(body.as_bytes()),
                "{}",
                body
            );
        }
        prop_assert_eq!(json_fingerprint(text.as_bytes()), json_fingerprint(canonical.as_bytes()));
    }
}

// ---------------------------------------------------------------------------
// Published vectors
// ---------------------------------------------------------------------------

fn vectors() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/data/rfc8785"))
}

#[test]
fn rfc8785_published_vectors_byte_for_byte() {
    let names = [
        "arrays",
        "french",
        "structures",
        "unicode",
        "values",
        "weird",
    ];
    for name in names {
        let input = std::fs::read(vectors().join(format!("input/{name}.json"))).unwrap();
        let mut expected = std::fs::read(vectors().join(format!("output/{name}.json"))).unwrap();
        // The one deliberate difference: numbers keep their literals, where
        // RFC 8785 writes the ECMAScript form of their doubles.
        let as_written: &[(&str, &str)] = match name {
            "structures" => &[(r#""\n":56,"#, r#""\n":56.0,"#)],
            "values" => &[(
                "[1e+30,4.5,333333333.3333333,0.002,1e-27]",
                "[1E30,4.50,333333333.33333329,2e-3,0.000000000000000000000000001]",
            )],
            _ => &[],
        };
        for (rfc8785, literal) in as_written {
            let text = String::from_utf8(expected).unwrap();
            assert!(text.contains(rfc8785), "{name}: {text}");
            expected = text.replace(rfc8785, literal).into_bytes();
        }
        let out = canonicalize_json(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            out,
            expected,
            "{name}: got {:?}",
            String::from_utf8_lossy(&out)
        );
        // The expected output is itself canonical, and fingerprints the same.
        assert_eq!(canonicalize_json(&expected).unwrap(), expected, "{name}");
        assert_eq!(
            json_fingerprint(&input),
            json_fingerprint(&expected),
            "{name}"
        );
    }
}

#[test]
fn rfc8785_appendix_b_es6_numbers() {
    let table = std::fs::read_to_string(vectors().join("es6-numbers.txt")).unwrap();
    let mut checked = 0;
    for line in table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (hex, expected) = line.split_once(',').unwrap();
        let f = f64::from_bits(u64::from_str_radix(hex, 16).unwrap());
        // The ES6 form is canonical as it stands.
        let own = canonicalize_json(expected.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(own).unwrap(), expected, "{hex}");
        // Other spellings of the double are kept as written: another request
        // unless the text is the same.
        for spelled in [format!("{f:?}"), format!("{f:e}"), format!("[{f:E}]")] {
            let out = String::from_utf8(canonicalize_json(spelled.as_bytes()).unwrap()).unwrap();
            assert_eq!(out, spelled, "{hex}");
            assert_eq!(
                json_fingerprint(spelled.as_bytes()) == json_fingerprint(expected.as_bytes()),
                spelled == expected,
                "{hex} spelled {spelled}"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 26);
}

/// The fingerprint hashes `METHOD\nPATH\nKEY\nSCOPE\n` then the body. Method,
/// path and key cannot contain a newline, but a scope can: a scope `a` with a
/// body `b\nc` frames like a scope `a\nb` with a body `c`. That never matters,
/// because a fingerprint is only compared with the record of the same
/// (scope, key): two scopes are two records. Documented in docs/security.md.
#[tokio::test]
async fn framing_collision_needs_two_scopes_and_two_scopes_are_two_records() {
    let key = IdempotencyKey::parse(b"order-7f3a9c2e").unwrap();
    let fp = |scope: &str, body: &[u8]| {
        Fingerprint::compute(&Method::POST, "/v1/orders", &key, scope, None, body)
    };
    assert_eq!(fp("a", b"b\nc"), fp("a\nb", b"c"));
    let store = MemoryStore::new();
    let first = RecordKey::new(Scope::new("a"), key.clone());
    let second = RecordKey::new(Scope::new("a\nb"), key.clone());
    assert!(matches!(
        store.begin(&first, &fp("a", b"b\nc").into()).await,
        Ok(Begin::Claimed(_))
    ));
    assert!(matches!(
        store.begin(&second, &fp("a\nb", b"c").into()).await,
        Ok(Begin::Claimed(_))
    ));
}
