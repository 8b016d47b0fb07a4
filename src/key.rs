//! Parsing of the `Idempotency-Key` header value.

use http::header::{GetAll, HeaderValue};
use std::fmt;
use std::sync::Arc;

/// Shortest accepted key, in bytes.
pub const MIN_KEY_LEN: usize = 8;
/// Longest accepted key, in bytes.
pub const MAX_KEY_LEN: usize = 128;

/// A validated idempotency key: 8 to 128 characters of `[A-Za-z0-9._-]`.
///
/// Both header forms are accepted and normalised to the same key: the bare
/// token (`Idempotency-Key: order-8f2a1c`) and the RFC 8941 sf-string form
/// used by the IETF draft (`Idempotency-Key: "order-8f2a1c"`).
///
/// ```
/// use tower_idempotency::IdempotencyKey;
///
/// let bare = IdempotencyKey::parse(b"order-8f2a1c").unwrap();
/// let quoted = IdempotencyKey::parse(b"\"order-8f2a1c\"").unwrap();
/// assert_eq!(bare, quoted);
/// assert_eq!(bare.as_str(), "order-8f2a1c");
/// assert!(IdempotencyKey::parse(b"short").is_none());
/// assert!(IdempotencyKey::parse(b"has space in it").is_none());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Arc<str>);

/// What is wrong with a request's key header (each has its refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    /// No header.
    Missing,
    /// More than one value.
    Repeated,
    /// A value that is not a key.
    Invalid,
}

impl IdempotencyKey {
    /// Parses one header value; `None` when it is not a valid key.
    pub fn parse(value: &[u8]) -> Option<Self> {
        let token = match value {
            [b'"', inner @ .., b'"'] => inner,
            _ => value,
        };
        let valid_len = (MIN_KEY_LEN..=MAX_KEY_LEN).contains(&token.len());
        if valid_len && token.iter().all(|&b| is_key_byte(b)) {
            // Every accepted byte is ASCII, so this cannot fail.
            std::str::from_utf8(token).ok().map(|s| Self(s.into()))
        } else {
            None
        }
    }

    /// Extracts the key from all values of the header: exactly one valid value is required.
    pub fn from_header_values(values: GetAll<'_, HeaderValue>) -> Option<Self> {
        Self::from_headers(values).ok()
    }

    /// As [`from_header_values`](Self::from_header_values), saying what is
    /// wrong: no header, more than one, or a value that is not a key.
    pub(crate) fn from_headers(values: GetAll<'_, HeaderValue>) -> Result<Self, KeyProblem> {
        let mut iter = values.iter();
        let first = iter.next().ok_or(KeyProblem::Missing)?;
        // Two field lines, or one holding a comma-joined list (`a, b`), are
        // several keys (RFC 9110, section 5.3); ',' is never a key byte.
        if iter.next().is_some() {
            return Err(KeyProblem::Repeated);
        }
        let value = first.as_bytes();
        // A comma is looked for only in a value that is not a key.
        Self::parse(value).ok_or_else(|| {
            if value.contains(&b',') {
                KeyProblem::Repeated
            } else {
                KeyProblem::Invalid
            }
        })
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey")
            .field(&self.as_str())
            .finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `[A-Za-z0-9._-]`.
const fn is_key_byte_by_rule(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// [`is_key_byte_by_rule`] for every byte, looked up rather than computed:
/// keys are checked on every request.
const KEY_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = is_key_byte_by_rule(b as u8);
        b += 1;
    }
    table
};

fn is_key_byte(b: u8) -> bool {
    KEY_BYTES[usize::from(b)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn the_key_byte_table_follows_the_rule_for_every_byte() {
        let accepted: Vec<u8> = (0..=u8::MAX).filter(|&b| is_key_byte(b)).collect();
        assert_eq!(accepted.len(), 26 + 26 + 10 + 3);
        for b in 0..=u8::MAX {
            assert_eq!(is_key_byte(b), is_key_byte_by_rule(b), "byte {b:#04x}");
        }
    }

    #[test]
    fn accepts_token_and_sf_string_forms() {
        let a = IdempotencyKey::parse(b"abc.DEF_123-xyz").unwrap();
        let b = IdempotencyKey::parse(b"\"abc.DEF_123-xyz\"").unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn enforces_length_bounds() {
        assert!(IdempotencyKey::parse(b"1234567").is_none());
        assert!(IdempotencyKey::parse(b"12345678").is_some());
        assert!(IdempotencyKey::parse("a".repeat(128).as_bytes()).is_some());
        assert!(IdempotencyKey::parse("a".repeat(129).as_bytes()).is_none());
        assert!(IdempotencyKey::parse(b"\"1234567\"").is_none());
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [
            &b""[..],
            b"\"\"",
            b"\"",
            b"\"abcdefghij",
            b"abcdefghij\"",
            b"abc defghij",
            b"abcdefgh\x00",
            b"abcdefgh\xc3\xa9",
            b"\"abc\\\"defghij\"",
            b"abcdefgh,ijklmnop",
            b"abcdefgh/ijkl",
        ] {
            assert!(IdempotencyKey::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn repeated_header_is_rejected() {
        let mut headers = HeaderMap::new();
        headers.append("idempotency-key", HeaderValue::from_static("abcdefgh1"));
        assert!(IdempotencyKey::from_header_values(headers.get_all("idempotency-key")).is_some());
        headers.append("idempotency-key", HeaderValue::from_static("abcdefgh1"));
        assert!(IdempotencyKey::from_header_values(headers.get_all("idempotency-key")).is_none());
        assert!(IdempotencyKey::from_header_values(headers.get_all("other")).is_none());
    }

    #[test]
    fn each_key_problem_has_its_refusal() {
        let problem = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append("idempotency-key", HeaderValue::from_static(value));
            }
            IdempotencyKey::from_headers(headers.get_all("idempotency-key")).err()
        };
        assert_eq!(problem(&[]), Some(KeyProblem::Missing));
        assert_eq!(problem(&["abcdefgh1"]), None);
        assert_eq!(problem(&["\"abcdefgh1\""]), None);
        let long: &'static str = "a".repeat(300).leak();
        for bad in ["", "1234567", long, "abc defghij", "\"abcdefgh1"] {
            assert_eq!(problem(&[bad]), Some(KeyProblem::Invalid), "{bad:?}");
        }
        for list in [
            &["abcdefgh1", "abcdefgh1"][..],
            &["abcdefgh1, abcdefgh2"],
            &["a,"],
        ] {
            assert_eq!(problem(list), Some(KeyProblem::Repeated), "{list:?}");
        }
    }
}
