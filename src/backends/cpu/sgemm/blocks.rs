//! Products of small packed blocks, for kernels that run their own loop
//! around the register kernel instead of one [`super::sgemm`] call: the
//! CPU attention (`q kᵀ` and `p v` of each block of query rows, with the
//! softmax in between) packs its keys and values once per head and each
//! block of queries and weights once, then multiplies blocks that stay in
//! L1. A whole `sgemm` per block would pack the keys again for every
//! block of queries and fork rayon tasks for a product of 50 KFLOP.
//!
//! The layouts are the parent module's: A in 6-row slivers, B in 16-column
//! slivers, as [`pack_a`] and [`pack_b`] write them. Each element of a
//! product is the same chain of fused multiply-adds over the inner
//! dimension, in order, as `sgemm` gives (one slice: callers keep `kc`
//! small), so the bits do not depend on the block sizes.

use super::pack::{pack_a as pack_a_rows, pack_b as pack_b_rows};
use super::{avx512, tile, Mat, MR, NR};

/// Packs rows `i0..i0 + mc`, columns `p0..p0 + kc` of `a` into `out` as
/// 6-row slivers (zeros past `mc`), growing `out` when it is short.
/// Every element the block covers must be inside `a.data` (checked by
/// indexing: callers check their operands' extents first).
pub(crate) fn pack_a(a: Mat<'_>, i0: usize, mc: usize, p0: usize, kc: usize, out: &mut Vec<f32>) {
    pack_a_rows(a, i0, mc, p0, kc, out);
}

/// Packs rows `p0..p0 + kc`, columns `0..n` of `b` into `out` as
/// 16-column slivers (zeros past `n`), growing `out` when it is short, on
/// the calling thread. The same extent rule as [`pack_a`].
pub(crate) fn pack_b(b: Mat<'_>, p0: usize, kc: usize, n: usize, out: &mut Vec<f32>) {
    pack_b_rows(b, p0, kc, n, out, false);
}

/// The depth of each slice of an inner dimension of `k` that
/// [`super::sgemm`] cuts (as even as they can be, at most 256): a product
/// whose blocks follow these slices, added in order, has `sgemm`'s bits.
pub(crate) fn slice_depth(k: usize) -> usize {
    super::slice_depth(k)
}

/// Floats [`pack_a`] writes for `mc` rows of depth `kc`.
pub(crate) fn packed_a_len(mc: usize, kc: usize) -> usize {
    mc.div_ceil(MR) * MR * kc
}

/// Floats [`pack_b`] writes for `n` columns of depth `kc`.
pub(crate) fn packed_b_len(kc: usize, n: usize) -> usize {
    n.div_ceil(NR) * NR * kc
}

/// `c (+)= a b` on the calling thread: `a` is `mc` rows of depth `kc`
/// packed by [`pack_a`], `b` is `nw` columns of depth `kc` packed by
/// [`pack_b`], `c` holds `mc` rows of `ldc` floats (the first `nw` of each
/// are written; `accumulate` adds the product to them). The 6x32 AVX-512
/// kernel where the CPU has it, else the 6x16 AVX2 one (the same bits).
///
/// Call only where [`super::available`] is true. Panics when a slice is
/// shorter than the sizes say (a bug in the caller, not a user's input).
#[allow(clippy::too_many_arguments)]
pub(crate) fn multiply(
    a: &[f32],
    b: &[f32],
    kc: usize,
    mc: usize,
    nw: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    wide: bool,
) {
    assert!(super::available(), "sgemm blocks need avx2 and fma");
    assert!(!wide || avx512::available(), "the wide kernel needs avx512f");
    if mc == 0 || nw == 0 {
        return;
    }
    assert!(nw <= ldc && c.len() >= (mc - 1) * ldc + nw, "sgemm blocks: C too short");
    assert!(
        a.len() >= packed_a_len(mc, kc) && b.len() >= packed_b_len(kc, nw),
        "sgemm blocks: operands too short"
    );
    if kc == 0 {
        if !accumulate {
            c.chunks_mut(ldc).take(mc).for_each(|row| row[..nw].fill(0.0));
        }
        return;
    }
    // SAFETY: `c` has `mc` rows of `ldc >= nw` floats (checked), which
    // this call borrows mutably; the packed operands cover `mc` rows and
    // `nw` columns of depth `kc` (checked); the CPU features are checked
    // above.
    unsafe { tile(&a[..packed_a_len(mc, kc)], b, kc, mc, nw, 0, c.as_mut_ptr(), ldc, accumulate, wide) }
}

/// True where [`multiply`] may take the 6x32 AVX-512 kernel.
pub(crate) fn wide_available() -> bool {
    avx512::available()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A packed block product gives `sgemm`'s bits (one slice deep), with
    /// edge rows and columns, accumulating and not, on either kernel.
    #[test]
    fn a_block_product_is_sgemms() {
        if !super::super::available() {
            return;
        }
        let (m, k, n) = (13, 40, 37);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 53 % 89) as f32 - 44.0) / 13.0).collect();
        let (am, bm) = (Mat { data: &a, base: 0, rs: k, cs: 1 }, Mat { data: &b, base: 0, rs: n, cs: 1 });
        let mut want = vec![0f32; m * n];
        super::super::sgemm(m, k, n, am, bm, &mut want, false);
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        pack_a(am, 0, m, 0, k, &mut pa);
        pack_b(bm, 0, k, n, &mut pb);
        for wide in [false, wide_available()] {
            let ldc = n + 3;
            let mut c = vec![1f32; m * ldc];
            multiply(&pa, &pb, k, m, n, &mut c, ldc, false, wide);
            let got: Vec<f32> = c.chunks(ldc).flat_map(|r| r[..n].to_vec()).collect();
            assert_eq!(got, want, "wide {wide}");
            multiply(&pa, &pb, k, m, n, &mut c, ldc, true, wide);
            let twice: Vec<f32> = c.chunks(ldc).flat_map(|r| r[..n].to_vec()).collect();
            assert_eq!(twice, want.iter().map(|x| x + x).collect::<Vec<_>>(), "wide {wide}, accumulating");
            assert!(c.chunks(ldc).all(|r| r[n..] == [1.0; 3]), "wrote past the block's columns");
        }
    }
}
