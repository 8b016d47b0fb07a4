//! Encodings the shared stores have in common: stored response headers, and
//! the id that names a record in wake-up messages.

use super::StoreError;
use http::{HeaderName, HeaderValue};

/// The notification payload naming a record: a hash, so any scope and key fit.
/// PostgreSQL's wake-ups only (Redis names records by their own keys).
#[cfg(feature = "postgres")]
pub(crate) fn key_id(key: &super::RecordKey) -> String {
    use sha2::{Digest, Sha256};
    let (scope, k) = (key.scope().as_str(), key.key().as_str());
    let mut bytes = Vec::with_capacity(8 + scope.len() + k.len());
    bytes.extend_from_slice(&(scope.len() as u64).to_be_bytes());
    bytes.extend_from_slice(scope.as_bytes());
    bytes.extend_from_slice(k.as_bytes());
    hex(&Sha256::digest(&bytes)[..16])
}

/// Lower-case hex digits of `bytes`, in one allocation.
#[cfg(any(feature = "postgres", test))]
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// Headers as `name:value\r\n` lines, in order: names contain no `:` and values
/// no CR or LF, so the encoding is exact for any (even non-UTF-8) value.
/// (`RedisStore` writes the same encoding straight into its commands.)
#[cfg(any(feature = "postgres", test))]
pub(crate) fn encode_headers(headers: &[(HeaderName, HeaderValue)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

pub(crate) fn decode_headers(
    mut bytes: &[u8],
) -> Result<Vec<(HeaderName, HeaderValue)>, StoreError> {
    let corrupt = || StoreError::Backend("stored response headers are corrupt".into());
    let mut headers = Vec::new();
    while !bytes.is_empty() {
        let end = bytes
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(corrupt)?;
        let line = &bytes[..end];
        bytes = &bytes[end + 2..];
        let colon = line.iter().position(|&b| b == b':').ok_or_else(corrupt)?;
        let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| corrupt())?;
        let value = HeaderValue::from_bytes(&line[colon + 1..]).map_err(|_| corrupt())?;
        headers.push((name, value));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_exactly_in_order() {
        let headers = vec![
            (
                HeaderName::from_static("link"),
                HeaderValue::from_static("</a>; rel=\"a\""),
            ),
            (
                HeaderName::from_static("etag"),
                HeaderValue::from_static(""),
            ),
            (
                HeaderName::from_static("link"),
                HeaderValue::from_bytes(b" \xff:x\t").unwrap(),
            ),
        ];
        assert_eq!(decode_headers(&encode_headers(&headers)).unwrap(), headers);
        assert!(decode_headers(b"no-colon\r\n").is_err());
        assert!(decode_headers(b"a:b").is_err());
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn key_ids_separate_scope_from_key() {
        let id = |s: &str, k: &str| {
            key_id(&crate::store::RecordKey::new(
                crate::Scope::new(s),
                crate::IdempotencyKey::parse(k.as_bytes()).unwrap(),
            ))
        };
        assert_ne!(id("ab", "cdefghijk"), id("abc", "defghijk"));
        assert_eq!(id("a", "bcdefghij").len(), 32);
    }

    #[test]
    fn hex_digits_are_lower_case_and_in_order() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }
}
