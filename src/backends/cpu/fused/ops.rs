//! The typed loops a fused kernel runs on one block: elementwise ops,
//! row reductions, row broadcasts, and strided gathers of leaves.
//!
//! Every loop reads operand slices of the block's length and writes a
//! scratch slice of the same length, so the per-element work is a plain
//! zipped loop that LLVM vectorizes. Element semantics are those of the
//! unfused kernels ([`crate::ir::eval`], `cast_elem`, the reduction rules of
//! `reduce.rs`), so an elementwise body gives bit-identical results fused
//! or not.

use super::super::layout::{Layout, Offsets};
use super::super::storage::{cast_elem, dispatch, Elem, HostSlice};
use crate::ir::eval::{self, Real};
use crate::ir::{BinaryOp, CompareOp, DType, HostData, ReduceOp, UnaryOp};
use crate::{Error, Result};
use half::{bf16, f16};

/// A borrowed operand: elements `start..` of some typed storage.
#[derive(Clone, Copy)]
pub(super) struct Arg<'v> {
    pub h: HostSlice<'v>,
    pub start: usize,
}

impl<'v> Arg<'v> {
    /// The `len` elements as `T`, or an error (never a panic) if the
    /// storage is of another type or too short.
    pub fn get<T: Elem>(self, len: usize) -> Result<&'v [T]> {
        self.h
            .typed::<T>()?
            .get(self.start..self.start + len)
            .ok_or_else(|| Error::Backend("cpu: fused operand shorter than its block".into()))
    }
}

/// Runs `f` on the first `len` elements of `dst` viewed as `O` (growing it
/// if needed). The scratch is moved out and back, so no typed `&mut`
/// accessor on [`HostData`] is needed.
pub(super) fn with_out<O: Elem>(
    dst: &mut HostData,
    len: usize,
    f: impl FnOnce(&mut [O]) -> Result<()>,
) -> Result<()> {
    let h = std::mem::replace(dst, HostData::U8(Vec::new()));
    let found = h.dtype();
    let mut v = O::from_host(h).ok_or_else(|| {
        Error::Backend(format!("cpu: fused scratch is {found}, the op writes {}", O::DTYPE))
    })?;
    if v.len() < len {
        v.resize(len, O::default());
    }
    let r = f(&mut v[..len]);
    *dst = O::into_host(v);
    r
}

/// A zeroed scratch vector of `len` elements of `dtype`.
pub(super) fn scratch(dtype: DType, len: usize) -> HostData {
    dispatch!(dtype, T => <T as crate::ir::Element>::into_host(vec![T::default(); len]))
}

use super::super::elementwise::{all_binary, all_unary, const_match};

#[inline(always)]
fn map1<A: Copy, O>(d: &mut [O], a: &[A], f: impl Fn(A) -> O) {
    for (o, &x) in d.iter_mut().zip(a) {
        *o = f(x);
    }
}

#[inline(always)]
fn map2<A: Copy, B: Copy, O>(d: &mut [O], a: &[A], b: &[B], f: impl Fn(A, B) -> O) {
    for ((o, &x), &y) in d.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// [`map1`] for `f32`, run by an AVX2+FMA copy of the loop when the CPU
/// has them, as the unfused unary kernel does. Bit-identical to the plain
/// loop: eval's f32 math never uses `mul_add` and Rust does not contract.
fn map1_f32(d: &mut [f32], a: &[f32], f: impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked just above).
        unsafe { map1_f32_avx2(d, a, &f) };
        return;
    }
    map1(d, a, f)
}

/// [`map2`] for `f32`, AVX2 when available (see [`map1_f32`]).
fn map2_f32(d: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked just above).
        unsafe { map2_f32_avx2(d, a, b, &f) };
        return;
    }
    map2(d, a, b, f)
}

/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map1_f32_avx2(d: &mut [f32], a: &[f32], f: &impl Fn(f32) -> f32) {
    for (o, &x) in d.iter_mut().zip(a) {
        *o = f(x);
    }
}

/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map2_f32_avx2(d: &mut [f32], a: &[f32], b: &[f32], f: &impl Fn(f32, f32) -> f32) {
    for ((o, &x), &y) in d.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

fn unsupported(op: &str, d: DType) -> Error {
    Error::Backend(format!("cpu: {op} is not defined on {d}"))
}

/// `dst = op(a)` on `len` elements of `dtype`.
pub(super) fn unary(op: UnaryOp, dtype: DType, a: Arg<'_>, dst: &mut HostData, len: usize) -> Result<()> {
    macro_rules! float {
        ($t:ty) => {{
            let x = a.get::<$t>(len)?;
            with_out::<$t>(dst, len, |d| {
                all_unary!(op, OP => map1(d, x, |v: $t| <$t as Real>::unary(OP, v)));
                Ok(())
            })
        }};
    }
    macro_rules! half {
        ($t:ty) => {{
            let x = a.get::<$t>(len)?;
            with_out::<$t>(dst, len, |d| {
                all_unary!(op, OP => map1(d, x, |v: $t| <$t>::from_f32(f32::unary(OP, v.to_f32()))));
                Ok(())
            })
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let x = a.get::<$t>(len)?;
            with_out::<$t>(dst, len, |d| {
                const_match!(UnaryOp, op, OP => map1(d, x, |v: $t| eval::unary_int(OP, v as i64) as $t);
                    Neg, Abs, Relu; return Err(unsupported(op.mnemonic(), dtype)));
                Ok(())
            })
        }};
    }
    match dtype {
        DType::F32 => {
            let x = a.get::<f32>(len)?;
            with_out::<f32>(dst, len, |d| {
                all_unary!(op, OP => map1_f32(d, x, |v: f32| f32::unary(OP, v)));
                Ok(())
            })
        }
        DType::F64 => float!(f64),
        DType::F16 => half!(f16),
        DType::BF16 => half!(bf16),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::Bool => Err(unsupported(op.mnemonic(), DType::Bool)),
    }
}

/// `dst = a op b` on `len` elements of `dtype`.
pub(super) fn binary(
    op: BinaryOp,
    dtype: DType,
    a: Arg<'_>,
    b: Arg<'_>,
    dst: &mut HostData,
    len: usize,
) -> Result<()> {
    macro_rules! float {
        ($t:ty) => {{
            let (x, y) = (a.get::<$t>(len)?, b.get::<$t>(len)?);
            with_out::<$t>(dst, len, |d| {
                all_binary!(op, OP => map2(d, x, y, |p: $t, q: $t| <$t as Real>::binary(OP, p, q)));
                Ok(())
            })
        }};
    }
    macro_rules! half {
        ($t:ty) => {{
            let (x, y) = (a.get::<$t>(len)?, b.get::<$t>(len)?);
            with_out::<$t>(dst, len, |d| {
                all_binary!(op, OP => map2(d, x, y, |p: $t, q: $t| {
                    <$t>::from_f32(f32::binary(OP, p.to_f32(), q.to_f32()))
                }));
                Ok(())
            })
        }};
    }
    macro_rules! int {
        ($t:ty) => {{
            let (x, y) = (a.get::<$t>(len)?, b.get::<$t>(len)?);
            with_out::<$t>(dst, len, |d| {
                all_binary!(op, OP => map2(d, x, y, |p: $t, q: $t| {
                    eval::binary_int(OP, p as i64, q as i64) as $t
                }));
                Ok(())
            })
        }};
    }
    match dtype {
        DType::F32 => {
            let (x, y) = (a.get::<f32>(len)?, b.get::<f32>(len)?);
            with_out::<f32>(dst, len, |d| {
                all_binary!(op, OP => map2_f32(d, x, y, |p: f32, q: f32| f32::binary(OP, p, q)));
                Ok(())
            })
        }
        DType::F64 => float!(f64),
        DType::F16 => half!(f16),
        DType::BF16 => half!(bf16),
        DType::U8 => int!(u8),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::Bool => {
            let (x, y) = (a.get::<bool>(len)?, b.get::<bool>(len)?);
            with_out::<bool>(dst, len, |d| {
                match op {
                    BinaryOp::Maximum => map2(d, x, y, |p, q| p | q),
                    BinaryOp::Minimum => map2(d, x, y, |p, q| p & q),
                    _ => return Err(unsupported(op.mnemonic(), DType::Bool)),
                }
                Ok(())
            })
        }
    }
}

/// `dst = a op b` (to bool) on `len` elements; the operands are `of`.
pub(super) fn compare(
    op: CompareOp,
    of: DType,
    a: Arg<'_>,
    b: Arg<'_>,
    dst: &mut HostData,
    len: usize,
) -> Result<()> {
    dispatch!(of, T => {
        let (x, y) = (a.get::<T>(len)?, b.get::<T>(len)?);
        with_out::<bool>(dst, len, |d| {
            const_match!(CompareOp, op, OP => map2(d, x, y, |p: T, q: T| eval::compare(OP, p, q));
                Eq, Ne, Lt, Le, Gt, Ge; unreachable!());
            Ok(())
        })
    })
}

/// `dst = cond ? a : b` on `len` elements of `dtype`.
pub(super) fn where_(
    dtype: DType,
    cond: Arg<'_>,
    a: Arg<'_>,
    b: Arg<'_>,
    dst: &mut HostData,
    len: usize,
) -> Result<()> {
    let c = cond.get::<bool>(len)?;
    dispatch!(dtype, T => {
        let (x, y) = (a.get::<T>(len)?, b.get::<T>(len)?);
        with_out::<T>(dst, len, |d| {
            for (((o, &c), &p), &q) in d.iter_mut().zip(c).zip(x).zip(y) {
                *o = if c { p } else { q };
            }
            Ok(())
        })
    })
}

/// `dst = cast(a)` from `from` to `to` on `len` elements.
pub(super) fn cast(from: DType, to: DType, a: Arg<'_>, dst: &mut HostData, len: usize) -> Result<()> {
    dispatch!(from, A => {
        let x = a.get::<A>(len)?;
        dispatch!(to, B => with_out::<B>(dst, len, |d| {
            map1(d, x, cast_elem::<A, B>);
            Ok(())
        }))
    })
}

/// A plain copy (an `expand` to the same shape).
pub(super) fn copy(dtype: DType, a: Arg<'_>, dst: &mut HostData, len: usize) -> Result<()> {
    dispatch!(dtype, T => {
        let x = a.get::<T>(len)?;
        with_out::<T>(dst, len, |d| {
            d.copy_from_slice(x);
            Ok(())
        })
    })
}

/// Row `r` of `dst` (`cols` elements) filled with `a[r]`, for `rows` rows.
pub(super) fn row_expand(
    dtype: DType,
    a: Arg<'_>,
    dst: &mut HostData,
    rows: usize,
    cols: usize,
) -> Result<()> {
    dispatch!(dtype, T => {
        let x = a.get::<T>(rows)?;
        with_out::<T>(dst, rows * cols, |d| {
            for (r, &v) in x.iter().enumerate() {
                d[r * cols..(r + 1) * cols].fill(v);
            }
            Ok(())
        })
    })
}

#[inline(always)]
fn is_nan<T: PartialEq>(v: T) -> bool {
    #[allow(clippy::eq_op)]
    let nan = v != v;
    nan
}

/// The max (or min) of a lane, the first NaN if any (as `reduce.rs`).
fn extreme<T: Elem>(lane: &[T], want_max: bool) -> T {
    let Some((&first, rest)) = lane.split_first() else { return T::default() };
    if is_nan(first) {
        return first;
    }
    let mut acc = first;
    for &v in rest {
        if is_nan(v) {
            return v;
        }
        if (want_max && v > acc) || (!want_max && v < acc) {
            acc = v;
        }
    }
    acc
}

/// `dst[r] = op(a[r * cols .. (r + 1) * cols])` for `rows` rows.
///
/// Each row is reduced left to right: float sums accumulate in `f64`
/// (`f16`/`bf16` too) and round once, integer sums wrap, `mean` divides
/// the `f64` sum by `cols`, `max`/`min` let the first NaN win. This is the
/// order of the unfused kernel for rows shorter than its split threshold;
/// longer rows there are summed in segments, so sums may differ in the
/// last bits.
pub(super) fn reduce(
    op: ReduceOp,
    dtype: DType,
    a: Arg<'_>,
    dst: &mut HostData,
    rows: usize,
    cols: usize,
) -> Result<()> {
    dispatch!(dtype, T => reduce_rows::<T>(op, a, dst, rows, cols))
}

fn reduce_rows<T: Elem>(
    op: ReduceOp,
    a: Arg<'_>,
    dst: &mut HostData,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let x = a.get::<T>(rows * cols)?;
    let lane = |r: usize| &x[r * cols..(r + 1) * cols];
    with_out::<T>(dst, rows, |d| {
        let float = T::DTYPE.is_float();
        match op {
            ReduceOp::Sum if float => {
                for (r, o) in d.iter_mut().enumerate() {
                    *o = T::from_f64(lane(r).iter().map(|&v| v.to_f64()).sum::<f64>());
                }
            }
            ReduceOp::Sum if T::DTYPE.is_int() => {
                for (r, o) in d.iter_mut().enumerate() {
                    *o = T::from_i64(lane(r).iter().fold(0i64, |s, &v| s.wrapping_add(v.to_i64())));
                }
            }
            ReduceOp::Mean if float => {
                for (r, o) in d.iter_mut().enumerate() {
                    let s = lane(r).iter().map(|&v| v.to_f64()).sum::<f64>();
                    *o = T::from_f64(s / cols as f64);
                }
            }
            ReduceOp::Max | ReduceOp::Min => {
                let want_max = op == ReduceOp::Max;
                for (r, o) in d.iter_mut().enumerate() {
                    *o = extreme(lane(r), want_max);
                }
            }
            _ => return Err(unsupported(op.mnemonic(), T::DTYPE)),
        }
        Ok(())
    })
}

/// Elements `start .. start + dst.len()` (row-major logical order) of a
/// strided view, copied into `dst`. Walks the innermost dim as runs (a
/// slice copy at stride 1, a fill at stride 0), so an expanded bias or a
/// sliced row costs little more than a copy.
///
/// The caller has checked `l.extent() <= data.len()` and that the range
/// lies inside the view, so indexing cannot fail.
pub(super) fn gather<T: Copy>(data: &[T], l: &Layout, start: usize, dst: &mut [T]) {
    if dst.is_empty() {
        return;
    }
    let rank = l.shape.rank();
    if rank == 0 {
        dst.fill(data[l.offset]);
        return;
    }
    let inner = l.shape.0[rank - 1];
    let s = l.strides[rank - 1];
    let mut outer = Offsets::new(&l.shape.0[..rank - 1], &l.strides[..rank - 1], l.offset, start / inner);
    let mut j = start % inner;
    let mut done = 0;
    while done < dst.len() {
        let base = outer.next_offset();
        let take = (inner - j).min(dst.len() - done);
        let out = &mut dst[done..done + take];
        match s {
            1 => out.copy_from_slice(&data[base + j..base + j + take]),
            0 => out.fill(data[base]),
            _ => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = data[base + (j + i) * s];
                }
            }
        }
        done += take;
        j = 0;
    }
}
