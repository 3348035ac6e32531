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

/// The partials' pairwise sum, the last step of every sum here (kept
/// one definition so that a kernel filling the partials itself, as the
/// AVX-512 softmax does, ends in the same bits).
#[inline(always)]
pub(crate) fn combine(mut p: [f64; LANES]) -> f64 {
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
    // From partial 0: whole rounds of the partials, then the rest.
    add_run_plain(&mut p, 0, lane);
    combine(p)
}

/// The sum of a dense lane, in `f64` (see the module docs for the order).
pub(crate) fn sum_f64<T: Elem>(lane: &[T]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if let Some(l) = as_f32(lane) {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports avx2 (checked just above).
            return unsafe { sum_f32_avx2(l) };
        }
    }
    sum_slice(lane)
}

/// The sum of `f(v)` over a dense `f32` lane, in `f64`, in the order of
/// [`sum_f64`]: the bits of `sum_f64` of the mapped lane, without storing
/// it (a row kernel's sum of a value it computes, as layer norm's squared
/// deviations). Inlined into the caller, so it runs in the caller's
/// vector width.
#[inline(always)]
pub(crate) fn sum_f64_of(lane: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut p = [0f64; LANES];
    let chunks = lane.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            p[j] += f(c[j]) as f64;
        }
    }
    for (j, &v) in rest.iter().enumerate() {
        p[j] += f(v) as f64;
    }
    combine(p)
}

/// The sums of columns `j0 .. j0 + out.len()` of a dense row-major
/// block of `rows` rows (row `i` starts at `x[i * stride]`), in `f64`,
/// each the bits of [`sum_f64_iter`] down its column (row `i` into
/// partial `i % LANES`, the partials combined as ever), but walked row by
/// row: the loads are contiguous and the adds vectorize across columns,
/// where walking each column alone jumps a row per element. A bias
/// gradient (a sum over the batch) is this.
pub(crate) fn sum_columns<T: Elem>(x: &[T], stride: usize, rows: usize, j0: usize, out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports avx2 (checked just above).
        return unsafe { sum_columns_avx2(x, stride, rows, j0, out) };
    }
    sum_columns_plain(x, stride, rows, j0, out)
}

/// [`sum_columns`] compiled for AVX2: the same adds, four at a time.
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_columns_avx2<T: Elem>(x: &[T], stride: usize, rows: usize, j0: usize, out: &mut [f64]) {
    sum_columns_plain(x, stride, rows, j0, out)
}

#[inline(always)]
fn sum_columns_plain<T: Elem>(x: &[T], stride: usize, rows: usize, j0: usize, out: &mut [f64]) {
    let width = out.len();
    let mut p = vec![0f64; LANES * width];
    for i in 0..rows {
        let row = &x[i * stride + j0..][..width];
        let acc = &mut p[(i % LANES) * width..][..width];
        for (a, v) in acc.iter_mut().zip(row) {
            *a += v.to_f64();
        }
    }
    for (j, o) in out.iter_mut().enumerate() {
        *o = combine(std::array::from_fn(|l| p[l * width + j]));
    }
}

/// Adds `run`, the elements `start..start + run.len()` of a lane, to the
/// lane's partials: element `i` of the lane into partial `i % LANES`, as
/// [`sum_f64_iter`] adds it, so a lane added run by run in order, then
/// [`combine`]d, is that function's bits. A lane made of dense runs (a
/// bias gradient sums `h * w` runs of each image) reads each run as a
/// slice, where the strided walk cost an index step per element.
pub(crate) fn add_run<T: Elem>(p: &mut [f64; LANES], start: usize, run: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports avx2 (checked just above).
        return unsafe { add_run_avx2(p, start, run) };
    }
    add_run_plain(p, start, run)
}

/// [`add_run`] compiled for AVX2: the same adds, four at a time.
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_run_avx2<T: Elem>(p: &mut [f64; LANES], start: usize, run: &[T]) {
    add_run_plain(p, start, run)
}

#[inline(always)]
fn add_run_plain<T: Elem>(p: &mut [f64; LANES], start: usize, run: &[T]) {
    // Up to the next partial 0, then whole rounds of the partials.
    let head = ((LANES - start % LANES) % LANES).min(run.len());
    for (j, v) in run[..head].iter().enumerate() {
        p[(start + j) % LANES] += v.to_f64();
    }
    let chunks = run[head..].chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            p[j] += c[j].to_f64();
        }
    }
    for (j, v) in rest.iter().enumerate() {
        p[j] += v.to_f64();
    }
}

/// `lane` as `&[f32]` when `T` is `f32`.
fn as_f32<T: Elem>(lane: &[T]) -> Option<&[f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: `T` is `f32` (the same type id), so the slice is a `&[f32]`.
        Some(unsafe { std::slice::from_raw_parts(lane.as_ptr().cast::<f32>(), lane.len()) })
    } else {
        None
    }
}

/// [`sum_slice`] for `f32` with AVX2: partials 0-3, 4-7, 8-11, 12-15 are
/// four `f64x4` registers, each element converted and added to exactly
/// the partial [`sum_slice`] adds it to, so the result is the same bits.
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_f32_avx2(lane: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let chunks = lane.chunks_exact(LANES);
    let rest = chunks.remainder();
    let mut acc = [_mm256_setzero_pd(); 4];
    for c in chunks {
        // SAFETY: `c` has 16 elements: two unaligned 8-float loads.
        let (lo, hi) = unsafe { (_mm256_loadu_ps(c.as_ptr()), _mm256_loadu_ps(c.as_ptr().add(8))) };
        acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
        acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(lo)));
        acc[2] = _mm256_add_pd(acc[2], _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
        acc[3] = _mm256_add_pd(acc[3], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(hi)));
    }
    let mut p = [0f64; LANES];
    for (k, a) in acc.iter().enumerate() {
        // SAFETY: `p[4k..4k+4]` is four f64s.
        unsafe { _mm256_storeu_pd(p.as_mut_ptr().add(4 * k), *a) };
    }
    for (j, v) in rest.iter().enumerate() {
        p[j] += *v as f64;
    }
    combine(p)
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
    if let Some(l) = as_f32(lane) {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports avx2 (checked just above).
            let (best, nan) = unsafe { extreme_f32_avx2(l, want_max) };
            if !nan && best != 0.0 {
                // `T` is `f32`: the round trip through `f64` is exact.
                return T::from_f64(best as f64);
            }
            return extreme_iter(lane.iter().copied(), want_max);
        }
    }
    let (best, nan) = extreme_lanes(lane, want_max);
    if nan || (T::DTYPE.is_float() && best == T::default()) {
        return extreme_iter(lane.iter().copied(), want_max);
    }
    best
}

/// [`extreme_lanes`] for `f32` with AVX2: `max_ps(v, m)` is `v > m ? v :
/// m` lane by lane, the same select, and NaNs are flagged per lane. Four
/// accumulators, 32 elements an iteration: one `max_ps` chain waits out
/// its latency at every vector (a softmax row's max took a quarter of the
/// kernel), and the extreme of a lane without NaN is the same whichever
/// way it is grouped (a zero result, where the sign could differ, goes to
/// the scalar definition).
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn extreme_f32_avx2(lane: &[f32], want_max: bool) -> (f32, bool) {
    use std::arch::x86_64::*;
    let pick = |v: __m256, m: __m256| if want_max { _mm256_max_ps(v, m) } else { _mm256_min_ps(v, m) };
    let wide = lane.chunks_exact(4 * MAX_LANES);
    let narrow = wide.remainder().chunks_exact(MAX_LANES);
    let rest = narrow.remainder();
    let mut m = [_mm256_set1_ps(lane[0]); 4];
    let mut nan = [_mm256_setzero_ps(); 2];
    for c in wide {
        for k in 0..4 {
            // SAFETY: `c` has 32 elements: `8k..8k+8` is inside it.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(MAX_LANES * k)) };
            nan[k % 2] = _mm256_or_ps(nan[k % 2], _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            m[k] = pick(v, m[k]);
        }
    }
    for c in narrow {
        // SAFETY: `c` has 8 elements.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        nan[0] = _mm256_or_ps(nan[0], _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        m[0] = pick(v, m[0]);
    }
    let m = pick(pick(m[0], m[1]), pick(m[2], m[3]));
    let nan = _mm256_or_ps(nan[0], nan[1]);
    let mut lanes = [0f32; MAX_LANES];
    // SAFETY: `lanes` is eight f32s.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let mut any_nan = _mm256_movemask_ps(nan) != 0 || lane[0].is_nan();
    for (j, &v) in rest.iter().enumerate() {
        any_nan |= v.is_nan();
        let better = if want_max { v > lanes[j] } else { v < lanes[j] };
        lanes[j] = if better { v } else { lanes[j] };
    }
    let mut best = lanes[0];
    for &v in &lanes[1..] {
        if (want_max && v > best) || (!want_max && v < best) {
            best = v;
        }
    }
    (best, any_nan)
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
    fn column_sums_are_the_strided_sums_bit_for_bit() {
        for rows in [0, 1, 5, 16, 17, 40] {
            let (stride, j0, width) = (23, 3, 19);
            let x: Vec<f32> = (0..rows * stride).map(|i| ((i * 7919 % 113) as f32 - 56.0) * 0.37).collect();
            let mut got = vec![f64::NAN; width];
            sum_columns(&x, stride, rows, j0, &mut got);
            for (j, g) in got.iter().enumerate() {
                let want = sum_f64_iter((0..rows).map(|i| x[i * stride + j0 + j] as f64));
                assert_eq!(g.to_bits(), want.to_bits(), "rows {rows} column {j}");
            }
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
        // Past the 32-wide loop: a NaN in each of its four accumulators,
        // in the 8-wide loop and in the tail; a zero maximum.
        for at in [3, 12, 21, 30, 70, 99] {
            let mut l: Vec<f32> = (0..101).map(|i| ((i * 7919 % 113) as f32 - 56.0) * 0.37).collect();
            l[at] = f32::NAN;
            cases.push(l);
        }
        let mut zeros: Vec<f32> = (0..77).map(|i| -1.0 - i as f32).collect();
        zeros[40] = -0.0;
        zeros[50] = 0.0;
        cases.push(zeros);
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

    /// A lane added as runs of every length from every start gives
    /// [`sum_f64_iter`]'s bits.
    #[test]
    fn a_lane_added_run_by_run_is_the_iterated_sum() {
        // Magnitudes from 1e-7 to 1e10: the f64 sums round, so a value
        // added to another partial changes the bits.
        let x: Vec<f32> =
            (0..300).map(|i| (((i * 7919) % 1013) as f32 * 1.37 - 506.0) * 10f32.powi(i % 15 - 7)).collect();
        for len in [0, 1, 5, 16, 17, 31, 64, 100, 300] {
            let want = sum_f64_iter(x[..len].iter().map(|&v| v as f64));
            for run in [1, 3, 4, 15, 16, 17, 64, 299] {
                let mut p = [0f64; LANES];
                for (k, r) in x[..len].chunks(run).enumerate() {
                    add_run(&mut p, k * run, r);
                }
                assert_eq!(combine(p).to_bits(), want.to_bits(), "lane of {len} in runs of {run}");
                let mut p = [0f64; LANES];
                for (k, r) in x[..len].chunks(run).enumerate() {
                    add_run_plain(&mut p, k * run, r);
                }
                assert_eq!(combine(p).to_bits(), want.to_bits(), "lane of {len} in runs of {run}, plain");
            }
        }
    }
}
