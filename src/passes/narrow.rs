//! Narrowing: compute only the rows that slices keep.
//!
//! *Does.* A backward analysis finds, for every node, the window of it its
//! users read along one dimension: a slice of step 1 reads its window, and
//! a node whose own result is read in a window reads the matching window
//! of its operands, through
//! - elementwise ops (unary, binary, compare, where, cast);
//! - `expand` (a dimension that is not broadcast), `permute`, `reshape` (a
//!   dimension kept whole: the same size after the same product of
//!   dimensions), `slice` (of another dimension, or of this one with
//!   step 1);
//! - reductions over other dimensions;
//! - `matmul`: rows of the left operand, columns of the right one, batch
//!   dimensions of both;
//! - `attention`: query rows (and the mask's), when no row of the window
//!   loses a key to the causal flag (every row sees every key; the
//!   narrowed node then drops the flag).
//!
//! A node read in different windows is read in their hull; in windows of
//! different dimensions, or by any other op, whole; in a window of more
//! than half a dimension, whole too (little to save, and an aligned size
//! to lose: GPT-2's LM head pads 50257 columns to 50264 for cuBLAS). Then every node of
//! those kinds read in a strict window is rebuilt on windows of its
//! operands, and the slices that read it read the narrowed node. GPT-2's
//! prefill wants the logits of its last position only: the last layer's
//! attention output, projections, MLP and layer norms then run on that
//! one row, and only the keys and values it writes to the cache run on
//! all of them (Hugging Face asks for the same with `logits_to_keep`;
//! XLA's algebraic simplifier sinks slices through elementwise ops).
//!
//! *Does not.* Narrow sources (inputs, variables, `full`, `arange`,
//! random draws, whose values depend on their shape): a slice of the
//! source stays. Narrow along two dimensions at once, through strided
//! slices, or through any op not listed (convolutions, gathers, effects,
//! `write_at`, casts are listed). It leaves the whole nodes it bypassed to
//! DCE.
//!
//! *Preserves.* Every output value up to rounding: each element is the
//! same expression of the same operands, but a product of fewer rows may
//! run another kernel (a GEMV), which sums in another order. Regions (a
//! narrowed node keeps its node's region), effects (never rebuilt).
//!
//! *Invalidates.* Nothing kept across passes (it runs before fusion).
//!
//! *Assumes.* A verified graph in the canonical phase: elementwise
//! operands of one shape, matmul operands of one rank.

use super::{Changed, Pass, PassCtx, PassOptions};
use crate::ir::{AttnLayout, Graph, NodeId, Op, Shape};
use crate::{Error, Result};
use std::collections::HashMap;

/// Computes only the rows slices keep (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Narrow;

/// What the rewrite made so far.
#[derive(Default)]
struct Narrowed {
    /// Each narrowed node's new node and where its window starts.
    nodes: HashMap<NodeId, (NodeId, usize)>,
    /// Slices already made, by (source, dim, start, len): one per window.
    windows: HashMap<(NodeId, usize, usize, usize), NodeId>,
}

/// The part of a node its users read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    /// All of it.
    Whole,
    /// Indices `start..start + len` of dimension `dim`, all of the others.
    Window { dim: usize, start: usize, len: usize },
}

impl Pass for Narrow {
    fn name(&self) -> &'static str {
        "narrow"
    }

    /// Only a slice of step 1 starts a window.
    fn applies(&self, _options: &PassOptions, graph: &Graph) -> bool {
        graph.node_ids().iter().any(|&id| matches!(graph.node(id).op, Op::Slice { step: 1, .. }))
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let order = graph.topo_order();
        let reads = analyze(graph, &order);
        let mut narrowed = Narrowed::default();
        for &id in &order {
            let Some(&Read::Window { dim, start, len }) = reads.get(&id) else { continue };
            if !narrowable(graph, id, dim, start) {
                continue;
            }
            let new = rebuild(graph, id, (dim, start, len), &mut narrowed)?;
            narrowed.nodes.insert(id, (new, start));
            cx.rewrite();
        }
        if narrowed.nodes.is_empty() {
            return Ok(Changed::No);
        }
        // Whatever else reads a narrowed node is a slice of its window
        // (any other user would have read it whole): it now views the
        // narrowed node.
        for &id in &order {
            if narrowed.nodes.contains_key(&id) {
                continue;
            }
            let Op::Slice { dim, start, step: 1, len } = graph.node(id).op else { continue };
            let [operand] = graph.operands(id)[..] else { continue };
            if !narrowed.nodes.contains_key(&operand) {
                continue;
            }
            let region = graph.node(id).region;
            let view = window_of(graph, operand, (dim, start, len), &mut narrowed, region)?;
            graph.replace_all_uses(id, view);
        }
        Ok(Changed::Yes)
    }
}

/// What each node's users read of it, users first (`order` is operands
/// before users).
fn analyze(graph: &Graph, order: &[NodeId]) -> HashMap<NodeId, Read> {
    let live: std::collections::HashSet<NodeId> = order.iter().copied().collect();
    let roots: std::collections::HashSet<NodeId> = graph.roots().into_iter().collect();
    let mut reads: HashMap<NodeId, Read> = HashMap::new();
    for &id in order.iter().rev() {
        let size = |dim: usize| graph.node(id).shape.0[dim];
        let mut read: Option<Read> = roots.contains(&id).then_some(Read::Whole);
        for user in graph.users(id) {
            if !live.contains(&user) {
                continue;
            }
            let of_user = reads.get(&user).copied().unwrap_or(Read::Whole);
            for (slot, &o) in graph.operands(user).iter().enumerate() {
                if o == id {
                    let r = operand_read(graph, user, slot, of_user);
                    read = Some(match read {
                        None => r,
                        Some(prev) => hull(prev, r),
                    });
                }
            }
        }
        // A window of more than half a dimension is read whole: it saves
        // less than half the work, and the narrowed node can cost more
        // than it saves. GPT-2's LM head pads its 50257 columns to 50264
        // so that half-precision rows are 16-byte aligned for cuBLAS's
        // tensor-core kernels; narrowing the GEMM back to the 50257 its
        // slice keeps made the logits and weight-gradient GEMMs 5x slower.
        let read = match read.unwrap_or(Read::Whole) {
            Read::Window { dim, len, .. } if 2 * len > size(dim) => Read::Whole,
            r => r,
        };
        reads.insert(id, read);
    }
    reads
}

/// The smallest read covering both.
fn hull(a: Read, b: Read) -> Read {
    match (a, b) {
        (Read::Window { dim: d1, start: s1, len: l1 }, Read::Window { dim: d2, start: s2, len: l2 })
            if d1 == d2 =>
        {
            let start = s1.min(s2);
            Read::Window { dim: d1, start, len: (s1 + l1).max(s2 + l2) - start }
        }
        _ => Read::Whole,
    }
}

/// Whether `id`'s window from `start` along `dim` can be computed on
/// windows of its operands (or on whole operands, for a broadcast one).
fn narrowable(graph: &Graph, id: NodeId, dim: usize, start: usize) -> bool {
    let node = graph.node(id);
    match &node.op {
        Op::Reshape(_) => kept_dim(&graph.node(graph.operands(id)[0]).shape, &node.shape, dim).is_some(),
        // Query rows are dim 2 of the `[b, h, sq, dv]` layout only (the
        // `attention-layout` pass, which makes the other, runs later).
        Op::Attention { causal, layout: AttnLayout::Bhsd, .. } => {
            dim == 2 && sees_every_key(graph, id, *causal, start)
        }
        Op::Attention { .. } => false,
        op => rebuildable(op),
    }
}

/// Whether every query row from `start` on of attention `id` sees every
/// key: always without the causal flag; with it, row `i` keeps keys
/// `0..=i`, so only from the last key's row on.
fn sees_every_key(graph: &Graph, id: NodeId, causal: bool, start: usize) -> bool {
    let keys = graph.node(graph.operands(id)[1]).shape.0[2];
    !causal || start + 1 >= keys
}

/// Ops whose result can be computed on a window of their operands.
fn rebuildable(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Where
            | Op::Cast(_)
            | Op::Expand(_)
            | Op::Permute(_)
            | Op::Reshape(_)
            | Op::Slice { .. }
            | Op::Reduce { .. }
            | Op::MatMul
            | Op::Attention { .. }
    )
}

/// What `user`, read as `read`, reads of its operand in `slot`.
fn operand_read(graph: &Graph, user: NodeId, slot: usize, read: Read) -> Read {
    let node = graph.node(user);
    let operand = graph.node(graph.operands(user)[slot]);
    let (in_shape, out_shape) = (&operand.shape, &node.shape);
    // A slice reads its window even when it is read whole.
    if let Op::Slice { dim: sd, start: ss, step: 1, len: sl } = node.op {
        return match read {
            Read::Window { dim, start, len } if dim == sd => Read::Window { dim, start: ss + start, len },
            // A window of another dimension passes through (the slice
            // stays, one dimension at a time).
            window @ Read::Window { .. } => window,
            Read::Whole => Read::Window { dim: sd, start: ss, len: sl },
        };
    }
    let Read::Window { dim, start, len } = read else { return Read::Whole };
    let window = |d: usize| Read::Window { dim: d, start, len };
    match &node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Cast(_) => window(dim),
        Op::Expand(_) => {
            // Right-aligned: output dim `dim` is input dim `dim - lead`.
            let lead = out_shape.rank() - in_shape.rank();
            match dim.checked_sub(lead) {
                Some(d) if in_shape.0[d] == out_shape.0[dim] => window(d),
                _ => Read::Whole,
            }
        }
        Op::Permute(perm) => window(perm[dim]),
        Op::Reshape(_) => match kept_dim(in_shape, out_shape, dim) {
            Some(d) => window(d),
            None => Read::Whole,
        },
        Op::Slice { dim: sd, .. } if *sd != dim => window(dim),
        Op::Reduce { dims, keepdim, .. } => {
            // Output dim `dim` is the input dim it came from.
            let d = if *keepdim {
                Some(dim)
            } else {
                (0..in_shape.rank()).filter(|d| !dims.contains(d)).nth(dim)
            };
            match d {
                Some(d) if !dims.contains(&d) => window(d),
                _ => Read::Whole,
            }
        }
        Op::MatMul => {
            let r = out_shape.rank();
            match (slot, dim) {
                (0, d) if d == r - 2 => window(d),
                (1, d) if d == r - 1 => window(d),
                (_, d) if d < r - 2 => window(d),
                _ => Read::Whole,
            }
        }
        Op::Attention { causal, layout: AttnLayout::Bhsd, .. } => {
            // Query rows only: q and the mask's rows.
            let sees_all = sees_every_key(graph, user, *causal, start);
            match slot {
                0 if dim == 2 && sees_all => window(2),
                3 if dim == 2 && sees_all && in_shape.0[2] == out_shape.0[2] => window(2),
                _ => Read::Whole,
            }
        }
        _ => Read::Whole,
    }
}

/// The input dimension a reshape keeps as output dimension `dim`: the same
/// size after the same number of elements, so a window of one is a window
/// of the other.
fn kept_dim(input: &Shape, output: &Shape, dim: usize) -> Option<usize> {
    let before: usize = output.0[..dim].iter().product();
    let mut acc = 1;
    for (d, &n) in input.0.iter().enumerate() {
        if acc == before && n == output.0[dim] {
            return Some(d);
        }
        acc *= n;
        if acc > before {
            return None;
        }
    }
    None
}

/// `id`'s op on windows of its operands: the window `(dim, start, len)` of
/// its result.
fn rebuild(
    graph: &mut Graph,
    id: NodeId,
    (dim, start, len): (usize, usize, usize),
    narrowed: &mut Narrowed,
) -> Result<NodeId> {
    let node = graph.node(id).clone();
    let read = Read::Window { dim, start, len };
    let operands = graph.operands(id);
    // A slice of this dimension is a window of its operand.
    if let Op::Slice { dim: sd, start: ss, step: 1, .. } = node.op {
        if sd == dim {
            return window_of(graph, operands[0], (dim, ss + start, len), narrowed, node.region);
        }
    }
    let mut inputs = Vec::with_capacity(operands.len());
    for (slot, &o) in operands.iter().enumerate() {
        inputs.push(match operand_read(graph, id, slot, read) {
            Read::Window { dim: d, start: s, len: l } => {
                window_of(graph, o, (d, s, l), narrowed, node.region)?
            }
            Read::Whole => o,
        });
    }
    let mut shape = node.shape.clone();
    shape.0[dim] = len;
    let op = match node.op {
        Op::Expand(_) => Op::Expand(shape.clone()),
        Op::Reshape(_) => Op::Reshape(shape.clone()),
        Op::Slice { dim: sd, start: ss, step, len: sl } => Op::Slice { dim: sd, start: ss, step, len: sl },
        // Every row of the window sees every key (`operand_read`).
        Op::Attention { scale, mask, layout, .. } => Op::Attention { scale, causal: false, mask, layout },
        op => op,
    };
    let new = graph
        .add(op, &inputs, Some((shape.clone(), node.dtype)), node.region)
        .map_err(|e| Error::Backend(format!("narrow: rebuilding {id}: {e}")))?;
    if graph.node(new).shape != shape {
        return Err(Error::Backend(format!(
            "narrow: {id} narrowed to {} where {shape} was meant",
            graph.node(new).shape
        )));
    }
    Ok(new)
}

/// The window `(dim, start, len)` of `id`'s value: of its narrowed node if
/// it has one, else a slice of it (none if the window is all of it), made
/// once per window.
fn window_of(
    graph: &mut Graph,
    id: NodeId,
    (dim, start, len): (usize, usize, usize),
    narrowed: &mut Narrowed,
    region: crate::ir::RegionId,
) -> Result<NodeId> {
    let (source, origin) = narrowed.nodes.get(&id).copied().unwrap_or((id, 0));
    if start == origin && len == graph.node(source).shape.0[dim] {
        return Ok(source);
    }
    let key = (source, dim, start - origin, len);
    if let Some(&made) = narrowed.windows.get(&key) {
        return Ok(made);
    }
    let op = Op::Slice { dim, start: start - origin, step: 1, len };
    let made = graph
        .add(op, &[source], None, region)
        .map_err(|e| Error::Backend(format!("narrow: a window of {id}: {e}")))?;
    narrowed.windows.insert(key, made);
    Ok(made)
}
