//! Request fingerprints: digests of the request line, key, scope and the
//! canonical form of JSON bodies.
//!
//! Which digest a store compares depends on where its records live. A
//! [`Fingerprint`] is SHA-256 over that canonical stream, computed alike by
//! every process: what stores shared between processes (`PostgresStore`,
//! `RedisStore`) persist. A store whose records never leave the process
//! (`MemoryStore`) compares [`RequestFingerprint::local`] instead: a 128-bit
//! HighwayHash of the same canonical form under a key drawn at random per
//! process, equal exactly when the fingerprints are (but for a chance of
//! 2^-128 per pair), without the SHA-256; and, first,
//! [`RequestFingerprint::exact`], the same kind of digest of the exact bytes.
//!
//! The canonical form is RFC 8785 (JCS) with one deliberate deviation, from
//! section 3.2.2.3: a number is written as its literal text, exactly as sent,
//! not as the ECMAScript form of its nearest IEEE 754 double. A handler reading
//! the body with typed fields tells `2` from `2.0` (an integer field refuses
//! `2.0`), `1.5` from `1.50` (a decimal type keeps the scale), `-0` from `0`,
//! and `100` from `1e2` (raw text); a retry that changes any of them under the
//! same key is another request (`409 idempotency_key_reuse`), never a replay.
//! Numbers must be in JSON's grammar (RFC 8259 section 6) and within double
//! range. Everything else is as RFC 8785 prescribes: object members sorted by
//! the UTF-16 code units of their keys, no insignificant whitespace, and strings
//! re-serialised with the minimal escapes, so key order, whitespace and string
//! escapes do not count.

use crate::IdempotencyKey;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

mod fast;
mod number;
mod request;
mod serde_path;
#[cfg(test)]
mod tests;

use self::fast::*;
use self::number::*;
pub use self::request::{ExactDigest, LocalDigest, RequestFingerprint};
use self::serde_path::*;

/// SHA-256 digest identifying one logical request.
///
/// Two requests with the same fingerprint are the same operation: same method,
/// path and query, key, scope, and body — where JSON bodies are compared in their
/// canonical form (see [`canonicalize_json`]), so key order, whitespace and string
/// escapes do not matter, while every number counts as written.
///
/// ```
/// use http::{HeaderValue, Method};
/// use tower_idempotency::{IdempotencyKey, fingerprint::Fingerprint};
///
/// let key = IdempotencyKey::parse(b"order-0001").unwrap();
/// let json = HeaderValue::from_static("application/json");
/// let a = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "acme", Some(&json),
///     br#"{"sku":"A","qty":1}"#);
/// let b = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "acme", Some(&json),
///     b"{ \"qty\": 1, \"sku\": \"\\u0041\" }");
/// assert_eq!(a, b);
/// // `1.0` is another number to a handler reading `qty` as an integer.
/// let respelled = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "acme",
///     Some(&json), br#"{"sku":"A","qty":1.0}"#);
/// assert_ne!(a, respelled);
/// let other_scope = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "globex",
///     Some(&json), br#"{"sku":"A","qty":1}"#);
/// assert_ne!(a, other_scope);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// A fingerprint a store kept, from its 32 bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Computes the fingerprint of a request.
    ///
    /// JSON bodies (`application/json`, `application/*+json`) are canonicalised per
    /// RFC 8785, numbers kept as written (see [`canonicalize_json`]); other
    /// bodies, and JSON that fails to parse (invalid, trailing text, nested deeper
    /// than 128 levels, duplicate object keys, numbers out of range), are hashed as
    /// raw bytes.
    pub fn compute(
        method: &http::Method,
        path_and_query: &str,
        key: &IdempotencyKey,
        scope: &str,
        content_type: Option<&http::HeaderValue>,
        body: &[u8],
    ) -> Self {
        let mut hasher = Sha256::new();
        for part in [method.as_str(), path_and_query, key.as_str(), scope] {
            hasher.update(part.as_bytes());
            hasher.update(b"\n");
        }
        if content_type.is_some_and(|ct| is_json_content_type(ct.as_bytes())) {
            with_canonical_json(body, |canonical| hasher.update(canonical.unwrap_or(body)));
        } else {
            hasher.update(body);
        }
        Self(hasher.finalize().into())
    }

    /// Its 32 bytes (a SHA-256 digest), as a store keeps them.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

/// Whether a `Content-Type` names JSON: `application/json` or `application/*+json`.
pub fn is_json_content_type(value: &[u8]) -> bool {
    // Case-insensitive without allocating: this runs on every request.
    if value == b"application/json" {
        return true;
    }
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    let essence = essence.trim_ascii();
    let prefix = b"application/".len();
    if essence.len() <= prefix || !essence[..prefix].eq_ignore_ascii_case(b"application/") {
        return false;
    }
    let subtype = &essence[prefix..];
    subtype.eq_ignore_ascii_case(b"json")
        || (subtype.len() >= 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case(b"+json"))
}

/// Why a body could not be canonicalised.
#[derive(Debug)]
pub struct CanonicalizeError(String);

impl fmt::Display for CanonicalizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not canonicalisable JSON: {}", self.0)
    }
}

impl std::error::Error for CanonicalizeError {}

/// Serialises a JSON text in its canonical form: RFC 8785 (JCS), but for
/// numbers, which keep their literal text.
///
/// Objects are sorted by the UTF-16 code units of their keys, whitespace is
/// dropped, and strings use the minimal JSON escapes, as RFC 8785 prescribes.
/// A number is copied exactly as written, not laid out as ECMAScript's
/// `Number.prototype.toString` lays out its double (RFC 8785 section 3.2.2.3):
/// a deliberate deviation, because a handler can tell `2` from `2.0`, `1.5`
/// from `1.50` and `-0` from `0`. So two texts canonicalise alike exactly when
/// they differ only in key order, whitespace and string escapes.
///
/// Duplicate object keys are an error rather than last-wins, so a fingerprint
/// never hides a value the handler might read, and so are numbers outside
/// JSON's grammar or double range and text after the value. Nesting is bounded
/// at 128 levels by the parser, so hostile input cannot overflow the stack.
///
/// ```
/// use tower_idempotency::fingerprint::canonicalize_json;
///
/// let out = canonicalize_json(br#"{ "b": [1e2, 0.50, -0], "a": "\u00e9\/" }"#).unwrap();
/// assert_eq!(out, "{\"a\":\"é/\",\"b\":[1e2,0.50,-0]}".as_bytes());
/// assert_ne!(canonicalize_json(b"2.0").unwrap(), canonicalize_json(b"2").unwrap());
/// assert!(canonicalize_json(br#"{"a":1,"a":2}"#).is_err());
/// assert!(canonicalize_json(br#"{"a":1}garbage"#).is_err());
/// assert!(canonicalize_json(b"[01]").is_err());
/// assert!(canonicalize_json(b"1e400").is_err());
/// ```
pub fn canonicalize_json(input: &[u8]) -> Result<Vec<u8>, CanonicalizeError> {
    let mut buffers = Reusable::default();
    canonicalize_into(input, &mut buffers)?;
    Ok(buffers.out)
}

/// Calls `f` with the canonical form of `input` (`None` when it is not JSON
/// the canonicaliser accepts): `input` itself when it is already canonical,
/// otherwise written into buffers this thread keeps, so that a fingerprint
/// allocates nothing for its canonical text.
fn with_canonical_json<R>(input: &[u8], f: impl FnOnce(Option<&[u8]>) -> R) -> R {
    // A body already canonical is its own canonical form: hashed where it
    // is, without a copy. The proof is tried unless this thread's recent
    // bodies were not canonical (see `Proofs`): it would fail again.
    let prove = Proofs::try_now();
    if prove && is_canonical(input) {
        return f(Some(input));
    }
    thread_local! {
        static BUFFERS: std::cell::RefCell<Reusable> = std::cell::RefCell::default();
    }
    let mut f = Some(f);
    let kept = BUFFERS.try_with(|buffers| {
        let mut buffers = buffers.try_borrow_mut().ok()?;
        let ok = canonicalize_into(input, &mut buffers).is_ok();
        Proofs::note(prove, ok && buffers.out == input);
        let result = (f.take()?)(ok.then_some(&buffers.out[..]));
        buffers.trim();
        Some(result)
    });
    match kept {
        Ok(Some(result)) => result,
        // Only while the thread shuts down: buffers of its own.
        _ => {
            let canonical = canonicalize_json(input).ok();
            (f.take().expect("not called yet"))(canonical.as_deref())
        }
    }
}

/// Whether to try proving a body canonical before canonicalising it, per
/// thread. A client's serialiser writes every body alike, so a body that was
/// not canonical is usually followed by more that are not, and proving them
/// would scan each twice (the proof stops at the first key out of order, but
/// often well into the body). After a failed proof the next
/// [`SKIPPED`](Self::SKIPPED) bodies are canonicalised without one; a body
/// that turns out canonical all the same brings the proof back at once. Only
/// the cost depends on this: both ways give the same canonical text.
struct Proofs;

thread_local! {
    /// Bodies this thread canonicalises before it tries the next proof.
    static SKIP: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

impl Proofs {
    /// Bodies canonicalised without a proof after one failed.
    const SKIPPED: u8 = 15;

    /// Whether the body at hand should be proven first (counts it if not).
    fn try_now() -> bool {
        SKIP.try_with(|skip| match skip.get() {
            0 => true,
            n => {
                skip.set(n - 1);
                false
            }
        })
        .unwrap_or(true)
    }

    /// Notes how a body was canonicalised: after a failed proof (`tried`,
    /// yet canonicalised) the proof pauses; a body found to be its own
    /// canonical form resumes it.
    fn note(tried: bool, was_canonical: bool) {
        let _ = SKIP.try_with(|skip| {
            if was_canonical {
                skip.set(0);
            } else if tried {
                skip.set(Self::SKIPPED);
            }
        });
    }
}

/// The canonicaliser's buffers, kept between calls.
#[derive(Default)]
struct Reusable {
    out: Vec<u8>,
    scratch: Vec<u8>,
    members: Vec<Member>,
}

impl Reusable {
    /// Buffers this large are not kept: one big body must not hold its
    /// memory for the rest of the thread's life.
    const KEPT_BYTES: usize = 64 * 1024;

    fn trim(&mut self) {
        if self.out.capacity() > Self::KEPT_BYTES || self.scratch.capacity() > Self::KEPT_BYTES {
            *self = Self::default();
        }
        if self.members.capacity() > 1024 {
            self.members = Vec::new();
        }
    }
}

/// Writes the canonical form of `input` into `reusable.out`.
fn canonicalize_into(input: &[u8], reusable: &mut Reusable) -> Result<(), CanonicalizeError> {
    let Reusable {
        out,
        scratch,
        members,
    } = reusable;
    out.clear();
    out.reserve(input.len());
    let mut buffers = Buffers {
        out: std::mem::take(out),
        scratch: std::mem::take(scratch),
    };
    // The common case in one pass over the bytes; anything unusual (escaped
    // keys, surrogate escapes, out-of-range numbers, duplicate keys, deep
    // nesting, any syntax error) is left to the serde_json path below, which
    // decides it.
    let mut fast = FastCanonical {
        input,
        at: 0,
        buf: &mut buffers,
        members: std::mem::take(members),
        shape: Shape::default(),
    };
    let handled = fast.document().is_some();
    *members = fast.members;
    members.clear();
    if handled {
        *out = buffers.out;
        *scratch = buffers.scratch;
        return Ok(());
    }
    buffers.out.clear();
    *out = canonicalize_with_serde(input, buffers)?;
    Ok(())
}

/// The general path: serde_json parses, [`CanonicalValue`] writes.
fn canonicalize_with_serde(input: &[u8], buf: Buffers) -> Result<Vec<u8>, CanonicalizeError> {
    let mut de = serde_json::Deserializer::from_slice(input);
    let mut state = SerdeState {
        buf,
        input,
        numbers_at: 0,
    };
    CanonicalValue { state: &mut state }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| CanonicalizeError(e.to_string()))?;
    Ok(state.buf.out)
}

/// The canonical output, and a scratch buffer reused by every object to
/// reorder its members (no allocation per object).
struct Buffers {
    out: Vec<u8>,
    scratch: Vec<u8>,
}
