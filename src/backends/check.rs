//! The checks every backend runs on a [`Plan`] before compiling it, so the
//! CPU backend and the CUDA lowering refuse the same bad plans with the
//! same message.
//!
//! [`crate::backends::Backend::compile`] is public, and a plan can be
//! written by hand or parsed from text: nothing but this check stands
//! between a plan whose tables contradict its graph and kernels that write
//! outside their memory. It asks for what both backends' soundness rests
//! on:
//!
//! - the order lists nodes of the graph, each once, operands first, every
//!   output among them, and no `buffer` node (plans bind inputs);
//! - every `input k` and `random` stream is within the plan's counts;
//! - every node's type is the one its operands give ([`crate::ir::infer`]:
//!   kernels index memory on the strength of node types);
//! - a plan with planning tables verifies ([`crate::ir::verify`]): the
//!   tables describe the graph (arena ranges aligned, as large as their
//!   value and inside the arena; no two live values sharing bytes; every
//!   cross-stream edge ordered by an event; see `ir/plan_check.rs`), and
//!   it runs in exactly its schedule's order.
//!
//! Each backend then checks what only it knows (the CPU executor, its run
//! order against the arena; the CUDA lowering, every location against its
//! region).

use crate::ir::{DType, Graph, NodeId, Op, Plan, Shape};
use std::collections::HashSet;

/// Checks `plan` (see the module docs); the message names the first
/// broken rule.
pub(crate) fn check_plan(plan: &Plan) -> Result<(), String> {
    let graph = &plan.graph;
    let mut done = HashSet::with_capacity(plan.order.len());
    for &id in &plan.order {
        if !graph.contains(id) {
            return Err(format!("plan orders {id}, which is not in its graph"));
        }
        if let Some(o) = graph.operands(id).into_iter().find(|o| !done.contains(o)) {
            return Err(format!("operand {o} of {id} is not in the plan order before it"));
        }
        match graph.node(id).op {
            Op::Buffer(b) => {
                return Err(format!(
                    "plan contains buffer node {id} (buffer {}); plans bind inputs instead",
                    b.0
                ))
            }
            Op::Input(k) if k as usize >= plan.inputs => {
                return Err(format!("{id} reads input {k}, but the plan binds {} input(s)", plan.inputs))
            }
            Op::Random { stream, .. } if stream as usize >= plan.random_streams => {
                return Err(format!(
                    "{id} draws from random stream {stream}, but the plan has {} stream(s)",
                    plan.random_streams
                ))
            }
            _ => {}
        }
        check_type(graph, id)?;
        if !done.insert(id) {
            return Err(format!("plan orders {id} twice"));
        }
    }
    if let Some(o) = graph.outputs().iter().find(|o| !done.contains(o)) {
        return Err(format!("output {o} is not in the plan order"));
    }
    let tables = graph.tables();
    if !tables.is_empty() {
        crate::ir::verify(graph).map_err(|e| format!("the plan does not verify: {e}"))?;
        if tables.schedule.as_ref().is_some_and(|s| *s != plan.order) {
            return Err("the plan's order is not its graph's schedule".into());
        }
    }
    Ok(())
}

/// The node's declared type is the one its operands give.
fn check_type(graph: &Graph, id: NodeId) -> Result<(), String> {
    let node = graph.node(id);
    let operands = graph.operands(id);
    let types: Vec<(&Shape, DType)> =
        operands.iter().map(|&o| (&graph.node(o).shape, graph.node(o).dtype)).collect();
    match crate::ir::infer(&node.op, &types) {
        Ok(Some((s, d))) if s == node.shape && d == node.dtype => Ok(()),
        Ok(None) => Ok(()),
        Ok(Some((s, d))) => Err(format!(
            "{id} ({}) is declared {}{} but its operands give {d}{s}",
            node.op.mnemonic(),
            node.dtype,
            node.shape
        )),
        Err(e) => Err(format!("{id} ({}): {e}", node.op.mnemonic())),
    }
}
