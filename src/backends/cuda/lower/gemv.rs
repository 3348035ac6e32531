//! Lowering of products of a few rows to the GEMV kernels
//! (`codegen/gemv.rs`) instead of a cuBLAS GEMM: a decode step's
//! projections and LM head, with the matmul body's epilogue in the same
//! kernel. Falls back (returns `false`) for anything else, and always
//! with `KILN_CUDA_GEMV=0` (to compare with cuBLAS in one process).
//!
//! **Every float dtype but f64, by default.** On an H100 (2026-11-26, one
//! warm machine, `benches/gpu_generate.rs`), GPT-2 small's decode step in a
//! CUDA graph took 0.690 ms/token in f32 with these kernels and 0.808
//! with cuBLAS; in bf16 0.670 and 0.661, a tie within the machine's noise.
//! The bf16 kernels read 16 bytes a lane (8 elements) and carry their
//! epilogue, so they stay on; they were f32-only while they read 8 bytes
//! (0.985 against cuBLAS's 0.969 ms/token).

use super::ops::{buffer_locs, operand};
use super::{Lowering, Storage, Value};
use crate::backends::cuda::codegen::body::{Operand, Source};
use crate::backends::cuda::codegen::epilogue;
use crate::backends::cuda::codegen::gemv::{self, Spec};
use crate::backends::cuda::codegen::index::Access;
use crate::backends::cuda::program::{Launch, Loc};
use crate::backends::Layout;
use crate::ir::{DType, Graph, Shape};

/// A matmul body's epilogue for [`Lowering::gemv`]: the body with the
/// product as `input product`, the fused node's operands, the output dtype.
pub(super) struct Epi<'a> {
    pub g: &'a Graph,
    pub ops: &'a [Value],
    pub product: usize,
    pub out: DType,
}

impl Lowering<'_> {
    /// `a . b` (then `epi`) into `dst` with the GEMV kernels, when they take
    /// it: one product (no batch) of at most `gemv::MAX_M` rows, operands in
    /// memory. `Ok(false)`: nothing was launched, use the GEMM.
    pub(super) fn gemv(
        &mut self,
        a: &Value,
        b: &Value,
        shape: &Shape,
        dtype: DType,
        dst: Loc,
        epi: Option<Epi<'_>>,
    ) -> Result<bool, String> {
        let r = shape.rank();
        if off("KILN_CUDA_GEMV") || r < 2 || shape.0[..r - 2].iter().product::<usize>() != 1 {
            return Ok(false);
        }
        let (Storage::Mem(la), Storage::Mem(lb)) = (a.storage.clone(), b.storage.clone()) else {
            return Ok(false);
        };
        let (m, n) = (shape.0[r - 2], shape.0[r - 1]);
        if a.layout.shape.rank() < 2 || b.layout.shape.rank() < 2 {
            return Ok(false);
        }
        let k = *a.layout.shape.0.last().unwrap_or(&0);
        let two = |l: &Layout| {
            let q = l.shape.rank();
            (l.offset, l.strides[q - 2], l.strides[q - 1])
        };
        let (bo, mut bk, mut bn) = two(&b.layout);
        // A dim of size 1 may carry any stride: make it the contiguous one
        // if the other is not.
        if n == 1 && bk != 1 {
            bn = 1;
        }
        if k == 1 && bn != 1 {
            bk = 1;
        }
        let spec = Spec { dtype, m, n, k, a: two(&a.layout), b: (bo, bk, bn) };
        if !gemv::applies(&spec) {
            return Ok(false);
        }
        // The epilogue's operands, the product last (dense, in registers).
        let mut operands: Vec<Operand> = Vec::new();
        let mut epi_locs: Vec<Loc> = Vec::new();
        let out_dtype = match &epi {
            Some(e) => {
                if !epilogue::fusable(e.g, e.product, m, n) {
                    return Ok(false);
                }
                operands = e.ops.iter().map(operand).collect();
                operands.push(Operand {
                    source: Source::Buffer,
                    access: Access::strided(Layout::contiguous(shape.clone())),
                    dtype,
                });
                epi_locs = buffer_locs(e.ops);
                e.out
            }
            None => dtype,
        };
        let cg = epi.as_ref().map(|e| epilogue::Epilogue { g: e.g, operands: &operands, product: e.product });
        let mut args = vec![dst];
        let name = if spec.splits() > 1 {
            args.push(self.transient(spec.workspace_bytes()));
            args.push(self.new_counters(spec.tiles()));
            "gemv_split"
        } else {
            "gemv"
        };
        args.extend([la, lb]);
        args.extend(epi_locs);
        let kernel = self.add_kernel(name, |nm| gemv::gemv(nm, &spec, out_dtype, cg.as_ref()))?;
        self.launches.push(Launch::Kernel { kernel, args });
        Ok(true)
    }
}

/// True when the environment variable `name` is `0`: a decode kernel
/// switched off, so that a benchmark compares it with the general path.
pub(super) fn off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "0")
}
