//! Where each step's value goes: the memory table's placements checked
//! against their nodes and the arena, as `exec.rs`'s module docs say why
//! that makes the arena sound. An `extra` output's bytes are written by
//! its fused node's kernel, so its range is checked against that kernel's
//! operands and value.

use super::exec::{Place, Step};
use super::fused::FusedKernel;
use crate::ir::{DType, Graph, Node, NodeId, Op, Placement, Plan};
use crate::{Error, Result};
use std::collections::HashMap;

fn bad(msg: String) -> Error {
    Error::Backend(format!("cpu: {msg}"))
}

/// True when the executor can compute a node in the bytes of its operand
/// in `slot`: only a fused kernel that reads that operand element for
/// element as it writes (it copies each block out before writing it; see
/// [`FusedKernel::can_run_in_place`]).
fn can_run_in_place(kernel: Option<&FusedKernel>, slot: usize) -> bool {
    kernel.is_some_and(|k| k.can_run_in_place(slot))
}

/// The place of a node whose memory plan computes it in place of an
/// operand the executor cannot overwrite (see [`can_run_in_place`]): a
/// fresh allocation of its own. Correct, only not in place: the operand's
/// range is left as the plan expects, and nothing else is written there
/// (a node planned in place of this one then writes the range as its own,
/// see `place_values`). Plans do take this path: the memory pass lets a
/// fused node overwrite an operand of another dtype of the same byte size
/// (a cast from i64 to f64; the CUDA kernels compute that in place), but
/// the CPU kernel reads an in-place operand at the output's dtype.
fn in_place_fallback() -> Place {
    Place::Auto
}

/// Fills each step's [`Place`] from the memory table, checking every
/// placement against its node and the arena (see the module docs).
pub(super) fn place_values(
    plan: &Plan,
    steps: &mut [Step],
    arena_bytes: usize,
    kernels: &HashMap<NodeId, FusedKernel>,
) -> Result<()> {
    let graph = &plan.graph;
    let Some(mem) = graph.tables().memory.as_ref() else { return Ok(()) };
    let pos: HashMap<NodeId, usize> = steps.iter().enumerate().map(|(i, s)| (s.id, i)).collect();
    // The arena byte range each step's value reads from, through views.
    let mut root: Vec<Option<(usize, usize)>> = vec![None; steps.len()];
    for i in 0..steps.len() {
        let id = steps[i].id;
        let node = graph.node(id);
        let vm =
            mem.values.get(&id).ok_or_else(|| bad(format!("{id} has no placement in the memory plan")))?;
        let what = |p: &str| bad(format!("{id} ({}) cannot be placed {p}", node.op.mnemonic()));
        let place = match (&node.op, &vm.placement) {
            (Op::Input(_), Placement::Input | Placement::Output) => Place::Auto,
            (Op::Input(_), _) => return Err(what("anywhere but input")),
            (Op::Full(_), Placement::Constant | Placement::Output) => Place::Auto,
            (op, Placement::Alias(target)) if op.is_view() => {
                check_alias(graph, mem, id, *target)?;
                Place::Auto
            }
            (op, Placement::Output) if op.is_view() => Place::Auto,
            (_, Placement::Alias(_)) => return Err(what("as an alias (it is not a view)")),
            (_, Placement::Constant) => return Err(what("as a constant")),
            (_, Placement::Input) => return Err(what("as an input")),
            (_, Placement::Output) => Place::Auto,
            (Op::WriteAt { .. }, Placement::OverInput(of)) => {
                let target = graph.operands(id).first().copied();
                if target != Some(*of) || !matches!(graph.node(*of).op, Op::Input(_)) {
                    return Err(what(&format!("over {of}, which is not its target input")));
                }
                steps[i].over = vec![(0, 0)];
                Place::OverInput
            }
            // An assigned value computed over its variable's input, when
            // the run holds the input's only reference (`over.rs`); else
            // into fresh bytes, which is the same value.
            (Op::Fused(body), Placement::OverInput(of)) if body.over().is_some() => {
                let k = body.over().filter(|&k| graph.operands(id).get(k) == Some(of));
                match k {
                    None => return Err(what(&format!("over {of}, which is not its marked operand"))),
                    Some(k) if matches!(graph.node(*of).op, Op::Input(_)) => {
                        steps[i].over.push((k, 0));
                        Place::OverInput
                    }
                    Some(_) => Place::Auto,
                }
            }
            // An extra output over its variable's input: as above; its
            // fused node's step writes it.
            (Op::Extra { output }, Placement::OverInput(of)) => {
                let fused = graph.operands(id)[0];
                let marked = match &graph.node(fused).op {
                    Op::Fused(body) => {
                        body.output_over(*output).filter(|&k| graph.operands(fused).get(k) == Some(of))
                    }
                    _ => None,
                };
                match (marked, steps[i].operands.first().copied()) {
                    (Some(k), Some(p)) if matches!(graph.node(*of).op, Op::Input(_)) => {
                        steps[p].over.push((k, *output));
                        Place::OverInput
                    }
                    (Some(_), _) => Place::Auto,
                    (None, _) => return Err(what(&format!("over {of}, which is not its marked operand"))),
                }
            }
            (Op::Extra { .. }, Placement::Arena { in_place_of: Some(_), .. }) => {
                return Err(what("in place of an operand (an extra output has bytes of its own)"))
            }
            (_, Placement::OverInput(_)) => {
                return Err(what("over an input (only write_at and assigned values are)"))
            }
            (_, Placement::Arena { offset, bytes, in_place_of }) => {
                if steps[i].output {
                    return Err(bad(format!(
                        "output {id} is placed in the arena, which the next run reuses"
                    )));
                }
                let (offset, len) = arena_range(id, node, *offset, *bytes, arena_bytes)?;
                match in_place_of {
                    None => Place::Arena { offset, len },
                    Some(of) => {
                        let slot =
                            graph.operands(id).iter().position(|o| o == of).ok_or_else(|| {
                                bad(format!("{id} is placed in place of {of}, not an operand"))
                            })?;
                        match pos.get(of).map(|&p| steps[p].place) {
                            Some(
                                Place::Arena { offset: o, len: l }
                                | Place::InPlaceOf { offset: o, len: l, .. },
                            ) if o == offset
                                && l * graph.node(*of).dtype.size() == len * node.dtype.size() =>
                            {
                                if can_run_in_place(kernels.get(&id), slot) {
                                    Place::InPlaceOf { slot, offset, len }
                                } else {
                                    in_place_fallback()
                                }
                            }
                            // The operand was planned in this range, in place
                            // of its own operand, and fell back to a fresh
                            // allocation: nothing lives in the range now (its
                            // first value's last reader was that operand, which
                            // runs before this node), so this node writes it as
                            // its own.
                            Some(Place::Auto)
                                if matches!(
                                    mem.values.get(of).map(|v| &v.placement),
                                    Some(Placement::Arena { offset: o, in_place_of: Some(_), .. })
                                        if usize::try_from(*o) == Ok(offset)
                                ) =>
                            {
                                Place::Arena { offset, len }
                            }
                            _ => {
                                return Err(bad(format!(
                                    "{id} is placed in place of {of}, whose arena range differs"
                                )))
                            }
                        }
                    }
                }
            }
        };
        steps[i].place = place;
        let size = node.dtype.size();
        root[i] = match place {
            Place::Arena { offset, len } | Place::InPlaceOf { offset, len, .. } => Some((offset, len * size)),
            Place::Auto if node.op.is_view() => steps[i].operands.first().and_then(|&p| root[p]),
            Place::Auto | Place::OverInput => None,
        };
        if let Place::Arena { offset, len } | Place::InPlaceOf { offset, len, .. } = place {
            let (start, end) = (offset, offset + len * size);
            // An extra output is written by its fused node's kernel, while
            // that kernel reads its operands and writes its own value.
            let writer = match node.op {
                Op::Extra { .. } => steps[i].operands[0],
                _ => i,
            };
            let mut read: Vec<usize> = steps[writer].operands.clone();
            if writer != i {
                read.push(writer);
            }
            for (slot, &p) in read.iter().enumerate() {
                let exempt = matches!(place, Place::InPlaceOf { slot: s, .. } if s == slot);
                if let Some((o, b)) = root[p] {
                    if !exempt && o < end && start < o + b && b > 0 && end > start {
                        return Err(bad(format!(
                            "{id} is written to arena bytes {start}..{end}, which overlap its operand {} ({o}..{})",
                            steps[p].id,
                            o + b
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

/// An alias names the view's operand or a value it is itself a view of.
fn check_alias(graph: &Graph, mem: &crate::ir::MemoryPlan, id: NodeId, target: NodeId) -> Result<()> {
    let mut cur = graph.operands(id).first().copied();
    while let Some(c) = cur {
        if c == target {
            return Ok(());
        }
        cur = match mem.values.get(&c).map(|v| &v.placement) {
            Some(Placement::Alias(_)) => graph.operands(c).first().copied(),
            _ => None,
        };
    }
    Err(bad(format!("{id} is placed as an alias of {target}, which it is not a view of")))
}

/// The checked arena range of a value: inside the arena, aligned for its
/// dtype, exactly its bytes. Returns (byte offset, element count).
fn arena_range(
    id: NodeId,
    node: &Node,
    offset: u64,
    bytes: u64,
    arena_bytes: usize,
) -> Result<(usize, usize)> {
    let numel = node.shape.numel();
    let size = node.dtype.size();
    let want = numel.checked_mul(size);
    let (offset, bytes) = match (usize::try_from(offset), usize::try_from(bytes)) {
        (Ok(o), Ok(b)) => (o, b),
        _ => return Err(bad(format!("{id}: arena range {offset}+{bytes} is too large"))),
    };
    if want != Some(bytes) {
        return Err(bad(format!(
            "{id} is {}{} ({} bytes) but its arena range has {bytes} bytes",
            node.dtype,
            node.shape,
            want.map_or_else(|| "too many".to_string(), |w| w.to_string())
        )));
    }
    if offset.checked_add(bytes).is_none_or(|end| end > arena_bytes) {
        return Err(bad(format!(
            "{id}: arena range {offset}+{bytes} ends past the {arena_bytes}-byte arena"
        )));
    }
    let align = dtype_align(node.dtype);
    if offset % align != 0 {
        return Err(bad(format!(
            "{id}: arena offset {offset} is not aligned for {} ({align} bytes)",
            node.dtype
        )));
    }
    Ok((offset, numel))
}

/// The alignment of a dtype's Rust element type.
fn dtype_align(d: DType) -> usize {
    super::storage::dispatch!(d, T => std::mem::align_of::<T>())
}
