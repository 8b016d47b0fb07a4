//! `IdempotencyKey::parse` and `from_header_values` on arbitrary bytes: no panic,
//! and the answer agrees with an independent reading of the grammar
//! (`^[A-Za-z0-9._-]{8,128}$`, optionally as an RFC 8941 sf-string `"..."`).
#![no_main]

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use tower_idempotency::IdempotencyKey;

fn reference(value: &[u8]) -> Option<&[u8]> {
    let token = if value.len() >= 2 && value[0] == b'"' && value[value.len() - 1] == b'"' {
        &value[1..value.len() - 1]
    } else {
        value
    };
    let allowed = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    ((8..=128).contains(&token.len()) && token.iter().all(allowed)).then_some(token)
}

fuzz_target!(|data: &[u8]| {
    let parsed = IdempotencyKey::parse(data);
    let expected = reference(data);
    assert_eq!(
        parsed.as_ref().map(|k| k.as_str().as_bytes()),
        expected,
        "parse disagrees with the grammar on {data:?}"
    );
    if let Some(key) = &parsed {
        // Normalised: the token and its sf-string form are the same key.
        assert_eq!(
            IdempotencyKey::parse(key.as_str().as_bytes()).as_ref(),
            Some(key)
        );
        let quoted = format!("\"{}\"", key.as_str());
        assert_eq!(IdempotencyKey::parse(quoted.as_bytes()).as_ref(), Some(key));
    }

    // Through a header map: one value parses like `parse`, two never do.
    let Ok(value) = HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.append("idempotency-key", value.clone());
    let one = IdempotencyKey::from_header_values(headers.get_all("idempotency-key"));
    assert_eq!(one, parsed);
    headers.append("idempotency-key", value);
    assert!(IdempotencyKey::from_header_values(headers.get_all("idempotency-key")).is_none());
});
