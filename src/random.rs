//! Randomness from the operating system (`getrandom`), for the keyed hashes'
//! secret keys and for ids that must not be guessed.

use std::fmt::Write;

/// `N` bytes from the operating system's random source.
///
/// Panics if the operating system has no usable random source, as the
/// standard library's `RandomState` does: nothing here can be made safe
/// without one.
pub(crate) fn bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).expect("the operating system's random source");
    out
}

/// A random HighwayHash key (four 64-bit lanes, 256 bits): the secret of a
/// keyed hash that no caller can aim collisions at.
pub(crate) fn hash_key() -> highway::Key {
    let b: [u8; 32] = bytes();
    highway::Key(std::array::from_fn(|i| {
        u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
    }))
}

/// A random (version 4) UUID in its hyphenated lower-case form (RFC 9562,
/// section 5.4): 122 random bits, the version and variant bits set.
pub(crate) fn uuid_v4() -> String {
    let mut b: [u8; 16] = bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut out = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_version_4_in_the_hyphenated_form() {
        for _ in 0..64 {
            let id = super::uuid_v4();
            let groups: Vec<&str> = id.split('-').collect();
            assert_eq!(
                groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
                [8, 4, 4, 4, 12]
            );
            assert!(id
                .bytes()
                .all(|c| c == b'-' || c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
            assert_eq!(&groups[2][..1], "4", "{id}: version");
            assert!("89ab".contains(&groups[3][..1]), "{id}: variant");
        }
        assert_ne!(super::uuid_v4(), super::uuid_v4());
    }

    #[test]
    fn draws_differ() {
        let (a, b): ([u8; 16], [u8; 16]) = (super::bytes(), super::bytes());
        assert_ne!(a, b);
        assert_ne!(super::hash_key().0, super::hash_key().0);
    }
}
