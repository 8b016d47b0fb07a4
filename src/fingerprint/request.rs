//! A request's fingerprint as a store receives it: computed only when needed.

use super::{is_json_content_type, with_canonical_json, Fingerprint};
use crate::IdempotencyKey;
use highway::{HighwayHash, HighwayHasher, Key};
use std::fmt;
use std::sync::OnceLock;

/// What a [`Store`](crate::store::Store) compares to tell a retry from key reuse.
///
/// Three digests of one request, each computed on first use and never for a
/// request that does not need it:
///
/// - [`fingerprint`](Self::fingerprint): SHA-256 over the canonical form (RFC
///   8785 canonicalisation, numbers as written), the [`Fingerprint`] a store
///   shared between processes persists and compares.
/// - [`local`](Self::local): a keyed 128-bit digest of the same canonical form
///   under a secret drawn when the process starts, for a store whose records
///   never leave the process. Equal exactly when the fingerprints are equal
///   (but for a chance of 2^-128 per pair), at the cost of the
///   canonicalisation alone.
/// - [`exact`](Self::exact): a keyed digest of the request's exact bytes, which
///   such a store may compare first, so that a byte-identical retry (almost
///   every retry) is never canonicalised.
///
/// ```
/// use http::{HeaderValue, Method};
/// use tower_idempotency::{IdempotencyKey, fingerprint::RequestFingerprint};
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
    local: OnceLock<LocalDigest>,
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
            local: OnceLock::new(),
            exact: OnceLock::new(),
        }
    }

    /// The canonical fingerprint, computed on first use: the value a store
    /// shared between processes persists and compares.
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

    /// A keyed digest of the canonical form [`fingerprint`](Self::fingerprint)
    /// hashes, computed on first use without SHA-256: equal local digests mean
    /// equal fingerprints, and unequal ones unequal fingerprints (but for a
    /// chance of 2^-128 per pair).
    ///
    /// Only comparable within one process (its key is drawn at random when the
    /// process starts): never persist it or send it to another instance. For a
    /// fingerprint computed elsewhere (`From<Fingerprint>`), it is a digest of
    /// that fingerprint, so it equals only the local digests of fingerprints
    /// computed elsewhere, never those of requests given by their parts.
    pub fn local(&self) -> LocalDigest {
        *self.local.get_or_init(|| {
            let mut hasher = HighwayHasher::new(keys().local);
            match &self.request {
                Some(p) => {
                    let parts = p.parts();
                    // Framed by length, not by the separator `Fingerprint`
                    // writes: no two requests share one encoding, even with a
                    // scope that holds the separator.
                    let mut header = [0u8; 1 + 8 * 4];
                    for (len, part) in header[1..].chunks_exact_mut(8).zip(parts) {
                        len.copy_from_slice(&(part.len() as u64).to_le_bytes());
                    }
                    hasher.append(&header);
                    for part in parts {
                        hasher.append(part.as_bytes());
                    }
                    if p.is_json() {
                        with_canonical_json(p.body, |canonical| {
                            hasher.append(canonical.unwrap_or(p.body));
                        });
                    } else {
                        hasher.append(p.body);
                    }
                }
                None => {
                    hasher.append(&[1]);
                    hasher.append(self.fingerprint().as_bytes());
                }
            }
            LocalDigest(hasher.finalize128())
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
            let mut hasher = HighwayHasher::new(keys().exact);
            match &self.request {
                Some(p) => {
                    let parts = p.parts();
                    // The content type decides between canonical JSON and raw bytes.
                    let json = p.is_json();
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

impl Parts<'_> {
    fn parts(&self) -> [&str; 4] {
        [
            self.method.as_str(),
            self.path_and_query,
            self.key.as_str(),
            self.scope,
        ]
    }

    /// Whether the body is canonicalised (JSON) rather than hashed as it is.
    fn is_json(&self) -> bool {
        self.content_type
            .is_some_and(|ct| is_json_content_type(ct.as_bytes()))
    }
}

impl RequestFingerprint<'_> {
    /// Whether [`fingerprint`](Self::fingerprint) has been computed.
    #[cfg(test)]
    pub(crate) fn fingerprint_computed(&self) -> bool {
        self.fingerprint.get().is_some()
    }

    /// Whether [`local`](Self::local) has been computed.
    #[cfg(test)]
    pub(crate) fn local_computed(&self) -> bool {
        self.local.get().is_some()
    }
}

impl From<Fingerprint> for RequestFingerprint<'static> {
    /// A fingerprint computed elsewhere (for example by a store's own tests).
    fn from(fingerprint: Fingerprint) -> Self {
        Self {
            request: None,
            fingerprint: OnceLock::from(fingerprint),
            local: OnceLock::new(),
            exact: OnceLock::new(),
        }
    }
}

impl fmt::Debug for RequestFingerprint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestFingerprint")
            .field("fingerprint", &self.fingerprint.get())
            .field("local", &self.local.get())
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

/// A keyed digest of a request's canonical form; see [`RequestFingerprint::local`].
///
/// 128-bit HighwayHash (a keyed hash its authors designed as a pseudo-random
/// function) under a random key that never leaves the process, as for
/// [`ExactDigest`]: without the key nobody can build a request whose digest
/// equals another's, and by chance two requests share one with probability
/// 2^-128. SHA-256's collision resistance without a key is what a digest
/// compared across processes needs; this one is never compared outside the
/// process that computed it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalDigest([u64; 2]);

impl LocalDigest {
    #[cfg(test)]
    pub(crate) const ZERO: Self = Self([0; 2]);

    /// The digest's bytes, for a store that packs it with its record.
    pub(crate) fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.0[0].to_le_bytes());
        bytes[8..].copy_from_slice(&self.0[1].to_le_bytes());
        bytes
    }

    /// The digest [`to_bytes`](Self::to_bytes) wrote.
    pub(crate) fn from_bytes(bytes: [u8; 16]) -> Self {
        let (low, high) = bytes.split_at(8);
        Self([
            u64::from_le_bytes(low.try_into().expect("8 bytes")),
            u64::from_le_bytes(high.try_into().expect("8 bytes")),
        ])
    }
}

impl fmt::Debug for LocalDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocalDigest(..)")
    }
}

/// The keys of [`RequestFingerprint::exact`] and [`RequestFingerprint::local`],
/// drawn once per process.
struct Keys {
    exact: Key,
    local: Key,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys {
        exact: crate::random::hash_key(),
        local: crate::random::hash_key(),
    })
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

    /// The contract a store relies on when it compares local digests instead
    /// of fingerprints: for requests given by their parts, equal exactly when
    /// the SHA-256 fingerprints are equal.
    #[test]
    fn local_digests_are_equal_exactly_when_fingerprints_are() {
        let json = HeaderValue::from_static("application/json");
        let problem = HeaderValue::from_static("application/problem+json; charset=utf-8");
        let text = HeaderValue::from_static("text/plain");
        let keys = ["order-0001", "order-0002"].map(|k| IdempotencyKey::parse(k.as_bytes()));
        let [Some(k1), Some(k2)] = keys else {
            panic!("keys")
        };
        let bodies: [&[u8]; 9] = [
            br#"{"sku":"A","qty":1}"#,
            b"{ \"qty\": 1, \"sku\": \"\\u0041\" }",
            br#"{"sku":"A","qty":1.0}"#,
            br#"{"sku":"A","qty":2}"#,
            br#"{"a":1,"a":2}"#,
            br#"{"a":1"#,
            b"",
            b"[1,2]",
            b"[ 1 , 2 ]",
        ];
        let mut requests = Vec::new();
        for method in [Method::POST, Method::PUT] {
            for path in ["/v1/orders", "/v1/orders?x=1"] {
                for key in [&k1, &k2] {
                    for scope in ["acme", "globex"] {
                        for ct in [Some(&json), Some(&problem), Some(&text), None] {
                            for body in bodies {
                                requests.push((method.clone(), path, key, scope, ct, body));
                            }
                        }
                    }
                }
            }
        }
        let digests: Vec<_> = requests
            .iter()
            .map(|(m, p, k, s, ct, b)| {
                let r = RequestFingerprint::new(m, p, k, s, *ct, b);
                (*r.fingerprint(), r.local())
            })
            .collect();
        let mut equal = 0;
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_eq!(a.0 == b.0, a.1 == b.1, "{a:?} {b:?}");
                equal += usize::from(a.0 == b.0);
            }
        }
        // Canonically equal bodies, and JSON or not with the same canonical
        // bytes, are among the pairs: the property is not vacuous.
        assert!(equal > requests.len(), "{equal} equal pairs");
        // A digest of the request, not a constant: recomputed, the same.
        let (m, p, k, s, ct, b) = &requests[0];
        assert_eq!(
            RequestFingerprint::new(m, p, k, s, *ct, b).local(),
            digests[0].1
        );
    }

    #[test]
    fn local_digest_of_a_computed_fingerprint_matches_only_computed_ones() {
        let key = IdempotencyKey::parse(b"order-0001").unwrap();
        let json = HeaderValue::from_static("application/json");
        let request = |body: &'static [u8]| {
            RequestFingerprint::new(&Method::POST, "/a", &key, "acme", Some(&json), body)
        };
        let parts = request(br#"{"a":1,"b":2}"#);
        let computed = RequestFingerprint::from(*parts.fingerprint());
        let reordered = RequestFingerprint::from(*request(br#"{"b":2,"a":1}"#).fingerprint());
        let other = RequestFingerprint::from(*request(br#"{"b":2,"a":2}"#).fingerprint());
        assert_ne!(computed.local(), parts.local());
        assert_eq!(computed.local(), reordered.local());
        assert_ne!(computed.local(), other.local());
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
