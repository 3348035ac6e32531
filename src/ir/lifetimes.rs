//! Facts that the memory pass and the plan checker both derive from a
//! schedule and its stream plan: where each value's bytes come from
//! (storage roots through views), happens-before between nodes (vector
//! clocks), how long each value's bytes must stay untouched, and which
//! fused nodes may overwrite an operand in place.
//!
//! One implementation serves both, so the pass never plans what the
//! checker rejects; tests/plan_props.rs recomputes the overlap rule on its
//! own, pair by pair, so a shared mistake here is still caught.
//!
//! Launch groups ([`super::LaunchGroup`]) may run their members in any
//! order or all at once, so a member's value counts as written from the
//! group's first step (`window_start`) and its reads count at the group's
//! last step (`last_read`, the frontier), and a member writes over an
//! operand only when no other member reads it.
//!
//! An `extra` output ([`Op::Extra`]) is written by its fused node's
//! kernel, so its bytes count as written from that node's first step on
//! (its window starts there, wherever the schedule puts the `extra`), and
//! it is written over an input under the same rules as the fused node's
//! own value, with the fused node as the writer.
//!
//! Everything is indexed by schedule step. Building the facts assumes the
//! schedule and the stream plan were checked (every node scheduled once,
//! operands first; streams below the count; events recorded before their
//! waiters): [`super::plan_check`] checks those before it builds them.

use super::{FusedBody, FusedKind, Graph, NodeId, Op, Shape, StreamPlan};

/// Arena offsets are multiples of this (a cache line; what SIMD loads like).
pub(crate) const ALIGN: u64 = 64;

/// Where a value's bytes are, before any offset is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `input` (or a realized `buffer`): bound by the caller.
    Input,
    /// `full`: one element, outside the arena.
    Constant,
    /// A view over the bytes of the named storage root.
    Alias(NodeId),
    /// The storage root of a graph output: its own allocation.
    Output,
    /// Everything else: bytes in the arena.
    Arena,
}

/// Per-step facts of one schedule (see the module docs).
pub(crate) struct Facts {
    /// The schedule.
    pub order: Vec<NodeId>,
    /// Step of each node, by node index (`u32::MAX`: not scheduled).
    step_of: Vec<u32>,
    /// Number of streams (1 without a stream plan).
    pub streams: usize,
    /// Stream of each step.
    stream: Vec<u32>,
    /// Position of each step within its stream.
    idx: Vec<i64>,
    /// The steps of each stream, in order.
    per_stream: Vec<Vec<u32>>,
    /// Vector clock of each step (`streams` entries per step): entry `s`
    /// is the position of the last node on stream `s` that happens before
    /// or is this node (-1 for none).
    vc: Vec<i64>,
    /// Placement kind of each step.
    pub kind: Vec<Kind>,
    /// Step of the last reader of each step's value, readers of its
    /// aliases included (the step itself when nothing reads it).
    pub last_read: Vec<u32>,
    /// Per step and stream, the position of the last reader on that stream
    /// (readers of aliases and the node itself included; -1 for none).
    frontier: Vec<i64>,
    /// First and last step of each step's launch group (the step itself
    /// twice outside any group).
    span: Vec<(u32, u32)>,
}

/// Bytes of a node's value.
pub(crate) fn value_bytes(graph: &Graph, id: NodeId) -> u64 {
    let node = graph.node(id);
    node.shape.numel() as u64 * node.dtype.size() as u64
}

/// Whether a value exists before any stream starts (inputs, constants and
/// views of them that need no copy): reading it needs no event.
pub(crate) fn ready_before_run(kind: Kind, kinds_root: impl Fn(NodeId) -> Kind) -> bool {
    match kind {
        Kind::Input | Kind::Constant => true,
        Kind::Alias(root) => matches!(kinds_root(root), Kind::Input | Kind::Constant),
        _ => false,
    }
}

impl Facts {
    /// Builds the facts of `order` (a checked schedule of `graph`) under
    /// `streams` (a checked stream plan, or one stream when `None`).
    pub fn new(graph: &Graph, order: &[NodeId], streams: Option<&StreamPlan>) -> Facts {
        let n = order.len();
        let max_index = order.iter().map(|id| id.index() + 1).max().unwrap_or(0);
        let mut step_of = vec![u32::MAX; max_index];
        for (t, id) in order.iter().enumerate() {
            step_of[id.index()] = t as u32;
        }
        let count = streams.map_or(1, |s| s.count.max(1) as usize);
        let stream: Vec<u32> = order
            .iter()
            .map(|id| streams.and_then(|s| s.stream_of.get(id)).map_or(0, |s| s.0.min(count as u32 - 1)))
            .collect();
        let mut per_stream = vec![Vec::new(); count];
        let mut idx = vec![0i64; n];
        for t in 0..n {
            let s = stream[t] as usize;
            idx[t] = per_stream[s].len() as i64;
            per_stream[s].push(t as u32);
        }
        let operand_steps = |id: NodeId| -> Vec<u32> {
            graph.operands(id).iter().map(|o| step_of.get(o.index()).copied().unwrap_or(u32::MAX)).collect()
        };
        // Vector clocks: a node starts from its stream predecessor and the
        // recorders of the events it waits for.
        let mut waits: Vec<Vec<u32>> = vec![Vec::new(); n];
        if let Some(plan) = streams {
            for e in &plan.events {
                let Some(&after) = step_of.get(e.after.index()) else { continue };
                for w in &e.waiters {
                    if let Some(&ws) = step_of.get(w.index()) {
                        if (ws as usize) < n && after < ws {
                            waits[ws as usize].push(after);
                        }
                    }
                }
            }
        }
        let mut vc = vec![-1i64; n * count];
        let mut last_on = vec![u32::MAX; count];
        for t in 0..n {
            let s = stream[t] as usize;
            if last_on[s] != u32::MAX {
                let p = last_on[s] as usize;
                vc.copy_within(p * count..(p + 1) * count, t * count);
            }
            for &r in &waits[t] {
                for k in 0..count {
                    vc[t * count + k] = vc[t * count + k].max(vc[r as usize * count + k]);
                }
            }
            vc[t * count + s] = idx[t];
            last_on[s] = t as u32;
        }
        // Kinds: storage roots follow views that need no copy.
        let mut kind = vec![Kind::Arena; n];
        let mut strides: Vec<Option<Vec<usize>>> = vec![None; n];
        for (t, &id) in order.iter().enumerate() {
            let node = graph.node(id);
            kind[t] = match &node.op {
                Op::Input(_) | Op::Buffer(_) => Kind::Input,
                Op::Full(_) => Kind::Constant,
                op if op.is_view() => {
                    let o = operand_steps(id)[0] as usize;
                    let root = match kind[o] {
                        Kind::Alias(r) => r,
                        _ => order[o],
                    };
                    let root_kind = kind[step_of[root.index()] as usize];
                    let viewed = if root_kind == Kind::Constant {
                        Some(vec![0; node.shape.rank()])
                    } else {
                        let from = strides[o]
                            .clone()
                            .unwrap_or_else(|| graph.node(order[o]).shape.contiguous_strides());
                        view_strides(op, &graph.node(order[o]).shape, &from, &node.shape)
                    };
                    match viewed {
                        Some(s) => {
                            strides[t] = Some(s);
                            Kind::Alias(root)
                        }
                        // A reshape the strides cannot express: a copy, so a root.
                        None => Kind::Arena,
                    }
                }
                _ => Kind::Arena,
            };
        }
        for out in graph.outputs() {
            let Some(&t) = step_of.get(out.index()) else { continue };
            let root = match kind[t as usize] {
                Kind::Alias(r) => step_of[r.index()] as usize,
                _ => t as usize,
            };
            if kind[root] == Kind::Arena {
                kind[root] = Kind::Output;
            }
        }
        let mut span: Vec<(u32, u32)> = (0..n as u32).map(|t| (t, t)).collect();
        for group in &graph.tables().groups {
            let steps: Vec<u32> =
                group.members.iter().filter_map(|m| step_of.get(m.index()).copied()).collect();
            let (Some(&first), Some(&last)) = (steps.iter().min(), steps.iter().max()) else { continue };
            for &t in &steps {
                if let Some(s) = span.get_mut(t as usize) {
                    *s = (first, last);
                }
            }
        }
        for (t, &id) in order.iter().enumerate() {
            if let Op::Extra { .. } = graph.node(id).op {
                if let Some(&f) = graph.operands(id).first().and_then(|f| step_of.get(f.index())) {
                    if (f as usize) < t {
                        span[t].0 = span[f as usize].0;
                    }
                }
            }
        }
        // Readers: direct users (a group member at its group's last
        // step), then views hand theirs to what they view.
        let mut last_read: Vec<u32> = (0..n as u32).collect();
        let mut frontier = vec![-1i64; n * count];
        for t in 0..n {
            frontier[t * count + stream[t] as usize] = idx[t];
            let at = (span[t].1 as usize).min(n - 1);
            for o in operand_steps(order[t]) {
                let o = o as usize;
                last_read[o] = last_read[o].max(at as u32);
                let f = &mut frontier[o * count + stream[at] as usize];
                *f = (*f).max(idx[at]);
            }
        }
        for t in (0..n).rev() {
            if let Kind::Alias(_) = kind[t] {
                let o = operand_steps(order[t])[0] as usize;
                last_read[o] = last_read[o].max(last_read[t]);
                for k in 0..count {
                    frontier[o * count + k] = frontier[o * count + k].max(frontier[t * count + k]);
                }
            }
        }
        Facts {
            order: order.to_vec(),
            step_of,
            streams: count,
            stream,
            idx,
            per_stream,
            vc,
            kind,
            last_read,
            frontier,
            span,
        }
    }

    /// The first step during which the bytes of step `t`'s value may be
    /// written: its own, or its launch group's first.
    pub fn window_start(&self, t: usize) -> u32 {
        self.span[t].0
    }

    /// Whether a member of step `y`'s launch group other than `y` reads
    /// the bytes of step `x`'s storage root.
    fn group_reads(&self, graph: &Graph, y: usize, x: usize) -> bool {
        let (first, last) = self.span[y];
        (first..=last).map(|z| z as usize).filter(|&z| z != y).any(|z| {
            graph.operands(self.order[z]).iter().any(|&o| self.step(o).is_some_and(|o| self.root(o) == x))
        })
    }

    /// The step of a scheduled node.
    pub fn step(&self, id: NodeId) -> Option<usize> {
        self.step_of.get(id.index()).filter(|&&s| s != u32::MAX).map(|&s| s as usize)
    }

    /// The stream of a step.
    pub fn stream(&self, t: usize) -> u32 {
        self.stream[t]
    }

    /// The storage root of a step's value (itself unless it is an alias).
    pub fn root(&self, t: usize) -> usize {
        match self.kind[t] {
            Kind::Alias(r) => self.step_of[r.index()] as usize,
            _ => t,
        }
    }

    /// Whether step `a` happens before step `b` (strictly).
    pub fn happens_before(&self, a: usize, b: usize) -> bool {
        a != b && self.vc[b * self.streams + self.stream[a] as usize] >= self.idx[a]
    }

    /// Whether a step's value is ready before any stream starts.
    pub fn ready_before_run(&self, t: usize) -> bool {
        ready_before_run(self.kind[t], |r| self.kind[self.step_of[r.index()] as usize])
    }

    /// The last step during which the bytes of step `t`'s value must stay
    /// untouched: its last reader, and on several streams also every node
    /// that is not ordered after all of its readers (such a node may run
    /// while a reader still reads). A value defined after this step may
    /// reuse the bytes; see the plan module docs.
    pub fn window_end(&self, t: usize) -> u32 {
        let mut end = self.last_read[t];
        if self.streams == 1 {
            return end;
        }
        let f = &self.frontier[t * self.streams..(t + 1) * self.streams];
        for (s, steps) in self.per_stream.iter().enumerate() {
            // Clocks only grow along a stream, so the nodes clear of every
            // reader are a suffix: find where it starts.
            let clear = |y: u32| {
                let y = y as usize;
                (0..self.streams).all(|k| {
                    let mut c = self.vc[y * self.streams + k];
                    if k == s {
                        c -= 1; // strictly after: the node itself does not count
                    }
                    c >= f[k]
                })
            };
            let first_clear = steps.partition_point(|&y| !clear(y));
            if first_clear > 0 {
                end = end.max(steps[first_clear - 1]);
            }
        }
        end
    }

    /// Why fused node `y` cannot be computed in place of its operand slot
    /// `k`, or `None` when it can (rules (a) to (d) of the memory pass).
    pub fn in_place_refusal(&self, graph: &Graph, y: usize, k: usize) -> Option<&'static str> {
        let yid = self.order[y];
        let Op::Fused(body) = &graph.node(yid).op else {
            return Some("only fused elementwise and row kernels compute in place");
        };
        // A row kernel reads its operands in passes over each row and
        // writes a per-element output in the last one, each element read
        // by the thread that then writes it (after the row's reductions
        // combined): in place is safe for a domain-shaped output.
        let in_place_kind = match body.kind() {
            FusedKind::Elementwise => true,
            FusedKind::Reduction { domain, .. } => body.graph().node(body.output()).shape == *domain,
            FusedKind::MatMul { .. } => false,
        };
        if !in_place_kind {
            return Some("only fused elementwise and row kernels with a per-element output compute in place");
        }
        if self.kind[y] != Kind::Arena {
            return Some("the node is not an arena value (an output has its own bytes)");
        }
        let operands = graph.operands(yid);
        let Some(&xid) = operands.get(k) else { return Some("no such operand") };
        let Some(x) = self.step(xid) else { return Some("the operand is not scheduled") };
        if self.kind[x] != Kind::Arena {
            return Some("the operand is not an arena value");
        }
        if self.last_read[x] != self.span[y].1 {
            return Some("the operand is read after this node");
        }
        if self.group_reads(graph, y, x) {
            return Some("another member of the launch group reads the operand");
        }
        let others_before = (0..self.streams).all(|s| {
            s == self.stream[y] as usize
                || self.vc[y * self.streams + s] >= self.frontier[x * self.streams + s]
        });
        if !others_before {
            return Some("another reader of the operand may run at the same time (unordered stream)");
        }
        if let Some(why) = reads_in_step(graph, body, k, xid, yid) {
            return Some(why);
        }
        let aliased = operands
            .iter()
            .enumerate()
            .any(|(j, &o)| j != k && self.step(o).is_some_and(|o| self.root(o) == x));
        if aliased {
            return Some("another operand reads the same bytes");
        }
        None
    }
}

impl Facts {
    /// The input a graph output may be written over
    /// ([`crate::ir::Placement::OverInput`]): the target of a `write_at`,
    /// or the operand an assigned fused value is marked `over`
    /// ([`crate::ir::FusedBody::over`]), when
    /// [`Facts::over_input_refusal`] finds nothing against it.
    pub fn over_input(&self, graph: &Graph, y: usize) -> Option<NodeId> {
        let (writer, slot) = over_slot(graph, self.order[y]).ok()?;
        let target = *graph.operands(writer).get(slot)?;
        self.over_input_refusal(graph, y, target).is_none().then_some(target)
    }

    /// Why output step `y` cannot be written over the bytes of input node
    /// `x`, or `None` when it can: `y` is a `write_at` (its target operand)
    /// or a fused elementwise node marked `over` an operand, and the
    /// storage root of a graph output; `x` is that operand, an `input`
    /// read directly (no view), which no graph output returns; every other
    /// reader of `x` (its aliases' included) runs before `y`, on any
    /// stream. A `write_at`'s value and offset do not read `x`'s bytes: the
    /// write then only changes the window, after everything that read the
    /// old bytes. A fused node reads `x` only as its `input k`, directly at
    /// the output's shape and byte size, and no other operand reads `x`'s
    /// bytes: each element is then read before it is overwritten (the
    /// memory pass's in-place rule, for an input).
    pub fn over_input_refusal(&self, graph: &Graph, y: usize, x: NodeId) -> Option<&'static str> {
        let yid = self.order[y];
        let (writer, slot) = match over_slot(graph, yid) {
            Ok(found) => found,
            Err(why) => return Some(why),
        };
        if self.kind[y] != Kind::Output {
            return Some("the node is not the storage root of a graph output");
        }
        // An extra output is written by its fused node's step: that step
        // reads the operands and must be the input's last reader.
        let Some(w) = self.step(writer) else { return Some("the fused node is not scheduled") };
        let operands = graph.operands(writer);
        if operands.get(slot) != Some(&x) {
            return Some("the input is not the operand the node writes over");
        }
        let Some(xs) = self.step(x) else { return Some("the input is not scheduled") };
        if !matches!(graph.node(x).op, Op::Input(_)) {
            return Some("the target is not an input");
        }
        let returned = graph.outputs().iter().any(|&o| self.step(o).is_some_and(|o| self.root(o) == xs));
        if returned {
            return Some("a graph output returns the input's bytes");
        }
        if self.last_read[xs] != self.span[w].1 {
            return Some("the input is read after the write");
        }
        if self.group_reads(graph, w, xs) {
            return Some("another member of the launch group reads the input");
        }
        let others_before = (0..self.streams).all(|s| {
            s == self.stream[w] as usize
                || self.vc[w * self.streams + s] >= self.frontier[xs * self.streams + s]
        });
        if !others_before {
            return Some("another reader of the input may run at the same time (unordered stream)");
        }
        let aliased = operands
            .iter()
            .enumerate()
            .any(|(j, &o)| j != slot && self.step(o).is_some_and(|o| self.root(o) == xs));
        let Op::Fused(body) = &graph.node(writer).op else {
            return aliased.then_some("the value or the offset reads the input's bytes");
        };
        if aliased {
            return Some("another operand reads the input's bytes");
        }
        reads_in_step(graph, body, slot, x, yid)
    }
}

/// Why fused node `y` would not read each element of operand `x` (its
/// `input k`) before writing the same element, or `None` when it does:
/// `x` has the result's byte size, and the body reads `input k` directly
/// (no view) at the result's shape. The in-place rule for an arena
/// operand and for an input written over share it.
fn reads_in_step(graph: &Graph, body: &FusedBody, k: usize, x: NodeId, y: NodeId) -> Option<&'static str> {
    if value_bytes(graph, x) != value_bytes(graph, y) {
        return Some("the operand has another byte size");
    }
    let g = body.graph();
    let Some(&input) = body.input_nodes().get(k) else { return Some("no such body input") };
    if g.node(input).shape != graph.node(y).shape {
        return Some("the body reads the operand at another shape");
    }
    if g.users(input).iter().any(|&u| g.node(u).op.is_view()) {
        return Some("the body reads the operand through a view");
    }
    None
}

/// The node whose kernel writes `y` and its operand slot that `y` may be
/// written over: a `write_at`'s target, a fused node's `over` operand (for
/// an `extra`, its fused node's operand marked for that output); why not
/// otherwise.
fn over_slot(graph: &Graph, y: NodeId) -> Result<(NodeId, usize), &'static str> {
    match &graph.node(y).op {
        Op::WriteAt { .. } => Ok((y, 0)),
        Op::Fused(body) => {
            body.over().map(|k| (y, k)).ok_or("the fused node is not marked to write over an operand")
        }
        Op::Extra { output } => {
            let fused = graph.operands(y)[0];
            match &graph.node(fused).op {
                Op::Fused(body) => body
                    .output_over(*output)
                    .map(|k| (fused, k))
                    .ok_or("the extra output is not marked to write over an operand"),
                _ => Err("an extra output's operand is not a fused node"),
            }
        }
        _ => Err("only write_at and an assigned fused value write over an input"),
    }
}

/// The strides of view `op` (from `shape` with `strides` to `to`), or
/// `None` when a reshape cannot be expressed by strides (it copies).
fn view_strides(op: &Op, shape: &Shape, strides: &[usize], to: &Shape) -> Option<Vec<usize>> {
    match op {
        Op::Permute(perm) => Some(perm.iter().map(|&p| strides.get(p).copied().unwrap_or(0)).collect()),
        Op::Expand(_) => {
            let lead = to.rank().saturating_sub(shape.rank());
            Some(
                (0..to.rank())
                    .map(|i| {
                        if i < lead || (shape.0[i - lead] == 1 && to.0[i] != 1) {
                            0
                        } else {
                            strides[i - lead]
                        }
                    })
                    .collect(),
            )
        }
        Op::Slice { dim, step, len, .. } => {
            // With one element or none the stride is never stepped; scaling
            // it by a step past the end (up to usize::MAX) would overflow.
            let mut s = strides.to_vec();
            if let Some(d) = s.get_mut(*dim).filter(|_| *len > 1) {
                *d *= step;
            }
            Some(s)
        }
        Op::Reshape(_) => shape.reshape_strides(strides, to),
        _ => None,
    }
}

/// The most bytes held at once by values with these inclusive step
/// windows: `(first, last, bytes)` each.
pub(crate) fn peak_bytes(windows: &[(u32, u32, u64)]) -> u64 {
    let mut deltas: Vec<(u64, i128)> = Vec::with_capacity(windows.len() * 2);
    for &(a, b, bytes) in windows {
        deltas.push((a as u64, bytes as i128));
        deltas.push((b as u64 + 1, -(bytes as i128)));
    }
    // Frees before allocations at the same step.
    deltas.sort_unstable();
    let (mut cur, mut peak) = (0i128, 0i128);
    for (_, d) in deltas {
        cur += d;
        peak = peak.max(cur);
    }
    peak as u64
}
