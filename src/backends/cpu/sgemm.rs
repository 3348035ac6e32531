//! `f32` GEMM for AVX2+FMA CPUs: packed panels and a 6x16 register
//! kernel, the BLIS/GotoBLAS design; on CPUs with AVX-512F, a 6x32
//! kernel (`avx512.rs`) runs pairs of the same 16-column B slivers.
//!
//! # Why not matrixmultiply here
//!
//! matrixmultiply's `sgemm` kept kiln's 1024^3 product at 1.3-1.4x
//! OpenBLAS's time on the 2-core EPYC (issue 8), and it runs each call on
//! one thread, so a matmul with few rows (an MLP with batch 128) ran on one
//! core. This kernel keeps 12 accumulators (6 rows x 16 columns) in
//! registers for a whole `KC`-long slice of the inner dimension, reading A
//! and B from packed, contiguous panels; matrixmultiply stays for `f64`
//! and for CPUs without AVX2+FMA.
//!
//! # Blocking
//!
//! For each slice of the inner dimension (in order; slices at most `KC`
//! deep and as even as they can be), B's slice is packed once into
//! 16-column slivers (shared by all tasks), then the output is cut into
//! tiles of at most `MC` rows and a span of columns; each tile packs its
//! rows of A into 6-row slivers (in a buffer of its thread) and runs the
//! kernel over every 6x16 block of the tile, B slivers outer, A slivers
//! inner. A packed A block (`MC x KC` floats) stays in L2 and a B sliver
//! (`KC x 16`) in L1 while the kernel streams over them. A transposed
//! operand (`rs == 1`, as `x.t()` and `w.t()` are) packs from its
//! contiguous columns, B through 8x8 register transposes. Tiles run in
//! parallel on rayon. When every row fits one tile (an MLP's batch of
//! 128) the tasks split the columns instead, so every core works, and each
//! owns its span of columns for the whole product (`few_rows`): A is
//! packed once, and each span of B by the task that reads it. When that B
//! is a weight read as `w.t()` (a linear layer's forward), the product is
//! computed transposed instead, reading the weight's rows in place
//! (`transposed.rs`).
//!
//! # Results
//!
//! Every output element is, for each slice in order (the slices depend
//! on `k` alone), a chain of fused
//! multiply-adds over that slice in order, added to what the earlier slices
//! gave. Neither the tiling, the thread count nor the kernel (6x16 or
//! 6x32) changes that order, so the product is the same bits on any
//! number of threads, with or without AVX-512.

mod avx2;
mod avx512;
pub(crate) mod blocks;
pub(crate) mod cache;
mod pack;
mod transposed;

use avx2::{kernel, kernel_rows};
pub(crate) use cache::PackedB;
use pack::{pack_a, pack_a_into, pack_b, pack_b_into};
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows of the register kernel.
const MR: usize = 6;
/// Columns of the register kernel (two 8-float vectors).
const NR: usize = 16;
/// Depth of one packed slice of the inner dimension.
const KC: usize = 256;
/// Slivers of B packed together, row by row (see `pack_b`).
const PACK_GROUP: usize = 16;
/// Most rows of A packed per tile (a multiple of `MR`).
const MC: usize = 144;
/// Most floats of A that `few_rows` packs at once (16 MB; a batch of 128
/// by 1024 is 131,072): the whole packed A stays in a thread's buffer
/// after the call, so a very deep product takes the general loop, which
/// packs one tile at a time.
const FEW_ROWS_PACKED_A: usize = 1 << 22;

/// One operand: its elements, where the matrix starts, row and column strides.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    pub base: usize,
    pub rs: usize,
    pub cs: usize,
}

impl Mat<'_> {
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[self.base + i * self.rs + j * self.cs]
    }
}

/// True when this CPU can run [`sgemm`].
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

thread_local! {
    /// Each thread's packed-A buffer, reused by every tile it runs.
    static PACK_A: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's packed-B buffer.
    static PACK_B: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the thread's buffer, taken out of its slot for the call
/// (so a nested call on this thread, a rayon task stolen while this one
/// waits, finds the slot empty and uses a fresh vector instead of
/// borrowing this one).
fn with_buffer<R>(
    slot: &'static std::thread::LocalKey<RefCell<Vec<f32>>>,
    f: impl FnOnce(&mut Vec<f32>) -> R,
) -> R {
    let mut buf = slot.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let r = f(&mut buf);
    slot.with(|s| *s.borrow_mut() = buf);
    r
}

/// A raw pointer to C that tasks share; each writes only its own tile.
#[derive(Clone, Copy)]
struct CPtr(*mut f32);
impl CPtr {
    /// The element `off` of C.
    ///
    /// # Safety
    /// `off` is inside C.
    unsafe fn at(self, off: usize) -> *mut f32 {
        // SAFETY: in bounds (the caller's contract).
        unsafe { self.0.add(off) }
    }
}

// SAFETY: tasks write disjoint tiles of C (see `sgemm`), and C outlives them
// (rayon's scope ends before `sgemm` returns).
unsafe impl Send for CPtr {}
// SAFETY: as for `Send`.
unsafe impl Sync for CPtr {}

/// `c = a x b` for an `m x k` by `k x n` problem; `c` is row-major `m x n`.
/// Every element of A and B the problem covers must be inside its slice
/// (checked: an out-of-range operand panics in packing, before any write,
/// so callers check extents first). `parallel` lets tiles run on rayon.
///
/// Call only when [`available`] is true.
pub(crate) fn sgemm(m: usize, k: usize, n: usize, a: Mat<'_>, b: Mat<'_>, c: &mut [f32], parallel: bool) {
    sgemm_with(m, k, n, a, BSrc::Mat(b), c, parallel, avx512::available());
}

/// [`sgemm`] with B already packed, every slice of it ([`PackedB`], a
/// weight read again: see `cache.rs`). The same bits as packing B here.
pub(crate) fn sgemm_packed(m: usize, a: Mat<'_>, b: &PackedB, c: &mut [f32], parallel: bool) {
    sgemm_with(m, b.k, b.n, a, BSrc::Packed(&b.data), c, parallel, avx512::available());
}

/// Where the kernel's B slivers come from.
#[derive(Clone, Copy)]
enum BSrc<'a> {
    /// The operand itself, packed slice by slice during the product.
    Mat(Mat<'a>),
    /// [`PackedB::data`]: every slice packed, in order.
    Packed(&'a [f32]),
}

/// Depth of each slice of an inner dimension of `k`: as even as they can
/// be, at most `KC` (784 is three of 262/262/260, not 256/256/256/16: a
/// 16-deep slice reads and writes all of C for a sixteenth of the work).
fn slice_depth(k: usize) -> usize {
    k.div_ceil(k.div_ceil(KC))
}

/// [`sgemm`] with the 6x32 AVX-512 kernel (`wide`, where available) or
/// the 6x16 AVX2 one only; they give the same bits.
#[allow(clippy::too_many_arguments)]
fn sgemm_with(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: BSrc<'_>,
    c: &mut [f32],
    parallel: bool,
    wide: bool,
) {
    assert!(available(), "sgemm needs avx2 and fma");
    if let BSrc::Packed(all) = b {
        assert_eq!(all.len(), n.div_ceil(NR) * NR * k, "sgemm: packed B of the wrong size");
    }
    assert!(!wide || avx512::available(), "the wide kernel needs avx512f");
    assert_eq!(c.len(), m * n, "sgemm: C has the wrong length");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    let n_slivers = n.div_ceil(NR);
    let threads = if parallel { rayon::current_num_threads() } else { 1 };
    if let BSrc::Mat(bm) = b {
        if transposed::applies(m, k, n, bm, threads) {
            transposed::product(m, k, n, a, bm, c, wide);
            return;
        }
    }
    // Row blocks of whole 6-row slivers, as even as they can be and at most
    // MC rows, their count a multiple of the thread count when there are
    // enough rows (so no core waits on a short last block).
    let m_slivers = m.div_ceil(MR);
    let mut m_blocks = m_slivers.div_ceil(MC / MR);
    if m_blocks >= threads {
        m_blocks = m_blocks.div_ceil(threads) * threads;
    }
    let m_blocks = m_blocks.min(m_slivers);
    // Columns split in whole slivers too, so there are about four tiles per
    // thread (a batch-128 MLP has one row block: its tiles split columns).
    let n_chunks = (4 * threads).div_ceil(m_blocks).clamp(1, n_slivers.div_ceil(4).max(1));
    let chunk_slivers = n_slivers.div_ceil(n_chunks);
    let row_start = |mb: usize| MR * (mb * m_slivers / m_blocks);
    let tiles: Vec<(usize, usize)> =
        (0..m_blocks).flat_map(|mb| (0..n_slivers.div_ceil(chunk_slivers)).map(move |nc| (mb, nc))).collect();
    let cp = CPtr(c.as_mut_ptr());
    let depth = slice_depth(k);
    if m_blocks == 1 && threads > 1 && tiles.len() > 1 && m.div_ceil(MR) * MR * k <= FEW_ROWS_PACKED_A {
        few_rows(m, k, n, a, b, cp, depth, chunk_slivers * NR, wide);
        return;
    }
    with_buffer(&PACK_B, |pb| {
        for (slice, p0) in (0..k).step_by(depth).enumerate() {
            let kc = depth.min(k - p0);
            let packed_b: &[f32] = match b {
                BSrc::Mat(b) => {
                    pack_b(b, p0, kc, n, pb, threads > 1);
                    pb
                }
                BSrc::Packed(all) => &all[n_slivers * NR * p0..][..n_slivers * NR * kc],
            };
            let run = |&(mb, nc): &(usize, usize)| {
                let (i0, j0) = (row_start(mb), nc * chunk_slivers * NR);
                let (mc, nw) = (row_start(mb + 1).min(m) - i0, (chunk_slivers * NR).min(n - j0));
                with_buffer(&PACK_A, |pa| {
                    pack_a(a, i0, mc, p0, kc, pa);
                    // SAFETY: the tile is rows i0..i0+mc, columns j0..j0+nw
                    // of the m x n matrix C (`c.len() == m * n`, checked);
                    // tiles are disjoint, so no two tasks write one element.
                    unsafe {
                        tile(
                            &pa[..mc.div_ceil(MR) * kc * MR],
                            packed_b,
                            kc,
                            mc,
                            nw,
                            j0,
                            cp.at(i0 * n),
                            n,
                            slice > 0,
                            wide,
                        )
                    };
                });
            };
            if threads > 1 && tiles.len() > 1 {
                tiles.par_iter().for_each(run);
            } else {
                tiles.iter().for_each(run);
            }
        }
    });
}

/// [`sgemm`] when every row fits one block (an MLP's batch): the tasks
/// split C's columns in spans of `span`, and each owns its span for the
/// whole product. A is packed once, every slice of it, in parallel; each
/// task then packs its own columns of B slice by slice, right before its
/// kernel reads them (so they are in its L2), and adds the slices in
/// order. That is one fork-join per product where the general loop has
/// two per slice, and A packed once where the general loop packs it once
/// per tile (eight times for a batch of 128 and 1024 columns). Each
/// element still adds the slices in order, so the bits are the general
/// loop's.
#[allow(clippy::too_many_arguments)]
fn few_rows(
    m: usize,
    k: usize,
    n: usize,
    a: Mat<'_>,
    b: BSrc<'_>,
    cp: CPtr,
    depth: usize,
    span: usize,
    wide: bool,
) {
    let a_len = m.div_ceil(MR) * MR;
    let slices: Vec<(usize, usize)> = (0..k).step_by(depth).map(|p0| (p0, depth.min(k - p0))).collect();
    with_buffer(&PACK_A, |pa| {
        if pa.len() < a_len * k {
            pa.resize(a_len * k, 0.0);
        }
        // Slice `s` (from column p0) starts at `a_len * p0`.
        let mut parts = Vec::with_capacity(slices.len());
        let mut rest = &mut pa[..a_len * k];
        for &(p0, kc) in &slices {
            let (part, tail) = rest.split_at_mut(a_len * kc);
            parts.push((p0, kc, part));
            rest = tail;
        }
        parts.par_iter_mut().for_each(|(p0, kc, part)| pack_a_into(a, 0, m, *p0, *kc, part));
        let packed_a: &[f32] = pa;
        let spans: Vec<usize> = (0..n).step_by(span).collect();
        let n16 = n.div_ceil(NR) * NR;
        spans.par_iter().for_each(|&j0| {
            let nw = span.min(n - j0);
            let b = match b {
                BSrc::Mat(b) => b,
                BSrc::Packed(all) => {
                    for (slice, &(p0, kc)) in slices.iter().enumerate() {
                        let pa = &packed_a[a_len * p0..a_len * (p0 + kc)];
                        // SAFETY: as below; `j0` is a multiple of 16 (the
                        // span is whole slivers), so the tile reads this
                        // span's slivers of the packed slice.
                        unsafe {
                            tile(
                                pa,
                                &all[n16 * p0..][..n16 * kc],
                                kc,
                                m,
                                nw,
                                j0,
                                cp.at(0),
                                n,
                                slice > 0,
                                wide,
                            )
                        };
                    }
                    return;
                }
            };
            let cols = Mat { base: b.base + j0 * b.cs, ..b };
            with_buffer(&PACK_B, |pb| {
                for (slice, &(p0, kc)) in slices.iter().enumerate() {
                    pack_b(cols, p0, kc, nw, pb, false);
                    let pa = &packed_a[a_len * p0..a_len * (p0 + kc)];
                    // SAFETY: the span is columns j0..j0+nw of all m rows of
                    // the m x n matrix C; spans are disjoint.
                    unsafe { tile(pa, pb, kc, m, nw, 0, cp.at(j0), n, slice > 0, wide) };
                }
            });
        });
    });
}

/// One tile: every 6x16 block of rows `0..mc` (of the packed A) and
/// columns `j0..j0+nw` of C, whose row 0 is at `c` with row stride `ldc`.
/// With `wide`, pairs of B slivers run as one 6x32 block
/// ([`avx512::kernel_6x32`]); a last odd sliver runs the 6x16 kernel.
///
/// # Safety
/// `c` points at a row of C with `mc` rows of `ldc` elements from it, the
/// columns `j0..j0+nw` of which nobody else touches meanwhile; the CPU
/// supports avx2 and fma, and avx512f when `wide`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    pa: &[f32],
    pb: &[f32],
    kc: usize,
    mc: usize,
    nw: usize,
    j0: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    wide: bool,
) {
    let mut edge = [0f32; MR * 2 * NR];
    // B slivers outer, A slivers inner: one B sliver (`kc x 16`, 16 KB;
    // two for the wide kernel) stays in L1 while every A sliver of the
    // tile (the packed block, in L2) streams past it, the BLIS order.
    let mut j = 0;
    while j < nw {
        // Columns of this block: 32 (two slivers) when wide and more than
        // one sliver's columns are left, else at most 16.
        let span = if wide && nw - j > NR { 2 * NR } else { NR };
        let w = span.min(nw - j);
        let b_sliver = &pb[((j0 + j) / NR) * kc * NR..][..kc * span];
        for (si, a_sliver) in pa.chunks(kc * MR).enumerate() {
            let r0 = si * MR;
            let h = MR.min(mc - r0);
            // SAFETY: rows r0..r0+h and columns j0+j..j0+j+w are inside the
            // tile (the caller's contract); a full block writes exactly
            // those, an edge block goes through `edge` and copies only them.
            // The wide kernel reads its two slivers inside `b_sliver`
            // (`kc * 32` floats), the second `kc * 16` after the first.
            unsafe {
                let dst = c.add(r0 * ldc + j0 + j);
                let full = h == MR && w == span;
                let (out, out_ld) = if full { (dst, ldc) } else { (edge.as_mut_ptr(), span) };
                let acc = accumulate && full;
                if span == NR {
                    kernel(kc, a_sliver.as_ptr(), b_sliver.as_ptr(), out, out_ld, acc);
                } else {
                    avx512::kernel_6x32(kc, a_sliver.as_ptr(), b_sliver.as_ptr(), kc * NR, out, out_ld, acc);
                }
                if !full {
                    for r in 0..h {
                        let row = dst.add(r * ldc);
                        for (q, &v) in edge[r * span..r * span + w].iter().enumerate() {
                            let o = row.add(q);
                            *o = if accumulate { *o + v } else { v };
                        }
                    }
                }
            }
        }
        j += span;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// `x` (`rows x cols`, row-major) stored in one of three layouts, as
    /// the operand of that matrix: row-major, transposed in memory (`rs ==
    /// 1`, the packers' transpose paths), or every other column of a
    /// twice-as-wide matrix starting at column 1 (neither stride 1, the
    /// element-by-element path).
    fn laid_out(x: &[f32], rows: usize, cols: usize, layout: usize) -> (Vec<f32>, usize, usize, usize) {
        match layout {
            0 => (x.to_vec(), 0, cols, 1),
            1 => ((0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect(), 0, 1, rows),
            _ => {
                let mut wide = vec![f32::NAN; rows * cols * 2 + 1];
                for i in 0..rows {
                    for j in 0..cols {
                        wide[1 + i * 2 * cols + 2 * j] = x[i * cols + j];
                    }
                }
                (wide, 1, 2 * cols, 2)
            }
        }
    }

    /// Every edge case of the blocking (rows past 6 and 144, columns past
    /// 16 and 32, depths past 256 and off the 8-row transpose blocks; few
    /// rows in column spans, the last one short), each
    /// operand row-major, transposed and strided, against an f64
    /// reference; the same bits on 1, 2, 3 and 5 threads, and from the
    /// AVX2 kernel alone where the AVX-512 one runs.
    #[test]
    fn matches_an_f64_reference_at_every_edge_and_on_any_thread_count() {
        if !available() {
            return;
        }
        let shapes = [
            (1, 1, 1),
            (7, 3, 17),
            (6, 256, 16),
            (150, 300, 35),
            (13, 513, 100),
            (300, 40, 7),
            (12, 21, 33),
            (40, 600, 130),
            (13, 70, 48),
            (130, 300, 200),
        ];
        for &(m, k, n) in &shapes {
            let (a, b) = (data(m * k, 1 + m as u64), data(k * n, 2 + n as u64));
            let want: Vec<f64> = (0..m * n)
                .map(|e| (0..k).map(|p| a[(e / n) * k + p] as f64 * b[p * n + e % n] as f64).sum())
                .collect();
            // Packing copies the same values whatever the layout, so every
            // layout gives the row-major operands' bits.
            let mut first: Option<Vec<f32>> = None;
            for (la, lb) in [(0, 0), (0, 1), (1, 0), (1, 1), (2, 2), (0, 2)] {
                let (ad, ab, ars, acs) = laid_out(&a, m, k, la);
                let (bd, bb, brs, bcs) = laid_out(&b, k, n, lb);
                let ma = Mat { data: &ad, base: ab, rs: ars, cs: acs };
                let mb = Mat { data: &bd, base: bb, rs: brs, cs: bcs };
                let mut c = vec![f32::NAN; m * n];
                sgemm(m, k, n, ma, mb, &mut c, true);
                for (e, (&got, &want)) in c.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
                        "{m}x{k}x{n} layouts {la},{lb} [{},{}]: {got} vs {want}",
                        e / n,
                        e % n
                    );
                }
                let same = first.get_or_insert_with(|| c.clone());
                assert!(
                    c.iter().zip(same.iter()).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "layouts {la},{lb}"
                );
                let mut serial = vec![0f32; m * n];
                sgemm(m, k, n, ma, mb, &mut serial, false);
                assert!(
                    c.iter().zip(&serial).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "threads changed bits"
                );
                // The AVX2 kernel alone, where `sgemm` ran the AVX-512 one.
                if avx512::available() {
                    let mut narrow = vec![0f32; m * n];
                    sgemm_with(m, k, n, ma, BSrc::Mat(mb), &mut narrow, true, false);
                    assert!(
                        c.iter().zip(&narrow).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{m}x{k}x{n}: the AVX-512 kernel changed bits"
                    );
                }
                // Three and five threads tile C differently again.
                for threads in [3, 5] {
                    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
                    let mut other = vec![0f32; m * n];
                    pool.install(|| sgemm(m, k, n, ma, mb, &mut other, true));
                    assert!(
                        c.iter().zip(&other).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{threads} threads changed bits"
                    );
                }
            }
        }
    }
}
