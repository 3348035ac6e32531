//! The effects check: after every pass, the graph still runs the
//! collectives that entered the pipeline, each once, in recorded order.
//!
//! *Why.* A rank's k-th collective meets every other rank's k-th. Passes
//! see each rank's own constants, so a pass that merges two collectives
//! (CSE of equal-looking operands), drops one (folding a `where` on a
//! constant, then DCE) or reorders two (the schedule) on some ranks only
//! pairs different rounds: a wrong sum on one rank and a hang or timeout
//! on another. Passes are written not to (collectives are effects: see
//! [`Op::is_effect`](crate::ir::Op::is_effect) and each pass's header);
//! this check makes it an invariant the pass manager enforces, as
//! [`crate::ir::verify`] does for types.
//!
//! *What.* [`Recorded::of`] lists the input graph's collectives by
//! sequence number (`seq`), with op, dtype and shape. After each pass,
//! [`Recorded::check`] lists the graph's collectives in the order a
//! backend would run them: the schedule's order once there is a schedule,
//! else by `seq` (the schedule keeps that order), and requires the two
//! lists to be equal. The first difference is an [`Error::Verify`] naming
//! the pass. It runs in every build, not only where `verify` does: it is
//! one walk of the node list, and what it prevents is a hang on a GPU.

use crate::ir::{Collective, DType, Graph, NodeId, Op, Shape};
use crate::{Error, Result};

/// One collective as recorded: what the other ranks pair it by.
#[derive(Clone, Debug, PartialEq)]
struct Entry {
    seq: u64,
    what: Collective,
    dtype: DType,
    shape: Shape,
}

impl Entry {
    fn of(graph: &Graph, id: NodeId) -> Option<Entry> {
        let node = graph.node(id);
        match node.op {
            Op::Collective { what, seq } => {
                Some(Entry { seq, what, dtype: node.dtype, shape: node.shape.clone() })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seq={} ({} {}{})", self.seq, self.what.mnemonic(), self.dtype, self.shape)
    }
}

/// The collectives a graph entered the pipeline with, in recorded order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recorded(Vec<Entry>);

impl Recorded {
    /// The collectives of `graph` (a verified pipeline input), by `seq`.
    pub(crate) fn of(graph: &Graph) -> Recorded {
        Recorded(graph.effects().into_iter().filter_map(|id| Entry::of(graph, id)).collect())
    }

    /// Checks that `graph`, after pass `pass`, runs exactly the recorded
    /// collectives in recorded order (see the module docs).
    pub(crate) fn check(&self, graph: &Graph, pass: &str) -> Result<()> {
        if self.0.is_empty() && graph.effects().is_empty() {
            return Ok(());
        }
        let scheduled = graph.tables().schedule.is_some();
        let mut running: Vec<Entry> =
            graph.schedule_or_topo().into_iter().filter_map(|id| Entry::of(graph, id)).collect();
        if !scheduled {
            running.sort_by_key(|e| e.seq);
        }
        match first_difference(&self.0, &running, scheduled) {
            None => Ok(()),
            Some(what) => Err(Error::Verify(format!(
                "after pass {pass}: {what}; every rank must run the collectives it recorded, each once, in recorded order"
            ))),
        }
    }
}

/// What is wrong with `running` against `recorded`, in words.
fn first_difference(recorded: &[Entry], running: &[Entry], scheduled: bool) -> Option<String> {
    for (k, want) in recorded.iter().enumerate() {
        let Some(got) = running.get(k) else {
            return Some(format!("collective {want} was recorded but the graph no longer runs it"));
        };
        if got == want {
            continue;
        }
        if got.seq == want.seq {
            return Some(format!(
                "collective seq={} was recorded as {} {}{} but the graph runs {} {}{}",
                want.seq,
                want.what.mnemonic(),
                want.dtype,
                want.shape,
                got.what.mnemonic(),
                got.dtype,
                got.shape
            ));
        }
        if !running.iter().any(|r| r.seq == want.seq) {
            return Some(format!("collective {want} was recorded but the graph no longer runs it"));
        }
        if !recorded.iter().any(|r| r.seq == got.seq) {
            return Some(format!("the graph runs collective {got}, which was never recorded"));
        }
        let order = if scheduled { "the schedule runs" } else { "the graph runs" };
        return Some(format!("{order} collective {got} where {want} was recorded"));
    }
    running.get(recorded.len()).map(|extra| match recorded.iter().any(|r| r.seq == extra.seq) {
        true => format!("the graph runs collective {extra} twice"),
        false => format!("the graph runs collective {extra}, which was never recorded"),
    })
}

#[cfg(test)]
mod tests;
