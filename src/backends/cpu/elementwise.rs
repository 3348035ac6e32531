//! Elementwise kernels (unary, binary, compare, where, cast) and the
//! chunked, optionally parallel map loops every kernel builds on.
//!
//! Every kernel writes into an output slice the executor hands it (an
//! owned allocation or a range of the plan's arena) and overwrites every
//! element of it.
//!
//! Semantics come from [`crate::ir::eval`] only: the op is matched once
//! outside the loop and bound to a constant, so each loop is a
//! monomorphized closure calling the `#[inline(always)]` eval function.

use super::pool;
use super::storage::{cast_elem, dispatch, Elem, Out, View};
use super::CpuBuffer;
use crate::backends::layout::Offsets;
use crate::ir::eval::{self, Real};
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp};
use crate::{Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Outputs with at least this many elements are split across threads.
pub(crate) const PAR_THRESHOLD: usize = 32 * 1024;
/// Elements per parallel chunk (fixed, so results never depend on the
/// number of threads).
pub(crate) const CHUNK: usize = 16 * 1024;

/// Calls `f(start, chunk)` over `out` in chunks, in parallel when large.
pub(crate) fn fill_chunks<O: Send>(out: &mut [O], f: impl Fn(usize, &mut [O]) + Sync) {
    if out.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| f(i * CHUNK, c));
    } else {
        f(0, out);
    }
}

/// The elements of a row-major dense view, in order.
pub(crate) fn dense<'a, T>(v: &View<'a, T>) -> Option<&'a [T]> {
    let n = v.layout.numel();
    if v.layout.is_contiguous() {
        v.data.get(v.layout.offset..v.layout.offset + n)
    } else {
        None
    }
}

/// The one value of a view that broadcasts a single element (every
/// stride 0), e.g. a constant or an expanded scalar.
pub(crate) fn splat<T: Copy>(v: &View<'_, T>) -> Option<T> {
    if v.layout.numel() > 0 && v.layout.strides.iter().all(|&s| s == 0) {
        v.data.get(v.layout.offset).copied()
    } else {
        None
    }
}

/// `out[i] = f(a[i])` over every element of `a`, row-major (`out` has
/// `a`'s element count).
pub(crate) fn map1<A: Elem, O: Elem>(a: View<'_, A>, out: &mut [O], f: impl Fn(A) -> O + Sync) {
    if let Some(s) = dense(&a) {
        fill_chunks(out, |st, c| {
            for (o, &x) in c.iter_mut().zip(&s[st..]) {
                *o = f(x);
            }
        });
    } else {
        fill_chunks(out, |st, c| {
            let mut it = a.layout.offsets(st);
            for o in c {
                *o = f(a.data[it.next_offset()]);
            }
        });
    }
}

/// [`map1`] for the float unary ops: both loops (dense and strided) run
/// in an AVX2+FMA copy when the CPU has them (the build targets baseline
/// x86-64, so the plain loops are SSE2). eval's `exp` uses `mul_add`
/// (see [`crate::ir::fast_math`]): compiled without FMA that is a libm
/// `fmaf` call, a correctly rounded one, so both copies give the same
/// bits, but only this one is fast.
fn map1_fma<A: Elem, O: Elem>(a: View<'_, A>, out: &mut [O], f: impl Fn(A) -> O + Sync) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        match dense(&a) {
            // SAFETY (both): the CPU supports avx2 and fma (checked above).
            Some(s) => fill_chunks(out, |st, c| unsafe { map1_dense_fma(c, &s[st..], &f) }),
            None => fill_chunks(out, |st, c| unsafe { map1_strided_fma(&a, st, c, &f) }),
        }
        return;
    }
    map1(a, out, f)
}

/// `out[i] = f(src[i])`, compiled for AVX2+FMA.
///
/// # Safety
///
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map1_dense_fma<A: Elem, O: Elem>(out: &mut [O], src: &[A], f: &impl Fn(A) -> O) {
    for (o, &x) in out.iter_mut().zip(src) {
        *o = f(x);
    }
}

/// `out[i] = f(a[start + i])` over a strided view, compiled for AVX2+FMA.
///
/// # Safety
///
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map1_strided_fma<A: Elem, O: Elem>(
    a: &View<'_, A>,
    start: usize,
    out: &mut [O],
    f: &impl Fn(A) -> O,
) {
    let mut it = a.layout.offsets(start);
    for o in out {
        *o = f(a.data[it.next_offset()]);
    }
}

/// `f` of matching elements of two views of one shape, into `out`.
pub(crate) fn map2<A: Elem, B: Elem, O: Elem>(
    a: View<'_, A>,
    b: View<'_, B>,
    out: &mut [O],
    f: impl Fn(A, B) -> O + Sync,
) {
    if let (Some(x), Some(y)) = (dense(&a), dense(&b)) {
        fill_chunks(out, |st, c| {
            for ((o, &p), &q) in c.iter_mut().zip(&x[st..]).zip(&y[st..]) {
                *o = f(p, q);
            }
        });
    } else if let (Some(x), Some(q)) = (dense(&a), splat(&b)) {
        // `x * 2.0`: a broadcast scalar on the right reads one element.
        fill_chunks(out, |st, c| {
            for (o, &p) in c.iter_mut().zip(&x[st..]) {
                *o = f(p, q);
            }
        });
    } else if let (Some(p), Some(y)) = (splat(&a), dense(&b)) {
        fill_chunks(out, |st, c| {
            for (o, &q) in c.iter_mut().zip(&y[st..]) {
                *o = f(p, q);
            }
        });
    } else {
        fill_chunks(out, |st, c| {
            let (mut ia, mut ib) = (a.layout.offsets(st), b.layout.offsets(st));
            for o in c {
                *o = f(a.data[ia.next_offset()], b.data[ib.next_offset()]);
            }
        });
    }
}

/// `f` of matching elements of three views of one shape, into `out`.
pub(crate) fn map3<A: Elem, B: Elem, C: Elem, O: Elem>(
    a: View<'_, A>,
    b: View<'_, B>,
    c: View<'_, C>,
    out: &mut [O],
    f: impl Fn(A, B, C) -> O + Sync,
) {
    if let (Some(x), Some(y), Some(z)) = (dense(&a), dense(&b), dense(&c)) {
        fill_chunks(out, |st, ch| {
            for (((o, &p), &q), &r) in ch.iter_mut().zip(&x[st..]).zip(&y[st..]).zip(&z[st..]) {
                *o = f(p, q, r);
            }
        });
    } else {
        fill_chunks(out, |st, ch| {
            let (mut ia, mut ib, mut ic) = (a.layout.offsets(st), b.layout.offsets(st), c.layout.offsets(st));
            for o in ch {
                *o = f(a.data[ia.next_offset()], b.data[ib.next_offset()], c.data[ic.next_offset()]);
            }
        });
    }
}

/// A row-major dense copy of a view into `out`.
pub(crate) fn copy_into<T: Elem>(a: View<'_, T>, out: &mut [T]) {
    match dense(&a) {
        Some(s) if s.len() == out.len() => out.copy_from_slice(s),
        _ => copy_strided(a, out),
    }
}

/// Shortest last dimension [`copy_strided`] copies as runs.
const RUN: usize = 8;

/// [`copy_into`] of a view that is not dense. When its last dimension is
/// contiguous (stride 1) and at least [`RUN`] long, as a permuted
/// attention output's heads are (`[b, h, s, d]` read as `[b, s, h, d]`),
/// each row of it is one `copy_from_slice`: element by element, through
/// the odometer, that copy took about 2 ns a float, 1-2% of MiniLM's
/// forward (issue 38). Either way the same elements land in the same
/// places.
fn copy_strided<T: Elem>(a: View<'_, T>, out: &mut [T]) {
    let l = a.layout;
    let r = l.shape.rank();
    let inner = if r >= 2 && l.strides[r - 1] == 1 { l.shape.0[r - 1] } else { 0 };
    if inner < RUN || out.len() != l.numel() {
        map1(a, out, |x| x);
        return;
    }
    fill_chunks(out, |st, c| {
        // The chunk starts `st % inner` into row `st / inner`; its runs
        // may start and end inside rows.
        let mut rows = Offsets::new(&l.shape.0[..r - 1], &l.strides[..r - 1], l.offset, st / inner);
        let (mut col, mut done) = (st % inner, 0);
        while done < c.len() {
            let at = rows.next_offset() + col;
            let len = (inner - col).min(c.len() - done);
            c[done..done + len].copy_from_slice(&a.data[at..at + len]);
            done += len;
            col = 0;
        }
    });
}

/// `dst = src` (over the shorter of the two) in fixed-size pieces, which
/// compile to a few moves, where `copy_from_slice` of a run-time length
/// is a `memmove` call: for the short runs of small images (an im2col's
/// window rows, a max-pool gradient's joins of 2-element blocks), where
/// the call was a third of the copying time (issue 38).
pub(crate) fn copy_short<R: Copy>(dst: &mut [R], src: &[R]) {
    let (n, mut i) = (dst.len().min(src.len()), 0);
    while n - i >= 8 {
        dst[i..i + 8].copy_from_slice(&src[i..i + 8]);
        i += 8;
    }
    if n - i >= 4 {
        dst[i..i + 4].copy_from_slice(&src[i..i + 4]);
        i += 4;
    }
    if n - i >= 2 {
        dst[i..i + 2].copy_from_slice(&src[i..i + 2]);
        i += 2;
    }
    if n > i {
        dst[i] = src[i];
    }
}

/// A row-major dense copy of a view (scratch for kernels that need one).
pub(crate) fn contiguous<T: Elem>(a: View<'_, T>) -> Result<Vec<T>> {
    if let Some(s) = dense(&a) {
        return pool::try_to_vec(s);
    }
    let mut out = pool::vec_for_overwrite::<T>(a.layout.numel())?;
    copy_strided(a, &mut out);
    Ok(out)
}

/// Matches a fieldless enum value and runs `$body` with `$C` bound to a
/// constant of the matched variant, so the body monomorphizes per variant.
/// Without `; fallback`, the list must name every variant (no fallback
/// arm, so a new variant is a compile error rather than a run-time panic);
/// with one, unlisted variants take the fallback.
macro_rules! const_match {
    ($ty:ident, $val:expr, $C:ident => $body:expr; $($v:ident),*) => {
        match $val {
            $( $ty::$v => { const $C: $ty = $ty::$v; $body } )*
        }
    };
    ($ty:ident, $val:expr, $C:ident => $body:expr; $($v:ident),* ; $other:expr) => {{
        // A `let`, so the macro is also an expression (attributes on
        // expressions are unstable).
        #[allow(unreachable_patterns)]
        let value = match $val {
            $( $ty::$v => { const $C: $ty = $ty::$v; $body } )*
            _ => $other,
        };
        value
    }};
}

macro_rules! all_unary {
    ($val:expr, $C:ident => $body:expr) => {
        const_match!(UnaryOp, $val, $C => $body;
            Neg, Abs, Exp, Log, Sqrt, Rsqrt, Recip, Sin, Cos, Tanh, Sigmoid, Relu, Gelu, GeluTanh, Silu)
    };
}

macro_rules! all_binary {
    ($val:expr, $C:ident => $body:expr) => {
        const_match!(BinaryOp, $val, $C => $body;
            Add, Sub, Mul, Div, Pow, Maximum, Minimum, GeluTanhGrad, GeluGrad, SiluGrad)
    };
}
// Shared with the fused kernels (`fused/ops.rs`).
pub(crate) use {all_binary, all_unary, const_match};

fn unsupported(op: &str, d: DType) -> Error {
    Error::Backend(format!("cpu: {op} is not defined on {d}"))
}

/// `op` applied to every element, into `out` (of `x`'s dtype).
pub(crate) fn unary(x: &CpuBuffer, op: UnaryOp, out: Out<'_>) -> Result<()> {
    macro_rules! float {
        ($t:ty) => {{
            let (v, o) = (x.view::<$t>()?, out.get::<$t>()?);
            all_unary!(op, OP => map1(v, o, |a: $t| <$t as Real>::unary(OP, a)))
        }};
    }
    macro_rules! half {
        ($t:ty) => {{
            let (v, o) = (x.view::<$t>()?, out.get::<$t>()?);
            all_unary!(op, OP => map1_fma(v, o, |a: $t| <$t>::from_f32(f32::unary(OP, a.to_f32()))))
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (v, o) = (x.view::<$t>()?, out.get::<$t>()?);
            const_match!(UnaryOp, op, OP => map1(v, o, |a: $t| eval::unary_int(OP, a as i64) as $t);
                Neg, Abs, Relu; return Err(unsupported(op.mnemonic(), x.dtype())))
        }};
    }
    match x.dtype() {
        DType::F32 => {
            let (v, o) = (x.view::<f32>()?, out.get::<f32>()?);
            all_unary!(op, OP => map1_fma(v, o, |a: f32| f32::unary(OP, a)))
        }
        DType::F64 => float!(f64),
        DType::F16 => half!(f16),
        DType::BF16 => half!(bf16),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::Bool => return Err(unsupported(op.mnemonic(), DType::Bool)),
    }
    Ok(())
}

/// `op` applied to matching elements of two buffers of one type, into `out`.
pub(crate) fn binary(a: &CpuBuffer, b: &CpuBuffer, op: BinaryOp, out: Out<'_>) -> Result<()> {
    macro_rules! float {
        ($t:ty) => {{
            let (p, q, o) = (a.view::<$t>()?, b.view::<$t>()?, out.get::<$t>()?);
            all_binary!(op, OP => map2(p, q, o, |x: $t, y: $t| <$t as Real>::binary(OP, x, y)))
        }};
    }
    macro_rules! half {
        ($t:ty) => {{
            let (p, q, o) = (a.view::<$t>()?, b.view::<$t>()?, out.get::<$t>()?);
            all_binary!(op, OP => map2(p, q, o, |x: $t, y: $t| {
                <$t>::from_f32(f32::binary(OP, x.to_f32(), y.to_f32()))
            }))
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (p, q, o) = (a.view::<$t>()?, b.view::<$t>()?, out.get::<$t>()?);
            all_binary!(op, OP => map2(p, q, o, |x: $t, y: $t| {
                eval::binary_int(OP, x as i64, y as i64) as $t
            }))
        }};
    }
    match a.dtype() {
        DType::F32 => float!(f32),
        DType::F64 => float!(f64),
        DType::F16 => half!(f16),
        DType::BF16 => half!(bf16),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::Bool => {
            let (p, q, o) = (a.view::<bool>()?, b.view::<bool>()?, out.get::<bool>()?);
            match op {
                BinaryOp::Maximum => map2(p, q, o, |x, y| x | y),
                BinaryOp::Minimum => map2(p, q, o, |x, y| x & y),
                _ => return Err(unsupported(op.mnemonic(), DType::Bool)),
            }
        }
    }
    Ok(())
}

/// `a op b` elementwise, into a bool `out`.
pub(crate) fn compare(a: &CpuBuffer, b: &CpuBuffer, op: CompareOp, out: Out<'_>) -> Result<()> {
    let o = out.get::<bool>()?;
    dispatch!(a.dtype(), T => {
        let (p, q) = (a.view::<T>()?, b.view::<T>()?);
        const_match!(CompareOp, op, OP => map2(p, q, o, |x: T, y: T| eval::compare(OP, x, y));
            Eq, Ne, Lt, Le, Gt, Ge)
    });
    Ok(())
}

/// `cond ? a : b` elementwise, into `out`.
pub(crate) fn where_(cond: &CpuBuffer, a: &CpuBuffer, b: &CpuBuffer, out: Out<'_>) -> Result<()> {
    let c = cond.view::<bool>()?;
    dispatch!(a.dtype(), T => {
        let (p, q) = (a.view::<T>()?, b.view::<T>()?);
        map3(c, p, q, out.get::<T>()?, |c, x: T, y: T| if c { x } else { y })
    });
    Ok(())
}

/// Every element converted to `out`'s dtype with [`crate::ir::Scalar::cast`] semantics.
pub(crate) fn cast(x: &CpuBuffer, out: Out<'_>) -> Result<()> {
    dispatch!(x.dtype(), A => {
        let v = x.view::<A>()?;
        dispatch!(out.dtype(), B => map1(v, out.get::<B>()?, cast_elem::<A, B>))
    });
    Ok(())
}
