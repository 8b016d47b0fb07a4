//! Object members in RFC 8785 key order, and duplicate keys.

use super::*;

/// Objects with more members are sorted with `sort_unstable_by`; fewer are
/// ranked by comparing every pair (quadratic, so only for small objects),
/// by their prefixes as they are read, and in full if those do not decide.
const SMALL_OBJECT: usize = 16;

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
pub(super) enum Order {
    /// As they came: their keys are in order.
    Arrival,
    /// As they are now: sorted in place.
    Sorted,
    /// Nibble `k` (bits `4k..4k + 4`) is the index of the member with the
    /// `k`-th key.
    Ranked(u64),
}

/// Ranks 0, 1, 2, ... in nibbles 0, 1, 2, ...: the identity permutation.
const IDENTITY: u64 = 0xfedc_ba98_7654_3210;

/// The key order of an object's first 16 members by their prefixes, kept
/// while the members are read (so no separate pass over them).
#[derive(Clone, Copy)]
pub(super) struct Ranking {
    /// Nibble `k`: the index of the member with the `k`-th key so far.
    ranked: u64,
    /// Two prefixes are equal or a key is outside the BMP: the prefixes do
    /// not decide, [`sort_members`] does.
    undecided: bool,
}

impl Ranking {
    pub(super) const NEW: Self = Self {
        ranked: 0,
        undecided: false,
    };

    /// The first `n` members of the object, all ranked, are in key order.
    #[inline(always)]
    pub(super) fn in_arrival_order(&self, n: usize) -> bool {
        n <= SMALL_OBJECT && !self.undecided && self.ranked == IDENTITY & used(n)
    }

    /// Ranks the member with `prefix` after the `earlier` members of its
    /// object: it goes after those whose keys are below its own.
    #[inline(always)]
    pub(super) fn add(&mut self, earlier: &[Member], prefix: u64, bmp: bool) {
        let j = earlier.len();
        if j >= SMALL_OBJECT {
            return; // sorted by `sort_members`
        }
        let mut below = 0;
        let mut undecided = !bmp;
        for a in earlier {
            below += u32::from(a.prefix < prefix);
            undecided |= a.prefix == prefix;
        }
        self.undecided |= undecided;
        self.ranked = insert(self.ranked, below, j);
    }
}

/// The nibbles of the first `n` members (`n <= 16`).
#[inline(always)]
fn used(n: usize) -> u64 {
    u64::MAX.checked_shr(4 * (16 - n) as u32).unwrap_or(0)
}

/// Inserts index `j` at position `at` (`at <= j < 16`) of a list of nibbles.
#[inline(always)]
fn insert(ranked: u64, at: u32, j: usize) -> u64 {
    let low = (1u64 << (4 * at)) - 1;
    (ranked & low) | ((j as u64) << (4 * at)) | ((ranked & !low) << 4)
}

/// Orders an object's members by key, ranked by `ranking` as they were
/// read: `None` on a duplicate key.
#[inline(always)]
pub(super) fn order(members: &mut [Member], ranking: Ranking, input: &[u8]) -> Option<Order> {
    let n = members.len();
    if n > SMALL_OBJECT || ranking.undecided {
        return sort_members(members, input);
    }
    Some(if ranking.ranked == IDENTITY & used(n) {
        Order::Arrival
    } else {
        Order::Ranked(ranking.ranked)
    })
}

/// Orders an object's members by comparing their keys in full: `None` on a
/// duplicate key.
#[inline(never)]
fn sort_members(members: &mut [Member], input: &[u8]) -> Option<Order> {
    if in_order(members, input) {
        return Some(Order::Arrival);
    }
    let n = members.len();
    if n <= SMALL_OBJECT {
        let mut ranked = 0;
        for (j, b) in members.iter().enumerate() {
            let mut below = 0;
            for a in &members[..j] {
                match key_order(a, b, input) {
                    Ordering::Less => below += 1,
                    Ordering::Greater => {}
                    Ordering::Equal => return None, // a duplicate key
                }
            }
            ranked = insert(ranked, below, j);
        }
        return Some(Order::Ranked(ranked));
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
