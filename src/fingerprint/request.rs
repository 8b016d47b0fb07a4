//! A request's fingerprint as a store receives it: computed only when needed.

use super::Fingerprint;
use crate::IdempotencyKey;
use highway::{HighwayHash, HighwayHasher, Key};
use std::fmt;
use std::sync::OnceLock;

/// What a [`Store`](crate::Store) compares to tell a retry from key reuse.
///
/// The canonical [`Fingerprint`] costs about 1.7 µs per KiB of JSON (RFC 8785
/// canonicalisation and SHA-256), so it is computed on the first call of
/// [`fingerprint`](Self::fingerprint) and never for a request that does not need
/// it. [`exact`](Self::exact) is a cheap digest of the request's exact bytes: a
/// store that keeps records in this process may compare it first and skip the
/// fingerprint when the bytes are the same, as they are for almost every retry.
///
/// ```
/// use http::{HeaderValue, Method};
/// use tower_idempotency::{IdempotencyKey, RequestFingerprint};
///
/// let key = IdempotencyKey::parse(b"order-0001").unwrap();
/// let json = HeaderValue::from_static("application/json");
/// let first = RequestFingerprint::new(&Method::POST, "/v1/orders", &key, "acme",
///     Some(&json), br#"{"sku":"A","qty":1}"#);
/// let retry = RequestFingerprint::new(&Method::POST, "/v1/orders", &key, "acme",
///     Some(&json), br#"{"sku":"A","qty":1}"#);
/// let reordered = RequestFingerprint::new(&Method::POST, "/v1/orders", &key, "acme",
///     Some(&json), br#"{"qty":1,"sku":"A"}"#);
/// assert_eq!(first.exact(), retry.exact());
/// assert_ne!(first.exact(), reordered.exact());
/// assert_eq!(first.fingerprint(), reordered.fingerprint());
/// ```
pub struct RequestFingerprint<'a> {
    /// `None` for a fingerprint computed elsewhere.
    request: Option<Parts<'a>>,
    fingerprint: OnceLock<Fingerprint>,
    exact: OnceLock<ExactDigest>,
}

/// The arguments of [`Fingerprint::compute`].
struct Parts<'a> {
    method: &'a http::Method,
    path_and_query: &'a str,
    key: &'a IdempotencyKey,
    scope: &'a str,
    content_type: Option<&'a http::HeaderValue>,
    body: &'a [u8],
}

impl<'a> RequestFingerprint<'a> {
    /// The fingerprint of a request, computed lazily from its parts (the
    /// arguments of [`Fingerprint::compute`]).
    pub fn new(
        method: &'a http::Method,
        path_and_query: &'a str,
        key: &'a IdempotencyKey,
        scope: &'a str,
        content_type: Option<&'a http::HeaderValue>,
        body: &'a [u8],
    ) -> Self {
        Self {
            request: Some(Parts {
                method,
                path_and_query,
                key,
                scope,
                content_type,
                body,
            }),
            fingerprint: OnceLock::new(),
            exact: OnceLock::new(),
        }
    }

    /// The canonical fingerprint, computed on first use: the value every store
    /// persists and compares.
    pub fn fingerprint(&self) -> &Fingerprint {
        self.fingerprint.get_or_init(|| {
            let p = self
                .request
                .as_ref()
                .expect("a computed fingerprint is set at construction");
            Fingerprint::compute(
                p.method,
                p.path_and_query,
                p.key,
                p.scope,
                p.content_type,
                p.body,
            )
        })
    }

    /// A digest of the request's exact bytes, keyed by a secret chosen at random
    /// when the process starts: equal digests mean equal fingerprints, unequal
    /// ones mean nothing (the bytes may still be canonically the same).
    ///
    /// Only comparable within one process: never persist it or send it to
    /// another instance.
    pub fn exact(&self) -> ExactDigest {
        *self.exact.get_or_init(|| {
            let mut hasher = HighwayHasher::new(*process_key());
            match &self.request {
                Some(p) => {
                    let parts = [p.method.as_str(), p.path_and_query, p.key.as_str(), p.scope];
                    // The content type decides between canonical JSON and raw bytes.
                    let json = p
                        .content_type
                        .is_some_and(|ct| super::is_json_content_type(ct.as_bytes()));
                    // One header with every part's length, so no two requests
                    // share one encoding (and few small writes, which cost more
                    // than their bytes).
                    let mut header = [0u8; 2 + 8 * 4];
                    header[1] = u8::from(json);
                    for (len, part) in header[2..].chunks_exact_mut(8).zip(parts) {
                        len.copy_from_slice(&(part.len() as u64).to_le_bytes());
                    }
                    hasher.append(&header);
                    for part in parts {
                        hasher.append(part.as_bytes());
                    }
                    hasher.append(p.body);
                }
                None => {
                    hasher.append(&[1]);
                    hasher.append(self.fingerprint().as_bytes());
                }
            }
            ExactDigest(hasher.finalize64())
        })
    }
}

impl RequestFingerprint<'_> {
    /// Whether [`fingerprint`](Self::fingerprint) has been computed.
    #[cfg(test)]
    pub(crate) fn fingerprint_computed(&self) -> bool {
        self.fingerprint.get().is_some()
    }
}

impl From<Fingerprint> for RequestFingerprint<'static> {
    /// A fingerprint computed elsewhere (for example by a store's own tests).
    fn from(fingerprint: Fingerprint) -> Self {
        Self {
            request: None,
            fingerprint: OnceLock::from(fingerprint),
            exact: OnceLock::new(),
        }
    }
}

impl fmt::Debug for RequestFingerprint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestFingerprint")
            .field("fingerprint", &self.fingerprint.get())
            .field("exact", &self.exact.get())
            .finish_non_exhaustive()
    }
}

/// A keyed digest of a request's exact bytes; see [`RequestFingerprint::exact`].
///
/// HighwayHash (a keyed hash its authors designed as a pseudo-random
/// function, 64-bit output) under a random key that never leaves the process:
/// without the key, nobody can construct a body that collides with another,
/// and the layer never reveals a digest. A third of the instructions of the
/// standard library's SipHash-1-3 on a 1 KiB body, two thirds of the time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExactDigest(u64);

impl fmt::Debug for ExactDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ExactDigest(..)")
    }
}

/// The key of [`RequestFingerprint::exact`], drawn once per process.
fn process_key() -> &'static Key {
    static KEY: OnceLock<Key> = OnceLock::new();
    KEY.get_or_init(random_key)
}

/// A random HighwayHash key: 256 bits from the operating system.
pub(crate) fn random_key() -> Key {
    Key(crate::random::lanes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderValue, Method};

    fn exact(
        method: &Method,
        path: &str,
        key: &str,
        scope: &str,
        content_type: Option<&HeaderValue>,
        body: &[u8],
    ) -> ExactDigest {
        let key = IdempotencyKey::parse(key.as_bytes()).unwrap();
        RequestFingerprint::new(method, path, &key, scope, content_type, body).exact()
    }

    #[test]
    fn exact_digest_tells_every_part_apart() {
        let json = HeaderValue::from_static("application/json");
        let text = HeaderValue::from_static("text/plain");
        let post = Method::POST;
        let base = exact(&post, "/a", "order-0001", "acme", Some(&json), b"{}");
        assert_eq!(
            base,
            exact(&post, "/a", "order-0001", "acme", Some(&json), b"{}")
        );
        let others = [
            exact(&Method::PUT, "/a", "order-0001", "acme", Some(&json), b"{}"),
            exact(&post, "/b", "order-0001", "acme", Some(&json), b"{}"),
            exact(&post, "/a", "order-0002", "acme", Some(&json), b"{}"),
            exact(&post, "/a", "order-0001", "acme2", Some(&json), b"{}"),
            exact(&post, "/a", "order-0001", "acme", Some(&text), b"{}"),
            exact(&post, "/a", "order-0001", "acme", None, b"{}"),
            exact(&post, "/a", "order-0001", "acme", Some(&json), b"{} "),
            // The same bytes split differently between the parts.
            exact(&post, "/ao", "rder-0001", "acme", Some(&json), b"{}"),
            exact(&post, "/a", "order-0001a", "cme", Some(&json), b"{}"),
            exact(&post, "/a", "order-0001", "acme{", Some(&json), b"}"),
        ];
        for (i, other) in others.iter().enumerate() {
            assert_ne!(base, *other, "variant {i}");
        }
        // The body's bytes matter beyond the hasher's 32-byte packets.
        let long = vec![b'x'; 1000];
        let mut changed = long.clone();
        changed[999] = b'y';
        assert_ne!(
            exact(&post, "/a", "order-0001", "acme", None, &long),
            exact(&post, "/a", "order-0001", "acme", None, &changed)
        );
    }

    #[test]
    fn exact_digest_of_a_computed_fingerprint_differs_from_any_request() {
        let key = IdempotencyKey::parse(b"order-0001").unwrap();
        let request = RequestFingerprint::new(&Method::POST, "/a", &key, "acme", None, b"{}");
        let computed = RequestFingerprint::from(*request.fingerprint());
        assert_eq!(computed.fingerprint(), request.fingerprint());
        assert_ne!(computed.exact(), request.exact());
    }
}
