//! The gradient of [`Op::Attention`](crate::ir::Op::Attention), written
//! with the IR's own ops. The forward node never stores the attention
//! probabilities `P`, so the rule recomputes them (`softmax(scale q kᵀ +
//! mask)`, removed keys as `-inf`, a row with no key left as zeros, as
//! the kernels define it) and then applies the usual identities:
//!
//! ```text
//! dv = Pᵀ g            dP = g vᵀ
//! dS = P ⊙ (dP - rowsum(dP ⊙ P))
//! dq = dS (scale · k)  dk = dSᵀ (scale · q)  dmask = dS (additive masks)
//! ```
//!
//! The scale is applied to the operands of each product, never to its
//! result: the products run in the low type under autocast (f16 or an
//! f16 model), and `q kᵀ` of a 64-wide head with entries of 32 is 65536,
//! inf in f16, although `scale · q kᵀ` (8192) is not. So the scores are
//! `(√scale · q)(√scale · k)ᵀ`, as PyTorch's math path computes them, and
//! the gradients take `scale · k` and `scale · q` (the scale is at most 1
//! for the default `1/√d`, so no operand grows). The forward kernels
//! accumulate in f32 and never had the problem.
//!
//! This materializes the `[sq, sk]` scores in the backward graph (fused
//! into a few kernels by the fusion pass): exact and simple, at the memory
//! cost of the unfused formulation. A fused backward kernel is future work.

use super::build::{Builder, Built};
use crate::ir::{AttnMask, BinaryOp, CompareOp, DType, NodeId, ReduceOp, Shape, UnaryOp};

/// The gradients of q, k, v and the mask (for the slots `wanted`).
pub(super) fn vjp(
    b: &mut Builder,
    g: NodeId,
    xs: &[NodeId],
    wanted: &[bool],
    scale: f64,
    causal: bool,
    mask: AttnMask,
) -> Built<Vec<Option<NodeId>>> {
    let (q, k, v) = (xs[0], xs[1], xs[2]);
    let root = scale.sqrt();
    let (q_root, k_root) = (b.scale(q, root)?, b.scale(k, root)?);
    let p = probabilities(b, q_root, k_root, xs.get(3).copied(), causal, mask)?;
    let dv = if wanted[2] {
        let pt = b.transpose_last(p)?;
        Some(b.matmul(pt, g)?)
    } else {
        None
    };
    let need_ds = wanted[0] || wanted[1] || wanted.get(3).copied().unwrap_or(false);
    let mut out = vec![None, None, dv];
    if xs.len() > 3 {
        out.push(None);
    }
    if !need_ds {
        return Ok(out);
    }
    let vt = b.transpose_last(v)?;
    let dp = b.matmul(g, vt)?;
    let dpp = b.mul(dp, p)?;
    let row = b.reduce(ReduceOp::Sum, dpp, &[3], true)?;
    let shape = b.shape(p);
    let row = b.expand(row, &shape)?;
    let centered = b.sub(dp, row)?;
    let ds = b.mul(p, centered)?;
    if wanted[0] {
        let k_scaled = b.scale(k, scale)?;
        out[0] = Some(b.matmul(ds, k_scaled)?);
    }
    if wanted[1] {
        let dst = b.transpose_last(ds)?;
        let q_scaled = b.scale(q, scale)?;
        out[1] = Some(b.matmul(dst, q_scaled)?);
    }
    if mask == AttnMask::Additive && wanted.get(3).copied().unwrap_or(false) {
        out[3] = Some(ds);
    }
    Ok(out)
}

/// `P = softmax(q kᵀ + mask)` over the keys (`q` and `k` already scaled
/// by `√scale`), with removed keys at `-inf` and rows with no key left
/// all zero.
fn probabilities(
    b: &mut Builder,
    q: NodeId,
    k: NodeId,
    m: Option<NodeId>,
    causal: bool,
    mask: AttnMask,
) -> Built {
    let kt = b.transpose_last(k)?;
    let mut s = b.matmul(q, kt)?;
    let shape = b.shape(s);
    let dtype = b.dtype(s);
    let neg_inf = b.full(f64::NEG_INFINITY, &shape, dtype)?;
    match (mask, m) {
        (AttnMask::Additive, Some(m)) => s = b.add_(s, m)?,
        (AttnMask::Keep, Some(m)) => s = b.select(m, s, neg_inf)?,
        _ => {}
    }
    if causal {
        let keep = causal_keep(b, &shape)?;
        s = b.select(keep, s, neg_inf)?;
    }
    let mx = b.reduce(ReduceOp::Max, s, &[3], true)?;
    let row_shape = b.shape(mx);
    let row_inf = b.full(f64::NEG_INFINITY, &row_shape, dtype)?;
    let empty = b.compare(CompareOp::Eq, mx, row_inf)?;
    let zero = b.full(0.0, &row_shape, dtype)?;
    let mx = b.select(empty, zero, mx)?;
    let mx = b.expand(mx, &shape)?;
    let shifted = b.sub(s, mx)?;
    let e = b.unary(UnaryOp::Exp, shifted)?;
    let l = b.reduce(ReduceOp::Sum, e, &[3], true)?;
    let zero = b.full(0.0, &row_shape, dtype)?;
    let none = b.compare(CompareOp::Eq, l, zero)?;
    let one = b.full(1.0, &row_shape, dtype)?;
    let l = b.select(none, one, l)?;
    let l = b.expand(l, &shape)?;
    b.binary(BinaryOp::Div, e, l)
}

/// `j <= i` over `[b, h, sq, sk]`: the keys a causal query row keeps.
fn causal_keep(b: &mut Builder, shape: &Shape) -> Built {
    let (sq, sk) = (shape.0[2], shape.0[3]);
    let rows = b.arange(0, 1, sq, DType::I64)?;
    let rows = b.reshape(rows, &Shape::new([sq, 1]))?;
    let rows = b.expand(rows, &Shape::new([sq, sk]))?;
    let cols = b.arange(0, 1, sk, DType::I64)?;
    let cols = b.reshape(cols, &Shape::new([1, sk]))?;
    let cols = b.expand(cols, &Shape::new([sq, sk]))?;
    let keep = b.compare(CompareOp::Le, cols, rows)?;
    let keep = b.reshape(keep, &Shape::new([1, 1, sq, sk]))?;
    b.expand(keep, shape)
}
