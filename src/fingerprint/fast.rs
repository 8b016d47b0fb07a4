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
    /// Members of the objects being read (a stack shared by nested objects).
    pub(super) members: Vec<Member>,
}

/// One object member, read but not necessarily written yet.
#[derive(Clone, Copy)]
pub(super) struct Member {
    /// The key's first 8 bytes, big-endian, zero-padded: comparing two of
    /// these compares the keys' first 8 bytes (a key has no NUL byte).
    prefix: u64,
    /// Where the key (valid UTF-8, no escapes) sits in the input: the index
    /// of its opening quote, and its length without the quotes.
    key: u32,
    key_len: u32,
    /// A range: see `text`.
    from: u32,
    to: u32,
    text: Text,
    /// Every character of the key is in the BMP (no 4-byte UTF-8 sequence):
    /// between two such keys, byte order is UTF-16 code unit order.
    bmp: bool,
}

/// Where a member's canonical `"key":value` is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Text {
    /// All of it, in the input at `from..to`.
    Source,
    /// The key in the input, and the value in the input at `from..to`, with
    /// whitespace around the colon.
    Spaced,
    /// All of it, written to `buf.out` at `from..to` (relative to the
    /// object's first member), after a comma unless it is the first one.
    Written,
}

impl Member {
    fn key<'a>(&self, input: &'a [u8]) -> &'a [u8] {
        let start = self.key as usize + 1;
        &input[start..start + self.key_len as usize]
    }
}

/// Deeper documents go to the serde_json path (which allows 128 levels). API
/// bodies rarely nest past a handful of levels; 32 keeps this path's recursion
/// within a 256 KiB stack even in a debug build, where its frames are large.
pub(super) const FAST_MAX_DEPTH: usize = 32;

/// Longer inputs go to the serde_json path, so that every offset into the
/// input fits u32 (and so does every offset into the output, which is at most
/// 5.25 times as long as the input: `1e20` is `100000000000000000000`).
const FAST_MAX_LEN: usize = (u32::MAX / 8) as usize;

/// Objects with more members are sorted with `sort_unstable_by`; fewer are
/// ranked by comparing every pair (quadratic, so only for small objects).
const SMALL_OBJECT: usize = 16;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Bit 7 set in each byte of `x` (little-endian) that is `"`, `\` or a control
/// character, and, if `non_ascii`, in each byte above 0x7f. Exact up to the
/// lowest set bit (bytes above it may be flagged spuriously, by borrows),
/// which is all the callers read.
#[inline(always)]
fn stop_bytes(x: u64, non_ascii: bool) -> u64 {
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    let stops = (quote.wrapping_sub(ONES) & !quote)
        | (backslash.wrapping_sub(ONES) & !backslash)
        | (x.wrapping_sub(ONES * 0x20) & !x);
    (if non_ascii { stops | x } else { stops }) & HIGHS
}

/// From `i`, eight bytes at a time: the index of the first `"`, `\` or
/// control byte, and also of the first non-ASCII one if `non_ascii`
/// (`input.len()` if none).
#[inline(always)]
fn run_end(input: &[u8], mut i: usize, non_ascii: bool) -> usize {
    while let Some(chunk) = input.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        let stops = stop_bytes(u64::from_le_bytes(*chunk), non_ascii);
        if stops != 0 {
            return i + (stops.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&b) = input.get(i) {
        if b == b'"' || b == b'\\' || b < 0x20 || (non_ascii && b > 0x7f) {
            break;
        }
        i += 1;
    }
    i
}

/// Scans string contents from `i`: the index of the first `"`, `\` or control
/// byte (`input.len()` if none), and whether a byte before it is non-ASCII.
#[inline(always)]
fn scan_string(input: &[u8], i: usize) -> (usize, bool) {
    let end = run_end(input, i, true);
    match input.get(end) {
        Some(&b) if b > 0x7f => (run_end(input, end + 1, false), true),
        _ => (end, false),
    }
}

/// [`scan_string`] for a key whose contents start at `i`, with the key's
/// prefix (see [`Member::prefix`]), read from the same eight bytes.
#[inline(always)]
fn scan_key(input: &[u8], i: usize) -> (usize, bool, u64) {
    if let Some(chunk) = input.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        let x = u64::from_le_bytes(*chunk);
        let stops = stop_bytes(x, true);
        if stops == 0 {
            let (end, high) = scan_string(input, i + 8);
            return (end, high, x.swap_bytes());
        }
        let n = stops.trailing_zeros() / 8; // 0..=7
        let end = i + n as usize;
        if input[end] < 0x80 {
            return (end, false, (x & ((1u64 << (8 * n)) - 1)).swap_bytes());
        }
    }
    let (end, high) = scan_string(input, i);
    (end, high, key_prefix(input, i, end - i))
}

/// The first 8 bytes of the key of `len` bytes at `start`, big-endian,
/// zero-padded.
#[inline(always)]
fn key_prefix(input: &[u8], start: usize, len: usize) -> u64 {
    match input.get(start..).and_then(|rest| rest.first_chunk::<8>()) {
        Some(chunk) if len >= 8 => u64::from_be_bytes(*chunk),
        Some(chunk) => u64::from_be_bytes(*chunk) & !(u64::MAX >> (8 * len)),
        None => input[start..start + len]
            .iter()
            .take(8)
            .enumerate()
            .fold(0, |acc, (k, &b)| acc | u64::from(b) << (56 - 8 * k)),
    }
}

/// Appends `input[from..to]` to `out`; when that is short, without a call to
/// `memcpy`: 32 bytes are copied (a constant length, so inline moves), then
/// the excess is cut off.
#[inline(always)]
fn append(out: &mut Vec<u8>, input: &[u8], from: usize, to: usize) {
    if to - from <= 32 && out.capacity() - out.len() >= 32 {
        if let Some(chunk) = input.get(from..).and_then(|rest| rest.first_chunk::<32>()) {
            let end = out.len() + (to - from);
            out.extend_from_slice(chunk);
            out.truncate(end);
            return;
        }
    }
    out.extend_from_slice(&input[from..to]);
}

/// The end of the run of ASCII digits starting at `i`.
#[inline(always)]
fn digits_end(input: &[u8], mut i: usize) -> usize {
    while let Some(b'0'..=b'9') = input.get(i) {
        i += 1;
    }
    i
}

/// The next token at or after `at`: where it is, and its first byte.
#[inline(always)]
fn token(input: &[u8], at: usize) -> Option<(usize, u8)> {
    let b = *input.get(at)?;
    if b > b' ' {
        return Some((at, b));
    }
    token_after_whitespace(input, at)
}

#[inline(never)]
fn token_after_whitespace(input: &[u8], mut at: usize) -> Option<(usize, u8)> {
    while let b' ' | b'\t' | b'\n' | b'\r' = *input.get(at)? {
        at += 1;
    }
    Some((at, input[at]))
}

/// The end of `text` when it is at `at`.
#[inline(always)]
fn literal_end(input: &[u8], at: usize, text: &[u8]) -> Option<usize> {
    let end = at + text.len();
    (input.get(at..end)? == text).then_some(end)
}

/// The end of the number at `at` when its source text is its canonical form:
/// a plain integer of at most 15 digits other than -0, or a plain decimal of
/// at most 15 significant digits, with no trailing zero, that ECMAScript
/// prints without an exponent. `None` for anything else, valid or not.
#[inline(always)]
fn plain_number_end(input: &[u8], at: usize) -> Option<usize> {
    let negative = input[at] == b'-';
    let int_start = at + usize::from(negative);
    let int_end = digits_end(input, int_start);
    let int_len = int_end - int_start;
    if int_len == 0 || int_len > 15 {
        return None;
    }
    let leading_zero = input[int_start] == b'0';
    if leading_zero && int_len > 1 {
        return None; // not JSON
    }
    match input.get(int_end) {
        Some(b'.') => {
            let frac_start = int_end + 1;
            let end = digits_end(input, frac_start);
            let frac_len = end - frac_start;
            // No digit, a trailing zero, or an exponent: not plain.
            if frac_len == 0
                || input[end - 1] == b'0'
                || matches!(input.get(end), Some(b'e' | b'E'))
            {
                return None;
            }
            let significant = if leading_zero {
                // 0.000001 (1e-6) is the smallest ECMAScript prints plain.
                let zeros = input[frac_start..end]
                    .iter()
                    .take_while(|&&b| b == b'0')
                    .count();
                if zeros > 5 {
                    return None;
                }
                frac_len - zeros
            } else {
                int_len + frac_len
            };
            // At most 15 significant digits, and not zero (the last digit is
            // not 0): the unique shortest form of the double nearest to it
            // (see `short_decimal`), and so its canonical form.
            (significant <= 15).then_some(end)
        }
        Some(b'e' | b'E') => None,
        // -0 prints as 0.
        _ if negative && leading_zero => None,
        // Below 2^53 and without leading zeros: the source is canonical.
        _ => Some(int_end),
    }
}

/// RFC 8785 key order (UTF-16 code units), `Equal` for the same key.
#[inline(always)]
fn key_order(a: &Member, b: &Member, input: &[u8]) -> Ordering {
    if a.prefix != b.prefix && a.bmp && b.bmp {
        return a.prefix.cmp(&b.prefix);
    }
    key_order_beyond_prefix(a, b, input)
}

/// [`key_order`] when the prefixes do not decide.
#[inline(never)]
fn key_order_beyond_prefix(a: &Member, b: &Member, input: &[u8]) -> Ordering {
    if a.prefix == b.prefix && a.key_len <= 8 && b.key_len <= 8 {
        // The prefixes hold both keys whole.
        return Ordering::Equal;
    }
    let (x, y) = (a.key(input), b.key(input));
    if a.bmp && b.bmp {
        return x.cmp(y);
    }
    match (std::str::from_utf8(x), std::str::from_utf8(y)) {
        (Ok(x), Ok(y)) => cmp_utf16(x, y),
        _ => x.cmp(y), // unreachable: keys were validated
    }
}

/// How an object's members are to be written.
enum Order {
    /// As they came: their keys are in order.
    Arrival,
    /// As they are now: sorted in place.
    Sorted,
    /// `ranked[k]` is the index of the member with the `k`-th key.
    Ranked([u8; SMALL_OBJECT]),
}

/// Orders an object's members by key: `None` on a duplicate key.
fn sort_members(members: &mut [Member], input: &[u8]) -> Option<Order> {
    let n = members.len();
    if n <= SMALL_OBJECT {
        // A member's rank is the number of keys below its own. The prefixes
        // decide when they all differ and every key is in the BMP.
        let mut ranks = [0u8; SMALL_OBJECT];
        let mut undecided = false;
        for (i, a) in members.iter().enumerate() {
            undecided |= !a.bmp;
            for (j, b) in members.iter().enumerate().skip(i + 1) {
                ranks[j] += u8::from(a.prefix < b.prefix);
                ranks[i] += u8::from(a.prefix > b.prefix);
                undecided |= a.prefix == b.prefix;
            }
        }
        if undecided {
            if in_order(members, input) {
                return Some(Order::Arrival);
            }
            // Every pair compared in full, once.
            ranks = [0u8; SMALL_OBJECT];
            for i in 0..n {
                for j in i + 1..n {
                    match key_order(&members[i], &members[j], input) {
                        Ordering::Less => ranks[j] += 1,
                        Ordering::Greater => ranks[i] += 1,
                        Ordering::Equal => return None, // a duplicate key
                    }
                }
            }
        }
        // Ranks 0, 1, 2, ... (and zeros past `n`): in order already.
        let arrival = 0x0f0e_0d0c_0b0a_0908_0706_0504_0302_0100_u128
            & u128::MAX.checked_shr(8 * (16 - n) as u32).unwrap_or(0);
        if u128::from_le_bytes(ranks) == arrival {
            return Some(Order::Arrival);
        }
        let mut ranked = [0u8; SMALL_OBJECT];
        for (i, &rank) in ranks[..n].iter().enumerate() {
            ranked[usize::from(rank)] = i as u8;
        }
        return Some(Order::Ranked(ranked));
    }
    if in_order(members, input) {
        return Some(Order::Arrival);
    }
    members.sort_unstable_by(|a, b| key_order(a, b, input));
    if members
        .windows(2)
        .any(|w| key_order(&w[0], &w[1], input) == Ordering::Equal)
    {
        return None; // duplicate key: an error, reported by the serde_json path
    }
    Some(Order::Sorted)
}

/// Strictly increasing keys: sorted, and no duplicate.
fn in_order(members: &[Member], input: &[u8]) -> bool {
    members
        .windows(2)
        .all(|w| key_order(&w[0], &w[1], input) == Ordering::Less)
}

impl FastCanonical<'_, '_> {
    pub(super) fn document(&mut self) -> Option<()> {
        if self.input.len() > FAST_MAX_LEN {
            return None;
        }
        self.value(0)?;
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.input.get(self.at) {
            self.at += 1;
        }
        (self.at == self.input.len()).then_some(())
    }

    fn peek(&mut self) -> Option<u8> {
        let (at, b) = token(self.input, self.at)?;
        self.at = at;
        Some(b)
    }

    fn literal(&mut self, text: &[u8]) -> Option<()> {
        let end = literal_end(self.input, self.at, text)?;
        self.at = end;
        self.buf.out.extend_from_slice(text);
        Some(())
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string(),
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
        let input = self.input;
        let (mut at, mut b) = token(input, self.at + 1)?;
        if b == b'}' {
            self.at = at + 1;
            self.buf.out.extend_from_slice(b"{}");
            return Some(());
        }
        // A member whose value is its own source text (a string without
        // escapes, a plain number, a literal) is only recorded here, and
        // written once, in key order, at the end. The others are written as
        // they come, and moved at the end if needed.
        self.buf.out.push(b'{');
        let body = self.buf.out.len();
        // Kept in a local while this object reads its members (handed back
        // around nested values), so that the compiler can keep it in registers.
        let mut members = std::mem::take(&mut self.members);
        let first = members.len();
        let mut all_written = true;
        loop {
            if b != b'"' {
                return None;
            }
            let key_start = at;
            let (key_end, high, prefix) = scan_key(input, key_start + 1);
            // Keys with escapes are rare: the serde_json path handles them.
            if *input.get(key_end)? != b'"' {
                return None;
            }
            let key_len = key_end - key_start - 1;
            let bmp = !high || {
                let key = &input[key_start + 1..key_end];
                std::str::from_utf8(key).ok()?;
                key.iter().all(|&b| b < 0xf0)
            };
            let colon = key_end + 1;
            let value_start = if input.get(colon) == Some(&b':') {
                colon + 1
            } else {
                let (at, b) = token(input, colon)?;
                if b != b':' {
                    return None;
                }
                at + 1
            };
            (at, b) = token(input, value_start)?;
            let source_end = match b {
                b'"' => {
                    let (end, high) = scan_string(input, at + 1);
                    if *input.get(end)? == b'"' {
                        if high {
                            std::str::from_utf8(&input[at + 1..end]).ok()?;
                        }
                        Some(end + 1)
                    } else {
                        None
                    }
                }
                b'-' | b'0'..=b'9' => plain_number_end(input, at),
                b't' => literal_end(input, at, b"true"),
                b'f' => literal_end(input, at, b"false"),
                b'n' => literal_end(input, at, b"null"),
                _ => None,
            };
            let (from, to, text) = match source_end {
                Some(end) if at == value_start && colon + 1 == value_start => {
                    let member = (key_start as u32, end as u32, Text::Source);
                    at = end;
                    all_written = false;
                    member
                }
                Some(end) => {
                    let member = (at as u32, end as u32, Text::Spaced);
                    at = end;
                    all_written = false;
                    member
                }
                None => {
                    let out = &mut self.buf.out;
                    if out.len() > body {
                        out.push(b',');
                    }
                    let from = out.len() - body;
                    out.extend_from_slice(&input[key_start..key_end + 1]);
                    out.push(b':');
                    self.at = at;
                    self.members = members;
                    self.value(depth)?;
                    members = std::mem::take(&mut self.members);
                    at = self.at;
                    let to = self.buf.out.len() - body;
                    (
                        u32::try_from(from).ok()?,
                        u32::try_from(to).ok()?,
                        Text::Written,
                    )
                }
            };
            members.push(Member {
                prefix,
                key: key_start as u32,
                key_len: key_len as u32,
                from,
                to,
                text,
                bmp,
            });
            (at, b) = token(input, at)?;
            match b {
                b',' => (at, b) = token(input, at + 1)?,
                b'}' => break,
                _ => return None,
            }
        }
        self.at = at + 1;
        let order = sort_members(&mut members[first..], input)?;
        let out = &mut self.buf.out;
        if !(matches!(order, Order::Arrival) && all_written) {
            // Written members move to `scratch`; then every member is written
            // in key order.
            let scratch = &mut self.buf.scratch;
            if out.len() > body {
                scratch.clear();
                scratch.extend_from_slice(&out[body..]);
                out.truncate(body);
            }
            let members = &members[first..];
            for k in 0..members.len() {
                let member = match &order {
                    Order::Ranked(ranked) => &members[usize::from(ranked[k])],
                    _ => &members[k],
                };
                if k > 0 {
                    out.push(b',');
                }
                let (from, to) = (member.from as usize, member.to as usize);
                match member.text {
                    Text::Source => append(out, input, from, to),
                    Text::Spaced => {
                        let key_start = member.key as usize;
                        let key_end = key_start + member.key_len as usize + 2;
                        append(out, input, key_start, key_end);
                        out.push(b':');
                        append(out, input, from, to);
                    }
                    Text::Written => out.extend_from_slice(&scratch[from..to]),
                }
            }
        }
        out.push(b'}');
        members.truncate(first);
        self.members = members;
        Some(())
    }

    /// A string value, written in its canonical form.
    fn string(&mut self) -> Option<()> {
        let input = self.input;
        let start = self.at;
        let (end, high) = scan_string(input, start + 1);
        match *input.get(end)? {
            b'"' => {
                if high {
                    std::str::from_utf8(&input[start + 1..end]).ok()?;
                }
                // No escape in the source: nothing to escape either; the
                // token, quotes included, is its own canonical form.
                self.at = end + 1;
                append(&mut self.buf.out, input, start, end + 1);
                Some(())
            }
            b'\\' => {
                let text = self.escaped_string(start + 1, end)?;
                write_json_string(&mut self.buf.out, &text);
                Some(())
            }
            _ => None,
        }
    }

    /// Decodes a string token with escapes, whose contents start at `begin`
    /// and whose first escape is at `i`.
    fn escaped_string(&mut self, begin: usize, mut i: usize) -> Option<String> {
        let input = self.input;
        let mut text = String::from(std::str::from_utf8(&input[begin..i]).ok()?);
        loop {
            let run_start = i;
            i = run_end(input, i, false);
            text.push_str(std::str::from_utf8(&input[run_start..i]).ok()?);
            match *input.get(i)? {
                b'"' => {
                    self.at = i + 1;
                    return Some(text);
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

    /// A number: its source text when that is its canonical form (see
    /// [`plain_number_end`]), else [`Self::general_number`].
    fn number(&mut self) -> Option<()> {
        match plain_number_end(self.input, self.at) {
            Some(end) => {
                append(&mut self.buf.out, self.input, self.at, end);
                self.at = end;
                Some(())
            }
            None => self.general_number(),
        }
    }

    fn general_number(&mut self) -> Option<()> {
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
