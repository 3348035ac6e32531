//! 2-D convolution (im2col + GEMM per batch item and group) and pooling.
//!
//! `f16`/`bf16` compute in `f32` and round once at the end; `f32` and
//! `f64` compute in their own type. Pooling reads the input in place and
//! computes each window in `f64` (exact for max, one rounding for avg).

use super::elementwise::{contiguous, map1, PAR_THRESHOLD};
use super::matmul::{gemm_rowmajor, GemmFloat};
use super::storage::{cast_elem, Elem, Out, View};
use super::CpuBuffer;
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
    let mut xs = vec![R::default(); x.layout.numel()];
    map1(x, &mut xs, cast_elem::<T, R>);
    let mut ws = vec![R::default(); w.layout.numel()];
    map1(w, &mut ws, cast_elem::<T, R>);
    let og = o / g;
    let kk = cg * kh * kw;
    let pp = oh * ow;
    if dst.len() != n * o * pp {
        return Err(bad(format!("conv2d output of {} elements, {} expected", dst.len(), n * o * pp)));
    }
    let mut out = vec![R::default(); n * o * pp];
    if out.is_empty() {
        return Ok(());
    }
    let task = |i: usize, dst: &mut [R], inner_parallel: bool| -> Result<()> {
        let (b, gi) = (i / g, i % g);
        let mut col = vec![R::default(); kk * pp];
        for ci in 0..cg {
            let plane = &xs[((b * c + gi * cg + ci) * h) * wi..][..h * wi];
            for ky in 0..kh {
                for kx in 0..kw {
                    let row = &mut col[((ci * kh + ky) * kw + kx) * pp..][..pp];
                    for oy in 0..oh {
                        let iy = (oy * sh + ky * dh) as isize - ph as isize;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        let src = &plane[iy as usize * wi..][..wi];
                        for ox in 0..ow {
                            let ix = (ox * sw + kx * dw) as isize - pw as isize;
                            if ix >= 0 && ix < wi as isize {
                                row[oy * ow + ox] = src[ix as usize];
                            }
                        }
                    }
                }
            }
        }
        let wg = &ws[gi * og * kk..][..og * kk];
        gemm_rowmajor(og, kk, pp, wg, &col, dst, inner_parallel)
    };
    if n * g >= 2 && out.len() * kk >= PAR_THRESHOLD {
        out.par_chunks_mut(og * pp).enumerate().try_for_each(|(i, dst)| task(i, dst, false))?;
    } else {
        for (i, dst) in out.chunks_mut(og * pp).enumerate() {
            task(i, dst, true)?;
        }
    }
    for (d, v) in dst.iter_mut().zip(out) {
        *d = cast_elem::<R, T>(v);
    }
    Ok(())
}

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
    let xs = contiguous(x)?;
    if out.len() != n * c * oh * ow {
        return Err(bad(format!("pool2d output of {} elements, {} expected", out.len(), n * c * oh * ow)));
    }
    if out.is_empty() {
        return Ok(());
    }
    let plane = |i: usize, dst: &mut [T]| {
        let src = &xs[i * h * w..][..h * w];
        for oy in 0..oh {
            for ox in 0..ow {
                let mut acc = match p.kind {
                    PoolKind::Max => f64::NEG_INFINITY,
                    PoolKind::Avg => 0.0,
                };
                'win: for ky in 0..kh {
                    let iy = (oy * sh + ky) as isize - ph as isize;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    for kx in 0..kw {
                        let ix = (ox * sw + kx) as isize - pw as isize;
                        if ix < 0 || ix >= w as isize {
                            continue;
                        }
                        let v = src[iy as usize * w + ix as usize].to_f64();
                        match p.kind {
                            PoolKind::Max if v.is_nan() => {
                                acc = v;
                                break 'win;
                            }
                            PoolKind::Max if v > acc => acc = v,
                            PoolKind::Max => {}
                            PoolKind::Avg => acc += v,
                        }
                    }
                }
                if p.kind == PoolKind::Avg {
                    acc /= (kh * kw) as f64;
                }
                dst[oy * ow + ox] = T::from_f64(acc);
            }
        }
    };
    if out.len() * kh * kw >= PAR_THRESHOLD {
        out.par_chunks_mut(oh * ow).enumerate().for_each(|(i, d)| plane(i, d));
    } else {
        out.chunks_mut(oh * ow).enumerate().for_each(|(i, d)| plane(i, d));
    }
    Ok(())
}
