//! 2-D convolution (im2col + GEMM) and pooling.
//!
//! A convolution is one product per group and batch of images: the
//! group's weights `[og, kk]` by the column matrix of every image of the
//! batch side by side `[kk, images * oh * ow]` (as many images as fit
//! [`COL_BUDGET`]). Each output element is the GEMM's chain over `kk`,
//! which does not depend on how many columns the product has, so the
//! bits are those of one product per image (the layout before issue 38,
//! whose per-image products and their packing were most of the digits
//! CNN's convolution time). The column matrix is built in `im2col.rs`;
//! the padded input, the column matrix and the product live in scratch
//! kept from call to call (`pool::scratch`), and a small product runs on
//! the calling thread ([`CONV_GEMM_PAR_WORK`]).
//!
//! `f16`/`bf16` compute in `f32` and round once at the end; `f32` and
//! `f64` compute in their own type. Pooling reads the input in place and
//! computes each window in `f64` (exact for max, one rounding for avg).

use super::elementwise::{contiguous, map1};
use super::im2col::{padded_planes, Geometry};
use super::matmul::{gemm_rowmajor, GemmFloat};
use super::storage::{cast_elem, Elem, Out, View};
use super::CpuBuffer;
use super::{pool, pool_grad};
use crate::ir::{window_out, DType, PoolKind};
use crate::{Error, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Convolution hyper-parameters, as on `Op::Conv2d`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvParams {
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Padding (h, w).
    pub padding: [usize; 2],
    /// Dilation (h, w).
    pub dilation: [usize; 2],
    /// Channel groups.
    pub groups: usize,
}

fn bad(msg: String) -> Error {
    Error::Backend(format!("cpu: {msg}"))
}

/// NCHW input `x`, OIHW weight `w`, into `out`.
pub(crate) fn conv2d(x: &CpuBuffer, w: &CpuBuffer, p: ConvParams, out: Out<'_>) -> Result<()> {
    match x.dtype() {
        DType::F32 => conv_in::<f32, f32>(x.view()?, w.view()?, p, out.get()?),
        DType::F64 => conv_in::<f64, f64>(x.view()?, w.view()?, p, out.get()?),
        DType::F16 => conv_in::<f16, f32>(x.view()?, w.view()?, p, out.get()?),
        DType::BF16 => conv_in::<bf16, f32>(x.view()?, w.view()?, p, out.get()?),
        d => Err(bad(format!("conv2d is not defined on {d}"))),
    }
}

fn conv_in<T: Elem, R: GemmFloat>(
    x: View<'_, T>,
    w: View<'_, T>,
    p: ConvParams,
    dst: &mut [T],
) -> Result<()> {
    let (xd, wd) = (&x.layout.shape.0, &w.layout.shape.0);
    if xd.len() != 4 || wd.len() != 4 || p.groups == 0 {
        return Err(bad(format!("conv2d of {} and {}", x.layout.shape, w.layout.shape)));
    }
    let (n, c, h, wi) = (xd[0], xd[1], xd[2], xd[3]);
    let (o, cg, kh, kw) = (wd[0], wd[1], wd[2], wd[3]);
    let g = p.groups;
    if cg * g != c || o % g != 0 {
        return Err(bad(format!("conv2d groups {g} do not fit {} and {}", x.layout.shape, w.layout.shape)));
    }
    let [sh, sw] = p.stride;
    let [ph, pw] = p.padding;
    let [dh, dw] = p.dilation;
    let oh = window_out(h, kh, sh, ph, dh).ok_or_else(|| bad("conv2d window does not fit".into()))?;
    let ow = window_out(wi, kw, sw, pw, dw).ok_or_else(|| bad("conv2d window does not fit".into()))?;
    let og = o / g;
    let kk = cg * kh * kw;
    let pp = oh * ow;
    if dst.len() != n * o * pp {
        return Err(bad(format!("conv2d output of {} elements, {} expected", dst.len(), n * o * pp)));
    }
    if dst.is_empty() {
        return Ok(());
    }
    if kk == 0 {
        dst.fill(cast_elem::<R, T>(R::default()));
        return Ok(());
    }
    // Scratch reused from call to call (stale contents: each is written
    // whole before it is read), so no call zeroes or faults in fresh pages.
    let mut ws = pool::scratch::<R>(w.layout.numel())?;
    map1(w, &mut ws, cast_elem::<T, R>);
    let geom =
        Geometry { c, h, wi, cg, kh, kw, oh, ow, stride: p.stride, padding: p.padding, dilation: p.dilation };
    let mut xp = pool::scratch::<R>(geom.padded_len(n))?;
    padded_planes(&x, ph, pw, &mut xp)?;
    // Images per product: as many as keep the column matrix within
    // COL_BUDGET, at least one.
    let per = (COL_BUDGET / (kk * pp)).clamp(1, n);
    // The column matrix only where the product is not packed straight from xp.
    let mut col_all = None;
    let mut prod_all = pool::scratch::<R>(og * per * pp)?;
    for gi in 0..g {
        let wg = &ws[gi * og * kk..][..og * kk];
        for b0 in (0..n).step_by(per) {
            let nb = per.min(n - b0);
            let cols = nb * pp;
            let prod = &mut prod_all[..og * cols];
            let parallel = og * kk * cols >= CONV_GEMM_PAR_WORK;
            if parallel || !geom.product(&xp, wg, og, gi, b0, nb, prod) {
                let col_all = match &mut col_all {
                    Some(c) => c,
                    None => col_all.insert(pool::scratch::<R>(kk * per * pp)?),
                };
                let col = &mut col_all[..kk * cols];
                geom.im2col(&xp, gi, b0, nb, col);
                gemm_rowmajor(og, kk, cols, wg, col, prod, parallel)?;
            }
            // prod is [og, nb, pp]; the output is [n, o, pp].
            for (oc, row) in prod.chunks(cols).enumerate() {
                for (bi, px) in row.chunks(pp).enumerate() {
                    let at = ((b0 + bi) * o + gi * og + oc) * pp;
                    for (d, &v) in dst[at..at + pp].iter_mut().zip(px) {
                        *d = cast_elem::<R, T>(v);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Most elements of one column matrix (16 MB of `f32`): a batch of small
/// images is one product, a batch of large ones several.
const COL_BUDGET: usize = 1 << 22;

/// Below this many multiply-adds a convolution's product runs on the
/// calling thread, which has just written its column matrix (in its own
/// cache): split, the other core reads the matrix from this one's cache
/// after a wake-up. The digits CNN's products (32x144x512, 16x288x512 and
/// 32x512x144: 2.4M; 16x9x2048 and 16x2048x9: 0.3M) were split from
/// matmul's 2^20; serial, its epoch read 45-47 ms against 49-71 split
/// (2^20) and 48-61 with only the 2.4M ones split (alternating runs at
/// load 1.9-2.7, issue 38, twelfth session). Larger products were not
/// measured; this is the first power of two above the measured ones.
const CONV_GEMM_PAR_WORK: usize = 1 << 22;

/// Pooling window parameters, as on `Op::Pool2d`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolParams {
    /// Max or average.
    pub kind: PoolKind,
    /// Window (h, w).
    pub kernel: [usize; 2],
    /// Stride (h, w).
    pub stride: [usize; 2],
    /// Padding (h, w).
    pub padding: [usize; 2],
}

/// Max or average pooling over NCHW windows, into `out`.
pub(crate) fn pool2d(x: &CpuBuffer, p: PoolParams, out: Out<'_>) -> Result<()> {
    match x.dtype() {
        DType::F32 => pool_in(x.view::<f32>()?, p, out.get()?),
        DType::F64 => pool_in(x.view::<f64>()?, p, out.get()?),
        DType::F16 => pool_in(x.view::<f16>()?, p, out.get()?),
        DType::BF16 => pool_in(x.view::<bf16>()?, p, out.get()?),
        d => Err(bad(format!("pool2d is not defined on {d}"))),
    }
}

fn pool_in<T: Elem>(x: View<'_, T>, p: PoolParams, out: &mut [T]) -> Result<()> {
    let xd = &x.layout.shape.0;
    if xd.len() != 4 {
        return Err(bad(format!("pool2d of {}", x.layout.shape)));
    }
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let [kh, kw] = p.kernel;
    let [sh, sw] = p.stride;
    let [ph, pw] = p.padding;
    let oh = window_out(h, kh, sh, ph, 1).ok_or_else(|| bad("pool2d window does not fit".into()))?;
    let ow = window_out(w, kw, sw, pw, 1).ok_or_else(|| bad("pool2d window does not fit".into()))?;
    let own;
    let xs = match super::elementwise::dense(&x) {
        Some(s) => s,
        None => {
            own = contiguous(x)?;
            &own[..]
        }
    };
    if out.len() != n * c * oh * ow {
        return Err(bad(format!("pool2d output of {} elements, {} expected", out.len(), n * c * oh * ow)));
    }
    if out.is_empty() {
        return Ok(());
    }
    let plane = |i: usize, dst: &mut [T]| {
        let src = &xs[i * h * w..][..h * w];
        for oy in 0..oh {
            let y0 = (oy * sh) as isize - ph as isize;
            let (y0, y1) = (y0.max(0) as usize, ((y0 + kh as isize) as usize).min(h));
            for ox in 0..ow {
                let x0 = (ox * sw) as isize - pw as isize;
                let (x0, x1) = (x0.max(0) as usize, ((x0 + kw as isize) as usize).min(w));
                let v = match p.kind {
                    // NaN wins (found as the backward finds its place).
                    PoolKind::Max => pool_grad::window_max(src, w, (y0, y1), (x0, x1)).0,
                    PoolKind::Avg => {
                        let sum = (y0..y1)
                            .flat_map(|iy| src[iy * w + x0..iy * w + x1].iter())
                            .fold(0.0, |acc, v| acc + v.to_f64());
                        sum / (kh * kw) as f64
                    }
                };
                dst[oy * ow + ox] = T::from_f64(v);
            }
        }
    };
    // Runs of whole planes per task, as the backward's (`pool_grad.rs`).
    let per = (pool_grad::PAR_CHUNK / (oh * ow)).max(1);
    let planes = |first: usize, dst: &mut [T]| {
        for (j, d) in dst.chunks_mut(oh * ow).enumerate() {
            plane(first + j, d);
        }
    };
    if out.len() * (1 + kh * kw) >= pool_grad::POOL_PAR_THRESHOLD && out.len() > per * oh * ow {
        out.par_chunks_mut(per * oh * ow).enumerate().for_each(|(k, d)| planes(k * per, d));
    } else {
        planes(0, out);
    }
    Ok(())
}
