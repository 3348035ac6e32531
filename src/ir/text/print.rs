//! Graph → text.

use crate::ir::{AttnLayout, Collective, Graph, NodeId, Op, Placement, RegionAutocast, RegionId};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Prints the graph in the text IR: a `plan` line when the graph carries
/// planning tables, a `region <path> autocast=<bf16|f16|off>` line for each
/// region with an autocast setting of its own, the nodes its outputs and
/// effects need (in schedule order when it has a schedule, else numbered
/// densely in structural topological order), then `return`. Ends with a
/// newline. Deterministic, so it can be snapshotted and diffed.
///
/// An invalid graph still prints (for debugging a pass) and never panics:
/// a missing output prints as `%?missing`, a node in a missing region as
/// `@?region<id>`, and on a cycle some operand is used before its line
/// (or prints as `%?cycle`); such text does not parse back.
pub fn print(graph: &Graph) -> String {
    let mut out = String::new();
    print_into(&mut out, graph, "");
    out
}

fn print_into(out: &mut String, graph: &Graph, indent: &str) {
    let (order, number) = numbering(graph);
    let name = |id: &NodeId, placeholder: &str| match number.get(id) {
        Some(n) => format!("%{n}"),
        None => format!("%?{placeholder}"),
    };
    let annotations = Annotations::of(graph, &name);
    if let Some(header) = plan_header(graph) {
        let _ = writeln!(out, "{indent}{header}");
    }
    if indent.is_empty() {
        for (i, r) in graph.regions().iter().enumerate() {
            if r.autocast != RegionAutocast::Inherit {
                let _ =
                    writeln!(out, "region {} autocast={}", graph.region_name(RegionId(i as u32)), r.autocast);
            }
        }
    }
    for (i, &id) in order.iter().enumerate() {
        let node = graph.node(id);
        let operands: Vec<String> = graph.operands(id).iter().map(|o| name(o, "cycle")).collect();
        let _ = write!(out, "{indent}%{i}: {}{} = {}", node.dtype, node.shape, node.op.mnemonic());
        if !operands.is_empty() {
            let _ = write!(out, " {}", operands.join(", "));
        }
        out.push_str(&attrs(&node.op, node.dtype));
        if let Some(a) = annotations.per_node.get(&id) {
            out.push_str(a);
        }
        if (node.region.0 as usize) < graph.regions().len() {
            let path = graph.region_name(node.region);
            if !path.is_empty() {
                let _ = write!(out, " @{path}");
            }
        } else {
            let _ = write!(out, " @?region{}", node.region.0);
        }
        if let Op::Fused(body) = &node.op {
            out.push_str(" {\n");
            print_into(out, body.graph(), &format!("{indent}    "));
            let _ = write!(out, "{indent}}}");
        }
        out.push('\n');
    }
    let _ = write!(out, "{indent}return");
    let outputs: Vec<String> = graph.outputs().iter().map(|o| name(o, "missing")).collect();
    if !outputs.is_empty() {
        let _ = write!(out, " {}", outputs.join(", "));
    }
    out.push('\n');
}

/// `plan schedule streams=2 arena=.. lower-bound=.. naive=..`: which
/// tables the graph carries, with their totals.
fn plan_header(graph: &Graph) -> Option<String> {
    let t = graph.tables();
    if t.is_empty() {
        return None;
    }
    let mut words = vec!["plan".to_string()];
    if t.schedule.is_some() {
        words.push("schedule".into());
    }
    if let Some(s) = &t.streams {
        words.push(format!("streams={}", s.count));
    }
    if let Some(m) = &t.memory {
        words.push(format!("arena={} lower-bound={} naive={}", m.arena_bytes, m.lower_bound, m.naive_bytes));
    }
    Some(words.join(" "))
}

/// The `!key=value` text of each node's plan annotations.
struct Annotations {
    per_node: HashMap<NodeId, String>,
}

impl Annotations {
    fn of(graph: &Graph, name: &dyn Fn(&NodeId, &str) -> String) -> Annotations {
        let mut per_node: HashMap<NodeId, String> = HashMap::new();
        let t = graph.tables();
        if let Some(streams) = &t.streams {
            let mut records: HashMap<NodeId, Vec<String>> = HashMap::new();
            let mut waits: HashMap<NodeId, Vec<String>> = HashMap::new();
            for (i, e) in streams.events.iter().enumerate() {
                records.entry(e.after).or_default().push(format!("e{i}"));
                for w in &e.waiters {
                    waits.entry(*w).or_default().push(format!("e{i}"));
                }
            }
            for (id, s) in &streams.stream_of {
                let text = per_node.entry(*id).or_default();
                let _ = write!(text, " !stream={}", s.0);
                if let Some(w) = waits.get(id) {
                    let _ = write!(text, " !wait={}", w.join(","));
                }
                if let Some(r) = records.get(id) {
                    let _ = write!(text, " !record={}", r.join(","));
                }
            }
        }
        for (i, g) in t.groups.iter().enumerate() {
            for id in &g.members {
                let _ = write!(per_node.entry(*id).or_default(), " !group={i}");
            }
        }
        if let Some(memory) = &t.memory {
            for (id, v) in &memory.values {
                let text = per_node.entry(*id).or_default();
                match &v.placement {
                    Placement::Arena { offset, bytes, in_place_of } => {
                        let _ = write!(text, " !arena={offset}+{bytes}");
                        if let Some(of) = in_place_of {
                            let _ = write!(text, " !in-place={}", name(of, "missing"));
                        }
                    }
                    Placement::Alias(of) => {
                        let _ = write!(text, " !alias={}", name(of, "missing"));
                    }
                    Placement::Input => text.push_str(" !input"),
                    Placement::Output => text.push_str(" !output"),
                    Placement::OverInput(of) => {
                        let _ = write!(text, " !over={}", name(of, "missing"));
                    }
                    Placement::Constant => text.push_str(" !const"),
                }
                let _ = write!(text, " !live={}..{}", v.live.0, v.live.1);
            }
        }
        Annotations { per_node }
    }
}

/// The nodes the outputs need, in the order they print, and each one's
/// dense number: the schedule when the graph has a valid one, else
/// [`Graph::compacted`] order. Unlike `compacted` it tolerates invalid
/// graphs (outputs that do not exist are skipped), so printing and DOT
/// never panic.
pub(crate) fn numbering(graph: &Graph) -> (Vec<NodeId>, HashMap<NodeId, usize>) {
    let roots: Vec<NodeId> = graph.roots().into_iter().filter(|&o| graph.contains(o)).collect();
    let topo = graph.topo_order_from(&roots);
    let order = match &graph.tables().schedule {
        Some(s) if is_schedule_of(graph, s, &topo) => s.clone(),
        _ => topo,
    };
    let number = order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    (order, number)
}

/// True when `schedule` lists exactly the needed nodes, operands first.
fn is_schedule_of(graph: &Graph, schedule: &[NodeId], needed: &[NodeId]) -> bool {
    if schedule.len() != needed.len() {
        return false;
    }
    let needed: HashSet<NodeId> = needed.iter().copied().collect();
    let mut seen = HashSet::new();
    schedule.iter().all(|&id| {
        needed.contains(&id) && graph.operands(id).iter().all(|o| seen.contains(o)) && seen.insert(id)
    })
}

fn list(xs: &[usize]) -> String {
    let items: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(","))
}

/// The attribute text of an op, each attribute preceded by a space.
fn attrs(op: &Op, dtype: crate::ir::DType) -> String {
    match op {
        Op::Input(k) => format!(" {k}"),
        Op::Buffer(b) => format!(" {}", b.0),
        Op::Full(v) => format!(" {}", v.format(dtype)),
        Op::Arange { start, step } => format!(" start={} step={}", start.format(dtype), step.format(dtype)),
        Op::Random { stream, .. } => format!(" stream={stream}"),
        Op::Reshape(_)
        | Op::Expand(_)
        | Op::Cast(_)
        | Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Where
        | Op::Assign
        | Op::AttentionDelta
        | Op::MatMul => String::new(),
        Op::Permute(perm) => format!(" perm={}", list(perm)),
        Op::Slice { dim, start, step, len } => format!(" dim={dim} start={start} step={step} len={len}"),
        Op::Reduce { dims, keepdim, into, .. } => {
            let into = into.map(|d| format!(" into={d}")).unwrap_or_default();
            format!(" dims={}{}{into}", list(dims), if *keepdim { " keepdim" } else { "" })
        }
        Op::Conv2d { stride, padding, dilation, groups } => format!(
            " stride={} padding={} dilation={} groups={groups}",
            list(stride),
            list(padding),
            list(dilation)
        ),
        Op::Pool2d { kernel, stride, padding, .. } | Op::MaxPool2dGrad { kernel, stride, padding } => {
            format!(" kernel={} stride={} padding={}", list(kernel), list(stride), list(padding))
        }
        Op::Gather { dim }
        | Op::IndexSelect { dim }
        | Op::IndexAdd { dim }
        | Op::WriteAt { dim }
        | Op::Cat { dim } => {
            format!(" dim={dim}")
        }
        Op::Attention { scale, causal, mask, layout } => format!(
            " scale={scale:?} mask={}{}{}",
            mask.name(),
            if *causal { " causal" } else { "" },
            if *layout == AttnLayout::Bhsd { String::new() } else { format!(" layout={}", layout.name()) }
        ),
        Op::AttentionStats { scale, causal, mask } => {
            format!(" scale={scale:?} mask={}{}", mask.name(), if *causal { " causal" } else { "" })
        }
        Op::AttentionGrad { scale, causal, mask, wrt } => format!(
            " wrt={} scale={scale:?} mask={}{}",
            wrt.name(),
            mask.name(),
            if *causal { " causal" } else { "" }
        ),
        Op::Fused(body) => {
            let overs: Vec<Option<usize>> = (0..body.outputs().len()).map(|j| body.output_over(j)).collect();
            match overs[..] {
                [None] | [] => format!(" kind={}", body.kind().name()),
                [Some(k)] => format!(" kind={} over={k}", body.kind().name()),
                _ if overs.iter().all(Option::is_none) => format!(" kind={}", body.kind().name()),
                _ => {
                    let each: Vec<String> =
                        overs.iter().map(|o| o.map_or("_".to_string(), |k| k.to_string())).collect();
                    format!(" kind={} over=[{}]", body.kind().name(), each.join(","))
                }
            }
        }
        Op::Extra { output } => format!(" output={output}"),
        Op::Collective { what: Collective::Broadcast(root), seq } => format!(" root={root} seq={seq}"),
        Op::Collective { what: Collective::AllReduce(_), seq } => format!(" seq={seq}"),
        Op::Collective {
            what: Collective::ReduceScatter { ranks, .. } | Collective::AllGather { ranks },
            seq,
        } => {
            format!(" ranks={ranks} seq={seq}")
        }
    }
}
