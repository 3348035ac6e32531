//! The vector-Jacobian rules: for a node `y = f(x0, x1, ...)` and the
//! gradient `g` of the loss with respect to `y`, the gradient with respect
//! to each operand, written with the IR's own ops.
//!
//! Elementwise ops see operands of their own shape (broadcasting is an
//! explicit `expand`, whose rule sums back), so no rule here deals with
//! broadcasting. Ops whose result is not a float (comparisons, `argmax`,
//! casts to integers) never receive a gradient; integer and bool operands
//! (indices, conditions) never get one. Conventions follow PyTorch where a
//! derivative is undefined: `relu'(0) = 0`, `|x|'(0) = 0`, ties of
//! `maximum`/`minimum` split the gradient in half, ties of a `max`/`min`
//! reduction share it evenly, and `d(a^b)/db` is 0 where `a = 0, b >= 0`.

use super::build::{Builder, Built};
use super::window;
use crate::ir::{AttnLayout, BinaryOp, Collective, CompareOp, DType, NodeId, Op, ReduceOp, Shape, UnaryOp};

/// One node's rule: the gradient for each operand slot whose `wanted` is
/// true (`None` elsewhere). `y` is the node, `g` its gradient.
pub(super) fn vjp(
    b: &mut Builder,
    y: NodeId,
    g: NodeId,
    xs: &[NodeId],
    wanted: &[bool],
) -> Built<Vec<Option<NodeId>>> {
    let op = b.g.node(y).op.clone();
    let one = |r: Built| r.map(|n| vec![Some(n)]);
    match op {
        Op::Unary(u) => one(unary(b, u, xs[0], y, g)),
        Op::Binary(op) => binary(b, op, xs[0], xs[1], y, g, wanted),
        Op::Where => Ok(vec![
            None,
            if wanted[1] { Some(b.keep_where(xs[0], g)?) } else { None },
            if wanted[2] {
                let zero = b.zeros_like(g)?;
                Some(b.select(xs[0], zero, g)?)
            } else {
                None
            },
        ]),
        Op::Cast(_) => {
            let to = b.dtype(xs[0]);
            one(b.cast(g, to))
        }
        Op::Reduce { op, dims, keepdim: _, into } => {
            // A widening sum's gradient is the plain one narrowed back to
            // the operand's dtype (as `sum(cast(x))` differentiates).
            let spread = reduce(b, op, &dims, xs[0], y, g)?;
            one(match into {
                Some(_) => b.cast(spread, b.dtype(xs[0])),
                None => Ok(spread),
            })
        }
        Op::Reshape(_) => {
            let shape = b.shape(xs[0]);
            one(b.reshape(g, &shape))
        }
        Op::Permute(perm) => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            one(b.permute(g, &inverse))
        }
        Op::Expand(_) => {
            let shape = b.shape(xs[0]);
            one(b.sum_to(g, &shape))
        }
        Op::Slice { dim, start, step, len: _ } => {
            let n = b.shape(xs[0]).0[dim];
            one(b.place(g, dim, start, step, n, 0.0))
        }
        Op::MatMul => Ok(vec![
            match (wanted[0], b.is_transpose(xs[0])) {
                (false, _) => None,
                (true, false) => {
                    let bt = b.transpose_last(xs[1])?;
                    Some(b.matmul(g, bt)?)
                }
                // da = g bᵀ = (b gᵀ)ᵀ: see `Builder::is_transpose`.
                (true, true) => {
                    let gt = b.transpose_last(g)?;
                    let p = b.matmul(xs[1], gt)?;
                    Some(b.transpose_last(p)?)
                }
            },
            match (wanted[1], b.is_transpose(xs[1])) {
                (false, _) => None,
                (true, false) => {
                    let at = b.transpose_last(xs[0])?;
                    Some(b.matmul(at, g)?)
                }
                // db = aᵀ g = (gᵀ a)ᵀ: see `Builder::is_transpose`.
                (true, true) => {
                    let gt = b.transpose_last(g)?;
                    let p = b.matmul(gt, xs[0])?;
                    Some(b.transpose_last(p)?)
                }
            },
        ]),
        Op::Cat { dim } => {
            let mut out = Vec::with_capacity(xs.len());
            let mut offset = 0;
            for (&x, &w) in xs.iter().zip(wanted) {
                let len = b.shape(x).0[dim];
                out.push(if w { Some(b.slice(g, dim, offset, 1, len)?) } else { None });
                offset += len;
            }
            Ok(out)
        }
        Op::Gather { dim } => Ok(vec![Some(gather(b, dim, xs[0], xs[1], g)?), None]),
        Op::IndexSelect { dim } => {
            // A scatter-add of g into zeros: linear in the number of picked
            // rows, whatever the table's size (an embedding's gradient).
            let zero = b.zeros_like(xs[0])?;
            Ok(vec![Some(b.op(Op::IndexAdd { dim }, &[zero, xs[1], g])?), None])
        }
        Op::IndexAdd { dim } => Ok(vec![
            Some(g),
            None,
            if wanted[2] { Some(b.op(Op::IndexSelect { dim }, &[g, xs[1]])?) } else { None },
        ]),
        // The value flows through; the old value is only overwritten.
        Op::Assign => Ok(vec![None, Some(g)]),
        Op::WriteAt { dim } => Ok(vec![
            // The target's gradient is g with the window zeroed (it was
            // overwritten); the value's is g's window.
            if wanted[0] {
                let zero = b.zeros_like(xs[1])?;
                Some(b.op(Op::WriteAt { dim }, &[g, zero, xs[2]])?)
            } else {
                None
            },
            if wanted[1] { Some(write_window(b, dim, xs[0], xs[1], xs[2], g)?) } else { None },
            None,
        ]),
        Op::Attention { scale, causal, mask, layout: AttnLayout::Bhsd } => {
            super::attention::vjp(b, y, g, xs, wanted, scale, causal, mask)
        }
        // Only the `attention-layout` pass makes these, after autodiff ran.
        Op::Attention { layout: AttnLayout::Bshd, .. } => {
            Err("attention with layout=bshd has no gradient rule (the attention-layout pass makes it after autodiff; differentiate the bhsd attention)".into())
        }
        // Autodiff records these for an attention's gradient; a second
        // derivative through them is not written.
        Op::AttentionStats { .. } | Op::AttentionDelta | Op::AttentionGrad { .. } => {
            Err(format!("{} has no gradient (a second derivative of attention)", op.mnemonic()))
        }
        Op::Conv2d { stride, padding, dilation, groups } => {
            let conv = window::Conv { stride, padding, dilation, groups };
            Ok(vec![
                if wanted[0] { Some(conv.input_grad(b, g, xs[1], &b.shape(xs[0]))?) } else { None },
                if wanted[1] { Some(conv.weight_grad(b, g, xs[0], &b.shape(xs[1]))?) } else { None },
            ])
        }
        Op::Pool2d { kind, kernel, stride, padding } => {
            one(window::Pool { kind, kernel, stride, padding }.input_grad(b, xs[0], g))
        }
        // Piecewise constant in x; linear in g.
        Op::MaxPool2dGrad { kernel, stride, padding } => Ok(vec![
            None,
            if wanted[1] {
                let pool = window::Pool { kind: crate::ir::PoolKind::Max, kernel, stride, padding };
                Some(pool.max_grad_grad(b, xs[0], g)?)
            } else {
                None
            },
        ]),
        Op::Compare(_) => Ok(vec![None; xs.len()]),
        // The loss is the sum of every rank's: each rank's operand reaches
        // every rank's result, so its gradient is the sum (mean) of every
        // rank's incoming gradient, one more collective of the same kind,
        // numbered after every collective recorded so far (the backward
        // sweep meets them in one order on every rank).
        Op::Collective { what: c @ Collective::AllReduce(ReduceOp::Sum | ReduceOp::Mean), .. } => {
            let seq = b.g.next_effect_seq();
            one(b.op(Op::Collective { what: c, seq }, &[g]))
        }
        // A reduce-scatter's rank r result is chunk r of the sum, so operand k's gradient is every rank's incoming
        // gradient end to end (an all-gather), divided by the group's size
        // for the mean; an all-gather's operand k is chunk k of every
        // rank's result, so its gradient is chunk k of the sum of every
        // rank's incoming gradient (a reduce-scatter sum).
        Op::Collective { what: Collective::ReduceScatter { op: op @ (ReduceOp::Sum | ReduceOp::Mean), ranks }, .. } => {
            let seq = b.g.next_effect_seq();
            let gathered = b.op(Op::Collective { what: Collective::AllGather { ranks }, seq }, &[g])?;
            match op {
                ReduceOp::Mean => one(b.scale(gathered, 1.0 / ranks.max(1) as f64)),
                _ => one(Ok(gathered)),
            }
        }
        Op::Collective { what: Collective::AllGather { ranks }, .. } => {
            let seq = b.g.next_effect_seq();
            let what = Collective::ReduceScatter { op: ReduceOp::Sum, ranks };
            one(b.op(Op::Collective { what, seq }, &[g]))
        }
        Op::Collective { what: c, .. } => Err(format!(
            "{} has no gradient rule; detach its operand (only all_reduce_sum/mean, reduce_scatter_sum/mean and all_gather differentiate)",
            c.mnemonic()
        )),
        Op::Fused(_) | Op::Extra { .. } => {
            Err("a fused node has no gradient rule (autodiff runs on graphs before fusion)".into())
        }
        Op::Input(_) | Op::Buffer(_) | Op::Full(_) | Op::Arange { .. } | Op::Random { .. } => Ok(Vec::new()),
    }
}

fn unary(b: &mut Builder, op: UnaryOp, x: NodeId, y: NodeId, g: NodeId) -> Built {
    match op {
        UnaryOp::Neg => b.neg(g),
        UnaryOp::Abs => {
            // sign(x) * g, with sign(0) = 0.
            let zero = b.zeros_like(x)?;
            let pos = b.compare(CompareOp::Gt, x, zero)?;
            let neg = b.compare(CompareOp::Lt, x, zero)?;
            let minus_g = b.neg(g)?;
            let low = b.keep_where(neg, minus_g)?;
            b.select(pos, g, low)
        }
        UnaryOp::Exp => b.mul(g, y),
        UnaryOp::Log => b.div(g, x),
        // d sqrt(x) = 1 / (2 sqrt(x))
        UnaryOp::Sqrt => {
            let half = b.scale(g, 0.5)?;
            b.div(half, y)
        }
        // d x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3
        UnaryOp::Rsqrt => {
            let y2 = b.mul(y, y)?;
            let y3 = b.mul(y2, y)?;
            let t = b.mul(g, y3)?;
            b.scale(t, -0.5)
        }
        // d (1/x) = -1/x^2 = -y^2
        UnaryOp::Recip => {
            let y2 = b.mul(y, y)?;
            let t = b.mul(g, y2)?;
            b.neg(t)
        }
        UnaryOp::Sin => {
            let c = b.unary(UnaryOp::Cos, x)?;
            b.mul(g, c)
        }
        UnaryOp::Cos => {
            let s = b.unary(UnaryOp::Sin, x)?;
            let t = b.mul(g, s)?;
            b.neg(t)
        }
        // 1 - tanh^2
        UnaryOp::Tanh => {
            let y2 = b.mul(y, y)?;
            let one = b.full_like(y, 1.0)?;
            let d = b.sub(one, y2)?;
            b.mul(g, d)
        }
        // s (1 - s)
        UnaryOp::Sigmoid => {
            let one = b.full_like(y, 1.0)?;
            let c = b.sub(one, y)?;
            let d = b.mul(y, c)?;
            b.mul(g, d)
        }
        UnaryOp::Relu => {
            let zero = b.zeros_like(x)?;
            let pos = b.compare(CompareOp::Gt, x, zero)?;
            b.keep_where(pos, g)
        }
        // The activations' gradients are one op each, as PyTorch's
        // backward kernels are: computed in f32 for f16/bf16 and rounded
        // once. Under autocast the dozen ops of GELU's derivative each ran
        // in bf16 and rounded (GPT-2 small's GELU backward: 69 µs a layer
        // on an H200, compute-bound on the conversions).
        UnaryOp::Gelu => b.binary(BinaryOp::GeluGrad, x, g),
        UnaryOp::GeluTanh => b.binary(BinaryOp::GeluTanhGrad, x, g),
        UnaryOp::Silu => b.binary(BinaryOp::SiluGrad, x, g),
    }
}

fn binary(
    b: &mut Builder,
    op: BinaryOp,
    x0: NodeId,
    x1: NodeId,
    y: NodeId,
    g: NodeId,
    wanted: &[bool],
) -> Built<Vec<Option<NodeId>>> {
    let (ga, gb): (Option<NodeId>, Option<NodeId>) = match op {
        BinaryOp::Add => (Some(g), Some(g)),
        BinaryOp::Sub => (Some(g), if wanted[1] { Some(b.neg(g)?) } else { None }),
        BinaryOp::Mul => (
            if wanted[0] { Some(b.mul(g, x1)?) } else { None },
            if wanted[1] { Some(b.mul(g, x0)?) } else { None },
        ),
        // d/da = g / b;  d/db = -g a / b^2 = -(g / b) (a / b)
        BinaryOp::Div => {
            let q = b.div(g, x1)?;
            let gb = if wanted[1] {
                let t = b.mul(q, y)?;
                Some(b.neg(t)?)
            } else {
                None
            };
            (Some(q), gb)
        }
        BinaryOp::Pow => {
            // d/da = b a^(b-1);  d/db = a^b ln a, taken as 0 where a = 0 and b >= 0.
            let ga = if wanted[0] {
                let one = b.full_like(x1, 1.0)?;
                let e = b.sub(x1, one)?;
                let p = b.binary(BinaryOp::Pow, x0, e)?;
                let d = b.mul(x1, p)?;
                Some(b.mul(g, d)?)
            } else {
                None
            };
            let gb = if wanted[1] {
                let zero = b.zeros_like(x0)?;
                let a0 = b.compare(CompareOp::Eq, x0, zero)?;
                let bnn = b.compare(CompareOp::Ge, x1, zero)?;
                let cut = b.and(a0, bnn)?;
                let ln = b.unary(UnaryOp::Log, x0)?;
                let d = b.mul(y, ln)?;
                let gd = b.mul(g, d)?;
                let zero = b.zeros_like(gd)?;
                Some(b.select(cut, zero, gd)?)
            } else {
                None
            };
            (ga, gb)
        }
        BinaryOp::Maximum | BinaryOp::Minimum => {
            // The winner takes g; a tie splits it in half.
            let wins = if op == BinaryOp::Maximum { CompareOp::Gt } else { CompareOp::Lt };
            let tie = b.compare(CompareOp::Eq, x0, x1)?;
            let half = b.scale(g, 0.5)?;
            let zero = b.zeros_like(g)?;
            let side = |b: &mut Builder, me: NodeId, other: NodeId| -> Built {
                let win = b.compare(wins, me, other)?;
                let lose = b.select(tie, half, zero)?;
                b.select(win, g, lose)
            };
            (
                if wanted[0] { Some(side(b, x0, x1)?) } else { None },
                if wanted[1] { Some(side(b, x1, x0)?) } else { None },
            )
        }
        // Linear in g: d/dg = f'(x) = op(x, 1) · g. The second derivative
        // of the activation (d/dx) is not implemented.
        BinaryOp::GeluTanhGrad | BinaryOp::GeluGrad | BinaryOp::SiluGrad => {
            if wanted[0] {
                return Err(format!(
                    "{} has no gradient with respect to x: second derivatives of activations are not supported",
                    op.mnemonic()
                ));
            }
            (None, Some(b.binary(op, x0, g)?))
        }
    };
    Ok(vec![ga.filter(|_| wanted[0]), gb.filter(|_| wanted[1])])
}

fn reduce(b: &mut Builder, op: ReduceOp, dims: &[usize], x: NodeId, y: NodeId, g: NodeId) -> Built {
    let shape = b.shape(x);
    let spread = b.unreduce(g, dims, &shape)?;
    match op {
        ReduceOp::Sum => Ok(spread),
        ReduceOp::Mean => {
            let count: usize = dims.iter().map(|&d| shape.0[d]).product();
            b.scale(spread, 1.0 / count as f64)
        }
        ReduceOp::Max | ReduceOp::Min => {
            // Every position equal to the extreme shares g evenly.
            let extreme = b.unreduce(y, dims, &shape)?;
            let hit = b.compare(CompareOp::Eq, x, extreme)?;
            let dtype = b.dtype(x);
            let mask = b.cast(hit, dtype)?;
            let count = b.reduce(ReduceOp::Sum, mask, dims, true)?;
            let count = b.expand(count, &shape)?;
            let share = b.div(mask, count)?;
            b.mul(spread, share)
        }
        ReduceOp::ArgMax => Err("argmax has no gradient (its result is an index)".into()),
    }
}

/// `one_hot[.., k] = (index[..] == k)` for `k < classes`, in `dtype`: the
/// index with a new last dim of size `classes`.
fn one_hot(b: &mut Builder, index: NodeId, classes: usize, dtype: DType) -> Built {
    let ishape = b.shape(index);
    let mut column = ishape.clone();
    column.0.push(1);
    let mut full = ishape.clone();
    full.0.push(classes);
    let idx = b.reshape(index, &column)?;
    let idx = b.expand(idx, &full)?;
    let range = b.arange(0, 1, classes, b.dtype(index))?;
    let mut row = Shape(vec![1; ishape.rank()]);
    row.0.push(classes);
    let range = b.reshape(range, &row)?;
    let range = b.expand(range, &full)?;
    let hit = b.compare(CompareOp::Eq, idx, range)?;
    b.cast(hit, dtype)
}

/// `gather`'s rule where the index picks one position along `dim` per row
/// (a cross-entropy's target logit): `dx = (index == k) * g + 0`, every
/// operand an expanded view of the index, the classes or `g`, in `x`'s
/// shape. So the whole gradient is one elementwise expression that fusion
/// puts in its reader's kernel; the general rule's one-hot product over an
/// extra dim, summed over it, was a kernel of its own and a tensor of the
/// logits' size kept through the backward pass (0.9 ms of a GPT-2 step).
/// `+ 0` gives +0.0 where the product is -0.0, as PyTorch's scatter into
/// zeros does.
fn gather_one(b: &mut Builder, dim: usize, xshape: &Shape, dtype: DType, index: NodeId, g: NodeId) -> Built {
    let idx = b.expand(index, xshape)?;
    let range = b.arange(0, 1, xshape.0[dim], b.dtype(index))?;
    let mut along = Shape(vec![1; xshape.rank()]);
    along.0[dim] = xshape.0[dim];
    let range = b.reshape(range, &along)?;
    let range = b.expand(range, xshape)?;
    let hit = b.compare(CompareOp::Eq, idx, range)?;
    let hot = b.cast(hit, dtype)?;
    let spread = b.expand(g, xshape)?;
    let dx = b.mul(hot, spread)?;
    let zero = b.full(0.0, xshape, dtype)?;
    b.add_(dx, zero)
}

/// The window of `g` that `write_at(x, value, offset)` along `dim` wrote:
/// a gather at the clamped offset plus `0..len` along `dim`, the op's own
/// clamp, so the gradient reads exactly the elements the write replaced.
fn write_window(b: &mut Builder, dim: usize, x: NodeId, value: NodeId, offset: NodeId, g: NodeId) -> Built {
    let vshape = b.shape(value);
    let len = vshape.0[dim];
    let last = (b.shape(x).0[dim] - len) as f64;
    let it = b.dtype(offset);
    let scalar = Shape::scalar();
    let (lo, hi) = (b.full(0.0, &scalar, it)?, b.full(last, &scalar, it)?);
    let clamped = b.binary(BinaryOp::Maximum, offset, lo)?;
    let clamped = b.binary(BinaryOp::Minimum, clamped, hi)?;
    let ones = Shape(vec![1; vshape.rank()]);
    let start = b.reshape(clamped, &ones)?;
    let start = b.expand(start, &vshape)?;
    let mut along = ones.clone();
    along.0[dim] = len;
    let steps = b.arange(0, 1, len, it)?;
    let steps = b.reshape(steps, &along)?;
    let steps = b.expand(steps, &vshape)?;
    let index = b.add_(start, steps)?;
    b.op(Op::Gather { dim }, &[g, index])
}

/// `gather`'s rule, a scatter-add written as a one-hot product:
/// `dx[.., k, ..] = Σ_i g[.., i, ..] (index[.., i, ..] == k)` along `dim`,
/// zeros where the index is smaller than `x` in the other dims.
fn gather(b: &mut Builder, dim: usize, x: NodeId, index: NodeId, g: NodeId) -> Built {
    let xshape = b.shape(x);
    let dtype = b.dtype(x);
    let ishape = b.shape(index);
    let rank = ishape.rank();
    let classes = xshape.0[dim];
    let one_per_row = ishape.0[dim] == 1 && (0..rank).all(|d| d == dim || ishape.0[d] == xshape.0[d]);
    if one_per_row {
        return gather_one(b, dim, &xshape, dtype, index, g);
    }
    let hot = one_hot(b, index, classes, dtype)?;
    let hot_shape = b.shape(hot);
    let mut column = ishape.clone();
    column.0.push(1);
    let gc = b.reshape(g, &column)?;
    let gc = b.expand(gc, &hot_shape)?;
    let weighted = b.mul(hot, gc)?;
    // Sum over the gathered positions, then put the class dim where `dim` was.
    let summed = b.reduce(ReduceOp::Sum, weighted, &[dim], false)?;
    let mut perm: Vec<usize> = (0..rank - 1).collect();
    perm.insert(dim, rank - 1);
    let mut dx = b.permute(summed, &perm)?;
    for (d, (&have, &want)) in ishape.0.iter().zip(&xshape.0).enumerate() {
        if d != dim && have < want {
            dx = b.crop(dx, d, 0, want)?;
        }
    }
    Ok(dx)
}
