//! cuBLASLt: a GEMM with its bias and activation applied in the GEMM's
//! own epilogue, so the product is written once, finished.
//!
//! Lowering marks a matmul whose fused body is `product + bias` (a bias
//! vector over the output's columns), `act(product + bias)` or
//! `act(product)` with `act` a relu or the tanh GELU (f32, f16, bf16, no
//! batch), and puts the generated epilogue kernel right after the GEMM.
//! When cuBLASLt's heuristic finds an algorithm for it, the executor runs
//! the one cuBLASLt call and skips that kernel; otherwise it runs the
//! plain GEMM and the kernel.
//!
//! Plain GEMMs (no epilogue, no batch, not widened) go through cuBLASLt
//! too, because its heuristic says how much workspace the algorithm takes:
//! a stream's workspace grows to that, where classic cuBLAS, which cannot
//! be asked, gets 32 MiB (`device.rs`). The matrices' alignment, known
//! from their offsets, goes to the heuristic as well. cuBLASLt's GELU is
//! the tanh approximation (`gelu_tanh`, GPT-2's), not the exact (erf)
//! form of `gelu`, which stays in the generated kernel. A residual
//! `r + (product [+ bias])` is cuBLASLt's C matrix, read with `beta = 1`
//! (`Gemm::residual`).
//!
//! The heuristic's first algorithm is its guess, and plans run it. With
//! GEMM tuning on (`Context::with_gemm_tuning`), `gemm_tune.rs` times the
//! candidates it offers and keeps the fastest (as XLA's GEMM autotuner
//! does).

use super::program::{Epilogue, Gemm};
use crate::ir::DType;
use crate::{Error, Result};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::sys::CUstream;
use std::ffi::c_void;

fn check(st: lt::cublasStatus_t, what: &str) -> Result<()> {
    if st == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Backend(format!("cuda: cuBLASLt {what}: {st:?}")))
    }
}

/// A compiled epilogue GEMM: descriptors and the chosen algorithm.
pub(crate) struct LtPlan {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: usize,
    /// Every algorithm the heuristic offered (best guess first), with the
    /// workspace bytes each takes: what tuning chooses among.
    candidates: Vec<(lt::cublasLtMatmulAlgo_t, usize)>,
    bias: bool,
    /// Whether C is a residual read with `beta = 1` ([`Gemm::residual`]).
    residual: bool,
    /// Whether it applies an epilogue the lowered kernel after it would
    /// (the executor then skips that kernel).
    fused: bool,
}

// SAFETY: host-side descriptors, used under the device's launch lock.
unsafe impl Send for LtPlan {}
unsafe impl Sync for LtPlan {}

impl LtPlan {
    /// The plan for `g` with the heuristic's first algorithm, keeping up
    /// to `wanted` candidates; `None` when cuBLASLt offers no algorithm
    /// (the plain GEMM and the generated epilogue run instead).
    pub fn new(handle: lt::cublasLtHandle_t, g: &Gemm, wanted: usize) -> Result<Option<LtPlan>> {
        let (data, compute) = match g.dtype {
            DType::F32 if g.tf32 => {
                (lt::cudaDataType::CUDA_R_32F, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32)
            }
            DType::F32 => (lt::cudaDataType::CUDA_R_32F, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            DType::F16 => (lt::cudaDataType::CUDA_R_16F, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            DType::BF16 => (lt::cudaDataType::CUDA_R_16BF, lt::cublasComputeType_t::CUBLAS_COMPUTE_32F),
            _ => return Ok(None),
        };
        let (epilogue, bias) = match g.epilogue {
            Epilogue::None => (lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT, false),
            Epilogue::Relu => (lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU, false),
            Epilogue::Bias(_) => (lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS, true),
            Epilogue::BiasRelu(_) => (lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS, true),
            Epilogue::Gelu => (lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU, false),
            Epilogue::BiasGelu(_) => (lt::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS, true),
        };
        // A widened product (`out_dtype` f32) never carries an epilogue;
        // lowering keeps the two apart. Through cuBLASLt (C and D of f32)
        // it measured no faster than classic cuBLAS (GPT-2's bf16 LM head,
        // 2026-11-27), so it stays there.
        if g.batch != 1 || g.out_dtype != g.dtype {
            return Ok(None);
        }
        // cublasOperation_t as the attribute's int32: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| -> i32 { t as i32 };
        // SAFETY: descriptor creation and setup with values that outlive
        // the calls; every descriptor is destroyed in Drop.
        unsafe {
            let mut desc = std::ptr::null_mut();
            check(
                lt::cublasLtMatmulDescCreate(&mut desc, compute, lt::cudaDataType::CUDA_R_32F),
                "descriptor",
            )?;
            let mut plan = LtPlan {
                desc,
                a: std::ptr::null_mut(),
                b: std::ptr::null_mut(),
                c: std::ptr::null_mut(),
                algo: std::mem::zeroed(),
                workspace: 0,
                candidates: Vec::new(),
                bias,
                residual: g.residual.is_some(),
                fused: g.epilogue != Epilogue::None || g.residual.is_some(),
            };
            let set = |attr: lt::cublasLtMatmulDescAttributes_t, v: *const c_void, n: usize| {
                check(lt::cublasLtMatmulDescSetAttribute(desc, attr, v, n), "descriptor attribute")
            };
            let (ta, tb) = (op(g.transa), op(g.transb));
            set(
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &ta as *const _ as _,
                std::mem::size_of_val(&ta),
            )?;
            set(
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &tb as *const _ as _,
                std::mem::size_of_val(&tb),
            )?;
            set(
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &epilogue as *const _ as _,
                std::mem::size_of_val(&epilogue),
            )?;
            let (ar, ac) = if g.transa { (g.k, g.m) } else { (g.m, g.k) };
            let (br, bc) = if g.transb { (g.n, g.k) } else { (g.k, g.n) };
            check(
                lt::cublasLtMatrixLayoutCreate(&mut plan.a, data, ar as u64, ac as u64, g.a.1 as i64),
                "layout A",
            )?;
            check(
                lt::cublasLtMatrixLayoutCreate(&mut plan.b, data, br as u64, bc as u64, g.b.1 as i64),
                "layout B",
            )?;
            check(
                lt::cublasLtMatrixLayoutCreate(&mut plan.c, data, g.m as u64, g.n as u64, g.c.1 as i64),
                "layout C",
            )?;
            let mut pref = std::ptr::null_mut();
            check(lt::cublasLtMatmulPreferenceCreate(&mut pref), "preference")?;
            let ws = super::device::BLAS_WORKSPACE;
            let mut st = lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as _,
                8,
            );
            // The heuristic assumes 256-byte aligned matrices unless told:
            // a view's offset may align them less, and an algorithm that
            // needs more would fail at run time.
            use lt::cublasLtMatmulPreferenceAttributes_t as P;
            for (attr, loc) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.a.0),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.b.0),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.residual.unwrap_or(g.c.0)),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c.0),
            ] {
                let align = alignment(loc.offset);
                if st == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                    st = lt::cublasLtMatmulPreferenceSetAttribute(pref, attr, &align as *const u32 as _, 4);
                }
            }
            let wanted = wanted.max(1);
            let mut results: Vec<lt::cublasLtMatmulHeuristicResult_t> = vec![std::mem::zeroed(); wanted];
            let mut found = 0;
            let heuristic = lt::cublasLtMatmulAlgoGetHeuristic(
                handle,
                desc,
                plan.a,
                plan.b,
                plan.c,
                plan.c,
                pref,
                wanted as i32,
                results.as_mut_ptr(),
                &mut found,
            );
            lt::cublasLtMatmulPreferenceDestroy(pref);
            check(st, "preference attribute")?;
            if heuristic != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Ok(None);
            }
            plan.candidates = results
                .iter()
                .take(found.max(0) as usize)
                .filter(|r| r.state == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
                .map(|r| (r.algo, r.workspaceSize))
                .collect();
            if plan.candidates.is_empty() {
                return Ok(None);
            }
            plan.choose(0);
            Ok(Some(plan))
        }
    }

    /// How many algorithms the heuristic offered.
    pub fn candidates(&self) -> usize {
        self.candidates.len()
    }

    /// Runs candidate `i` from now on (`i < candidates()`).
    pub fn choose(&mut self, i: usize) {
        (self.algo, self.workspace) = self.candidates[i];
    }

    /// The most workspace bytes any candidate takes.
    pub fn max_workspace(&self) -> u64 {
        self.candidates.iter().map(|c| c.1 as u64).max().unwrap_or(0)
    }

    /// Whether it applies the epilogue of the kernel lowered after it.
    pub fn fused(&self) -> bool {
        self.fused
    }

    /// Bytes of workspace the chosen algorithm takes.
    pub fn workspace(&self) -> u64 {
        self.workspace as u64
    }

    /// Enqueues `D = epilogue(op(A) op(B) + R)` on `stream`, `R` the
    /// residual at `residual` when the plan has one (else 0).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        handle: lt::cublasLtHandle_t,
        stream: CUstream,
        a: u64,
        b: u64,
        c: u64,
        bias: u64,
        residual: u64,
        workspace: u64,
    ) -> Result<()> {
        let (one, zero) = (1.0f32, 0.0f32);
        // C is the residual (beta 1) or the output itself, unread (beta 0).
        let (beta, cin) = if self.residual { (&one, residual) } else { (&zero, c) };
        // SAFETY: the descriptors describe these buffers (lowering sized
        // them); the bias pointer is set per launch, under the launch lock,
        // and read by cuBLASLt when it enqueues (a capture bakes it in).
        unsafe {
            if self.bias {
                let p = bias as *const c_void;
                check(
                    lt::cublasLtMatmulDescSetAttribute(
                        self.desc,
                        lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                        &p as *const _ as _,
                        std::mem::size_of_val(&p),
                    ),
                    "bias pointer",
                )?;
            }
            check(
                lt::cublasLtMatmul(
                    handle,
                    self.desc,
                    &one as *const f32 as _,
                    a as *const c_void,
                    self.a,
                    b as *const c_void,
                    self.b,
                    beta as *const f32 as _,
                    cin as *const c_void,
                    self.c,
                    c as *mut c_void,
                    self.c,
                    &self.algo,
                    workspace as *mut c_void,
                    self.workspace,
                    stream as _,
                ),
                "matmul",
            )
        }
    }
}

/// The alignment (bytes, at most 256) of a matrix `offset` bytes into a
/// region: regions themselves start 256-byte aligned (`memory.rs`).
fn alignment(offset: u64) -> u32 {
    if offset == 0 {
        256
    } else {
        (1u32 << offset.trailing_zeros().min(8)).min(256)
    }
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: created in `new` (null ones are skipped by the library).
        unsafe {
            for l in [self.a, self.b, self.c] {
                if !l.is_null() {
                    lt::cublasLtMatrixLayoutDestroy(l);
                }
            }
            lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}
