//! Reshapes of computed elementwise values, moved to their operands.
//!
//! A view of a computed value ends that value's fusion group (see the
//! module docs of `fusion`). For a `reshape` of an elementwise node read
//! by nothing else that is not needed: an elementwise op computes each
//! element from the elements at the same position of its operands, and a
//! reshape keeps every element's row-major position, so
//! `reshape(f(a, b)) = f(reshape(a), reshape(b))`. Rewritten that way, the
//! node lands in its reader's group, and the reshapes reach the values
//! the chain starts from, where they are free leaf views. GPT-2's loss
//! gradient (`[B·T, V]`, reshaped to `[B, T, V]` for the LM head) was
//! written in f32 and cast to bf16 by a kernel of its own.
//!
//! Left alone: a chain that reads a matmul's product (its epilogue stays
//! with the GEMM, in the product's shape; [`hoist_reshapes_over_epilogues`]
//! moves a reshape of the product below its bias instead), and a reshape that no
//! elementwise op or reduction reads (a matmul reads a reshape as a free
//! view, so the chain gains nothing, and keeping it in its own shape lets
//! it join the row reduction it reads: GPT-2's layer norm output, reshaped
//! for the next projection, stayed a kernel apart from its mean and
//! variance). Bit for bit the same values: the same ops on the same
//! elements.

use crate::ir::{DType, Graph, Node, NodeId, Op, Shape};

/// Sinks every reshape of an elementwise node that has no other reader
/// and is not an output, repeatedly (a reshape moved onto an elementwise
/// operand may move again); returns how many moved.
pub(super) fn sink_reshapes(graph: &mut Graph) -> usize {
    each_reshape(graph, |graph, id, target, p| {
        let producer = graph.node(p).clone();
        let joins =
            |u: NodeId| elementwise(&graph.node(u).op) || matches!(graph.node(u).op, Op::Reduce { .. });
        let users = graph.users(id);
        if !elementwise(&producer.op)
            || users.is_empty()
            || !users.into_iter().all(joins)
            || graph.users(p) != [id]
            || graph.outputs().contains(&p)
            || (epilogue(graph, p) && !widens_product(graph, p))
        {
            return 0;
        }
        let operands: Vec<NodeId> = graph
            .operands(p)
            .into_iter()
            .map(|o| {
                let node = Node {
                    op: Op::Reshape(target.clone()),
                    shape: target.clone(),
                    dtype: graph.node(o).dtype,
                    region: graph.node(id).region,
                };
                graph.add_unchecked(node, &[o])
            })
            .collect();
        let rebuilt = graph.add_unchecked(Node { shape: target.clone(), ..producer }, &operands);
        graph.replace_all_uses(id, rebuilt);
        // Both are read by nothing now; removed, so that the users
        // counted above stay exact for the next reshape.
        graph.remove(id);
        graph.remove(p);
        1
    })
}

/// Moves a reshape of a matmul's product (or of its epilogue) below the
/// elementwise ops that read it, where their other operands are values
/// broadcast along the product's rows (a bias, a scalar) and the reshape
/// keeps the last dimension: `f(reshape(p), expand(b))` becomes
/// `reshape(f(p, expand(b)))`, the same ops on the same elements (a
/// reshape that keeps the last dim keeps each element's column, and `b`
/// depends on the column alone), repeatedly. `x.matmul(wᵀ) + b` with `x`
/// `[batch, seq, in]` is one GEMM over `[batch · seq, in]` reshaped back to
/// three dims before the bias (`Tensor::matmul`), so the bias was a group
/// of the reshaped shape that could not join the GEMM: BERT-base's 36
/// query, key and value biases were kernels of 5.5 µs each on an H200
/// that cuBLASLt's bias epilogue adds for free. Not moved over casts
/// (the reshape sinks back over a widening one, see [`widens_product`]),
/// nor over an op wider than the product (an autocast bias added in f32
/// after the bf16 product widens: moved, it made the GEMM store f32, and
/// a 2-layer GPT-2 bf16 training step took 108 launches instead of 98;
/// 96 now). Returns how many moved.
pub(super) fn hoist_reshapes_over_epilogues(graph: &mut Graph) -> usize {
    each_reshape(graph, |graph, id, target, p| {
        let product = graph.node(p).shape.clone();
        let keeps_columns = product.rank() >= 1 && target.0.last() == product.0.last();
        // `p` is a product or an epilogue chain reading one, of this dtype.
        let Some(narrowest) = product_dtype(graph, p).filter(|_| keeps_columns) else { return 0 };
        let mut moved = 0;
        for e in graph.users(id) {
            let node = graph.node(e).clone();
            if !elementwise(&node.op)
                || matches!(node.op, Op::Cast(_))
                || super::widens_float(narrowest, node.dtype)
            {
                continue;
            }
            let operands = graph.operands(e);
            if !operands.iter().all(|&o| o == id || by_column(graph, o)) {
                continue;
            }
            let rebuilt: Vec<NodeId> = operands
                .iter()
                .map(|&o| if o == id { p } else { column_broadcast(graph, o, &product) })
                .collect();
            let inner = graph.add_unchecked(Node { shape: product.clone(), ..node.clone() }, &rebuilt);
            let back = Node {
                op: Op::Reshape(target.clone()),
                shape: target.clone(),
                dtype: node.dtype,
                region: node.region,
            };
            let outer = graph.add_unchecked(back, &[inner]);
            graph.replace_all_uses(e, outer);
            graph.remove(e);
            moved += 1;
        }
        if graph.users(id).is_empty() && !graph.outputs().contains(&id) {
            graph.remove(id);
        }
        moved
    })
}

/// Calls `rewrite(graph, reshape, target, operand)` on each reshape of
/// one operand in topological order, again and again until a whole walk
/// rewrites nothing (a moved reshape may move again); returns the sum of
/// what the calls returned (how many rewrites each made).
fn each_reshape(
    graph: &mut Graph,
    mut rewrite: impl FnMut(&mut Graph, NodeId, Shape, NodeId) -> usize,
) -> usize {
    let mut total = 0;
    loop {
        let mut changed = false;
        for id in graph.topo_order() {
            if !graph.contains(id) {
                continue;
            }
            let Op::Reshape(target) = graph.node(id).op.clone() else { continue };
            let [p] = graph.operands(id)[..] else { continue };
            let n = rewrite(graph, id, target, p);
            total += n;
            changed |= n > 0;
        }
        if !changed {
            return total;
        }
    }
}

/// The dtype of the matmul product `p`'s chain starts from (`p` itself or
/// through elementwise ops), if any.
fn product_dtype(graph: &Graph, p: NodeId) -> Option<DType> {
    let mut n = p;
    loop {
        match graph.node(n).op {
            Op::MatMul => return Some(graph.node(n).dtype),
            ref op if elementwise(op) => {
                n = *graph.operands(n).iter().find(|&&o| epilogue_or_product(graph, o))?;
            }
            _ => return None,
        }
    }
}

/// Whether `o` is a matmul's product or an elementwise chain reading one.
fn epilogue_or_product(graph: &Graph, o: NodeId) -> bool {
    matches!(graph.node(o).op, Op::MatMul) || (elementwise(&graph.node(o).op) && epilogue(graph, o))
}

/// Whether `o` is an `expand` whose source varies along the last
/// dimension at most (a bias `[n]`, `[1, 1, n]`, a scalar).
fn by_column(graph: &Graph, o: NodeId) -> bool {
    let Op::Expand(_) = graph.node(o).op else { return false };
    let [src] = graph.operands(o)[..] else { return false };
    let dims = &graph.node(src).shape.0;
    dims.iter().rev().skip(1).all(|&d| d == 1)
}

/// The column broadcast `o` ([`by_column`]) over `product`'s shape: its
/// source as `[n]` (its last dim: all others are 1), expanded.
fn column_broadcast(graph: &mut Graph, o: NodeId, product: &Shape) -> NodeId {
    let [src] = graph.operands(o)[..] else { return o };
    let (dtype, region) = (graph.node(src).dtype, graph.node(o).region);
    let n = graph.node(src).shape.0.last().copied().unwrap_or(1);
    let flat = if graph.node(src).shape.rank() == 1 {
        src
    } else {
        let shape = Shape::new([n]);
        graph.add_unchecked(Node { op: Op::Reshape(shape.clone()), shape, dtype, region }, &[src])
    };
    graph.add_unchecked(
        Node { op: Op::Expand(product.clone()), shape: product.clone(), dtype, region },
        &[flat],
    )
}

/// Whether `p`'s elementwise chain reads a matmul's product directly: a
/// GEMM epilogue (bias, activation), which fusion keeps with the GEMM in
/// the product's shape; moving the reshape into it would leave the GEMM
/// without its epilogue (an attention block's projection, reshaped into
/// heads).
fn epilogue(graph: &Graph, p: NodeId) -> bool {
    let mut stack = vec![p];
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        for o in graph.operands(n) {
            match graph.node(o).op {
                Op::MatMul => return true,
                ref op if elementwise(op) => stack.push(o),
                _ => {}
            }
        }
    }
    false
}

/// Whether `p` only widens a matmul's product (bf16 or f16 to f32 or
/// f64, f32 to f64). That is no epilogue worth the GEMM's shape: fusion
/// recomputes a widening cast in each reader's body from the narrow value
/// (`group.rs`, `duplicate`), so once the reshape moves above it the GEMM
/// writes its narrow product, half the bytes, and its readers widen as
/// they read. Kept as the GEMM's epilogue, the cast made cuBLAS store
/// f32: GPT-2 small's `[4096, 768] x [768, 768]` bf16 products took
/// 20.6 µs each storing f32 and take 12.5 storing bf16, its `[4096, 3072]
/// x [3072, 768]` ones 31.1 and 29.0 (H200, 2026-11-29).
fn widens_product(graph: &Graph, p: NodeId) -> bool {
    let Op::Cast(to) = graph.node(p).op else { return false };
    let [o] = graph.operands(p)[..] else { return false };
    matches!(graph.node(o).op, Op::MatMul) && super::widens_float(graph.node(o).dtype, to)
}

/// Ops that compute each element from the same position of their
/// operands, all of the result's shape.
fn elementwise(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Cast(_))
}
