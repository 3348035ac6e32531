//! Autocast: mixed precision as a rewrite of the whole step's graph.
//!
//! *Does.* Under [`PassOptions::autocast`] (`Context::with_autocast`),
//! or in regions with an autocast setting of their own
//! (`Context::scope_with_autocast`; a region inherits its parent's, the
//! root the context's, and a gradient region `grad/<path>` that of
//! `<path>`), gives every node recorded in `f32` the precision [`POLICY`]
//! names for its op and inserts the casts that makes necessary. Only the
//! *low* ops look at their region: what follows follows its operands,
//! whatever region it is in.
//! - *low* ops (matmul, conv2d) run in the low type: their `f32`
//!   operands are cast to it and so is their result;
//! - *f32* ops (reductions, exp/log/pow, rsqrt/sqrt/recip) run in the
//!   recorded type: low operands are widened back;
//! - every other op *follows*: it runs in the widest type among its
//!   operands that *decide*, and the others are cast to that. An operand
//!   does not decide when it is a constant (`full`), a leaf (input,
//!   variable, random, or elementwise values of leaves, such as a
//!   parameter's initializer) read through a broadcast or of one
//!   element, or an elementwise value of such operands only (dropout's
//!   scale): a
//!   bias added to a bf16 product is cast to bf16, it does not widen the
//!   product, as PyTorch's 0-d tensors do not promote. But a constant
//!   the low type cannot hold (non-zero yet rounding to zero, or
//!   overflowing) keeps its op in f32: autodiff chose it for f32 (the
//!   gelu gradient's guard `|x| < 1e-18` would be `|x| < 0` in f16).
//!
//! Two rules override the table. A value that reaches a graph output
//! through following ops only (views and elementwise) keeps its recorded
//! type: a variable's assignment is an output, so an optimizer's update,
//! its moments and the loss scaler's bookkeeping stay `f32`, and a
//! gradient leaves its bf16 product through one cast. And every output
//! keeps its recorded dtype (a cast back is added where the policy
//! changed it), so the context gets the buffers it recorded.
//!
//! A cast is made once per value and type: a weight read by the forward
//! matmul and, transposed, by the backward one has one low copy per step,
//! since casts are placed under views (`permute(cast(w))`, not
//! `cast(permute(w))`; the same for `reshape` and `expand`, so a
//! broadcast bias is cast at its own size). A cast of a `full` is a
//! `full` of the low type, and a cast back of a widening cast is its
//! operand (exact: bf16 -> f32 -> bf16 is the identity).
//!
//! *Does not.* Touch nodes recorded in another type (an explicit
//! `cast(bf16)` of the user, f64, integers), fuse the casts (fusion puts
//! them into the neighbouring kernels: a widening cast into the matmul
//! epilogue or reduction that reads it, a narrowing one into the kernel
//! that produces its operand), or scale losses (`autocast::GradScaler`
//! does, in the graph).
//!
//! *Preserves.* The outputs' dtypes and shapes and their order; regions
//! (a cast sits in the region of the value it converts).
//!
//! *Invalidates.* Every node id (the graph is rebuilt from its needed
//! nodes; dead nodes are dropped) and the plan tables.
//!
//! *Assumes.* A verified graph in which broadcasting is explicit (every
//! elementwise op's operands have its shape), as the user API records.
//! The result is a function of the graph's structure only.

mod policy;

pub use policy::{policy_text, OpKey, PolicyEntry, Precision, POLICY};

use super::{Changed, Pass, PassCtx, PassOptions};
use crate::ir::{infer, DType, Graph, Node, NodeId, Op, Phase, ReduceOp, RegionAutocast, RegionId, Scalar};
use crate::{Error, Result};
use std::collections::HashMap;

/// Rewrites a graph for mixed precision by [`POLICY`] (see the module
/// docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Autocast;

impl Pass for Autocast {
    fn name(&self) -> &'static str {
        "autocast"
    }

    fn reaches(&self) -> Phase {
        Phase::Recorded
    }

    fn applies(&self, options: &PassOptions, graph: &Graph) -> bool {
        options.autocast.is_some() || graph.regions().iter().any(|r| r.autocast != RegionAutocast::Inherit)
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let lows = region_lows(graph, cx.options.autocast)?;
        let mut used: Vec<DType> = lows.iter().flatten().copied().collect();
        used.sort_by_key(|d| d.name());
        used.dedup();
        for &low in &used {
            cx.note(policy_text(low));
        }
        let scoped: Vec<String> = graph
            .regions()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.autocast != RegionAutocast::Inherit)
            .map(|(i, r)| format!("{} {}", graph.region_name(RegionId(i as u32)), r.autocast))
            .collect();
        if !scoped.is_empty() {
            cx.note(format!("regions: {}", scoped.join(", ")));
        }
        if used.is_empty() {
            return Ok(Changed::No);
        }
        let (out, counts) = {
            let _span = tracing::debug_span!("autocast-rewrite").entered();
            rewrite(graph, &lows)?
        };
        let to = used.iter().map(|d| d.name()).collect::<Vec<_>>().join("/");
        cx.note(format!(
            "{} node(s) to {to}, {} cast(s) added, {} output(s) cast back",
            counts.lowered, counts.casts, counts.outputs
        ));
        for _ in 0..counts.lowered + counts.casts {
            cx.rewrite();
        }
        if counts.lowered == 0 && counts.casts == 0 {
            return Ok(Changed::No);
        }
        *graph = out;
        Ok(Changed::Yes)
    }
}

/// What one rewrite did.
#[derive(Default)]
struct Counts {
    /// Nodes now computed in the low type.
    lowered: usize,
    /// Cast nodes added (outputs' casts included).
    casts: usize,
    /// Outputs that needed a cast back to their recorded dtype.
    outputs: usize,
}

/// The float type a node computes in, as recorded: a comparison's and an
/// argmax's is their operand's, a source's or a cast's none (a source is
/// data; a cast converts from whatever it is given).
fn compute_type(graph: &Graph, id: NodeId) -> Option<DType> {
    let node = graph.node(id);
    match &node.op {
        op if op.is_source() => None,
        Op::Cast(_) => None,
        Op::Compare(_) | Op::Reduce { op: ReduceOp::ArgMax, .. } => {
            Some(graph.node(graph.operands(id)[0]).dtype)
        }
        _ => Some(node.dtype),
    }
}

/// Per node index, whether the node is an output or reaches one through
/// following ops only (see the module docs): it keeps its recorded type.
fn pinned(graph: &Graph, order: &[NodeId]) -> Vec<bool> {
    let mut pinned = vec![false; graph.node_bound()];
    for o in graph.outputs() {
        pinned[o.index()] = true;
    }
    for &id in order.iter().rev() {
        if !pinned[id.index()] || compute_type(graph, id) != Some(DType::F32) {
            continue;
        }
        if policy::precision_of(&graph.node(id).op).0 != Precision::Follow {
            continue;
        }
        for o in graph.operands(id) {
            if graph.node(o).dtype == DType::F32 {
                pinned[o.index()] = true;
            }
        }
    }
    pinned
}

/// Per node index, whether the node's value does not decide a following
/// op's type: a `full`, or a *leaf-like* value (one computed from sources
/// by views and elementwise ops only: an input, a variable, its initial
/// value still being computed, a random draw) of one element or read
/// through a broadcast, or an elementwise op of such values. Leaf-like
/// rather than source: a parameter decides the same whether its value is
/// a buffer already or an initializer computed in the same plan (the
/// first step of a loop).
fn constant_like(graph: &Graph, order: &[NodeId]) -> Vec<bool> {
    let mut like = vec![false; graph.node_bound()];
    let mut leafy = vec![false; graph.node_bound()];
    for &id in order {
        let node = graph.node(id);
        let operands = graph.operands(id);
        let elementwise = node.op.is_elementwise();
        leafy[id.index()] = node.op.is_source()
            || ((node.op.is_view() || elementwise) && operands.iter().all(|o| leafy[o.index()]));
        like[id.index()] = match &node.op {
            Op::Full(_) => true,
            _ if leafy[id.index()] && node.shape.numel() == 1 => true,
            op if op.is_view() => {
                let o = operands[0];
                let broadcast = leafy[o.index()] && graph.node(o).shape.numel() < node.shape.numel();
                like[o.index()] || broadcast
            }
            Op::Cast(_) => false,
            _ if elementwise => {
                let floats: Vec<NodeId> =
                    operands.into_iter().filter(|o| graph.node(*o).dtype.is_float()).collect();
                !floats.is_empty() && floats.iter().all(|o| like[o.index()])
            }
            _ => false,
        };
    }
    like
}

/// Whether `id` is a recorded-f32 constant (a `full`, or a view of one)
/// that `low` cannot hold: a non-zero value that rounds to zero, or a
/// finite one that overflows. An op reading it stays f32, because the
/// constant was chosen for f32: the gelu gradient's guard `|x| < 1e-18`
/// is `|x| < 0` in f16, and its `gelu(x) / x` is then 0/0 at `x = 0`.
fn constant_lost_in(graph: &Graph, mut id: NodeId, low: DType) -> bool {
    if low == DType::F32 || graph.node(id).dtype != DType::F32 {
        return false;
    }
    while graph.node(id).op.is_view() {
        id = graph.operands(id)[0];
    }
    match graph.node(id).op {
        Op::Full(Scalar::Float(v)) => match Scalar::Float(v).cast(low) {
            Scalar::Float(r) => (v != 0.0 && r == 0.0) || (v.is_finite() && !r.is_finite()),
            _ => false,
        },
        _ => false,
    }
}

/// Per region (by id), the low type its products run in, `None` where they
/// stay `f32`: the region's own setting, else its parent's, up to the
/// root, which takes the context's (`global`). A gradient region
/// `grad/<path>` takes `<path>`'s, so a backward product runs in the type
/// of its forward one.
fn region_lows(graph: &Graph, global: Option<DType>) -> Result<Vec<Option<DType>>> {
    let check = |low: DType| match low {
        DType::BF16 | DType::F16 => Ok(low),
        other => Err(Error::Config(format!("autocast runs in bf16 or f16, not {other}"))),
    };
    if let Some(low) = global {
        check(low)?;
    }
    let regions = graph.regions();
    let own = |mut id: RegionId| -> Result<Option<DType>> {
        loop {
            let r = &regions[id.0 as usize];
            match r.autocast {
                RegionAutocast::Low(low) => return check(low).map(Some),
                RegionAutocast::Off => return Ok(None),
                RegionAutocast::Inherit => match r.parent {
                    Some(p) => id = p,
                    None => return Ok(global),
                },
            }
        }
    };
    (0..regions.len() as u32)
        .map(|i| {
            let path = graph.region_name(RegionId(i));
            let forward = match path.strip_prefix("grad") {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => graph.find_region(rest),
                _ => None,
            };
            own(forward.unwrap_or(RegionId(i)))
        })
        .collect()
}

/// Builds the rewritten graph: one walk in topological order that decides
/// each node's type from its operands' new types and adds the casts.
/// `lows` is [`region_lows`].
fn rewrite(graph: &Graph, lows: &[Option<DType>]) -> Result<(Graph, Counts)> {
    let order = graph.topo_order();
    let pinned = pinned(graph, &order);
    let like = constant_like(graph, &order);
    let mut b = Builder { out: graph.empty_like(), memo: HashMap::new(), counts: Counts::default() };
    let mut map: HashMap<NodeId, NodeId> = HashMap::with_capacity(order.len());
    for &id in &order {
        let node = graph.node(id);
        let operands = graph.operands(id);
        let new: Vec<NodeId> = operands.iter().map(|o| map[o]).collect();
        if node.op.is_source() {
            map.insert(id, b.out.add_unchecked(node.clone(), &[]));
            continue;
        }
        if let Op::Cast(to) = node.op {
            // A cast converts from any type; one to the type its operand
            // now has is that operand.
            if b.out.node(new[0]).dtype == to {
                map.insert(id, new[0]);
            } else {
                map.insert(id, b.out.add_unchecked(node.clone(), &new));
            }
            continue;
        }
        // The type each float operand recorded in f32 is converted to;
        // operands of other types go back to their recorded type.
        let target = match compute_type(graph, id) {
            Some(DType::F32) => match policy::precision_of(&node.op).0 {
                _ if matches!(node.op, Op::Fused(_)) => DType::F32,
                Precision::Low => lows.get(node.region.0 as usize).copied().flatten().unwrap_or(DType::F32),
                Precision::Recorded => DType::F32,
                Precision::Follow if pinned[id.index()] => DType::F32,
                Precision::Follow => {
                    let deciding = operands
                        .iter()
                        .zip(&new)
                        .filter(|(o, _)| graph.node(**o).dtype == DType::F32 && !like[o.index()])
                        .map(|(_, n)| b.out.node(*n).dtype);
                    let low = deciding
                        .fold(None, |acc: Option<DType>, d| match acc {
                            Some(DType::F32) => Some(DType::F32),
                            _ => Some(d),
                        })
                        .unwrap_or(DType::F32);
                    let lost = operands.iter().any(|&o| constant_lost_in(graph, o, low));
                    if lost {
                        DType::F32
                    } else {
                        low
                    }
                }
            },
            _ => DType::F32,
        };
        let converted: Vec<NodeId> = operands
            .iter()
            .zip(&new)
            .enumerate()
            .map(|(slot, (o, &n))| {
                let recorded = graph.node(*o).dtype;
                let keeps = policy::operand_keeps_type(&node.op, slot);
                let want = if recorded == DType::F32 && !keeps { target } else { recorded };
                b.convert(n, want)
            })
            .collect();
        let types: Vec<_> = converted.iter().map(|&n| (&b.out.node(n).shape, b.out.node(n).dtype)).collect();
        let (shape, dtype) = infer(&node.op, &types)
            .map_err(|m| Error::Verify(format!("autocast made an ill-typed {}: {m}", node.op.mnemonic())))?
            .ok_or_else(|| Error::Verify(format!("autocast: {} has no inferred type", node.op.mnemonic())))?;
        if dtype != node.dtype {
            b.counts.lowered += 1;
        }
        let rewritten = Node { op: node.op.clone(), shape, dtype, region: node.region };
        map.insert(id, b.out.add_unchecked(rewritten, &converted));
    }
    let mut outputs = Vec::with_capacity(graph.outputs().len());
    for o in graph.outputs() {
        let n = map[o];
        let recorded = graph.node(*o).dtype;
        if b.out.node(n).dtype != recorded {
            b.counts.outputs += 1;
        }
        outputs.push(b.convert(n, recorded));
    }
    b.out.set_outputs(outputs);
    Ok((b.out, b.counts))
}

/// The graph being built and its conversions, one per (value, type).
struct Builder {
    out: Graph,
    memo: HashMap<(NodeId, DType), NodeId>,
    counts: Counts,
}

impl Builder {
    /// `id` (a node of the new graph) as a value of type `want`.
    fn convert(&mut self, id: NodeId, want: DType) -> NodeId {
        let node = self.out.node(id).clone();
        if node.dtype == want || !node.dtype.is_float() || !want.is_float() {
            return id;
        }
        if let Some(&done) = self.memo.get(&(id, want)) {
            return done;
        }
        let made = match &node.op {
            Op::Full(v) => {
                self.counts.casts += 1;
                self.out.add_unchecked(Node { op: Op::Full(v.cast(want)), dtype: want, ..node }, &[])
            }
            Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) => {
                let below = self.convert(self.out.operands(id)[0], want);
                self.out.add_unchecked(Node { dtype: want, ..node }, &[below])
            }
            Op::Cast(_) if widens_exactly(self.out.node(self.out.operands(id)[0]).dtype, node.dtype) => {
                let below = self.out.operands(id)[0];
                if self.out.node(below).dtype == want {
                    below
                } else {
                    self.cast(id, &node, want)
                }
            }
            _ => self.cast(id, &node, want),
        };
        self.memo.insert((id, want), made);
        made
    }

    fn cast(&mut self, id: NodeId, node: &Node, want: DType) -> NodeId {
        self.counts.casts += 1;
        let cast = Node { op: Op::Cast(want), shape: node.shape.clone(), dtype: want, region: node.region };
        self.out.add_unchecked(cast, &[id])
    }
}

/// True when every value of `from` is a value of `to` (so casting on to
/// `from` again gives it back).
fn widens_exactly(from: DType, to: DType) -> bool {
    matches!((from, to), (DType::F16 | DType::BF16, DType::F32 | DType::F64) | (DType::F32, DType::F64))
}

#[cfg(test)]
mod tests;
