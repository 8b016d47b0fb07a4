//! The single-pass canonicaliser for the JSON most requests carry.

use super::*;

/// A single-pass canonicaliser for the JSON most requests carry. Every method
/// returns `None` ("not handled here") instead of an error: the caller then
/// runs the serde_json path, so this one only has to be right on what it
/// accepts, and it accepts a strict subset of what serde_json accepts.
pub(super) struct FastCanonical<'a, 'b> {
    pub(super) input: &'a [u8],
    pub(super) at: usize,
    pub(super) buf: &'b mut Buffers,
    /// Members of the objects being written (a stack shared by nested objects):
    /// the key (valid UTF-8, no escapes), whether it is ASCII, and where its
    /// value sits in `buf.out`.
    pub(super) members: Vec<(&'a [u8], bool, usize, usize)>,
}

/// Deeper documents go to the serde_json path (which allows 128 levels).
pub(super) const FAST_MAX_DEPTH: usize = 64;

impl<'a> FastCanonical<'a, '_> {
    pub(super) fn document(&mut self) -> Option<()> {
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

pub(super) enum Decoded<'a> {
    /// The bytes between the quotes (valid UTF-8), and whether they are ASCII.
    Raw(&'a [u8], bool),
    Owned(String),
}
