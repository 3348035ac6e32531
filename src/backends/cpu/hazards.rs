//! The executor's own check of a memory plan against its run order: two
//! arena values that share bytes never overlap in time.
//!
//! `ir::verify` checks the planner's post-conditions too; this check is
//! what the executor's soundness rests on, so it does not trust that the
//! verifier ran or covers everything. For every two arena values whose
//! ranges overlap, the later-written one may only be written after the
//! earlier one's write and after every read of it (through views too)
//! *happen before* it: the same stream earlier, or a chain of events (see
//! [`crate::ir::plan`]). The one exception is a kernel that computes its
//! value in place of the operand it reads. An `extra` output's bytes are
//! written by its fused node's step, so that step is its writer. Without it, one kernel could
//! write bytes while another (on another stream) reads them: a data race.

use super::exec::{Place, Step};
use crate::ir::Graph;
use crate::{Error, Result};

/// When each step runs relative to the others.
pub(super) struct RunOrder {
    /// The stream of each step.
    pub stream: Vec<usize>,
    /// The position of each step on its stream.
    pub seq: Vec<usize>,
    /// `clock[i][s]`: how many steps of stream `s` happen before step `i`
    /// (step `i` included).
    pub clock: Vec<Vec<usize>>,
    /// The launch group of each step: members of one group run at once
    /// (`run.rs`), so none is before another.
    pub group: Vec<Option<usize>>,
}

impl RunOrder {
    /// All steps in order on one stream.
    pub(super) fn sequential(n: usize) -> RunOrder {
        RunOrder {
            stream: vec![0; n],
            seq: (0..n).collect(),
            clock: (0..n).map(|i| vec![i + 1]).collect(),
            group: vec![None; n],
        }
    }

    /// True when step `p` finishes before step `q` starts (or `p == q`).
    fn before(&self, p: usize, q: usize) -> bool {
        let together = self.group[p].is_some() && self.group[p] == self.group[q];
        p == q || (!together && self.clock[q][self.stream[p]] > self.seq[p])
    }
}

/// Checks that no arena bytes are written while an overlapping value is
/// still to be read (or written) by a step not ordered before the write.
pub(super) fn check(graph: &Graph, steps: &[Step], order: &RunOrder) -> Result<()> {
    let n = steps.len();
    // The arena value each step's value is (or views), and its readers.
    let mut root: Vec<Option<usize>> = vec![None; n];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut ranges = Vec::new();
    // The step whose kernel writes each step's bytes.
    let writer: Vec<usize> = (0..n)
        .map(|i| match graph.node(steps[i].id).op {
            crate::ir::Op::Extra { .. } => steps[i].operands.first().copied().unwrap_or(i),
            _ => i,
        })
        .collect();
    for i in 0..n {
        let size = graph.node(steps[i].id).dtype.size();
        root[i] = match steps[i].place {
            Place::Arena { offset, len } | Place::InPlaceOf { offset, len, .. } => {
                if len > 0 {
                    ranges.push((offset, offset + len * size, i));
                }
                Some(i)
            }
            Place::Auto if graph.node(steps[i].id).op.is_view() => {
                steps[i].operands.first().and_then(|&p| root[p])
            }
            Place::Auto | Place::OverInput => None,
        };
        for &p in &steps[i].operands {
            if let Some(r) = root[p] {
                readers[r].push(i);
            }
        }
    }
    ranges.sort_unstable();
    for a in 0..ranges.len() {
        let (_, end, x) = ranges[a];
        for &(start, _, y) in &ranges[a + 1..] {
            if start >= end {
                break;
            }
            let (first, second) = if x < y { (x, y) } else { (y, x) };
            let in_place = matches!(steps[second].place, Place::InPlaceOf { slot, .. }
                if steps[second].operands.get(slot) == Some(&first));
            let name = |i: usize| steps[i].id;
            let (wf, ws) = (writer[first], writer[second]);
            if wf == ws && first != second || !order.before(wf, ws) {
                return Err(Error::Backend(format!(
                    "cpu: {} and {} share arena bytes but may be written at once",
                    name(first),
                    name(second)
                )));
            }
            for &r in &readers[first] {
                if !(order.before(r, ws) || (r == second && in_place)) {
                    return Err(Error::Backend(format!(
                        "cpu: {} overwrites the arena bytes of {} before its reader {} has run",
                        name(second),
                        name(first),
                        name(r)
                    )));
                }
            }
        }
    }
    Ok(())
}
