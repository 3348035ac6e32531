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
//! passes read. Readers that fusion can give the copy to (an elementwise
//! op, a reduction's prologue) get one each. The other readers in `grad`
//! (a view, a matmul: a weight gradient reads the transpose of the
//! activation its forward matmul read), and those of the node's forward
//! views (through any number of them; the views are copied onto the
//! copy), share one copy, a kernel of its own, *when that frees memory*:
//! every value its chain starts from is a source or is live for the
//! backward pass anyway (read there directly, or by a chain copied into a
//! fusing reader), at least one of them is computed, and the copy is no
//! wider than the widest of those (a widening cast's copy would hold more
//! than it frees). Otherwise they read the forward value as before. The
//! `multi-output` pass then merges such a copy into a backward kernel that
//! reads what it reads (GELU's derivative for GELU's output, a layer
//! norm's backward for its output), or drops it for the forward kernel it
//! copies. Copies per reader multiply along diamonds of cheap nodes,
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
//! *Measured.* GPT-2 small's training step (12 layers, batch 8, 512
//! positions, AdamW), planned for the CPU backend: the copies for matmuls
//! take the arena from 4.40 to 3.48 GB in f32 and from 2.53 to 2.07 GB in
//! bf16 autocast (each layer's GELU output and both layer norm outputs are
//! no longer kept for the backward pass), with 25 fewer kernels; the loss
//! is bit for bit the same. Before them, remat itself took a 4-layer GPT-2
//! (width 256, 128 positions, batch 16, 8192 tokens) AdamW step's arena
//! from 526.5 MB to 373.5 MB, and its kernels from 469 to 470 (the GELU's
//! five forward kernels become one, the layer norms' split where their
//! rows are kept); every loss bit for bit the same.
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
        let in_grad = |g: &Graph, r: RegionId| g.within(r, grad);
        let mut copies = 0usize;
        let order = graph.topo_order();
        let leaves = recomputable(graph, &order, |r| in_grad(graph, r));
        let kept = kept_for_backward(graph, &order, &leaves, |r| in_grad(graph, r));
        // Copies per reader can multiply along diamonds of cheap nodes.
        let budget = 2 * order.len();
        for &id in order.iter().rev() {
            let node = graph.node(id).clone();
            let Some(chain_leaves) = leaves.get(&id) else {
                continue;
            };
            let users = graph.users(id);
            let (backward, forward): (Vec<NodeId>, Vec<NodeId>) =
                users.into_iter().partition(|&u| in_grad(graph, graph.node(u).region));
            let returned = graph.outputs().contains(&id);
            // Backward readers of forward views of the value (a weight
            // gradient's matmul reads the transpose of the reshape the
            // forward matmul read), with the view each reads. Those that
            // could fuse a copy read the forward view as before: fusion
            // already recomputes what they read where it is cheap (a
            // widening cast).
            let mut viewed = read_through_views(graph, &forward, &|r| in_grad(graph, r));
            viewed.retain(|&(u, _)| !fuses_copy(&graph.node(u).op));
            if (backward.is_empty() && viewed.is_empty()) || (forward.is_empty() && !returned) {
                continue;
            }
            // Readers whose kernel can take the copy in get one each.
            // The others (a view, a matmul) share one copy, a kernel of
            // its own, only where that frees the forward value: when
            // everything its chain reads stays live for the backward pass
            // anyway (see `kept_for_backward`).
            let (fusing, other): (Vec<NodeId>, Vec<NodeId>) =
                backward.into_iter().partition(|&u| fuses_copy(&graph.node(u).op));
            let frees = (!other.is_empty() || !viewed.is_empty())
                && frees_by_recomputing(graph, id, chain_leaves, &leaves, &kept);
            let operands = graph.operands(id);
            let path = graph.region_name(node.region);
            let region = graph.region_path(&format!("grad/{path}"));
            // A copy per reader, so that each fuses into its reader's
            // kernel; one shared copy once the budget is spent.
            let mut groups: Vec<Vec<NodeId>> = if copies + fusing.len() <= budget {
                fusing.into_iter().map(|u| vec![u]).collect()
            } else {
                vec![fusing]
            };
            groups.retain(|g| !g.is_empty());
            if frees {
                // One copy for the readers that are no kernel it can join,
                // and the views they read copied onto it.
                let copy = graph.add_unchecked(Node { region, ..node.clone() }, &operands);
                let mut views = HashMap::from([(id, copy)]);
                let readers = other.iter().map(|&u| (u, id)).chain(viewed);
                for (u, read) in readers.collect::<Vec<_>>() {
                    let new = copy_views(graph, read, region, &mut views);
                    let ops: Vec<NodeId> =
                        graph.operands(u).into_iter().map(|o| if o == read { new } else { o }).collect();
                    graph.set_operands(u, &ops);
                }
                copies += 1;
                cx.rewrite();
            }
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
/// the chains of its users start from it. A cast counts by the wider of
/// itself and its operand: a bf16 layer norm output is the f32 output's
/// cast, and reads what the f32 output reads (by its own bytes, twice its
/// size, so it was kept in memory for the backward pass).
///
/// Without the limit a chain runs back through every residual add of a
/// transformer: GPT-2 small's backward recomputed each layer's residual
/// stream from the embedding and every earlier layer's projection (50
/// operands, 630 MB read per kernel, 24 such kernels a step).
///
/// Returns each such node with the values its chain starts from.
fn recomputable(
    graph: &Graph,
    order: &[NodeId],
    in_grad: impl Fn(RegionId) -> bool,
) -> HashMap<NodeId, BTreeSet<NodeId>> {
    let mut leaves: HashMap<NodeId, BTreeSet<NodeId>> = HashMap::new();
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
        let size = match node.op {
            Op::Cast(_) => bytes(graph, id).max(bytes(graph, graph.operands(id)[0])),
            _ => bytes(graph, id),
        };
        if read <= READ_LIMIT * size {
            leaves.insert(id, reads);
        }
    }
    leaves
}

/// The forward values the backward pass reads whatever this pass decides
/// for a value that only views and matmuls read there: those its nodes
/// read directly (a matmul's product, a reduction's rows) and the values
/// the chains copied into its fusing readers start from. Each is named by
/// the value under its views ([`base`]).
fn kept_for_backward(
    graph: &Graph,
    order: &[NodeId],
    leaves: &HashMap<NodeId, BTreeSet<NodeId>>,
    in_grad: impl Fn(RegionId) -> bool,
) -> HashSet<NodeId> {
    let mut kept = HashSet::new();
    for &r in order {
        if !in_grad(graph.node(r).region) {
            continue;
        }
        for o in graph.operands(r) {
            let b = base(graph, o);
            if in_grad(graph.node(b).region) {
                continue;
            }
            match leaves.get(&b) {
                Some(chain) if o == b && fuses_copy(&graph.node(r).op) => {
                    kept.extend(chain.iter().map(|&l| base(graph, l)));
                }
                Some(_) => {}
                None => {
                    kept.insert(b);
                }
            }
        }
    }
    kept
}

/// Whether a copy of a chain starting from `chain_leaves` frees memory:
/// each value it reads is a source (a parameter, an input, a constant:
/// live throughout) or stays live for the backward pass anyway (`kept`),
/// and at least one is a computed value the backward pass reads, whose
/// kernel the copy can join as an extra output (`multi-output`). A cast
/// of a weight, which reads only the weight, would be a kernel of its own
/// per weight in the backward pass. And the copy is no wider than the
/// widest such value: a widening cast's copy would hold more than it
/// frees.
///
/// A leaf that views a recomputable value (a row's `rsqrt` expanded over
/// the row) counts by the values that one's chain reads.
fn frees_by_recomputing(
    graph: &Graph,
    value: NodeId,
    chain_leaves: &BTreeSet<NodeId>,
    leaves: &HashMap<NodeId, BTreeSet<NodeId>>,
    kept: &HashSet<NodeId>,
) -> bool {
    let mut computed = false;
    let mut widest = 0;
    let mut stack: Vec<NodeId> = chain_leaves.iter().copied().collect();
    let mut seen = HashSet::new();
    while let Some(l) = stack.pop() {
        let b = base(graph, l);
        if !seen.insert(b) || matches!(graph.node(b).op, Op::Input(_) | Op::Full(_)) {
            continue;
        }
        if kept.contains(&b) {
            computed = true;
            widest = widest.max(bytes(graph, b));
        } else if let Some(inner) = leaves.get(&b) {
            stack.extend(inner.iter().copied());
        } else {
            return false;
        }
    }
    computed && bytes(graph, value) <= widest
}

/// The readers in `grad` of views (outside `grad`, through any number of
/// them) among `forward`, each with the view it reads.
fn read_through_views(
    graph: &Graph,
    forward: &[NodeId],
    in_grad: &dyn Fn(RegionId) -> bool,
) -> Vec<(NodeId, NodeId)> {
    let mut out = Vec::new();
    let mut stack: Vec<NodeId> = forward.iter().copied().filter(|&u| graph.node(u).op.is_view()).collect();
    while let Some(w) = stack.pop() {
        for r in graph.users(w) {
            if in_grad(graph.node(r).region) {
                out.push((r, w));
            } else if graph.node(r).op.is_view() {
                stack.push(r);
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The copy of view chain `read` in `region`, over the copy its chain
/// starts from (`copies` holds it, and every view copied so far).
fn copy_views(
    graph: &mut Graph,
    read: NodeId,
    region: RegionId,
    copies: &mut HashMap<NodeId, NodeId>,
) -> NodeId {
    if let Some(&c) = copies.get(&read) {
        return c;
    }
    let from = copy_views(graph, graph.operands(read)[0], region, copies);
    let node = graph.node(read).clone();
    let c = graph.add_unchecked(Node { region, ..node }, &[from]);
    copies.insert(read, c);
    c
}

/// The value `id` views (itself when it is no view).
fn base(graph: &Graph, mut id: NodeId) -> NodeId {
    while graph.node(id).op.is_view() {
        id = graph.operands(id)[0];
    }
    id
}

/// The bytes reading `id` touches: a view reads at most its source.
fn read_bytes(graph: &Graph, mut id: NodeId) -> usize {
    let mut least = bytes(graph, id);
    while graph.node(id).op.is_view() {
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
