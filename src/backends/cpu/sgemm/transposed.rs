//! Products of a few rows against a weight read as `w.t()`, computed
//! transposed: `c = a wᵀ` as `cᵀ = w aᵀ`, so the weight is the kernel's A,
//! read where it lies, and only the small `aᵀ` is packed.
//!
//! # Why
//!
//! A linear layer's forward in a training step (`x[128, 1024] w.t()`,
//! `w` of `[1024, 1024]`) has 128 rows, so the general loop's B is the
//! whole weight, packed every step through 8x8 register transposes
//! (its bytes change every step, so `cache.rs` never keeps it): 11% of
//! the product's samples and 3.5% of the AdamW step's in the thirteenth
//! session's profile (issue 38), for 128 rows of work per packed float.
//! Transposed, the weight's rows are the kernel's A rows: each 6-row
//! sliver is six sequential streams that the kernel broadcasts from
//! (`kernel_rows`, `avx512::kernel_6x32_rows`), and B is `aᵀ`, 128
//! columns, packed once for all slices in a few microseconds. The result
//! is `cᵀ`, accumulated over the slices in a buffer of the calling
//! thread, and each task writes its rows of it into its columns of `c`
//! through 8x8 transposes at the end.
//!
//! # Results
//!
//! Each element is the chain of fused multiply-adds over each slice in
//! order (the slices of [`super::slice_depth`]), added to the earlier
//! slices' sum, as in the general loop: a multiply-add's two factors
//! commute exactly, so the bits are [`super::sgemm`]'s (tested).

use super::pack::{pack_a, pack_b_into};
use super::{avx512, kernel, kernel_rows, slice_depth, with_buffer, CPtr, Mat, MR, NR, PACK_A};
use rayon::prelude::*;
use std::cell::RefCell;

thread_local! {
    /// The calling thread's `cᵀ` (rows of the weight by C's rows, rounded
    /// up to whole slivers), reused by every transposed product it runs.
    static TRANSPOSED_C: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// True when `c = a b` (`m x k` by `k x n`) is a product [`product`]
/// takes: B is a transposed row-major matrix (`rs == 1`, a `w.t()`), A's
/// rows fit one row block of the general loop (which would pack all of B
/// for them), and there are at least two slivers of the weight's rows
/// per thread.
pub(super) fn applies(m: usize, k: usize, n: usize, b: Mat<'_>, threads: usize) -> bool {
    b.rs == 1 && b.cs != 1 && threads > 1 && m <= super::MC && k > 0 && n >= 2 * MR * threads
}

/// `c = a b` for `b = wᵀ` (see [`applies`]), computed as `cᵀ = w aᵀ` on
/// rayon. Every element of A and B the problem covers must be inside its
/// slice (checked before any write: an operand out of range panics).
/// `wide` takes the 6x32 AVX-512 kernel ([`avx512::available`]).
pub(super) fn product(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>, c: &mut [f32], wide: bool) {
    assert!(super::available(), "sgemm needs avx2 and fma");
    assert!(!wide || avx512::available(), "the wide kernel needs avx512f");
    assert_eq!(c.len(), m * n, "sgemm: C has the wrong length");
    // The weight, `n x k` row-major (rows `b.cs` apart), whose rows the
    // kernel reads through raw pointers: its last element is checked here.
    let w = Mat { data: b.data, base: b.base, rs: b.cs, cs: 1 };
    assert!(w.base + (n - 1) * w.rs + k <= w.data.len(), "sgemm: B out of range");
    let at = Mat { data: a.data, base: a.base, rs: a.cs, cs: a.rs };
    let depth = slice_depth(k);
    let slices: Vec<(usize, usize)> = (0..k).step_by(depth).map(|p0| (p0, depth.min(k - p0))).collect();
    // `aᵀ`'s columns (C's rows) rounded up to a sliver: the packed width
    // and `cᵀ`'s row stride, so every block the kernels write is whole.
    let m16 = m.div_ceil(NR) * NR;
    let n6 = n.div_ceil(MR) * MR;
    let threads = rayon::current_num_threads();
    let slivers = n6 / MR;
    let span = slivers.div_ceil((4 * threads).min(slivers)) * MR;
    let cp = CPtr(c.as_mut_ptr());
    with_buffer(&PACK_A, |packed| {
        if packed.len() < m16 * k {
            packed.resize(m16 * k, 0.0);
        }
        // Slice `s` (from row p0 of `aᵀ`) starts at `m16 * p0`.
        let mut parts = Vec::with_capacity(slices.len());
        let mut rest = &mut packed[..m16 * k];
        for &(p0, kc) in &slices {
            let (part, tail) = rest.split_at_mut(m16 * kc);
            parts.push((p0, kc, part));
            rest = tail;
        }
        parts.par_iter_mut().for_each(|(p0, kc, part)| pack_b_into(at, *p0, *kc, m, part, false));
        let packed: &[f32] = packed;
        with_buffer(&TRANSPOSED_C, |ct| {
            if ct.len() < n6 * m16 {
                ct.resize(n6 * m16, 0.0);
            }
            let ctp = CPtr(ct.as_mut_ptr());
            let starts: Vec<usize> = (0..n).step_by(span).collect();
            starts.par_iter().for_each(|&r0| {
                let rows = span.min(n - r0);
                let mut edge = Vec::new();
                for (slice, &(p0, kc)) in slices.iter().enumerate() {
                    let slice_b = &packed[m16 * p0..][..m16 * kc];
                    let mut j = 0;
                    while j < m16 {
                        let cols = if wide && m16 - j > NR { 2 * NR } else { NR };
                        let b_sliver = &slice_b[(j / NR) * kc * NR..][..kc * cols];
                        for s in (r0..r0 + rows).step_by(MR) {
                            // SAFETY: rows s..s+6 of `cᵀ` (at most n6, its
                            // row count), columns j..j+cols (at most m16,
                            // its row stride) belong to this task's span;
                            // a whole sliver's six weight rows hold
                            // p0..p0+kc (the weight's extent is checked
                            // above), and an edge sliver is packed with
                            // zero rows past n.
                            unsafe {
                                let dst = ctp.at(s * m16 + j);
                                if s + MR <= n {
                                    let a_rows = w.data.as_ptr().add(w.base + s * w.rs + p0);
                                    if cols == NR {
                                        kernel_rows(kc, a_rows, w.rs, b_sliver.as_ptr(), dst, m16, slice > 0);
                                    } else {
                                        let next = kc * NR;
                                        avx512::kernel_6x32_rows(
                                            kc,
                                            a_rows,
                                            w.rs,
                                            b_sliver.as_ptr(),
                                            next,
                                            dst,
                                            m16,
                                            slice > 0,
                                        );
                                    }
                                } else {
                                    pack_a(w, s, n - s, p0, kc, &mut edge);
                                    if cols == NR {
                                        kernel(kc, edge.as_ptr(), b_sliver.as_ptr(), dst, m16, slice > 0);
                                    } else {
                                        let next = kc * NR;
                                        let a_sliver = edge.as_ptr();
                                        avx512::kernel_6x32(
                                            kc,
                                            a_sliver,
                                            b_sliver.as_ptr(),
                                            next,
                                            dst,
                                            m16,
                                            slice > 0,
                                        );
                                    }
                                }
                            }
                        }
                        j += cols;
                    }
                }
                // SAFETY: rows r0..r0+rows of `cᵀ` are this task's, all
                // written above; columns r0..r0+rows of the m x n matrix C
                // are written by this task only.
                unsafe { transpose_into(ctp.at(r0 * m16), m16, rows, m, cp.at(r0), n) };
            });
        });
    });
}

/// `dst[j * ldd + r] = src[r * lds + j]` for `r < rows`, `j < cols`: rows of
/// `cᵀ` into columns of C, 8x8 blocks through registers, edges one by one.
/// Eight rows of C at a time, each written across the whole span before
/// the next eight: C's rows are `ldd` floats apart (4 KB for a 1024-wide
/// layer, one L1 set), so spans of a row are finished while their lines
/// are held, and `cᵀ`, in L2, is the side read in columns.
///
/// # Safety
/// `src` has `rows` rows of `cols` readable floats `lds` apart; `dst` has
/// `cols` rows of `rows` writable floats `ldd` apart; the CPU has avx2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose_into(src: *const f32, lds: usize, rows: usize, cols: usize, dst: *mut f32, ldd: usize) {
    use std::arch::x86_64::*;
    let (rows8, cols8) = (rows / 8 * 8, cols / 8 * 8);
    // SAFETY: every index below is r < rows, j < cols (the contract).
    unsafe {
        for j in (0..cols8).step_by(8) {
            for r in (0..rows8).step_by(8) {
                let ld = |q: usize| _mm256_loadu_ps(src.add((r + q) * lds + j));
                let t = super::pack::transpose_8x8([ld(0), ld(1), ld(2), ld(3), ld(4), ld(5), ld(6), ld(7)]);
                for (q, v) in t.into_iter().enumerate() {
                    _mm256_storeu_ps(dst.add((j + q) * ldd + r), v);
                }
            }
            for r in rows8..rows {
                for q in 0..8 {
                    *dst.add((j + q) * ldd + r) = *src.add(r * lds + j + q);
                }
            }
        }
        for j in cols8..cols {
            for r in 0..rows {
                *dst.add(j * ldd + r) = *src.add(r * lds + j);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose_into(_: *const f32, _: usize, _: usize, _: usize, _: *mut f32, _: usize) {
    unreachable!("sgemm is only called where `available()`")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposed product gives the general loop's bits (one thread,
    /// which never takes it) with the weight's rows at a stride past their
    /// length, edge slivers of the weight (rows not a multiple of 6) and
    /// of C's rows (not a multiple of 16 or 32), depths of one slice and
    /// of three, on either kernel and on 2, 3 and 5 threads.
    #[test]
    fn gives_the_general_loops_bits() {
        if !super::super::available() {
            return;
        }
        for &(m, k, n) in &[(128, 300, 100), (13, 40, 37), (40, 784, 130), (1, 7, 200), (144, 256, 66)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
            // The weight, n rows of k floats, 3 floats of padding a row.
            let ld = k + 3;
            let w: Vec<f32> = (0..n * ld).map(|i| ((i * 53 % 89) as f32 - 44.0) / 13.0).collect();
            let am = Mat { data: &a, base: 0, rs: k, cs: 1 };
            let bm = Mat { data: &w, base: 0, rs: 1, cs: ld };
            let mut want = vec![0f32; m * n];
            super::super::sgemm(m, k, n, am, bm, &mut want, false);
            for threads in [2, 3, 5] {
                assert!(applies(m, k, n, bm, threads) || n < 2 * MR * threads);
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
                for wide in [false, avx512::available()] {
                    let mut got = vec![f32::NAN; m * n];
                    pool.install(|| product(m, k, n, am, bm, &mut got, wide));
                    let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{m}x{k}x{n} on {threads} threads, wide {wide}");
                }
            }
        }
    }
}
