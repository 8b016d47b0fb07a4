//! Randomness from the operating system (`getrandom`), for the keyed hashes'
//! secret keys and for ids that must not be guessed.

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

/// Four random 64-bit lanes: a HighwayHash key.
pub(crate) fn lanes() -> [u64; 4] {
    let b: [u8; 32] = bytes();
    std::array::from_fn(|i| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_differ() {
        let (a, b): ([u8; 16], [u8; 16]) = (super::bytes(), super::bytes());
        assert_ne!(a, b);
        assert_ne!(super::lanes(), super::lanes());
    }
}
