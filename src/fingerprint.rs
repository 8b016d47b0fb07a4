//! Request fingerprints: SHA-256 over the request line, key, scope and the
//! RFC 8785 (JCS) canonical form of JSON bodies.

use crate::IdempotencyKey;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;

/// SHA-256 digest identifying one logical request.
///
/// Two requests with the same fingerprint are the same operation: same method,
/// path and query, key, scope, and body — where JSON bodies are compared in their
/// RFC 8785 canonical form, so key order and whitespace do not matter.
///
/// ```
/// use http::{HeaderValue, Method};
/// use tower_idempotency::{Fingerprint, IdempotencyKey};
///
/// let key = IdempotencyKey::parse(b"order-0001").unwrap();
/// let json = HeaderValue::from_static("application/json");
/// let a = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "acme", Some(&json),
///     br#"{"sku":"A","qty":1}"#);
/// let b = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "acme", Some(&json),
///     b"{ \"qty\": 1.0, \"sku\": \"A\" }");
/// assert_eq!(a, b);
/// let other_scope = Fingerprint::compute(&Method::POST, "/v1/orders", &key, "globex",
///     Some(&json), br#"{"sku":"A","qty":1}"#);
/// assert_ne!(a, other_scope);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Computes the fingerprint of a request.
    ///
    /// JSON bodies (`application/json`, `application/*+json`) are canonicalised per
    /// RFC 8785; other bodies, and JSON that fails to parse (invalid, nested deeper
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
        let canonical = content_type
            .filter(|ct| is_json_content_type(ct.as_bytes()))
            .and_then(|_| canonicalize_json(body).ok());
        hasher.update(canonical.as_deref().unwrap_or(body));
        Self(hasher.finalize().into())
    }

    /// The digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
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
    let essence = value.split(|&b| b == b';').next().unwrap_or_default();
    let essence = essence.trim_ascii().to_ascii_lowercase();
    match essence.strip_prefix(b"application/") {
        Some(subtype) => subtype == b"json" || subtype.ends_with(b"+json"),
        None => false,
    }
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

/// Serialises a JSON text in its RFC 8785 (JCS) canonical form.
///
/// Objects are sorted by the UTF-16 code units of their keys, whitespace is
/// dropped, numbers use the ECMAScript `Number.prototype.toString` form of their
/// IEEE 754 double value, and strings use the minimal JSON escapes.
/// Duplicate object keys are an error rather than last-wins, so a fingerprint
/// never hides a value the handler might read. Nesting is bounded at 128 levels
/// by the parser, so hostile input cannot overflow the stack.
///
/// ```
/// use tower_idempotency::fingerprint::canonicalize_json;
///
/// let out = canonicalize_json(br#"{ "b": [1e2, 0.5, -0], "a": "\u00e9" }"#).unwrap();
/// assert_eq!(out, "{\"a\":\"é\",\"b\":[100,0.5,0]}".as_bytes());
/// assert!(canonicalize_json(br#"{"a":1,"a":2}"#).is_err());
/// ```
pub fn canonicalize_json(input: &[u8]) -> Result<Vec<u8>, CanonicalizeError> {
    let mut buffers = Buffers {
        out: Vec::with_capacity(input.len()),
        scratch: Vec::new(),
    };
    // The common case in one pass over the bytes; anything unusual (escaped
    // keys, surrogate escapes, long or out-of-range numbers, duplicate keys,
    // deep nesting, any syntax error) is left to the serde_json path below,
    // which decides it exactly as before.
    let mut fast = FastCanonical {
        input,
        at: 0,
        buf: &mut buffers,
        members: Vec::new(),
    };
    if fast.document().is_some() {
        return Ok(buffers.out);
    }
    buffers.out.clear();
    canonicalize_with_serde(input, buffers)
}

/// The general path: serde_json parses, [`CanonicalValue`] writes.
fn canonicalize_with_serde(
    input: &[u8],
    mut buffers: Buffers,
) -> Result<Vec<u8>, CanonicalizeError> {
    let mut de = serde_json::Deserializer::from_slice(input);
    CanonicalValue { buf: &mut buffers }
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| CanonicalizeError(e.to_string()))?;
    Ok(buffers.out)
}

/// The canonical output, and a scratch buffer reused by every object to
/// reorder its members (no allocation per object).
struct Buffers {
    out: Vec<u8>,
    scratch: Vec<u8>,
}

/// A single-pass canonicaliser for the JSON most requests carry. Every method
/// returns `None` ("not handled here") instead of an error: the caller then
/// runs the serde_json path, so this one only has to be right on what it
/// accepts, and it accepts a strict subset of what serde_json accepts.
struct FastCanonical<'a, 'b> {
    input: &'a [u8],
    at: usize,
    buf: &'b mut Buffers,
    /// Members of the objects being written (a stack shared by nested objects):
    /// the key (valid UTF-8, no escapes), whether it is ASCII, and where its
    /// value sits in `buf.out`.
    members: Vec<(&'a [u8], bool, usize, usize)>,
}

/// Deeper documents go to the serde_json path (which allows 128 levels).
const FAST_MAX_DEPTH: usize = 64;

impl<'a> FastCanonical<'a, '_> {
    fn document(&mut self) -> Option<()> {
        self.value(0)?;
        self.skip_whitespace();
        (self.at == self.input.len()).then_some(())
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.input.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.input.get(self.at).copied()
    }

    fn literal(&mut self, text: &[u8]) -> Option<()> {
        let end = self.at + text.len();
        (self.input.get(self.at..end)? == text).then_some(())?;
        self.at = end;
        self.buf.out.extend_from_slice(text);
        Some(())
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => {
                let start = self.at;
                match self.string()? {
                    // No escape in the source: nothing to escape either; the
                    // token, quotes included, is its own canonical form.
                    Decoded::Raw(..) => self.buf.out.extend_from_slice(&self.input[start..self.at]),
                    Decoded::Owned(text) => write_json_string(&mut self.buf.out, &text),
                }
                Some(())
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth > FAST_MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.buf.out.push(b'[');
        if self.peek()? == b']' {
            self.at += 1;
            self.buf.out.push(b']');
            return Some(());
        }
        loop {
            self.value(depth)?;
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.buf.out.push(b',');
                }
                b']' => {
                    self.at += 1;
                    self.buf.out.push(b']');
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<()> {
        if depth > FAST_MAX_DEPTH {
            return None;
        }
        self.at += 1;
        let start = self.buf.out.len();
        let first = self.members.len();
        if self.peek()? == b'}' {
            self.at += 1;
            self.buf.out.extend_from_slice(b"{}");
            return Some(());
        }
        // Members are written in arrival order as `"key":value`, then
        // reordered only if their keys are not sorted already.
        self.buf.out.push(b'{');
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let key_start = self.at;
            // Keys with escapes are rare: the serde_json path handles them.
            let Decoded::Raw(key, ascii) = self.string()? else {
                return None;
            };
            let key_end = self.at;
            if self.peek()? != b':' {
                return None;
            }
            self.at += 1;
            let from = self.buf.out.len();
            self.buf
                .out
                .extend_from_slice(&self.input[key_start..key_end]);
            self.buf.out.push(b':');
            self.value(depth)?;
            self.members.push((key, ascii, from, self.buf.out.len()));
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.buf.out.push(b',');
                }
                b'}' => {
                    self.at += 1;
                    break;
                }
                _ => return None,
            }
        }
        self.buf.out.push(b'}');
        let order = |a: &(&[u8], bool, usize, usize), b: &(&[u8], bool, usize, usize)| {
            if a.1 && b.1 {
                a.0.cmp(b.0)
            } else {
                match (std::str::from_utf8(a.0), std::str::from_utf8(b.0)) {
                    (Ok(x), Ok(y)) => cmp_utf16(x, y),
                    _ => a.0.cmp(b.0), // unreachable: keys were validated
                }
            }
        };
        let members = &mut self.members[first..];
        // Strictly increasing: sorted, and no duplicate.
        if !members
            .windows(2)
            .all(|w| order(&w[0], &w[1]) == Ordering::Less)
        {
            members.sort_unstable_by(order);
            if members.windows(2).any(|w| w[0].0 == w[1].0) {
                return None; // duplicate key: an error, reported by the serde_json path
            }
            let Buffers { out, scratch } = &mut *self.buf;
            scratch.clear();
            scratch.extend_from_slice(&out[start..]);
            out.truncate(start);
            out.push(b'{');
            for (i, (_, _, from, to)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&scratch[from - start..to - start]);
            }
            out.push(b'}');
        }
        self.members.truncate(first);
        Some(())
    }

    /// A string token; `Raw` (with whether it is ASCII) when it has no escape.
    fn string(&mut self) -> Option<Decoded<'a>> {
        let input = self.input;
        let begin = self.at + 1;
        let mut i = begin;
        let mut high = 0u8;
        while let Some(&b) = input.get(i) {
            if b == b'"' || b == b'\\' || b < 0x20 {
                break;
            }
            high |= b;
            i += 1;
        }
        match *input.get(i)? {
            b'"' => {
                let raw = &input[begin..i];
                let ascii = high < 0x80;
                if !ascii {
                    std::str::from_utf8(raw).ok()?;
                }
                self.at = i + 1;
                return Some(Decoded::Raw(raw, ascii));
            }
            b'\\' => {}
            _ => return None,
        }
        let mut text = String::from(std::str::from_utf8(&input[begin..i]).ok()?);
        loop {
            let run_start = i;
            while let Some(&b) = input.get(i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                i += 1;
            }
            text.push_str(std::str::from_utf8(&input[run_start..i]).ok()?);
            match *input.get(i)? {
                b'"' => {
                    self.at = i + 1;
                    return Some(Decoded::Owned(text));
                }
                b'\\' => {
                    let c = match *input.get(i + 1)? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = std::str::from_utf8(input.get(i + 2..i + 6)?).ok()?;
                            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                                return None;
                            }
                            // Surrogates (pairs or lone) go to the serde_json path.
                            char::from_u32(u32::from_str_radix(hex, 16).ok()?)?
                        }
                        _ => return None,
                    };
                    text.push(c);
                    i += if input[i + 1] == b'u' { 6 } else { 2 };
                }
                _ => return None,
            }
        }
    }

    fn number(&mut self) -> Option<()> {
        let input = self.input;
        let begin = self.at;
        let mut i = begin;
        let negative = input[i] == b'-';
        if negative {
            i += 1;
        }
        // Significant digits (leading zeros dropped, at most 18 kept) and the
        // decimal exponent of the last one kept.
        let mut significand = 0u64;
        let mut kept = 0usize;
        let mut dropped = 0i32; // integer digits past the 18 kept
        let mut exponent = 0i32;
        let int_start = i;
        while let Some(&b) = input.get(i).filter(|b| b.is_ascii_digit()) {
            if significand == 0 && b == b'0' {
                // a leading zero: not significant
            } else if kept < 18 {
                significand = significand * 10 + u64::from(b - b'0');
                kept += 1;
            } else {
                dropped += 1;
            }
            i += 1;
        }
        let int_len = i - int_start;
        // JSON: at least one digit, and no leading zero before another digit.
        if int_len == 0 || (int_len > 1 && input[int_start] == b'0') {
            return None;
        }
        let mut integral = true;
        if input.get(i) == Some(&b'.') {
            i += 1;
            let frac_start = i;
            while let Some(&b) = input.get(i).filter(|b| b.is_ascii_digit()) {
                if significand == 0 && b == b'0' {
                    exponent -= 1;
                } else if kept < 18 {
                    significand = significand * 10 + u64::from(b - b'0');
                    kept += 1;
                    exponent -= 1;
                } else {
                    kept += 1; // more than 18 digits: the exact path below
                }
                i += 1;
            }
            if i == frac_start {
                return None;
            }
            integral = false;
        }
        if let Some(b'e' | b'E') = input.get(i) {
            i += 1;
            let exp_negative = match input.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let exp_start = i;
            let mut e = 0i32;
            while let Some(&b) = input.get(i).filter(|b| b.is_ascii_digit()) {
                e = e.saturating_mul(10).saturating_add(i32::from(b - b'0'));
                i += 1;
            }
            if i == exp_start {
                return None;
            }
            exponent = exponent.saturating_add(if exp_negative { -e } else { e });
            integral = false;
        }
        self.at = i;
        let out = &mut self.buf.out;
        if integral {
            // Up to 18 digits fits u64 (and i64 when negative), as serde_json reads it.
            if int_len > 18 {
                return None;
            }
            if int_len <= 15 && significand != 0 {
                // Below 2^53 and without leading zeros: the source is canonical.
                out.extend_from_slice(&input[begin..i]);
            } else {
                write_integer_or_double(out, significand, negative);
            }
            return Some(());
        }
        if significand == 0 && kept == 0 {
            // Any spelling of zero (0.0, -0e5): ECMAScript prints "0".
            out.push(b'0');
            return Some(());
        }
        // A decimal of at most 15 significant digits well inside the normal
        // range is the unique shortest form of the double nearest to it (see
        // `short_decimal`): its digits are the canonical ones.
        let exponent = exponent.saturating_add(dropped);
        if kept <= 15 && dropped == 0 {
            let mut int_buf = [0u8; 20];
            let digits = itoa_u64(significand, &mut int_buf);
            let trailing = digits.iter().rev().take_while(|&&b| b == b'0').count();
            let digits = &digits[..digits.len() - trailing];
            // Scientific exponent of the first digit.
            // Saturating: the exponent may already sit at i32's bounds (1e4007379511).
            let first = exponent
                .saturating_add((digits.len() + trailing) as i32)
                .saturating_sub(1);
            if (-290..=290).contains(&first) {
                // A plain decimal with no exponent and no trailing zero that
                // ECMAScript also prints in plain notation is already canonical.
                let plain = !input[begin..i].contains(&b'e')
                    && !input[begin..i].contains(&b'E')
                    && input[i - 1] != b'0'
                    && (-6..=20).contains(&first);
                if plain {
                    out.extend_from_slice(&input[begin..i]);
                    return Some(());
                }
                if negative {
                    out.push(b'-');
                }
                write_es6_digits(out, digits, first);
                return Some(());
            }
        }
        // Anything else: correctly rounded, as serde_json's `float_roundtrip`.
        let text = std::str::from_utf8(&input[begin..i]).ok()?;
        let v: f64 = text.parse().ok()?;
        if !v.is_finite() {
            return None;
        }
        write_es6_number(out, v);
        Some(())
    }
}

enum Decoded<'a> {
    /// The bytes between the quotes (valid UTF-8), and whether they are ASCII.
    Raw(&'a [u8], bool),
    Owned(String),
}

/// Writes one JSON value in canonical form to `buf.out`.
struct CanonicalValue<'a> {
    buf: &'a mut Buffers,
}

impl<'de> DeserializeSeed<'de> for CanonicalValue<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CanonicalValue<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.buf.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.buf
            .out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        write_integer_or_double(&mut self.buf.out, v.unsigned_abs(), v < 0);
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write_integer_or_double(&mut self.buf.out, v, false);
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        write_es6_number(&mut self.buf.out, v);
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        write_json_string(&mut self.buf.out, v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.buf.out.push(b'[');
        let mut first = true;
        loop {
            let mark = self.buf.out.len();
            if !first {
                self.buf.out.push(b',');
            }
            if seq
                .next_element_seed(CanonicalValue {
                    buf: &mut *self.buf,
                })?
                .is_none()
            {
                self.buf.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.buf.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Values are written in arrival order after `start`, then the region is
        // rewritten in key order; this avoids an allocation per member.
        let start = self.buf.out.len();
        let mut members: Vec<(Cow<'de, str>, usize, usize)> = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let from = self.buf.out.len();
            map.next_value_seed(CanonicalValue {
                buf: &mut *self.buf,
            })?;
            members.push((key, from, self.buf.out.len()));
        }
        members.sort_unstable_by(|a, b| cmp_utf16(&a.0, &b.0));
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(de::Error::custom("duplicate object key"));
        }
        // Nested objects finished using the scratch buffer before this one.
        let Buffers { out, scratch } = &mut *self.buf;
        scratch.clear();
        scratch.extend_from_slice(&out[start..]);
        out.truncate(start);
        out.reserve(scratch.len() + members.len() * 8);
        out.push(b'{');
        for (i, (key, from, to)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json_string(out, key);
            out.push(b':');
            out.extend_from_slice(&scratch[from - start..to - start]);
        }
        out.push(b'}');
        Ok(())
    }
}

/// Deserialises an object key, borrowing from the input when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// Orders strings by UTF-16 code units, as RFC 8785 section 3.2.3 requires.
///
/// UTF-8 byte order is code point order, and UTF-16 order differs from it only
/// between a character in U+E000..=U+FFFF and a supplementary one (whose
/// surrogates D800..DFFF come first), so only the first differing characters
/// are decoded.
fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let Some(i) = ab.iter().zip(bb).position(|(x, y)| x != y) else {
        return ab.len().cmp(&bb.len());
    };
    // The common prefix ends inside (or at the start of) the same character in
    // both strings, so this boundary is one in both.
    let mut at = i;
    while !a.is_char_boundary(at) {
        at -= 1;
    }
    let first = |s: &str| s[at..].chars().next().map_or(0, u32::from);
    let utf16_rank = |c: u32| match c {
        0..=0xD7FF => (0, c),
        0x10000.. => (1, c),
        _ => (2, c),
    };
    utf16_rank(first(a)).cmp(&utf16_rank(first(b)))
}

/// JCS string escaping (the same as serde_json's): `"`, `\\`, and control
/// characters, with the short forms \b \t \n \f \r and lowercase \u00xx
/// otherwise; everything else is copied as is.
fn write_json_string(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Nearly every string needs no escape: one vectorisable pass, one copy.
    if bytes.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut copied = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0C => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0..=0x1F => b'u',
            _ => continue,
        };
        out.extend_from_slice(&bytes[copied..i]);
        copied = i + 1;
        out.push(b'\\');
        out.push(short);
        if short == b'u' {
            out.extend_from_slice(&[
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xF)],
            ]);
        }
    }
    out.extend_from_slice(&bytes[copied..]);
    out.push(b'"');
}

/// Integers up to 2^53 are exact doubles and print as plain digits; larger ones
/// are rounded to a double first, as ECMAScript would.
fn write_integer_or_double(out: &mut Vec<u8>, magnitude: u64, negative: bool) {
    const MAX_SAFE: u64 = 1 << 53;
    if magnitude <= MAX_SAFE {
        if negative && magnitude != 0 {
            out.push(b'-');
        }
        out.extend_from_slice(itoa_u64(magnitude, &mut [0u8; 20]));
    } else {
        let v = magnitude as f64;
        write_es6_number(out, if negative { -v } else { v });
    }
}

fn itoa_u64(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// Serialises a finite double per ECMAScript `Number.prototype.toString`.
pub(crate) fn write_es6_number(out: &mut Vec<u8>, v: f64) {
    if v == 0.0 {
        out.push(b'0');
        return;
    }
    if v < 0.0 {
        out.push(b'-');
    }
    // At most 17 significant digits: kept on the stack.
    let mut digit_buf = [0u8; 24];
    let mut int_buf = [0u8; 20];
    let even;
    let (mut digits, exponent) = match short_decimal(v.abs()) {
        Some((n, fraction_digits)) => {
            let d = itoa_u64(n, &mut int_buf);
            let exponent = d.len() as i32 - 1 - fraction_digits;
            let significant = d.len() - d.iter().rev().take_while(|&&b| b == b'0').count();
            (&d[..significant], exponent)
        }
        None => shortest_digits(v.abs(), &mut digit_buf),
    };
    // The exact (800-digit) tie check is expensive; run it only when the value's
    // exact decimal expansion has the one length a tie needs.
    if digits.last().is_some_and(|d| d % 2 == 1) && tie_possible(v.abs(), digits.len()) {
        if let Some(found) = even_tie_digits(v.abs(), digits, exponent) {
            even = found;
            digits = &even;
        }
    }
    write_es6_digits(out, digits, exponent);
}

/// Writes shortest round-trip `digits` (no trailing zero) whose first digit has
/// decimal exponent `exponent`, per ECMAScript `Number.prototype.toString`.
fn write_es6_digits(out: &mut Vec<u8>, digits: &[u8], exponent: i32) {
    let k = digits.len() as i32;
    let n = exponent + 1;
    if k <= n && n <= 21 {
        out.extend_from_slice(digits);
        out.extend(std::iter::repeat_n(b'0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.extend_from_slice(&digits[..n as usize]);
        out.push(b'.');
        out.extend_from_slice(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        out.extend(std::iter::repeat_n(b'0', (-n) as usize));
        out.extend_from_slice(digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if n > 0 { b'+' } else { b'-' });
        out.extend_from_slice(itoa_u64((n - 1).unsigned_abs() as u64, &mut [0u8; 20]));
    }
}

/// The shortest round-trip digits of the finite, positive `v` and the decimal
/// exponent of the first one, from Rust's `{:e}` (shortest, like ECMAScript).
fn shortest_digits(v: f64, digit_buf: &mut [u8; 24]) -> (&[u8], i32) {
    use std::io::Write;
    let mut buf = [0u8; 40];
    let len = {
        let mut cursor = std::io::Cursor::new(&mut buf[..]);
        write!(cursor, "{v:e}").expect("buffer is large enough for any f64");
        cursor.position() as usize
    };
    let text = &buf[..len];
    let e_at = text
        .iter()
        .position(|&b| b == b'e')
        .expect("{:e} has an exponent");
    let mut k = 0;
    for &b in &text[..e_at] {
        if b != b'.' {
            digit_buf[k] = b;
            k += 1;
        }
    }
    let exponent: i32 = std::str::from_utf8(&text[e_at + 1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("{:e} exponent is an integer");
    (&digit_buf[..k], exponent)
}

/// `Some((n, j))` when the positive `v` is the double nearest to the decimal
/// `n / 10^j` with `n < 10^15` and `j <= 15`: such a decimal has at most 15
/// significant digits, and no two decimals of at most 15 digits round to the same
/// double, so it is the unique shortest round-trip form (no tie either, which
/// needs 16 digits or more). `n / 10^j` in floating point is correctly rounded,
/// so the comparison is exact.
fn short_decimal(v: f64) -> Option<(u64, i32)> {
    const POW10: [f64; 16] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    ];
    const LIMIT: f64 = 1e15;
    for (j, p) in POW10.iter().enumerate() {
        let n = (v * p).round();
        if n >= LIMIT {
            return None;
        }
        if n >= 1.0 && n / p == v {
            return Some((n as u64, j as i32));
        }
    }
    None
}

/// Whether the exact decimal expansion of the finite, non-zero `v` has exactly
/// `k + 1` significant digits. A tie (see [`even_tie_digits`]) needs the exact
/// value to be `k` digits followed by a single `5`, so when this is false
/// `even_tie_digits(v, digits, _)` with `k` digits is `None`, and is skipped.
/// Integer arithmetic only; answers `true` (check exactly) when it cannot tell.
fn tie_possible(v: f64, k: usize) -> bool {
    let bits = v.abs().to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    // v = m * 2^q exactly.
    let (mut m, mut q) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    if m == 0 {
        return false;
    }
    let tz = m.trailing_zeros();
    m >>= tz;
    q += tz as i32;
    let significant = if q >= 0 {
        // An integer: m * 2^q, without its trailing decimal zeros.
        if (64 - m.leading_zeros()) as i32 + q > 127 {
            return true;
        }
        let mut n = u128::from(m) << q;
        while n % 10 == 0 {
            n /= 10;
        }
        decimal_len(n)
    } else {
        // m odd: v = m * 5^x / 10^x, and m * 5^x (odd) has no trailing zero.
        let x = q.unsigned_abs();
        if x > 32 {
            // m * 5^x >= 5^33 > 10^23: more than the 18 digits a tie can have.
            return false;
        }
        decimal_len(u128::from(m) * 5u128.pow(x))
    };
    significant == k + 1
}

fn decimal_len(mut n: u128) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// ECMAScript breaks a tie between two shortest digit strings (the double lies
/// exactly halfway) towards the even one; Rust's formatter rounds half up.
/// Returns the even digits when `digits` lost such a tie. Odd last digits only.
fn even_tie_digits(v: f64, digits: &[u8], exponent: i32) -> Option<Vec<u8>> {
    // A double's exact decimal expansion has at most 767 significant digits.
    let exact = format!("{v:.800e}");
    let (mantissa, exact_exponent) = exact.split_once('e')?;
    if exact_exponent.parse::<i32>().ok()? != exponent {
        return None;
    }
    let exact_digits: Vec<u8> = mantissa.bytes().filter(|&b| b != b'.').collect();
    let (prefix, rest) = exact_digits.split_at(digits.len());
    let is_tie = rest.first() == Some(&b'5') && rest[1..].iter().all(|&b| b == b'0');
    if !is_tie {
        return None;
    }
    let mut even = prefix.to_vec();
    if even.last()? % 2 == 1 {
        // Round the prefix up by one unit in its last place.
        let mut i = even.len();
        loop {
            i = i.checked_sub(1)?;
            if even[i] == b'9' {
                even[i] = b'0';
            } else {
                even[i] += 1;
                break;
            }
        }
    }
    let candidate = format!("0.{}e{}", std::str::from_utf8(&even).ok()?, exponent + 1);
    (even != digits && candidate.parse::<f64>().ok()? == v).then_some(even)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        String::from_utf8(canonicalize_json(s.as_bytes()).unwrap()).unwrap()
    }

    fn es6(v: f64) -> String {
        let mut out = Vec::new();
        write_es6_number(&mut out, v);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn es6_number_serialisation_matches_rfc8785_appendix_b() {
        let cases: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, want) in cases {
            assert_eq!(es6(f64::from_bits(bits)), want, "bits {bits:#x}");
        }
    }

    /// What the single-pass path produces, if it takes the document.
    fn fast(input: &str) -> Option<Vec<u8>> {
        let mut buffers = Buffers {
            out: Vec::new(),
            scratch: Vec::new(),
        };
        let mut fast = FastCanonical {
            input: input.as_bytes(),
            at: 0,
            buf: &mut buffers,
            members: Vec::new(),
        };
        fast.document()?;
        Some(buffers.out)
    }

    fn slow(input: &str) -> Result<Vec<u8>, String> {
        let buffers = Buffers {
            out: Vec::new(),
            scratch: Vec::new(),
        };
        canonicalize_with_serde(input.as_bytes(), buffers).map_err(|e| e.to_string())
    }

    #[test]
    fn single_pass_path_agrees_with_serde_path_or_declines() {
        let numbers = [
            "0",
            "-0",
            "1",
            "-1",
            "10.5",
            "1.50",
            "0.05",
            "1e2",
            "1E+2",
            "1e-7",
            "1e21",
            "1e20",
            "123456789012345",
            "1234567890123456",
            "123456789012345678",
            "1234567890123456789",
            "9007199254740993",
            "0.1",
            "0.30000000000000004",
            "4.35",
            "1e-400",
            "1e400",
            "2.5e-300",
            "-0.0",
            "0e5",
            "5e-324",
            "1.7976931348623157e308",
            "333333333.33333329",
            "0.000001",
            "0.0000001",
        ];
        let strings = [
            r#""""#,
            r#""a""#,
            "\"é€😀\"",
            r#""\n\t\"\\\/""#,
            r#""\u00e9\u20AC""#,
            r#""\ud83d\ude00""#,
            r#""\ud800""#,
            r#""\u0000\u001f""#,
            "\"\u{7f}\"",
        ];
        let mut docs: Vec<String> = Vec::new();
        docs.extend(numbers.iter().map(|n| n.to_string()));
        docs.extend(strings.iter().map(|s| s.to_string()));
        for n in numbers {
            for s in strings {
                docs.push(format!(
                    r#"{{ "z": [{n}, {s}], "a": {{"é": null, "b": {s}}}, "\u00e9x": true, "דּ": {n} }}"#
                ));
                docs.push(format!("[{n},{s},{{}},[],false]"));
                docs.push(format!("{{{s}:{n},\"x\":1}}"));
            }
        }
        for bad in [
            "",
            " ",
            "01",
            "1.",
            ".5",
            "-",
            "+1",
            "1e",
            "[1,]",
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            "[1 2]",
            r#"{"a":1,"a":2}"#,
            "\"\u{1}\"",
            "tru",
            "nul",
            "[",
            "{}}",
            "1 2",
            r#""\x""#,
            r#""\u12""#,
        ] {
            docs.push(bad.to_string());
        }
        docs.push("[".repeat(64) + &"]".repeat(64));
        docs.push("[".repeat(65) + &"]".repeat(65));
        docs.push("[".repeat(129) + &"]".repeat(129));
        for doc in &docs {
            if let Some(out) = fast(doc) {
                assert_eq!(Ok(out), slow(doc), "{doc}");
            }
            assert_eq!(
                canonicalize_json(doc.as_bytes()).map_err(|e| e.to_string()),
                slow(doc),
                "{doc}"
            );
        }
    }

    #[test]
    fn tie_precheck_never_skips_a_tie() {
        // Whenever the cheap precheck says "no tie", the exact check agrees.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut values: Vec<f64> = Vec::new();
        for _ in 0..20_000 {
            // xorshift64*: random bit patterns over the whole exponent range.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            values.push(f64::from_bits(x.wrapping_mul(0x2545_f491_4f6c_dd1d)));
        }
        for i in 0..2_000u64 {
            values.push(((1u64 << 53) + 2 * i + 1) as f64 * 8.0);
            values.push((i as f64 + 0.5) / 8.0);
            values.push(i as f64 * 1e21 + 5e20);
        }
        values.extend([
            f64::from_bits(0x4430000000000000),
            f64::from_bits(0x44b52d02c7e14af5),
            f64::from_bits(0x41b3de4355555553),
            f64::from_bits(0x41b3de4355555557),
            f64::from_bits(0x43143ff3c1cb0959),
            5e-324,
            1.7976931348623157e308,
        ]);
        for v in values.into_iter().filter(|v| v.is_finite() && *v != 0.0) {
            let v = v.abs();
            let text = format!("{v:e}");
            let (mantissa, exponent) = text.split_once('e').unwrap();
            let digits: Vec<u8> = mantissa.bytes().filter(|&b| b != b'.').collect();
            let exponent: i32 = exponent.parse().unwrap();
            if digits.last().is_some_and(|d| d % 2 == 1) && !tie_possible(v, digits.len()) {
                assert_eq!(even_tie_digits(v, &digits, exponent), None, "{v:e}");
            }
        }
    }

    #[test]
    fn rfc8785_section_3_2_2_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let want = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(canon(input), want);
    }

    #[test]
    fn sorts_keys_by_utf16_code_units() {
        // RFC 8785 section 3.2.3: U+1F600 (surrogates D83D DE00) sorts before U+FB33.
        let input = "{\"\u{20ac}\":1,\"\\r\":2,\"\u{fb33}\":3,\"1\":4,\"\u{1f600}\":5,\"\u{80}\":6,\"\u{f6}\":7}";
        let want = "{\"\\r\":2,\"1\":4,\"\u{80}\":6,\"\u{f6}\":7,\"\u{20ac}\":1,\"\u{1f600}\":5,\"\u{fb33}\":3}";
        assert_eq!(canon(input), want);
    }

    #[test]
    fn nested_objects_are_sorted_recursively() {
        assert_eq!(
            canon(r#"{"z":{"b":[{"d":1,"c":2}],"a":null},"y":[]}"#),
            r#"{"y":[],"z":{"a":null,"b":[{"c":2,"d":1}]}}"#
        );
    }

    #[test]
    fn rejects_duplicates_lone_surrogates_and_deep_nesting() {
        assert!(canonicalize_json(br#"{"a":1,"b":{"x":1,"x":1}}"#).is_err());
        assert!(canonicalize_json(br#"["\ud800"]"#).is_err());
        assert!(canonicalize_json(b"\"\xff\"").is_err());
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(canonicalize_json(deep.as_bytes()).is_err());
        let ok_depth = "[".repeat(100) + &"]".repeat(100);
        assert!(canonicalize_json(ok_depth.as_bytes()).is_ok());
        assert!(canonicalize_json(b"1e400").is_err());
        assert!(canonicalize_json(b"{} {}").is_err());
    }

    #[test]
    fn large_integers_round_through_double() {
        assert_eq!(canon("18446744073709551615"), "18446744073709552000");
        assert_eq!(canon("-9007199254740993"), "-9007199254740992");
        assert_eq!(canon("[-0, 0.0, -0.0, 1.50]"), "[0,0,0,1.5]");
    }

    #[test]
    fn json_content_types() {
        assert!(is_json_content_type(b"application/json"));
        assert!(is_json_content_type(b"Application/JSON; charset=utf-8"));
        assert!(is_json_content_type(b"application/merge-patch+json"));
        assert!(!is_json_content_type(b"text/json"));
        assert!(!is_json_content_type(b"application/jsonx"));
        assert!(!is_json_content_type(b"application/x-www-form-urlencoded"));
    }
}
