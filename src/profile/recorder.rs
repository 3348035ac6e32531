//! What a profiled executable holds: each node's label (number, op,
//! region, stream), computed once when the plan is compiled, and the
//! clock readings of the runs not yet collected.
//!
//! A backend calls [`Recorder::record`] after each step (from any stream
//! thread: the readings are behind a mutex, taken once per step, only in
//! profiled plans); the context collects them after the run with
//! [`Recorder::take`]. Runs of one executable that overlap (two threads
//! reading at once) may collect each other's readings; their sum is
//! still every node's time.

use super::{fingerprint, NodeTime};
use crate::ir::text::numbering;
use crate::ir::{NodeId, Op, Plan};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A node's label in a profile.
#[derive(Clone, Debug)]
pub(crate) struct Label {
    pub node: usize,
    pub op: String,
    pub region: String,
    pub stream: u32,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Recorder {
    /// The plan's [`fingerprint`].
    pub plan: u64,
    labels: HashMap<NodeId, Label>,
    readings: Mutex<Vec<(NodeId, Instant, Instant)>>,
}

impl Recorder {
    /// Labels every scheduled node of `plan`.
    pub fn new(plan: &Plan) -> Recorder {
        let g = &plan.graph;
        let (_, number) = numbering(g);
        let streams = g.tables().streams.as_ref();
        let labels = plan
            .order
            .iter()
            .map(|&id| {
                let node = g.node(id);
                let op = match &node.op {
                    Op::Fused(b) => format!("fused {}", b.kind().name()),
                    other => other.mnemonic().to_string(),
                };
                let label = Label {
                    node: number.get(&id).copied().unwrap_or(usize::MAX),
                    op,
                    region: g.region_name(node.region),
                    stream: streams.and_then(|s| s.stream_of.get(&id)).map_or(0, |s| s.0),
                };
                (id, label)
            })
            .collect();
        Recorder { plan: fingerprint(g), labels, readings: Mutex::new(Vec::new()) }
    }

    /// Records that node `id` ran from `start` to `end`.
    pub fn record(&self, id: NodeId, start: Instant, end: Instant) {
        self.readings.lock().unwrap_or_else(|e| e.into_inner()).push((id, start, end));
    }

    /// The node time of `id`, from times the caller measured.
    pub fn time(&self, id: NodeId, start_us: f64, dur_us: f64) -> Option<NodeTime> {
        let l = self.labels.get(&id)?;
        Some(NodeTime {
            node: l.node,
            op: l.op.clone(),
            region: l.region.clone(),
            stream: l.stream,
            start_us,
            dur_us,
            prologue: false,
        })
    }

    /// Takes the readings so far, as times from `run_start`.
    pub fn take(&self, run_start: Instant) -> Vec<NodeTime> {
        let readings = std::mem::take(&mut *self.readings.lock().unwrap_or_else(|e| e.into_inner()));
        readings
            .into_iter()
            .filter_map(|(id, s, e)| {
                let start = s.saturating_duration_since(run_start).as_secs_f64() * 1e6;
                self.time(id, start, e.saturating_duration_since(s).as_secs_f64() * 1e6)
            })
            .collect()
    }
}
