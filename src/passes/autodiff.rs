//! Autodiff: reverse-mode gradients as a graph transformation.
//!
//! *Does.* Given a scalar (or seeded) value `out` and a set of leaf nodes,
//! adds to the graph the nodes that compute the gradient of `out` with
//! respect to each leaf ([`gradients`]). It walks the nodes `out` needs in
//! reverse topological order, applies one vector-Jacobian rule per node
//! (`autodiff/rules.rs`, `autodiff/window.rs`) and sums the contributions
//! that reach a node through several users. The gradient of a node in
//! region `r` is recorded in region `grad/r` (`grad` for the root), so
//! dumps, DOT clusters and stats show the backward pass as its own
//! regions. `Tensor::backward` runs this on a context's recording graph;
//! the gradient graph then goes through the same pipeline as everything
//! else (it is fused and planned together with the forward pass and the
//! updates that read it).
//!
//! As a registered pass ([`Autodiff`], for `.kir` snapshot cases; it is
//! not in the pipeline) it differentiates output 0, a scalar, with respect
//! to every float `input` slot and appends one gradient per slot, in slot
//! order, to the outputs (zeros for a slot the output does not depend on).
//!
//! *Does not.* Propagate into a leaf's operands (a leaf is where the
//! gradient is wanted: a variable's value, however it was computed), into
//! a stop node (`detach`) or into a non-float value; differentiate twice
//! (gradient nodes are plain nodes, but no rule has been checked for a
//! second derivative); remove anything.
//!
//! *Preserves.* Every existing node, id and output (the pass form only
//! appends outputs).
//!
//! *Invalidates.* Planning tables (it adds nodes).
//!
//! *Assumes.* A graph before fusion (there is no rule for a `fused` node)
//! that verifies. Composite user ops differentiate through the primitives
//! they are recorded as: `softmax`, `log_softmax` (with their row maximum
//! detached, which is exact: both are shift-invariant), `layer_norm`,
//! `stack` (a `cat` of reshapes), `narrow` (a `slice`), `mean` and `matmul`
//! with broadcast batch dims (an `expand`).

mod attention;
pub(crate) use attention::expand as expand_attention_grad;
mod build;
mod rules;
mod window;

use super::{Changed, Pass, PassCtx};
use crate::ir::{DType, Graph, NodeId, Op, RegionId, Shape};
use crate::{Error, Result};
use build::Builder;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What to differentiate: `out` seeded with `seed` (a node of `out`'s
/// shape and dtype; ones for a scalar loss), with respect to `leaves`,
/// not propagating through `stops`.
#[derive(Clone, Copy, Debug)]
pub struct GradRequest<'a> {
    /// The value whose gradient is taken.
    pub out: NodeId,
    /// The gradient of the final result with respect to `out`.
    pub seed: NodeId,
    /// The nodes to differentiate with respect to.
    pub leaves: &'a [NodeId],
    /// Nodes whose gradient is not propagated to their operands.
    pub stops: &'a HashSet<NodeId>,
}

/// The region gradients of nodes in `region` are recorded in: `grad/<path>`.
pub fn grad_region(graph: &mut Graph, region: RegionId) -> RegionId {
    let path = graph.region_name(region);
    let grad = graph.region(RegionId::ROOT, "grad");
    if path.is_empty() {
        grad
    } else {
        path.split('/').fold(grad, |r, name| graph.region(r, name))
    }
}

/// Adds the gradient of `request.out` with respect to each leaf and
/// returns the gradient node of each (`None` where `out` does not depend
/// on the leaf through float values). Errors are kiln bugs (a rule built a
/// node `infer` refused, or the graph holds a fused node).
pub fn gradients(graph: &mut Graph, request: &GradRequest) -> Result<Vec<Option<NodeId>>> {
    let _span = tracing::debug_span!("autodiff", leaves = request.leaves.len()).entered();
    let order = graph.topo_order_from(&[request.out]);
    let leaves: HashSet<NodeId> = request.leaves.iter().copied().collect();
    // Which nodes carry a gradient: float values that are leaves or depend
    // on one through non-stop nodes.
    let mut needs: HashSet<NodeId> = HashSet::new();
    for &id in &order {
        let node = graph.node(id);
        if !node.dtype.is_float() {
            continue;
        }
        if leaves.contains(&id)
            || (!request.stops.contains(&id) && graph.operands(id).iter().any(|o| needs.contains(o)))
        {
            needs.insert(id);
        }
    }
    // Each node's gradient contributions, summed when the sweep reaches it
    // (every reader comes first) or, for a leaf, at the end.
    let mut adjoint: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    if needs.contains(&request.out) {
        adjoint.insert(request.out, vec![request.seed]);
    }
    for &id in order.iter().rev() {
        if leaves.contains(&id) || !needs.contains(&id) {
            continue;
        }
        let Some(parts) = adjoint.remove(&id) else { continue };
        let g = sum_parts(graph, id, parts)?;
        let operands = graph.operands(id);
        let wanted: Vec<bool> = operands.iter().map(|o| needs.contains(o)).collect();
        let home = graph.node(id).region;
        let region = grad_region(graph, home);
        let mut b = Builder { g: graph, region };
        let parts = rules::vjp(&mut b, id, g, &operands, &wanted).map_err(|m| {
            Error::Verify(format!(
                "autodiff: the rule for {id} ({}) failed: {m}",
                graph.node(id).op.mnemonic()
            ))
        })?;
        for ((&operand, part), &want) in operands.iter().zip(parts).zip(&wanted) {
            let Some(part) = part.filter(|_| want) else { continue };
            adjoint.entry(operand).or_default().push(part);
        }
    }
    request
        .leaves
        .iter()
        .map(|l| adjoint.get(l).map(|parts| sum_parts(graph, *l, parts.clone())).transpose())
        .collect()
}

/// The sum of `id`'s gradient contributions, in the order they came, in
/// `id`'s gradient region. A zero-padded `cat` joins an earlier one
/// whose values it does not overlap ([`Builder::join_pads`]): the slices
/// that tile a tensor give it one `cat`, not padded copies added.
fn sum_parts(graph: &mut Graph, id: NodeId, parts: Vec<NodeId>) -> Result<NodeId> {
    let home = graph.node(id).region;
    let region = grad_region(graph, home);
    let mut b = Builder { g: graph, region };
    let fail = |m: String| Error::Verify(format!("autodiff: summing gradients failed: {m}"));
    let mut terms: Vec<NodeId> = Vec::with_capacity(parts.len());
    for part in parts {
        let joined = terms.iter().enumerate().find_map(|(at, &t)| Some((at, b.join_pads(t, part)?)));
        match joined {
            Some((at, pieces)) => terms[at] = b.cat_pieces(terms[at], pieces).map_err(fail)?,
            None => terms.push(part),
        }
    }
    let mut total =
        *terms.first().ok_or_else(|| Error::Verify(format!("autodiff: {id} has no gradient part")))?;
    for &t in &terms[1..] {
        total = b.add_(total, t).map_err(fail)?;
    }
    Ok(total)
}

/// The pass form of [`gradients`], for `.kir` cases: differentiates output
/// 0 (a float scalar) with respect to every float `input` slot and appends
/// the gradients to the outputs in slot order (module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Autodiff;

impl Pass for Autodiff {
    fn name(&self) -> &'static str {
        "autodiff"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let Some(&out) = graph.outputs().first() else {
            return Err(Error::Verify("autodiff: the graph has no output to differentiate".into()));
        };
        let node = graph.node(out);
        if node.shape.numel() != 1 || !node.dtype.is_float() {
            return Err(Error::Verify(format!(
                "autodiff: output 0 must be a float scalar (the loss), got {}{}",
                node.dtype, node.shape
            )));
        }
        let (shape, dtype) = (node.shape.clone(), node.dtype);
        let mut slots: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
        let mut types: BTreeMap<u32, (Shape, DType)> = BTreeMap::new();
        for id in graph.node_ids() {
            let n = graph.node(id);
            if let Op::Input(k) = n.op {
                if n.dtype.is_float() {
                    slots.entry(k).or_default().push(id);
                    types.insert(k, (n.shape.clone(), n.dtype));
                }
            }
        }
        let home = graph.node(out).region;
        let region = grad_region(graph, home);
        let seed = Builder { g: graph, region }
            .full(1.0, &shape, dtype)
            .map_err(|m| Error::Verify(format!("autodiff: {m}")))?;
        let leaves: Vec<NodeId> = slots.values().flatten().copied().collect();
        let stops = HashSet::new();
        let found = gradients(graph, &GradRequest { out, seed, leaves: &leaves, stops: &stops })?;
        let by_leaf: HashMap<NodeId, NodeId> =
            leaves.iter().zip(found).filter_map(|(&l, g)| g.map(|g| (l, g))).collect();
        let mut outputs = graph.outputs().to_vec();
        for (slot, nodes) in &slots {
            let mut b = Builder { g: graph, region };
            let mut total: Option<NodeId> = None;
            for g in nodes.iter().filter_map(|n| by_leaf.get(n)) {
                total = Some(match total {
                    Some(t) => b.add_(t, *g).map_err(|m| Error::Verify(format!("autodiff: {m}")))?,
                    None => *g,
                });
            }
            let grad = match total {
                Some(t) => t,
                None => {
                    let (s, d) = &types[slot];
                    b.full(0.0, s, *d).map_err(|m| Error::Verify(format!("autodiff: {m}")))?
                }
            };
            outputs.push(grad);
            cx.rewrite();
        }
        graph.set_outputs(outputs);
        Ok(Changed::Yes)
    }
}
