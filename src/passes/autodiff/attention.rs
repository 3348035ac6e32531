//! The gradient of [`Op::Attention`](crate::ir::Op::Attention). The
//! forward node never stores the attention probabilities `P`
//! (`softmax(scale q kᵀ + mask)`, removed keys as `-inf`, a row with no
//! key left as zeros, as the kernels define it), so the gradient
//! recomputes them and applies the usual identities:
//!
//! ```text
//! dv = Pᵀ g            dP = g vᵀ
//! dS = P ⊙ (dP - delta),  delta = rowsum(dP ⊙ P) = rowsum(g ⊙ o)
//! dq = dS (scale · k)  dk = dSᵀ (scale · q)  dmask = dS (additive masks)
//! ```
//!
//! Autodiff records it as three nodes that never hold the `[sq, sk]`
//! matrices: [`Op::AttentionStats`] (each query row's log-sum-exp `lse`
//! and `delta` from the forward's output `o`), then [`Op::AttentionGrad`]
//! for `dq` and for `dk` and `dv` side by side (one kernel computes both:
//! they share `P = e^(s - lse)`). The `attention-grad` pass keeps them
//! where a fused kernel runs them (f16 and bf16 heads the tensor-core
//! kernels take) and replaces the rest by their definition with the IR's
//! own ops ([`expand`]; fused into a few kernels by the fusion pass, f32
//! products then run on cuBLAS, which beats a CUDA-core fused kernel).
//! Of a kept stats node, the multi-output pass later has the forward write
//! the `lse` (`extra %attention output=1`) and leaves only `delta` to
//! compute ([`Op::AttentionDelta`](crate::ir::Op::AttentionDelta)). An
//! additive mask whose gradient is wanted takes the materialized form
//! (`P` as a softmax, `delta = rowsum(dP ⊙ P)`) directly: its gradient is
//! `dS` itself, a `[sq, sk]` matrix.
//!
//! The scale is applied to the operands of each product, never to its
//! result: the products run in the low type under autocast (f16 or an
//! f16 model), and `q kᵀ` of a 64-wide head with entries of 32 is 65536,
//! inf in f16, although `scale · q kᵀ` (8192) is not. So the scores are
//! `(√scale · q)(√scale · k)ᵀ`, as PyTorch's math path computes them, and
//! the gradients take `scale · k` and `scale · q` (the scale is at most 1
//! for the default `1/√d`, so no operand grows). The kernels accumulate
//! in f32 and never had the problem.

use super::build::{Builder, Built};
use crate::ir::{AttnMask, AttnWrt, BinaryOp, CompareOp, DType, Graph, NodeId, Op, ReduceOp, Shape, UnaryOp};

/// The gradients of q, k, v and the mask (for the slots `wanted`) of the
/// attention node `y`.
#[allow(clippy::too_many_arguments)]
pub(super) fn vjp(
    b: &mut Builder,
    y: NodeId,
    g: NodeId,
    xs: &[NodeId],
    wanted: &[bool],
    scale: f64,
    causal: bool,
    mask: AttnMask,
) -> Built<Vec<Option<NodeId>>> {
    let mask_grad = mask == AttnMask::Additive && wanted.get(3).copied().unwrap_or(false);
    if mask_grad {
        return expanded(b, g, xs, wanted, scale, causal, mask);
    }
    let (q, k, v) = (xs[0], xs[1], xs[2]);
    let m = xs.get(3).copied();
    let with_mask = |mut ops: Vec<NodeId>| {
        ops.extend(m);
        ops
    };
    let stats = b.op(Op::AttentionStats { scale, causal, mask }, &with_mask(vec![q, k, y, g]))?;
    let grad = |b: &mut Builder, wrt| {
        b.op(Op::AttentionGrad { scale, causal, mask, wrt }, &with_mask(vec![q, k, v, g, stats]))
    };
    let mut out = vec![None; xs.len()];
    if wanted[0] {
        out[0] = Some(grad(b, AttnWrt::Query)?);
    }
    if wanted[1] || wanted[2] {
        let kv = grad(b, AttnWrt::KeyValue)?;
        let (d, dv) = (b.shape(k).0[3], b.shape(v).0[3]);
        if wanted[1] {
            out[1] = Some(b.slice(kv, 3, 0, 1, d)?);
        }
        if wanted[2] {
            out[2] = Some(b.slice(kv, 3, d, 1, dv)?);
        }
    }
    Ok(out)
}

/// Replaces the [`Op::AttentionStats`] or [`Op::AttentionGrad`] node `id`
/// by its definition in the IR's own ops (see [`expand_stats`] and
/// [`expand_grad`]); the caller removes `id`. A `kv` gradient's slices of
/// the keys' or the values' columns are replaced by those gradients (and
/// removed), and a `cat` of the two is built only for other readers.
/// Gives the nodes it replaced.
pub(crate) fn expand(graph: &mut Graph, id: NodeId) -> Result<usize, String> {
    let node = graph.node(id).clone();
    let ops = graph.operands(id);
    let mut b = Builder { g: graph, region: node.region };
    let (scale, causal, mask, wrt) = match node.op {
        Op::AttentionStats { scale, causal, mask } => {
            let stats = expand_stats(&mut b, &ops, scale, causal, mask, node.dtype)?;
            graph.replace_all_uses(id, stats);
            return Ok(1);
        }
        Op::AttentionGrad { scale, causal, mask, wrt } => (scale, causal, mask, wrt),
        _ => return Err(format!("{id} is not an attention_stats or attention_grad")),
    };
    if wrt == AttnWrt::QueryKeyValue {
        // The three gradients, each `[b, h, s, d]`, into `[b, s, 3, h, d]`.
        let (dq, _, _) = expand_grad(&mut b, &ops, scale, causal, mask, AttnWrt::Query)?;
        let (_, dk, dv) = expand_grad(&mut b, &ops, scale, causal, mask, AttnWrt::KeyValue)?;
        let mut parts = Vec::new();
        for x in [dq, dk, dv] {
            let x = x.ok_or_else(|| "the expanded attention gradient lacks a part".to_string())?;
            let x = b.permute(x, &[0, 2, 1, 3])?;
            let [bs, s, h, d] = b.shape(x).0[..] else { return Err("a rank-4 attention gradient".into()) };
            parts.push(b.reshape(x, &Shape(vec![bs, s, 1, h, d]))?);
        }
        let packed = b.cat(&parts, 2)?;
        graph.replace_all_uses(id, packed);
        return Ok(1);
    }
    if wrt == AttnWrt::KeyValueAndQuery {
        // The queries' gradient (`extra output=1`) to its readers; the
        // rest is a `kv` gradient's.
        let (dq, _, _) = expand_grad(&mut b, &ops, scale, causal, mask, AttnWrt::Query)?;
        let dq = dq.ok_or_else(|| "the expanded attention gradient lacks a part".to_string())?;
        for user in graph.users(id) {
            if graph.node(user).op == (Op::Extra { output: 1 }) {
                graph.replace_all_uses(user, dq);
                graph.remove(user);
            }
        }
    }
    let mut b = Builder { g: graph, region: node.region };
    let (dq, dk, dv) = expand_grad(&mut b, &ops, scale, causal, mask, wrt)?;
    if let Some(dq) = dq {
        graph.replace_all_uses(id, dq);
        return Ok(1);
    }
    let missing = || "the expanded attention gradient lacks a part".to_string();
    let (dk, dv) = (dk.ok_or_else(missing)?, dv.ok_or_else(missing)?);
    let d = graph.node(dk).shape.0[3];
    let mut replaced = 0;
    for user in graph.users(id) {
        let Op::Slice { dim: 3, start, step: 1, len } = graph.node(user).op else { continue };
        let (part, at) = if start + len <= d {
            (dk, start)
        } else if start >= d {
            (dv, start - d)
        } else {
            continue;
        };
        let part_len = graph.node(part).shape.0[3];
        let piece = if at == 0 && len == part_len {
            part
        } else {
            let mut b = Builder { g: graph, region: node.region };
            b.slice(part, 3, at, 1, len)?
        };
        graph.replace_all_uses(user, piece);
        graph.remove(user);
        replaced += 1;
    }
    if !graph.users(id).is_empty() || graph.outputs().contains(&id) {
        let mut b = Builder { g: graph, region: node.region };
        let cat = b.cat(&[dk, dv], 3)?;
        graph.replace_all_uses(id, cat);
    }
    Ok(replaced + 1)
}

/// The type an expansion computes its softmax in: f32 for f16 and bf16
/// (as autocast runs reductions and `exp`; the products stay in the low
/// type), the operands' own type otherwise.
fn wide(dtype: DType) -> DType {
    if matches!(dtype, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dtype
    }
}

/// `x` as `to` (itself when it is `to` already).
fn as_type(b: &mut Builder, x: NodeId, to: DType) -> Built {
    if b.dtype(x) == to {
        Ok(x)
    } else {
        b.cast(x, to)
    }
}

/// The scores `scale q kᵀ + mask` of operands `q, k, ..` (removed keys
/// `-inf`) in the wide type of `q`; the products run in `q`'s type on
/// operands scaled by `√scale` (see the module docs).
fn wide_scores(
    b: &mut Builder,
    q: NodeId,
    k: NodeId,
    m: Option<NodeId>,
    scale: f64,
    causal: bool,
    mask: AttnMask,
) -> Built {
    let root = scale.sqrt();
    let (q_root, k_root) = (b.scale(q, root)?, b.scale(k, root)?);
    let kt = b.transpose_last(k_root)?;
    let s = b.matmul(q_root, kt)?;
    let acc = wide(b.dtype(q));
    let s = as_type(b, s, acc)?;
    let m = match (mask, m) {
        (AttnMask::Additive, Some(m)) => Some(as_type(b, m, acc)?),
        (_, m) => m,
    };
    masked(b, s, m, causal, mask)
}

/// `attention_stats q, k, o, g [, mask]`: `lse` (the scores' log-sum-exp,
/// `+inf` for a row with no key) beside `delta = Σ o g`, cast to
/// `dtype`.
fn expand_stats(
    b: &mut Builder,
    ops: &[NodeId],
    scale: f64,
    causal: bool,
    mask: AttnMask,
    dtype: DType,
) -> Built {
    let (q, k, o, g) = (ops[0], ops[1], ops[2], ops[3]);
    let s = wide_scores(b, q, k, ops.get(4).copied(), scale, causal, mask)?;
    let acc = b.dtype(s);
    let Rows { mx, empty, l, .. } = shifted_exp(b, s)?;
    let row_shape = b.shape(mx);
    let log = b.unary(UnaryOp::Log, l)?;
    let lse = b.add_(log, mx)?;
    let inf = b.full(f64::INFINITY, &row_shape, acc)?;
    let lse = b.select(empty, inf, lse)?;
    let (o, g) = (as_type(b, o, acc)?, as_type(b, g, acc)?);
    let og = b.mul(o, g)?;
    let delta = b.reduce(ReduceOp::Sum, og, &[3], true)?;
    let stats = b.cat(&[lse, delta], 3)?;
    as_type(b, stats, dtype)
}

/// `attention_grad q, k, v, g, stats [, mask]` as `(dq, dk, dv)` (`dq`
/// for `wrt=q`, `dk` and `dv` for `wrt=kv`): `P = e^(s - lse)` and `dS =
/// P (g vᵀ - delta)` in the wide type, the products in the operands'.
fn expand_grad(
    b: &mut Builder,
    ops: &[NodeId],
    scale: f64,
    causal: bool,
    mask: AttnMask,
    wrt: AttnWrt,
) -> Built<(Option<NodeId>, Option<NodeId>, Option<NodeId>)> {
    let (q, k, v, g, stats) = (ops[0], ops[1], ops[2], ops[3], ops[4]);
    let low = b.dtype(q);
    let s = wide_scores(b, q, k, ops.get(5).copied(), scale, causal, mask)?;
    let (shape, acc) = (b.shape(s), b.dtype(s));
    let row = |b: &mut Builder, at: usize| -> Built {
        let x = b.slice(stats, 3, at, 1, 1)?;
        let x = as_type(b, x, acc)?;
        b.expand(x, &shape)
    };
    let lse = row(b, 0)?;
    let shifted = b.sub(s, lse)?;
    let p = b.unary(UnaryOp::Exp, shifted)?;
    let vt = b.transpose_last(v)?;
    let dp = b.matmul(g, vt)?;
    let dp = as_type(b, dp, acc)?;
    let delta = row(b, 1)?;
    let centered = b.sub(dp, delta)?;
    let ds = b.mul(p, centered)?;
    let ds = as_type(b, ds, low)?;
    if wrt == AttnWrt::Query {
        let k_scaled = b.scale(k, scale)?;
        return Ok((Some(b.matmul(ds, k_scaled)?), None, None));
    }
    let dst = b.transpose_last(ds)?;
    let q_scaled = b.scale(q, scale)?;
    let dk = b.matmul(dst, q_scaled)?;
    let p = as_type(b, p, low)?;
    let pt = b.transpose_last(p)?;
    let dv = b.matmul(pt, g)?;
    Ok((None, Some(dk), Some(dv)))
}

/// The gradients of q, k, v and the mask (for the slots `wanted`), through
/// the recomputed `[sq, sk]` probabilities.
fn expanded(
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
    let s = b.matmul(q, kt)?;
    let s = masked(b, s, m, causal, mask)?;
    let (shape, dtype) = (b.shape(s), b.dtype(s));
    let Rows { e, l, .. } = shifted_exp(b, s)?;
    let row_shape = b.shape(l);
    let zero = b.full(0.0, &row_shape, dtype)?;
    let none = b.compare(CompareOp::Eq, l, zero)?;
    let one = b.full(1.0, &row_shape, dtype)?;
    let l = b.select(none, one, l)?;
    let l = b.expand(l, &shape)?;
    b.binary(BinaryOp::Div, e, l)
}

/// What [`shifted_exp`] gives, per row of the keys.
struct Rows {
    /// The row maximum, 0 for a row with no key left.
    mx: NodeId,
    /// Whether the row has no key left (its maximum is `-inf`).
    empty: NodeId,
    /// `e^(s - mx)` over the whole `[.., sq, sk]`.
    e: NodeId,
    /// The row sums of `e` (0 for an empty row).
    l: NodeId,
}

/// The softmax's shared start over the keys of scores `s`: the row
/// maximum (0 where every key is removed, so that `s - mx` is `-inf`, not
/// NaN), `e = e^(s - mx)` and its row sums.
fn shifted_exp(b: &mut Builder, s: NodeId) -> Built<Rows> {
    let (shape, dtype) = (b.shape(s), b.dtype(s));
    let mx = b.reduce(ReduceOp::Max, s, &[3], true)?;
    let row_shape = b.shape(mx);
    let row_inf = b.full(f64::NEG_INFINITY, &row_shape, dtype)?;
    let empty = b.compare(CompareOp::Eq, mx, row_inf)?;
    let zero = b.full(0.0, &row_shape, dtype)?;
    let mx = b.select(empty, zero, mx)?;
    let wide_mx = b.expand(mx, &shape)?;
    let shifted = b.sub(s, wide_mx)?;
    let e = b.unary(UnaryOp::Exp, shifted)?;
    let l = b.reduce(ReduceOp::Sum, e, &[3], true)?;
    Ok(Rows { mx, empty, e, l })
}

/// The scores `s` with the mask applied: added, or `-inf` where a bool
/// mask or causality removes a key.
fn masked(b: &mut Builder, mut s: NodeId, m: Option<NodeId>, causal: bool, mask: AttnMask) -> Built {
    let shape = b.shape(s);
    let neg_inf = b.full(f64::NEG_INFINITY, &shape, b.dtype(s))?;
    match (mask, m) {
        (AttnMask::Additive, Some(m)) => s = b.add_(s, m)?,
        (AttnMask::Keep, Some(m)) => s = b.select(m, s, neg_inf)?,
        _ => {}
    }
    if causal {
        let keep = causal_keep(b, &shape)?;
        s = b.select(keep, s, neg_inf)?;
    }
    Ok(s)
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
