//! Lowering of f16 and bf16 matmul bodies to the Hopper GEMM with the
//! epilogue inside it (`codegen/gemm_wgmma.rs`) instead of a cuBLAS GEMM
//! and an epilogue kernel, on sm_90 devices, for bodies whose epilogue
//! cuBLASLt takes none of (the erf GELU, a cast, a scale: bias, relu, the
//! tanh GELU and a residual stay on cuBLASLt), where the target asks for
//! it (`Target::wgmma_gemm`: on unless `KILN_CUDA_WGMMA_GEMM=0`). Falls
//! back (returns `false`) for anything else.

use super::gemv::Epi;
use super::matmul::gemm_operand;
use super::ops::{buffer_locs, operand};
use super::{Lowering, Storage, Value};
use crate::backends::cuda::codegen::body::{Operand, Source};
use crate::backends::cuda::codegen::epilogue::{self, Epilogue};
use crate::backends::cuda::codegen::gemm_wgmma::{self, Spec, Tile};
use crate::backends::cuda::codegen::index::Access;
use crate::backends::cuda::program::{Launch, Loc};
use crate::backends::Layout;
use crate::ir::{DType, Shape};

/// Output tiles below which a product stays on cuBLAS: half an H100's
/// SMs. With fewer, the kernel (which never splits `k`) leaves most of the
/// card idle where cuBLAS may split `k`. Not measured: a guard, not a tuned
/// threshold.
const MIN_TILES: usize = 66;

impl Lowering<'_> {
    /// `epi(a . b)` into `dst` with the Hopper GEMM, when it takes it: see
    /// the module docs. `Ok(false)`: nothing was launched.
    pub(super) fn gemm_wgmma(
        &mut self,
        a: &Value,
        b: &Value,
        shape: &Shape,
        dtype: DType,
        dst: Loc,
        e: Epi<'_>,
    ) -> Result<bool, String> {
        let r = shape.rank();
        if !(self.hopper && self.wgmma_gemm) || r < 2 {
            return Ok(false);
        }
        let (Storage::Mem(la), Storage::Mem(lb)) = (a.storage.clone(), b.storage.clone()) else {
            return Ok(false);
        };
        let (m, n) = (shape.0[r - 2], shape.0[r - 1]);
        let batch: usize = shape.0[..r - 2].iter().product();
        let k = *a.layout.shape.0.last().unwrap_or(&0);
        // `a` row-major with its rows one evenly strided run across the
        // batch; the weight `[n, k]` contiguous along `k`, the same for
        // every batch (a linear layer's `x . wᵀ`).
        let (Some((false, lda, sa)), Some((true, ldb, sb))) = (gemm_operand(a), gemm_operand(b)) else {
            return Ok(false);
        };
        // TMA reads 16-byte aligned rows; the epilogue stores 16 bytes at once.
        if (batch > 1 && (sa != m * lda || sb != 0))
            || a.layout.offset % 8 != 0
            || b.layout.offset % 8 != 0
            || dst.offset % 16 != 0
        {
            return Ok(false);
        }
        let spec = Spec { dtype, m: batch * m, n, k, lda, ldb };
        let tile = Tile::for_device(self.sms);
        if !gemm_wgmma::applies(&spec)
            || spec.m.div_ceil(tile.rows) * n.div_ceil(tile.cols) < MIN_TILES
            || !epilogue::fusable(e.g, e.product, spec.m, n)
        {
            return Ok(false);
        }
        // The epilogue's operands, the product last (dense, in registers).
        let mut operands: Vec<Operand> = e.ops.iter().map(operand).collect();
        operands.push(Operand {
            source: Source::Buffer,
            access: Access::strided(Layout::contiguous(shape.clone())),
            dtype,
        });
        let cg = Epilogue { g: e.g, operands: &operands, product: e.product };
        let size = dtype.size() as u64;
        let mut args =
            vec![dst, la.plus(a.layout.offset as u64 * size), lb.plus(b.layout.offset as u64 * size)];
        args.extend(buffer_locs(e.ops));
        let kernel =
            self.add_kernel("gemm_wgmma", |nm| gemm_wgmma::gemm_wgmma(nm, &spec, tile, e.out, Some(&cg)))?;
        self.launches.push(Launch::Kernel { kernel, args });
        Ok(true)
    }
}
