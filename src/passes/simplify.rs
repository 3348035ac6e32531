//! Algebraic simplification by equality saturation (egg): rewrite rules
//! grow an e-graph of equal forms of the graph, and a cost model picks the
//! cheapest.
//!
//! *Does.* Turns the needed nodes into an e-graph: source ops (`input`,
//! `buffer`, `full`, `arange`, `rand`/`randn`) are leaves carrying their
//! attributes, every other op an e-node whose children are its operands'
//! e-classes in slot order; every attribute (perm, shapes, dims, dtype,
//! scalar bits) is part of the e-node ([`lang`]), so nodes with different
//! attributes never merge. It runs the rules of [`rules::RULES`] (each a
//! named identity with the conditions under which it holds) to saturation
//! or a limit, then extracts one node per e-class by a cost model, and
//! keeps the result only if it is cheaper than the input. The cost of a
//! node is, lexicographically: bytes moved (views, inputs and `full`
//! constants move none; `arange` and random nodes write their output;
//! every other op reads each operand slot and writes its output), then
//! node count, then divisions, then nodes the input did not have (so ties
//! keep the input's form). Extraction chooses by tree cost, and the chosen
//! graph's cost counting each node once is compared with the input's
//! ([`extract`]). Kept nodes keep their ids and regions; a new node takes
//! the region of the first input node of its e-class, or of the user it
//! was made for. Input nodes the result no longer needs are removed (unless
//! a node that was already dead still uses them). The rewrite count of
//! [`PassStats`](super::PassStats) is the number of rule applications that
//! merged two e-classes, whether or not the extraction kept them; the
//! notes (the dump's `;;` line and a tracing event) say why the runner
//! stopped and what the cost went from and to.
//!
//! *Limits.* At most [`ITER_LIMIT`] iterations, [`NODE_LIMIT_BASE`] +
//! [`NODE_LIMIT_PER_NODE`] e-nodes per input node, and [`TIME_LIMIT`]. The
//! rules only shrink or reshape the graph (the reassociations under fast
//! math grow at most quadratically in a chain's length), so on real graphs
//! the run saturates in a few iterations. Only the time limit can make the
//! result depend on the machine; the iteration and node limits depend on
//! the graph alone, and egg runs deterministically here (its
//! `deterministic` feature, the simple scheduler, no randomness).
//!
//! *Does not.* Apply float-inexact rules (reassociation, `x / c` for any
//! `c`, float sums of broadcasts) unless `PassOptions::fast_math` is set;
//! fold `x * 0` (NaN, infinities and -0.0 say no), `x + 0.0` (-0.0) or
//! `(x * 2) / 2` for integers (overflow); evaluate constants beyond a rule
//! combining two of them; touch nodes the outputs and effects do not
//! need; or merge, drop or replace a collective (each is an e-node of its
//! own, its `seq` an attribute, and a root of the extraction; a result
//! that would replace one keeps the input instead).
//!
//! *Preserves.* Every value the outputs see, bit for bit (fast math: up to
//! the reassociation it allows; rule comments say what holds when); the
//! outputs' order; ids of the input nodes it keeps. With no cheaper
//! graph, the graph is untouched and the pass reports no change.
//!
//! *Invalidates.* Operand edges of kept nodes whose operands became other
//! nodes of equal value; removed node ids.
//!
//! *Assumes.* A verified graph of pure ops (true of every op today); the
//! kernels' semantics of `ir::eval` (elementwise), `Scalar::cast` (casts)
//! and wrapping integer sums; a GEMM whose sum over `k` for one output
//! element runs in the same order whatever the operands' strides (true of
//! matrixmultiply on kiln's row blocks), so `(AB)^T` and `B^T A^T` agree
//! bit for bit.

mod apply;
mod extract;
mod lang;
mod rules;

use super::{Changed, Pass, PassCtx};
use crate::ir::{Graph, NodeId};
use crate::{Error, Result};
use apply::Apply;
use egg::{Rewrite, Runner, SimpleScheduler, StopReason};
use extract::{extract, own_cost, rebuild, Cost};
use lang::{ENode, OpKey, SGraph, Types};
use rules::{Env, RULES};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Simplifies by equality saturation (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Simplify;

/// Most iterations of the runner (each applies every rule once).
pub const ITER_LIMIT: usize = 30;
/// E-nodes allowed whatever the graph's size.
pub const NODE_LIMIT_BASE: usize = 1_000;
/// E-nodes allowed per needed input node.
pub const NODE_LIMIT_PER_NODE: usize = 4;
/// Wall-clock limit of the run (checked between rules).
pub const TIME_LIMIT: Duration = Duration::from_millis(1_000);

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let order = graph.topo_order();
        if order.is_empty() {
            return Ok(Changed::No);
        }
        // Graph → e-graph, and the input's cost (each node once).
        let mut egraph = SGraph::new(Types);
        let mut class_of: HashMap<NodeId, egg::Id> = HashMap::with_capacity(order.len());
        let mut inputs: Vec<(NodeId, ENode)> = Vec::with_capacity(order.len());
        let mut before = Cost::default();
        for &id in &order {
            let node = graph.node(id);
            let operands = graph.operands(id);
            let children = operands
                .iter()
                .map(|o| class_of.get(o).copied())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::Verify(format!("simplify: an operand of {id} is not needed")))?;
            let op = OpKey::from(&node.op);
            let types = operands.iter().zip(&children).map(|(&o, &c)| {
                (&graph.node(o).shape, graph.node(o).dtype, egraph[c].data.constant.is_some())
            });
            before = before + own_cost(&op, &node.shape, node.dtype, types);
            let enode = ENode { op, shape: node.shape.clone(), dtype: node.dtype, children };
            class_of.insert(id, egraph.add(enode.clone()));
            inputs.push((id, enode));
        }
        // The outputs, then the effects: a collective is extracted whether
        // or not an output still reads it.
        let outputs = graph.outputs().len();
        let effects = graph.effects();
        let roots: Vec<egg::Id> =
            graph.outputs().iter().chain(&effects).filter_map(|o| class_of.get(o).copied()).collect();

        let env = Env { fast_math: cx.options.fast_math };
        let rewrites = RULES
            .iter()
            .filter(|r| !r.fast_math || env.fast_math)
            .map(|rule| Rewrite::new(rule.name, Apply { rule, env }, Apply { rule, env }))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(|e| Error::Config(format!("simplify: bad rule: {e}")))?;
        let node_limit = NODE_LIMIT_BASE.saturating_add(NODE_LIMIT_PER_NODE.saturating_mul(order.len()));
        let runner = Runner::<ENode, Types, ()>::new(Types)
            .with_egraph(egraph)
            .with_scheduler(SimpleScheduler)
            .with_iter_limit(ITER_LIMIT)
            .with_node_limit(node_limit)
            .with_time_limit(TIME_LIMIT)
            .run(&rewrites);
        let g = &runner.egraph;
        let applied: usize = runner.iterations.iter().map(|it| it.applied.values().sum::<usize>()).sum();
        cx.stats.rewrites = applied;
        let stop = format!(
            "stop: {}, {} e-nodes",
            stop_reason(runner.stop_reason.as_ref(), runner.iterations.len(), node_limit),
            g.total_size()
        );
        tracing::debug!(
            rewrites = applied,
            iterations = runner.iterations.len(),
            e_nodes = g.total_size(),
            "simplify {stop}"
        );
        cx.note(stop);

        // The input nodes as canonical e-nodes, and each class's region.
        let mut originals: HashMap<ENode, NodeId> = HashMap::with_capacity(inputs.len());
        let mut class_region = HashMap::with_capacity(inputs.len());
        let mut effect_nodes = Vec::with_capacity(effects.len());
        for (id, mut enode) in inputs {
            for c in &mut enode.children {
                *c = g.find(*c);
            }
            if let Some(&class) = class_of.get(&id) {
                class_region.entry(g.find(class)).or_insert(graph.node(id).region);
            }
            if graph.node(id).op.is_effect() {
                effect_nodes.push((class_of.get(&id).map(|&c| g.find(c)), enode.clone()));
            }
            originals.entry(enode).or_insert(id);
        }
        let extraction = extract(g, &roots, &originals);
        // Each collective's class must be extracted as that collective (no
        // rule equates one with anything else; this keeps it so whatever a
        // rule does).
        if effect_nodes.iter().any(|(class, e)| class.and_then(|c| extraction.choice.get(&c)) != Some(e)) {
            cx.note("kept the input: the cheapest form replaced a collective");
            return Ok(Changed::No);
        }
        let after = extraction.cost.work();
        let summary =
            format!("{} -> {} bytes, {} -> {} nodes", before.bytes, after.bytes, before.ops, after.ops);
        if after.partial_cmp(&before.work()) != Some(std::cmp::Ordering::Less) {
            cx.note(format!("kept the input: no cheaper graph ({summary})"));
            return Ok(Changed::No);
        }
        rebuild(graph, g, &roots, outputs, &extraction.choice, &originals, &class_region)
            .ok_or_else(|| Error::Verify("simplify: the extracted graph is incomplete".into()))?;
        cx.note(format!("cost {summary}"));
        remove_unneeded(graph, &order);
        Ok(Changed::Yes)
    }
}

/// The stop reason in words.
fn stop_reason(reason: Option<&StopReason>, iterations: usize, node_limit: usize) -> String {
    match reason {
        Some(StopReason::Saturated) => format!("saturated after {iterations} iteration(s)"),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n} > {node_limit})"),
        Some(StopReason::TimeLimit(s)) => format!("time limit ({s:.3} s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".into(),
    }
}

/// Removes the nodes that were needed before the pass and are not now,
/// users first, where nothing (a node already dead before) still uses them.
fn remove_unneeded(graph: &mut Graph, before: &[NodeId]) {
    let needed: HashSet<NodeId> = graph.topo_order().into_iter().collect();
    for &id in before.iter().rev() {
        // Outputs are needed, so `needed` covers them.
        if !needed.contains(&id) && graph.users(id).is_empty() {
            graph.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::{parse, print};
    use crate::passes::PassOptions;

    fn simplify(src: &str, fast_math: bool) -> (String, PassCtx) {
        let mut g = parse(src).unwrap();
        let mut cx =
            PassCtx { options: PassOptions { fast_math, ..PassOptions::default() }, ..PassCtx::default() };
        Simplify.run(&mut g, &mut cx).unwrap();
        crate::ir::verify(&g).unwrap();
        (print(&g), cx)
    }

    #[test]
    fn stop_reason_reaches_the_notes() {
        let (out, cx) =
            simplify("%x: f32[4] = input 0\n%a: f32[4] = neg %x\n%b: f32[4] = neg %a\nreturn %b\n", false);
        assert_eq!(out, "%0: f32[4] = input 0\nreturn %0\n");
        assert_eq!(cx.stats.rewrites, 1);
        assert!(cx.notes[0].starts_with("stop: saturated after 2 iteration(s), "), "{:?}", cx.notes);
        assert_eq!(cx.notes[1], "cost 64 -> 0 bytes, 3 -> 1 nodes");
    }

    #[test]
    fn nothing_cheaper_leaves_the_graph_alone() {
        let src = "%x: f32[4] = input 0\n%z: f32[4] = full 0\n%a: f32[4] = mul %x, %z\nreturn %a\n";
        let mut g = parse(src).unwrap();
        let ids = g.node_ids();
        let mut cx = PassCtx::default();
        assert_eq!(Simplify.run(&mut g, &mut cx).unwrap(), Changed::No);
        assert_eq!(g.node_ids(), ids);
        assert!(cx.notes[1].starts_with("kept the input"), "{:?}", cx.notes);
    }

    #[test]
    fn every_op_is_left_valid() {
        // One graph with every op (the text format's test file); the pass
        // must return a verified graph, with and without fast math.
        let src = include_str!("../../tests/text/all_ops.kir");
        for fast_math in [false, true] {
            simplify(src, fast_math);
        }
    }

    #[test]
    fn a_long_chain_stays_within_the_node_limit() {
        // (x * 3) * 3 * ... under fast math reassociates pairwise; the node
        // limit bounds the e-graph, and the result is still valid.
        let mut src = String::from("%x: f32[4] = input 0\n%c: f32[4] = full 3\n%v0: f32[4] = mul %x, %c\n");
        for i in 1..200 {
            src.push_str(&format!("%v{i}: f32[4] = mul %v{}, %c\n", i - 1));
        }
        src.push_str("return %v199\n");
        let (out, cx) = simplify(&src, true);
        assert!(out.lines().count() < 200, "{out}");
        assert!(cx.notes[0].starts_with("stop: "), "{:?}", cx.notes);
    }
}
