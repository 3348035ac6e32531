//! The typed loops a fused kernel runs on one block: elementwise ops,
//! row reductions, row broadcasts, and strided gathers of leaves.
//!
//! # Operands
//!
//! A block is `rows` rows of `cols` elements. An operand ([`Arg`]) is one
//! of: *flat* (one element per element of the block, contiguous), a
//! *splat* (one value everywhere: a constant), *cols* (one row's worth,
//! the same for every row: a bias broadcast over rows), or *per-row* (one
//! value per row, broadcast along it: a row's max or mean). Only flat
//! operands take memory of the block's size; the broadcasts are read where
//! they are, never expanded into scratch. When every operand is flat or a
//! splat, an op is one loop over the whole block; otherwise it is one
//! loop per row, each operand a row slice or a scalar ([`Seg`]).
//!
//! # Semantics
//!
//! Element functions are those of the unfused kernels ([`crate::ir::eval`],
//! `cast_elem`), so an elementwise body is bit-identical fused and
//! unfused; row reductions are `lanes.rs`'s, as the unfused kernel's.
//! `f32` loops, and every float unary op, run in an AVX2+FMA copy when
//! the CPU has them, with the same results: Rust never contracts `a * b +
//! c`, and eval's one `mul_add` (in `exp`) is correctly rounded in either
//! copy (an instruction in this one, libm's `fmaf` in the plain one).

use super::super::elementwise::{all_binary, all_unary, const_match};
use super::super::lanes;
use super::super::storage::{cast_elem, dispatch, Elem, HostSlice, Out};
use crate::backends::layout::{Layout, Offsets};
use crate::ir::eval::{self, Real};
use crate::ir::{BinaryOp, CompareOp, DType, Element, HostData, ReduceOp, UnaryOp};
use crate::{Error, Result};
use half::{bf16, f16};

/// A block's shape: `rows` rows of `cols` elements (`cols` is 1 for a
/// value with one element per row).
#[derive(Clone, Copy, Debug)]
pub(super) struct Blk {
    pub rows: usize,
    pub cols: usize,
}

impl Blk {
    pub fn len(self) -> usize {
        self.rows * self.cols
    }
}

/// A borrowed operand of one block (see the module docs).
#[derive(Clone, Copy)]
pub(super) enum Arg<'v> {
    /// `len` elements from the offset.
    Flat(HostSlice<'v>, usize),
    /// The element at the offset, everywhere.
    Splat(HostSlice<'v>, usize),
    /// `cols` elements from the offset, repeated for every row.
    Cols(HostSlice<'v>, usize),
    /// `rows` elements from the offset, each repeated along its row.
    PerRow(HostSlice<'v>, usize),
}

/// An operand at its element type, checked against the block's size.
#[derive(Clone, Copy)]
pub(super) enum TArg<'v, T> {
    Flat(&'v [T]),
    Splat(T),
    Cols(&'v [T]),
    PerRow(&'v [T]),
}

/// One row (or the whole block) of an operand: a slice or one value.
#[derive(Clone, Copy)]
pub(super) enum Seg<'v, T> {
    S(&'v [T]),
    C(T),
}

fn short() -> Error {
    Error::Backend("cpu: fused operand shorter than its block".into())
}

impl<'v> Arg<'v> {
    /// The operand as `T` for a block of shape `b`, or an error (never a
    /// panic) if the storage is of another type or too short.
    pub fn typed<T: Elem>(self, b: Blk) -> Result<TArg<'v, T>> {
        let take = |h: HostSlice<'v>, s: usize, n: usize| -> Result<&'v [T]> {
            h.typed::<T>()?.get(s..s + n).ok_or_else(short)
        };
        Ok(match self {
            Arg::Flat(h, s) => TArg::Flat(take(h, s, b.len())?),
            Arg::Splat(h, s) => TArg::Splat(*h.typed::<T>()?.get(s).ok_or_else(short)?),
            // With one column these are flat, or a splat.
            Arg::Cols(h, s) if b.cols == 1 => TArg::Splat(*h.typed::<T>()?.get(s).ok_or_else(short)?),
            Arg::PerRow(h, s) if b.cols == 1 => TArg::Flat(take(h, s, b.rows)?),
            Arg::Cols(h, s) => TArg::Cols(take(h, s, b.cols)?),
            Arg::PerRow(h, s) => TArg::PerRow(take(h, s, b.rows)?),
        })
    }
}

impl<'v, T: Copy> TArg<'v, T> {
    /// True when the operand reads the same way for the whole block.
    #[inline(always)]
    fn uniform(&self) -> bool {
        matches!(self, TArg::Flat(_) | TArg::Splat(_))
    }

    /// The whole block (only for a uniform operand; others give row 0).
    #[inline(always)]
    fn whole(self) -> Seg<'v, T> {
        match self {
            TArg::Flat(x) | TArg::Cols(x) => Seg::S(x),
            TArg::Splat(v) => Seg::C(v),
            TArg::PerRow(x) => Seg::C(x[0]),
        }
    }

    /// Row `r` of a block with `cols` columns.
    #[inline(always)]
    pub(super) fn row(self, r: usize, cols: usize) -> Seg<'v, T> {
        match self {
            TArg::Flat(x) => Seg::S(&x[r * cols..(r + 1) * cols]),
            TArg::Splat(v) => Seg::C(v),
            TArg::Cols(x) => Seg::S(x),
            TArg::PerRow(x) => Seg::C(x[r]),
        }
    }
}

/// Where an op writes its block: task scratch (grown as needed) or the
/// kernel's output.
pub(super) enum Dst<'a, 'o> {
    Scratch(&'a mut HostData),
    Out(&'a mut Out<'o>),
}

/// Runs `f` on the first `len` elements of `dst` as `O`.
pub(super) fn with_dst<O: Elem>(dst: &mut Dst<'_, '_>, len: usize, f: impl FnOnce(&mut [O])) -> Result<()> {
    match dst {
        Dst::Scratch(h) => with_out(h, len, |o| {
            f(o);
            Ok(())
        }),
        Dst::Out(out) => {
            let o = out.reborrow().get::<O>()?;
            let o =
                o.get_mut(..len).ok_or_else(|| Error::Backend("cpu: fused output block too short".into()))?;
            f(o);
            Ok(())
        }
    }
}

/// Runs `f` on the first `len` elements of `dst` viewed as `O` (growing it
/// if needed; an empty vector of another type, a GEMM buffer's first use,
/// becomes one of `O`).
pub(super) fn with_out<O: Elem>(
    dst: &mut HostData,
    len: usize,
    f: impl FnOnce(&mut [O]) -> Result<()>,
) -> Result<()> {
    if O::vec_mut(dst).is_none() && dst.is_empty() {
        *dst = O::into_host(Vec::new());
    }
    let found = dst.dtype();
    let v = O::vec_mut(dst).ok_or_else(|| {
        Error::Backend(format!("cpu: fused scratch is {found}, the op writes {}", O::DTYPE))
    })?;
    if v.len() < len {
        v.resize(len, O::default());
    }
    f(&mut v[..len])
}

/// An empty scratch vector of `dtype` (it grows to the block on first use).
pub(super) fn scratch(dtype: DType) -> HostData {
    dispatch!(dtype, T => <T as crate::ir::Element>::into_host(Vec::new()))
}

#[inline(always)]
fn apply1<A: Copy, O>(d: &mut [O], a: Seg<'_, A>, f: &impl Fn(A) -> O)
where
    O: Copy,
{
    match a {
        Seg::S(x) => {
            for (o, &v) in d.iter_mut().zip(x) {
                *o = f(v);
            }
        }
        Seg::C(v) => d.fill(f(v)),
    }
}

#[inline(always)]
fn apply2<A: Copy, B: Copy, O: Copy>(d: &mut [O], a: Seg<'_, A>, b: Seg<'_, B>, f: &impl Fn(A, B) -> O) {
    match (a, b) {
        (Seg::S(x), Seg::S(y)) => {
            for ((o, &p), &q) in d.iter_mut().zip(x).zip(y) {
                *o = f(p, q);
            }
        }
        (Seg::S(x), Seg::C(q)) => {
            for (o, &p) in d.iter_mut().zip(x) {
                *o = f(p, q);
            }
        }
        (Seg::C(p), Seg::S(y)) => {
            for (o, &q) in d.iter_mut().zip(y) {
                *o = f(p, q);
            }
        }
        (Seg::C(p), Seg::C(q)) => d.fill(f(p, q)),
    }
}

/// `d = f(a)` over a block of `cols` columns.
#[inline(always)]
fn zip1<A: Copy, O: Copy>(d: &mut [O], a: TArg<'_, A>, cols: usize, f: &impl Fn(A) -> O) {
    if a.uniform() {
        apply1(d, a.whole(), f);
    } else {
        for (r, dr) in d.chunks_mut(cols.max(1)).enumerate() {
            apply1(dr, a.row(r, cols), f);
        }
    }
}

/// `d = f(a, b)` over a block of `cols` columns.
#[inline(always)]
fn zip2<A: Copy, B: Copy, O: Copy>(
    d: &mut [O],
    a: TArg<'_, A>,
    b: TArg<'_, B>,
    cols: usize,
    f: &impl Fn(A, B) -> O,
) {
    if a.uniform() && b.uniform() {
        apply2(d, a.whole(), b.whole(), f);
    } else {
        for (r, dr) in d.chunks_mut(cols.max(1)).enumerate() {
            apply2(dr, a.row(r, cols), b.row(r, cols), f);
        }
    }
}

/// [`zip1`] in an AVX2+FMA copy when the CPU has them: the float unary
/// ops, whose `exp` uses `mul_add` (see [`crate::ir::fast_math`]; the
/// plain copy calls libm's `fmaf`, the same bits, slowly).
fn zip1_fma<A: Copy, O: Copy>(d: &mut [O], a: TArg<'_, A>, cols: usize, f: &impl Fn(A) -> O) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked just above).
        unsafe { zip1_avx2(d, a, cols, f) };
        return;
    }
    zip1(d, a, cols, f)
}

/// [`zip2`] for `f32`, in an AVX2+FMA copy when the CPU has them.
fn zip2_f32(d: &mut [f32], a: TArg<'_, f32>, b: TArg<'_, f32>, cols: usize, f: impl Fn(f32, f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked just above).
        unsafe { zip2_f32_avx2(d, a, b, cols, &f) };
        return;
    }
    zip2(d, a, b, cols, &f)
}

/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip1_avx2<A: Copy, O: Copy>(d: &mut [O], a: TArg<'_, A>, cols: usize, f: &impl Fn(A) -> O) {
    zip1(d, a, cols, f)
}

/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip2_f32_avx2(
    d: &mut [f32],
    a: TArg<'_, f32>,
    b: TArg<'_, f32>,
    cols: usize,
    f: &impl Fn(f32, f32) -> f32,
) {
    zip2(d, a, b, cols, f)
}

fn unsupported(op: &str, d: DType) -> Error {
    Error::Backend(format!("cpu: {op} is not defined on {d}"))
}

/// `dst = op(a)` on a block of `dtype`.
pub(super) fn unary(op: UnaryOp, dtype: DType, a: Arg<'_>, dst: &mut Dst<'_, '_>, b: Blk) -> Result<()> {
    macro_rules! run {
        ($zip:ident, $t:ty, $f:expr) => {{
            let x = a.typed::<$t>(b)?;
            with_dst::<$t>(dst, b.len(), |d| $zip(d, x, b.cols, &$f))
        }};
    }
    match dtype {
        DType::F32 => {
            let x = a.typed::<f32>(b)?;
            with_dst::<f32>(dst, b.len(), |d| {
                all_unary!(op, OP => zip1_fma(d, x, b.cols, &|v| f32::unary(OP, v)));
            })
        }
        DType::F64 => all_unary!(op, OP => run!(zip1, f64, |v: f64| f64::unary(OP, v))),
        DType::F16 => {
            all_unary!(op, OP => run!(zip1_fma, f16, |v: f16| f16::from_f32(f32::unary(OP, v.to_f32()))))
        }
        DType::BF16 => {
            all_unary!(op, OP => run!(zip1_fma, bf16, |v: bf16| bf16::from_f32(f32::unary(OP, v.to_f32()))))
        }
        DType::U8 | DType::I32 | DType::I64 => dispatch!(dtype, T => {
            const_match!(UnaryOp, op, OP => run!(zip1, T, |v: T| T::from_i64(eval::unary_int(OP, v.to_i64())));
                Neg, Abs, Relu; Err(unsupported(op.mnemonic(), dtype)))
        }),
        DType::Bool => Err(unsupported(op.mnemonic(), DType::Bool)),
    }
}

/// `dst = a op b` on a block of `dtype`.
pub(super) fn binary(
    op: BinaryOp,
    dtype: DType,
    a: Arg<'_>,
    c: Arg<'_>,
    dst: &mut Dst<'_, '_>,
    b: Blk,
) -> Result<()> {
    macro_rules! run {
        ($t:ty, $f:expr) => {{
            let (x, y) = (a.typed::<$t>(b)?, c.typed::<$t>(b)?);
            with_dst::<$t>(dst, b.len(), |d| zip2(d, x, y, b.cols, &$f))
        }};
    }
    match dtype {
        DType::F32 => {
            let (x, y) = (a.typed::<f32>(b)?, c.typed::<f32>(b)?);
            with_dst::<f32>(dst, b.len(), |d| {
                all_binary!(op, OP => zip2_f32(d, x, y, b.cols, |p, q| f32::binary(OP, p, q)));
            })
        }
        DType::F64 => all_binary!(op, OP => run!(f64, |p: f64, q: f64| f64::binary(OP, p, q))),
        DType::F16 => all_binary!(op, OP => run!(f16, |p: f16, q: f16| {
            f16::from_f32(f32::binary(OP, p.to_f32(), q.to_f32()))
        })),
        DType::BF16 => all_binary!(op, OP => run!(bf16, |p: bf16, q: bf16| {
            bf16::from_f32(f32::binary(OP, p.to_f32(), q.to_f32()))
        })),
        DType::U8 | DType::I32 | DType::I64 => dispatch!(dtype, T => {
            all_binary!(op, OP => run!(T, |p: T, q: T| T::from_i64(eval::binary_int(OP, p.to_i64(), q.to_i64()))))
        }),
        DType::Bool => match op {
            BinaryOp::Maximum => run!(bool, |p: bool, q: bool| p | q),
            BinaryOp::Minimum => run!(bool, |p: bool, q: bool| p & q),
            _ => Err(unsupported(op.mnemonic(), DType::Bool)),
        },
    }
}

/// `dst = a op c` (to bool) on a block; the operands are `of`.
pub(super) fn compare(
    op: CompareOp,
    of: DType,
    a: Arg<'_>,
    c: Arg<'_>,
    dst: &mut Dst<'_, '_>,
    b: Blk,
) -> Result<()> {
    dispatch!(of, T => {
        let (x, y) = (a.typed::<T>(b)?, c.typed::<T>(b)?);
        with_dst::<bool>(dst, b.len(), |d| {
            const_match!(CompareOp, op, OP => zip2(d, x, y, b.cols, &|p: T, q: T| eval::compare(OP, p, q));
                Eq, Ne, Lt, Le, Gt, Ge);
        })
    })
}

/// `dst = cond ? a : c` on a block of `dtype`.
pub(super) fn where_(
    dtype: DType,
    cond: Arg<'_>,
    a: Arg<'_>,
    c: Arg<'_>,
    dst: &mut Dst<'_, '_>,
    b: Blk,
) -> Result<()> {
    let k = cond.typed::<bool>(b)?;
    dispatch!(dtype, T => {
        let (x, y) = (a.typed::<T>(b)?, c.typed::<T>(b)?);
        with_dst::<T>(dst, b.len(), |d| {
            if k.uniform() && x.uniform() && y.uniform() {
                select(d, k.whole(), x.whole(), y.whole());
            } else {
                for (r, dr) in d.chunks_mut(b.cols.max(1)).enumerate() {
                    select(dr, k.row(r, b.cols), x.row(r, b.cols), y.row(r, b.cols));
                }
            }
        })
    })
}

/// `d[i] = k[i] ? x[i] : y[i]`, one loop per shape of the operands. Both
/// values are loaded before the choice, so the loop is a blend, not a
/// branch: a dropout mask is random, and a branch on it mispredicted half
/// the time (13% of the digits MLP step went here).
fn select<T: Copy>(d: &mut [T], k: Seg<'_, bool>, x: Seg<'_, T>, y: Seg<'_, T>) {
    #[inline(always)]
    fn pick<T: Copy>(c: bool, a: T, b: T) -> T {
        if c {
            a
        } else {
            b
        }
    }
    match (k, x, y) {
        (Seg::S(k), Seg::S(x), Seg::S(y)) => {
            for (((o, &c), &a), &b) in d.iter_mut().zip(k).zip(x).zip(y) {
                *o = pick(c, a, b);
            }
        }
        (Seg::S(k), Seg::S(x), Seg::C(b)) => {
            for ((o, &c), &a) in d.iter_mut().zip(k).zip(x) {
                *o = pick(c, a, b);
            }
        }
        (Seg::S(k), Seg::C(a), Seg::S(y)) => {
            for ((o, &c), &b) in d.iter_mut().zip(k).zip(y) {
                *o = pick(c, a, b);
            }
        }
        (Seg::S(k), Seg::C(a), Seg::C(b)) => {
            for (o, &c) in d.iter_mut().zip(k) {
                *o = pick(c, a, b);
            }
        }
        (Seg::C(c), x, y) => match if c { x } else { y } {
            Seg::S(v) => {
                for (o, &a) in d.iter_mut().zip(v) {
                    *o = a;
                }
            }
            Seg::C(v) => d.fill(v),
        },
    }
}

/// `dst = cast(a)` from `from` to `to` on a block.
pub(super) fn cast(from: DType, to: DType, a: Arg<'_>, dst: &mut Dst<'_, '_>, b: Blk) -> Result<()> {
    dispatch!(from, A => {
        let x = a.typed::<A>(b)?;
        dispatch!(to, B => with_dst::<B>(dst, b.len(), |d| zip1(d, x, b.cols, &cast_elem::<A, B>)))
    })
}

/// The operand's elements, row-major and dense (an `expand` to the same
/// shape, a row value broadcast along its row, or a body whose output is
/// a leaf).
pub(super) fn copy(dtype: DType, a: Arg<'_>, dst: &mut Dst<'_, '_>, b: Blk) -> Result<()> {
    dispatch!(dtype, T => {
        let x = a.typed::<T>(b)?;
        with_dst::<T>(dst, b.len(), |d| match x {
            TArg::Flat(s) => d.copy_from_slice(s),
            _ => zip1(d, x, b.cols, &|v: T| v),
        })
    })
}

/// `dst[r] = op(row r of a)` for the block's rows (`b.cols` is the length
/// of a row). Float sums and means accumulate in `f64` in `lanes.rs`'s
/// order, integer sums wrap, max/min let the first NaN win: exactly the
/// unfused kernel's rows.
pub(super) fn reduce(op: ReduceOp, dtype: DType, a: Arg<'_>, dst: &mut Dst<'_, '_>, b: Blk) -> Result<()> {
    dispatch!(dtype, T => {
        let x = a.typed::<T>(b)?;
        let float = T::DTYPE.is_float();
        let f: fn(&[T], usize) -> T = match op {
            ReduceOp::Sum if float => |l, _| <T as Elem>::from_f64(lanes::sum_f64(l)),
            ReduceOp::Mean if float => |l, n| <T as Elem>::from_f64(lanes::sum_f64(l) / n as f64),
            ReduceOp::Sum if T::DTYPE.is_int() => |l, _| T::from_i64(l.iter().fold(0i64, |s, &v| s.wrapping_add(v.to_i64()))),
            ReduceOp::Max => |l, _| lanes::extreme(l, true),
            ReduceOp::Min => |l, _| lanes::extreme(l, false),
            _ => return Err(unsupported(op.mnemonic(), T::DTYPE)),
        };
        let cols = b.cols;
        with_dst::<T>(dst, b.rows, |d| {
            let mut row = Vec::new();
            for (r, o) in d.iter_mut().enumerate() {
                *o = match x.row(r, cols) {
                    Seg::S(lane) => f(lane, cols),
                    Seg::C(v) => {
                        // A broadcast reduced: rare, so made concrete.
                        row.clear();
                        row.resize(cols, v);
                        f(&row, cols)
                    }
                };
            }
        })
    })
}

/// Elements `start .. start + dst.len()` (row-major logical order) of a
/// strided view, copied into `dst`. Walks the innermost dims as runs (a
/// slice copy at stride 1, a fill at stride 0; trailing dims that step as
/// one make one run), so an expanded bias or a sliced row costs little
/// more than a copy.
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
    // Trailing dims that step through storage as one (an expanded bias's
    // `[.., 8, 8]` at strides 0, 0; a dense tail) walk as one run: the
    // odometer steps once a run, not once an innermost row.
    let (mut lead, mut inner, s) = (rank - 1, l.shape.0[rank - 1], l.strides[rank - 1]);
    while lead > 0 && l.strides[lead - 1] == s * inner {
        inner *= l.shape.0[lead - 1];
        lead -= 1;
    }
    if inner == 0 {
        return;
    }
    let mut outer = Offsets::new(&l.shape.0[..lead], &l.strides[..lead], l.offset, start / inner);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Shape;

    /// `gather` of every range of views whose trailing dims merge into runs
    /// (stride 0, stride 1, stride 2) or do not, against the odometer
    /// element by element.
    #[test]
    fn gather_matches_the_odometer_on_merged_and_unmerged_tails() {
        let data: Vec<f32> = (0..400).map(|i| i as f32).collect();
        let layouts = [
            (vec![3, 4, 2, 2], vec![0, 1, 0, 0], 5),
            (vec![3, 4, 2, 2], vec![16, 4, 2, 1], 1),
            (vec![2, 3, 5], vec![40, 10, 2], 3),
            (vec![2, 3, 5], vec![1, 2, 6], 0),
            (vec![4, 1, 3], vec![3, 7, 1], 2),
            (vec![6], vec![0], 9),
            (vec![2, 3], vec![0, 0], 4),
        ];
        for (shape, strides, offset) in layouts {
            let l = Layout { shape: Shape::new(shape.clone()), strides: strides.clone(), offset };
            let n = l.numel();
            let want: Vec<f32> = {
                let mut it = l.offsets(0);
                (0..n).map(|_| data[it.next_offset()]).collect()
            };
            for start in 0..n {
                for len in 0..=n - start {
                    let mut got = vec![f32::NAN; len];
                    gather(&data, &l, start, &mut got);
                    assert_eq!(got, want[start..start + len], "{shape:?} {strides:?} from {start} for {len}");
                }
            }
        }
    }
}
