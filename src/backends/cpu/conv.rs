//! 2-D convolution (im2col + GEMM) and pooling.
//!
//! A convolution is one product per group and batch of images: the
//! group's weights `[og, kk]` by the column matrix of every image of the
//! batch side by side `[kk, images * oh * ow]` (as many images as fit
//! [`COL_BUDGET`]). Each output element is the GEMM's chain over `kk`,
//! which does not depend on how many columns the product has, so the
//! bits are those of one product per image (the layout before issue 38,
//! whose per-image products and their packing were most of the digits
//! CNN's convolution time).
//!
//! `f16`/`bf16` compute in `f32` and round once at the end; `f32` and
//! `f64` compute in their own type. Pooling reads the input in place and
//! computes each window in `f64` (exact for max, one rounding for avg).

use super::elementwise::{contiguous, copy_short, map1};
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
    if dst.is_empty() {
        return Ok(());
    }
    if kk == 0 {
        dst.fill(cast_elem::<R, T>(R::default()));
        return Ok(());
    }
    // Images per product: as many as keep the column matrix within
    // COL_BUDGET, at least one.
    let per = (COL_BUDGET / (kk * pp)).clamp(1, n);
    let xp = padded(&xs, h, wi, ph, pw);
    let geom =
        Geometry { c, h, wi, cg, kh, kw, oh, ow, stride: p.stride, padding: p.padding, dilation: p.dilation };
    for gi in 0..g {
        let wg = &ws[gi * og * kk..][..og * kk];
        for b0 in (0..n).step_by(per) {
            let nb = per.min(n - b0);
            let cols = nb * pp;
            // Pooled scratch (stale contents: both are written whole), so
            // a large column matrix does not fault in fresh pages per call.
            let mut col = pool::vec_for_overwrite::<R>(kk * cols)?;
            geom.im2col(&xp, gi, b0, nb, &mut col);
            let mut prod = pool::vec_for_overwrite::<R>(og * cols)?;
            gemm_rowmajor(og, kk, cols, wg, &col, &mut prod, true)?;
            // prod is [og, nb, pp]; the output is [n, o, pp].
            for (oc, row) in prod.chunks(cols).enumerate() {
                for (bi, px) in row.chunks(pp).enumerate() {
                    let at = ((b0 + bi) * o + gi * og + oc) * pp;
                    for (d, &v) in dst[at..at + pp].iter_mut().zip(px) {
                        *d = cast_elem::<R, T>(v);
                    }
                }
            }
            pool::give_back(R::into_host(col));
            pool::give_back(R::into_host(prod));
        }
    }
    Ok(())
}

/// Most elements of one column matrix (16 MB of `f32`): a batch of small
/// images is one product, a batch of large ones several.
const COL_BUDGET: usize = 1 << 22;

/// The shapes an im2col needs.
struct Geometry {
    c: usize,
    h: usize,
    wi: usize,
    cg: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
}

impl Geometry {
    /// The column matrix of images `b0..b0 + nb`, group `gi`, into `col`
    /// (every element written): row `(ci, ky, kx)`, column `(b, oy, ox)`,
    /// so one product by the group's `[og, kk]` weights gives every
    /// image's outputs. `xp` holds the input's planes with their padding
    /// written out as zeros (`[n, c, h + 2 ph, w + 2 pw]`), so every
    /// window row is a plain copy. Rows split across threads when large.
    fn im2col<R: Copy + Send + Sync>(&self, xp: &[R], gi: usize, b0: usize, nb: usize, col: &mut [R]) {
        let (pp, cols) = (self.oh * self.ow, nb * self.oh * self.ow);
        let (hp, wp) = (self.h + 2 * self.padding[0], self.wi + 2 * self.padding[1]);
        let [sh, sw] = self.stride;
        let [dh, dw] = self.dilation;
        let fill = |r: usize, row: &mut [R]| {
            let (ci, ky, kx) = (r / (self.kh * self.kw), (r / self.kw) % self.kh, r % self.kw);
            for bi in 0..nb {
                let plane = &xp[((b0 + bi) * self.c + gi * self.cg + ci) * hp * wp..][..hp * wp];
                for (oy, out) in row[bi * pp..][..pp].chunks_mut(self.ow).enumerate() {
                    let src = &plane[(oy * sh + ky * dh) * wp + kx * dw..];
                    if sw == 1 {
                        copy_short(out, &src[..self.ow]);
                    } else {
                        for (j, d) in out.iter_mut().enumerate() {
                            *d = src[j * sw];
                        }
                    }
                }
            }
        };
        if col.len() >= super::index::COPY_PAR_THRESHOLD {
            col.par_chunks_mut(cols).enumerate().for_each(|(r, row)| fill(r, row));
        } else {
            col.chunks_mut(cols).enumerate().for_each(|(r, row)| fill(r, row));
        }
    }
}

/// `x`'s planes (`[n * c, h, w]`, dense) with `ph` rows and `pw` columns
/// of zeros around each.
fn padded<R: Copy + Default>(xs: &[R], h: usize, w: usize, ph: usize, pw: usize) -> Vec<R> {
    let (hp, wp) = (h + 2 * ph, w + 2 * pw);
    let planes = xs.len().checked_div(h * w).unwrap_or(0);
    let mut xp = vec![R::default(); planes * hp * wp];
    for (src, dst) in xs.chunks(h * w.max(1)).zip(xp.chunks_mut(hp * wp)) {
        for y in 0..h {
            dst[(y + ph) * wp + pw..][..w].copy_from_slice(&src[y * w..][..w]);
        }
    }
    xp
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
