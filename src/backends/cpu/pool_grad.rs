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
/// threads: a pass over the windows is a few loads and compares per
/// element, so below this the wake-ups cost more than they save (the
/// digits CNN's 32K-element gradients ran 20% slower split per plane).
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
    let geo = Windows { h, w, ow, kernel: p.kernel, stride: p.stride, padding: p.padding };
    // Windows that tile (stride at least the window) give each element
    // at most one term: written straight, no sums.
    let tiles = sh >= kh && sw >= kw;
    let plane = |i: usize, dst: &mut [T], scratch: &mut Scratch| {
        let (src, gp) = (&xs[i * h * w..][..h * w], &gs[i * oh * ow..][..oh * ow]);
        let Scratch { acc, best, at } = scratch;
        if tiles {
            dst.fill(T::from_f64(0.0));
        } else {
            acc.clear();
            acc.resize(h * w, 0.0);
        }
        for oy in 0..oh {
            geo.row_max(src, oy, best, at);
            for ox in 0..ow {
                // `0 + g`, as the sum into zeros would be (-0 becomes 0).
                let gv = gp[oy * ow + ox].to_f64();
                if tiles {
                    dst[at[ox]] = T::from_f64(0.0 + gv);
                } else {
                    acc[at[ox]] += gv;
                }
            }
        }
        if !tiles {
            for (d, a) in dst.iter_mut().zip(acc.iter()) {
                *d = T::from_f64(*a);
            }
        }
    };
    // Whole planes per task, at least `PAR_CHUNK` elements: the digits
    // CNN's planes are 16-64 elements, and a task per plane spent more in
    // rayon's wake-ups than in the windows.
    let per = (PAR_CHUNK / (h * w)).max(1);
    let planes = |first: usize, dst: &mut [T], scratch: &mut Scratch| {
        for (j, d) in dst.chunks_mut(h * w).enumerate() {
            plane(first + j, d, scratch);
        }
    };
    if out.len() + gs.len() * kh * kw >= POOL_PAR_THRESHOLD && out.len() > per * h * w {
        let init = || Scratch::new(ow);
        out.par_chunks_mut(per * h * w).enumerate().for_each_init(init, |sc, (k, d)| planes(k * per, d, sc));
    } else {
        planes(0, out, &mut Scratch::new(ow));
    }
    Ok(())
}

/// A task's scratch: a plane's sums (overlapping windows) and a row of
/// windows' maxima and their places.
struct Scratch {
    acc: Vec<f64>,
    best: Vec<f64>,
    at: Vec<usize>,
}

impl Scratch {
    fn new(ow: usize) -> Scratch {
        Scratch { acc: Vec::new(), best: vec![0.0; ow], at: vec![0; ow] }
    }
}

/// One plane's pooling windows (`h x w` input, `ow` windows a row).
#[derive(Clone, Copy)]
pub(crate) struct Windows {
    pub h: usize,
    pub w: usize,
    pub ow: usize,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl Windows {
    /// The maximum of each window of output row `oy` (`best[ox]`, NaN if
    /// the window holds one) and its place in the plane (`at[ox]`, by the
    /// module docs' rule), for `src`, one plane.
    ///
    /// The row's windows advance together, one kernel offset at a time:
    /// a window's compares depend on each other (the running maximum),
    /// so one window at a time waited on each compare and select (about
    /// 10 cycles an element); across the row they are independent.
    pub(crate) fn row_max<T: Elem>(&self, src: &[T], oy: usize, best: &mut [f64], at: &mut [usize]) {
        let Windows { h, w, ow, kernel: [kh, kw], stride: [sh, sw], padding: [ph, pw] } = *self;
        let (best, at) = (&mut best[..ow], &mut at[..ow]);
        let y0 = (oy * sh) as isize - ph as isize;
        for (ox, (b, a)) in best.iter_mut().zip(at.iter_mut()).enumerate() {
            let x0 = ((ox * sw) as isize - pw as isize).max(0) as usize;
            *b = f64::NEG_INFINITY;
            *a = y0.max(0) as usize * w + x0;
        }
        for ky in 0..kh {
            let iy = y0 + ky as isize;
            if iy < 0 || iy >= h as isize {
                continue;
            }
            let row = &src[iy as usize * w..][..w];
            for kx in 0..kw {
                // The windows whose column `ox * sw + kx - pw` is inside.
                let lo = pw.saturating_sub(kx).div_ceil(sw);
                let hi = ((w + pw).saturating_sub(kx).div_ceil(sw)).min(ow);
                for ox in lo..hi {
                    let ix = ox * sw + kx - pw;
                    let v = row[ix].to_f64();
                    // Selects, not branches: which element wins is data.
                    let wins = (v > best[ox]) | v.is_nan();
                    best[ox] = if wins { v } else { best[ox] };
                    at[ox] = if wins { iy as usize * w + ix } else { at[ox] };
                }
            }
        }
    }
}
