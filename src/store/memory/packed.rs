//! A completed record in one allocation: the claim's local digest, the record's
//! identity (scope and key) and the response (status, allow-listed headers,
//! body), packed into one `Arc<[u8]>` of exactly its length.
//!
//! A retained record then costs its map slot and this one buffer, and a replay
//! touches the slot and this buffer only: the identity check, the digest
//! and the response are read from the same few cache lines. A replay decodes a
//! fresh [`StoredResponse`] whose header values and body share the buffer
//! (`Bytes` slices of it, no copy).
//!
//! Layout:
//!
//! ```text
//! local digest           16 bytes
//! scope length, scope    varint, bytes
//! key length, key        varint, bytes
//! status                 u16, little endian
//! header count           varint
//! per header             varint (name length << 1 | sensitive), name,
//!                        varint value length, value
//! body                   the rest
//! ```
//!
//! A tombstone (a completed record past its retention, see
//! [`MemoryStoreBuilder::with_tombstone`](super::MemoryStoreBuilder::with_tombstone))
//! is the same buffer cut after the key: the digest and the identity, no
//! status, no response. A response always has its status after the key, so
//! the two never read alike.

use crate::fingerprint::LocalDigest;
use crate::store::{RecordKey, StoredResponse};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use std::sync::Arc;

/// Responses with bodies up to this size are packed (copied into the record's
/// buffer). Larger bodies are kept as they are, without a copy.
pub(super) const PACK_BODY_MAX: usize = 1024;

const DIGEST_LEN: usize = 16;

/// Packs `response` with its record's identity and local digest, or returns it
/// back when it is not worth packing (a large body) or cannot be decoded again
/// exactly (a header value that only `unsafe` code could have built).
pub(super) fn pack(
    key: &RecordKey,
    local: LocalDigest,
    response: StoredResponse,
) -> Result<Arc<[u8]>, StoredResponse> {
    let valid = response
        .headers
        .iter()
        .all(|(_, value)| decodes_again(value.as_bytes()));
    if response.body.len() > PACK_BODY_MAX || !valid {
        return Err(response);
    }
    let (scope, id) = (
        key.scope().as_str().as_bytes(),
        key.key().as_str().as_bytes(),
    );
    let headers_len: usize = response
        .headers
        .iter()
        .map(|(name, value)| {
            let (name, value) = (name.as_str().len(), value.len());
            varint_len((name as u64) << 1) + name + varint_len(value as u64) + value
        })
        .sum();
    let len = DIGEST_LEN
        + varint_len(scope.len() as u64)
        + scope.len()
        + varint_len(id.len() as u64)
        + id.len()
        + 2
        + varint_len(response.headers.len() as u64)
        + headers_len
        + response.body.len();
    // Allocated once at its exact length (`RepeatN` is `TrustedLen`), then
    // written in place: no transient buffer between retained ones.
    let mut packed: Arc<[u8]> = std::iter::repeat_n(0, len).collect();
    let buf = Arc::get_mut(&mut packed).expect("a new Arc is unique");
    let mut w = Writer { buf, pos: 0 };
    w.put(&local.to_bytes());
    w.put_bytes(scope);
    w.put_bytes(id);
    w.put(&response.status.as_u16().to_le_bytes());
    w.put_varint(response.headers.len() as u64);
    for (name, value) in &response.headers {
        let name = name.as_str().as_bytes();
        w.put_varint((name.len() as u64) << 1 | u64::from(value.is_sensitive()));
        w.put(name);
        w.put_bytes(value.as_bytes());
    }
    w.put(&response.body);
    debug_assert_eq!(w.pos, len);
    Ok(packed)
}

/// The tombstone of `key`'s record claimed by `local`: its digest and
/// identity only.
pub(super) fn tombstone(key: &RecordKey, local: LocalDigest) -> Arc<[u8]> {
    let (scope, id) = (
        key.scope().as_str().as_bytes(),
        key.key().as_str().as_bytes(),
    );
    let len = DIGEST_LEN
        + varint_len(scope.len() as u64)
        + scope.len()
        + varint_len(id.len() as u64)
        + id.len();
    let mut packed: Arc<[u8]> = std::iter::repeat_n(0, len).collect();
    let buf = Arc::get_mut(&mut packed).expect("a new Arc is unique");
    let mut w = Writer { buf, pos: 0 };
    w.put(&local.to_bytes());
    w.put_bytes(scope);
    w.put_bytes(id);
    debug_assert_eq!(w.pos, len);
    packed
}

/// The tombstone of the completed record `packed`: its first part, copied.
pub(super) fn tombstone_of(packed: &[u8]) -> Arc<[u8]> {
    let mut r = Reader::after_digest(packed);
    r.bytes();
    r.bytes();
    Arc::from(&packed[..r.pos])
}

/// Whether `packed` is a tombstone: nothing after the identity.
pub(super) fn is_tombstone(packed: &[u8]) -> bool {
    let mut r = Reader::after_digest(packed);
    r.bytes();
    r.bytes();
    r.pos == packed.len()
}

/// Whether `HeaderValue::from_bytes` accepts `value` (visible ASCII, obs-text
/// and tab; no other control byte), checked without building one.
fn decodes_again(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| (b >= 0x20 && b != 0x7f) || b == b'\t')
}

/// The local digest of the claim whose response `packed` holds.
pub(super) fn local(packed: &[u8]) -> LocalDigest {
    let mut digest = [0; DIGEST_LEN];
    digest.copy_from_slice(&packed[..DIGEST_LEN]);
    LocalDigest::from_bytes(digest)
}

/// Whether `packed` is the record of `key`.
pub(super) fn is_record_of(packed: &[u8], key: &RecordKey) -> bool {
    let mut r = Reader::after_digest(packed);
    r.bytes() == key.scope().as_str().as_bytes() && r.bytes() == key.key().as_str().as_bytes()
}

/// Whether `packed` belongs to `scope`.
pub(super) fn is_in_scope(packed: &[u8], scope: &str) -> bool {
    scope_of(packed) == scope.as_bytes()
}

/// The scope `packed` belongs to.
pub(super) fn scope_of(packed: &[u8]) -> &[u8] {
    Reader::after_digest(packed).bytes()
}

/// The stored response, its header values and body sharing `packed`.
pub(super) fn unpack(packed: &Arc<[u8]>) -> StoredResponse {
    let mut r = Reader::after_digest(packed);
    r.bytes();
    r.bytes();
    let status = u16::from_le_bytes([r.byte(), r.byte()]);
    let status = StatusCode::from_u16(status).expect("a packed status is valid");
    let count = r.varint() as usize;
    let mut headers = Vec::with_capacity(count);
    let shared = Bytes::from_owner(Packed(packed.clone()));
    for _ in 0..count {
        let tagged = r.varint();
        let name = r.take((tagged >> 1) as usize);
        let name = header_name(name);
        let len = r.varint() as usize;
        let value = shared.slice(r.pos..r.pos + len);
        r.pos += len;
        let mut value =
            HeaderValue::from_maybe_shared(value).expect("a packed header value is valid");
        value.set_sensitive(tagged & 1 == 1);
        headers.push((name, value));
    }
    let body = shared.slice(r.pos..);
    StoredResponse {
        status,
        headers,
        body,
    }
}

/// A packed header name. The ones the layer records by default by constant
/// (parsing one costs more than the rest of the replay's decoding), others parsed.
fn header_name(name: &[u8]) -> HeaderName {
    use http::header::{CONTENT_ENCODING, CONTENT_TYPE, ETAG, LINK, LOCATION};
    match name {
        b"content-type" => CONTENT_TYPE,
        b"content-encoding" => CONTENT_ENCODING,
        b"location" => LOCATION,
        b"etag" => ETAG,
        b"link" => LINK,
        _ => HeaderName::from_bytes(name).expect("a packed header name is valid"),
    }
}

/// The owner of replayed `Bytes` slices: keeps the record's buffer alive.
struct Packed(Arc<[u8]>);

impl AsRef<[u8]> for Packed {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn after_digest(buf: &'a [u8]) -> Self {
        Self {
            buf,
            pos: DIGEST_LEN,
        }
    }

    fn byte(&mut self) -> u8 {
        let b = self.buf[self.pos];
        self.pos += 1;
        b
    }

    fn varint(&mut self) -> u64 {
        let mut value = 0;
        let mut shift = 0;
        loop {
            let b = self.byte();
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return value;
            }
            shift += 7;
        }
    }

    fn take(&mut self, len: usize) -> &'a [u8] {
        let bytes = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        bytes
    }

    fn bytes(&mut self) -> &'a [u8] {
        let len = self.varint() as usize;
        self.take(len)
    }
}

fn varint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }

    fn put_varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.put(&[value as u8 | 0x80]);
            value >>= 7;
        }
        self.put(&[value as u8]);
    }

    fn put_bytes(&mut self, bytes: &[u8]) {
        self.put_varint(bytes.len() as u64);
        self.put(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    const ZERO: LocalDigest = LocalDigest::ZERO;

    fn record(scope: &str, key: &str) -> RecordKey {
        RecordKey::for_test(scope, key)
    }

    #[test]
    fn the_header_value_check_is_the_one_of_the_http_crate() {
        for b in 0..=u8::MAX {
            let value = [b'a', b, b'z'];
            assert_eq!(
                decodes_again(&value),
                HeaderValue::from_bytes(&value).is_ok(),
                "byte {b:#04x}"
            );
        }
    }

    fn roundtrip(key: &RecordKey, response: StoredResponse) {
        let digest = LocalDigest::from_bytes(*b"0123456789abcdef");
        let packed = pack(key, digest, response.clone()).expect("packed");
        let unpacked = unpack(&packed);
        assert_eq!(unpacked, response);
        for ((_, a), (_, b)) in unpacked.headers.iter().zip(&response.headers) {
            assert_eq!(a.is_sensitive(), b.is_sensitive());
            assert_eq!(a.as_bytes(), b.as_bytes());
        }
        assert_eq!(&unpacked.body[..], &response.body[..]);
        assert_eq!(local(&packed), digest);
        assert!(is_record_of(&packed, key));
        assert!(is_in_scope(&packed, key.scope().as_str()));
    }

    #[test]
    fn a_packed_response_round_trips_byte_for_byte() {
        let key = record("acme", "order-0001");
        let mut secret = HeaderValue::from_static("session=abc");
        secret.set_sensitive(true);
        roundtrip(
            &key,
            StoredResponse {
                status: StatusCode::CREATED,
                headers: vec![
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    ),
                    // Repeated names keep their order.
                    (header::SET_COOKIE, HeaderValue::from_static("a=1")),
                    (header::SET_COOKIE, secret),
                    (
                        HeaderName::from_static("x-custom-header"),
                        // Not UTF-8 (obs-text), but a valid header value.
                        HeaderValue::from_bytes(b"caf\xe9 \xff\x80").unwrap(),
                    ),
                    (header::ETAG, HeaderValue::from_static("")),
                    // The names decoded by constant, and one that looks like them.
                    (header::LOCATION, HeaderValue::from_static("/v1/orders/1")),
                    (header::LINK, HeaderValue::from_static("</a>; rel=next")),
                    (
                        HeaderName::from_static("etags"),
                        HeaderValue::from_static("x"),
                    ),
                    (
                        HeaderName::from_static("content-typ"),
                        HeaderValue::from_static("y"),
                    ),
                ],
                body: Bytes::from((0..=255u8).cycle().take(PACK_BODY_MAX).collect::<Vec<_>>()),
            },
        );
    }

    #[test]
    fn empty_and_long_parts_round_trip() {
        // No headers, no body.
        roundtrip(
            &record("s", "12345678"),
            StoredResponse {
                status: StatusCode::NO_CONTENT,
                headers: Vec::new(),
                body: Bytes::new(),
            },
        );
        // Lengths that need several varint bytes; an empty scope.
        let long_scope = "t".repeat(70_000);
        let long_value = HeaderValue::from_bytes("v".repeat(200).as_bytes()).unwrap();
        roundtrip(
            &record(&long_scope, &"k".repeat(128)),
            StoredResponse {
                status: StatusCode::from_u16(599).unwrap(),
                headers: vec![(HeaderName::from_bytes(&[b'h'; 300]).unwrap(), long_value)],
                body: Bytes::from_static(b"{}"),
            },
        );
        roundtrip(
            &record("", "12345678"),
            StoredResponse {
                status: StatusCode::OK,
                headers: Vec::new(),
                body: Bytes::from_static(b"x"),
            },
        );
    }

    #[test]
    fn identity_is_exact() {
        let key = record("acme", "order-0001");
        let response = StoredResponse {
            status: StatusCode::OK,
            headers: Vec::new(),
            body: Bytes::from_static(b"ok"),
        };
        let packed = pack(&key, ZERO, response).unwrap();
        assert!(is_record_of(&packed, &key));
        assert!(!is_record_of(&packed, &record("acm", "eorder-0001")));
        assert!(!is_record_of(&packed, &record("acme", "order-00011")));
        assert!(!is_record_of(&packed, &record("acme", "order-0002")));
        assert!(!is_record_of(&packed, &record("acme2", "order-0001")));
        assert!(is_in_scope(&packed, "acme"));
        assert!(!is_in_scope(&packed, "acm"));
    }

    #[test]
    fn large_bodies_are_not_packed() {
        let response = StoredResponse {
            status: StatusCode::OK,
            headers: Vec::new(),
            body: Bytes::from(vec![0; PACK_BODY_MAX + 1]),
        };
        let back = pack(&record("s", "12345678"), ZERO, response.clone());
        assert_eq!(back.unwrap_err(), response);
    }

    #[test]
    fn a_tombstone_keeps_the_identity_and_digest_only() {
        let key = record("acme", "order-0001");
        let local = LocalDigest::from_bytes([7; 16]);
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: Vec::new(),
            body: Bytes::from_static(b"done"),
        };
        let packed = pack(&key, local, response).unwrap();
        assert!(!is_tombstone(&packed));
        let tomb = tombstone_of(&packed);
        assert_eq!(tomb, tombstone(&key, local));
        assert!(is_tombstone(&tomb));
        assert!(is_record_of(&tomb, &key) && !is_record_of(&tomb, &record("acme", "order-0002")));
        assert_eq!(
            (super::local(&tomb), scope_of(&tomb)),
            (local, &b"acme"[..])
        );
        // The digest, two lengths, the scope and the key: nothing else.
        assert_eq!(tomb.len(), 16 + 1 + 4 + 1 + 10);
    }

    #[test]
    fn the_buffer_has_no_slack() {
        let response = StoredResponse {
            status: StatusCode::CREATED,
            headers: vec![(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body: Bytes::from(vec![b'x'; 100]),
        };
        let packed = pack(&record("acme", "fill-000000000001"), ZERO, response).unwrap();
        // 16 digest + 5 scope + 18 key + 2 status + 1 count + 30 header + 100 body.
        assert_eq!(packed.len(), 172);
    }
}
