//! Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror and
//! Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
//!
//! Every random value kiln produces is a pure function of `(seed, stream,
//! element index)`, so it does not depend on how a backend splits work
//! into threads or blocks, and every backend produces the same bits. A
//! future CUDA backend must reproduce this definition exactly:
//!
//! - **Generator.** Philox4x32 with 10 rounds; multipliers
//!   `M0 = 0xD2511F53`, `M1 = 0xCD9E8D57`; Weyl key increments
//!   `W0 = 0x9E3779B9`, `W1 = 0xBB67AE85`. One round maps counter
//!   `(c0, c1, c2, c3)` and key `(k0, k1)` to
//!   `(hi(M1*c2) ^ c1 ^ k0, lo(M1*c2), hi(M0*c0) ^ c3 ^ k1, lo(M0*c0))`;
//!   the key is bumped by `(W0, W1)` between rounds (as Random123 does).
//! - **Key** `= [seed & 0xffffffff, seed >> 32]`.
//! - **Counter** `= [i & 0xffffffff, i >> 32, stream & 0xffffffff, stream >> 32]`
//!   where `i` is the row-major element index. One Philox call per element,
//!   giving outputs `r0, r1, r2, r3`.
//! - **53-bit uniform** from two words `(a, b)`:
//!   `((((a as u64) << 21) ^ ((b as u64) >> 11)) as f64) * 2^-53`, in `[0, 1)`.
//! - **uniform(seed, stream, i)** `= uniform53(r0, r1)`.
//! - **normal(seed, stream, i)** (Box–Muller, cosine branch):
//!   `u1 = 1 - uniform53(r0, r1)` (in `(0, 1]`, so `ln` is finite),
//!   `u2 = uniform53(r2, r3)`, result `sqrt(-2 ln u1) * cos(2π u2)`,
//!   computed in `f64`.
//!
//! Backends round the `f64` to the node's dtype. For `Uniform`, a value
//! that rounds up to `1.0` in a narrow dtype is replaced by the largest
//! value of that dtype below 1, so `[0, 1)` holds after rounding.

/// First Philox multiplier.
pub const M0: u32 = 0xD251_1F53;
/// Second Philox multiplier.
pub const M1: u32 = 0xCD9E_8D57;
/// Weyl increment of key word 0 (golden ratio).
pub const W0: u32 = 0x9E37_79B9;
/// Weyl increment of key word 1 (sqrt(3) - 1).
pub const W1: u32 = 0xBB67_AE85;

#[inline(always)]
fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = (a as u64) * (b as u64);
    ((p >> 32) as u32, p as u32)
}

/// Philox4x32-10 of one counter under one key: the raw 128 random bits
/// every other function here derives from.
#[inline]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The four output words for element `index` of stream `stream` under `seed`.
#[inline]
pub fn words(seed: u64, stream: u64, index: u64) -> [u32; 4] {
    philox4x32_10(
        [index as u32, (index >> 32) as u32, stream as u32, (stream >> 32) as u32],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// 53 random bits from two words as an `f64` in `[0, 1)`.
#[inline(always)]
pub fn uniform_from(a: u32, b: u32) -> f64 {
    ((((a as u64) << 21) ^ ((b as u64) >> 11)) as f64) * (1.0 / 9_007_199_254_740_992.0)
}

/// A uniform `f64` in `[0, 1)` for element `index` of `stream`.
#[inline]
pub fn uniform(seed: u64, stream: u64, index: u64) -> f64 {
    let r = words(seed, stream, index);
    uniform_from(r[0], r[1])
}

/// A standard normal `f64` for element `index` of `stream` (Box–Muller).
#[inline]
pub fn normal(seed: u64, stream: u64, index: u64) -> f64 {
    let r = words(seed, stream, index);
    let u1 = 1.0 - uniform_from(r[0], r[1]);
    let u2 = uniform_from(r[2], r[3]);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Random123 kat_vectors, philox4x32 with 10 rounds.
    #[test]
    fn known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn counter_and_key_layout() {
        let seed = 0x0123_4567_89ab_cdef_u64;
        let r = words(seed, 0x1111_2222_3333_4444, 0x5555_6666_7777_8888);
        assert_eq!(
            r,
            philox4x32_10([0x7777_8888, 0x5555_6666, 0x3333_4444, 0x1111_2222], [0x89ab_cdef, 0x0123_4567])
        );
    }

    #[test]
    fn uniform_range_and_normal_finite() {
        assert_eq!(uniform_from(0, 0), 0.0);
        assert!(uniform_from(u32::MAX, u32::MAX) < 1.0);
        for i in 0..1000 {
            let u = uniform(7, 3, i);
            assert!((0.0..1.0).contains(&u));
            assert!(normal(7, 3, i).is_finite());
        }
    }
}
