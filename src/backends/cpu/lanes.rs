//! Reductions of one lane (a row): the one definition of their order,
//! shared by the unfused reduction kernel and the fused row kernels, so the
//! two agree to the bit.
//!
//! A float sum accumulates in `f64` over [`LANES`] interleaved partial
//! sums (element `i` goes to partial `i % LANES`), then adds the partials
//! pairwise (`p[j] += p[j + w]` for `w` = 8, 4, 2, 1). That order is fixed
//! by the lane's length alone, never by threads or blocks, and it is what
//! makes the sum vectorize: one strict left-to-right chain of `f64` adds
//! runs at one add per 4 cycles, the partials at several per cycle. It is
//! also a little more accurate than one chain.
//!
//! Max and min are exact whatever the order, save two cases the vector
//! loop hands to the scalar definition ([`extreme_iter`]): a lane with a
//! NaN (the first NaN wins) and a zero result (the first of `-0.0`/`0.0`
//! wins).

use super::storage::Elem;

/// Interleaved partial sums per lane.
pub(crate) const LANES: usize = 16;

#[inline(always)]
fn combine(mut p: [f64; LANES]) -> f64 {
    let mut w = LANES / 2;
    while w > 0 {
        for j in 0..w {
            p[j] += p[j + w];
        }
        w /= 2;
    }
    p[0]
}

/// The sum of a strided lane, in `f64`, in the order of [`sum_f64`].
pub(crate) fn sum_f64_iter(it: impl Iterator<Item = f64>) -> f64 {
    let mut p = [0f64; LANES];
    for (i, v) in it.enumerate() {
        p[i % LANES] += v;
    }
    combine(p)
}

#[inline(always)]
fn sum_slice<T: Elem>(lane: &[T]) -> f64 {
    let mut p = [0f64; LANES];
    let chunks = lane.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            p[j] += c[j].to_f64();
        }
    }
    for (j, v) in rest.iter().enumerate() {
        p[j] += v.to_f64();
    }
    combine(p)
}

/// The sum of a dense lane, in `f64` (see the module docs for the order).
pub(crate) fn sum_f64<T: Elem>(lane: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports avx2 (checked just above).
        return unsafe { sum_avx2(lane) };
    }
    sum_slice(lane)
}

/// [`sum_slice`] compiled for AVX2 (same operations, wider vectors).
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2<T: Elem>(lane: &[T]) -> f64 {
    sum_slice(lane)
}

#[inline(always)]
fn is_nan<T: PartialEq>(v: T) -> bool {
    #[allow(clippy::eq_op)]
    let nan = v != v;
    nan
}

/// The max (or min) of a lane, left to right, the first NaN if any; the
/// definition the vector loop must match.
pub(crate) fn extreme_iter<T: Elem>(mut lane: impl Iterator<Item = T>, want_max: bool) -> T {
    let Some(mut acc) = lane.next() else { return T::default() };
    if is_nan(acc) {
        return acc;
    }
    for v in lane {
        if is_nan(v) {
            return v;
        }
        if (want_max && v > acc) || (!want_max && v < acc) {
            acc = v;
        }
    }
    acc
}

const MAX_LANES: usize = 8;

/// The vector loop: per-lane extremes and whether a NaN was seen.
#[inline(always)]
fn extreme_lanes<T: Elem>(lane: &[T], want_max: bool) -> (T, bool) {
    let mut m = [lane[0]; MAX_LANES];
    let mut nan = [false; MAX_LANES];
    let chunks = lane.chunks_exact(MAX_LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..MAX_LANES {
            let v = c[j];
            nan[j] |= is_nan(v);
            let better = if want_max { v > m[j] } else { v < m[j] };
            m[j] = if better { v } else { m[j] };
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        nan[j] |= is_nan(v);
        let better = if want_max { v > m[j] } else { v < m[j] };
        m[j] = if better { v } else { m[j] };
    }
    let mut best = m[0];
    for &v in &m[1..] {
        if (want_max && v > best) || (!want_max && v < best) {
            best = v;
        }
    }
    (best, nan.iter().any(|&n| n) || is_nan(lane[0]))
}

/// The max (or min) of a dense lane, as [`extreme_iter`] defines it.
pub(crate) fn extreme<T: Elem>(lane: &[T], want_max: bool) -> T {
    if lane.is_empty() {
        return T::default();
    }
    #[cfg(target_arch = "x86_64")]
    let (best, nan) = if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports avx2 (checked just above).
        unsafe { extreme_avx2(lane, want_max) }
    } else {
        extreme_lanes(lane, want_max)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (best, nan) = extreme_lanes(lane, want_max);
    if nan || (T::DTYPE.is_float() && best == T::default()) {
        return extreme_iter(lane.iter().copied(), want_max);
    }
    best
}

/// [`extreme_lanes`] compiled for AVX2.
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn extreme_avx2<T: Elem>(lane: &[T], want_max: bool) -> (T, bool) {
    extreme_lanes(lane, want_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes of every length up to 70 (every tail of the 16- and 8-wide
    /// loops), of well-spread values.
    fn lanes() -> Vec<Vec<f32>> {
        (0..70)
            .map(|n| (0..n).map(|i| ((i * 7919 % 113) as f32 - 56.0) * 0.37 + (i as f32).sin()).collect())
            .collect()
    }

    #[test]
    fn the_slice_sum_is_the_strided_sum_bit_for_bit_and_close_to_the_exact_one() {
        for l in lanes() {
            let fast = sum_f64(&l);
            assert_eq!(fast.to_bits(), sum_f64_iter(l.iter().map(|&v| v as f64)).to_bits());
            assert_eq!(fast.to_bits(), sum_slice(&l).to_bits(), "the AVX2 copy differs");
            let exact: f64 = l.iter().map(|&v| v as f64).sum();
            assert!((fast - exact).abs() <= 1e-12 * l.iter().map(|v| v.abs() as f64).sum::<f64>());
        }
    }

    #[test]
    fn max_and_min_match_the_scalar_definition_with_nans_and_signed_zeros() {
        let mut cases = lanes();
        cases.push(vec![-0.0, 0.0, -1.0]);
        cases.push(vec![0.0, -0.0, -1.0]);
        cases.push(vec![-3.0; 19]);
        let mut nan = lanes()[40].clone();
        nan[33] = f32::from_bits(0x7fc0_0001);
        nan[37] = f32::NAN;
        cases.push(nan);
        for l in &cases {
            for want_max in [true, false] {
                let want = extreme_iter(l.iter().copied(), want_max);
                let got = extreme(l, want_max);
                assert_eq!(got.to_bits(), want.to_bits(), "{l:?} max={want_max}");
                let wide: Vec<f64> = l.iter().map(|&v| v as f64).collect();
                let got64 = extreme(&wide, want_max);
                assert_eq!(got64.to_bits(), extreme_iter(wide.iter().copied(), want_max).to_bits());
            }
        }
        let ints: Vec<i32> = (0..37).map(|i| (i * 7919 % 113) - 56).collect();
        assert_eq!(extreme(&ints, true), *ints.iter().max().unwrap());
        assert_eq!(extreme(&ints, false), *ints.iter().min().unwrap());
    }
}
