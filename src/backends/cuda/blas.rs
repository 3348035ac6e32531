//! cuBLAS: strided, batched GEMMs (`cublasGemmStridedBatchedEx`).
//!
//! A kiln matmul arrives already in cuBLAS's column-major terms (see
//! [`super::program::Gemm`]): a transposed view is `CUBLAS_OP_T` on the
//! same bytes, a broadcast batch is a batch stride of 0. f16 and bf16
//! multiply with f32 accumulation (and store it as f32 where the plan
//! widens the product, `Gemm::out_dtype`); f32 uses plain FP32 arithmetic unless
//! the context allows TF32 (`Context::with_tf32`); f64 is f64 throughout.

use super::program::Gemm;
use crate::ir::DType;
use crate::{Error, Result};
use cudarc::cublas::sys as bsys;
use cudarc::cublas::sys::{
    cublasComputeType_t as Compute, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t as Op,
    cublasStatus_t, cudaDataType as Data,
};
use cudarc::driver::sys::CUstream;
use std::ffi::c_void;

/// Runs `g` on `stream` with `a`, `b`, `c` the resolved device pointers.
pub(crate) fn gemm(handle: cublasHandle_t, stream: CUstream, g: &Gemm, a: u64, b: u64, c: u64) -> Result<()> {
    // A marked epilogue (`g.epilogue`) is cuBLASLt's business; here the
    // generated epilogue kernel that follows does that work.
    let int = |v: usize, what: &str| {
        i32::try_from(v)
            .map_err(|_| Error::Backend(format!("cuda: GEMM {what} {v} does not fit cuBLAS's int")))
    };
    let long = |v: usize| v as i64;
    let (data, compute) = match g.dtype {
        DType::F16 => (Data::CUDA_R_16F, Compute::CUBLAS_COMPUTE_32F),
        DType::BF16 => (Data::CUDA_R_16BF, Compute::CUBLAS_COMPUTE_32F),
        DType::F32 if g.tf32 => (Data::CUDA_R_32F, Compute::CUBLAS_COMPUTE_32F_FAST_TF32),
        DType::F32 => (Data::CUDA_R_32F, Compute::CUBLAS_COMPUTE_32F),
        DType::F64 => (Data::CUDA_R_64F, Compute::CUBLAS_COMPUTE_64F),
        d => return Err(Error::Backend(format!("cuda: cuBLAS has no {d} GEMM"))),
    };
    let out = match (g.dtype, g.out_dtype) {
        (a, c) if a == c => data,
        (DType::F16 | DType::BF16, DType::F32) => Data::CUDA_R_32F,
        (a, c) => return Err(Error::Backend(format!("cuda: cuBLAS has no {a} GEMM storing {c}"))),
    };
    let op = |t: bool| if t { Op::CUBLAS_OP_T } else { Op::CUBLAS_OP_N };
    let (one_f, zero_f) = (1.0f32, 0.0f32);
    let (one_d, zero_d) = (1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if g.dtype == DType::F64 {
        (&one_d as *const f64 as _, &zero_d as *const f64 as _)
    } else {
        (&one_f as *const f32 as _, &zero_f as *const f32 as _)
    };
    // SAFETY: the handle is used under the launch lock; the pointers are
    // device addresses of the plan's buffers, sized by lowering for these
    // dimensions; alpha and beta live across the call (cuBLAS reads them
    // before returning, in host pointer mode).
    let status = unsafe {
        let st = bsys::cublasSetStream_v2(handle, stream as _);
        if st != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend(format!("cuda: cublasSetStream: {st:?}")));
        }
        bsys::cublasGemmStridedBatchedEx(
            handle,
            op(g.transa),
            op(g.transb),
            int(g.m, "m")?,
            int(g.n, "n")?,
            int(g.k, "k")?,
            alpha,
            a as *const c_void,
            data,
            int(g.a.1, "lda")?,
            long(g.a.2),
            b as *const c_void,
            data,
            int(g.b.1, "ldb")?,
            long(g.b.2),
            beta,
            c as *mut c_void,
            out,
            int(g.c.1, "ldc")?,
            long(g.c.2),
            int(g.batch, "batch")?,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    if status != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(Error::Backend(format!(
            "cuda: cuBLAS GEMM ({} to {} m={} n={} k={} batch={}) failed: {status:?}",
            g.dtype, g.out_dtype, g.m, g.n, g.k, g.batch
        )));
    }
    Ok(())
}
