//! Checks of the planning tables a graph carries (schedule, streams,
//! memory): what [`super::verify`] runs once a planning pass has filled
//! them, so a table that does not describe its graph is caught right after
//! the pass that wrote it. A backend runs the same checks before it writes
//! into an arena, so they are exact and fast: linear walks, sorts, and one
//! sweep over the schedule with the live arena ranges in an ordered map
//! (never all pairs of values).
//!
//! Rules, in the order they are checked (the message names the rule):
//! - **schedule**: every node the outputs need, once, operands first.
//! - **streams**: a schedule exists; every scheduled node (and nothing
//!   else) has a stream below the count; every event is recorded after a
//!   scheduled node, has waiters, each on another stream than its recorder
//!   and scheduled after it; every operand edge between streams is ordered
//!   by happens-before, except edges from values that exist before the run
//!   (inputs, constants, views of them).
//! - **groups**: a schedule exists; each launch group has two members or
//!   more, at consecutive steps in schedule order, each a fused
//!   elementwise node in no other group, none reading another, all on
//!   one stream when there is a stream plan.
//! - **memory**: a schedule exists; every scheduled node (and nothing
//!   else) has an entry; its placement is the one its op calls for (input,
//!   constant, alias of the view's storage root, output for the root of a
//!   graph output, arena otherwise); `live` is its step and its last
//!   reader's step (readers of its aliases included); arena ranges are
//!   aligned, inside `arena_bytes` and as large as the value; in-place
//!   pairs meet the in-place rules; no two arena values whose lifetimes
//!   conflict share a byte (except a value and the one computed in place
//!   of it); `lower_bound` and `naive_bytes` are what the values give.

use super::lifetimes::{peak_bytes, value_bytes, Facts, Kind, ALIGN};
use super::{Graph, MemoryPlan, NodeId, Placement, StreamPlan};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashSet};

/// `%4 (mul)`: how messages name a node.
fn name(graph: &Graph, id: NodeId) -> String {
    format!("{id} ({})", graph.node(id).op.mnemonic())
}

/// Checks every table the graph carries; the message names the first
/// broken rule.
pub(crate) fn check_tables(graph: &Graph) -> Result<(), String> {
    let tables = graph.tables();
    let Some(schedule) = &tables.schedule else {
        if tables.streams.is_some() || tables.memory.is_some() || !tables.groups.is_empty() {
            return Err(
                "stream and memory plans and launch groups need a schedule (`plan schedule ...`)".into()
            );
        }
        return Ok(());
    };
    check_schedule(graph, schedule)?;
    if let Some(streams) = &tables.streams {
        check_stream_tables(graph, schedule, streams)?;
    }
    check_groups(graph, schedule, &tables.groups, tables.streams.as_ref())?;
    if tables.streams.is_none() && tables.memory.is_none() {
        return Ok(());
    }
    let facts = Facts::new(graph, schedule, tables.streams.as_ref());
    if tables.streams.is_some() {
        check_ordering(graph, &facts)?;
    }
    if let Some(memory) = &tables.memory {
        check_memory(graph, &facts, memory)?;
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
            return Err(format!("schedule: step {step} is {id}, which the outputs do not need"));
        }
        if !seen.insert(id) {
            return Err(format!("schedule: step {step}: {} is scheduled twice", name(graph, id)));
        }
        if let Some(o) = graph.operands(id).into_iter().find(|o| !seen.contains(o)) {
            return Err(format!(
                "schedule: step {step}: {} runs before its operand {}",
                name(graph, id),
                name(graph, o)
            ));
        }
    }
    if seen.len() != needed.len() {
        let mut missing: Vec<NodeId> = needed.difference(&seen).copied().collect();
        missing.sort();
        return Err(format!("schedule: it leaves out {}", name(graph, missing[0])));
    }
    Ok(())
}

/// Launch groups are runs of consecutive independent steps of one kind
/// (fused elementwise, or column reductions) on one stream (see [`super::LaunchGroup`]).
fn check_groups(
    graph: &Graph,
    schedule: &[NodeId],
    groups: &[super::LaunchGroup],
    streams: Option<&StreamPlan>,
) -> Result<(), String> {
    let step: std::collections::HashMap<NodeId, usize> =
        schedule.iter().enumerate().map(|(t, &id)| (id, t)).collect();
    let mut grouped = HashSet::new();
    for (g, group) in groups.iter().enumerate() {
        if group.members.len() < 2 {
            return Err(format!(
                "groups: group {g} has {} member(s); a group has two or more",
                group.members.len()
            ));
        }
        let members: HashSet<NodeId> = group.members.iter().copied().collect();
        let mut last: Option<usize> = None;
        for &id in &group.members {
            let t = *step
                .get(&id)
                .ok_or_else(|| format!("groups: group {g} holds {id}, which is not scheduled"))?;
            if last.is_some_and(|l| t != l + 1) {
                return Err(format!(
                    "groups: group {g}: {} is at step {t}, not right after the member before it",
                    name(graph, id)
                ));
            }
            last = Some(t);
            if !grouped.insert(id) {
                return Err(format!("groups: {} is in two groups", name(graph, id)));
            }
            let kind = super::GroupKind::of(graph, id);
            if kind.is_none() {
                return Err(format!(
                    "groups: group {g}: {} is neither a fused elementwise node nor a column reduction",
                    name(graph, id)
                ));
            }
            if kind != super::GroupKind::of(graph, group.members[0]) {
                return Err(format!(
                    "groups: group {g}: {} is not of the kind of {}",
                    name(graph, id),
                    name(graph, group.members[0])
                ));
            }
            if let Some(o) = graph.operands(id).into_iter().find(|o| members.contains(o)) {
                return Err(format!(
                    "groups: group {g}: {} reads {}, a member of its own group",
                    name(graph, id),
                    name(graph, o)
                ));
            }
            let stream = |n: NodeId| streams.and_then(|s| s.stream_of.get(&n)).map(|s| s.0);
            if stream(id) != stream(group.members[0]) {
                return Err(format!(
                    "groups: group {g}: {} is on another stream than {}",
                    name(graph, id),
                    name(graph, group.members[0])
                ));
            }
        }
    }
    Ok(())
}

/// Streams and events name scheduled nodes, and events go from one
/// stream to another, forward in the schedule.
fn check_stream_tables(graph: &Graph, schedule: &[NodeId], plan: &StreamPlan) -> Result<(), String> {
    if plan.count == 0 {
        return Err("streams: a stream plan has at least one stream".into());
    }
    let step: std::collections::HashMap<NodeId, usize> =
        schedule.iter().enumerate().map(|(t, &id)| (id, t)).collect();
    for &id in schedule {
        match plan.stream_of.get(&id) {
            None => return Err(format!("streams: {} has no stream", name(graph, id))),
            Some(s) if s.0 >= plan.count => {
                return Err(format!(
                    "streams: {} is on stream {}, but the plan has {} stream(s)",
                    name(graph, id),
                    s.0,
                    plan.count
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = plan.stream_of.keys().find(|id| !step.contains_key(id)) {
        return Err(format!("streams: {extra} has a stream but is not scheduled"));
    }
    for (i, e) in plan.events.iter().enumerate() {
        let Some(&after) = step.get(&e.after) else {
            return Err(format!("streams: event e{i} is recorded after {}, which is not scheduled", e.after));
        };
        if e.waiters.is_empty() {
            return Err(format!("streams: event e{i} (after {}) has no waiters", name(graph, e.after)));
        }
        let mut prev = None;
        for &w in &e.waiters {
            let Some(&ws) = step.get(&w) else {
                return Err(format!("streams: event e{i} is awaited by {w}, which is not scheduled"));
            };
            if plan.stream_of[&w] == plan.stream_of[&e.after] {
                return Err(format!(
                    "streams: event e{i}: {} waits for {} on its own stream {}",
                    name(graph, w),
                    name(graph, e.after),
                    plan.stream_of[&w].0
                ));
            }
            if ws <= after {
                return Err(format!(
                    "streams: event e{i}: {} (step {ws}) waits for {} (step {after}), which is not scheduled before it",
                    name(graph, w),
                    name(graph, e.after)
                ));
            }
            if prev.is_some_and(|p| p >= ws) {
                return Err(format!("streams: event e{i}: waiters are not in schedule order at {w}"));
            }
            prev = Some(ws);
        }
    }
    Ok(())
}

/// Every operand edge between streams is ordered by happens-before.
fn check_ordering(graph: &Graph, facts: &Facts) -> Result<(), String> {
    for (t, &id) in facts.order.iter().enumerate() {
        for o in graph.operands(id) {
            let Some(os) = facts.step(o) else { continue };
            if facts.stream(os) != facts.stream(t)
                && !facts.ready_before_run(os)
                && !facts.happens_before(os, t)
            {
                return Err(format!(
                    "streams: {} on stream {} reads {} on stream {}, and no event orders them",
                    name(graph, id),
                    facts.stream(t),
                    name(graph, o),
                    facts.stream(os)
                ));
            }
        }
    }
    Ok(())
}

/// One arena value in the sweep.
struct Item {
    step: usize,
    /// The first step its bytes may be written ([`Facts::window_start`]).
    start: usize,
    offset: u64,
    bytes: u64,
    end: u32,
    in_place_of: Option<usize>,
}

fn check_memory(graph: &Graph, facts: &Facts, memory: &MemoryPlan) -> Result<(), String> {
    let mut items: Vec<Item> = Vec::new();
    let mut naive = 0u64;
    let mut written_over = std::collections::BTreeSet::new();
    for (t, &id) in facts.order.iter().enumerate() {
        let Some(v) = memory.values.get(&id) else {
            return Err(format!("memory: {} has no memory entry", name(graph, id)));
        };
        let want = (t as u32, facts.last_read[t]);
        if v.live != want {
            return Err(format!(
                "memory: {} is live {}..{}, but it is defined at step {} and last read at step {}",
                name(graph, id),
                v.live.0,
                v.live.1,
                want.0,
                want.1
            ));
        }
        let expected = facts.kind[t];
        let wrong = |what: &str| {
            Err(format!(
                "memory: {} must be placed as {what}, not {}",
                name(graph, id),
                placement_text(&v.placement)
            ))
        };
        match (expected, &v.placement) {
            (Kind::Input, Placement::Input)
            | (Kind::Constant, Placement::Constant)
            | (Kind::Output, Placement::Output) => {}
            (Kind::Alias(root), Placement::Alias(of)) if *of == root => {}
            (Kind::Output, Placement::OverInput(x)) => {
                if let Some(why) = facts.over_input_refusal(graph, t, *x) {
                    let x_name = if graph.contains(*x) { name(graph, *x) } else { x.to_string() };
                    return Err(format!(
                        "memory: {} cannot be written over {x_name}: {why}",
                        name(graph, id)
                    ));
                }
                if !written_over.insert(*x) {
                    return Err(format!("memory: two outputs are written over {}", name(graph, *x)));
                }
            }
            (Kind::Arena, Placement::Arena { offset, bytes, in_place_of }) => {
                if *bytes != value_bytes(graph, id) {
                    return Err(format!(
                        "memory: {} holds {bytes} bytes in the arena, but its value has {}",
                        name(graph, id),
                        value_bytes(graph, id)
                    ));
                }
                if offset % ALIGN != 0 || offset + bytes > memory.arena_bytes {
                    return Err(format!(
                        "memory: {} at {offset}+{bytes} is not a {ALIGN}-byte aligned range inside the {}-byte arena",
                        name(graph, id),
                        memory.arena_bytes
                    ));
                }
                naive += bytes;
                let in_place_of = match in_place_of {
                    None => None,
                    Some(x) => Some(check_in_place(graph, facts, memory, t, *x, *offset)?),
                };
                if *bytes > 0 {
                    items.push(Item {
                        step: t,
                        start: facts.window_start(t) as usize,
                        offset: *offset,
                        bytes: *bytes,
                        end: facts.window_end(t),
                        in_place_of,
                    });
                }
            }
            (Kind::Input, _) => return wrong("!input"),
            (Kind::Constant, _) => return wrong("!const"),
            (Kind::Output, _) => return wrong("!output (a graph output reads it)"),
            (Kind::Alias(root), _) => return wrong(&format!("!alias={root} (its storage root)")),
            (Kind::Arena, _) => return wrong("!arena"),
        }
    }
    if memory.values.len() != facts.order.len() {
        if let Some(extra) = memory.values.keys().find(|id| facts.step(**id).is_none()) {
            return Err(format!("memory: {extra} has a memory entry but is not scheduled"));
        }
    }
    let groups = sweep(graph, facts, &items)?;
    let lower = peak_bytes(&groups);
    if memory.lower_bound != lower || memory.naive_bytes != naive {
        return Err(format!(
            "memory: the totals say lower-bound={} naive={}, but the values give lower-bound={lower} naive={naive}",
            memory.lower_bound, memory.naive_bytes
        ));
    }
    Ok(())
}

/// Checks `y` (step `t`, at `offset`) computed in place of `x`; returns
/// `x`'s step.
fn check_in_place(
    graph: &Graph,
    facts: &Facts,
    memory: &MemoryPlan,
    t: usize,
    x: NodeId,
    offset: u64,
) -> Result<usize, String> {
    let y = facts.order[t];
    let x_name = if graph.contains(x) { name(graph, x) } else { x.to_string() };
    let bad =
        |why: &str| Err(format!("memory: {} cannot be computed in place of {x_name}: {why}", name(graph, y)));
    let Some(k) = graph.operands(y).iter().position(|&o| o == x) else {
        return bad("it is not an operand");
    };
    if let Some(why) = facts.in_place_refusal(graph, t, k) {
        return bad(why);
    }
    match memory.values.get(&x).map(|v| &v.placement) {
        Some(Placement::Arena { offset: xo, .. }) if *xo == offset => {}
        _ => return bad("it does not take the operand's bytes (same offset)"),
    }
    facts.step(x).map_or_else(|| bad("it is not scheduled"), Ok)
}

/// Sweeps the schedule with the arena ranges whose lifetimes are open, in
/// offset order: a range that starts must not overlap its neighbours.
/// Returns the windows of in-place groups (a value and the ones computed
/// in place of it hold one range) for the lower bound.
fn sweep(graph: &Graph, facts: &Facts, items: &[Item]) -> Result<Vec<(u32, u32, u64)>, String> {
    // offset -> (end offset, item index, window end)
    let mut active: BTreeMap<u64, (u64, usize, u32)> = BTreeMap::new();
    let mut expiry: BinaryHeap<Reverse<(u32, u64, usize)>> = BinaryHeap::new();
    let mut group_of: Vec<usize> = Vec::with_capacity(items.len());
    let mut groups: Vec<(u32, u32, u64)> = Vec::new();
    let mut item_at: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        item_at.insert(item.step, i);
        while let Some(&Reverse((end, offset, j))) = expiry.peek() {
            if end as usize >= item.start {
                break;
            }
            expiry.pop();
            if active.get(&offset).is_some_and(|a| a.1 == j) {
                active.remove(&offset);
            }
        }
        let describe = |j: usize| {
            let it = &items[j];
            format!(
                "{} (steps {}..{}, bytes {}..{})",
                name(graph, facts.order[it.step]),
                it.step,
                it.end,
                it.offset,
                it.offset + it.bytes
            )
        };
        let end_off = item.offset + item.bytes;
        let mut window_end = item.end;
        if let Some(x) = item.in_place_of.and_then(|x| item_at.get(&x).copied()) {
            match active.get(&item.offset) {
                Some(&(_, j, xend)) if j == x => window_end = window_end.max(xend),
                _ => return Err(format!("memory: {} takes bytes in place that are not held", describe(i))),
            }
            let g = group_of[x];
            group_of.push(g);
            groups[g].1 = groups[g].1.max(window_end);
        } else {
            if let Some((_, &(prev_end, j, _))) = active.range(..=item.offset).next_back() {
                if prev_end > item.offset {
                    return Err(overlap(describe(i), describe(j)));
                }
            }
            if let Some((&next, &(_, j, _))) = active.range(item.offset + 1..).next() {
                if next < end_off {
                    return Err(overlap(describe(i), describe(j)));
                }
            }
            group_of.push(groups.len());
            groups.push((item.start as u32, window_end, item.bytes));
        }
        active.insert(item.offset, (end_off, i, window_end));
        expiry.push(Reverse((window_end, item.offset, i)));
    }
    Ok(groups)
}

/// A placement as its annotation reads (`!arena=0+64`).
fn placement_text(p: &Placement) -> String {
    match p {
        Placement::Arena { offset, bytes, in_place_of: None } => format!("!arena={offset}+{bytes}"),
        Placement::Arena { offset, bytes, in_place_of: Some(x) } => {
            format!("!arena={offset}+{bytes} !in-place={x}")
        }
        Placement::Alias(of) => format!("!alias={of}"),
        Placement::Input => "!input".into(),
        Placement::Output => "!output".into(),
        Placement::OverInput(x) => format!("!over={x}"),
        Placement::Constant => "!const".into(),
    }
}

fn overlap(a: String, b: String) -> String {
    format!("memory: {a} and {b} share arena bytes while both are live")
}
