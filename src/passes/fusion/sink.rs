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
//! with the GEMM, in the product's shape), and a reshape that no
//! elementwise op or reduction reads (a matmul reads a reshape as a free
//! view, so the chain gains nothing, and keeping it in its own shape lets
//! it join the row reduction it reads: GPT-2's layer norm output, reshaped
//! for the next projection, stayed a kernel apart from its mean and
//! variance). Bit for bit the same values: the same ops on the same
//! elements.

use crate::ir::{Graph, Node, NodeId, Op};

/// Sinks every reshape of an elementwise node that has no other reader
/// and is not an output, repeatedly (a reshape moved onto an elementwise
/// operand may move again); returns how many moved.
pub(super) fn sink_reshapes(graph: &mut Graph) -> usize {
    let mut moved = 0;
    loop {
        let mut changed = false;
        for id in graph.topo_order() {
            if !graph.contains(id) {
                continue;
            }
            let Op::Reshape(target) = graph.node(id).op.clone() else { continue };
            let [p] = graph.operands(id)[..] else { continue };
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
                continue;
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
            moved += 1;
            changed = true;
        }
        if !changed {
            return moved;
        }
    }
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
