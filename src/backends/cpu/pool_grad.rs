//! The input gradient of a max pooling (`max_pool2d_grad`): one pass over
//! the windows, each finding its maximum in `x` again and adding its
//! gradient there.
//!
//! Which element a window's gradient goes to is PyTorch's choice, found
//! as its kernels find it: the window is read in row-major order and the
//! index moves on `v > best || v.is_nan()`, so the first of tied maxima
//! wins, a window holding NaN sends its gradient to its last NaN, and a
//! window whose every element is `-inf` sends it to its first element
//! inside the input (padding is never read). A NaN or inf in `g` reaches
//! that one element and no other.
//!
//! A plane's sums are kept in `f64` and rounded once, so overlapping
//! windows (stride under the kernel) add without an intermediate
//! rounding, in window order; windows that tile (stride at least the
//! window) give each element at most one term, written straight. Runs of
//! whole planes split across threads above [`POOL_PAR_THRESHOLD`].

use super::conv::PoolParams;
use super::elementwise::{contiguous, dense};
use super::storage::{Elem, Out, View};
use super::CpuBuffer;
use crate::ir::{window_out, DType};
use crate::{Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements read and written from which the planes split across
/// threads, as copies do (`index::COPY_PAR_THRESHOLD`): a pass over the
/// windows is a few loads and compares an element. Before, pooling split
/// into a task per plane from 32K (the digits CNN's planes are 16-64
/// elements); the two were not measured apart (see RESULTS.md, issue 38,
/// ninth session).
pub(crate) const POOL_PAR_THRESHOLD: usize = 1 << 18;

/// Elements of a task when they split.
pub(crate) const PAR_CHUNK: usize = 1 << 15;

fn bad(msg: String) -> Error {
    Error::Backend(format!("cpu: {msg}"))
}

/// `max_pool2d_grad(x, g)` into `out` (x's shape).
pub(crate) fn max_pool2d_grad(x: &CpuBuffer, g: &CpuBuffer, p: PoolParams, out: Out<'_>) -> Result<()> {
    if g.dtype() != x.dtype() {
        return Err(bad(format!("max_pool2d_grad of {} and {}", x.dtype(), g.dtype())));
    }
    match x.dtype() {
        DType::F32 => grad_in::<f32>(x.view()?, g.view()?, p, out.get()?),
        DType::F64 => grad_in::<f64>(x.view()?, g.view()?, p, out.get()?),
        DType::F16 => grad_in::<f16>(x.view()?, g.view()?, p, out.get()?),
        DType::BF16 => grad_in::<bf16>(x.view()?, g.view()?, p, out.get()?),
        d => Err(bad(format!("max_pool2d_grad is not defined on {d}"))),
    }
}

/// The elements of `v` in row-major order: borrowed when dense.
fn elements<'a, T: Elem>(v: View<'a, T>, own: &'a mut Vec<T>) -> Result<&'a [T]> {
    if let Some(s) = dense(&v) {
        return Ok(s);
    }
    *own = contiguous(v)?;
    Ok(own)
}

fn grad_in<T: Elem>(x: View<'_, T>, g: View<'_, T>, p: PoolParams, out: &mut [T]) -> Result<()> {
    let xd = x.layout.shape.0.clone();
    if xd.len() != 4 {
        return Err(bad(format!("max_pool2d_grad of {}", x.layout.shape)));
    }
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let ([kh, kw], [sh, sw], [ph, pw]) = (p.kernel, p.stride, p.padding);
    let fit = || bad("max_pool2d_grad window does not fit".into());
    let oh = window_out(h, kh, sh, ph, 1).ok_or_else(fit)?;
    let ow = window_out(w, kw, sw, pw, 1).ok_or_else(fit)?;
    if g.layout.shape.0 != [n, c, oh, ow] || out.len() != n * c * h * w {
        return Err(bad(format!(
            "max_pool2d_grad of {} and {} into {} elements",
            x.layout.shape,
            g.layout.shape,
            out.len()
        )));
    }
    if out.is_empty() {
        return Ok(());
    }
    let (mut xo, mut go) = (Vec::new(), Vec::new());
    let xs = elements(x, &mut xo)?;
    let gs = elements(g, &mut go)?;
    // The first row (column) of window `o` inside the input, and the end.
    let span = |o: usize, s: usize, pad: usize, k: usize, size: usize| {
        let start = (o * s) as isize - pad as isize;
        (start.max(0) as usize, ((start + k as isize) as usize).min(size))
    };
    // Windows that tile (stride at least the window) give each element
    // at most one term: written straight, no sums.
    let tiles = sh >= kh && sw >= kw;
    let plane = |i: usize, dst: &mut [T], acc: &mut Vec<f64>| {
        let (src, gp) = (&xs[i * h * w..][..h * w], &gs[i * oh * ow..][..oh * ow]);
        if tiles {
            dst.fill(T::from_f64(0.0));
        } else {
            acc.clear();
            acc.resize(h * w, 0.0);
        }
        for oy in 0..oh {
            let (y0, y1) = span(oy, sh, ph, kh, h);
            for ox in 0..ow {
                let (x0, x1) = span(ox, sw, pw, kw, w);
                let (_, at) = window_max(src, w, (y0, y1), (x0, x1));
                // `0 + g`, as the sum into zeros would be (-0 becomes 0).
                let gv = gp[oy * ow + ox].to_f64();
                if tiles {
                    dst[at] = T::from_f64(0.0 + gv);
                } else {
                    acc[at] += gv;
                }
            }
        }
        if !tiles {
            for (d, a) in dst.iter_mut().zip(acc.iter()) {
                *d = T::from_f64(*a);
            }
        }
    };
    // Whole planes per task, at least `PAR_CHUNK` elements.
    let per = (PAR_CHUNK / (h * w)).max(1);
    let planes = |first: usize, dst: &mut [T], acc: &mut Vec<f64>| {
        for (j, d) in dst.chunks_mut(h * w).enumerate() {
            plane(first + j, d, acc);
        }
    };
    if out.len() + gs.len() * kh * kw >= POOL_PAR_THRESHOLD && out.len() > per * h * w {
        out.par_chunks_mut(per * h * w)
            .enumerate()
            .for_each_init(Vec::new, |acc, (k, d)| planes(k * per, d, acc));
    } else {
        planes(0, out, &mut Vec::new());
    }
    Ok(())
}

/// The maximum of the window of rows `y0..y1` and columns `x0..x1` of a
/// plane `src` (`w` wide), NaN if it holds one, and its place by the
/// module docs' rule.
///
/// No branch depends on the data: the place moves by an integer select,
/// the running maximum is `f64::max` (which skips NaN) with NaN kept
/// aside, so after a NaN only a later NaN moves the place, as after
/// PyTorch's `maxval = NaN`. Written as `if wins { v } else { best }` the
/// float select compiled to a jump, whose mispredictions were most of the
/// loop's time (the digits CNN's pooling, forward and back).
#[inline(always)]
pub(crate) fn window_max<T: Elem>(
    src: &[T],
    w: usize,
    (y0, y1): (usize, usize),
    (x0, x1): (usize, usize),
) -> (f64, usize) {
    // The usual windows (2x2 and 3x3, none cut by the padding) without
    // the per-row loop setup and, for 2x2, without the chain of
    // dependent steps, which were most of the digits CNN's pooling time,
    // forward and back (issue 38, twelfth session).
    match (y1 - y0, x1 - x0) {
        (2, 2) => window_max_2x2(src, w, y0 * w + x0),
        (3, 3) => window_max_of::<T, 3, 3>(src, w, y0, x0),
        _ => window_max_any(src, w, (y0, y1), (x0, x1)),
    }
}

/// [`window_max`] of any window.
pub(crate) fn window_max_any<T: Elem>(
    src: &[T],
    w: usize,
    (y0, y1): (usize, usize),
    (x0, x1): (usize, usize),
) -> (f64, usize) {
    let (mut best, mut at, mut nan) = (f64::NEG_INFINITY, y0 * w + x0, false);
    for iy in y0..y1 {
        for (ix, v) in src[iy * w + x0..iy * w + x1].iter().enumerate() {
            window_step(v.to_f64(), iy * w + x0 + ix, (&mut best, &mut at, &mut nan));
        }
    }
    (if nan { f64::NAN } else { best }, at)
}

/// One element `v` (at `i`) of a window's walk in row-major order: the
/// place moves to a NaN, or to a larger value while no NaN was seen; the
/// maximum is `f64::max`'s (the first of `-0.0` and `0.0`).
#[inline(always)]
fn window_step(v: f64, i: usize, (best, at, nan): (&mut f64, &mut usize, &mut bool)) {
    let wins = v.is_nan() | (!*nan & (v > *best));
    *at = if wins { i } else { *at };
    *nan |= v.is_nan();
    *best = best.max(v);
}

/// [`window_max_any`] of the 2x2 window from element `i0` as a tree, not
/// a chain: the same value and place. Without NaN, the loop's place is
/// the first of the maxima in row-major order (it moves only on `>`,
/// from the first element) and its value that element's (`f64::max`
/// keeps its first operand on a tie of `-0.0` and `0.0`, as the tests
/// check against the loop), which pairs keeping their first on ties
/// give in any grouping; with NaN, the last NaN's place and NaN.
#[inline(always)]
fn window_max_2x2<T: Elem>(src: &[T], w: usize, i0: usize) -> (f64, usize) {
    let (Some(r0), Some(r1)) = (src[i0..].first_chunk::<2>(), src[i0 + w..].first_chunk::<2>()) else {
        return window_max_any(src, w, (i0 / w, i0 / w + 2), (i0 % w, i0 % w + 2));
    };
    let v = [r0[0].to_f64(), r0[1].to_f64(), r1[0].to_f64(), r1[1].to_f64()];
    let at = [i0, i0 + 1, i0 + w, i0 + w + 1];
    let first = |(a, i): (f64, usize), (b, j): (f64, usize)| if b > a { (b, j) } else { (a, i) };
    let (best, k) = first(first((v[0], 0), (v[1], 1)), first((v[2], 2), (v[3], 3)));
    let nan = v.map(f64::is_nan);
    let last_nan = if nan[3] {
        3
    } else if nan[2] {
        2
    } else if nan[1] {
        1
    } else {
        0
    };
    if nan.contains(&true) {
        (f64::NAN, at[last_nan])
    } else {
        (best, at[k])
    }
}

/// [`window_max_any`] of the `KH x KW` window from row `y0`, column
/// `x0`: the same body with constant loop lengths.
#[inline(always)]
fn window_max_of<T: Elem, const KH: usize, const KW: usize>(
    src: &[T],
    w: usize,
    y0: usize,
    x0: usize,
) -> (f64, usize) {
    let (mut best, mut at, mut nan) = (f64::NEG_INFINITY, y0 * w + x0, false);
    for iy in y0..y0 + KH {
        let row: &[T; KW] = match src[iy * w + x0..].first_chunk() {
            Some(r) => r,
            None => return window_max_any(src, w, (y0, y0 + KH), (x0, x0 + KW)),
        };
        for (ix, v) in row.iter().enumerate() {
            window_step(v.to_f64(), iy * w + x0 + ix, (&mut best, &mut at, &mut nan));
        }
    }
    (if nan { f64::NAN } else { best }, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 2x2 and 3x3 window of planes drawn from values that tie
    /// (`-0.0` and `0.0` among them), NaN, infinities: the unrolled
    /// windows give the general loop's maximum (its bits) and place.
    #[test]
    fn unrolled_windows_match_the_general_loop() {
        let pick = [0.0, -0.0, 1.0, 1.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2.5];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (h, w) = (5, 6);
        for round in 0..4000 {
            // Mostly one or two kinds of value a plane, so ties and all-NaN
            // or all -inf windows are common.
            let kinds = 1 + round % 3;
            let chosen: Vec<f64> = (0..kinds).map(|_| pick[(next() % pick.len() as u64) as usize]).collect();
            let plane: Vec<f64> = (0..h * w).map(|_| chosen[(next() % kinds as u64) as usize]).collect();
            let plane32: Vec<f32> = plane.iter().map(|&v| v as f32).collect();
            for k in [2, 3] {
                for y0 in 0..=h - k {
                    for x0 in 0..=w - k {
                        let win = ((y0, y0 + k), (x0, x0 + k));
                        let (a, b) =
                            (window_max(&plane, w, win.0, win.1), window_max_any(&plane, w, win.0, win.1));
                        assert_eq!(
                            (a.0.to_bits(), a.1),
                            (b.0.to_bits(), b.1),
                            "f64 window {win:?} of {plane:?}"
                        );
                        let (a, b) = (
                            window_max(&plane32, w, win.0, win.1),
                            window_max_any(&plane32, w, win.0, win.1),
                        );
                        assert_eq!(
                            (a.0.to_bits(), a.1),
                            (b.0.to_bits(), b.1),
                            "f32 window {win:?} of {plane:?}"
                        );
                    }
                }
            }
        }
    }
}
