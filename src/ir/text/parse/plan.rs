//! The planning part of the text format: the `plan` line and the `!`
//! annotations that carry a graph's schedule, stream and memory tables.

use super::{clip, parse_err, Annotations, Cursor, State};
use crate::ir::{Event, MemoryPlan, NodeId, Placement, PlanTables, StreamId, StreamPlan, ValueMemory};
use crate::Result;
use std::collections::BTreeMap;

/// What a `plan schedule streams=N arena=.. lower-bound=.. naive=..` line declares.
#[derive(Default)]
pub(super) struct PlanHeader {
    pub line: usize,
    pub schedule: bool,
    pub streams: Option<u32>,
    pub memory: Option<(u64, u64, u64)>,
}

/// The words after `plan`.
pub(super) fn plan_header(cur: &mut Cursor) -> Result<PlanHeader> {
    let mut header = PlanHeader { line: cur.line, ..PlanHeader::default() };
    let mut memory = [None; 3];
    while let Some(word) = cur.word() {
        let value = |cur: &mut Cursor, what: &str| -> Result<u64> {
            cur.expect('=', &format!("after {what}"))?;
            let w = cur.word().ok_or_else(|| cur.err(format!("expected a number after {what}=")))?;
            w.parse()
                .map_err(|_| cur.err(format!("{what} must be a non-negative integer, found '{}'", clip(w))))
        };
        match word {
            "schedule" => header.schedule = true,
            "streams" => {
                let n = value(cur, "streams")?;
                header.streams = Some(
                    u32::try_from(n)
                        .ok()
                        .filter(|&n| n >= 1)
                        .ok_or_else(|| cur.err("streams must be at least 1"))?,
                );
            }
            "arena" => memory[0] = Some(value(cur, "arena")?),
            "lower-bound" => memory[1] = Some(value(cur, "lower-bound")?),
            "naive" => memory[2] = Some(value(cur, "naive")?),
            other => {
                return Err(cur.err(format!(
                    "unknown plan table '{}' (expected schedule, streams=N, arena=B lower-bound=B naive=B)",
                    clip(other)
                )))
            }
        }
    }
    if !cur.at_end() {
        return Err(cur.err(format!("unexpected {} in the plan line", cur.found())));
    }
    header.memory = match memory {
        [Some(a), Some(l), Some(n)] => Some((a, l, n)),
        [None, None, None] => None,
        _ => return Err(cur.err("a memory plan needs all of arena=, lower-bound= and naive=")),
    };
    Ok(header)
}

impl State {
    /// Builds the planning tables the `plan` line and the `!` annotations
    /// describe, after the graph itself is complete.
    pub(super) fn attach_tables(&mut self) -> Result<()> {
        let Some(plan) = self.plan.take() else {
            if let Some((_, line, _)) = self.annotations.first() {
                return Err(parse_err(
                    *line,
                    "`!` annotations need a `plan` line before the first definition",
                ));
            }
            return Ok(());
        };
        let mut tables = PlanTables::default();
        if plan.schedule {
            tables.schedule = Some(self.order.clone());
        }
        let mut streams = plan.streams.map(|count| StreamPlan { count, ..StreamPlan::default() });
        let mut groups: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
        let mut records: BTreeMap<u32, (NodeId, usize)> = BTreeMap::new();
        let mut waits: BTreeMap<u32, Vec<NodeId>> = BTreeMap::new();
        let mut memory = plan.memory.map(|(arena_bytes, lower_bound, naive_bytes)| MemoryPlan {
            arena_bytes,
            lower_bound,
            naive_bytes,
            values: BTreeMap::new(),
        });
        for (id, line, items) in std::mem::take(&mut self.annotations) {
            let err = |m: String| parse_err(line, m);
            let mut placement = None;
            let mut in_place = None;
            let mut live = None;
            for (key, value) in &items {
                let needs = |table: &str| err(format!("!{key} needs {table} on the `plan` line"));
                match key.as_str() {
                    "stream" => {
                        let s = streams.as_mut().ok_or_else(|| needs("streams=N"))?;
                        let k: u32 = value.parse().map_err(|_| err(format!("!stream={value}: not a stream number")))?;
                        s.stream_of.insert(id, StreamId(k));
                    }
                    "group" => {
                        if !plan.schedule {
                            return Err(needs("schedule"));
                        }
                        let k: usize =
                            value.parse().map_err(|_| err(format!("!group={value}: not a group number")))?;
                        groups.entry(k).or_default().push(id);
                    }
                    "record" | "wait" => {
                        streams.as_ref().ok_or_else(|| needs("streams=N"))?;
                        for e in value.split(',') {
                            let k: u32 = e
                                .strip_prefix('e')
                                .and_then(|k| k.parse().ok())
                                .ok_or_else(|| err(format!("!{key}: '{}' is not an event like e0", clip(e))))?;
                            if key == "record" {
                                if let Some((_, first)) = records.insert(k, (id, line)) {
                                    return Err(err(format!("event e{k} is recorded twice (first on line {first})")));
                                }
                            } else {
                                waits.entry(k).or_default().push(id);
                            }
                        }
                    }
                    "arena" => {
                        memory.as_ref().ok_or_else(|| needs("arena="))?;
                        let (o, b) = value
                            .split_once('+')
                            .and_then(|(o, b)| Some((o.parse().ok()?, b.parse().ok()?)))
                            .ok_or_else(|| err(format!("!arena={value}: expected OFFSET+BYTES")))?;
                        placement = Some(Placement::Arena { offset: o, bytes: b, in_place_of: None });
                    }
                    "in-place" | "alias" | "over" => {
                        memory.as_ref().ok_or_else(|| needs("arena="))?;
                        let name = value.strip_prefix('%').ok_or_else(|| err(format!("!{key} names a value like %3")))?;
                        let &(target, _) = self
                            .names
                            .get(name)
                            .ok_or_else(|| err(format!("!{key}: undefined value %{name}")))?;
                        if key == "alias" {
                            placement = Some(Placement::Alias(target));
                        } else if key == "over" {
                            placement = Some(Placement::OverInput(target));
                        } else {
                            in_place = Some(target);
                        }
                    }
                    "input" | "output" | "const" if value.is_empty() => {
                        memory.as_ref().ok_or_else(|| needs("arena="))?;
                        placement = Some(match key.as_str() {
                            "input" => Placement::Input,
                            "output" => Placement::Output,
                            _ => Placement::Constant,
                        });
                    }
                    "live" => {
                        let (a, b) = value
                            .split_once("..")
                            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                            .ok_or_else(|| err(format!("!live={value}: expected FIRST..LAST")))?;
                        live = Some((a, b));
                    }
                    _ => {
                        return Err(err(format!(
                            "unknown annotation !{key} (known: stream, record, wait, group, arena, in-place, alias, input, output, over, const, live)"
                        )))
                    }
                }
            }
            if let Some(of) = in_place {
                match &mut placement {
                    Some(Placement::Arena { in_place_of, .. }) => *in_place_of = Some(of),
                    _ => return Err(err("!in-place goes with an !arena placement".into())),
                }
            }
            match (placement, live, memory.as_mut()) {
                (Some(placement), Some(live), Some(m)) => {
                    m.values.insert(id, ValueMemory { placement, live });
                }
                (None, None, _) => {}
                (Some(_), None, _) => return Err(err("a placement needs its !live=FIRST..LAST".into())),
                _ => {
                    return Err(err(
                        "!live goes with a placement (!arena, !alias, !input, !output, !over, !const)".into(),
                    ))
                }
            }
        }
        if let Some(s) = streams.as_mut() {
            let count = records.len().max(waits.keys().last().map_or(0, |&k| k as usize + 1));
            for k in 0..count as u32 {
                let (after, _) = records.get(&k).copied().ok_or_else(|| {
                    parse_err(
                        plan.line,
                        format!("event e{k} is waited for but never recorded (events are e0, e1, ...)"),
                    )
                })?;
                s.events.push(Event { after, waiters: waits.remove(&k).unwrap_or_default() });
            }
        }
        for (k, (&g, _)) in groups.iter().enumerate() {
            if g != k {
                return Err(parse_err(
                    plan.line,
                    format!("launch group {k} has no member (groups are 0, 1, ...)"),
                ));
            }
        }
        tables.groups = groups.into_values().map(|members| crate::ir::LaunchGroup { members }).collect();
        tables.streams = streams;
        tables.memory = memory;
        *self.graph.tables_mut() = tables;
        Ok(())
    }
}

impl<'a> Cursor<'a> {
    /// `!key=value` or `!flag` plan annotations up to the region marker
    /// or the end of the line; a value runs to the next space.
    pub(super) fn annotations(&mut self) -> Result<Annotations> {
        let mut out = Vec::new();
        while self.eat('!') {
            let rest = &self.s[self.pos..];
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let token = &rest[..end];
            self.pos += end;
            let (key, value) = token.split_once('=').unwrap_or((token, ""));
            if key.is_empty() {
                return Err(self.err("expected an annotation name after '!'"));
            }
            out.push((key.to_string(), value.to_string()));
        }
        Ok(out)
    }
}
