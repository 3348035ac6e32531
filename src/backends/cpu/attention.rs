//! Scaled dot-product attention on the CPU: a blocked kernel with the
//! online softmax of flash attention, so the `[sq, sk]` scores of a head
//! never exist as a whole (a block of `QB × KB` of them at a time).
//!
//! For each (batch, head) and block of `QB` query rows the kernel walks
//! the keys in blocks of `KB`: scores of the block, then per row the new
//! running maximum `m'`, the factor `e^(m - m')` that rescales what was
//! summed so far, the running sum `l` of `e^(s - m')` and the running
//! output `acc += e^(s - m') v`. At the end `out = acc / l`. A removed
//! key (causal, `false` in a bool mask) has the score `-inf` in place of
//! its product, an additive mask adds to it; a key whose score is `-inf`
//! adds nothing (its value is not read), and a row with every key removed
//! has `l = 0` and gives zeros. f16, bf16 and f32 accumulate in f32, f64
//! in f64, as the CUDA kernel does.
//!
//! Order of the arithmetic (it fixes the bits): a score is a running sum
//! over the head dim in order (`s += q[c] k[j, c]`, vectorized across the
//! keys of a block against the head's keys transposed), then `s * scale +
//! mask`; `e^x` in f32 is kiln's [`crate::ir::fast_math::exp_f32`] (within
//! 1 ulp, the fused kernels' exp), in f64 libm's. On AVX2+FMA CPUs the
//! block runs in an AVX2 copy of the same code (no contraction into FMA,
//! so the same bits).
//!
//! NaN and inf propagate as in PyTorch's formula: a NaN score makes the
//! running maximum NaN (a plain `>` would skip it, and a row of NaN
//! scores would look like a row with every key removed: zeros), so its
//! row is NaN; a `+inf` score gives `e^(inf - inf)`, NaN; a value is
//! multiplied by its weight even when the weight underflows to 0, so a
//! NaN value reaches every row that keeps its key.
//!
//! Operands may be any strided view (the heads of a `[b, s, h, d]`
//! projection permuted, a key-padding mask expanded over heads and
//! queries): queries, keys and values are copied to dense accumulator-type
//! scratch (linear in their size), the mask is read through its strides
//! so an expanded mask costs nothing.
//!
//! `f32` on AVX2+FMA CPUs takes `gemm.rs` instead: the same online
//! softmax, with the scores and `p v` of each block as products on the
//! sgemm register kernel and the operands packed from their strides (no
//! dense copies). The blocks below stay the reference for the other
//! dtypes and CPUs.

use super::elementwise::contiguous;
use super::storage::{dispatch, Elem, Out};
use super::CpuBuffer;
use crate::ir::{AttnLayout, AttnMask, DType};
use crate::{Error, Result};
use rayon::prelude::*;

mod gemm;

/// Query rows per block (one task's rows share each key block).
const QB: usize = 16;
/// Keys per block.
const KB: usize = 64;

/// The accumulator type: f32 for f16/bf16/f32, f64 for f64.
pub(super) trait Acc:
    Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Div<Output = Self>
    + 'static
{
    const ZERO: Self;
    const NEG_INF: Self;
    fn of(x: f64) -> Self;
    fn exp(self) -> Self;
    fn wide(self) -> f64;
    /// Whether it is NaN (the one value unequal to itself).
    #[inline]
    #[allow(clippy::eq_op)]
    fn is_nan(self) -> bool {
        self != self
    }
}

impl Acc for f32 {
    const ZERO: f32 = 0.0;
    const NEG_INF: f32 = f32::NEG_INFINITY;
    fn of(x: f64) -> f32 {
        x as f32
    }
    /// kiln's own `exp` (within 1 ulp, branch-free, so a row of weights
    /// vectorizes), the one the fused CPU kernels use; libm's `expf` was
    /// a call per score.
    fn exp(self) -> f32 {
        crate::ir::fast_math::exp_f32(self)
    }
    fn wide(self) -> f64 {
        self as f64
    }
}

impl Acc for f64 {
    const ZERO: f64 = 0.0;
    const NEG_INF: f64 = f64::NEG_INFINITY;
    fn of(x: f64) -> f64 {
        x
    }
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn wide(self) -> f64 {
        self
    }
}

/// The mask, read through its strides: `[b, h, i, j]` is
/// `data[offset + b s0 + h s1 + i s2 + j s3]`.
pub(super) struct MaskRead<'a, A> {
    kind: AttnMask,
    keep: &'a [bool],
    add: Vec<A>,
    strides: [usize; 4],
    offset: usize,
}

impl<'a, A: Acc> MaskRead<'a, A> {
    /// The reader of `mask` (`kind`; `None` reads as keeping every key).
    pub(super) fn new(mask: Option<&'a CpuBuffer>, kind: AttnMask) -> Result<MaskRead<'a, A>> {
        let mut read = MaskRead { kind, keep: &[], add: Vec::new(), strides: [0; 4], offset: 0 };
        if let Some(m) = mask.filter(|_| kind != AttnMask::None) {
            let l = m.layout();
            read.strides = [l.strides[0], l.strides[1], l.strides[2], l.strides[3]];
            read.offset = l.offset;
            match kind {
                AttnMask::Keep => read.keep = m.view::<bool>()?.data,
                _ => {
                    read.add = dispatch!(m.dtype(), M => m.view::<M>()?.data.iter().map(|e| A::of(Elem::to_f64(*e))).collect())
                }
            }
        }
        Ok(read)
    }

    /// True when every `(b, h, i, j)` of `n` reads inside the mask's
    /// storage (or there is no mask), so reading them cannot panic.
    fn covers(&self, n: &Dims) -> bool {
        let len = match self.kind {
            AttnMask::None => return true,
            AttnMask::Keep => self.keep.len(),
            AttnMask::Additive => self.add.len(),
        };
        let sizes = [n.b, n.h, n.sq, n.sk];
        let last = sizes
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |at, (&len, &st)| at.checked_add(len.saturating_sub(1).checked_mul(st)?));
        sizes.contains(&0) || last.is_some_and(|last| last < len)
    }

    /// The mask's term for `(b, h, i, j)`: `Some` of 0 or the additive
    /// value, or `None` for a removed key (whose score is `-inf`, not its
    /// product plus `-inf`: a NaN product of a removed key stays out, as
    /// PyTorch's `masked_fill` leaves it out).
    #[inline]
    pub(super) fn at(&self, b: usize, h: usize, i: usize, j: usize) -> Option<A> {
        let s = &self.strides;
        let o = self.offset + b * s[0] + h * s[1] + i * s[2] + j * s[3];
        match self.kind {
            AttnMask::None => Some(A::ZERO),
            AttnMask::Additive => Some(self.add[o]),
            AttnMask::Keep if self.keep[o] => Some(A::ZERO),
            AttnMask::Keep => None,
        }
    }
}

/// `softmax(scale q kᵀ + mask) v` into `out` (dense, `[b, h, sq, dv]`
/// or, with `layout` [`AttnLayout::Bshd`], `[b, sq, h, dv]`), and each
/// row's log-sum-exp into `lse` (`[b, h, sq]` in the accumulator type,
/// `+inf` for a row that keeps no key) where the plan reads it (`extra
/// %attention output=1`, for the backward's `attention_delta`).
///
/// A `bshd` result is computed in `bhsd` order and its rows then moved
/// in place: on the CPU that move costs what the merge's copy did, and
/// the kernels stay one (the layout pays on the GPU, where the kernels
/// write each row where it goes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    q: &CpuBuffer,
    k: &CpuBuffer,
    v: &CpuBuffer,
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    layout: AttnLayout,
    mut out: Out<'_>,
    lse: Option<Out<'_>>,
) -> Result<()> {
    attention_bhsd(q, k, v, mask, kind, scale, causal, out.reborrow(), lse)?;
    if layout == AttnLayout::Bshd {
        let dims = Dims::of(q, k, v)?;
        match out.dtype() {
            DType::F64 => heads_to_rows(out.get::<f64>()?, &dims),
            DType::F32 => heads_to_rows(out.get::<f32>()?, &dims),
            DType::F16 => heads_to_rows(out.get::<half::f16>()?, &dims),
            DType::BF16 => heads_to_rows(out.get::<half::bf16>()?, &dims),
            d => return Err(Error::Backend(format!("cpu: attention is not defined on {d}"))),
        }
    }
    Ok(())
}

/// `[b, h, sq, dv]` rows rearranged in place into `[b, sq, h, dv]`.
fn heads_to_rows<T: Copy>(out: &mut [T], n: &Dims) {
    let heads = out.to_vec();
    let dv = n.dv;
    for (bh, head) in heads.chunks(n.sq * dv).enumerate() {
        let (b, h) = (bh / n.h, bh % n.h);
        for (s, row) in head.chunks(dv).enumerate() {
            out[((b * n.sq + s) * n.h + h) * dv..][..dv].copy_from_slice(row);
        }
    }
}

/// [`attention`] in the `[b, h, sq, dv]` layout.
#[allow(clippy::too_many_arguments)]
fn attention_bhsd(
    q: &CpuBuffer,
    k: &CpuBuffer,
    v: &CpuBuffer,
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    out: Out<'_>,
    lse: Option<Out<'_>>,
) -> Result<()> {
    let dims = Dims::of(q, k, v)?;
    if out.len() != dims.b * dims.h * dims.sq * dims.dv {
        return Err(Error::Backend("cpu: attention output of the wrong size".into()));
    }
    if lse.as_ref().is_some_and(|l| l.len() != dims.b * dims.h * dims.sq) {
        return Err(Error::Backend("cpu: attention log-sum-exp of the wrong size".into()));
    }
    if kind != AttnMask::None && mask.is_none() {
        return Err(Error::Backend("cpu: attention lacks its mask operand".into()));
    }
    let sizes = [dims.b, dims.h, dims.sq, dims.sk, dims.d, dims.dv];
    if q.dtype() == DType::F32 && gemm::available() && !sizes.contains(&0) {
        let read = MaskRead::<f32>::new(mask, kind)?;
        let out = out.get::<f32>()?;
        let mut scratch = Vec::new();
        let lse: &mut [f32] = match lse {
            Some(l) => l.get::<f32>()?,
            None => {
                scratch.resize(dims.b * dims.h * dims.sq, 0.0);
                &mut scratch
            }
        };
        return gemm::run(q, k, v, &read, scale as f32, causal, &dims, out, lse);
    }
    match q.dtype() {
        DType::F64 => run::<f64, f64>(q, k, v, mask, kind, scale, causal, &dims, out, lse),
        DType::F32 => run::<f32, f32>(q, k, v, mask, kind, scale, causal, &dims, out, lse),
        DType::F16 => run::<half::f16, f32>(q, k, v, mask, kind, scale, causal, &dims, out, lse),
        DType::BF16 => run::<half::bf16, f32>(q, k, v, mask, kind, scale, causal, &dims, out, lse),
        d => Err(Error::Backend(format!("cpu: attention is not defined on {d}"))),
    }
}

/// The sizes: batch, heads, query and key lengths, head dims.
pub(super) struct Dims {
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) sq: usize,
    pub(super) sk: usize,
    pub(super) d: usize,
    pub(super) dv: usize,
}

impl Dims {
    /// The sizes of queries `q`, keys `k` and the `[.., dv]` operand `v`
    /// (the values, or the forward's output).
    pub(super) fn of(q: &CpuBuffer, k: &CpuBuffer, v: &CpuBuffer) -> Result<Dims> {
        let (qs, ks, vs) = (&q.shape().0, &k.shape().0, &v.shape().0);
        if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 {
            return Err(Error::Backend("cpu: attention operands must have rank 4".into()));
        }
        Ok(Dims { b: qs[0], h: qs[1], sq: qs[2], sk: ks[2], d: qs[3], dv: vs[3] })
    }
}

/// The operand as dense accumulator-type values.
pub(super) fn dense<T: Elem, A: Acc>(x: &CpuBuffer) -> Result<Vec<A>> {
    Ok(contiguous(x.view::<T>()?)?.into_iter().map(|e| A::of(Elem::to_f64(e))).collect())
}

#[allow(clippy::too_many_arguments)]
fn run<T: Elem, A: Acc + Elem>(
    q: &CpuBuffer,
    k: &CpuBuffer,
    v: &CpuBuffer,
    mask: Option<&CpuBuffer>,
    kind: AttnMask,
    scale: f64,
    causal: bool,
    n: &Dims,
    out: Out<'_>,
    lse: Option<Out<'_>>,
) -> Result<()> {
    let (q, k, v) = (dense::<T, A>(q)?, dense::<T, A>(k)?, dense::<T, A>(v)?);
    let read = MaskRead::new(mask, kind)?;
    let out = out.get::<T>()?;
    let scale = A::of(scale);
    let (sq, sk, d, dv) = (n.sq, n.sk, n.d, n.dv);
    // Every block writes its rows' log-sum-exp; a scratch row set when no
    // step reads them (one number a row, next to `dv` outputs).
    let mut scratch = Vec::new();
    let lse: &mut [A] = match lse {
        Some(l) => l.get::<A>()?,
        None => {
            scratch.resize(n.b * n.h * sq, A::ZERO);
            &mut scratch
        }
    };
    #[cfg(target_arch = "x86_64")]
    let wide = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    let heads = out.par_chunks_mut((sq * dv).max(1)).zip(lse.par_chunks_mut(sq.max(1)));
    heads.enumerate().for_each(|(bh, (head_out, head_lse))| {
        let (b, h) = (bh / n.h.max(1), bh % n.h.max(1));
        let qh = &q[bh * sq * d..][..sq * d];
        let kh = &k[bh * sk * d..][..sk * d];
        let kt: Vec<A> = (0..d * sk).map(|e| kh[(e % sk) * d + e / sk]).collect();
        let vh = &v[bh * sk * dv..][..sk * dv];
        let blocks = head_out.par_chunks_mut(QB * dv.max(1)).zip(head_lse.par_chunks_mut(QB));
        blocks.enumerate().for_each(|(blk, (rows_out, rows_lse))| {
            let at = Block { b, h, r0: blk * QB, qh, kt: &kt, vh, read: &read, scale, causal, sk, d, dv };
            #[cfg(target_arch = "x86_64")]
            if wide {
                // SAFETY: `wide` is true only where the CPU has AVX2 and FMA.
                return unsafe { block_avx2(&at, rows_out, rows_lse) };
            }
            block(&at, rows_out, rows_lse);
        });
    });
    Ok(())
}

/// What one block of query rows reads: its (batch, head), first row, the
/// head's dense queries, keys and values, the mask and the sizes.
struct Block<'a, A> {
    b: usize,
    h: usize,
    r0: usize,
    qh: &'a [A],
    /// The head's keys transposed, `[d, sk]`.
    kt: &'a [A],
    vh: &'a [A],
    read: &'a MaskRead<'a, A>,
    scale: A,
    causal: bool,
    sk: usize,
    d: usize,
    dv: usize,
}

/// [`block`] compiled for AVX2 and FMA: the same operations in the same
/// order (Rust does not contract `a * b + c` into a fused multiply-add, so
/// the bits are the same), on 8-wide vectors where the SSE2 build of the
/// crate used 4-wide ones. The attention of MiniLM's encoder at 8 x 128
/// (heads of 32) was a fifth of its forward pass in `perf` (issue 38),
/// most of it the dot products and the `acc += p v` rows.
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2<T: Elem, A: Acc>(at: &Block<'_, A>, rows_out: &mut [T], rows_lse: &mut [A]) {
    block(at, rows_out, rows_lse)
}

/// Rows `r0..r0 + rows_out.len() / dv` of one head: the online softmax
/// over key blocks (see the module doc), written to `rows_out`, and the
/// rows' log-sum-exp `m + ln l` to `rows_lse` (`+inf` for a row that
/// keeps no key, NaN for a row with a NaN score).
///
/// Shaped for vectors: a row's scores of a key block are `KB` running sums
/// over the head dim (`s += q[c] * kᵀ[c, ..]`, so one product of `q` and a
/// row of `kᵀ` fills `KB` lanes at once), and `acc += p v` runs over the
/// value dims in register-sized chunks. A dot product per key (the earlier
/// form) spent its time in horizontal adds and per-key branches.
#[inline(always)]
fn block<T: Elem, A: Acc>(at: &Block<'_, A>, rows_out: &mut [T], rows_lse: &mut [A]) {
    let &Block { b, h, r0, qh, kt, vh, read, scale, causal, sk, d, dv } = at;
    let rows = rows_out.len() / dv.max(1);
    let mut m = [A::NEG_INF; QB];
    let mut l = [A::ZERO; QB];
    let mut acc = vec![A::ZERO; rows * dv];
    // Causal: keys past the block's last row are never needed.
    let end = if causal { sk.min(r0 + rows) } else { sk };
    for j0 in (0..end).step_by(KB) {
        let kn = KB.min(end - j0);
        for r in 0..rows {
            let i = r0 + r;
            let qi = &qh[i * d..][..d];
            let mut s = [A::ZERO; KB];
            for (c, &qc) in qi.iter().enumerate() {
                axpy(&mut s[..kn], qc, &kt[c * sk + j0..][..kn]);
            }
            let mut best = m[r];
            for (c, sc) in s[..kn].iter_mut().enumerate() {
                let j = j0 + c;
                *sc = match read.at(b, h, i, j) {
                    Some(add) if !(causal && j > i) => *sc * scale + add,
                    _ => A::NEG_INF,
                };
                // NaN wins (once `best` is NaN, nothing replaces it).
                if *sc > best || sc.is_nan() && !best.is_nan() {
                    best = *sc;
                }
            }
            if best == A::NEG_INF {
                continue; // every key so far removed: nothing to add
            }
            let correction = (m[r] - best).exp();
            m[r] = best;
            let row = &mut acc[r * dv..][..dv];
            if correction != A::of(1.0) {
                row.iter_mut().for_each(|a| *a = *a * correction);
            }
            // The weights: a removed key's is e^-inf = 0, which adds
            // nothing to the sum; its value is not read (below).
            let mut p = [A::ZERO; KB];
            for (w, &sc) in p[..kn].iter_mut().zip(&s[..kn]) {
                *w = (sc - best).exp();
            }
            let sum = p[..kn].iter().fold(A::ZERO, |a, &w| a + w);
            for (c0, part) in (0..dv).step_by(VC).zip(row.chunks_mut(VC)) {
                // A chunk of the row in a local array, which stays in
                // registers across the keys.
                let mut tmp = [A::ZERO; VC];
                tmp[..part.len()].copy_from_slice(part);
                for (c, (&w, &sc)) in p[..kn].iter().zip(&s[..kn]).enumerate() {
                    if sc != A::NEG_INF {
                        axpy(&mut tmp[..part.len()], w, &vh[(j0 + c) * dv + c0..][..part.len()]);
                    }
                }
                part.copy_from_slice(&tmp[..part.len()]);
            }
            l[r] = l[r] * correction + sum;
        }
    }
    for (r, lse) in rows_lse.iter_mut().enumerate().take(rows) {
        *lse = if m[r] == A::NEG_INF { A::of(f64::INFINITY) } else { A::of(m[r].wide() + l[r].wide().ln()) };
        let inv = if l[r] == A::ZERO { A::ZERO } else { A::of(1.0) / l[r] };
        for (o, &a) in rows_out[r * dv..][..dv].iter_mut().zip(&acc[r * dv..][..dv]) {
            *o = T::from_f64((a * inv).wide());
        }
    }
}

/// Value dims per register chunk of `acc += p v` (four AVX vectors of f32).
const VC: usize = 32;

/// `y += a x`, elementwise; at the full lengths ([`KB`], [`VC`]) through
/// fixed-size arrays, which the compiler unrolls into registers (a slice of
/// a run-time length kept its sums on the stack, a load and a store per
/// element and key).
#[inline(always)]
fn axpy<A: Acc>(y: &mut [A], a: A, x: &[A]) {
    #[inline(always)]
    fn fixed<A: Acc, const N: usize>(y: &mut [A; N], a: A, x: &[A; N]) {
        for t in 0..N {
            y[t] = y[t] + a * x[t];
        }
    }
    let n = y.len().min(x.len());
    if let (Ok(y), Ok(x)) = (<&mut [A; KB]>::try_from(&mut *y), <&[A; KB]>::try_from(&x[..n])) {
        return fixed(y, a, x);
    }
    if let (Ok(y), Ok(x)) = (<&mut [A; VC]>::try_from(&mut *y), <&[A; VC]>::try_from(&x[..n])) {
        return fixed(y, a, x);
    }
    for (v, &u) in y.iter_mut().zip(x) {
        *v = *v + a * u;
    }
}
