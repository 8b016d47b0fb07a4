//! Flat objects: members that are all strings, numbers and literals, written
//! without whitespace. The objects of an array of records (order lines, say)
//! are usually such: each member is its own canonical text, and only their
//! order changes, and each usually has the keys of the one before, in the
//! same order: then the last one's [`Shape`] is checked and reused.

use super::canonical::scalar_end;
use super::scan::{append, scan_key};
use super::*;

/// Flat objects with more members go to [`FastCanonical::object`].
const FLAT_MAX: usize = 16;

/// The keys of the last flat object read the long way, in the order they
/// came, and where each goes in key order.
#[derive(Clone, Copy, Default)]
pub(in crate::fingerprint) struct Shape {
    /// Members (0: no shape to reuse).
    n: u8,
    /// Member `i`'s `"key":`, as they came.
    keys: [ShapeKey; FLAT_MAX],
    /// `order[k]`: which member (as they came) has the `k`-th key.
    order: [u8; FLAT_MAX],
}

/// A `"key":` of a [`Shape`].
#[derive(Clone, Copy, Default)]
struct ShapeKey {
    /// Its first 16 bytes, little-endian, and the mask of those that are its.
    bytes: u128,
    mask: u128,
    /// Where it is in the input, and its length (0: too long to note).
    at: u32,
    len: u8,
}

impl ShapeKey {
    /// The `len` bytes at `at`.
    #[inline(always)]
    fn new(input: &[u8], at: usize, len: usize) -> Option<Self> {
        let len = u8::try_from(len).unwrap_or(0);
        let mask = u128::MAX
            .checked_shr(8 * (16 - u32::from(len.min(16))))
            .unwrap_or(0);
        let bytes = match input.get(at..).and_then(|rest| rest.first_chunk::<16>()) {
            Some(chunk) => u128::from_le_bytes(*chunk) & mask,
            None => 0,
        };
        Some(Self {
            bytes,
            mask,
            at: u32::try_from(at).ok()?,
            len,
        })
    }

    /// Whether the input at `at` starts with this key (`None` past the end).
    #[inline(always)]
    fn at(&self, input: &[u8], at: usize) -> Option<bool> {
        if self.len <= 16 {
            if let Some(chunk) = input.get(at..).and_then(|rest| rest.first_chunk::<16>()) {
                return Some((u128::from_le_bytes(*chunk) ^ self.bytes) & self.mask == 0);
            }
        }
        let (key, len) = (self.at as usize, usize::from(self.len));
        Some(input.get(at..at + len)? == &input[key..key + len])
    }
}

/// One member: its key's prefix (as [`Member::prefix`]) and where its text,
/// `"key":value`, is in the input.
#[derive(Clone, Copy, Default)]
struct Flat {
    prefix: u64,
    from: u32,
    to: u32,
}

impl FastCanonical<'_, '_> {
    /// Writes the object at `self.at` if it is flat, its keys ASCII and told
    /// apart by their first 8 bytes (at most [`FLAT_MAX`] of them): `None`, with nothing written and
    /// `self.at` unchanged, for any other (which [`Self::object`] then
    /// reads from the start).
    // Inlined only where frames are small: in an unoptimised build, its
    // array and locals would swell every frame of the recursion through
    // nested values past what a 256 KiB thread stack holds.
    #[cfg_attr(debug_assertions, inline(never))]
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub(in crate::fingerprint) fn flat_object(&mut self) -> Option<()> {
        if self.same_shape().is_some() {
            return Some(());
        }
        let input = self.input;
        let mut at = self.at + 1;
        let mut members = [Flat::default(); FLAT_MAX];
        // As `Shape`: which member came `k`-th in key order, and each `"key":`.
        let mut order = [0u8; FLAT_MAX];
        let mut keys = [ShapeKey::default(); FLAT_MAX];
        let mut n = 0;
        if *input.get(at)? == b'}' {
            return None; // `{}`: left to the general path, which is as quick
        }
        loop {
            if *input.get(at)? != b'"' || n == FLAT_MAX {
                return None;
            }
            let (key_end, high, prefix) = scan_key(input, at + 1)?;
            // A non-ASCII key may need UTF-16 order: left to the general path.
            if high || *input.get(key_end + 1)? != b':' {
                return None;
            }
            let value = key_end + 2;
            let end = scalar_end(input, value)?;
            // A key too long to note is read the long way next time too.
            keys[n] = ShapeKey::new(input, at, value - at)?;
            // Insertion by prefix, which orders ASCII keys whose prefixes
            // differ. Equal prefixes (a duplicate key, or two long keys that
            // start alike) are left to the general path.
            let mut k = n;
            while k > 0 && members[k - 1].prefix > prefix {
                members[k] = members[k - 1];
                order[k] = order[k - 1];
                k -= 1;
            }
            if k > 0 && members[k - 1].prefix == prefix {
                return None;
            }
            members[k] = Flat {
                prefix,
                from: u32::try_from(at).ok()?,
                to: u32::try_from(end).ok()?,
            };
            order[k] = n as u8;
            n += 1;
            match input.get(end..end + 2) {
                Some(b",\"") => at = end + 1,
                _ if input.get(end) == Some(&b'}') => {
                    self.at = end + 1;
                    break;
                }
                _ => return None,
            }
        }
        self.shape = Shape {
            n: if keys[..n].iter().all(|k| k.len > 0) {
                n as u8
            } else {
                0
            },
            keys,
            order,
        };
        let out = &mut self.buf.out;
        out.push(b'{');
        for (i, member) in members[..n].iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            append(out, input, member.from as usize, member.to as usize);
        }
        out.push(b'}');
        Some(())
    }
}

impl FastCanonical<'_, '_> {
    /// Writes the object at `self.at` if its members have the keys of the
    /// last [`Shape`], in the same order, and values [`Self::flat_object`]
    /// takes: then their key order is the shape's. `None`, with nothing
    /// written and `self.at` unchanged, for any other.
    #[inline(always)]
    fn same_shape(&mut self) -> Option<()> {
        let input = self.input;
        let shape = &self.shape;
        let n = usize::from(shape.n);
        if n == 0 {
            return None;
        }
        let mut spans = [(0u32, 0u32); FLAT_MAX];
        let mut at = self.at + 1;
        for (i, key) in shape.keys[..n].iter().enumerate() {
            // The same bytes as a key already read: the same key, quotes
            // and colon included.
            if !key.at(input, at)? {
                return None;
            }
            let end = scalar_end(input, at + usize::from(key.len))?;
            spans[i] = (at as u32, end as u32);
            match *input.get(end)? {
                b',' if i + 1 < n => at = end + 1,
                b'}' if i + 1 == n => at = end + 1,
                _ => return None,
            }
        }
        let out = &mut self.buf.out;
        out.push(b'{');
        for (k, &i) in shape.order[..n].iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            let (from, to) = spans[usize::from(i)];
            append(out, input, from as usize, to as usize);
        }
        out.push(b'}');
        self.at = at;
        Some(())
    }
}
