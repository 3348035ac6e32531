//! Packing: copying a slice of A or B into the contiguous slivers the
//! register kernel reads (see the parent module's "Blocking"). Row-major
//! operands copy rows; transposed ones (`rs == 1`, as `x.t()` and `w.t()`
//! are) copy their contiguous columns, B through 8x8 register transposes.

use super::{Mat, MR, NR, PACK_GROUP};
use rayon::prelude::*;

/// Packs rows `p0..p0+kc` of B, all `n` columns, as 16-column slivers:
/// sliver `s` holds, for each row `p`, columns `16s..16s+16` (zeros past `n`).
pub(super) fn pack_b(b: Mat<'_>, p0: usize, kc: usize, n: usize, out: &mut Vec<f32>, parallel: bool) {
    let need = n.div_ceil(NR) * kc * NR;
    if out.len() < need {
        out.resize(need, 0.0);
    }
    pack_b_into(b, p0, kc, n, &mut out[..need], parallel);
}

/// [`pack_b`] into `out`, which holds exactly `ceil(n / 16) * kc * 16` floats.
pub(super) fn pack_b_into(b: Mat<'_>, p0: usize, kc: usize, n: usize, out: &mut [f32], parallel: bool) {
    let slivers = n.div_ceil(NR);
    assert_eq!(out.len(), slivers * kc * NR, "pack_b: output of the wrong size");
    // Groups of slivers, each filled row by row: a row of B is read as one
    // run of up to 256 floats (reading a sliver's 16 floats from each of
    // `kc` rows would touch a new page per row).
    let group = PACK_GROUP * kc * NR;
    let one = |(g, dst): (usize, &mut [f32])| {
        let s0 = g * PACK_GROUP;
        if b.cs != 1 && b.rs == 1 {
            // A transposed B (a weight read as `w.t()`, the backward
            // products): each column is a contiguous run, so each sliver is
            // a transpose of 16 runs (see `pack_b_transposed`).
            for (ls, sliver) in dst.chunks_mut(kc * NR).enumerate() {
                let j0 = (s0 + ls) * NR;
                pack_b_transposed(b, p0, kc, j0, NR.min(n - j0), sliver);
            }
            return;
        }
        let width = (dst.len() / (kc * NR) * NR).min(n - s0 * NR);
        for p in 0..kc {
            if b.cs == 1 && p + PREFETCH_ROWS < kc {
                prefetch_run(b.data, b.base + (p0 + p + PREFETCH_ROWS) * b.rs + s0 * NR, width);
            }
            for (ls, sliver) in dst.chunks_mut(kc * NR).enumerate() {
                let j0 = (s0 + ls) * NR;
                let w = NR.min(n - j0);
                let row = &mut sliver[p * NR..(p + 1) * NR];
                if b.cs == 1 {
                    let at = b.base + (p0 + p) * b.rs + j0;
                    let src = &b.data[at..at + w];
                    match (<&mut [f32; NR]>::try_from(&mut *row), <&[f32; NR]>::try_from(src)) {
                        // Sixteen floats, two vector moves (a memcpy call
                        // per row cost more than the copy).
                        (Ok(d), Ok(s)) => *d = *s,
                        _ => {
                            row[..w].copy_from_slice(src);
                            row[w..].fill(0.0);
                        }
                    }
                } else {
                    // Any other strides (an expanded or sliced view): one
                    // element at a time.
                    for (j, v) in row[..w].iter_mut().enumerate() {
                        *v = b.at(p0 + p, j0 + j);
                    }
                    row[w..].fill(0.0);
                }
            }
        }
    };
    if parallel && slivers > PACK_GROUP {
        out.par_chunks_mut(group).enumerate().for_each(one);
    } else {
        out.chunks_mut(group).enumerate().for_each(one);
    }
}

/// Rows of B ahead that packing asks the cache for. A row-major B's rows
/// are a page apart or more (1024 floats), and the hardware prefetcher
/// does not cross pages, so without this each row's first line waits on
/// L3 or memory; packing B was an eighth of an MLP forward.
const PREFETCH_ROWS: usize = 8;

/// Asks the cache for the lines of `data[at..at + len]` (what is inside
/// `data`; a prefetch of anything else is skipped).
#[inline(always)]
fn prefetch_run(data: &[f32], at: usize, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if let Some(run) = data.get(at..(at + len).min(data.len())) {
        for i in (0..run.len()).step_by(16) {
            // SAFETY: `run[i]` is in bounds; a prefetch has no other effect
            // (SSE is baseline on x86_64).
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(run.as_ptr().add(i).cast::<i8>())
            };
        }
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = (data, at, len);
}

/// One sliver of a B whose rows are adjacent (`rs == 1`): columns
/// `j0..j0+w` (`w <= 16`), rows `p0..p0+kc`, into `dst` (`kc * 16`
/// floats, zeros past `w`). Column `j` is the run `B[p0.., j]`; the
/// runs are bounds-checked once each, then read 8 rows at a time and
/// transposed in registers (`transpose8`), so a transposed B packs at
/// about the speed of a row-major one instead of one gathered element
/// per float.
fn pack_b_transposed(b: Mat<'_>, p0: usize, kc: usize, j0: usize, w: usize, dst: &mut [f32]) {
    let dst = &mut dst[..kc * NR];
    let col = |j: usize| {
        let at = b.base + p0 * b.rs + (j0 + j) * b.cs;
        &b.data[at..at + kc]
    };
    let mut cols: [&[f32]; NR] = [&[]; NR];
    for (j, c) in cols.iter_mut().enumerate().take(w) {
        *c = col(j);
    }
    let mut p = 0;
    if w == NR {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `sgemm` runs only where `available()` (avx2, fma);
            // every run in `cols` has `kc` floats and `dst` `kc * 16`, and
            // the blocks read rows `p..p+8` with `p + 8 <= kc`.
            unsafe { transpose_runs(&cols, kc / 8 * 8, dst) };
            p = kc / 8 * 8;
        }
    }
    for p in p..kc {
        let row = &mut dst[p * NR..(p + 1) * NR];
        for (j, v) in row.iter_mut().enumerate() {
            *v = if j < w { cols[j][p] } else { 0.0 };
        }
    }
}

/// The 8x8 transpose of eight rows of eight floats: column `q` of the
/// input is row `q` of the output (the unpack / shuffle / permute
/// network of the packing loops below).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn transpose_8x8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Rows `0..rows` (a multiple of 8) of 16 runs, transposed into `dst`
/// row by row (row `p` is 16 floats: element `p` of each run), as 8x8
/// blocks: 8 loads, the three-stage unpack/shuffle/permute transpose,
/// 8 stores.
///
/// # Safety
/// The CPU supports avx2; every run has at least `rows` floats and `dst`
/// at least `rows * 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_runs(cols: &[&[f32]; NR], rows: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    for p in (0..rows).step_by(8) {
        for half in 0..2 {
            // SAFETY: p + 8 <= rows, inside each run and inside `dst` (the
            // caller's contract).
            unsafe {
                let ld = |j: usize| _mm256_loadu_ps(cols[half * 8 + j].as_ptr().add(p));
                let rows8 = transpose_8x8([ld(0), ld(1), ld(2), ld(3), ld(4), ld(5), ld(6), ld(7)]);
                for (q, v) in rows8.into_iter().enumerate() {
                    _mm256_storeu_ps(dst.as_mut_ptr().add((p + q) * NR + half * 8), v);
                }
            }
        }
    }
}

/// Packs rows `i0..i0+mc`, columns `p0..p0+kc` of A as 6-row slivers:
/// sliver `s` holds, for each column `p`, rows `6s..6s+6` (zeros past `mc`).
pub(super) fn pack_a(a: Mat<'_>, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut Vec<f32>) {
    let need = mc.div_ceil(MR) * kc * MR;
    if out.len() < need {
        out.resize(need, 0.0);
    }
    pack_a_into(a, i0, mc, p0, kc, &mut out[..need]);
}

/// [`pack_a`] into `out`, which holds exactly `ceil(mc / 6) * kc * 6` floats.
pub(super) fn pack_a_into(a: Mat<'_>, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut [f32]) {
    for (s, dst) in out.chunks_mut(kc * MR).enumerate() {
        let r0 = s * MR;
        let h = MR.min(mc - r0);
        if a.cs == 1 && h == MR {
            // Six dense rows, read side by side, written in order.
            let row = |r: usize| {
                let at = a.base + (i0 + r0 + r) * a.rs + p0;
                &a.data[at..at + kc]
            };
            let rows = [row(0), row(1), row(2), row(3), row(4), row(5)];
            // SAFETY: `sgemm` runs only where `available()` (avx2); every
            // row has `kc` floats and `dst` `kc * 6`.
            #[cfg(target_arch = "x86_64")]
            let done = unsafe { interleave_rows(&rows, kc, dst) };
            #[cfg(not(target_arch = "x86_64"))]
            let done = 0;
            for p in done..kc {
                for (r, v) in dst[p * MR..(p + 1) * MR].iter_mut().enumerate() {
                    *v = rows[r][p];
                }
            }
            continue;
        }
        if a.rs == 1 && h == MR {
            // A transposed A (`x.t()` in a weight gradient): the six rows
            // of each column are adjacent, one six-float run per column.
            for (p, d) in dst.chunks_exact_mut(MR).enumerate() {
                let at = a.base + (i0 + r0) + (p0 + p) * a.cs;
                if let (Ok(d), Ok(s)) =
                    (<&mut [f32; MR]>::try_from(d), <&[f32; MR]>::try_from(&a.data[at..at + MR]))
                {
                    *d = *s;
                }
            }
            continue;
        }
        for p in 0..kc {
            for r in 0..MR {
                dst[p * MR + r] = if r < h { a.at(i0 + r0 + r, p0 + p) } else { 0.0 };
            }
        }
    }
}

/// Columns `0..p` of six rows of `kc` floats, interleaved into `dst`
/// (column `q` is `dst[6q..6q+6]`), eight columns at a time as an 8x8
/// register transpose of which six lanes are kept; returns `p`, the
/// columns done (the rest is the caller's). Each column's eight-float
/// store runs two floats into the next column's place, which the next
/// store overwrites, so the last block of eight stops short of `kc`.
/// Scalar, this interleave was 3-4% of an encoder GEMM.
///
/// # Safety
/// The CPU supports avx2; every row has `kc` floats and `dst` `6 * kc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn interleave_rows(rows: &[&[f32]; MR], kc: usize, dst: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    // Blocks whose last eight-float store (at 6 * (p + 7)) ends inside
    // `dst`: 6p + 50 <= 6kc.
    let blocks = if kc >= 9 { (kc - 9) / 8 + 1 } else { 0 };
    for blk in 0..blocks {
        let p = blk * 8;
        // SAFETY: p + 8 <= kc, inside each row; the stores end at
        // 6(p + 7) + 8 <= 6kc (the block count above).
        unsafe {
            let ld = |r: usize| _mm256_loadu_ps(rows[r].as_ptr().add(p));
            // Six rows and two of zeros: lanes 6 and 7 of each column are
            // zeros, which each 8-wide store below spills into the next
            // column's first two slots before the next store overwrites
            // them.
            let z = _mm256_setzero_ps();
            let cols = transpose_8x8([ld(0), ld(1), ld(2), ld(3), ld(4), ld(5), z, z]);
            for (q, v) in cols.into_iter().enumerate() {
                _mm256_storeu_ps(dst.as_mut_ptr().add((p + q) * MR), v);
            }
        }
    }
    blocks * 8
}
