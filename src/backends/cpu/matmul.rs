//! Batched matrix multiplication.
//!
//! `f32`, `f64` and `f16` go through the `gemm` crate, which takes row and
//! column strides, so transposed, sliced and stride-0 (expanded) operands
//! need no copy. `bf16` is widened to `f32`, multiplied and rounded once.
//! Integer dtypes use a row-major loop with wrapping `i64` arithmetic
//! (equal, modulo the dtype's width, to wrapping in the dtype).

use super::elementwise::{map1, PAR_THRESHOLD};
use super::layout::Layout;
use super::storage::{Elem, View};
use super::CpuBuffer;
use crate::ir::{DType, Element, HostData, Shape};
use crate::{Error, Result};
use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;

/// Below this many multiply-adds a single GEMM runs on one thread.
const GEMM_PAR_WORK: usize = 64 * 64 * 64;

/// The problem: batch offsets of each operand plus m, k, n and strides.
struct Problem {
    a_base: Vec<usize>,
    b_base: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    a_rs: usize,
    a_cs: usize,
    b_rs: usize,
    b_cs: usize,
}

impl Problem {
    fn new(a: &Layout, b: &Layout) -> Result<Problem> {
        let r = a.shape.rank();
        if r < 2 || b.shape.rank() != r {
            return Err(Error::Backend(format!("cpu: matmul of {} and {}", a.shape, b.shape)));
        }
        let batch = Shape(a.shape.0[..r - 2].to_vec());
        let nb = batch.numel();
        let bases = |l: &Layout| {
            let mut it = super::layout::Offsets::new(&batch.0, &l.strides[..r - 2], l.offset, 0);
            (0..nb).map(|_| it.next_offset()).collect::<Vec<_>>()
        };
        Ok(Problem {
            a_base: bases(a),
            b_base: bases(b),
            m: a.shape.0[r - 2],
            k: a.shape.0[r - 1],
            n: b.shape.0[r - 1],
            a_rs: a.strides[r - 2],
            a_cs: a.strides[r - 1],
            b_rs: b.strides[r - 2],
            b_cs: b.strides[r - 1],
        })
    }
}

/// `gemm` panics on element types it does not know; refuse them here.
fn gemm_dtype<T: Elem>() -> Result<()> {
    match T::DTYPE {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        d => Err(Error::Backend(format!("cpu: gemm does not take {d}"))),
    }
}

fn check_fits<T>(v: &View<'_, T>) -> Result<()> {
    if v.layout.extent() > v.data.len() {
        return Err(Error::Backend(format!(
            "cpu: layout {:?} does not fit storage of {} elements",
            v.layout,
            v.data.len()
        )));
    }
    Ok(())
}

/// `C = A x B` through `gemm` (`T` must be f32, f64 or f16).
fn gemm_float<T: Elem>(a: View<'_, T>, b: View<'_, T>) -> Result<Vec<T>> {
    gemm_dtype::<T>()?;
    check_fits(&a)?;
    check_fits(&b)?;
    let p = Problem::new(a.layout, b.layout)?;
    let (m, k, n) = (p.m, p.k, p.n);
    let nb = p.a_base.len();
    let mut out = vec![T::default(); nb * m * n];
    if m == 0 || n == 0 || k == 0 || nb == 0 {
        return Ok(out);
    }
    let (zero, one) = (T::from_f64(0.0), T::from_f64(1.0));
    let one_gemm = |i: usize, dst: &mut [T], par: Parallelism| {
        // SAFETY: `dst` holds m*n elements written with row stride n and
        // column stride 1. Every element gemm reads from A is at
        // a_base[i] + r*a_rs + c*a_cs with r < m, c < k, which is an offset
        // of A's layout, and check_fits proved every such offset is inside
        // `a.data` (likewise for B). T is f32, f64 or f16 (the callers).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.data.as_ptr().add(p.a_base[i]),
                p.a_cs as isize,
                p.a_rs as isize,
                b.data.as_ptr().add(p.b_base[i]),
                p.b_cs as isize,
                p.b_rs as isize,
                zero,
                one,
                false,
                false,
                false,
                par,
            )
        }
    };
    let work = m * n * k;
    if nb > 1 && work < GEMM_PAR_WORK * 8 {
        out.par_chunks_mut(m * n).enumerate().for_each(|(i, dst)| one_gemm(i, dst, Parallelism::None));
    } else {
        let par = if work >= GEMM_PAR_WORK { Parallelism::Rayon(0) } else { Parallelism::None };
        for (i, dst) in out.chunks_mut(m * n).enumerate() {
            one_gemm(i, dst, par);
        }
    }
    Ok(out)
}

/// `C = A x B` for integer dtypes, wrapping.
fn matmul_int<T: Elem>(a: View<'_, T>, b: View<'_, T>) -> Result<Vec<T>> {
    let p = Problem::new(a.layout, b.layout)?;
    let (m, k, n) = (p.m, p.k, p.n);
    let nb = p.a_base.len();
    let mut out = vec![T::default(); nb * m * n];
    if m == 0 || n == 0 {
        return Ok(out);
    }
    let row = |r: usize, dst: &mut [T]| {
        let (bi, i) = (r / m, r % m);
        let mut acc = vec![0i64; n];
        let a0 = p.a_base[bi] + i * p.a_rs;
        for q in 0..k {
            let av = a.data[a0 + q * p.a_cs].to_i64();
            if av == 0 {
                continue;
            }
            let b0 = p.b_base[bi] + q * p.b_rs;
            for (j, s) in acc.iter_mut().enumerate() {
                *s = s.wrapping_add(av.wrapping_mul(b.data[b0 + j * p.b_cs].to_i64()));
            }
        }
        for (d, s) in dst.iter_mut().zip(acc) {
            *d = T::from_i64(s);
        }
    };
    if nb * m * n * k.max(1) >= PAR_THRESHOLD {
        out.par_chunks_mut(n).enumerate().for_each(|(r, dst)| row(r, dst));
    } else {
        out.chunks_mut(n).enumerate().for_each(|(r, dst)| row(r, dst));
    }
    Ok(out)
}

/// `[.., m, k] x [.., k, n]` with equal batch dims, any strides.
pub(crate) fn matmul(a: &CpuBuffer, b: &CpuBuffer) -> Result<HostData> {
    Ok(match a.dtype() {
        DType::F32 => f32::into_host(gemm_float(a.view::<f32>()?, b.view::<f32>()?)?),
        DType::F64 => f64::into_host(gemm_float(a.view::<f64>()?, b.view::<f64>()?)?),
        DType::F16 => f16::into_host(gemm_float(a.view::<f16>()?, b.view::<f16>()?)?),
        DType::BF16 => {
            let (va, vb) = (a.view::<bf16>()?, b.view::<bf16>()?);
            let (la, lb) = (Layout::contiguous(a.shape().clone()), Layout::contiguous(b.shape().clone()));
            let wa = map1(va, bf16::to_f32);
            let wb = map1(vb, bf16::to_f32);
            let c = gemm_float(View { data: &wa, layout: &la }, View { data: &wb, layout: &lb })?;
            HostData::BF16(c.into_iter().map(bf16::from_f32).collect())
        }
        DType::U8 => u8::into_host(matmul_int(a.view::<u8>()?, b.view::<u8>()?)?),
        DType::I32 => i32::into_host(matmul_int(a.view::<i32>()?, b.view::<i32>()?)?),
        DType::I64 => i64::into_host(matmul_int(a.view::<i64>()?, b.view::<i64>()?)?),
        DType::Bool => return Err(Error::Backend("cpu: matmul is not defined on bool".into())),
    })
}

/// A plain `C = A x B` on row-major `f32`/`f64` slices, for conv's GEMMs.
pub(crate) fn gemm_rowmajor<T: Elem>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    dst: &mut [T],
    parallel: bool,
) -> Result<()> {
    gemm_dtype::<T>()?;
    if m == 0 || n == 0 || k == 0 || a.len() < m * k || b.len() < k * n || dst.len() < m * n {
        return Ok(());
    }
    let par = if parallel && m * n * k >= GEMM_PAR_WORK { Parallelism::Rayon(0) } else { Parallelism::None };
    // SAFETY: the lengths were checked above for dense row-major operands;
    // callers pass T = f32 or f64.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            n as isize,
            T::from_f64(0.0),
            T::from_f64(1.0),
            false,
            false,
            false,
            par,
        )
    }
    Ok(())
}
