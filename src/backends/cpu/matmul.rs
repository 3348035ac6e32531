//! Batched matrix multiplication.
//!
//! `f32` goes through kiln's packed AVX2 kernel (`sgemm.rs`, parallel over
//! tiles) where the CPU has AVX2+FMA; `f64` (and `f32` elsewhere) through
//! `matrixmultiply` (single-threaded `sgemm` / `dgemm`, parallelised here
//! with rayon over row blocks of A). A batch times one weight (a linear
//! layer over `[batch, seq]`) runs as one GEMM of all its rows
//! ([`Problem::batch_as_rows`]). Many other small problems run one
//! single-threaded GEMM per batch item across rayon. It takes
//! arbitrary row and column strides, so transposed, sliced and stride-0
//! (expanded) operands need no copy. `f16` and `bf16` are widened to
//! `f32`, multiplied and rounded once. Integer dtypes use a row-major loop
//! with wrapping `i64` arithmetic (equal, modulo the dtype's width, to
//! wrapping in the dtype).

use super::elementwise::{map1, PAR_THRESHOLD};
use super::storage::{Elem, Out, Storage, View};
use super::CpuBuffer;
use crate::backends::layout::Layout;
use crate::ir::{DType, Shape};
use crate::{Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::Arc;

/// Below this many multiply-adds a product of at most `FEW_ROWS` rows
/// (decode's GEMVs), or one of another dtype than f32 (matrixmultiply),
/// runs on one thread.
const GEMM_PAR_WORK: usize = 64 * 64 * 64;

/// Below this many multiply-adds a single packed f32 GEMM runs on one thread: a
/// rayon split costs a wake-up of the other core and a join, and below
/// about 2^20 multiply-adds that costs more than the second core saves.
/// Measured on the 2-core EPYC (issue 38, f32, the fastest of 300 runs,
/// three rounds; serial / split): 32x64x256 18.3-19.3 / 20.0-39.2 us,
/// 64x64x256 27.1-28.7 / 25.8-49.4, 128^3 43.6-44.4 / 45.2-46.7,
/// 64x128x256 52.0-53.5 / 45.6-48.9, 64x256x256 100.5-104.0 / 75.2-89.0.
/// At the old 64^3 the digits MLP's two 32x64x256 products were split,
/// and the rayon wake-ups were 8% of its step.
const SGEMM_PAR_WORK: usize = 1 << 20;

/// A batch of problems each smaller than this many multiply-adds runs one
/// single-threaded GEMM per batch item across rayon.
const GEMM_BATCH_PAR_WORK: usize = GEMM_PAR_WORK * 8;

/// Row blocks handed to rayon are never smaller than this.
const GEMM_MIN_ROWS: usize = 64;

/// The float types `matrixmultiply` multiplies natively.
pub(crate) trait GemmFloat: Elem + Send + Sync {
    /// `C = A x B` for one `m x k` by `k x n` problem, strides in elements.
    ///
    /// # Safety
    /// As `matrixmultiply::sgemm`: every `a + i*rsa + j*csa` (`i < m`,
    /// `j < k`) and `b + i*rsb + j*csb` (`i < k`, `j < n`) is a readable
    /// element; every `c + i*rsc + j*csc` (`i < m`, `j < n`) is a writable
    /// element, no two of them the same and none overlapping A or B.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! gemm_float_impl {
    ($t:ty, $f:path) => {
        impl GemmFloat for $t {
            unsafe fn gemm(
                m: usize,
                k: usize,
                n: usize,
                a: *const $t,
                rsa: isize,
                csa: isize,
                b: *const $t,
                rsb: isize,
                csb: isize,
                c: *mut $t,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: the caller upholds `GemmFloat::gemm`'s contract,
                // which is this function's (alpha = 1; beta = 0, so C is
                // written without being read).
                unsafe { $f(m, k, n, 1.0, a, rsa, csa, b, rsb, csb, 0.0, c, rsc, csc) }
            }
        }
    };
}
gemm_float_impl!(f32, matrixmultiply::sgemm);
gemm_float_impl!(f64, matrixmultiply::dgemm);

/// `s` as `&[f32]` when `T` is `f32`.
pub(super) fn as_f32<T: 'static>(s: &[T]) -> Option<&[f32]> {
    // SAFETY: same type id, so `T` is `f32`.
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
}

/// `s` as `&mut [f32]` when `T` is `f32`.
pub(super) fn as_f32_mut<T: 'static>(s: &mut [T]) -> Option<&mut [f32]> {
    // SAFETY: same type id, so `T` is `f32`.
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        .then(|| unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<f32>(), s.len()) })
}

/// One operand of a GEMM: storage, base offset, row and column strides.
#[derive(Clone, Copy)]
struct Operand<'a, T> {
    data: &'a [T],
    base: usize,
    rs: usize,
    cs: usize,
}

/// Products of at most this many rows skip the packed GEMM (`few_rows`).
pub(super) const FEW_ROWS: usize = 4;

/// Columns per rayon task of [`few_rows`].
const FEW_ROWS_COLUMNS: usize = 512;

/// `dst = a x b` for a few rows of `a` (a decode step's projections),
/// reading `b` where it lies instead of packing it: the packed GEMM
/// repacks the whole weight on every call, which was three fifths of
/// GPT-2's CPU decode time (`perf`, issue 34). Rows of `b` contiguous
/// (`cs == 1`, a weight stored `[in, out]`): each output row is a sum of
/// scaled rows of `b` (an axpy per element of `a`, which vectorizes).
/// Columns of `b` contiguous (`rs == 1`, a transposed weight such as a
/// tied LM head): each output is a dot product. Split over column blocks
/// across rayon when `parallel`. Same contract as [`gemm_rows`].
fn few_rows(
    m: usize,
    k: usize,
    n: usize,
    a: Operand<'_, f32>,
    b: Operand<'_, f32>,
    dst: &mut [f32],
    parallel: bool,
) {
    let a_at = |i: usize, kk: usize| a.data[a.base + i * a.rs + kk * a.cs];
    let columns = |c0: usize, width: usize, out: &mut dyn FnMut(usize, usize, f32)| {
        if b.cs == 1 {
            let mut acc = vec![0.0f32; width];
            for i in 0..m {
                acc.iter_mut().for_each(|x| *x = 0.0);
                for kk in 0..k {
                    let s = a_at(i, kk);
                    let row = &b.data[b.base + kk * b.rs + c0..][..width];
                    for (x, &y) in acc.iter_mut().zip(row) {
                        *x += s * y;
                    }
                }
                for (j, &x) in acc.iter().enumerate() {
                    out(i, c0 + j, x);
                }
            }
        } else {
            let mut row = vec![0.0f32; k];
            for i in 0..m {
                row.iter_mut().enumerate().for_each(|(kk, x)| *x = a_at(i, kk));
                for j in c0..c0 + width {
                    out(i, j, dot(&row, &b.data[b.base + j * b.cs..][..k]));
                }
            }
        }
    };
    if !parallel || n <= FEW_ROWS_COLUMNS {
        columns(0, n, &mut |i, j, x| dst[i * n + j] = x);
        return;
    }
    use rayon::prelude::*;
    let blocks: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(FEW_ROWS_COLUMNS))
        .into_par_iter()
        .map(|blk| {
            let c0 = blk * FEW_ROWS_COLUMNS;
            let width = FEW_ROWS_COLUMNS.min(n - c0);
            let mut part = vec![0.0f32; m * width];
            columns(c0, width, &mut |i, j, x| part[i * width + (j - c0)] = x);
            (c0, part)
        })
        .collect();
    for (c0, part) in blocks {
        let width = part.len() / m;
        for i in 0..m {
            dst[i * n + c0..][..width].copy_from_slice(&part[i * width..][..width]);
        }
    }
}

/// `x . y` over [`DOT_LANES`] running sums (added pairwise at the end):
/// one sum is a chain of dependent adds the compiler may not reorder, so
/// the LM head's 50257 dot products of 768 (GPT-2 decode on the CPU) ran
/// at one add per 4 cycles instead of at memory speed.
fn dot(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0.0f32; DOT_LANES];
    let (xs, ys) = (x.chunks_exact(DOT_LANES), y.chunks_exact(DOT_LANES));
    let (xr, yr) = (xs.remainder(), ys.remainder());
    for (a, b) in xs.zip(ys) {
        for l in 0..DOT_LANES {
            acc[l] += a[l] * b[l];
        }
    }
    let mut width = DOT_LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0] + xr.iter().zip(yr).map(|(a, b)| a * b).sum::<f32>()
}

/// Running sums of [`dot`]: two AVX registers of f32.
const DOT_LANES: usize = 16;

/// `dst` (`m x n`, row-major) = `a` (`m x k`) x `b` (`k x n`), split into
/// row blocks across rayon when `parallel` and the problem is big enough.
///
/// Callers guarantee (checked by `check_fits` / lengths) that every
/// element `base + i*rs + j*cs` of both operands, for indices inside the
/// problem, is inside its `data`; `dst.len() == m * n`; m, k, n > 0.
/// `b_storage` is the storage whose elements `b.data` is, when B may be
/// read again with the same bytes (a weight): the packed f32 GEMM then
/// keeps its packing (`sgemm/cache.rs`).
#[allow(clippy::too_many_arguments)]
fn gemm_rows<T: GemmFloat>(
    m: usize,
    k: usize,
    n: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    dst: &mut [T],
    parallel: bool,
    b_storage: Option<&Arc<Storage>>,
) {
    debug_assert_eq!(dst.len(), m * n);
    if let (Some(a32), Some(b32), Some(d32)) = (as_f32(a.data), as_f32(b.data), as_f32_mut(dst)) {
        if m <= FEW_ROWS && (b.cs == 1 || b.rs == 1) {
            let a = Operand { data: a32, base: a.base, rs: a.rs, cs: a.cs };
            let b = Operand { data: b32, base: b.base, rs: b.rs, cs: b.cs };
            few_rows(m, k, n, a, b, d32, parallel && m * n * k >= GEMM_PAR_WORK);
            return;
        }
        if super::sgemm::available() {
            let ma = super::sgemm::Mat { data: a32, base: a.base, rs: a.rs, cs: a.cs };
            let mb = super::sgemm::Mat { data: b32, base: b.base, rs: b.rs, cs: b.cs };
            // Products below SGEMM_PAR_WORK (a small MLP's training step,
            // whose weights change every step anyway) skip the cache's lock
            // and lookups; their packing is a few microseconds.
            let big = m * n * k >= SGEMM_PAR_WORK;
            let parallel = parallel && big;
            match b_storage.filter(|_| big).and_then(|s| super::sgemm::cache::packed(s, mb, k, n, parallel)) {
                Some(packed) => super::sgemm::sgemm_packed(m, ma, &packed, d32, parallel),
                None => super::sgemm::sgemm(m, k, n, ma, mb, d32, parallel),
            }
            return;
        }
    }
    // A stride of a dimension of size 1 is never multiplied by a non-zero
    // index; pin it to 0 so the `isize` casts below cannot wrap.
    let st = |d: usize, s: usize| if d == 1 { 0 } else { s as isize };
    let block = |r0: usize, c: &mut [T]| {
        let mr = c.len() / n;
        // SAFETY: rows r0..r0+mr of A are rows of the problem, so every
        // element matrixmultiply reads from A is `a.base + i*rs + j*cs`
        // with i < m, j < k, inside `a.data` by the caller's guarantee
        // (likewise B); for a dimension longer than 1 that offset bound
        // also keeps its stride below isize::MAX. A stride of 0 (an
        // expanded view) is allowed: matrixmultiply only reads A and B,
        // and its docs say their strides may be arbitrary. C is `c`, a
        // dense mr x n block (row stride n, column stride 1) of `dst`,
        // disjoint from the other blocks and from A and B (`&mut`).
        unsafe {
            T::gemm(
                mr,
                k,
                n,
                a.data.as_ptr().add(a.base + r0 * a.rs),
                st(m, a.rs),
                st(k, a.cs),
                b.data.as_ptr().add(b.base),
                st(k, b.rs),
                st(n, b.cs),
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    };
    let threads = rayon::current_num_threads();
    if parallel && threads > 1 && m * n * k >= GEMM_PAR_WORK && m >= 2 * GEMM_MIN_ROWS {
        let rows = m.div_ceil(threads).max(GEMM_MIN_ROWS);
        dst.par_chunks_mut(rows * n).enumerate().for_each(|(i, c)| block(i * rows, c));
    } else {
        block(0, dst);
    }
}

/// The problem: batch offsets of each operand plus m, k, n and strides.
pub(crate) struct Problem {
    pub(crate) a_base: Vec<usize>,
    pub(crate) b_base: Vec<usize>,
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) a_rs: usize,
    pub(crate) a_cs: usize,
    pub(crate) b_rs: usize,
    pub(crate) b_cs: usize,
}

impl Problem {
    pub(crate) fn new(a: &Layout, b: &Layout) -> Result<Problem> {
        let r = a.shape.rank();
        if r < 2 || b.shape.rank() != r {
            return Err(Error::Backend(format!("cpu: matmul of {} and {}", a.shape, b.shape)));
        }
        let batch = Shape(a.shape.0[..r - 2].to_vec());
        let nb = batch.numel();
        let bases = |l: &Layout| {
            let mut it = crate::backends::layout::Offsets::new(&batch.0, &l.strides[..r - 2], l.offset, 0);
            (0..nb).map(|_| it.next_offset()).collect::<Vec<_>>()
        };
        Ok(Problem {
            a_base: bases(a),
            b_base: bases(b),
            m: a.shape.0[r - 2],
            k: a.shape.0[r - 1],
            n: b.shape.0[r - 1],
            a_rs: a.strides[r - 2],
            a_cs: a.strides[r - 1],
            b_rs: b.strides[r - 2],
            b_cs: b.strides[r - 1],
        })
    }

    /// The row stride of A as one `(batch * m) x k` matrix, when the batch
    /// can be multiplied as one problem: B is the same matrix for every
    /// batch item (a weight expanded over `[batch, seq]`, as `x.matmul(
    /// &w.t())` records it) and A's batch items follow each other at
    /// `m` rows apart (one evenly strided run of rows). The output is dense
    /// `[batch, m, n]`, which is the same memory as `[batch * m, n]`.
    ///
    /// Why: an encoder's projections are `[8, 128, 384] x [384, 384]`.
    /// Eight GEMMs of 128 rows packed the weight eight times and each ran
    /// as one row block (the column-split path); one GEMM of 1024 rows
    /// packs it once and splits rows across the cores.
    pub(crate) fn batch_as_rows(&self) -> Option<usize> {
        let nb = self.a_base.len();
        if nb < 2 || self.b_base.iter().any(|&o| o != self.b_base[0]) {
            return None;
        }
        let step = self.a_base[1].checked_sub(self.a_base[0]).filter(|&s| s > 0)?;
        let even = self.a_base.windows(2).all(|w| w[1].checked_sub(w[0]) == Some(step));
        // One row: its stride is free, the batch step is the row stride.
        let rows = if self.m == 1 { step } else { self.a_rs };
        (even && rows.checked_mul(self.m) == Some(step)).then_some(rows)
    }
}

fn check_fits<T>(v: &View<'_, T>) -> Result<()> {
    if v.layout.extent() > v.data.len() {
        return Err(Error::Backend(format!(
            "cpu: layout {:?} does not fit storage of {} elements",
            v.layout,
            v.data.len()
        )));
    }
    Ok(())
}

/// `C = A x B` through `matrixmultiply` (`T` is f32 or f64), or the packed
/// f32 GEMM; `b_storage` as for [`gemm_rows`] (B's storage, when it is one
/// a later call may read again: not an arena range).
fn gemm_float<T: GemmFloat>(
    a: View<'_, T>,
    b: View<'_, T>,
    out: &mut [T],
    b_storage: Option<&Arc<Storage>>,
) -> Result<()> {
    check_fits(&a)?;
    check_fits(&b)?;
    let p = Problem::new(a.layout, b.layout)?;
    let (m, k, n) = (p.m, p.k, p.n);
    let nb = p.a_base.len();
    check_out(out, nb * m * n)?;
    if m == 0 || n == 0 || nb == 0 {
        return Ok(());
    }
    if k == 0 {
        // An empty sum: every output is zero.
        out.fill(T::default());
        return Ok(());
    }
    // check_fits proved every offset of each layout, so every element of
    // every batch item's problem, is inside its storage (gemm_rows' contract).
    if let Some(rows) = p.batch_as_rows() {
        // One weight for every batch item: one GEMM of `nb * m` rows.
        let a = Operand { data: a.data, base: p.a_base[0], rs: rows, cs: p.a_cs };
        let b = Operand { data: b.data, base: p.b_base[0], rs: p.b_rs, cs: p.b_cs };
        gemm_rows(nb * m, k, n, a, b, out, true, b_storage);
        return Ok(());
    }
    let opa = |i: usize| Operand { data: a.data, base: p.a_base[i], rs: p.a_rs, cs: p.a_cs };
    let opb = |i: usize| Operand { data: b.data, base: p.b_base[i], rs: p.b_rs, cs: p.b_cs };
    if nb > 1 && m * n * k < GEMM_BATCH_PAR_WORK {
        // many small problems: one single-threaded GEMM per batch item
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, dst)| gemm_rows(m, k, n, opa(i), opb(i), dst, false, None));
    } else {
        // few large problems: each split into row blocks across rayon
        for (i, dst) in out.chunks_mut(m * n).enumerate() {
            gemm_rows(m, k, n, opa(i), opb(i), dst, true, b_storage.filter(|_| nb == 1));
        }
    }
    Ok(())
}

fn check_out<T>(out: &[T], n: usize) -> Result<()> {
    if out.len() != n {
        return Err(Error::Backend(format!("cpu: matmul output of {} elements, {n} expected", out.len())));
    }
    Ok(())
}

/// `C = A x B` for integer dtypes, wrapping.
fn matmul_int<T: Elem>(a: View<'_, T>, b: View<'_, T>, out: &mut [T]) -> Result<()> {
    let p = Problem::new(a.layout, b.layout)?;
    let (m, k, n) = (p.m, p.k, p.n);
    let nb = p.a_base.len();
    check_out(out, nb * m * n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let row = |r: usize, dst: &mut [T]| {
        let (bi, i) = (r / m, r % m);
        let mut acc = vec![0i64; n];
        let a0 = p.a_base[bi] + i * p.a_rs;
        for q in 0..k {
            let av = a.data[a0 + q * p.a_cs].to_i64();
            if av == 0 {
                continue;
            }
            let b0 = p.b_base[bi] + q * p.b_rs;
            for (j, s) in acc.iter_mut().enumerate() {
                *s = s.wrapping_add(av.wrapping_mul(b.data[b0 + j * p.b_cs].to_i64()));
            }
        }
        for (d, s) in dst.iter_mut().zip(acc) {
            *d = T::from_i64(s);
        }
    };
    if nb * m * n * k.max(1) >= PAR_THRESHOLD {
        out.par_chunks_mut(n).enumerate().for_each(|(r, dst)| row(r, dst));
    } else {
        out.chunks_mut(n).enumerate().for_each(|(r, dst)| row(r, dst));
    }
    Ok(())
}

/// `C = A x B` in `f32` for a half-precision dtype: both operands widened
/// (into contiguous copies), multiplied, each result rounded once into `out`.
fn widened<T: Elem>(
    va: View<'_, T>,
    vb: View<'_, T>,
    out: &mut [T],
    to_f32: fn(T) -> f32,
    from_f32: fn(f32) -> T,
) -> Result<()> {
    let (la, lb) = (Layout::contiguous(va.layout.shape.clone()), Layout::contiguous(vb.layout.shape.clone()));
    let mut wa = vec![0f32; la.numel()];
    let mut wb = vec![0f32; lb.numel()];
    map1(va, &mut wa, to_f32);
    map1(vb, &mut wb, to_f32);
    let mut c = vec![0f32; out.len()];
    gemm_float(View { data: &wa, layout: &la }, View { data: &wb, layout: &lb }, &mut c, None)?;
    for (o, v) in out.iter_mut().zip(c) {
        *o = from_f32(v);
    }
    Ok(())
}

/// `[.., m, k] x [.., k, n]` with equal batch dims, any strides, into `out`.
pub(crate) fn matmul(a: &CpuBuffer, b: &CpuBuffer, out: Out<'_>) -> Result<()> {
    match a.dtype() {
        DType::F32 => {
            // B's bytes, when they outlive this run (a weight; an arena
            // range is rewritten by the next run).
            let b_storage = Some(&b.storage).filter(|s| !s.is_arena());
            gemm_float(a.view::<f32>()?, b.view::<f32>()?, out.get()?, b_storage)
        }
        DType::F64 => gemm_float(a.view::<f64>()?, b.view::<f64>()?, out.get()?, None),
        DType::F16 => widened(a.view::<f16>()?, b.view::<f16>()?, out.get()?, f16::to_f32, f16::from_f32),
        DType::BF16 => {
            widened(a.view::<bf16>()?, b.view::<bf16>()?, out.get()?, bf16::to_f32, bf16::from_f32)
        }
        DType::U8 => matmul_int(a.view::<u8>()?, b.view::<u8>()?, out.get()?),
        DType::I32 => matmul_int(a.view::<i32>()?, b.view::<i32>()?, out.get()?),
        DType::I64 => matmul_int(a.view::<i64>()?, b.view::<i64>()?, out.get()?),
        DType::Bool => Err(Error::Backend("cpu: matmul is not defined on bool".into())),
    }
}

/// A plain `C = A x B` on row-major `f32`/`f64` slices, for conv's GEMMs.
pub(crate) fn gemm_rowmajor<T: GemmFloat>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    dst: &mut [T],
    parallel: bool,
) -> Result<()> {
    if m == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    if a.len() < m * k || b.len() < k * n || dst.len() < m * n {
        return Err(Error::Backend(format!("cpu: gemm operands too short for {m}x{k}x{n}")));
    }
    // The lengths were checked just above for dense row-major operands.
    let a = Operand { data: a, base: 0, rs: k, cs: 1 };
    let b = Operand { data: b, base: 0, rs: n, cs: 1 };
    gemm_rows(m, k, n, a, b, &mut dst[..m * n], parallel, None);
    Ok(())
}
