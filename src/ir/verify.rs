//! The verifier: checks every invariant a [`Graph`] must hold, so that a
//! pass that breaks one is caught right after it runs instead of as a wrong
//! answer or a crash in a backend.
//!
//! Checked, in this order (the first violation is reported):
//! 1. every output is a node of the graph;
//! 2. the graph is acyclic (the message lists one cycle);
//! 3. for each node, in id order: its region exists; its operand count and
//!    type agree with [`infer`] (declared shape and dtype equal the
//!    inferred ones); source ops meet their own constraints (random values
//!    are float, `arange` is 1-D and numeric, constants are exactly
//!    representable in the node's dtype); two `input` nodes with one slot
//!    have one type;
//!    `extra` nodes name an output of their fused operand's body and have
//!    its type;
//! 4. no two effects (collectives) share a sequence number.
//!
//! Messages name the node as `%4 (mul)` with the graph's own ids, so they
//! point at the node a pass author has in hand.

use super::{infer, AttnWrt, DType, Graph, NodeId, Op, Scalar, Shape};
use crate::Error;
use std::collections::BTreeMap;

/// Checks every IR invariant of `graph`; `Err(Error::Verify)` names the
/// first node (or output, or cycle) that breaks one. Runs after every pass
/// in debug builds, so a broken invariant points at the pass that broke it.
pub fn verify(graph: &Graph) -> Result<(), Error> {
    check_graph(graph).map_err(Error::Verify)
}

fn check_graph(graph: &Graph) -> Result<(), String> {
    for (i, &o) in graph.outputs().iter().enumerate() {
        if !graph.contains(o) {
            return Err(format!("output {i} is {o}, which is not a node of the graph"));
        }
    }
    if let Some(cycle) = find_cycle(graph) {
        let path: Vec<String> = cycle.iter().map(|&id| describe(graph, id)).collect();
        return Err(format!("the graph has a cycle: {}", path.join(" -> ")));
    }
    let regions = graph.regions().len();
    let mut inputs: BTreeMap<u32, NodeId> = BTreeMap::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        let name = describe(graph, id);
        if node.region.0 as usize >= regions {
            return Err(format!(
                "{name}: region {} does not exist (the graph has {regions} region(s))",
                node.region.0
            ));
        }
        let operands = graph.operands(id);
        let types: Vec<(&Shape, DType)> =
            operands.iter().map(|&o| (&graph.node(o).shape, graph.node(o).dtype)).collect();
        check_node(&node.op, &types, &node.shape, node.dtype).map_err(|m| format!("{name}: {m}"))?;
        if let Op::Extra { output } = node.op {
            check_extra(graph, operands[0], output, &node.shape, node.dtype)
                .map_err(|m| format!("{name}: {m}"))?;
        }
        if let Op::Input(slot) = node.op {
            if let Some(&first) = inputs.get(&slot) {
                let f = graph.node(first);
                if f.shape != node.shape || f.dtype != node.dtype {
                    return Err(format!(
                        "{name}: input slot {slot} is declared {} here but {} at {}",
                        type_text(node.dtype, &node.shape),
                        type_text(f.dtype, &f.shape),
                        describe(graph, first)
                    ));
                }
            } else {
                inputs.insert(slot, id);
            }
        }
    }
    let effects = graph.effects();
    for pair in effects.windows(2) {
        let seq = graph.node(pair[0]).op.effect_seq();
        if seq == graph.node(pair[1]).op.effect_seq() {
            return Err(format!(
                "{} and {} are both collective seq={}; every collective has a sequence number of its own",
                describe(graph, pair[0]),
                describe(graph, pair[1]),
                seq.unwrap_or_default()
            ));
        }
    }
    super::plan_check::check_tables(graph)
}

/// An `extra` names an output (1 or more) its operand has and has its
/// type ([`extra_type`]).
fn check_extra(graph: &Graph, of: NodeId, output: usize, shape: &Shape, dtype: DType) -> Result<(), String> {
    let (want, dt) = extra_type(graph, of, output)?;
    if want != *shape || dt != dtype {
        return Err(format!(
            "declared {} but output {output} of {} is {}",
            type_text(dtype, shape),
            describe(graph, of),
            type_text(dt, &want)
        ));
    }
    Ok(())
}

/// How many outputs node `op` writes besides its value, which
/// [`Op::Extra`] nodes read: a fused node's extra body outputs, an
/// attention's rows' log-sum-exp, a `kv+q` attention gradient's queries'
/// gradient; 0 for every other op.
pub fn extra_outputs(op: &Op) -> usize {
    match op {
        Op::Fused(body) => body.outputs().len().saturating_sub(1),
        Op::Attention { .. } | Op::AttentionGrad { wrt: AttnWrt::KeyValueAndQuery, .. } => 1,
        _ => 0,
    }
}

/// The type of output `output` (1 or more) of node `of`, which an
/// [`Op::Extra`] reads: a fused node's body output, an attention's rows'
/// log-sum-exp (output 1, see [`Op::AttentionDelta`]), or the queries'
/// gradient of a `kv+q` attention gradient (output 1); why there is none
/// otherwise.
pub fn extra_type(graph: &Graph, of: NodeId, output: usize) -> Result<(Shape, DType), String> {
    let node = graph.node(of);
    match &node.op {
        Op::Fused(body) => {
            let outputs = body.outputs();
            if output == 0 || output >= outputs.len() {
                return Err(format!(
                    "output={output}, but {} has extra outputs 1..{} only",
                    describe(graph, of),
                    outputs.len()
                ));
            }
            let out = body.graph().node(outputs[output]);
            Ok((out.shape.clone(), out.dtype))
        }
        Op::Attention { .. } if output == 1 => {
            let q = graph.node(graph.operands(of)[0]);
            super::infer::attention_lse_type(&q.shape, q.dtype)
                .ok_or_else(|| format!("{} has no log-sum-exp output", describe(graph, of)))
        }
        Op::Attention { .. } => Err(format!(
            "output={output}, but {} has extra output 1 (its log-sum-exp) only",
            describe(graph, of)
        )),
        Op::AttentionGrad { wrt: AttnWrt::KeyValueAndQuery, .. } if output == 1 => {
            let q = graph.node(graph.operands(of)[0]);
            Ok((q.shape.clone(), node.dtype))
        }
        Op::AttentionGrad { wrt: AttnWrt::KeyValueAndQuery, .. } => Err(format!(
            "output={output}, but {} has extra output 1 (the queries' gradient) only",
            describe(graph, of)
        )),
        _ => Err(format!(
            "the operand {} has no extra outputs (only fused nodes, attention and attention_grad wrt=kv+q have)",
            describe(graph, of)
        )),
    }
}

/// `%4 (mul)`: how messages name a node.
fn describe(graph: &Graph, id: NodeId) -> String {
    format!("{id} ({})", graph.node(id).op.mnemonic())
}

/// `f32[2,3]`: a type as the text IR writes it.
pub(crate) fn type_text(dtype: DType, shape: &Shape) -> String {
    format!("{dtype}{shape}")
}

/// Checks one node against [`infer`] and the source-op constraints. The
/// message has no node prefix: the verifier and the parser add their own
/// (a node id, a line). Shared so that the parser accepts exactly what the
/// verifier accepts.
pub(crate) fn check_node(
    op: &Op,
    operands: &[(&Shape, DType)],
    shape: &Shape,
    dtype: DType,
) -> Result<(), String> {
    shape.check_addressable(dtype.size(), &dtype.to_string())?;
    match infer(op, operands)? {
        Some((s, d)) => {
            if s != *shape || d != dtype {
                return Err(format!(
                    "declared {} but operands give {}",
                    type_text(dtype, shape),
                    type_text(d, &s)
                ));
            }
            Ok(())
        }
        None => check_source(op, shape, dtype),
    }
}

fn check_source(op: &Op, shape: &Shape, dtype: DType) -> Result<(), String> {
    let name = op.mnemonic();
    match op {
        Op::Random { .. } if !dtype.is_float() => {
            Err(format!("{name} produces floats, but the node is declared {dtype}"))
        }
        Op::Arange { start, step } => {
            if shape.rank() != 1 {
                return Err(format!("arange is 1-D, but the node is declared {}", type_text(dtype, shape)));
            }
            if !dtype.is_numeric() {
                return Err(format!("arange needs a numeric dtype, but the node is declared {dtype}"));
            }
            exact("arange start", *start, dtype)?;
            exact("arange step", *step, dtype)
        }
        Op::Full(value) => exact("full value", *value, dtype),
        _ => Ok(()),
    }
}

/// The constant must be exactly a value of the node's dtype, stored in the
/// carrier that dtype uses (so constant folding and hashing see one value).
fn exact(what: &str, value: Scalar, dtype: DType) -> Result<(), String> {
    let ok = match (value.to_dtype_exact(dtype), value) {
        (Some(Scalar::Float(a)), Scalar::Float(b)) => a == b || (a.is_nan() && b.is_nan()),
        (Some(converted), _) => converted == value,
        (None, _) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{what} {value:?} is not exactly representable in {dtype}"))
    }
}

/// One cycle, listed operand before user and starting at its smallest id,
/// or `None` for an acyclic graph.
fn find_cycle(graph: &Graph) -> Option<Vec<NodeId>> {
    if !graph.has_cycle() {
        return None;
    }
    // Kahn's algorithm; what it cannot remove is on a cycle or downstream of one.
    let distinct = |id: NodeId| {
        let mut ops = graph.operands(id);
        ops.sort_unstable();
        ops.dedup();
        ops
    };
    let mut pending: BTreeMap<NodeId, usize> =
        graph.node_ids().into_iter().map(|id| (id, distinct(id).len())).collect();
    let mut ready: Vec<NodeId> = pending.iter().filter(|(_, &c)| c == 0).map(|(&id, _)| id).collect();
    while let Some(n) = ready.pop() {
        pending.remove(&n);
        for u in graph.users(n) {
            if let Some(c) = pending.get_mut(&u) {
                *c -= 1;
                if *c == 0 {
                    ready.push(u);
                }
            }
        }
    }
    // Every remaining node has a remaining operand: walk operands until a repeat.
    let mut walk = vec![*pending.keys().next()?];
    loop {
        let cur = *walk.last()?;
        let next = distinct(cur).into_iter().find(|o| pending.contains_key(o))?;
        if let Some(pos) = walk.iter().position(|&w| w == next) {
            let mut cycle: Vec<NodeId> = walk[pos..].to_vec();
            cycle.reverse(); // operand before user
            let min = cycle.iter().enumerate().min_by_key(|(_, &id)| id).map(|(i, _)| i)?;
            cycle.rotate_left(min);
            cycle.push(cycle[0]);
            return Some(cycle);
        }
        walk.push(next);
    }
}
