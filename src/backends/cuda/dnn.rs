//! cuDNN: forward convolutions and poolings.
//!
//! Descriptors are made once when a plan is compiled. A convolution's
//! algorithm is chosen once per shape (cuDNN's heuristics, the first that
//! succeeds within the workspace limit and, for f32, without TF32 unless
//! the context allows it) and cached on the device. Each stream has one
//! workspace that grows to what its convolutions need, up to
//! `KILN_CUDNN_WORKSPACE_MB` (default 1024 MiB); a workspace it outgrew is
//! kept until the device closes, because a captured graph may still point
//! at it.

use super::program::{Conv, Pool, Tensor4};
use crate::ir::{DType, PoolKind};
use crate::{Error, Result};
use cudarc::cudnn::sys::{self as d, cudnnStatus_t};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

/// The algorithm and math type chosen per convolution shape.
pub(crate) type AlgoCache = Mutex<HashMap<String, (d::cudnnConvolutionFwdAlgo_t, d::cudnnMathType_t)>>;

fn check(st: cudnnStatus_t, what: &str) -> Result<()> {
    if st == cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Backend(format!("cuda: cuDNN {what} failed: {st:?}")))
    }
}

fn data_type(t: DType) -> Result<d::cudnnDataType_t> {
    Ok(match t {
        DType::F16 => d::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::BF16 => d::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        DType::F32 => d::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F64 => d::cudnnDataType_t::CUDNN_DATA_DOUBLE,
        other => return Err(Error::Backend(format!("cuda: cuDNN has no {other} tensors"))),
    })
}

fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Backend(format!("cuda: dimension {v} does not fit cuDNN's int")))
}

/// A tensor descriptor, destroyed when dropped.
struct TensorDesc(d::cudnnTensorDescriptor_t);

impl TensorDesc {
    fn new(t: &Tensor4, dtype: DType) -> Result<TensorDesc> {
        let mut desc = std::ptr::null_mut();
        // SAFETY: create, then set with four dims and strides.
        unsafe {
            check(d::cudnnCreateTensorDescriptor(&mut desc), "tensor descriptor")?;
            let dims = [int(t.dims[0])?, int(t.dims[1])?, int(t.dims[2])?, int(t.dims[3])?];
            let strides = [int(t.strides[0])?, int(t.strides[1])?, int(t.strides[2])?, int(t.strides[3])?];
            let out = TensorDesc(desc);
            check(
                d::cudnnSetTensorNdDescriptor(desc, data_type(dtype)?, 4, dims.as_ptr(), strides.as_ptr()),
                "setting a tensor descriptor",
            )?;
            Ok(out)
        }
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created in `new`.
        unsafe { d::cudnnDestroyTensorDescriptor(self.0) };
    }
}

/// A compiled convolution: descriptors and the chosen algorithm.
pub(crate) struct ConvPlan {
    x: TensorDesc,
    y: TensorDesc,
    w: d::cudnnFilterDescriptor_t,
    conv: d::cudnnConvolutionDescriptor_t,
    algo: d::cudnnConvolutionFwdAlgo_t,
    /// Workspace bytes the algorithm needs.
    pub workspace: u64,
    double: bool,
}

// SAFETY: descriptors are plain host objects; used under the launch lock.
unsafe impl Send for ConvPlan {}
unsafe impl Sync for ConvPlan {}

impl ConvPlan {
    /// Descriptors for `c` and the algorithm for them, within `limit`
    /// workspace bytes.
    pub fn new(handle: d::cudnnHandle_t, c: &Conv, limit: u64, cache: &AlgoCache) -> Result<ConvPlan> {
        let x = TensorDesc::new(&c.x, c.dtype)?;
        let y = TensorDesc::new(&c.y, c.dtype)?;
        let mut w = std::ptr::null_mut();
        let mut conv = std::ptr::null_mut();
        let double = c.dtype == DType::F64;
        // SAFETY: descriptor creation and setup; each is destroyed in Drop.
        unsafe {
            check(d::cudnnCreateFilterDescriptor(&mut w), "filter descriptor")?;
            check(d::cudnnCreateConvolutionDescriptor(&mut conv), "convolution descriptor")?;
            let mut plan = ConvPlan {
                x,
                y,
                w,
                conv,
                algo: d::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                workspace: 0,
                double,
            };
            check(
                d::cudnnSetFilter4dDescriptor(
                    w,
                    data_type(c.dtype)?,
                    d::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    int(c.w.dims[0])?,
                    int(c.w.dims[1])?,
                    int(c.w.dims[2])?,
                    int(c.w.dims[3])?,
                ),
                "setting the filter",
            )?;
            let compute = if double {
                d::cudnnDataType_t::CUDNN_DATA_DOUBLE
            } else {
                d::cudnnDataType_t::CUDNN_DATA_FLOAT
            };
            check(
                d::cudnnSetConvolution2dDescriptor(
                    conv,
                    int(c.padding[0])?,
                    int(c.padding[1])?,
                    int(c.stride[0])?,
                    int(c.stride[1])?,
                    int(c.dilation[0])?,
                    int(c.dilation[1])?,
                    d::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    compute,
                ),
                "setting the convolution",
            )?;
            check(d::cudnnSetConvolutionGroupCount(conv, int(c.groups)?), "setting the group count")?;
            let key = format!(
                "{} x{:?}/{:?} w{:?} s{:?} p{:?} d{:?} g{} tf32={} limit={limit}",
                c.dtype, c.x.dims, c.x.strides, c.w.dims, c.stride, c.padding, c.dilation, c.groups, c.tf32
            );
            let cached = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
            let (algo, math) = match cached {
                Some(choice) => choice,
                None => {
                    let choice = choose(handle, &plan, c, limit)?;
                    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, choice);
                    choice
                }
            };
            // f32 stays exact FP32 unless TF32 is allowed (as PyTorch does it:
            // the chosen algorithm with FMA math).
            let math =
                if c.dtype == DType::F32 && !c.tf32 { d::cudnnMathType_t::CUDNN_FMA_MATH } else { math };
            check(d::cudnnSetConvolutionMathType(conv, math), "setting the math type")?;
            let mut ws = 0usize;
            check(
                d::cudnnGetConvolutionForwardWorkspaceSize(
                    handle, plan.x.0, w, conv, plan.y.0, algo, &mut ws,
                ),
                "sizing the workspace",
            )?;
            plan.algo = algo;
            plan.workspace = ws as u64;
            Ok(plan)
        }
    }

    /// Enqueues the convolution.
    pub fn run(&self, handle: d::cudnnHandle_t, x: u64, w: u64, y: u64, workspace: u64) -> Result<()> {
        let (one_f, zero_f, one_d, zero_d) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if self.double {
            (&one_d as *const f64 as _, &zero_d as *const f64 as _)
        } else {
            (&one_f as *const f32 as _, &zero_f as *const f32 as _)
        };
        // SAFETY: descriptors describe the buffers at these addresses, the
        // workspace has `self.workspace` bytes; used under the launch lock.
        unsafe {
            check(
                d::cudnnConvolutionForward(
                    handle,
                    alpha,
                    self.x.0,
                    x as *const c_void,
                    self.w,
                    w as *const c_void,
                    self.conv,
                    self.algo,
                    workspace as *mut c_void,
                    self.workspace as usize,
                    beta,
                    self.y.0,
                    y as *mut c_void,
                ),
                "convolution",
            )
        }
    }
}

/// cuDNN's heuristics: the first algorithm that succeeds within `limit`
/// workspace bytes.
fn choose(
    handle: d::cudnnHandle_t,
    plan: &ConvPlan,
    c: &Conv,
    limit: u64,
) -> Result<(d::cudnnConvolutionFwdAlgo_t, d::cudnnMathType_t)> {
    // SAFETY: the descriptors are set; `perf` has room for 16 results.
    unsafe {
        let mut perf: [d::cudnnConvolutionFwdAlgoPerf_t; 16] = std::mem::zeroed();
        let mut found = 0;
        check(
            d::cudnnGetConvolutionForwardAlgorithm_v7(
                handle,
                plan.x.0,
                plan.w,
                plan.conv,
                plan.y.0,
                perf.len() as i32,
                &mut found,
                perf.as_mut_ptr(),
            ),
            "choosing an algorithm",
        )?;
        for p in perf.iter().take(found.max(0) as usize) {
            if p.status == cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory as u64 <= limit {
                return Ok((p.algo, p.mathType));
            }
        }
    }
    // No heuristic result fits: the implicit GEMM needs no workspace.
    let math = if c.dtype == DType::F32 && !c.tf32 {
        d::cudnnMathType_t::CUDNN_FMA_MATH
    } else {
        d::cudnnMathType_t::CUDNN_DEFAULT_MATH
    };
    Ok((d::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, math))
}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: created in `new`.
        unsafe {
            d::cudnnDestroyFilterDescriptor(self.w);
            d::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

/// A compiled pooling: its descriptors.
pub(crate) struct PoolPlan {
    x: TensorDesc,
    y: TensorDesc,
    pool: d::cudnnPoolingDescriptor_t,
    double: bool,
}

// SAFETY: as for ConvPlan.
unsafe impl Send for PoolPlan {}
unsafe impl Sync for PoolPlan {}

impl PoolPlan {
    pub fn new(p: &Pool) -> Result<PoolPlan> {
        let x = TensorDesc::new(&p.x, p.dtype)?;
        let y = TensorDesc::new(&p.y, p.dtype)?;
        let mut pool = std::ptr::null_mut();
        let mode = match p.kind {
            PoolKind::Max => d::cudnnPoolingMode_t::CUDNN_POOLING_MAX,
            PoolKind::Avg => d::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
        };
        // SAFETY: create and set; destroyed in Drop.
        unsafe {
            check(d::cudnnCreatePoolingDescriptor(&mut pool), "pooling descriptor")?;
            let plan = PoolPlan { x, y, pool, double: p.dtype == DType::F64 };
            check(
                d::cudnnSetPooling2dDescriptor(
                    pool,
                    mode,
                    d::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    int(p.kernel[0])?,
                    int(p.kernel[1])?,
                    int(p.padding[0])?,
                    int(p.padding[1])?,
                    int(p.stride[0])?,
                    int(p.stride[1])?,
                ),
                "setting the pooling",
            )?;
            Ok(plan)
        }
    }

    /// Enqueues the pooling.
    pub fn run(&self, handle: d::cudnnHandle_t, x: u64, y: u64) -> Result<()> {
        let (one_f, zero_f, one_d, zero_d) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
        let (alpha, beta): (*const c_void, *const c_void) = if self.double {
            (&one_d as *const f64 as _, &zero_d as *const f64 as _)
        } else {
            (&one_f as *const f32 as _, &zero_f as *const f32 as _)
        };
        // SAFETY: as for the convolution.
        unsafe {
            check(
                d::cudnnPoolingForward(
                    handle,
                    self.pool,
                    alpha,
                    self.x.0,
                    x as *const c_void,
                    beta,
                    self.y.0,
                    y as *mut c_void,
                ),
                "pooling",
            )
        }
    }
}

impl Drop for PoolPlan {
    fn drop(&mut self) {
        // SAFETY: created in `new`.
        unsafe { d::cudnnDestroyPoolingDescriptor(self.pool) };
    }
}

/// Points cuDNN's handle at `stream`.
pub(crate) fn set_stream(handle: d::cudnnHandle_t, stream: cudarc::driver::sys::CUstream) -> Result<()> {
    // SAFETY: a live handle, used under the launch lock.
    check(unsafe { d::cudnnSetStream(handle, stream as _) }, "setting the stream")
}
