//! Flat objects: members that are all strings, numbers and literals, written
//! without whitespace. The objects of an array of records (order lines, say)
//! are usually such: each member is its own canonical text, and only their
//! order changes.

use super::scan::{append, literal_end, scan_key, scan_string};
use super::*;

/// Flat objects with more members go to [`FastCanonical::object`].
const FLAT_MAX: usize = 16;

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
        let input = self.input;
        let mut at = self.at + 1;
        let mut members = [Flat::default(); FLAT_MAX];
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
            let end = match *input.get(value)? {
                b'"' => {
                    let (end, high) = scan_string(input, value + 1);
                    if *input.get(end)? != b'"' {
                        return None;
                    }
                    if high {
                        std::str::from_utf8(&input[value + 1..end]).ok()?;
                    }
                    end + 1
                }
                b'-' | b'0'..=b'9' => number_end(input, value)?,
                b't' => literal_end(input, value, b"true")?,
                b'f' => literal_end(input, value, b"false")?,
                b'n' => literal_end(input, value, b"null")?,
                _ => return None,
            };
            // Insertion by prefix, which orders ASCII keys whose prefixes
            // differ. Equal prefixes (a duplicate key, or two long keys that
            // start alike) are left to the general path.
            let mut k = n;
            while k > 0 && members[k - 1].prefix > prefix {
                members[k] = members[k - 1];
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
