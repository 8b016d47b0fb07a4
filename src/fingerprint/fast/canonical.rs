//! Bodies already in canonical form, proven so by one scan that writes
//! nothing: their own bytes are what a digest of the canonical form hashes.

use super::scan::{literal_end, scan_key, scan_string};
use super::*;

/// Whether `input` is exactly its own canonical form: no insignificant
/// whitespace, object keys strictly increasing in UTF-16 code unit order (so
/// no duplicate), strings without escapes or control bytes and in UTF-8,
/// numbers in JSON's grammar and double range, nesting within
/// [`FAST_MAX_DEPTH`]. `false` also for what this scan leaves undecided (any
/// backslash, say): the canonicaliser then decides.
///
/// When it holds, the canonicaliser would return `input` itself, so hashing
/// `input` hashes the same bytes. (Were the canonicaliser to refuse such a
/// body, the raw bytes, `input` again, would be hashed.)
pub(in crate::fingerprint) fn is_canonical(input: &[u8]) -> bool {
    let mut proof = Proof { input, at: 0 };
    proof.value(0).is_some() && proof.at == input.len()
}

struct Proof<'a> {
    input: &'a [u8],
    at: usize,
}

/// An object key already read: where it is, and what ordering it needs.
#[derive(Clone, Copy)]
struct Key {
    /// Its contents, without the quotes, at `start..end` in the input.
    start: usize,
    end: usize,
    /// Its first 8 bytes, big-endian, zero-padded (as [`Member::prefix`]).
    prefix: u64,
    /// No character outside the BMP: byte order is UTF-16 order.
    bmp: bool,
}

impl Key {
    /// Whether `self` sorts strictly before `next` (RFC 8785 order).
    #[inline(always)]
    fn before(&self, next: &Key, input: &[u8]) -> bool {
        if self.bmp && next.bmp {
            if self.prefix != next.prefix {
                return self.prefix < next.prefix;
            }
            return input[self.start..self.end] < input[next.start..next.end];
        }
        // Both validated as UTF-8 when read.
        match (
            std::str::from_utf8(&input[self.start..self.end]),
            std::str::from_utf8(&input[next.start..next.end]),
        ) {
            (Ok(a), Ok(b)) => cmp_utf16(a, b) == Ordering::Less,
            _ => false,
        }
    }
}

impl Proof<'_> {
    /// The value at `self.at`; strings, numbers and literals are read where
    /// they appear (see [`scalar_end`]), so this only recurses into arrays
    /// and objects.
    fn value(&mut self, depth: usize) -> Option<()> {
        match *self.input.get(self.at)? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            _ => {
                self.at = scalar_end(self.input, self.at)?;
                Some(())
            }
        }
    }

    /// The end of the value at `at`.
    #[inline(always)]
    fn value_end(&mut self, at: usize, depth: usize) -> Option<usize> {
        match *self.input.get(at)? {
            b'{' | b'[' => {
                self.at = at;
                self.value(depth)?;
                Some(self.at)
            }
            _ => scalar_end(self.input, at),
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth > FAST_MAX_DEPTH {
            return None;
        }
        let input = self.input;
        let mut at = self.at + 1;
        if *input.get(at)? == b']' {
            self.at = at + 1;
            return Some(());
        }
        loop {
            at = self.value_end(at, depth)?;
            match *input.get(at)? {
                b',' => at += 1,
                b']' => {
                    self.at = at + 1;
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
        let mut at = self.at + 1;
        if *input.get(at)? == b'}' {
            self.at = at + 1;
            return Some(());
        }
        let mut previous: Option<Key> = None;
        loop {
            if *input.get(at)? != b'"' {
                return None;
            }
            // `None` on an escape (or a control byte): not decided here.
            let (end, high, prefix) = scan_key(input, at + 1)?;
            let bmp = !high || {
                let key = &input[at + 1..end];
                std::str::from_utf8(key).ok()?;
                key.iter().all(|&b| b < 0xf0)
            };
            let key = Key {
                start: at + 1,
                end,
                prefix,
                bmp,
            };
            if let Some(previous) = previous {
                if !previous.before(&key, input) {
                    return None;
                }
            }
            previous = Some(key);
            if *input.get(end + 1)? != b':' {
                return None;
            }
            at = self.value_end(end + 2, depth)?;
            match *input.get(at)? {
                b',' => at += 1,
                b'}' => {
                    self.at = at + 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// The end of the string, number or literal at `at` if it is its own
/// canonical form.
#[inline(always)]
pub(super) fn scalar_end(input: &[u8], at: usize) -> Option<usize> {
    match *input.get(at)? {
        b'"' => string_end(input, at),
        b'-' | b'0'..=b'9' => number_end(input, at),
        b't' => literal_end(input, at, b"true"),
        b'f' => literal_end(input, at, b"false"),
        b'n' => literal_end(input, at, b"null"),
        // Whitespace, among others: not canonical.
        _ => None,
    }
}

/// The end of the string token at `at` if it is its own canonical form: no
/// escape, no control byte, UTF-8.
#[inline(always)]
fn string_end(input: &[u8], at: usize) -> Option<usize> {
    let (end, high) = scan_string(input, at + 1);
    if *input.get(end)? != b'"' {
        return None;
    }
    if high {
        std::str::from_utf8(&input[at + 1..end]).ok()?;
    }
    Some(end + 1)
}
