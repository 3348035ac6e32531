//! A plan: what the passes hand a backend, and the side tables that the
//! planning passes attach to a graph (schedule, streams, memory).
//!
//! The tables are derived facts, so they live beside the graph, not in its
//! nodes, and any edit of the graph drops them ([`Graph`] clears its
//! [`PlanTables`] on every mutation): a table can never describe a graph
//! that has since changed.
//!
//! # Streams and events
//!
//! Each scheduled node runs on one stream; a stream runs its nodes in
//! schedule order. An [`Event`] is recorded on its node's stream right
//! after that node, and each waiter (a node on another stream) waits for it
//! before it starts. Node `a` *happens before* node `b` when they share a
//! stream and `a` comes first, or a chain of such steps and events leads
//! from `a` to `b`. A valid stream plan orders every operand before its
//! user this way, and records every event on a node scheduled before each
//! of its waiters (so a backend that issues work in schedule order never
//! waits on an event nobody has recorded yet); every event has a waiter.
//! Values that exist before the run (inputs, constants, and views of them
//! that need no copy) do no work: an edge from one needs no event, so they
//! may sit on any stream.
//!
//! # Memory
//!
//! Every value of the schedule has a [`Placement`]: `input` nodes are
//! [`Placement::Input`], `full` constants [`Placement::Constant`], a view
//! is an [`Placement::Alias`] of its *storage root* (the value its view
//! chain starts from), the storage root of a graph output is
//! [`Placement::Output`] (unless it is an input or a constant, which a
//! backend hands back as they are), and every other value is in the arena.
//! A graph output that `write_at` computes from an input whose every
//! other reader runs before it is [`Placement::OverInput`]: it is written
//! over that input's bytes when the caller gives them up (a variable's KV
//! cache, updated in place every decode step).
//! A `reshape` that no strides can express (of a transposed value, say)
//! copies: it is a storage root itself.
//!
//! Arena values own `bytes` bytes at `offset` (a multiple of 64) of one
//! arena allocation per plan. A value is *live* from its step to the step
//! of its last reader, readers of its aliases included (`live`). Two arena
//! values may share bytes only when every reader of the first (and the
//! first itself) happens before the second is written, or when the second
//! is computed in place of the first (`in_place_of`) by a fused elementwise
//! kernel that reads each element of it before writing that element. On
//! one stream that is: their live ranges are disjoint. On several, the
//! checker and the memory pass use a conservative window per value: it
//! ends at the last step of any node that is not ordered after all of the
//! value's readers (such a node may run while a reader still reads), and
//! values with disjoint windows may share. `lower_bound` is the most bytes
//! of arena values whose windows hold one step (a value and the one
//! computed in place of it count once): no layout of these windows uses
//! less.

use super::{FusedKind, Graph, NodeId, Op, ReduceOp};
use std::collections::BTreeMap;
use std::fmt;

/// An optimized graph and the order to run it in. Backends compile and run
/// plans; they never change them.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The optimized graph (its outputs are the plan's results); its
    /// [`PlanTables`] hold the stream and memory plans when planned.
    pub graph: Graph,
    /// Every node the outputs need, operands before users: the graph's
    /// schedule when it has one, else its topological order.
    pub order: Vec<NodeId>,
    /// How many input slots the plan binds per run (`Op::Input(k)`, `k < inputs`).
    pub inputs: usize,
    /// How many random streams the plan reads per run (`Op::Random { stream }`).
    pub random_streams: usize,
    /// The input slots whose bytes an output is written over
    /// ([`Placement::OverInput`]), ascending: a caller that gives those
    /// buffers up (holds no other reference to them) lets the run write in
    /// place; see `Executable::launch_owned`.
    pub donated: Vec<u32>,
}

impl Plan {
    /// A plan that runs `graph` in its schedule (or topological order).
    pub fn new(graph: Graph) -> Plan {
        let order = match graph.tables().schedule.as_ref() {
            Some(schedule) => schedule.clone(),
            None => graph.schedule_or_topo(),
        };
        let mut inputs = 0;
        let mut random_streams = 0;
        for &id in &order {
            match graph.node(id).op {
                Op::Input(k) => inputs = inputs.max(k as usize + 1),
                Op::Random { stream, .. } => random_streams = random_streams.max(stream as usize + 1),
                _ => {}
            }
        }
        let mut donated: Vec<u32> = match graph.tables().memory.as_ref() {
            Some(memory) => memory
                .values
                .values()
                .filter_map(|v| match v.placement {
                    Placement::OverInput(input) if graph.contains(input) => match graph.node(input).op {
                        Op::Input(k) => Some(k),
                        _ => None,
                    },
                    _ => None,
                })
                .collect(),
            None => Vec::new(),
        };
        donated.sort_unstable();
        donated.dedup();
        Plan { graph, order, inputs, random_streams, donated }
    }

    /// The plan bound to `inputs` slots per run: those of the graph it
    /// was optimized from. Passes may remove inputs (folding a `where` on
    /// a constant condition drops a branch, then DCE its input), and the
    /// caller still binds every slot of the graph it extracted, so a plan
    /// must accept slots it no longer reads (a backend leaves them alone).
    pub fn binding(mut self, inputs: usize) -> Plan {
        self.inputs = self.inputs.max(inputs);
        self
    }
}

/// Identifies a stream of a [`StreamPlan`] (`0..count`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// Identifies an event of a [`StreamPlan`] (its index in `events`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "e{}", self.0)
    }
}

/// Derived facts about a graph, filled by the planning passes and dropped
/// by any edit of the graph.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanTables {
    /// The execution order: every node the outputs need, operands first.
    pub schedule: Option<Vec<NodeId>>,
    /// Which stream runs each node and the events between streams.
    pub streams: Option<StreamPlan>,
    /// Where each value's bytes live.
    pub memory: Option<MemoryPlan>,
    /// Launch groups: runs of consecutive scheduled nodes that a backend
    /// runs as one launch (see [`LaunchGroup`]). Empty without any.
    pub groups: Vec<LaunchGroup>,
}

/// Fused elementwise nodes, or column reductions, that a backend runs as
/// one launch (a CUDA multi-tensor kernel, one parallel loop on the CPU):
/// the optimizer's update of every parameter, the scaler's checks, a
/// layer norm's parameter gradients. The `horizontal` pass
/// makes them; [`crate::ir::verify`] holds them to this contract:
///
/// - the members are at least two consecutive steps of the schedule, in
///   schedule order, on one stream, and each node is in one group at most;
/// - every member is a `fused` node of kind elementwise, or every member
///   is a column reduction (see [`GroupKind`]);
/// - no member reads another (they are independent).
///
/// Memory is planned as if every member ran at once, anywhere between the
/// group's first and last step: each member's value is written from the
/// first step, each member's operands are read until the last step, and
/// a member computes in place of (or writes over) an operand only when
/// no other member reads it (`lifetimes.rs`). So a backend may run the
/// members in any order, or all together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchGroup {
    /// The members, in schedule order.
    pub members: Vec<NodeId>,
}

/// The kinds of launch group members; a group's members are of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// `fused` nodes of kind elementwise.
    Elementwise,
    /// Column reductions: a `sum`, `mean`, `max` or `min` over a value's
    /// leading dims that keeps at least its last (`[rows, cols] →
    /// [cols]`: a bias's gradient). A backend runs them as one kernel
    /// whose blocks each take a member's columns.
    Columns,
}

impl GroupKind {
    /// The kind of group node `id` may be a member of, if any.
    pub fn of(graph: &Graph, id: NodeId) -> Option<GroupKind> {
        match &graph.node(id).op {
            Op::Fused(b) if *b.kind() == FusedKind::Elementwise => Some(GroupKind::Elementwise),
            Op::Reduce { op, dims, .. } => {
                let rank = graph.operands(id).first().map_or(0, |&x| graph.node(x).shape.rank());
                let leading =
                    !dims.is_empty() && dims.len() < rank && dims.iter().enumerate().all(|(i, &d)| i == d);
                let column = matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min);
                (leading && column).then_some(GroupKind::Columns)
            }
            _ => None,
        }
    }
}

impl PlanTables {
    /// True when no table is present.
    pub fn is_empty(&self) -> bool {
        self.schedule.is_none() && self.streams.is_none() && self.memory.is_none() && self.groups.is_empty()
    }

    /// The same tables with every node id renamed by `map` (entries of
    /// nodes `map` does not know are dropped): compaction uses it.
    pub fn remap(&self, map: &std::collections::HashMap<NodeId, NodeId>) -> PlanTables {
        let m = |id: &NodeId| map.get(id).copied();
        PlanTables {
            schedule: self.schedule.as_ref().map(|s| s.iter().filter_map(m).collect()),
            streams: self.streams.as_ref().map(|s| StreamPlan {
                count: s.count,
                stream_of: s.stream_of.iter().filter_map(|(id, st)| Some((m(id)?, *st))).collect(),
                events: s
                    .events
                    .iter()
                    .filter_map(|e| {
                        Some(Event { after: m(&e.after)?, waiters: e.waiters.iter().filter_map(m).collect() })
                    })
                    .collect(),
            }),
            memory: self.memory.as_ref().map(|mem| MemoryPlan {
                values: mem
                    .values
                    .iter()
                    .filter_map(|(id, v)| {
                        let placement = match &v.placement {
                            Placement::Arena { offset, bytes, in_place_of } => Placement::Arena {
                                offset: *offset,
                                bytes: *bytes,
                                in_place_of: in_place_of.as_ref().and_then(m),
                            },
                            Placement::Alias(of) => Placement::Alias(m(of)?),
                            Placement::OverInput(of) => Placement::OverInput(m(of)?),
                            other => other.clone(),
                        };
                        Some((m(id)?, ValueMemory { placement, live: v.live }))
                    })
                    .collect(),
                ..mem.clone()
            }),
            groups: self
                .groups
                .iter()
                .map(|g| LaunchGroup { members: g.members.iter().filter_map(m).collect() })
                .filter(|g| g.members.len() >= 2)
                .collect(),
        }
    }
}

/// The stream plan (see the module docs for what it means).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamPlan {
    /// How many streams the plan uses (ids `0..count`).
    pub count: u32,
    /// The stream of every scheduled node.
    pub stream_of: BTreeMap<NodeId, StreamId>,
    /// The events, indexed by [`EventId`].
    pub events: Vec<Event>,
}

/// One cross-stream dependency: recorded after `after` on its stream,
/// awaited by each waiter before it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The node after which the event is recorded.
    pub after: NodeId,
    /// The nodes (on other streams) that wait for it, in schedule order.
    pub waiters: Vec<NodeId>,
}

/// The memory plan: a placement and a lifetime per scheduled value, and
/// the totals a reader compares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Size of the one arena allocation (bytes).
    pub arena_bytes: u64,
    /// The most bytes of arena values live at any one step (over the
    /// stream-aware windows of the module docs): no layout of these
    /// lifetimes can use less.
    pub lower_bound: u64,
    /// The bytes of all arena values added up: one allocation per value.
    pub naive_bytes: u64,
    /// Every scheduled value.
    pub values: BTreeMap<NodeId, ValueMemory>,
}

/// Where one value lives and for which steps of the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueMemory {
    /// Its bytes.
    pub placement: Placement,
    /// The schedule steps (indices into the schedule) of its definition
    /// and of its last reader, inclusive; `last == first` when nothing in
    /// the plan reads it.
    pub live: (u32, u32),
}

/// Where a value's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `bytes` bytes at `offset` in the plan's arena; `in_place_of` names
    /// the operand whose bytes an elementwise kernel overwrites.
    Arena {
        /// Byte offset in the arena (aligned).
        offset: u64,
        /// Size in bytes.
        bytes: u64,
        /// The operand it overwrites in place, if any.
        in_place_of: Option<NodeId>,
    },
    /// A view: the bytes of the named value, read through a layout.
    Alias(NodeId),
    /// Bound by the caller per run; never written.
    Input,
    /// Returned to the caller: its own allocation, never shared.
    Output,
    /// Returned to the caller, written over the bytes of the named `input`
    /// node (a `write_at` into a variable): the run takes that input's
    /// bytes when the caller gives them up ([`Plan::donated`]), and a
    /// backend writes over a copy of them otherwise. The memory pass
    /// plans it only when every other reader of the input runs before the
    /// writer (see [`crate::ir::lifetimes::Facts::over_input_refusal`]).
    OverInput(NodeId),
    /// A constant (`full`): one element, not in the arena.
    Constant,
}
