//! The 6x16 register kernel for CPUs with AVX2 and FMA: twelve 256-bit
//! accumulators (6 rows x 16 columns), one B sliver row of two vectors
//! and one broadcast of A a row per step. Every CPU `sgemm` runs on has
//! it; the 6x32 kernel of `avx512.rs` gives the same bits where AVX-512F
//! is there. A is a packed sliver, or six rows read where they lie
//! (`transposed.rs`): one generic function, so the two are one chain.

#[cfg(target_arch = "x86_64")]
use super::{MR, NR};

/// The 6x16 register kernel: `C (+)= A_sliver x B_sliver` over `kc`.
///
/// # Safety
/// `a` has `kc * 6` floats, `b` `kc * 16`; `c` has 6 rows of 16 writable
/// floats at row stride `ldc`; the CPU supports avx2 and fma.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) unsafe fn kernel(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller's contract, which is `kernel_a`'s for a packed A.
    unsafe { kernel_a::<false>(kc, a, 0, b, c, ldc, accumulate) }
}

/// [`kernel`] with A read where it lies: six rows of `kc` adjacent floats,
/// `lda` floats apart (`transposed.rs`). The same bits as `kernel` on the
/// same values.
///
/// # Safety
/// `a + r * lda` has `kc` floats for each `r < 6`; the rest as [`kernel`].
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) unsafe fn kernel_rows(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY: the caller's contract, which is `kernel_a`'s for rows of A.
    unsafe { kernel_a::<true>(kc, a, lda, b, c, ldc, accumulate) }
}

/// The 6x16 kernel over an A packed in a sliver (`ROWS` false: element
/// `(r, p)` at `a + 6p + r`) or read in its rows (`ROWS`: at
/// `a + r * lda + p`); one function, so the two give the same chain.
///
/// # Safety
/// As [`kernel`] or [`kernel_rows`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_a<const ROWS: bool>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let (row, step) = if ROWS { (lda, 1) } else { (1, MR) };
    let z = _mm256_setzero_ps();
    let (mut c00, mut c01, mut c10, mut c11, mut c20, mut c21) = (z, z, z, z, z, z);
    let (mut c30, mut c31, mut c40, mut c41, mut c50, mut c51) = (z, z, z, z, z, z);
    // C's six rows are 6 x 64 bytes, `ldc` apart: fetch them now, so the
    // stores at the end (and the loads, when accumulating) do not wait on
    // memory after the loop (they cost 15% of the kernel without this).
    for r in 0..MR {
        // SAFETY: a prefetch never faults; the address is row r of the block.
        unsafe {
            let row = c.add(r * ldc).cast::<i8>();
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.add(60));
        }
    }
    for p in 0..kc {
        // SAFETY: p < kc, so these reads are inside the slivers.
        unsafe {
            let bp = b.add(p * NR);
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            let ap = a.add(p * step);
            let a0 = _mm256_broadcast_ss(&*ap);
            c00 = _mm256_fmadd_ps(a0, b0, c00);
            c01 = _mm256_fmadd_ps(a0, b1, c01);
            let a1 = _mm256_broadcast_ss(&*ap.add(row));
            c10 = _mm256_fmadd_ps(a1, b0, c10);
            c11 = _mm256_fmadd_ps(a1, b1, c11);
            let a2 = _mm256_broadcast_ss(&*ap.add(2 * row));
            c20 = _mm256_fmadd_ps(a2, b0, c20);
            c21 = _mm256_fmadd_ps(a2, b1, c21);
            let a3 = _mm256_broadcast_ss(&*ap.add(3 * row));
            c30 = _mm256_fmadd_ps(a3, b0, c30);
            c31 = _mm256_fmadd_ps(a3, b1, c31);
            let a4 = _mm256_broadcast_ss(&*ap.add(4 * row));
            c40 = _mm256_fmadd_ps(a4, b0, c40);
            c41 = _mm256_fmadd_ps(a4, b1, c41);
            let a5 = _mm256_broadcast_ss(&*ap.add(5 * row));
            c50 = _mm256_fmadd_ps(a5, b0, c50);
            c51 = _mm256_fmadd_ps(a5, b1, c51);
        }
    }
    let rows = [(c00, c01), (c10, c11), (c20, c21), (c30, c31), (c40, c41), (c50, c51)];
    for (r, (lo, hi)) in rows.into_iter().enumerate() {
        // SAFETY: row r < 6 has 16 writable floats (the caller's contract).
        unsafe {
            let dst = c.add(r * ldc);
            let (lo, hi) = if accumulate {
                (_mm256_add_ps(_mm256_loadu_ps(dst), lo), _mm256_add_ps(_mm256_loadu_ps(dst.add(8)), hi))
            } else {
                (lo, hi)
            };
            _mm256_storeu_ps(dst, lo);
            _mm256_storeu_ps(dst.add(8), hi);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn kernel(_: usize, _: *const f32, _: *const f32, _: *mut f32, _: usize, _: bool) {
    unreachable!("sgemm is only called where `available()`")
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn kernel_rows(
    _: usize,
    _: *const f32,
    _: usize,
    _: *const f32,
    _: *mut f32,
    _: usize,
    _: bool,
) {
    unreachable!("sgemm is only called where `available()`")
}
