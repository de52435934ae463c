//! Philox4x32-10, the counter-based generator of Salmon et al., "Parallel
//! random numbers: as easy as 1, 2, 3" (SC'11), as in Random123, cuRAND and
//! PyTorch's CUDA generator.
//!
//! Counter-based means the output is a pure function of (counter, key): any
//! element's random number can be computed independently, in any order, on
//! any device. That is what lets a recomputed forward pass and every backend
//! draw exactly the dropout mask this interpreter draws.

/// Multipliers of the two S-boxes.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
/// Weyl-sequence key increments (golden ratio, √3 − 1).
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The high and low 32 bits of `a·b`.
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// Ten Philox rounds of `counter` under `key`; the key is bumped between
/// rounds (Random123's `philox4x32_R(10, …)`).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The Philox key of a 64-bit seed: `(low 32 bits, high 32 bits)`.
pub fn key_of(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors (`kat_vectors`, philox4x32 10 rounds).
    #[test]
    fn random123_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn seeds_split_into_two_key_words() {
        assert_eq!(key_of(0x0123_4567_89ab_cdef), [0x89ab_cdef, 0x0123_4567]);
    }
}
