//! Matrix products: cuBLAS (or cuBLASLt with an epilogue) for float
//! dtypes, reading views of transposes as they are; the GEMV of
//! `gemv.rs` for products of a few rows; a generated kernel for integers;
//! and which epilogue (bias, relu, residual) cuBLASLt takes from a fused
//! matmul body.

use super::ops::{buffer_locs, operand};
use super::{Lowering, Storage, Value};
use crate::backends::cuda::codegen::ops;
use crate::backends::cuda::program::{Epilogue, Gemm, Launch, Loc};
use crate::ir::{BinaryOp, Graph, Node, NodeId, Op, UnaryOp};
use crate::ir::{DType, Scalar, Shape};

/// What cuBLASLt may apply to a GEMM's product (see `lt.rs`): its
/// epilogue and a residual added through its C matrix.
#[derive(Clone, Debug)]
pub(super) struct LtEpilogue {
    pub epilogue: Epilogue,
    pub residual: Option<Loc>,
}

impl LtEpilogue {
    /// The product as it is.
    pub const NONE: LtEpilogue = LtEpilogue { epilogue: Epilogue::None, residual: None };
}

impl Lowering<'_> {
    /// `a . b` of `dtype` into `dst`: cuBLAS for float dtypes (views of
    /// transposes are read as they are), a generated kernel for integers.
    /// Stored as `out_dtype`: `dtype`, or f32 for a widened f16/bf16
    /// product (see [`Gemm::out_dtype`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul(
        &mut self,
        a: &Value,
        b: &Value,
        shape: &Shape,
        dtype: DType,
        out_dtype: DType,
        dst: Loc,
        epilogue: LtEpilogue,
    ) -> Result<(), String> {
        let r = shape.rank();
        let k = a.layout.shape.0[r - 1];
        if shape.numel() == 0 {
            return Ok(());
        }
        if k == 0 {
            let numel = shape.numel();
            let kid = self.add_kernel("fill", |n| Ok(ops::fill(n, out_dtype, numel, Scalar::Int(0))))?;
            self.launches.push(Launch::Kernel { kernel: kid, args: vec![dst] });
            return Ok(());
        }
        let a = match a.storage {
            Storage::Const(_) => self.materialize(a)?,
            _ => a.clone(),
        };
        let b = match b.storage {
            Storage::Const(_) => self.materialize(b)?,
            _ => b.clone(),
        };
        if !dtype.is_float() {
            let (oa, ob) = (operand(&a), operand(&b));
            let kid = self.add_kernel("int_matmul", |n| Ok(ops::int_matmul(n, &oa, &ob, shape)))?;
            let mut args = vec![dst];
            args.extend(buffer_locs(&[a, b]));
            self.launches.push(Launch::Kernel { kernel: kid, args });
            return Ok(());
        }
        let (m, n) = (shape.0[r - 2], shape.0[r - 1]);
        let batch: usize = shape.0[..r - 2].iter().product();
        let a = match gemm_operand(&a) {
            Some(_) => a,
            None => self.materialize(&a)?,
        };
        let b = match gemm_operand(&b) {
            Some(_) => b,
            None => self.materialize(&b)?,
        };
        let (ta, lda_a, sa) = gemm_operand(&a).ok_or("a dense operand is not a GEMM operand")?;
        let (tb, ldb_b, sb) = gemm_operand(&b).ok_or("a dense operand is not a GEMM operand")?;
        let size = dtype.size() as u64;
        let at = |v: &Value| match v.storage {
            Storage::Mem(l) => Ok(l.plus(v.layout.offset as u64 * size)),
            Storage::Const(_) => Err("a constant GEMM operand".to_string()),
        };
        // A batch of `a`s against one `b` (a linear layer over [batch,
        // seq, in]) whose rows follow on from batch to batch is one GEMM of
        // batch x m rows: one call, the algorithms of its true size, and a
        // cuBLASLt epilogue (which takes no batch).
        let (m, batch, sa) =
            if batch > 1 && sb == 0 && !ta && sa == m * lda_a { (batch * m, 1, 0) } else { (m, batch, sa) };
        // out^T (n x m) = b^T (n x k) . a^T (k x m) in column-major terms.
        self.launches.push(Launch::Gemm(Gemm {
            dtype,
            out_dtype,
            transa: tb,
            transb: ta,
            m: n,
            n: m,
            k,
            a: (at(&b)?, ldb_b, sb),
            b: (at(&a)?, lda_a, sa),
            c: (dst, n, m * n),
            batch,
            epilogue: epilogue.epilogue,
            residual: epilogue.residual,
            tf32: self.tf32,
        }));
        Ok(())
    }
}

/// A GEMM operand `[.., r, c]`: (read column-major, leading dimension,
/// batch stride), or `None` when its strides need a copy first.
pub(super) fn gemm_operand(v: &Value) -> Option<(bool, usize, usize)> {
    let l = &v.layout;
    let rank = l.shape.rank();
    let (r, c) = (l.shape.0[rank - 2], l.shape.0[rank - 1]);
    let (sr, sc) = (l.strides[rank - 2], l.strides[rank - 1]);
    let (trans, ld) = if (c == 1 || sc == 1) && (r == 1 || sr >= c) {
        (false, if r == 1 { c.max(1) } else { sr })
    } else if (r == 1 || sr == 1) && (c == 1 || sc >= r) {
        (true, if c == 1 { r.max(1) } else { sc })
    } else {
        return None;
    };
    // The batch dims must be one evenly strided run (stride 0 broadcasts).
    let mut batch: Option<(usize, usize)> = None; // (count, stride) of the merged run
    for d in (0..rank - 2).rev() {
        let (n, s) = (l.shape.0[d], l.strides[d]);
        if n == 1 {
            continue;
        }
        batch = match batch {
            None => Some((n, s)),
            Some((cnt, st)) if s == st * cnt => Some((cnt * n, st)),
            Some(_) => return None,
        };
    }
    Some((trans, ld, batch.map_or(0, |(_, s)| s)))
}

/// Which epilogue cuBLASLt can take from a fused matmul body.
impl Lowering<'_> {
    /// The cuBLASLt epilogue a matmul body is (see `lt.rs`): `mm + bias`,
    /// `act(mm + bias)` or `act(mm)` with `act` a relu or a tanh GELU,
    /// for an f32/f16/bf16 product and a bias read densely along the
    /// columns, the same for every row (and
    /// every batch: a `[1, seq, n]` product of a model's linear layer takes
    /// it as a 2-d one does; a GEMM that stays batched runs without
    /// cuBLASLt, `LtPlan::new`). The generated epilogue kernel is still
    /// lowered right after the GEMM; the executor skips it when cuBLASLt
    /// takes the epilogue.
    ///
    /// A residual `r + (mm [+ bias])` (no activation: cuBLASLt would apply
    /// it after the residual) of the product's dtype, laid out densely as the
    /// product is, is read as the GEMM's C with `beta = 1`.
    pub(super) fn lt_epilogue(
        &mut self,
        g: &Graph,
        mm: NodeId,
        out: NodeId,
        ops: &[Value],
    ) -> Result<LtEpilogue, String> {
        let node = g.node(mm);
        if node.shape.rank() < 2 || !matches!(node.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Ok(LtEpilogue::NONE);
        }
        let (act, mut sum) = match &g.node(out).op {
            Op::Unary(op @ (UnaryOp::Relu | UnaryOp::GeluTanh)) => (Some(*op), g.operands(out)[0]),
            _ => (None, out),
        };
        let mut residual = None;
        if act.is_none() && g.node(sum).op == Op::Binary(BinaryOp::Add) {
            let terms = g.operands(sum);
            for (this, other) in [(terms[0], terms[1]), (terms[1], terms[0])] {
                let product_side = this == mm
                    || (g.node(this).op == Op::Binary(BinaryOp::Add) && g.operands(this).contains(&mm));
                if product_side && other != mm {
                    if let Some(at) = self.dense_like(g, other, node, ops)? {
                        residual = Some(at);
                        sum = this;
                        break;
                    }
                }
            }
        }
        let epilogue = self.lt_bias(g, mm, sum, act, ops)?;
        if residual.is_some() && sum != mm && epilogue == Epilogue::None {
            // `r + (mm + x)` with an `x` cuBLASLt cannot add: the kernel
            // after the GEMM must run, so it adds `r` too.
            return Ok(LtEpilogue::NONE);
        }
        Ok(LtEpilogue { epilogue, residual })
    }

    /// Where the body leaf `id` lies when it is dense with `product`'s
    /// shape, dtype and row-major layout (a residual cuBLASLt can read as
    /// C), or `None`.
    fn dense_like(
        &mut self,
        g: &Graph,
        id: NodeId,
        product: &Node,
        ops: &[Value],
    ) -> Result<Option<Loc>, String> {
        let leaf = g.node(id);
        if leaf.shape != product.shape
            || leaf.dtype != product.dtype
            || !crate::ir::fused::is_leaf_or_leaf_view(g, id)
        {
            return Ok(None);
        }
        let v = self.leaf_value(g, id, ops)?;
        let Storage::Mem(at) = v.storage else { return Ok(None) };
        let dims = &product.shape.0;
        let mut want = vec![1usize; dims.len()];
        for d in (0..dims.len().saturating_sub(1)).rev() {
            want[d] = want[d + 1] * dims[d + 1];
        }
        let dense = (0..dims.len()).all(|d| dims[d] == 1 || v.layout.strides[d] == want[d]);
        Ok(dense.then(|| at.plus(v.layout.offset as u64 * product.dtype.size() as u64)))
    }

    /// The epilogue of `sum` (the product, or the product plus a bias),
    /// under an activation (relu, tanh GELU) or none.
    fn lt_bias(
        &mut self,
        g: &Graph,
        mm: NodeId,
        sum: NodeId,
        act: Option<UnaryOp>,
        ops: &[Value],
    ) -> Result<Epilogue, String> {
        let node = g.node(mm);
        if sum == mm {
            return Ok(match act {
                Some(UnaryOp::Relu) => Epilogue::Relu,
                Some(_) => Epilogue::Gelu,
                None => Epilogue::None,
            });
        }
        if g.node(sum).op != Op::Binary(BinaryOp::Add) {
            return Ok(Epilogue::None);
        }
        let terms = g.operands(sum);
        let bias = match (terms[0] == mm, terms[1] == mm) {
            (true, false) => terms[1],
            (false, true) => terms[0],
            _ => return Ok(Epilogue::None),
        };
        if !crate::ir::fused::is_leaf_or_leaf_view(g, bias) {
            return Ok(Epilogue::None);
        }
        let v = self.leaf_value(g, bias, ops)?;
        let Storage::Mem(at) = v.storage else { return Ok(Epilogue::None) };
        // Every dim but the last broadcast (or of size 1), the last dense.
        let dims = &node.shape.0;
        let r = dims.len();
        let strides = &v.layout.strides;
        let rows_alike = (0..r - 1).all(|d| dims[d] == 1 || strides[d] == 0);
        if !(rows_alike && (dims[r - 1] == 1 || strides[r - 1] == 1)) {
            return Ok(Epilogue::None);
        }
        let at = at.plus(v.layout.offset as u64 * node.dtype.size() as u64);
        Ok(match act {
            Some(UnaryOp::Relu) => Epilogue::BiasRelu(at),
            Some(_) => Epilogue::BiasGelu(at),
            None => Epilogue::Bias(at),
        })
    }
}
