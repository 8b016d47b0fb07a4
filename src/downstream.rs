//! Keys to pass down the chain: what a claimed handler sends as the
//! idempotency key of its own calls (a card processor's `Idempotency-Key`),
//! so that a retry which runs the handler again repeats none of them.
//!
//! The layer and the engine can run a handler twice for one key: in plain
//! mode, a process killed after the handler charged and before the record
//! was written leaves nothing that says the charge happened, and the retry
//! runs again. A processor that honours idempotency keys makes the second
//! charge a replay of the first, if both calls carry the same key. The
//! handler cannot use the client's key for that (it belongs to the client,
//! who chooses it, and is only unique within a tenant), nor a key of its own
//! making (a fresh one per attempt is exactly what must not happen): it uses
//! [`DownstreamKeys::key_for`], the same on every attempt, every instance
//! and every store, for each `(scope, idempotency key, name)`.
//!
//! ```
//! use tower_idempotency::{IdempotencyKey, Scope, downstream::DownstreamKeys};
//!
//! let keys = DownstreamKeys::new(Scope::new("acme"), IdempotencyKey::parse(b"order-0001").unwrap());
//! let charge = keys.key_for("card-processor");
//! assert_eq!(charge, keys.key_for("card-processor")); // every attempt
//! assert_ne!(charge, keys.key_for("email"));          // one per call
//! assert!(charge.as_str().len() <= 64);               // Adyen's limit, Stripe's is 255
//! ```
//!
//! The layer puts one [`DownstreamKeys`] into the request extensions of
//! every claimed request (`Extension<DownstreamKeys>` in axum), and the
//! engine's [`RunContext::downstream_keys`](crate::engine::RunContext::downstream_keys)
//! gives one to every operation. `docs/idempotency.md` ("Carrying the key
//! down the chain") says what they guarantee and what they cannot.

use crate::config::ConfigError;
use crate::{IdempotencyKey, Scope};
use hmac::{Hmac, Mac};
use sha2::digest::Update;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;

/// Separates these hashes from every other use of SHA-256 with the same
/// bytes; a new derivation takes a new version here and in the prefix.
const DOMAIN: &[u8] = b"tower-idempotency/downstream-key/v1";
/// Hex digits of the digest kept: 192 bits, so that no two inputs share a
/// key (a collision takes some 2^96 tries) and the key stays short.
const HEX_DIGITS: usize = 48;
/// The shortest secret [`DownstreamSecret::new`] accepts, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// The downstream keys of one `(scope, idempotency key)`: one per name, see
/// [`key_for`](Self::key_for) and the [module documentation](self).
#[derive(Clone)]
pub struct DownstreamKeys {
    scope: Scope,
    key: IdempotencyKey,
    secret: Option<DownstreamSecret>,
}

impl DownstreamKeys {
    /// The downstream keys of `key` in `scope`, as a layer or engine without
    /// a [`DownstreamSecret`] derives them: to compute them outside a run
    /// (a reconciliation job, a support tool).
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self {
            scope,
            key,
            secret: None,
        }
    }

    /// As a layer or engine with `secret` derives them.
    pub fn with_secret(mut self, secret: DownstreamSecret) -> Self {
        self.secret = Some(secret);
        self
    }

    pub(crate) fn derived(
        scope: &Scope,
        key: &IdempotencyKey,
        secret: Option<&DownstreamSecret>,
    ) -> Self {
        Self {
            scope: scope.clone(),
            key: key.clone(),
            secret: secret.cloned(),
        }
    }

    /// The key to send as the idempotency key of the call named `name`
    /// (`"card-processor"`, `"refund"`, `"ledger"`): one name per distinct
    /// call the handler makes, the same name for the same call on every
    /// attempt.
    ///
    /// Deterministic in `(scope, key, name)` and the secret, and nothing
    /// else: identical on every attempt, every instance and every store, so
    /// a retry that runs the handler again (in plain mode after a crash, on
    /// any store) sends the processor the key the first attempt sent. Each
    /// field is length-prefixed before it is hashed, so no two different
    /// triples share a key, and a client, who chooses only its own key,
    /// cannot make its downstream key equal another tenant's.
    ///
    /// Its shape: `dk1-` (or `dk1h-` with a secret) and 48 lowercase hex
    /// digits, 52 or 53 characters of `[a-z0-9-]`, which processors accept as
    /// their own idempotency key (Stripe up to 255 characters, Adyen 64,
    /// PayPal's `PayPal-Request-Id` 108).
    pub fn key_for(&self, name: &str) -> DownstreamKey {
        let fields = [self.scope.as_str(), self.key.as_str(), name];
        let (prefix, digest) = match &self.secret {
            None => {
                let mut hash = Sha256::new();
                absorb(&mut hash, fields);
                ("dk1-", hash.finalize())
            }
            Some(secret) => ("dk1h-", secret.mac(fields)),
        };
        let mut out = String::with_capacity(prefix.len() + HEX_DIGITS);
        out.push_str(prefix);
        for byte in &digest[..HEX_DIGITS / 2] {
            out.push(hex_digit(byte >> 4));
            out.push(hex_digit(byte & 0xf));
        }
        DownstreamKey(out)
    }

    /// The scope these keys belong to.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The client's idempotency key these keys derive from.
    pub fn idempotency_key(&self) -> &IdempotencyKey {
        &self.key
    }
}

impl fmt::Debug for DownstreamKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DownstreamKeys")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("keyed", &self.secret.is_some())
            .finish()
    }
}

/// The domain, then each field, each preceded by its length (8 bytes, big
/// endian): `("ab", "c")` and `("a", "bc")` hash different bytes. The same
/// bytes go into the plain hash and the keyed one.
fn absorb(hash: &mut impl Update, fields: [&str; 3]) {
    let mut field = |bytes: &[u8]| {
        hash.update(&(bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    field(DOMAIN);
    for value in fields {
        field(value.as_bytes());
    }
}

fn hex_digit(nibble: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(nibble)])
}

/// One downstream key: `dk1-` or `dk1h-` and 48 lowercase hex digits.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as a header value (it is always a valid one).
    pub fn to_header_value(&self) -> http::HeaderValue {
        http::HeaderValue::from_str(&self.0).expect("ASCII letters, digits and '-'")
    }
}

impl fmt::Debug for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DownstreamKey").field(&self.0).finish()
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DownstreamKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<DownstreamKey> for String {
    fn from(key: DownstreamKey) -> Self {
        key.0
    }
}

/// A secret that keys the derivation of downstream keys (HMAC-SHA-256
/// instead of SHA-256), given to
/// [`IdempotencyLayer::with_downstream_secret`](crate::IdempotencyLayer::with_downstream_secret)
/// and [`Engine::with_downstream_secret`](crate::engine::Engine::with_downstream_secret).
///
/// Without one, anyone who knows a request's scope, key and a call's name
/// can compute its downstream key; with one, only holders of the secret can.
/// That matters when several services (or deployments) send the same
/// processor account keys derived from the same scopes and names: give each
/// its own secret, and a client of one can never choose a key whose
/// downstream key is one the other already used. Every instance that may
/// run a key must have the same secret, or their retries send different
/// keys. Changing it changes every key's downstream keys: see
/// `docs/idempotency.md` ("Rotating the secret") before you do.
///
/// It is not shown by `Debug`.
#[derive(Clone)]
pub struct DownstreamSecret(Arc<HmacSha256>);

impl DownstreamSecret {
    /// A secret of at least [`MIN_SECRET_LEN`] bytes (32 random bytes
    /// recommended).
    ///
    /// A shorter one is a configuration mistake to see at startup: it is
    /// refused with [`ConfigError::ShortSecret`], which says its length and
    /// never its bytes.
    ///
    /// ```
    /// use tower_idempotency::downstream::DownstreamSecret;
    ///
    /// # let bytes_from_the_vault = [7u8; 32];
    /// let secret = DownstreamSecret::new(bytes_from_the_vault)?;
    /// # let _ = secret;
    /// assert!(DownstreamSecret::new("short").is_err());
    /// # Ok::<(), tower_idempotency::ConfigError>(())
    /// ```
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, ConfigError> {
        let secret = secret.as_ref();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ConfigError::ShortSecret {
                len: secret.len(),
                min: MIN_SECRET_LEN,
            });
        }
        Ok(Self(Arc::new(keyed(secret))))
    }

    /// The MAC of `fields`, as [`absorb`] lays them out.
    fn mac(&self, fields: [&str; 3]) -> sha2::digest::Output<Sha256> {
        let mut mac = (*self.0).clone();
        absorb(&mut mac, fields);
        mac.finalize().into_bytes()
    }
}

impl fmt::Debug for DownstreamSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DownstreamSecret(..)")
    }
}

/// HMAC-SHA-256 (RFC 2104) keyed with `secret`: its inner and outer pads
/// are absorbed once here, so each downstream key costs the two hashes of
/// its message (a clone of this state, then the fields).
fn keyed(secret: &[u8]) -> HmacSha256 {
    // A key of any length is valid for HMAC (a longer one than the block is
    // hashed first), so this never fails.
    <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes a key of any length")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(scope: &str, key: &str) -> DownstreamKeys {
        DownstreamKeys::new(
            Scope::new(scope),
            IdempotencyKey::parse(key.as_bytes()).expect("a valid key"),
        )
    }

    fn secret() -> DownstreamSecret {
        DownstreamSecret::new(b"0123456789abcdef0123456789abcdef").expect("32 bytes")
    }

    /// The exact output: a change that would make two versions derive
    /// different keys (and so charge twice across an upgrade) fails here.
    /// The vectors were computed apart from this code, with Python's
    /// `hashlib` and `hmac` over the bytes `absorb` documents.
    #[test]
    fn the_derivation_is_pinned_by_vectors() {
        let order = keys("acme", "order-0001");
        assert_eq!(
            order.key_for("card-processor").as_str(),
            "dk1-302516cb4e90a995b9d8887516ed397c8edda792ab6ffbda"
        );
        assert_eq!(
            order
                .clone()
                .with_secret(secret())
                .key_for("card-processor")
                .as_str(),
            "dk1h-e5712926a53e503fe65c42fe28cbcbece0ca96ef2354f8f9"
        );
    }

    #[test]
    fn the_same_inputs_give_the_same_key_whoever_derives_it() {
        let a = keys("acme", "order-0001").key_for("card-processor");
        // Another instance: built afresh, from parsed (quoted) header bytes.
        let scope = Scope::new(String::from("acme"));
        let key = IdempotencyKey::parse(b"\"order-0001\"").unwrap();
        let b = DownstreamKeys::derived(&scope, &key, None).key_for("card-processor");
        assert_eq!(a, b);
        let keyed = |s| DownstreamKeys::derived(&scope, &key, Some(s)).key_for("card-processor");
        assert_eq!(keyed(&secret()), keyed(&secret()));
    }

    #[test]
    fn names_scopes_keys_and_secrets_each_change_the_key() {
        let base = keys("acme", "order-0001");
        let all = [
            base.key_for("card-processor"),
            base.key_for("card-processor2"),
            base.key_for(""),
            keys("acme2", "order-0001").key_for("card-processor"),
            keys("acme", "order-0002").key_for("card-processor"),
            base.clone().with_secret(secret()).key_for("card-processor"),
            base.clone()
                .with_secret(DownstreamSecret::new(b"another secret of 32 bytes......").unwrap())
                .key_for("card-processor"),
        ];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "{all:?}");
    }

    /// Joining the fields would make these pairs one input; length
    /// prefixes keep them apart.
    #[test]
    fn field_boundaries_are_unambiguous() {
        let pairs = [
            (("acme", "x-order-0001"), "n", ("acmex", "-order-0001"), "n"),
            (("acme", "order-0001"), "ab", ("acme", "order-0001a"), "b"),
            (("ac", "me-order-01"), "n", ("acme", "-order-01"), "n"),
        ];
        for ((s1, k1), n1, (s2, k2), n2) in pairs {
            assert_ne!(keys(s1, k1).key_for(n1), keys(s2, k2).key_for(n2));
        }
        // A scope that embeds what would be a separator and a length.
        let tricky = format!("acme{}", char::from(0));
        assert_ne!(
            keys(&tricky, "order-0001").key_for("n"),
            keys("acme", "order-0001").key_for("n")
        );
    }

    #[test]
    fn the_shape_fits_every_processor_and_is_not_the_clients_key() {
        let long_scope = "s".repeat(10_000);
        for k in [
            keys("acme", "order-0001"),
            keys(&long_scope, &"k".repeat(128)),
            keys("acme", "order-0001").with_secret(secret()),
        ] {
            for name in ["card-processor", "", &"n".repeat(1000)] {
                let key = k.key_for(name);
                let s = key.as_str();
                assert!(s.len() <= 64, "{s}");
                assert!(
                    s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                    "{s}"
                );
                assert!(!s.contains(k.idempotency_key().as_str()));
                assert_eq!(key.to_header_value(), s);
            }
        }
    }

    /// A client of another tenant choosing its key freely: none of a
    /// thousand tries lands on acme's downstream key (a match would take a
    /// second preimage of SHA-256 truncated to 192 bits).
    #[test]
    fn another_tenant_cannot_choose_a_key_that_lands_on_this_one() {
        let target = keys("acme", "order-0001").key_for("card-processor");
        for i in 0..1000 {
            let attempt = keys("mallory", &format!("order-{i:04}")).key_for("card-processor");
            assert_ne!(attempt, target);
        }
        // Its own key equal to acme's, or acme's downstream key as its key.
        assert_ne!(
            keys("mallory", "order-0001").key_for("card-processor"),
            target
        );
        assert_ne!(
            keys("mallory", target.as_str()).key_for("card-processor"),
            target
        );
    }

    /// RFC 4231, test cases 1, 2, 6 and 7 (6 and 7: a key longer than the
    /// block, hashed first), through the keyed state a secret holds.
    #[test]
    fn hmac_matches_rfc_4231() {
        let cases: [(&[u8], &[u8], &str); 4] = [
            (
                &[0x0b; 20],
                b"Hi There",
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe",
                b"what do ya want for nothing?",
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                &[0xaa; 131],
                b"This is a test using a larger than block-size key and a larger than block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (key, data, expected) in cases {
            let mut mac = keyed(key);
            Mac::update(&mut mac, data);
            let hex: String = mac
                .finalize()
                .into_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(hex, expected);
        }
    }

    #[test]
    fn a_short_secret_is_an_error_that_does_not_show_it() {
        for short in [&b""[..], b"short", &[b's'; MIN_SECRET_LEN - 1]] {
            let refused = DownstreamSecret::new(short).map(|_| ());
            let expected = ConfigError::ShortSecret {
                len: short.len(),
                min: MIN_SECRET_LEN,
            };
            assert_eq!(refused, Err(expected));
        }
        let shown = DownstreamSecret::new("sesame").unwrap_err().to_string();
        assert!(!shown.contains("sesame"), "{shown}");
        assert!(DownstreamSecret::new([0u8; MIN_SECRET_LEN]).is_ok());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let shown = format!("{:?}", keys("acme", "order-0001").with_secret(secret()));
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert_eq!(format!("{:?}", secret()), "DownstreamSecret(..)");
    }
}
