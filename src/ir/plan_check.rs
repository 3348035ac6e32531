//! Checks of the planning tables a graph carries (schedule, streams,
//! memory): what [`super::verify`] runs once a planning pass has filled
//! them, so a table that does not describe its graph is caught right after
//! the pass that wrote it.

use super::{Graph, NodeId};
use std::collections::HashSet;

/// Checks every table the graph carries; the message names the first
/// broken rule.
pub(crate) fn check_tables(graph: &Graph) -> Result<(), String> {
    let tables = graph.tables();
    if let Some(schedule) = &tables.schedule {
        check_schedule(graph, schedule)?;
    }
    Ok(())
}

/// The schedule lists every node the outputs need, once, operands first,
/// and nothing else.
fn check_schedule(graph: &Graph, schedule: &[NodeId]) -> Result<(), String> {
    let needed: HashSet<NodeId> = graph.topo_order().into_iter().collect();
    let mut seen = HashSet::new();
    for (step, &id) in schedule.iter().enumerate() {
        if !needed.contains(&id) {
            return Err(format!("schedule step {step} is {id}, which the outputs do not need"));
        }
        if !seen.insert(id) {
            return Err(format!("schedule step {step}: {id} is scheduled twice"));
        }
        if let Some(o) = graph.operands(id).into_iter().find(|o| !seen.contains(o)) {
            return Err(format!("schedule step {step}: {id} runs before its operand {o}"));
        }
    }
    if seen.len() != needed.len() {
        let mut missing: Vec<NodeId> = needed.difference(&seen).copied().collect();
        missing.sort();
        return Err(format!("the schedule leaves out {}", missing[0]));
    }
    Ok(())
}
