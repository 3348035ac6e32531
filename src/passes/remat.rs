//! Rematerialization: the backward pass recomputes the cheap elementwise
//! values of the forward pass it reads, instead of reading them kept.
//!
//! *Why.* Fusion never duplicates compute (`fusion.rs`), so a forward
//! value that the backward pass also reads is materialized: its group
//! ends there, it is written to memory, and it stays live until the
//! backward pass reads it. In a transformer's training step that cut every
//! elementwise chain at each intermediate: GPT-2's tanh GELU ran as five
//! kernels and kept four activations of the MLP's width per layer, and a
//! layer norm's normalize and scale two more. Recomputing those values in
//! the backward pass from the values the chain starts from (a matmul's
//! product, a reduction's rows, an input), as PyTorch's compiler does by
//! default, lets the forward chain fuse into one kernel and frees its
//! intermediates as soon as the forward pass is done with them.
//!
//! *Does.* For every *cheap* node (`unary`, `binary`, `compare`, `where`,
//! `cast`: elementwise work with no state and no randomness) outside the
//! `grad` region (autodiff's, [`crate::passes::autodiff`]) that has users
//! both outside and inside `grad`, adds a copy of the node for each of its
//! readers inside `grad`, in the matching `grad/...` region (the region
//! autodiff gives the gradient of a node of that region), so that fusion
//! puts each copy in its reader's kernel. Nodes are visited from the
//! outputs back, so a copy's operands are considered after it: a chain of
//! cheap nodes is copied down to the values it starts from, which both
//! passes read. Only readers that fusion can give the copy to (an
//! elementwise op, a reduction's prologue) get one: a view or a matmul in
//! `grad` would make the copy a kernel of its own (relu recomputed as a
//! kernel for its weight gradient's matmul), so it reads the forward value
//! as before. Copies per reader multiply along diamonds of cheap nodes,
//! so once they reach twice the graph's node count, each further node gets
//! one copy shared by its readers in `grad`. A chain is recomputed only
//! while it reads at most twice the bytes of the value it recomputes
//! (`READ_LIMIT`): a node past that is kept, and its users' chains start
//! from it, so the residual stream of a transformer is not recomputed
//! from every earlier layer's output.
//!
//! *Does not.* Copy a reduction, a matmul, a gather, a random source or
//! any op with an effect (those run once, as before), a view (free, and a
//! view of a computed value ends a fusion group either way), a node that
//! only the backward pass reads (it is computed once, there or before), or
//! a node reading a matmul's product (the matmul's epilogue, a bias, stays
//! with the GEMM, whose finished value is kept; what follows it is
//! recomputed). It changes nothing in a graph without a `grad` region.
//!
//! *Measured.* A 4-layer GPT-2 (width 256, 128 positions, batch 16, 8192
//! tokens) AdamW step, planned for the CPU backend (`KILN_DUMP`): the
//! arena falls from 526.5 MB to 373.5 MB and the kernels go from 469 to
//! 470 (the GELU's five forward kernels become one, the layer norms'
//! split where their rows are kept); every loss is bit for bit the same.
//!
//! *Preserves.* Every value the outputs see, bit for bit: a copy applies
//! the same op to the same operands. Outputs, their order, every existing
//! node's op and region.
//!
//! *Invalidates.* Nothing but the plan tables (run before fusion).
//!
//! *Assumes.* Autodiff's layout: gradient nodes live under the root's
//! `grad` region. The output is a function of the graph's structure only.

use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, Node, NodeId, Op, RegionId};
use crate::Result;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Copies cheap forward values into the backward pass that reads them
/// (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Remat;

impl Pass for Remat {
    fn name(&self) -> &'static str {
        "remat"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let Some(grad) = graph.find_region("grad") else {
            return Ok(Changed::No);
        };
        let in_grad = |g: &Graph, mut r: RegionId| loop {
            if r == grad {
                return true;
            }
            match g.regions()[r.0 as usize].parent {
                Some(p) => r = p,
                None => return false,
            }
        };
        let mut copies = 0usize;
        let order = graph.topo_order();
        let allowed = recomputable(graph, &order, |r| in_grad(graph, r));
        // Copies per reader can multiply along diamonds of cheap nodes.
        let budget = 2 * order.len();
        for &id in order.iter().rev() {
            let node = graph.node(id).clone();
            if !allowed.contains(&id) {
                continue;
            }
            let users = graph.users(id);
            let (backward, forward): (Vec<NodeId>, Vec<NodeId>) =
                users.into_iter().partition(|&u| in_grad(graph, graph.node(u).region));
            let returned = graph.outputs().contains(&id);
            // Only readers whose kernel can take the copy in: another
            // reader (a view, a matmul) would make the copy a kernel of
            // its own, so it reads the forward value as before.
            let backward: Vec<NodeId> =
                backward.into_iter().filter(|&u| fuses_copy(&graph.node(u).op)).collect();
            if backward.is_empty() || (forward.is_empty() && !returned) {
                continue;
            }
            let operands = graph.operands(id);
            let path = graph.region_name(node.region);
            let region = graph.region_path(&format!("grad/{path}"));
            // A copy per reader, so that each fuses into its reader's
            // kernel; one shared copy once the budget is spent.
            let groups: Vec<Vec<NodeId>> = if copies + backward.len() <= budget {
                backward.into_iter().map(|u| vec![u]).collect()
            } else {
                vec![backward]
            };
            for readers in groups {
                let copy = graph.add_unchecked(Node { region, ..node.clone() }, &operands);
                for u in readers {
                    let ops: Vec<NodeId> =
                        graph.operands(u).into_iter().map(|o| if o == id { copy } else { o }).collect();
                    graph.set_operands(u, &ops);
                }
                copies += 1;
                cx.rewrite();
            }
        }
        if copies == 0 {
            return Ok(Changed::No);
        }
        cx.note(format!("{copies} forward value(s) recomputed in the backward pass"));
        Ok(Changed::Yes)
    }
}

/// How many bytes a recomputed chain may read, in multiples of the bytes
/// of the value it recomputes.
const READ_LIMIT: usize = 2;

/// The cheap forward nodes whose recomputation reads at most
/// [`READ_LIMIT`] times their own bytes: the values the chain starts from
/// (the operands that are not themselves recomputed) counted once each,
/// a view by the bytes it reads (a bias expanded over the rows is its own
/// row). Visited operands first, so a node over the limit is kept, and
/// the chains of its users start from it.
///
/// Without the limit a chain runs back through every residual add of a
/// transformer: GPT-2 small's backward recomputed each layer's residual
/// stream from the embedding and every earlier layer's projection (50
/// operands, 630 MB read per kernel, 24 such kernels a step).
fn recomputable(graph: &Graph, order: &[NodeId], in_grad: impl Fn(RegionId) -> bool) -> HashSet<NodeId> {
    let mut leaves: HashMap<NodeId, BTreeSet<NodeId>> = HashMap::new();
    let mut allowed = HashSet::new();
    for &id in order {
        let node = graph.node(id);
        // A matmul's epilogue (its bias) stays with the GEMM: the value is
        // kept, the chain after it recomputed.
        if !cheap(&node.op)
            || in_grad(node.region)
            || graph.operands(id).iter().any(|&o| graph.node(o).op == Op::MatMul)
        {
            continue;
        }
        let mut reads = BTreeSet::new();
        for o in graph.operands(id) {
            match leaves.get(&o) {
                Some(inner) => reads.extend(inner.iter().copied()),
                None => {
                    reads.insert(o);
                }
            }
        }
        let read: usize = reads.iter().map(|&o| read_bytes(graph, o)).sum();
        if read <= READ_LIMIT * bytes(graph, id) {
            allowed.insert(id);
            leaves.insert(id, reads);
        }
    }
    allowed
}

/// The bytes reading `id` touches: a view reads at most its source.
fn read_bytes(graph: &Graph, mut id: NodeId) -> usize {
    let mut least = bytes(graph, id);
    while matches!(graph.node(id).op, Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. }) {
        id = graph.operands(id)[0];
        least = least.min(bytes(graph, id));
    }
    least
}

fn bytes(graph: &Graph, id: NodeId) -> usize {
    let node = graph.node(id);
    node.shape.numel() * node.dtype.size()
}

/// Elementwise work with no state, no randomness and no effect.
fn cheap(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Cast(_))
}

/// Whether fusion can put a copy read by `op` into `op`'s kernel: an
/// elementwise op, or a reduction (its prologue).
fn fuses_copy(op: &Op) -> bool {
    cheap(op) || matches!(op, Op::Reduce { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, DType, Shape, UnaryOp};

    /// x → e = exp(x) → f = e * e, read by the forward output and by a
    /// gradient node that also reads e: f gets a copy in `grad`, e one for
    /// each of its two readers there (the gradient node and f's copy), and
    /// the backward reads only copies; a second run changes nothing.
    #[test]
    fn a_chain_read_by_both_passes_is_copied_per_reader_down_to_its_start() {
        let mut g = Graph::new();
        let grad = g.region_path("grad");
        let f32x4 = Some((Shape::new([4]), DType::F32));
        let x = g.add(Op::Input(0), &[], f32x4.clone(), RegionId::ROOT).unwrap();
        let e = g.add(Op::Unary(UnaryOp::Exp), &[x], None, RegionId::ROOT).unwrap();
        let f = g.add(Op::Binary(BinaryOp::Mul), &[e, e], None, RegionId::ROOT).unwrap();
        let out = g.add(Op::Unary(UnaryOp::Neg), &[f], None, RegionId::ROOT).unwrap();
        let back = g.add(Op::Binary(BinaryOp::Add), &[f, e], None, grad).unwrap();
        g.set_outputs(vec![out, back]);
        let mut cx = PassCtx::default();
        assert_eq!(Remat.run(&mut g, &mut cx).unwrap(), Changed::Yes);
        assert_eq!(cx.stats.rewrites, 3, "f once, e twice; out is read by nothing in grad");
        let back_ops = g.operands(back);
        assert!(back_ops.iter().all(|&o| g.node(o).region == grad), "{back_ops:?}");
        assert_eq!(g.users(e), vec![f], "only the forward reads the original exp");
        assert_eq!(Remat.run(&mut g, &mut PassCtx::default()).unwrap(), Changed::No);
    }

    /// A residual stream x1 = x0 + a, x2 = x1 + b, x3 = x2 + c, each read
    /// by the backward pass: x1's chain reads two values of its size (x0,
    /// a) and is recomputed; x2's would read three (x0, a, b), so x2 is
    /// kept and x3's copy starts from it (x2, c).
    #[test]
    fn a_chain_that_reads_more_than_twice_its_bytes_is_kept() {
        let mut g = Graph::new();
        let grad = g.region_path("grad");
        let f32x4 = || Some((Shape::new([4]), DType::F32));
        let input = |g: &mut Graph, k| g.add(Op::Input(k), &[], f32x4(), RegionId::ROOT).unwrap();
        let (x0, a, b, c) = (input(&mut g, 0), input(&mut g, 1), input(&mut g, 2), input(&mut g, 3));
        let add =
            |g: &mut Graph, l, r, region| g.add(Op::Binary(BinaryOp::Add), &[l, r], None, region).unwrap();
        let x1 = add(&mut g, x0, a, RegionId::ROOT);
        let x2 = add(&mut g, x1, b, RegionId::ROOT);
        let x3 = add(&mut g, x2, c, RegionId::ROOT);
        let out = g.add(Op::Unary(UnaryOp::Neg), &[x3], None, RegionId::ROOT).unwrap();
        let (g1, g2, g3) = (add(&mut g, x1, x1, grad), add(&mut g, x2, x2, grad), add(&mut g, x3, x3, grad));
        g.set_outputs(vec![out, g1, g2, g3]);
        assert_eq!(Remat.run(&mut g, &mut PassCtx::default()).unwrap(), Changed::Yes);
        assert!(g.operands(g1).iter().all(|&o| o != x1 && g.operands(o) == vec![x0, a]), "x1 recomputed");
        assert_eq!(g.operands(g2), vec![x2, x2], "x2 kept");
        let copy = g.operands(g3)[0];
        assert!(copy != x3 && g.operands(copy) == vec![x2, c], "x3 recomputed from the kept x2");
    }
}
