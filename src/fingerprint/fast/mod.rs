//! The single-pass canonicaliser for the JSON most requests carry.

use super::*;

mod canonical;
mod flat;
mod order;
mod scan;

pub(super) use self::canonical::is_canonical;
pub(super) use self::flat::Shape;

use self::order::{order, Order, Ranking};
use self::scan::{append, literal_end, scan_key, scan_string, token};

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
    /// The keys of the last flat object (see [`flat`]).
    pub(super) shape: Shape,
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
/// input fits u32 (and so does every offset into the output, which is never
/// longer than the input: only whitespace and escapes change length).
const FAST_MAX_LEN: usize = (u32::MAX / 8) as usize;

impl FastCanonical<'_, '_> {
    pub(super) fn document(&mut self) -> Option<()> {
        if self.input.len() > FAST_MAX_LEN {
            return None;
        }
        // Room for the members of a few nested objects: no regrowth from
        // an empty Vec (4, 8, 16, ...) on typical bodies.
        self.members.reserve(32);
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
            b'{' if depth < FAST_MAX_DEPTH && self.flat_object().is_some() => Some(()),
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

    /// A number: its literal, as written.
    fn number(&mut self) -> Option<()> {
        let end = number_end(self.input, self.at)?;
        append(&mut self.buf.out, self.input, self.at, end);
        self.at = end;
        Some(())
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
        // escapes, a number, a literal) is only recorded here, and
        // written once, in key order, at the end ("pending"). The others are
        // written as they come, and moved at the end if needed.
        self.buf.out.push(b'{');
        let body = self.buf.out.len();
        // This object's members are `self.members[first..]` (nested objects
        // push theirs above, and pop them before returning).
        let first = self.members.len();
        let mut pending = 0;
        // A pending member precedes a written one in `members`.
        let mut interleaved = false;
        let mut ranking = Ranking::NEW;
        loop {
            if b != b'"' {
                return None;
            }
            let key_start = at;
            // Keys with escapes are rare: the serde_json path handles them.
            let (key_end, high, prefix) = scan_key(input, key_start + 1)?;
            let key_len = key_end - key_start - 1;
            let bmp = !high || {
                let key = &input[key_start + 1..key_end];
                std::str::from_utf8(key).ok()?;
                key.iter().all(|&b| b < 0xf0)
            };
            // `"key":v` with no whitespace (the member is its own canonical
            // text) is the common case: two bytes read at once.
            let compact = match input.get(key_end + 1..key_end + 3) {
                Some(&[b':', v]) if v > b' ' => {
                    (at, b) = (key_end + 2, v);
                    true
                }
                _ => {
                    let (colon, c) = token(input, key_end + 1)?;
                    if c != b':' {
                        return None;
                    }
                    (at, b) = token(input, colon + 1)?;
                    false
                }
            };
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
                b'-' | b'0'..=b'9' => number_end(input, at),
                b't' => literal_end(input, at, b"true"),
                b'f' => literal_end(input, at, b"false"),
                b'n' => literal_end(input, at, b"null"),
                _ => None,
            };
            let (from, to, text) = match source_end {
                Some(end) if compact => {
                    let member = (key_start as u32, end as u32, Text::Source);
                    at = end;
                    pending += 1;
                    member
                }
                Some(end) => {
                    let member = (at as u32, end as u32, Text::Spaced);
                    at = end;
                    pending += 1;
                    member
                }
                None => {
                    if pending > 0 {
                        if ranking.in_arrival_order(self.members.len() - first) {
                            // In key order so far: the pending members are
                            // written now, so that nothing moves at the end
                            // if the whole object is in key order.
                            let members = &mut self.members[first..];
                            write_pending(&mut self.buf.out, body, input, members)?;
                            pending = 0;
                        } else {
                            interleaved = true;
                        }
                    }
                    let out = &mut self.buf.out;
                    if out.len() > body {
                        out.push(b',');
                    }
                    let from = out.len() - body;
                    out.extend_from_slice(&input[key_start..key_end + 1]);
                    out.push(b':');
                    self.at = at;
                    self.value(depth)?;
                    at = self.at;
                    let to = self.buf.out.len() - body;
                    (
                        u32::try_from(from).ok()?,
                        u32::try_from(to).ok()?,
                        Text::Written,
                    )
                }
            };
            ranking.add(&self.members[first..], prefix, bmp);
            self.members.push(Member {
                prefix,
                key: key_start as u32,
                key_len: key_len as u32,
                from,
                to,
                text,
                bmp,
            });
            // `,"` (the next key, no whitespace) read at once.
            if let Some(b",\"") = input.get(at..at + 2) {
                (at, b) = (at + 1, b'"');
                continue;
            }
            (at, b) = token(input, at)?;
            match b {
                b',' => (at, b) = token(input, at + 1)?,
                b'}' => break,
                _ => return None,
            }
        }
        self.at = at + 1;
        let members = &mut self.members[first..];
        let order = order(members, ranking, input)?;
        let out = &mut self.buf.out;
        // In key order, with no pending member before a written one: the
        // written members are in place, and the pending ones, last in
        // `members`, follow. Otherwise the written members move to `scratch`,
        // and then every member is written in key order.
        let start = if matches!(order, Order::Arrival) && !interleaved {
            members.len() - pending
        } else {
            if out.len() > body {
                let scratch = &mut self.buf.scratch;
                scratch.clear();
                scratch.extend_from_slice(&out[body..]);
                out.truncate(body);
            }
            0
        };
        let scratch = &self.buf.scratch;
        for k in start..members.len() {
            let member = match order {
                Order::Ranked(ranked) => &members[(ranked >> (4 * k)) as usize & 0xf],
                _ => &members[k],
            };
            if out.len() > body {
                out.push(b',');
            }
            let (from, to) = (member.from as usize, member.to as usize);
            match member.text {
                Text::Source => append(out, input, from, to),
                Text::Spaced => write_spaced(out, input, member),
                Text::Written => out.extend_from_slice(&scratch[from..to]),
            }
        }
        out.push(b'}');
        self.members.truncate(first);
        Some(())
    }
}

/// Writes a `Text::Spaced` member without the whitespace.
#[inline(always)]
fn write_spaced(out: &mut Vec<u8>, input: &[u8], member: &Member) {
    let key_start = member.key as usize;
    let key_end = key_start + member.key_len as usize + 2;
    append(out, input, key_start, key_end);
    out.push(b':');
    append(out, input, member.from as usize, member.to as usize);
}

/// Writes the members of an object not written yet (`Text::Source` and
/// `Text::Spaced`), in the order given, after those written (`out[body..]`),
/// and marks them written.
#[inline(never)]
fn write_pending(
    out: &mut Vec<u8>,
    body: usize,
    input: &[u8],
    members: &mut [Member],
) -> Option<()> {
    for member in members {
        let from = out.len() - body;
        match member.text {
            Text::Written => continue,
            Text::Source => {
                if from > 0 {
                    out.push(b',');
                }
                append(out, input, member.from as usize, member.to as usize);
            }
            Text::Spaced => {
                if from > 0 {
                    out.push(b',');
                }
                write_spaced(out, input, member);
            }
        }
        member.from = u32::try_from(from + usize::from(from > 0)).ok()?;
        member.to = u32::try_from(out.len() - body).ok()?;
        member.text = Text::Written;
    }
    Some(())
}
