//! Weight prologue: work that reads only variables runs in a plan of its
//! own, whose results are kept between calls until a variable it reads
//! changes.
//!
//! *Why.* An inference plan recomputes, on every call, values that depend
//! on nothing but the model's weights: the copy `merge-matmuls` makes to
//! join q, k and v's weights (4.5 µs a BERT-base layer on an H200, 54 µs
//! of a 1.8 ms call), and under `with_autocast` the cast of every f32
//! weight to bf16 or f16 (a BERT-base's 110 M parameters read and written
//! again each call). Between two calls of an inference loop the weights do
//! not change, so neither do those values. TensorRT and ONNX Runtime fold
//! such work into the engine when it is built; kiln's weights are
//! variables a step may assign at any time, so it keeps the values instead
//! and computes them again when the bytes they were made from change.
//!
//! *Does.* Given which input slots hold a variable's current value (the
//! *stable* inputs, [`PassCtx::stable_inputs`], set by a context for a
//! plan it compiles; empty everywhere else, where the pass does nothing),
//! finds the values computed from stable inputs (and constants) alone:
//! pure nodes whose operands are all such values, reading at least one
//! stable input, no larger than the stable inputs they read (a value made
//! from a broadcast weight would cost more memory than it saves), and not
//! an output of the plan. Walking from the outputs, the first such value
//! that is not a view or a leaf is *kept*: it becomes a new input slot of
//! the plan, numbered from the number of the plan's slots on, and its
//! computation moves to the *prologue*, a graph of its own (inputs: the
//! stable slots it reads, renumbered from 0 in ascending order; outputs:
//! the kept values, in the order of their new slots). Views of kept
//! values and of inputs stay in the plan (free to keep there; a product
//! still reads a weight transposed).
//!
//! ```text
//! before                               after
//! %w  = cat %wq, %wk, %wv dim=0        %w  = input 7      (kept; slot 7 = the prologue's output 0)
//! %wt = permute %w perm=[1,0]          %wt = permute %w perm=[1,0]
//! %p  = matmul %x, %wt                 %p  = matmul %x, %wt
//! ```
//!
//! The pipeline runs the passes after this one on both graphs
//! (`run.rs`), and the context compiles both and runs them as one
//! executable (`backends/prologue.rs`) that launches the prologue only
//! when the bytes of a stable input it reads are not those it last read.
//!
//! *Does not.* Keep values of inputs that are not stable: a variable with
//! an assignment pending reads its old bytes now and holds new ones after
//! the run (a training step's weights), and any other input (a batch)
//! changes from call to call. Keep random values, effects (collectives),
//! assignments, or values made only from constants (a mask from `arange`
//! is cheaper computed where it is read than kept and read from memory).
//!
//! *Preserves.* Every value, bit for bit: the same nodes compute the same
//! values, in another plan. Effects (none moves). Regions of the nodes
//! moved; the new inputs are in the root region, as every input is.
//!
//! *Invalidates.* Nothing kept across passes (it runs before fusion). The
//! plan's outputs and their order are unchanged.
//!
//! *Cost.* Memory: each kept value lives as long as the compiled plan
//! (dropped with it, `Context::clear_plans`), as large as the weights it
//! was made from at most. A call whose stable inputs did change runs two
//! plans where there was one.
//!
//! *Assumes.* A verified graph in the canonical phase. O(n) in the nodes,
//! plus the set of stable inputs each candidate reads (merged sorted
//! lists).

use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, Node, NodeId, Op, RegionId};
use crate::Result;
use std::collections::HashMap;

/// Splits weight-only work into a prologue (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct WeightPrologue;

/// What the pass moved out of a plan: the prologue graph and where its
/// inputs and outputs go (see the module docs).
#[derive(Clone, Debug)]
pub struct Prologue {
    /// The work moved out, its outputs the kept values.
    pub graph: Graph,
    /// For each prologue input slot, the plan's input slot it reads.
    pub reads: Vec<u32>,
    /// The plan's slot of the prologue's output 0 (the number of slots the
    /// plan had); output `i` is slot `kept_from + i`.
    pub kept_from: u32,
}

impl Pass for WeightPrologue {
    fn name(&self) -> &'static str {
        "weight-prologue"
    }

    /// Only to a context's plans with a stable input (no other caller
    /// names any).
    fn applies_in(&self, cx: &PassCtx, _graph: &Graph) -> bool {
        cx.stable_inputs.iter().any(|&s| s)
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        if !cx.stable_inputs.iter().any(|&s| s) {
            return Ok(Changed::No);
        }
        let Some(prologue) = split(graph, &cx.stable_inputs) else {
            return Ok(Changed::No);
        };
        for _ in 0..prologue.graph.outputs().len() {
            cx.rewrite();
        }
        cx.note(format!(
            "kept {} value(s) made from {} variable(s) by {} node(s), in a prologue",
            prologue.graph.outputs().len(),
            prologue.reads.len(),
            prologue.graph.len()
        ));
        cx.prologue = Some(prologue);
        Ok(Changed::Yes)
    }
}

/// What is known of a node computed from stable inputs and constants.
struct Candidate {
    /// The stable input slots it reads, ascending.
    reads: Vec<u32>,
}

/// Rewrites `graph` into the plan that reads the kept values, returning
/// the prologue; `None` (and `graph` untouched) when nothing is kept.
fn split(graph: &mut Graph, stable: &[bool]) -> Option<Prologue> {
    let order = graph.topo_order();
    let sizes: HashMap<u32, usize> = order
        .iter()
        .filter_map(|&id| match graph.node(id).op {
            Op::Input(k) => Some((k, graph.node(id).shape.numel())),
            _ => None,
        })
        .collect();
    // Candidates: stable inputs, constants, and pure nodes made of them.
    let mut candidates: HashMap<NodeId, Candidate> = HashMap::new();
    for &id in &order {
        let node = graph.node(id);
        let candidate = match &node.op {
            Op::Input(k) => stable.get(*k as usize).copied().unwrap_or(false).then(|| vec![*k]),
            Op::Full(_) | Op::Arange { .. } => Some(Vec::new()),
            Op::Buffer(_) | Op::Random { .. } | Op::Assign | Op::Extra { .. } | Op::Fused(_) => None,
            op if op.is_effect() => None,
            _ => reads_of(graph, id, &candidates).filter(|reads| {
                let read: usize = reads.iter().map(|k| sizes.get(k).copied().unwrap_or(0)).sum();
                !reads.is_empty() && (node.op.is_view() || node.shape.numel() <= read)
            }),
        };
        if let Some(reads) = candidate {
            if !graph.outputs().contains(&id) {
                candidates.insert(id, Candidate { reads });
            }
        }
    }
    // Walk from the outputs: the first candidate that computes is kept.
    let mut kept: Vec<NodeId> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<NodeId> = graph.outputs().to_vec();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let op = &graph.node(id).op;
        if candidates.contains_key(&id) && !op.is_view() && !op.is_source() {
            kept.push(id);
        } else {
            stack.extend(graph.operands(id));
        }
    }
    if kept.is_empty() {
        return None;
    }
    let position: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    kept.sort_by_key(|id| position[id]);
    let mut reads: Vec<u32> = kept.iter().flat_map(|id| candidates[id].reads.iter().copied()).collect();
    reads.sort_unstable();
    reads.dedup();
    let prologue = prologue_graph(graph, &order, &kept, &reads)?;
    // The plan reads each kept value from a new input slot.
    let kept_from = stable.len() as u32;
    for (i, &id) in kept.iter().enumerate() {
        let node = graph.node(id);
        let input = Node {
            op: Op::Input(kept_from + i as u32),
            shape: node.shape.clone(),
            dtype: node.dtype,
            region: RegionId::ROOT,
        };
        let input = graph.add_unchecked(input, &[]);
        graph.replace_all_uses(id, input);
    }
    let live: std::collections::HashSet<NodeId> = graph.topo_order().into_iter().collect();
    let dead: Vec<NodeId> = graph.node_ids().into_iter().filter(|id| !live.contains(id)).collect();
    graph.remove_many(&dead);
    Some(Prologue { graph: prologue, reads, kept_from })
}

/// The stable slots node `id` reads when every operand is a candidate.
fn reads_of(graph: &Graph, id: NodeId, candidates: &HashMap<NodeId, Candidate>) -> Option<Vec<u32>> {
    let mut reads: Vec<u32> = Vec::new();
    for o in graph.operands(id) {
        reads.extend(&candidates.get(&o)?.reads);
    }
    reads.sort_unstable();
    reads.dedup();
    Some(reads)
}

/// The nodes `kept` needs, copied in topological order, each stable input
/// renumbered to its place in `reads`; the outputs are `kept`, in order.
/// `None` if a node it needs reads an input that is not in `reads` (never,
/// by the way candidates are made).
fn prologue_graph(graph: &Graph, order: &[NodeId], kept: &[NodeId], reads: &[u32]) -> Option<Graph> {
    let needed = graph.reachable_from(kept);
    let mut out = graph.empty_like();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for &id in order.iter().filter(|&id| needed.contains(id)) {
        let mut node = graph.node(id).clone();
        if let Op::Input(k) = node.op {
            node.op = Op::Input(reads.binary_search(&k).ok()? as u32);
        }
        let operands: Vec<NodeId> = graph.operands(id).iter().map(|o| map[o]).collect();
        map.insert(id, out.add_unchecked(node, &operands));
    }
    out.set_outputs(kept.iter().map(|id| map[id]).collect());
    Some(out)
}
