//! Softmax and layer norm as hand-fused row kernels.
//!
//! # Why
//!
//! The interpreter runs a reduction body one pass per step over a block
//! of rows, each pass writing a block-sized intermediate that the next
//! reads back: softmax is five passes (max, subtract, exp, sum, divide),
//! layer norm nine. On `f32[2048,1024]` those passes, not the arithmetic,
//! were the cost (RESULTS.md, issue 38). Softmax and layer norm are most
//! of the row bodies models run, so [`recognize`] finds them among a
//! compiled body's steps and [`FusedKernel::rows_block`] runs them a row
//! at a time: three or four vectorized loops over the row, which stays in
//! L1 between them, with the intermediates in registers or in one row of
//! scratch, and the output written once. Any other body, or a run whose
//! input the kernel does not read as rows (one value for the whole input,
//! or one per row), stays on the interpreter.
//!
//! # Semantics
//!
//! Bit for bit the interpreter's: the same element functions (`eval`'s
//! `f32` `-`, `exp`, `*`, `/`, `+`, `rsqrt`), the same row max
//! (`lanes::extreme`) and the same sums (`f64` over `lanes.rs`'s
//! interleaved partials, fixed by the row's length alone, never by
//! threads). A value the interpreter stores once and reads twice is kept
//! in a row of scratch (softmax's `exp`) or computed again (layer norm's
//! `x - mean`), which gives the same bits. [`Codegen::Off`] keeps the
//! interpreter alone, the reference these kernels are tested against.
//!
//! On a CPU with AVX-512F a softmax row runs `softmax_avx512.rs`
//! instead (512-bit `exp`, a division by Markstein's correction where it
//! is exact): the same bits, argued and tested there.

use super::super::codegen::Codegen;
use super::super::lanes;
use super::ops::{Arg, Blk, Seg, TArg};
use super::{softmax_avx512, Class, FusedKernel, Instr, Opnd, Step};
use crate::ir::eval::Real;
use crate::ir::{BinaryOp, DType, ReduceOp, UnaryOp};
use crate::{Error, Result};

/// A body these kernels run, by the steps (slots) they read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rows {
    /// `e = exp(x - max(x)); y = e / sum(e)`.
    Softmax { x: usize },
    /// `c = x - mean(x); y = c * rsqrt(mean(c * c) + eps)`, then times
    /// `scale` and plus `shift` where the body has them (full-size leaves,
    /// in practice a weight and a bias broadcast over the rows).
    LayerNorm { x: usize, eps: usize, scale: Option<usize>, shift: Option<usize> },
}

/// The kernel for a body (its steps, output and extra outputs), if it is
/// one of [`Rows`] on `f32` with rows of at least two columns; the
/// interpreter otherwise.
pub(super) fn recognize(
    codegen: Codegen,
    instrs: &[Instr],
    output: usize,
    extras: &[(usize, DType, Class)],
    cols: usize,
) -> Option<Rows> {
    if codegen == Codegen::Off || !extras.is_empty() || cols < 2 {
        return None;
    }
    let steps: Vec<(usize, &Step)> = instrs
        .iter()
        .enumerate()
        .filter(|(_, ins)| ins.live && !matches!(ins.step, Step::Leaf(_) | Step::MatMul(..)))
        .map(|(i, ins)| (i, &ins.step))
        .collect();
    let f32_only = instrs.iter().filter(|ins| ins.live).all(|ins| ins.dtype == DType::F32);
    if !f32_only || steps.last().map(|s| s.0) != Some(output) {
        return None;
    }
    let leaf = |o: &Opnd, class: Class| {
        !o.per_row && matches!(instrs[o.slot].step, Step::Leaf(_)) && instrs[o.slot].class == class
    };
    let at = |slot: usize| Opnd { slot, per_row: false };
    let row = |slot: usize| Opnd { slot, per_row: true };
    // Of `a op b`, the operand that is not `known` (`+` and `*` are
    // commutative to the bit, so either order is the same body).
    let other = |a: &Opnd, b: &Opnd, known: Opnd| match (*a == known, *b == known) {
        (true, _) => Some(*b),
        (false, true) => Some(*a),
        (false, false) => None,
    };
    use BinaryOp::{Add, Div, Mul, Sub};
    use Step::{Binary, Reduce, Unary};
    match steps.as_slice() {
        [(m, Reduce(ReduceOp::Max, x)), (d, Binary(Sub, x2, mb)), (e, Unary(UnaryOp::Exp, dd)), (s, Reduce(ReduceOp::Sum, ee)), (_, Binary(Div, e2, sb))]
            if leaf(x, Class::Full)
                && x2 == x
                && *mb == row(*m)
                && *dd == at(*d)
                && *ee == at(*e)
                && *e2 == at(*e)
                && *sb == row(*s) =>
        {
            Some(Rows::Softmax { x: x.slot })
        }
        [(mu, Reduce(ReduceOp::Mean, x)), (c, Binary(Sub, x2, mub)), (sq, Binary(Mul, c1, c2)), (var, Reduce(ReduceOp::Mean, sq2)), (ve, Binary(Add, a, b)), (rs, Unary(UnaryOp::Rsqrt, ve2)), (n, Binary(Mul, p, q)), tail @ ..]
            if leaf(x, Class::Full)
                && x2 == x
                && *mub == row(*mu)
                && *c1 == at(*c)
                && *c2 == at(*c)
                && *sq2 == at(*sq)
                && *ve2 == at(*ve)
                && other(p, q, at(*c)) == Some(row(*rs)) =>
        {
            let eps = other(a, b, at(*var)).filter(|e| leaf(e, Class::Row))?;
            let (mut last, mut scale, mut shift) = (*n, None, None);
            let mut tail = tail.iter().peekable();
            // `* scale`, then `+ shift`, each optional, each a leaf.
            for (op, slot) in [(Mul, &mut scale), (Add, &mut shift)] {
                if let Some((i, Binary(o, a, b))) = tail.peek() {
                    if let Some(k) = other(a, b, at(last)).filter(|k| *o == op && leaf(k, Class::Full)) {
                        *slot = Some(k.slot);
                        last = *i;
                        tail.next();
                    }
                }
            }
            tail.next().is_none().then_some(Rows::LayerNorm { x: x.slot, eps: eps.slot, scale, shift })
        }
        _ => None,
    }
}

impl FusedKernel {
    /// Runs `rows` over a block of `nb` rows into `out` (the block's dense
    /// output), its leaves resolved in `arg`. `Ok(false)` when the run's
    /// layouts are not ones these kernels read (the input is one value
    /// for every row, or one per row): the interpreter runs the block.
    pub(super) fn rows_block<'v>(
        &self,
        rows: Rows,
        arg: impl Fn(Opnd) -> Arg<'v>,
        nb: usize,
        out: &mut [f32],
        tmp: &mut Vec<f32>,
    ) -> Result<bool> {
        let cols = self.cols;
        let full = Blk { rows: nb, cols };
        let typed = |slot: usize, b: Blk| arg(Opnd { slot, per_row: false }).typed::<f32>(b);
        let (x, eps, scale, shift) = match rows {
            Rows::Softmax { x } => (typed(x, full)?, None, None, None),
            Rows::LayerNorm { x, eps, scale, shift } => (
                typed(x, full)?,
                Some(typed(eps, Blk { rows: nb, cols: 1 })?),
                scale.map(|s| typed(s, full)).transpose()?,
                shift.map(|s| typed(s, full)).transpose()?,
            ),
        };
        if matches!(x, TArg::Splat(_) | TArg::PerRow(_)) {
            return Ok(false);
        }
        if tmp.len() < cols {
            tmp.resize(cols, 0.0);
        }
        let tmp = &mut tmp[..cols];
        for (r, y) in out.chunks_exact_mut(cols).take(nb).enumerate() {
            let Seg::S(xr) = x.row(r, cols) else { return Ok(false) };
            match eps {
                None => softmax_row(xr, y, tmp),
                Some(eps) => {
                    let eps = match eps.row(r, 1) {
                        Seg::S(e) => {
                            *e.first().ok_or_else(|| Error::Backend("cpu: layer norm's eps".into()))?
                        }
                        Seg::C(e) => e,
                    };
                    layer_norm_row(xr, eps, scale.map(|s| s.row(r, cols)), shift.map(|s| s.row(r, cols)), y)
                }
            }
        }
        Ok(true)
    }
}

/// One softmax row into `y` (as long as `x`), `exp` in `tmp` (as long).
fn softmax_row(x: &[f32], y: &mut [f32], tmp: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if softmax_avx512::available() {
        // SAFETY: the CPU supports avx512f, avx2 and fma (checked just above).
        return unsafe { softmax_avx512::softmax_row(x, y, tmp) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked just above).
        return unsafe { softmax_avx2(x, y, tmp) };
    }
    softmax_plain(x, y, tmp)
}

/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_avx2(x: &[f32], y: &mut [f32], tmp: &mut [f32]) {
    softmax_plain(x, y, tmp)
}

#[inline(always)]
fn softmax_plain(x: &[f32], y: &mut [f32], tmp: &mut [f32]) {
    use BinaryOp::{Div, Sub};
    let m = lanes::extreme(x, true);
    // `exp` into a row that stays in L1 (the output's lines are written
    // once, by the division, not fetched and written twice).
    for (t, &v) in tmp.iter_mut().zip(x) {
        *t = f32::unary(UnaryOp::Exp, f32::binary(Sub, v, m));
    }
    let s = lanes::sum_f64(tmp) as f32;
    for (o, &t) in y.iter_mut().zip(tmp.iter()) {
        *o = f32::binary(Div, t, s);
    }
}

/// One layer-norm row into `y` (as long as `x`).
fn layer_norm_row(
    x: &[f32],
    eps: f32,
    scale: Option<Seg<'_, f32>>,
    shift: Option<Seg<'_, f32>>,
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports avx2 and fma (checked just above).
        return unsafe { layer_norm_avx2(x, eps, scale, shift, y) };
    }
    layer_norm_plain(x, eps, scale, shift, y)
}

/// # Safety
/// The CPU must support `avx2` and `fma`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn layer_norm_avx2(
    x: &[f32],
    eps: f32,
    scale: Option<Seg<'_, f32>>,
    shift: Option<Seg<'_, f32>>,
    y: &mut [f32],
) {
    layer_norm_plain(x, eps, scale, shift, y)
}

#[inline(always)]
fn layer_norm_plain(
    x: &[f32],
    eps: f32,
    scale: Option<Seg<'_, f32>>,
    shift: Option<Seg<'_, f32>>,
    y: &mut [f32],
) {
    use BinaryOp::{Add, Mul, Sub};
    let n = x.len() as f64;
    // `mean` as the interpreter's reduce computes it: the f64 sum over n, rounded once.
    let mean = (lanes::sum_f64(x) / n) as f32;
    let centered = |v: f32| f32::binary(Sub, v, mean);
    let var = (lanes::sum_f64_of(x, |v| f32::binary(Mul, centered(v), centered(v))) / n) as f32;
    let rs = f32::unary(UnaryOp::Rsqrt, f32::binary(Add, var, eps));
    let norm = |v: f32| f32::binary(Mul, centered(v), rs);
    // One loop per shape of the affine operands, so that each vectorizes.
    match (scale, shift) {
        (None, None) => y.iter_mut().zip(x).for_each(|(o, &v)| *o = norm(v)),
        (Some(Seg::S(w)), None) => {
            y.iter_mut().zip(x).zip(w).for_each(|((o, &v), &w)| *o = f32::binary(Mul, norm(v), w))
        }
        (Some(Seg::C(w)), None) => y.iter_mut().zip(x).for_each(|(o, &v)| *o = f32::binary(Mul, norm(v), w)),
        (None, Some(Seg::S(b))) => {
            y.iter_mut().zip(x).zip(b).for_each(|((o, &v), &b)| *o = f32::binary(Add, norm(v), b))
        }
        (None, Some(Seg::C(b))) => y.iter_mut().zip(x).for_each(|(o, &v)| *o = f32::binary(Add, norm(v), b)),
        (Some(w), Some(b)) => {
            let affine = |v: f32, w: f32, b: f32| f32::binary(Add, f32::binary(Mul, norm(v), w), b);
            match (w, b) {
                (Seg::S(w), Seg::S(b)) => y
                    .iter_mut()
                    .zip(x)
                    .zip(w.iter().zip(b))
                    .for_each(|((o, &v), (&w, &b))| *o = affine(v, w, b)),
                (Seg::S(w), Seg::C(b)) => {
                    y.iter_mut().zip(x).zip(w).for_each(|((o, &v), &w)| *o = affine(v, w, b))
                }
                (Seg::C(w), Seg::S(b)) => {
                    y.iter_mut().zip(x).zip(b).for_each(|((o, &v), &b)| *o = affine(v, w, b))
                }
                (Seg::C(w), Seg::C(b)) => y.iter_mut().zip(x).for_each(|(o, &v)| *o = affine(v, w, b)),
            }
        }
    }
}
