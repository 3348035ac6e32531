//! Streams: independent branches onto separate streams, with the fewest
//! events that keep every dependency.
//!
//! *Does.* Assigns every scheduled node (the schedule table, or the
//! topological order, which it then stores as the schedule) to one of
//! `cx.options.streams` streams and adds the events that order every
//! operand edge between streams. With one stream everything is on stream
//! 0 and there are no events. With more, as Caffe2's async scheduler does:
//! 1. *Chains.* Walking the schedule, a node continues the chain of its
//!    first operand (slot order) whose first-scheduled user it is and
//!    which is its chain's last node; otherwise it starts a chain. Linear
//!    runs stay on one stream, so events only sit where work forks/joins.
//! 2. *Streams.* Chains that do work, in order of their first node, go to
//!    the stream with the least work so far (bytes written; ties to the
//!    lowest stream). Chains that do none (inputs, constants, views) join
//!    the stream of their last node's first user.
//! 3. *Events.* Walking the schedule with a vector clock per node (which
//!    node of each stream is known to have finished), a node that reads
//!    an operand on another stream not yet ordered before it waits for an
//!    event recorded right after the latest such operand of that stream.
//!    One event per recording node serves all its waiters; an edge that
//!    earlier events already order gets none. Edges from values that exist
//!    before the run (inputs, constants, views of them) need no event.
//!
//! The members of a launch group ([`crate::ir::LaunchGroup`]) all take
//! the stream of the first: a backend runs them as one launch. An `extra`
//! output takes its fused node's stream: that node's kernel writes it.
//!
//! Collectives (`crate::dist`) go to a stream of their own, one past the
//! compute streams, whatever the option: every rank must issue them in
//! one order (a single stream, in schedule order, does), and the compute
//! after one (the rest of the backward pass) does not wait for it. A
//! collective neither continues nor starts a chain another node joins.
//!
//! The stream count in the table is the number of streams used (at most
//! the option, plus one for collectives). Events are numbered in the
//! schedule order of their recorders.
//!
//! *Does not.* Move nodes in the schedule (a backend issues work in
//! schedule order), balance by measured time, or change the graph.
//!
//! *Preserves.* The graph, the schedule and the launch groups.
//!
//! *Invalidates.* The memory table (lifetimes depend on streams).
//!
//! *Assumes.* A verified graph with a valid schedule table if any.
//! O(n·s) time and memory for s streams.

use super::{Changed, Pass, PassCtx};
use crate::ir::lifetimes::{value_bytes, Facts, Kind};
use crate::ir::{Event, Graph, NodeId, Phase, StreamId, StreamPlan};
use crate::Result;
use std::collections::{BTreeMap, HashMap};

/// Spreads the schedule over streams (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Streams;

impl Pass for Streams {
    fn name(&self) -> &'static str {
        "streams"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let order = graph.schedule_or_topo();
        let plan = plan_streams(graph, &order, cx.options.streams.max(1));
        cx.note(format!("{} stream(s), {} event(s)", plan.count, plan.events.len()));
        tracing::debug!(streams = plan.count, events = plan.events.len(), "streams");
        let tables = graph.tables_mut();
        let changed = tables.streams.as_ref() != Some(&plan) || tables.schedule.is_none();
        tables.schedule = Some(order);
        tables.streams = Some(plan);
        tables.memory = None;
        Ok(changed.into())
    }

    fn reaches(&self) -> Phase {
        Phase::Scheduled
    }
}

/// The stream plan of `order` on at most `max_streams` streams.
fn plan_streams(graph: &Graph, order: &[NodeId], max_streams: u32) -> StreamPlan {
    let n = order.len();
    let collective: Vec<bool> = order.iter().map(|&id| graph.node(id).op.is_collective()).collect();
    let any_collective = collective.contains(&true);
    if (max_streams == 1 && !any_collective) || n == 0 {
        let stream_of = order.iter().map(|&id| (id, StreamId(0))).collect();
        return StreamPlan { count: 1, stream_of, events: Vec::new() };
    }
    let facts = Facts::new(graph, order, None);
    let step: HashMap<NodeId, usize> = order.iter().enumerate().map(|(t, &id)| (id, t)).collect();
    let operands: Vec<Vec<usize>> = order
        .iter()
        .map(|&id| {
            let mut ops: Vec<usize> = Vec::new();
            for o in graph.operands(id) {
                if !ops.contains(&step[&o]) {
                    ops.push(step[&o]);
                }
            }
            ops
        })
        .collect();
    let mut first_user = vec![usize::MAX; n];
    for (t, ops) in operands.iter().enumerate() {
        for &o in ops {
            first_user[o] = first_user[o].min(t);
        }
    }

    // 1. Chains.
    let mut chain_of = vec![0usize; n];
    let mut tails: Vec<usize> = Vec::new();
    let mut work: Vec<u64> = Vec::new();
    for t in 0..n {
        let joined = operands[t]
            .iter()
            .copied()
            .find(|&o| first_user[o] == t && tails[chain_of[o]] == o && !collective[o] && !collective[t]);
        let c = match joined {
            Some(o) => chain_of[o],
            None => {
                tails.push(t);
                work.push(0);
                tails.len() - 1
            }
        };
        chain_of[t] = c;
        tails[c] = t;
        if facts.kind[t] == Kind::Arena || facts.kind[t] == Kind::Output {
            work[c] += value_bytes(graph, order[t]).max(1);
        }
    }

    // 2. Streams: working chains by load, the others beside their user.
    let mut stream_of_chain = vec![u32::MAX; tails.len()];
    let mut load = vec![0u64; max_streams as usize];
    for c in 0..tails.len() {
        if collective[tails[c]] {
            stream_of_chain[c] = max_streams; // the collectives' own stream
        } else if work[c] > 0 {
            let s = (0..load.len()).min_by_key(|&s| (load[s], s)).unwrap_or(0);
            load[s] += work[c];
            stream_of_chain[c] = s as u32;
        }
    }
    for c in (0..tails.len()).rev() {
        if stream_of_chain[c] == u32::MAX {
            let user = first_user[tails[c]];
            stream_of_chain[c] = if user < n && stream_of_chain[chain_of[user]] != u32::MAX {
                stream_of_chain[chain_of[user]]
            } else {
                0
            };
        }
    }
    let mut stream: Vec<usize> = (0..n).map(|t| stream_of_chain[chain_of[t]] as usize).collect();
    for group in &graph.tables().groups {
        let steps: Vec<usize> = group.members.iter().filter_map(|m| step.get(m).copied()).collect();
        if let Some(&first) = steps.first() {
            let s = stream[first];
            steps.iter().for_each(|&t| stream[t] = s);
        }
    }
    for t in 0..n {
        if let crate::ir::Op::Extra { .. } = graph.node(order[t]).op {
            stream[t] = stream[operands[t][0]];
        }
    }
    let count = stream.iter().max().map_or(1, |&s| s + 1);

    // 3. Events, with a vector clock per node.
    let mut idx = vec![0i64; n];
    let mut seen = vec![0i64; count];
    for t in 0..n {
        idx[t] = seen[stream[t]];
        seen[stream[t]] += 1;
    }
    let mut vc = vec![-1i64; n * count];
    let mut last_on = vec![usize::MAX; count];
    let mut event_at: BTreeMap<usize, Vec<usize>> = BTreeMap::new(); // recorder step -> waiter steps
    for t in 0..n {
        let s = stream[t];
        if last_on[s] != usize::MAX {
            let p = last_on[s];
            vc.copy_within(p * count..(p + 1) * count, t * count);
        }
        vc[t * count + s] = idx[t];
        // The latest unordered operand on each other stream, latest first.
        let mut latest: BTreeMap<usize, usize> = BTreeMap::new(); // stream -> operand step
        for &o in &operands[t] {
            if stream[o] != s && !facts.ready_before_run(o) {
                let e = latest.entry(stream[o]).or_insert(o);
                if idx[o] > idx[*e] {
                    *e = o;
                }
            }
        }
        let mut waits: Vec<usize> = latest.into_values().collect();
        waits.sort_unstable_by(|a, b| b.cmp(a));
        for o in waits {
            if vc[t * count + stream[o]] >= idx[o] {
                continue; // already ordered through an earlier event
            }
            event_at.entry(o).or_default().push(t);
            for k in 0..count {
                vc[t * count + k] = vc[t * count + k].max(vc[o * count + k]);
            }
        }
        last_on[s] = t;
    }
    StreamPlan {
        count: count as u32,
        stream_of: (0..n).map(|t| (order[t], StreamId(stream[t] as u32))).collect(),
        events: event_at
            .into_iter()
            .map(|(r, ws)| Event { after: order[r], waiters: ws.into_iter().map(|w| order[w]).collect() })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    fn planned(src: &str, streams: u32) -> Graph {
        let mut g = parse(src).unwrap();
        let mut cx = PassCtx::default();
        cx.options.streams = streams;
        Streams.run(&mut g, &mut cx).unwrap();
        crate::ir::verify(&g).unwrap();
        g
    }

    #[test]
    fn diamond_needs_one_event() {
        let src = "%x: f32[8] = input 0\n%a: f32[8] = exp %x\n%b: f32[8] = log %x\n\
                   %c: f32[8] = add %a, %b\nreturn %c\n";
        let g = planned(src, 2);
        let s = g.tables().streams.as_ref().unwrap();
        assert_eq!((s.count, s.events.len()), (2, 1));
        let g = planned(src, 1);
        let s = g.tables().streams.as_ref().unwrap();
        assert_eq!((s.count, s.events.len()), (1, 0));
    }
}
