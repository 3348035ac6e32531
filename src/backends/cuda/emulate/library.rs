//! What cuBLAS and cuDNN would compute, from the very descriptors the
//! lowering wrote: column-major GEMMs with their transposes and leading
//! dimensions, NCHW convolutions and poolings with their strides. Sums
//! accumulate in f64; results round once to the dtype.

use crate::backends::cuda::program::{Conv, Gemm, Loc, Pool};
use crate::ir::{DType, PoolKind};
use crate::Result;
use half::{bf16, f16};

/// Element `i` of dtype `d` at address `base`, widened to f64.
///
/// # Safety
/// `base` must point to at least `i + 1` elements of `d`.
unsafe fn read(base: u64, i: usize, d: DType) -> f64 {
    let p = base as *const u8;
    match d {
        DType::F16 => f16::from_bits((p as *const u16).add(i).read_unaligned()).to_f64(),
        DType::BF16 => bf16::from_bits((p as *const u16).add(i).read_unaligned()).to_f64(),
        DType::F32 => (p as *const f32).add(i).read_unaligned() as f64,
        DType::F64 => (p as *const f64).add(i).read_unaligned(),
        _ => f64::NAN,
    }
}

/// Stores `v` rounded to `d` as element `i` at `base`.
///
/// # Safety
/// As for [`read`].
unsafe fn write(base: u64, i: usize, d: DType, v: f64) {
    let p = base as *mut u8;
    match d {
        DType::F16 => (p as *mut u16).add(i).write_unaligned(f16::from_f64(v).to_bits()),
        DType::BF16 => (p as *mut u16).add(i).write_unaligned(bf16::from_f64(v).to_bits()),
        DType::F32 => (p as *mut f32).add(i).write_unaligned(v as f32),
        DType::F64 => (p as *mut f64).add(i).write_unaligned(v),
        _ => {}
    }
}

/// `C = op(A) op(B)`, batched, column-major (see [`Gemm`]).
pub(super) fn gemm(g: &Gemm, at: &dyn Fn(Loc) -> u64) -> Result<()> {
    // An epilogue for cuBLASLt is also lowered as the kernel that follows,
    // which the emulator runs: it emulates the path without cuBLASLt.
    let (a, b, c) = (at(g.a.0), at(g.b.0), at(g.c.0));
    for bt in 0..g.batch {
        for j in 0..g.n {
            for i in 0..g.m {
                let mut acc = 0.0f64;
                for l in 0..g.k {
                    let ai = if g.transa { l + i * g.a.1 } else { i + l * g.a.1 };
                    let bi = if g.transb { j + l * g.b.1 } else { l + j * g.b.1 };
                    // SAFETY: lowering sized every operand for these indices.
                    unsafe { acc += read(a, bt * g.a.2 + ai, g.dtype) * read(b, bt * g.b.2 + bi, g.dtype) };
                }
                // SAFETY: as above.
                unsafe { write(c, bt * g.c.2 + i + j * g.c.1, g.out_dtype, acc) };
            }
        }
    }
    Ok(())
}

/// Cross-correlation with zero padding, grouped.
pub(super) fn conv(c: &Conv, at: &dyn Fn(Loc) -> u64) -> Result<()> {
    let (x, w, y) = (at(c.x.at), at(c.w.at), at(c.y.at));
    let [n, ci, h, wd] = c.x.dims;
    let [k, cg, r, s] = c.w.dims;
    let [_, _, oh, ow] = c.y.dims;
    let kg = k / c.groups.max(1);
    let xs = c.x.strides;
    for b in 0..n {
        for o in 0..k {
            let g = o / kg.max(1);
            for p in 0..oh {
                for q in 0..ow {
                    let mut acc = 0.0;
                    for ch in 0..cg {
                        let cin = g * cg + ch;
                        if cin >= ci {
                            continue;
                        }
                        for u in 0..r {
                            for v in 0..s {
                                let ih =
                                    (p * c.stride[0] + u * c.dilation[0]) as isize - c.padding[0] as isize;
                                let iw =
                                    (q * c.stride[1] + v * c.dilation[1]) as isize - c.padding[1] as isize;
                                if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= wd {
                                    continue;
                                }
                                let xi = b * xs[0] + cin * xs[1] + ih as usize * xs[2] + iw as usize * xs[3];
                                let wi = ((o * cg + ch) * r + u) * s + v;
                                // SAFETY: lowering described these tensors.
                                unsafe { acc += read(x, xi, c.dtype) * read(w, wi, c.dtype) };
                            }
                        }
                    }
                    let yi = ((b * k + o) * oh + p) * ow + q;
                    // SAFETY: as above.
                    unsafe { write(y, yi, c.dtype, acc) };
                }
            }
        }
    }
    Ok(())
}

/// Max (padding never wins, NaN does) or average (padding counted) pooling.
pub(super) fn pool(pl: &Pool, at: &dyn Fn(Loc) -> u64) -> Result<()> {
    let (x, y) = (at(pl.x.at), at(pl.y.at));
    let [n, ch, h, wd] = pl.x.dims;
    let [_, _, oh, ow] = pl.y.dims;
    let xs = pl.x.strides;
    for b in 0..n {
        for cc in 0..ch {
            for p in 0..oh {
                for q in 0..ow {
                    let mut acc = match pl.kind {
                        PoolKind::Max => f64::NEG_INFINITY,
                        PoolKind::Avg => 0.0,
                    };
                    for u in 0..pl.kernel[0] {
                        for v in 0..pl.kernel[1] {
                            let ih = (p * pl.stride[0] + u) as isize - pl.padding[0] as isize;
                            let iw = (q * pl.stride[1] + v) as isize - pl.padding[1] as isize;
                            if ih < 0 || iw < 0 || ih as usize >= h || iw as usize >= wd {
                                continue;
                            }
                            let xi = b * xs[0] + cc * xs[1] + ih as usize * xs[2] + iw as usize * xs[3];
                            // SAFETY: lowering described this tensor.
                            let e = unsafe { read(x, xi, pl.dtype) };
                            acc = match pl.kind {
                                PoolKind::Max if e.is_nan() || acc.is_nan() => f64::NAN,
                                PoolKind::Max => acc.max(e),
                                PoolKind::Avg => acc + e,
                            };
                        }
                    }
                    if pl.kind == PoolKind::Avg {
                        acc /= (pl.kernel[0] * pl.kernel[1]) as f64;
                    }
                    // SAFETY: as above.
                    unsafe { write(y, ((b * ch + cc) * oh + p) * ow + q, pl.dtype, acc) };
                }
            }
        }
    }
    Ok(())
}
