//! Fast-path scanning: string and key runs eight bytes at a time, tokens, string values.

use super::*;

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

/// From `i`: the index of the first `"`, `\` or control byte, and also of the
/// first non-ASCII one if `non_ascii` (`input.len()` if none). Sixteen bytes
/// at a time where SSE2 is there (every x86-64), then as [`run_end_swar`].
// Not inlined in an unoptimised build, where its vector locals would swell
// every frame of the recursion through nested values (see `flat_object`).
#[cfg_attr(debug_assertions, inline(never))]
#[cfg_attr(not(debug_assertions), inline(always))]
fn run_end(input: &[u8], mut i: usize, non_ascii: bool) -> usize {
    #[cfg(all(
        any(target_arch = "x86", target_arch = "x86_64"),
        target_feature = "sse2"
    ))]
    while let Some(chunk) = input.get(i..).and_then(|rest| rest.first_chunk::<16>()) {
        let stops = sse2::stops(chunk, non_ascii);
        if stops != 0 {
            return i + stops.trailing_zeros() as usize;
        }
        i += 16;
    }
    run_end_swar(input, i, non_ascii)
}

/// [`run_end`] eight bytes at a time, in a `u64`: the whole scan elsewhere,
/// and the last bytes of the input where SSE2 is used.
#[inline(always)]
fn run_end_swar(input: &[u8], mut i: usize, non_ascii: bool) -> usize {
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

/// SSE2 through `safe_arch`, which exposes the intrinsics behind `cfg`
/// (this crate forbids `unsafe`).
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    target_feature = "sse2"
))]
mod sse2 {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, cmp_lt_mask_i8_m128i, load_unaligned_m128i,
        min_u8_m128i, move_mask_i8_m128i, set_splat_i8_m128i,
    };

    /// Bit `k` set if byte `k` of `chunk` is `"`, `\` or a control byte, or
    /// (if `non_ascii`) above 0x7f: exact in every bit, unlike
    /// [`stop_bytes`](super::stop_bytes).
    #[inline(always)]
    pub(super) fn stops(chunk: &[u8; 16], non_ascii: bool) -> u32 {
        let x = load_unaligned_m128i(chunk);
        let quote = cmp_eq_mask_i8_m128i(x, set_splat_i8_m128i(b'"' as i8));
        let backslash = cmp_eq_mask_i8_m128i(x, set_splat_i8_m128i(b'\\' as i8));
        let low = if non_ascii {
            // Signed: below 0x20 are the control bytes and, as negative
            // numbers, those above 0x7f.
            cmp_lt_mask_i8_m128i(x, set_splat_i8_m128i(0x20))
        } else {
            // Unsigned x <= 0x1f.
            cmp_eq_mask_i8_m128i(min_u8_m128i(x, set_splat_i8_m128i(0x1f)), x)
        };
        move_mask_i8_m128i(bitor_m128i(bitor_m128i(quote, backslash), low)) as u32
    }
}

/// Scans string contents from `i`: the index of the first `"`, `\` or control
/// byte (`input.len()` if none), and whether a byte before it is non-ASCII.
#[inline(always)]
pub(super) fn scan_string(input: &[u8], i: usize) -> (usize, bool) {
    let end = run_end(input, i, true);
    match input.get(end) {
        Some(&b) if b > 0x7f => (run_end(input, end + 1, false), true),
        _ => (end, false),
    }
}

/// A key without escapes whose contents start at `i`: the index of its
/// closing quote, whether a byte before it is non-ASCII, and its prefix (see
/// [`Member::prefix`]). `None` if a backslash or control byte (or the end of
/// the input) comes first. A key of at most 7 ASCII bytes is decided by the
/// first eight bytes alone.
#[inline(always)]
pub(super) fn scan_key(input: &[u8], i: usize) -> Option<(usize, bool, u64)> {
    if let Some(chunk) = input.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        let x = u64::from_le_bytes(*chunk);
        let stops = stop_bytes(x, true);
        if stops != 0 {
            let n = stops.trailing_zeros() / 8; // 0..=7
            match (x >> (8 * n)) as u8 {
                b'"' => {
                    let prefix = (x & ((1u64 << (8 * n)) - 1)).swap_bytes();
                    return Some((i + n as usize, false, prefix));
                }
                0x80.. => {}
                _ => return None,
            }
        }
    }
    let (end, high) = scan_string(input, i);
    if *input.get(end)? != b'"' {
        return None;
    }
    Some((end, high, key_prefix(input, i, end - i)))
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
pub(super) fn append(out: &mut Vec<u8>, input: &[u8], from: usize, to: usize) {
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

/// The next token at or after `at`: where it is, and its first byte.
#[inline(always)]
pub(super) fn token(input: &[u8], at: usize) -> Option<(usize, u8)> {
    let b = *input.get(at)?;
    if b > b' ' {
        return Some((at, b));
    }
    Some(token_after_whitespace(input, at))
}

/// [`token`] after whitespace, returned in registers: at the end of the
/// input, `(input.len(), 0)`, which every caller rejects as it rejects a NUL
/// byte (no JSON token starts with one).
#[inline(never)]
fn token_after_whitespace(input: &[u8], mut at: usize) -> (usize, u8) {
    loop {
        let Some(&b) = input.get(at) else {
            return (input.len(), 0);
        };
        if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return (at, b);
        }
        at += 1;
        if b == b'\n' {
            // Indentation: spaces, eight at a time.
            if let Some(chunk) = input.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
                let x = u64::from_le_bytes(*chunk) ^ (ONES * u64::from(b' '));
                // Bit 7 set in each byte that is not a space (exact: the sums
                // stay within their bytes).
                let others = (((x & !HIGHS) + !HIGHS) | x) & HIGHS;
                at += (others.trailing_zeros() / 8) as usize;
            }
        }
    }
}

/// The end of `text` when it is at `at`.
#[inline(always)]
pub(super) fn literal_end(input: &[u8], at: usize, text: &[u8]) -> Option<usize> {
    let end = at + text.len();
    (input.get(at..end)? == text).then_some(end)
}

impl FastCanonical<'_, '_> {
    /// A string value, written in its canonical form.
    pub(super) fn string(&mut self) -> Option<()> {
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
            b'\\' => self.escaped_string(start + 1, end),
            _ => None,
        }
    }

    /// Writes a string token with escapes, whose contents start at `begin`
    /// and whose first escape is at `i`, in its canonical form: decoded and
    /// escaped again as it goes, without an intermediate `String`.
    fn escaped_string(&mut self, begin: usize, mut i: usize) -> Option<()> {
        let input = self.input;
        let out = &mut self.buf.out;
        out.push(b'"');
        let mut run_start = begin;
        loop {
            // A run without quote, backslash or control byte: its own
            // canonical form, once known to be UTF-8 (an escape, ASCII,
            // cannot split a character).
            let run = &input[run_start..i];
            if !run.is_ascii() {
                std::str::from_utf8(run).ok()?;
            }
            out.extend_from_slice(run);
            match *input.get(i)? {
                b'"' => {
                    out.push(b'"');
                    self.at = i + 1;
                    return Some(());
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
                    write_char(out, c);
                    i += if input[i + 1] == b'u' { 6 } else { 2 };
                }
                _ => return None,
            }
            run_start = i;
            i = run_end(input, i, false);
        }
    }
}

/// Writes a decoded character of a string as [`write_json_string`] does.
fn write_char(out: &mut Vec<u8>, c: char) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let escaped: &[u8] = match c {
        '"' => b"\\\"",
        '\\' => b"\\\\",
        '\u{8}' => b"\\b",
        '\u{c}' => b"\\f",
        '\n' => b"\\n",
        '\r' => b"\\r",
        '\t' => b"\\t",
        '\0'..='\u{1f}' => {
            let b = c as usize;
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[b >> 4], HEX[b & 0xf]]);
            return;
        }
        _ => {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            return;
        }
    };
    out.extend_from_slice(escaped);
}

#[cfg(test)]
mod tests {
    use super::{run_end, run_end_swar};

    /// The SSE2 scan finds what the eight-byte scan finds: every byte value
    /// at every offset of a run, alone and before a second stop byte, from
    /// every starting point, with and without non-ASCII stops.
    #[test]
    fn the_sixteen_byte_scan_stops_where_the_eight_byte_scan_does() {
        for b in 0..=255u8 {
            for at in 0..40 {
                for second in [None, Some(b'"'), Some(0x01), Some(0xc3)] {
                    let mut input = vec![b'a'; 40];
                    input[at] = b;
                    if let Some(s) = second {
                        if at + 3 < input.len() {
                            input[at + 3] = s;
                        }
                    }
                    for from in [0, 1, 7, 15, 16, 17, at.min(39)] {
                        for non_ascii in [false, true] {
                            assert_eq!(
                                run_end(&input, from, non_ascii),
                                run_end_swar(&input, from, non_ascii),
                                "byte {b:#x} at {at}, second {second:?}, from {from}, non_ascii {non_ascii}"
                            );
                        }
                    }
                }
            }
        }
    }
}
