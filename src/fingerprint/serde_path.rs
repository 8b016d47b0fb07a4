//! The general canonicaliser: serde_json parses, these visitors write.

use super::*;

/// Writes one JSON value in canonical form to `buf.out`.
///
/// serde_json hands numbers over as doubles or 64-bit integers, not as
/// written, so each number is copied from its literal in `input`: serde_json
/// visits values in document order, and [`next_number_literal`] finds the
/// literals in the same order.
///
/// One reference wide: serde_json recurses through it up to 128 levels, and
/// every byte of it is copied into several frames per level in a debug build.
pub(super) struct CanonicalValue<'a, 'i> {
    pub(super) state: &'a mut SerdeState<'i>,
}

/// What the visitors share: the output buffers and the input.
pub(super) struct SerdeState<'i> {
    pub(super) buf: Buffers,
    pub(super) input: &'i [u8],
    /// Where the search for the next number literal starts.
    pub(super) numbers_at: usize,
}

impl CanonicalValue<'_, '_> {
    fn number<E: de::Error>(self) -> Result<(), E> {
        let state = self.state;
        // serde_json has checked the literal; [`number_end`] checks it as the
        // single-pass path does, so that the two paths accept the same numbers.
        let literal = next_number_literal(state.input, &mut state.numbers_at)
            .filter(|literal| number_end(literal, 0) == Some(literal.len()))
            .ok_or_else(|| E::custom("number out of range"))?;
        state.buf.out.extend_from_slice(literal);
        Ok(())
    }
}

/// The next number literal at or after `*at` in a JSON text (strings, which
/// may contain digits, are skipped), moving `*at` past it.
pub(super) fn next_number_literal<'a>(input: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let mut i = *at;
    while let Some(&b) = input.get(i) {
        match b {
            b'"' => {
                i += 1;
                while let Some(&c) = input.get(i) {
                    i += if c == b'\\' { 2 } else { 1 };
                    if c == b'"' {
                        break;
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let end = input[i..]
                    .iter()
                    .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .map_or(input.len(), |len| i + len);
                *at = end;
                return Some(&input[i..end]);
            }
            _ => i += 1,
        }
    }
    None
}

impl<'de> DeserializeSeed<'de> for CanonicalValue<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CanonicalValue<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.state.buf.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.state
            .buf
            .out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.number()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.number()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.number()
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        write_json_string(&mut self.state.buf.out, v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.state.buf.out.push(b'[');
        let mut first = true;
        loop {
            let mark = self.state.buf.out.len();
            if !first {
                self.state.buf.out.push(b',');
            }
            if seq
                .next_element_seed(CanonicalValue {
                    state: &mut *self.state,
                })?
                .is_none()
            {
                self.state.buf.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.state.buf.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // Values are written in arrival order after `start`, then the region is
        // rewritten in key order; this avoids an allocation per member.
        let start = self.state.buf.out.len();
        let mut members: Vec<(Cow<'de, str>, usize, usize)> = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let from = self.state.buf.out.len();
            map.next_value_seed(CanonicalValue {
                state: &mut *self.state,
            })?;
            members.push((key, from, self.state.buf.out.len()));
        }
        members.sort_unstable_by(|a, b| cmp_utf16(&a.0, &b.0));
        if members.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(de::Error::custom("duplicate object key"));
        }
        // Nested objects finished using the scratch buffer before this one.
        let Buffers { out, scratch } = &mut self.state.buf;
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
pub(super) struct KeySeed;

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
pub(super) fn cmp_utf16(a: &str, b: &str) -> Ordering {
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
pub(super) fn write_json_string(out: &mut Vec<u8>, s: &str) {
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
