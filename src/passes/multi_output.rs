//! Multi-output: a fused value that another fused kernel of its domain
//! reads is computed by that kernel, which writes it as an extra output.
//!
//! *Why.* Fusion never duplicates compute, so a value with readers in
//! several groups is a group of its own: it writes its result and each
//! reader reads it back. AdamW is the plain case: the second moment, the
//! first moment and the parameter are three kernels over one parameter's
//! elements, each moment written over its variable and read back by the
//! parameter update (ten passes over the parameter's size where seven
//! are needed). A layer norm is another: its mean and inverse deviation
//! are kept for the backward pass, so the mean, the centred values, the
//! variance, its inverse root and the output were five kernels. XLA
//! merges such producers into their consumer as a multi-output fusion;
//! this pass does the same for elementwise and row-reduction bodies.
//!
//! *Does.* For each fused elementwise or reduction node `C` in
//! topological order, and while one qualifies, merges into `C` a
//! *producer* `P`: a fused elementwise or reduction node whose value (or
//! one of its `extra` outputs) `C` reads, such that
//! - the merged body is one the fused contract allows
//!   ([`crate::ir::fused`]): one loop over one domain, `P`'s values read
//!   where they are computed (at the domain's shape, or a row value
//!   expanded along its row), every reduction over the same rows;
//! - no other reader of `P` reaches `C` (the merged kernel would then
//!   wait for its own output);
//! - every `over` mark survives (a reduction body writes over nothing);
//! - the merged node takes at most [`MAX_OPERANDS`] operands and holds at
//!   most [`MAX_BODY_NODES`] body nodes.
//!
//! The merged node's body computes `C`'s outputs, then those of `P`'s
//! outputs that something besides `C` reads
//! ([`crate::ir::FusedBody::outputs`]); operands both read are read once.
//! Every other reader of `P` (graph outputs included) reads an
//! `extra %merged output=j` node instead, and `P`'s and `C`'s `over` marks
//! follow their outputs, so the memory pass can still write each new
//! value over its variable. AdamW's three updates of one parameter become
//! one node with three outputs, and a layer norm with the residual add
//! before it one row kernel that writes the output, the sum, and the
//! rows' statistics.
//!
//! *Siblings* first, before any producer: an elementwise node `S` merges
//! into a fused node `C` that reads every computed value `S` reads (`S`
//! may add sources: parameters, constants) and something more, where
//! neither leads to the other. `S`'s output becomes an extra output of
//! `C`, computed at `C`'s time. This is where `remat`'s copies for a
//! backward matmul go: the copy of GELU's output joins GELU's derivative,
//! which reads the same product and the backward's gradient (one kernel,
//! one more write, where the forward value was kept in memory). `C` must
//! read something more, or the copy would join the forward kernel it
//! copies. A copy no sibling takes in is *dropped* for that forward kernel
//! (same body, same operands), whose value its readers then read, as
//! before `remat`: no kernel of its own in the backward pass.
//!
//! The same idea for an attention: its backward's statistics read the
//! log-sum-exp the forward computed, which the forward writes as its
//! extra output 1 (`attention_lse.rs`).
//!
//! And for a copy: last, a `cat` that pads a row kernel's value with
//! constant columns (a slice's gradient; GPT-2's padded LM head) becomes
//! that kernel's output, its rows written in place in the wider buffer
//! (`pad.rs`), and a `cat` of an attention's `q` and `kv` gradients into
//! a fused QKV projection's layout becomes one `attention_grad wrt=qkv`
//! whose kernels write there (`qkv.rs`); any other such pair becomes one
//! `attention_grad wrt=kv+q` whose `dq` is its extra output 1, so the
//! `dq` kernel can read the score gradients the `dk, dv` kernel computed
//! (`attention_pair.rs`).
//!
//! *Does not.* Merge matmul epilogues (one output each), duplicate
//! compute, or reorder anything: every body op is the one the fused graph
//! ran, so values are bit for bit those of the unmerged graph.
//!
//! *Preserves.* Every value the outputs see; the regions of `C`.
//!
//! *Invalidates.* The ids of merged nodes, and the plan tables.
//!
//! *Assumes.* A fused graph (after `fusion` and `assign`). O(n) per
//! candidate for the reachability check.

mod attention_lse;
mod attention_pair;
mod pad;
mod qkv;
mod redomain;

use super::{Changed, Pass, PassCtx};
use crate::ir::{FusedBody, FusedKind, Graph, Node, NodeId, Op, Phase, Shape};
use crate::Result;
use std::collections::HashMap;
use std::sync::Arc;

/// Operands a merged node may take: far under the 512 pointers a CUDA
/// kernel's 4 KiB of parameters hold, and as many as a multi-tensor
/// member should carry.
pub const MAX_OPERANDS: usize = 32;

/// Body nodes a merged node may hold: a GPT-2 layer norm with its
/// residual add is about 40, AdamW about 30. Merging stops well before a
/// kernel's source (and its compile time and registers) grows without
/// bound along a long chain of reductions.
pub const MAX_BODY_NODES: usize = 160;

/// Merges fused elementwise producers into their readers (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct MultiOutput;

impl Pass for MultiOutput {
    fn name(&self) -> &'static str {
        "multi-output"
    }

    fn reaches(&self) -> Phase {
        Phase::Fused
    }

    /// Only where a fused elementwise node reads another of its shape, or
    /// an attention's gradient has its statistics.
    fn applies(&self, _options: &super::PassOptions, graph: &Graph) -> bool {
        pad::any(graph)
            || qkv::any(graph)
            || attention_pair::any(graph)
            || graph.node_ids().into_iter().any(|c| {
                matches!(graph.node(c).op, Op::AttentionStats { .. })
                    || mergeable(graph, c).is_some()
                        && graph.operands(c).into_iter().any(|o| {
                            let p = source(graph, o);
                            p != c && mergeable(graph, p).is_some()
                        })
            })
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let lse = attention_lse::forward_writes_lse(graph)
            .map_err(|m| crate::Error::Verify(format!("multi-output: {m}")))?;
        if lse > 0 {
            cx.note(format!("{lse} attention(s) write their log-sum-exp for the backward"));
            cx.rewrite();
        }
        // Siblings first: a kernel that recomputes forward values for the
        // backward pass (`remat`) joins a backward kernel that reads them
        // too, before a forward producer of those values could take it
        // in (which would compute it in the forward pass and keep it live
        // until the backward reads it).
        let mut siblings = 0usize;
        for s in graph.topo_order() {
            if !graph.contains(s) {
                continue;
            }
            if sibling_hosts(graph, s).into_iter().find_map(|c| merge(graph, c, s)).is_some() {
                siblings += 1;
                cx.rewrite();
            }
        }
        let refolded = refold_lone_copies(graph);
        if refolded > 0 {
            cx.note(format!("{refolded} copies with no kernel to join read their forward value"));
            cx.rewrite();
        }
        let mut merged = 0usize;
        for c in graph.topo_order() {
            let mut c = c;
            while graph.contains(c) {
                let Some(next) = producers(graph, c).into_iter().find_map(|p| merge(graph, c, p)) else {
                    break;
                };
                c = next;
                merged += 1;
                cx.rewrite();
            }
        }
        cx.note(format!("{merged} producer(s) merged into their readers"));
        // Last, on the merged kernels: a row kernel's value is final once
        // nothing more merges into it.
        let padded = pad::rows_write_their_padding(graph);
        if padded > 0 {
            cx.note(format!("{padded} row kernel(s) write the padded copy a cat made"));
            cx.rewrite();
        }
        let packed = qkv::gradients_in_projection_layout(graph);
        if packed > 0 {
            cx.note(format!("{packed} attention backward(s) write their projection's layout"));
            cx.rewrite();
        }
        let paired = attention_pair::queries_with_keys(graph);
        if paired > 0 {
            cx.note(format!("{paired} attention backward(s) compute dq with dk, dv"));
            cx.rewrite();
        }
        if siblings > 0 {
            cx.note(format!("{siblings} sibling(s) merged into a kernel that reads what they read"));
        }
        tracing::debug!(merged, siblings, refolded, lse, padded, packed, paired, "multi-output");
        Ok(Changed::from(merged + siblings + refolded + lse + padded + packed + paired > 0))
    }
}

/// The fused body of `id`, if it is an elementwise or reduction one.
fn mergeable(graph: &Graph, id: NodeId) -> Option<&Arc<FusedBody>> {
    match &graph.node(id).op {
        Op::Fused(b)
            if matches!(b.kind(), FusedKind::Elementwise | FusedKind::Reduction { .. })
                && b.padded().is_none() =>
        {
            Some(b)
        }
        _ => None,
    }
}

/// The fused node whose output `id` is (itself, or an extra's operand).
fn source(graph: &Graph, id: NodeId) -> NodeId {
    match graph.node(id).op {
        Op::Extra { .. } => graph.operands(id)[0],
        _ => id,
    }
}

/// The producers `C` may take, in operand order (see the module docs);
/// whether the merged body is legal is left to [`merge`].
fn producers(graph: &Graph, c: NodeId) -> Vec<NodeId> {
    let mut out = Vec::new();
    if mergeable(graph, c).is_none() {
        return out;
    }
    let operands = graph.operands(c);
    for &o in &operands {
        let p = source(graph, o);
        if p == c || out.contains(&p) || mergeable(graph, p).is_none() {
            continue;
        }
        let mut all: Vec<NodeId> = operands.iter().copied().filter(|&o2| source(graph, o2) != p).collect();
        all.extend(graph.operands(p));
        all.sort_unstable();
        all.dedup();
        let nodes = |id: NodeId| mergeable(graph, id).map_or(0, |b| b.graph().len());
        if all.len() > MAX_OPERANDS || nodes(c) + nodes(p) > MAX_BODY_NODES {
            continue;
        }
        // No other reader of P (or of its extras) may lead to C.
        let mut readers: Vec<NodeId> = Vec::new();
        for u in graph.users(p) {
            match graph.node(u).op {
                Op::Extra { .. } => readers.extend(graph.users(u)),
                _ => readers.push(u),
            }
        }
        if readers.iter().all(|&u| u == c || !graph.reaches(u, c)) {
            out.push(p);
        }
    }
    out
}

/// The fused nodes that elementwise node `s` may be merged into as a
/// sibling, in topological order (see the module docs): each reads every
/// computed value `s` reads (`s` adds only sources, parameters and
/// constants, to its reads), neither leads to the other, and the merged
/// node stays within [`MAX_OPERANDS`] and [`MAX_BODY_NODES`]. Whether the
/// merged body is legal is left to [`merge`].
fn sibling_hosts(graph: &Graph, s: NodeId) -> Vec<NodeId> {
    let Some(sb) = mergeable(graph, s) else { return Vec::new() };
    if !matches!(sb.kind(), FusedKind::Elementwise) || graph.outputs().contains(&s) {
        return Vec::new();
    }
    let s_ops = graph.operands(s);
    let computed: Vec<NodeId> = s_ops.iter().copied().filter(|&o| !is_source(graph, o)).collect();
    let Some(&first) = computed.first() else { return Vec::new() };
    let mut out = Vec::new();
    for c in graph.users(first) {
        if c == s || out.contains(&c) {
            continue;
        }
        let Some(cb) = mergeable(graph, c) else { continue };
        let c_ops = graph.operands(c);
        // C reads all S reads, and something more: it runs no earlier
        // than S would. (A copy reading what the forward kernel it
        // recomputes reads would otherwise join that kernel, and be
        // computed in the forward pass again.)
        let more = c_ops.iter().any(|&o| !is_source(graph, o) && !computed.contains(&o));
        if !more || !computed.iter().all(|o| c_ops.contains(o)) {
            continue;
        }
        let mut all = c_ops.clone();
        all.extend(&s_ops);
        all.sort_unstable();
        all.dedup();
        if all.len() > MAX_OPERANDS || cb.graph().len() + sb.graph().len() > MAX_BODY_NODES {
            continue;
        }
        if graph.reaches(s, c) || graph.reaches(c, s) {
            continue;
        }
        out.push(c);
    }
    out
}

/// A backward kernel that is a forward kernel again (the same body over the
/// same operands: a copy `remat` made for a matmul of the backward pass,
/// which no sibling took in) is dropped, and its readers read the forward
/// kernel's value, kept until then as it was before `remat`: one kernel
/// fewer, and no more memory than without the copy. (A ReLU's output
/// read by its weight gradient's matmul is such a copy: the mask its
/// backward reads is a kernel of its own, which reads nothing more.)
/// Returns how many were dropped.
fn refold_lone_copies(graph: &mut Graph) -> usize {
    let Some(grad) = graph.find_region("grad") else { return 0 };
    let key = |graph: &Graph, id: NodeId| {
        let node = graph.node(id);
        match &node.op {
            Op::Fused(b) if matches!(b.kind(), FusedKind::Elementwise) && b.outputs().len() == 1 => {
                Some((b.to_string(), graph.operands(id), node.dtype, node.shape.clone()))
            }
            _ => None,
        }
    };
    let mut forward = HashMap::new();
    let mut copies = Vec::new();
    for id in graph.topo_order() {
        let Some(k) = key(graph, id) else { continue };
        if graph.within(graph.node(id).region, grad) {
            copies.push((id, k));
        } else {
            forward.entry(k).or_insert(id);
        }
    }
    let mut dropped = 0;
    for (id, k) in copies {
        if let Some(&f) = forward.get(&k) {
            if !graph.outputs().contains(&id) {
                graph.replace_all_uses(id, f);
                graph.remove(id);
                dropped += 1;
            }
        }
    }
    dropped
}

/// Whether `id` (through views) is a graph input or a constant: live
/// throughout, so reading it adds no lifetime.
fn is_source(graph: &Graph, mut id: NodeId) -> bool {
    while graph.node(id).op.is_view() {
        id = graph.operands(id)[0];
    }
    matches!(graph.node(id).op, Op::Input(_) | Op::Full(_))
}

/// Merges producer `p` into reader `c`; returns the merged node (`None`,
/// changing nothing, if the merged body breaks the fused contract).
fn merge(graph: &mut Graph, c: NodeId, p: NodeId) -> Option<NodeId> {
    let (mut cb, pb) = (mergeable(graph, c)?.clone(), mergeable(graph, p)?.clone());
    // An elementwise reader over another shape of P's domain computes over
    // P's domain instead (`redomain.rs`); its readers see a reshape. Not
    // a returned one: a returned view of a computed value is copied into
    // its output buffer, which would cost more than the merge saves.
    let returned = |x: NodeId| graph.outputs().contains(&x);
    let c_returned = returned(c)
        || graph.users(c).into_iter().any(|u| matches!(graph.node(u).op, Op::Extra { .. }) && returned(u));
    if !c_returned {
        if let Some(moved) = redomain::redomain(&cb, &domain(&pb)) {
            cb = Arc::new(moved);
        }
    }
    let c_ops = graph.operands(c);
    let p_ops = graph.operands(p);
    // The merged operand list: C's (less P's outputs), then P's new ones.
    let mut operands: Vec<NodeId> = Vec::new();
    let slot = |operands: &mut Vec<NodeId>, o: NodeId| match operands.iter().position(|&x| x == o) {
        Some(s) => s,
        None => {
            operands.push(o);
            operands.len() - 1
        }
    };
    let mut body = Graph::new();
    let mut inputs: HashMap<usize, NodeId> = HashMap::new();
    let mut input_node = |body: &mut Graph, s: usize, like: &Node| {
        *inputs
            .entry(s)
            .or_insert_with(|| body.add_unchecked(Node { op: Op::Input(s as u32), ..like.clone() }, &[]))
    };
    for &o in &c_ops {
        if source(graph, o) != p {
            slot(&mut operands, o);
        }
    }
    // P's body first: C reads its outputs.
    let pmap = copy_body(&mut body, pb.graph(), |body, k, n| {
        let s = slot(&mut operands, p_ops[k]);
        input_node(body, s, n)
    });
    let p_outputs: Vec<NodeId> = pb.outputs().iter().map(|o| pmap[o]).collect();
    let cmap = copy_body(&mut body, cb.graph(), |body, k, n| {
        let o = c_ops[k];
        match graph.node(o).op {
            _ if o == p => p_outputs[0],
            Op::Extra { output } if source(graph, o) == p => p_outputs[output],
            _ => {
                let s = slot(&mut operands, o);
                input_node(body, s, n)
            }
        }
    });
    // P's outputs that something besides C reads stay outputs; the rest
    // are only computed (C reads them in registers).
    let read_outside = |x: NodeId| graph.outputs().contains(&x) || graph.users(x).iter().any(|&u| u != c);
    let mut p_extras: Vec<Option<NodeId>> = vec![None; p_outputs.len()];
    for u in graph.users(p) {
        if let Op::Extra { output } = graph.node(u).op {
            p_extras[output] = Some(u);
        }
    }
    let p_direct = graph.outputs().contains(&p)
        || graph.users(p).iter().any(|&u| u != c && !matches!(graph.node(u).op, Op::Extra { .. }));
    let kept: Vec<usize> = (0..p_outputs.len())
        .filter(|&j| if j == 0 { p_direct } else { p_extras[j].is_some_and(read_outside) })
        .collect();
    let c_count = cb.outputs().len();
    let mut outputs: Vec<NodeId> = cb.outputs().iter().map(|o| cmap[o]).collect();
    outputs.extend(kept.iter().map(|&j| p_outputs[j]));
    body.set_outputs(outputs);
    let mut merged = FusedBody::new(body).ok()?;
    // `over` marks follow their outputs to the operands' new slots.
    let marks: Vec<(usize, NodeId)> = (0..c_count)
        .filter_map(|j| cb.output_over(j).map(|k| (j, c_ops[k])))
        .chain(
            kept.iter().enumerate().filter_map(|(i, &j)| pb.output_over(j).map(|k| (c_count + i, p_ops[k]))),
        )
        .collect();
    // A mark the merged body cannot keep (a reduction body writes over
    // nothing) would cost a copy of the variable every step: no merge.
    for (j, x) in marks {
        let s = operands.iter().position(|&o| o == x)?;
        merged = merged.with_output_over(j, s).ok()?;
    }
    let node = graph.node(c).clone();
    let shape = body_shape(&merged, merged.output());
    let new = graph.add_unchecked(Node { op: Op::Fused(Arc::new(merged)), shape, ..node.clone() }, &operands);
    // C's readers (its extras included, whose output numbers stay) read
    // the merged node; P's read its kept outputs as extras.
    if graph.node(new).shape == node.shape {
        graph.replace_all_uses(c, new);
    } else {
        // C moved to P's domain: its extras read the merged node over the
        // new shape and their readers, like C's, a reshape back.
        for u in graph.users(c) {
            if matches!(graph.node(u).op, Op::Extra { .. }) {
                let back = reshape_back(graph, u, new);
                graph.replace_all_uses(u, back);
                graph.set_operands(u, &[new]);
                graph.node_mut(u).shape = graph.node(new).shape.clone();
                graph.set_operands(back, &[u]);
            }
        }
        let back = reshape_back(graph, c, new);
        graph.replace_all_uses(c, back);
    }
    graph.remove(c);
    for (i, &j) in kept.iter().enumerate() {
        let output = c_count + i;
        match p_extras[j] {
            Some(u) => {
                graph.node_mut(u).op = Op::Extra { output };
                graph.set_operands(u, &[new]);
            }
            None => {
                let pn = graph.node(p).clone();
                let e = graph.add_unchecked(Node { op: Op::Extra { output }, ..pn }, &[new]);
                graph.replace_all_uses(p, e);
            }
        }
    }
    // P's extras that only C read are gone with it.
    let dropped: Vec<NodeId> =
        p_extras.iter().enumerate().filter(|(j, _)| !kept.contains(j)).filter_map(|(_, u)| *u).collect();
    graph.remove_many(&dropped);
    graph.remove(p);
    Some(new)
}

/// The domain of an elementwise or reduction body (the output's shape
/// for an elementwise one).
fn domain(body: &FusedBody) -> Shape {
    match body.kind() {
        FusedKind::Reduction { domain, .. } => domain.clone(),
        _ => body_shape(body, body.output()),
    }
}

/// The shape of body node `id`.
fn body_shape(body: &FusedBody, id: NodeId) -> Shape {
    body.graph().node(id).shape.clone()
}

/// A `reshape` of `from` to the shape `old` had, typed and placed as `old`.
fn reshape_back(graph: &mut Graph, old: NodeId, from: NodeId) -> NodeId {
    let n = graph.node(old).clone();
    let node = Node { op: Op::Reshape(n.shape.clone()), ..n };
    graph.add_unchecked(node, &[from])
}

/// Copies `from`'s nodes into `into` in topological order, each `input k`
/// replaced by `input(into, k, its node)`; returns each node's copy.
fn copy_body(
    into: &mut Graph,
    from: &Graph,
    mut input: impl FnMut(&mut Graph, usize, &Node) -> NodeId,
) -> HashMap<NodeId, NodeId> {
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    for id in from.topo_order() {
        let n = from.node(id);
        let new = match n.op {
            Op::Input(k) => input(into, k as usize, n),
            _ => {
                let ops: Vec<NodeId> = from.operands(id).iter().map(|o| map[o]).collect();
                into.add_unchecked(n.clone(), &ops)
            }
        };
        map.insert(id, new);
    }
    map
}
