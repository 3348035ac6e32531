//! Compiling a plan for the CPU: operand positions, use counts, where each
//! value's bytes go, the stream schedule, and the checks that make running
//! it sound whatever the planner wrote.
//!
//! # Placements
//!
//! Without a memory table every value is [`Place::Auto`]: inputs are the
//! bound buffers, constants one element broadcast, views share their
//! operand's storage, and every kernel writes a fresh (pooled) allocation
//! freed after its last use. With a memory table, `Arena` values are written
//! into their range of the plan's arena ([`Place::Arena`]); `Input`,
//! `Constant`, `Alias` and `Output` values behave as `Auto` does (an output
//! that would be a view into the arena is copied out when it is computed:
//! the next run reuses the arena).
//!
//! # Why the arena is sound
//!
//! A kernel writes an arena range through a `&mut [T]` while it reads its
//! operands through `&[T]`s. Checked here, at compile time: every range lies
//! inside the arena, is aligned for its dtype and has exactly the value's
//! bytes; no operand of a node (through any chain of views) overlaps the
//! node's own range, except the one operand a kernel overwrites in place,
//! which the kernel then reads from its output and never through a second
//! slice; no graph output is an arena value. With one stream the kernels run
//! one at a time, so these checks alone keep every `&mut` exclusive. With
//! several streams, kernels of different streams run at once; that no two
//! values sharing bytes are written or read at once is the plan's
//! post-condition, checked by [`crate::ir::verify`] (which compile runs on
//! every planned graph) and again by the executor itself (`hazards.rs`,
//! against the events), along with the cross-stream operand order and the
//! absence of deadlocks.

use super::arena::Arena;
use super::codegen::Codegen;
use super::fused::FusedKernel;
use super::hazards::RunOrder;
use crate::backends::DeviceStats;
use crate::ir::{NodeId, Op, Plan};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a step's value goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// As without a plan: the bound input, a broadcast constant, a view, or
    /// a fresh allocation of its own.
    Auto,
    /// `len` elements at byte `offset` of the arena.
    Arena { offset: usize, len: usize },
    /// The bytes of operand `slot` (an arena range), overwritten in place.
    InPlaceOf { slot: usize, offset: usize, len: usize },
    /// A `write_at` written over its target, or a fused node's output
    /// written over the operand its body marks, a donated input
    /// ([`crate::ir::Placement::OverInput`]), when the run holds the only
    /// reference to the input's storage; into a fresh allocation (as
    /// `Auto`) otherwise.
    OverInput,
}

/// One step of a compiled plan.
pub(super) struct Step {
    pub id: NodeId,
    /// Positions (in `order`) of the operands, in slot order.
    pub operands: Vec<usize>,
    pub place: Place,
    /// True for a graph output: its value must not stay in the arena.
    pub output: bool,
    /// Events (indices) this step waits for before it starts.
    pub waits: Vec<usize>,
    /// Events this step signals after it finishes.
    pub records: Vec<usize>,
    /// Whether the step does work or its value is ready before a run.
    pub source: SourceKind,
    /// (operand slot, output) pairs: the step writes that output (0 its
    /// value, 1.. a fused node's extra outputs) over the operand, a
    /// donated input, when the run holds its only reference (a `write_at`
    /// over its target, `(0, 0)`; a fused update over its variables, see
    /// `over.rs`). The run hands the step such an operand by value when
    /// the step is its last reader.
    pub over: Vec<(usize, usize)>,
}

/// What a step costs a stream: nothing (an input or a constant), nothing
/// beyond its operand (a view), or work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SourceKind {
    /// `input` or `full`: bound or made before any kernel runs.
    Ready,
    /// A view: ready exactly when its operand is.
    View,
    /// Anything else.
    Work,
}

/// The steps of each launch group (consecutive, on one stream) and the
/// group of each step.
pub(super) struct LaunchGroups {
    pub steps: Vec<Vec<usize>>,
    pub of: Vec<Option<usize>>,
}

/// The per-stream lists of steps when a plan uses more than one stream.
pub(super) struct Streams {
    /// Steps whose values are ready before any stream starts (inputs,
    /// constants and views of them, waiting for no event): the caller runs
    /// them first, so every stream may read them without an event (the
    /// stream plan's rule; see `ir::plan`).
    pub prelude: Vec<usize>,
    /// Step positions of each stream, in schedule order (prelude excluded).
    pub lists: Vec<Vec<usize>>,
    /// How many events the plan records.
    pub events: usize,
}

/// A plan prepared for repeated runs.
pub(super) struct CpuExecutable {
    pub plan: Arc<Plan>,
    pub stats: Arc<DeviceStats>,
    pub steps: Vec<Step>,
    /// How many times each position is read (operand slots plus outputs).
    pub uses: Vec<usize>,
    /// Positions of the graph outputs.
    pub outputs: Vec<usize>,
    /// Bytes of the arena, when the plan has arena values.
    pub arena_bytes: Option<usize>,
    /// The arena a run takes and gives back (`None` while one runs).
    pub arena: Mutex<Option<Arc<Arena>>>,
    /// Present when the plan runs on more than one stream.
    pub streams: Option<Streams>,
    /// The compiled kernel of every fused node.
    pub fused: HashMap<NodeId, FusedKernel>,
    /// The `extra` steps of each fused node with several outputs, by body
    /// output (`[j - 1]` for output `j`; `None` where no step reads it).
    pub extras: HashMap<NodeId, Vec<Option<usize>>>,
    /// The plan's launch groups, which `run.rs` runs at once.
    pub groups: LaunchGroups,
    /// The clock readings of a profiled plan (`CompileOptions::profile`).
    pub profile: Option<crate::profile::Recorder>,
    /// The process group the plan's collectives run in (the backend's,
    /// when it was compiled).
    pub member: Option<crate::dist::Joining>,
}

fn bad(msg: String) -> Error {
    Error::Backend(format!("cpu: {msg}"))
}

impl CpuExecutable {
    pub(super) fn new(plan: Arc<Plan>, stats: Arc<DeviceStats>, codegen: Codegen) -> Result<CpuExecutable> {
        let _span = tracing::debug_span!("compile", nodes = plan.order.len()).entered();
        crate::backends::check::check_plan(&plan).map_err(bad)?;
        let pos: HashMap<NodeId, usize> = plan.order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let find = |id: NodeId, what: &str| {
            pos.get(&id)
                .copied()
                .ok_or_else(|| bad(format!("{what} {id} is not in the plan order before its use")))
        };
        let mut steps = Vec::with_capacity(plan.order.len());
        let mut uses = vec![0usize; plan.order.len()];
        let mut fused = HashMap::new();
        let mut extras: HashMap<NodeId, Vec<Option<usize>>> = HashMap::new();
        for (i, &id) in plan.order.iter().enumerate() {
            if !plan.graph.contains(id) {
                return Err(bad(format!("plan orders {id}, which is not in its graph")));
            }
            let mut operands = Vec::new();
            for o in plan.graph.operands(id) {
                let p = find(o, "operand")?;
                if p >= i {
                    return Err(bad(format!("operand {o} of {id} runs after it")));
                }
                uses[p] += 1;
                operands.push(p);
            }
            if let Op::Buffer(b) = plan.graph.node(id).op {
                return Err(bad(format!(
                    "plan contains buffer node {id} (buffer {}); plans bind inputs instead",
                    b.0
                )));
            }
            match &plan.graph.node(id).op {
                Op::Fused(body) => {
                    fused.insert(id, FusedKernel::compile(body, id, codegen)?);
                }
                Op::Extra { output } => {
                    let of = plan.graph.operands(id)[0];
                    // A fused node's extra body outputs, an attention's
                    // log-sum-exp, a `kv+q` gradient's `dq` (output 1).
                    let count = match plan.graph.contains(of).then(|| &plan.graph.node(of).op) {
                        Some(op) if crate::ir::extra_outputs(op) > 0 => crate::ir::extra_outputs(op),
                        _ => {
                            return Err(bad(format!("extra {id} reads {of}, which writes no extra outputs")))
                        }
                    };
                    let slots = extras.entry(of).or_insert_with(|| vec![None; count]);
                    match output.checked_sub(1).and_then(|j| slots.get_mut(j)) {
                        Some(slot @ None) => *slot = Some(i),
                        Some(Some(_)) => {
                            return Err(bad(format!("two extra steps take output {output} of {of}")))
                        }
                        None => return Err(bad(format!("extra {id}: {of} has no output {output}"))),
                    }
                }
                _ => {}
            }
            let place = Place::Auto;
            let source = match plan.graph.node(id).op {
                Op::Input(_) | Op::Full(_) => SourceKind::Ready,
                ref op if op.is_view() => SourceKind::View,
                _ => SourceKind::Work,
            };
            steps.push(Step {
                id,
                operands,
                place,
                output: false,
                waits: vec![],
                records: vec![],
                source,
                over: Vec::new(),
            });
        }
        let mut outputs = Vec::new();
        for &o in plan.graph.outputs() {
            let p = find(o, "output")?;
            uses[p] += 1;
            outputs.push(p);
            steps[p].output = true;
        }
        let tables = plan.graph.tables();
        let arena_bytes = match &tables.memory {
            Some(mem) => {
                let bytes = usize::try_from(mem.arena_bytes).map_err(|_| bad("arena too large".into()))?;
                super::place::place_values(&plan, &mut steps, bytes, &fused)?;
                Some(bytes)
            }
            None => None,
        };
        let (streams, mut order) = match &tables.streams {
            Some(sp) if sp.count > 1 => {
                let (streams, order) = stream_lists(&pos, &mut steps, sp)?;
                (Some(streams), order)
            }
            Some(sp) if sp.count == 0 => return Err(bad("the stream plan has no streams".into())),
            _ => (None, RunOrder::sequential(steps.len())),
        };
        let groups = launch_groups(&plan, &pos, &order)?;
        order.group = groups.of.clone();
        if arena_bytes.is_some() {
            super::hazards::check(&plan.graph, &steps, &order)?;
        }
        let arena = match arena_bytes {
            Some(bytes) => Some(Arena::new(bytes, &stats)?),
            None => None,
        };
        tracing::debug!(
            arena_bytes = arena_bytes.unwrap_or(0),
            streams = streams.as_ref().map_or(1, |s| s.lists.len()),
            "compiled"
        );
        Ok(CpuExecutable {
            plan,
            stats,
            steps,
            uses,
            outputs,
            arena_bytes,
            arena: Mutex::new(arena),
            streams,
            fused,
            extras,
            groups,
            profile: None,
            member: None,
        })
    }
}

/// The plan's launch groups as step positions, checked to be what
/// `run.rs` can run at once: consecutive steps of one stream that do work
/// (the verifier checked the rest when the plan was compiled).
fn launch_groups(plan: &Plan, pos: &HashMap<NodeId, usize>, order: &RunOrder) -> Result<LaunchGroups> {
    let mut group_of = vec![None; plan.order.len()];
    let mut groups = Vec::new();
    for (g, group) in plan.graph.tables().groups.iter().enumerate() {
        let steps: Vec<usize> = group
            .members
            .iter()
            .map(|m| {
                pos.get(m).copied().ok_or_else(|| bad(format!("launch group member {m} is not in the plan")))
            })
            .collect::<Result<_>>()?;
        let consecutive =
            steps.windows(2).all(|w| w[1] == w[0] + 1 && order.stream[w[0]] == order.stream[w[1]]);
        if !consecutive || steps.len() < 2 {
            return Err(bad(format!("launch group {g} is not two or more consecutive steps of one stream")));
        }
        for &s in &steps {
            if group_of[s].replace(g).is_some() {
                return Err(bad(format!("{} is in two launch groups", plan.order[s])));
            }
        }
        groups.push(steps);
    }
    Ok(LaunchGroups { steps: groups, of: group_of })
}

/// Splits the steps into per-stream lists and attaches events, checking
/// that every stream and event exists, that every event is recorded on a
/// step before each of its waiters (so threads that each run their stream
/// in order never wait on each other in a cycle), and that every operand
/// on another stream happens before its user.
fn stream_lists(
    pos: &HashMap<NodeId, usize>,
    steps: &mut [Step],
    sp: &crate::ir::StreamPlan,
) -> Result<(Streams, RunOrder)> {
    let count = sp.count as usize;
    let mut stream = vec![0usize; steps.len()];
    let mut lists = vec![Vec::new(); count];
    let mut seq = vec![0usize; steps.len()];
    for (i, step) in steps.iter().enumerate() {
        let s =
            sp.stream_of.get(&step.id).ok_or_else(|| bad(format!("{} has no stream", step.id)))?.0 as usize;
        if s >= count {
            return Err(bad(format!("{} is on stream {s} of a {count}-stream plan", step.id)));
        }
        stream[i] = s;
        seq[i] = lists[s].len();
        lists[s].push(i);
    }
    for (e, ev) in sp.events.iter().enumerate() {
        let after = *pos
            .get(&ev.after)
            .ok_or_else(|| bad(format!("event e{e} follows {}, not in the plan", ev.after)))?;
        steps[after].records.push(e);
        for w in &ev.waiters {
            let wp =
                *pos.get(w).ok_or_else(|| bad(format!("event e{e} is awaited by {w}, not in the plan")))?;
            if wp <= after {
                return Err(bad(format!(
                    "{w} waits for event e{e}, recorded after {} which runs later",
                    ev.after
                )));
            }
            steps[wp].waits.push(e);
        }
    }
    // Sources that cost nothing are ready before the run (see `prelude`).
    let mut ready = vec![false; steps.len()];
    for i in 0..steps.len() {
        ready[i] = steps[i].waits.is_empty()
            && match steps[i].source {
                SourceKind::Ready => true,
                SourceKind::View => steps[i].operands.first().is_some_and(|&p| ready[p]),
                SourceKind::Work => false,
            };
    }
    // Vector clocks: clock[i][s] = how many steps of stream s happen before
    // or at step i.
    let mut clock: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
    let mut last_on = vec![None::<usize>; count];
    for i in 0..steps.len() {
        let mut c = match last_on[stream[i]] {
            Some(p) => clock[p].clone(),
            None => vec![0; count],
        };
        for &e in &steps[i].waits {
            let a = pos[&sp.events[e].after];
            for (x, y) in c.iter_mut().zip(&clock[a]) {
                *x = (*x).max(*y);
            }
        }
        for &p in &steps[i].operands {
            if !ready[p] && c[stream[p]] <= seq[p] {
                return Err(bad(format!(
                    "{} on stream {} reads {} of stream {} with no event ordering them",
                    steps[i].id, stream[i], steps[p].id, stream[p]
                )));
            }
        }
        c[stream[i]] = seq[i] + 1;
        clock.push(c);
        last_on[stream[i]] = Some(i);
    }
    let prelude: Vec<usize> = (0..steps.len()).filter(|&i| ready[i]).collect();
    for list in &mut lists {
        list.retain(|&i| !ready[i]);
    }
    let group = vec![None; steps.len()];
    Ok((Streams { prelude, lists, events: sp.events.len() }, RunOrder { stream, seq, clock, group }))
}
