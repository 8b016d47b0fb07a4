//! Object members in RFC 8785 key order, and duplicate keys.

use super::*;

/// Objects with more members are sorted with `sort_unstable_by`; fewer are
/// ranked by comparing every pair (quadratic, so only for small objects).
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
    /// `ranked[k]` is the index of the member with the `k`-th key.
    Ranked([u8; SMALL_OBJECT]),
}

/// Orders an object's members by key: `None` on a duplicate key.
pub(super) fn sort_members(members: &mut [Member], input: &[u8]) -> Option<Order> {
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
