//! `f32` attention whose two products run on the sgemm register kernel
//! (`sgemm/blocks.rs`): per block of query rows and block of keys, the
//! scores `q kᵀ` as one packed product, the online softmax of the parent
//! module over each row of them, then `acc += p v` as a second packed
//! product. The heads are read through their strides: no dense copy.
//!
//! # Why
//!
//! MiniLM-L6 at 8 x 128 spent about a third of its CPU forward here in
//! `perf` (issue 38, sixth session): the parent's scalar-shaped block (one
//! AVX2 `axpy` per head dim and key block) 14%, and the dense copies of
//! the permuted q, k and v heads (`elementwise::map1`, most of it the
//! kernel zeroing the fresh pages of each copy) another 15%. The products
//! are 2 x 1 MFLOP per head, which the 6x32 kernel runs near its GEMM rate
//! when the keys and values are packed once per head and the blocks fit
//! L1 (`QB x KB` scores, 24 KB).
//!
//! # Results
//!
//! A score is the sgemm chain of fused multiply-adds over the head dim in
//! order, then `s * scale + mask` as in the parent; `e^x` is
//! [`exp_f32`]; a row's sum of weights adds 16 interleaved partials of
//! each key block, then the block's partials pairwise; `acc` is rescaled
//! by `e^(m - m')` and the product `p v` (a chain over the block's keys in
//! order) is added to it. The bits differ from the parent's block (whose
//! sums are plain multiplies and adds), not its semantics: the f64
//! reference tests hold at the same tolerance. NaN and inf follow the
//! parent's rules (a NaN score makes its row NaN; a removed key's score is
//! `-inf` whatever its product), with one difference that the op tests
//! leave open: the value of a removed key is multiplied by its weight of
//! 0, so a NaN or inf value may reach a row that does not keep its key.

use super::{Dims, MaskRead};
use crate::backends::cpu::sgemm::{self, blocks, Mat};
use crate::backends::cpu::CpuBuffer;
use crate::ir::fast_math::exp_f32;
use crate::ir::AttnMask;
use crate::{Error, Result};
use rayon::prelude::*;

/// Query rows per block (eight slivers of the register kernel's six).
const QB: usize = 48;
/// Keys per block (128 scores a row, 24 KB of them a block).
const KB: usize = 128;

/// True where [`run`] can run (the CPU has AVX2 and FMA).
pub(super) fn available() -> bool {
    sgemm::available()
}

/// One `[b, h, rows, cols]` operand read through its layout.
struct Strided<'a> {
    data: &'a [f32],
    offset: usize,
    strides: [usize; 4],
}

impl<'a> Strided<'a> {
    /// The `f32` operand `x` of `rows x cols` per head, or an error when its
    /// layout is not of rank 4, not of those sizes, or reaches past its
    /// storage (so that packing, which indexes, cannot panic).
    fn of(x: &'a CpuBuffer, n: &Dims, rows: usize, cols: usize) -> Result<Strided<'a>> {
        let view = x.view::<f32>()?;
        let l = view.layout;
        let (shape, s) = (&l.shape.0, &l.strides);
        if shape.as_slice() != [n.b, n.h, rows, cols] || s.len() != 4 {
            return Err(Error::Backend(format!(
                "cpu: attention operand of shape {shape:?}, expected [{}, {}, {rows}, {cols}]",
                n.b, n.h
            )));
        }
        let sizes = [n.b, n.h, rows, cols];
        let last = sizes
            .iter()
            .zip(s)
            .try_fold(l.offset, |at, (&len, &st)| at.checked_add(len.saturating_sub(1).checked_mul(st)?));
        if sizes.contains(&0) || last.is_none_or(|last| last >= view.data.len()) {
            return Err(Error::Backend("cpu: attention operand outside its storage".into()));
        }
        Ok(Strided { data: view.data, offset: l.offset, strides: [s[0], s[1], s[2], s[3]] })
    }

    /// Head `(b, h)` from row `r0` as a matrix: rows by columns, or, with
    /// `transposed`, columns by rows.
    fn mat(&self, b: usize, h: usize, r0: usize, transposed: bool) -> Mat<'a> {
        let s = &self.strides;
        let base = self.offset + b * s[0] + h * s[1] + r0 * s[2];
        let (rs, cs) = if transposed { (s[3], s[2]) } else { (s[2], s[3]) };
        Mat { data: self.data, base, rs, cs }
    }
}

/// `softmax(scale q kᵀ + mask) v` of `f32` operands into `out` and the
/// rows' log-sum-exp into `lse`, as the parent's `attention` defines them
/// (`out` `[b, h, sq, dv]` dense, `lse` `[b, h, sq]`). Every size is
/// non-zero (the caller's check); operands of other shapes, or reaching
/// past their storage, are an error.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    q: &CpuBuffer,
    k: &CpuBuffer,
    v: &CpuBuffer,
    read: &MaskRead<'_, f32>,
    scale: f32,
    causal: bool,
    n: &Dims,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let (sq, sk, d, dv) = (n.sq, n.sk, n.d, n.dv);
    let (qs, ks, vs) = (Strided::of(q, n, sq, d)?, Strided::of(k, n, sk, d)?, Strided::of(v, n, sk, dv)?);
    if !read.covers(n) {
        return Err(Error::Backend("cpu: attention mask outside its storage".into()));
    }
    let wide = blocks::wide_available();
    let heads = out.par_chunks_mut(sq * dv).zip(lse.par_chunks_mut(sq));
    heads.enumerate().for_each(|(bh, (head_out, head_lse))| {
        let (b, h) = (bh / n.h, bh % n.h);
        // Keys transposed (`[d, kn]`) and values (`[kn, dv]`), packed
        // once per key block for every block of queries of the head.
        let packed: Vec<(Vec<f32>, Vec<f32>)> = (0..sk)
            .step_by(KB)
            .map(|j0| {
                let kn = KB.min(sk - j0);
                let (mut kt, mut vp) = (Vec::new(), Vec::new());
                blocks::pack_b(ks.mat(b, h, j0, true), 0, d, kn, &mut kt);
                blocks::pack_b(vs.mat(b, h, j0, false), 0, kn, dv, &mut vp);
                (kt, vp)
            })
            .collect();
        let head =
            Head { b, h, q: qs.mat(b, h, 0, false), packed: &packed, read, scale, causal, sk, d, dv, wide };
        let row_blocks = head_out.par_chunks_mut(QB * dv).zip(head_lse.par_chunks_mut(QB));
        row_blocks.enumerate().for_each(|(blk, (rows_out, rows_lse))| {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `run` is called only where `available()`: AVX2 and FMA.
            unsafe {
                rows_avx2(&head, blk * QB, rows_out, rows_lse)
            };
            #[cfg(not(target_arch = "x86_64"))]
            rows(&head, blk * QB, rows_out, rows_lse);
        });
    });
    Ok(())
}

/// What the blocks of one head read.
struct Head<'a> {
    b: usize,
    h: usize,
    /// The head's queries, `[sq, d]`.
    q: Mat<'a>,
    /// Per key block: its keys transposed and its values, packed.
    packed: &'a [(Vec<f32>, Vec<f32>)],
    read: &'a MaskRead<'a, f32>,
    scale: f32,
    causal: bool,
    sk: usize,
    d: usize,
    dv: usize,
    wide: bool,
}

/// [`rows`] compiled for AVX2 and FMA, so that the softmax's loops run 8
/// lanes wide and [`exp_f32`]'s `mul_add`s are FMA instructions (without
/// the feature, each is a call to libm's `fmaf`).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(at: &Head<'_>, r0: usize, rows_out: &mut [f32], rows_lse: &mut [f32]) {
    rows(at, r0, rows_out, rows_lse)
}

/// Query rows `r0..r0 + rows_lse.len()` of one head: for each key block,
/// the scores as a packed product, the online softmax of each row (the
/// parent module's, on `f32`), the weights packed and `acc += p v` as a
/// second product; then `out = acc / l` and `lse = m + ln l`.
#[inline(always)]
fn rows(at: &Head<'_>, r0: usize, rows_out: &mut [f32], rows_lse: &mut [f32]) {
    let &Head { b, h, q, packed, read, scale, causal, sk, d, dv, wide } = at;
    let rows = rows_lse.len();
    let mut pq = Vec::new();
    blocks::pack_a(q, r0, rows, 0, d, &mut pq);
    let mut s = vec![0f32; rows * KB];
    let mut pp = Vec::new();
    let mut acc = vec![0f32; rows * dv];
    let mut m = [f32::NEG_INFINITY; QB];
    let mut l = [0f32; QB];
    // Causal: key blocks past the block's last row are never needed.
    let end = if causal { sk.min(r0 + rows) } else { sk };
    for ((kt, vp), j0) in packed.iter().zip((0..end).step_by(KB)) {
        // The whole packed block (a causal row masks the keys past it):
        // the packed values are `kn` deep.
        let kn = KB.min(sk - j0);
        blocks::multiply(&pq, kt, d, rows, kn, &mut s, KB, false, wide);
        for (r, row) in s.chunks_mut(KB).enumerate().take(rows) {
            let i = r0 + r;
            let row = &mut row[..kn];
            scores(read, b, h, i, j0, scale, causal, row);
            let best = row_max(row, m[r]);
            if best == f32::NEG_INFINITY {
                // Every key so far removed: weights of 0 add nothing.
                row.fill(0.0);
                continue;
            }
            let correction = exp_f32(m[r] - best);
            m[r] = best;
            if correction != 1.0 {
                acc[r * dv..][..dv].iter_mut().for_each(|a| *a *= correction);
            }
            l[r] = l[r] * correction + weights(row, best);
        }
        let p = Mat { data: &s, base: 0, rs: KB, cs: 1 };
        blocks::pack_a(p, 0, rows, 0, kn, &mut pp);
        blocks::multiply(&pp, vp, kn, rows, dv, &mut acc, dv, true, wide);
    }
    for (r, lse) in rows_lse.iter_mut().enumerate() {
        *lse =
            if m[r] == f32::NEG_INFINITY { f32::INFINITY } else { (m[r] as f64 + (l[r] as f64).ln()) as f32 };
        let inv = if l[r] == 0.0 { 0.0 } else { 1.0 / l[r] };
        for (o, &a) in rows_out[r * dv..][..dv].iter_mut().zip(&acc[r * dv..][..dv]) {
            *o = a * inv;
        }
    }
}

/// Row `i` of the scores, keys `j0..j0 + row.len()`: `s * scale + mask`,
/// or `-inf` for a removed key (a `false` of a bool mask, a causal key
/// past `i`), as the parent's `MaskRead::at` reads it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn scores(
    read: &MaskRead<'_, f32>,
    b: usize,
    h: usize,
    i: usize,
    j0: usize,
    scale: f32,
    causal: bool,
    row: &mut [f32],
) {
    let st = &read.strides;
    let o = read.offset + b * st[0] + h * st[1] + i * st[2] + j0 * st[3];
    let n = row.len();
    match read.kind {
        AttnMask::None => row.iter_mut().for_each(|s| *s = *s * scale + 0.0),
        AttnMask::Additive if st[3] == 1 => {
            row.iter_mut().zip(&read.add[o..o + n]).for_each(|(s, &a)| *s = *s * scale + a);
        }
        AttnMask::Additive => {
            row.iter_mut().enumerate().for_each(|(c, s)| *s = *s * scale + read.add[o + c * st[3]])
        }
        // A slice and a select, so the loop vectorizes (indexing each
        // key's flag through the stride was a third of the softmax's time
        // in MiniLM, whose key-padding mask is a bool).
        AttnMask::Keep if st[3] == 1 => row.iter_mut().zip(&read.keep[o..o + n]).for_each(|(s, &k)| {
            let kept = *s * scale + 0.0;
            *s = if k { kept } else { f32::NEG_INFINITY };
        }),
        AttnMask::Keep => row.iter_mut().enumerate().for_each(|(c, s)| {
            *s = if read.keep[o + c * st[3]] { *s * scale + 0.0 } else { f32::NEG_INFINITY };
        }),
    }
    if causal {
        row[(i + 1).saturating_sub(j0).min(n)..].fill(f32::NEG_INFINITY);
    }
}

/// The running maximum `start` updated with `row`: NaN when either holds
/// a NaN (a plain `>` would skip it, and a row of NaN scores would read as
/// a row with every key removed), else the largest. Sixteen lanes, so the
/// loop vectorizes; the extreme does not depend on the grouping.
#[inline(always)]
fn row_max(row: &[f32], start: f32) -> f32 {
    let mut best = [f32::NEG_INFINITY; 16];
    let mut nan = [false; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for t in 0..16 {
            best[t] = if c[t] > best[t] { c[t] } else { best[t] };
            nan[t] |= c[t].is_nan();
        }
    }
    for (t, &x) in tail.iter().enumerate() {
        best[t] = if x > best[t] { x } else { best[t] };
        nan[t] |= x.is_nan();
    }
    if start.is_nan() || nan.iter().any(|&x| x) {
        return f32::NAN;
    }
    best.iter().fold(start, |m, &x| if x > m { x } else { m })
}

/// The weights `e^(s - best)` in place of the scores, and their sum (16
/// interleaved partials, then pairwise: fixed by the row's length).
#[inline(always)]
fn weights(row: &mut [f32], best: f32) -> f32 {
    row.iter_mut().for_each(|s| *s = exp_f32(*s - best));
    let mut part = [0f32; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for t in 0..16 {
            part[t] += c[t];
        }
    }
    for (t, &x) in tail.iter().enumerate() {
        part[t] += x;
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for t in 0..w {
            part[t] += part[t + w];
        }
    }
    part[0]
}
