//! Row-reduction kernels: softmax, layer norm, and any reduction.
//!
//! The domain `D` splits into rows (`D[..split]`) and columns
//! (`D[split..]`). A *group* of threads owns a row: one thread for short
//! rows (up to 16 columns), a warp for rows up to 512 columns, the whole
//! block beyond that. For every reduction of the body the group runs over
//! the row's columns, each thread accumulating its columns, then combines
//! across the group (`kiln::group_reduce`: warp shuffles, and shared memory
//! between warps). Values computed per row (the max, the sum, `rsqrt(var +
//! eps)`) are then known to every thread of the group; the output is
//! written in a last pass over the columns, or once per row.
//!
//! When each thread has at most 16 columns, operands read by several
//! passes are kept in registers after the first pass: softmax reads its
//! input once and writes its output once. Float sums accumulate in double
//! (as the CPU backend does), integer sums wrap.
//!
//! Longer rows are read from memory in every pass, and a row's max and
//! its sum of `exp(x - max)` (softmax, log-sum-exp, cross-entropy) take
//! one pass between them, `CHUNK` columns a thread at a time, the sum
//! rescaled whenever the running max grows (see [`OnlinePair`]).
//!
//! A body with extra outputs (`out1`, `out2`, ...) writes the per-element
//! ones in the same last pass as the output, and the per-row ones once
//! per row: a layer norm writes its rows' mean and inverse deviation for
//! the backward pass next to its output.

use super::body::{buffer_operands, out_name, params_named, Body, Leaf, Operand};
use super::expr;
use super::{paired, types, Kernel};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, Padded, ReduceOp, Shape, UnaryOp};
use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// Whether a body node is known per row or per element of the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Leaf,
    Row,
    Full,
}

/// Threads that own one row, for rows of `cols` columns: a warp while
/// each lane has at most [`MAX_ITEMS`] columns (kept in registers between
/// passes), a block beyond. A warp over a 768-wide layer norm row (GPT-2's)
/// had 24 columns a lane, read from memory in each of its three passes:
/// 6.3 µs a row on an H100, a sixth of a decode step's kernel time.
fn group_for(cols: usize) -> usize {
    if cols <= 16 {
        1
    } else if cols <= 32 * MAX_ITEMS {
        32
    } else {
        // About 8 columns per thread, 128 to 1024 threads.
        (cols.div_ceil(8)).next_power_of_two().clamp(128, 1024)
    }
}

/// Columns per thread at most for the unrolled, register-caching loops.
const MAX_ITEMS: usize = 16;
/// Columns a thread reads at once in the online max-and-sum pass: their
/// loads issue together, their max rescales the sum once, and their terms
/// add in float before the double. Measured alone on an H200 (GPT-2's
/// loss kernel, `[4096, 50257]` bf16, `benches/probes/row_kernels.py`):
/// 545 µs against 632 for the three-pass kernel; 634 with 4 columns, 839
/// with 16; and the same chunks in the output pass made it slower (617).
const CHUNK: usize = 8;
/// Registers (values) per thread at most for cached operands.
const MAX_CACHED: usize = 64;

/// The kernel computing a reduction `body` over `domain` split at `split`;
/// `in_place` when its per-element output is written over an operand
/// (no `__restrict__`: each element is read before its thread writes it,
/// after the row's last reduction).
pub(crate) fn generate(
    name: &str,
    g: &Graph,
    operands: &[Operand],
    domain: &Shape,
    split: usize,
    in_place: bool,
) -> Result<Kernel, String> {
    // A padded output 0 (`ir::Padded`): the body computes the unpadded
    // value, whose rows are stored `width` apart with the fills after.
    let pad = crate::ir::fused::padded_output(g);
    let unpadded;
    let g = match &pad {
        Some(p) => {
            unpadded = crate::ir::fused::without_cat(g, p.value);
            &unpadded
        }
        None => g,
    };
    let body = Body::new(g, operands)?;
    let rows: usize = domain.0[..split].iter().product();
    let cols: usize = domain.0[split..].iter().product();
    let width = pad.as_ref().map_or(cols, |p| p.width);
    let class = classify(&body, domain);
    // Leaves read directly (the rest are only viewed further).
    let read: Vec<NodeId> = body
        .order
        .iter()
        .copied()
        .filter(|&id| {
            body.is_leaf(id)
                && (id == body.output
                    || body.order.iter().any(|&n| !body.is_leaf(n) && g.operands(n).contains(&id)))
        })
        .collect();
    let group = group_for(cols);
    let (block, rows_per_block) = if group >= 128 { (group, 1) } else { (256, 256 / group) };
    let items = cols.div_ceil(group);
    let unrolled = items <= MAX_ITEMS;
    let index = body.index_type(rows * width.max(1), operands);
    let outputs = g.outputs();
    let out_dtypes: Vec<DType> = outputs.iter().map(|&o| g.node(o).dtype).collect();
    // Outputs per element (written in the last column pass) and per row.
    let full: Vec<usize> = (0..outputs.len()).filter(|&j| class[&outputs[j]] != Class::Row).collect();
    let per_row: Vec<usize> = (0..outputs.len()).filter(|&j| class[&outputs[j]] == Class::Row).collect();

    // Column passes: one per reduction, plus the outputs' if any is per element.
    let reductions: Vec<NodeId> =
        body.order.iter().copied().filter(|&n| matches!(g.node(n).op, Op::Reduce { .. })).collect();
    let mut passes: Vec<Vec<NodeId>> = reductions.iter().map(|&r| vec![g.operands(r)[0]]).collect();
    if !full.is_empty() {
        passes.push(full.iter().map(|&j| outputs[j]).collect());
    }
    // Only rows too long for registers: a row in registers reads memory
    // once however many passes it takes.
    let online = if unrolled { Vec::new() } else { online_pairs(&body) };
    // Computed values that later passes read again stay in registers (a
    // residual sum, a softmax's exp), then operands read in more than one
    // pass (of what is still computed from them).
    let kept =
        if unrolled { kept_values(&body, &class, &passes, MAX_CACHED / items.max(1)) } else { Vec::new() };
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for (k, p) in passes.iter().enumerate() {
        let mut seen = leaves_of(&body, p, &|n| available(&class, &kept, k, n));
        seen.sort();
        seen.dedup();
        for l in seen {
            *uses.entry(l).or_default() += 1;
        }
    }
    let mut cached: Vec<NodeId> = Vec::new();
    if unrolled {
        for &id in &read {
            let cacheable = body.leaves.get(&id).is_some_and(|l| l.operand.is_some() && !l.is_uniform());
            if cacheable
                && uses.get(&id).copied().unwrap_or(0) >= 2
                && (kept.len() + cached.len() + 1) * items <= MAX_CACHED
            {
                cached.push(id);
            }
        }
    }

    let mut src = String::new();
    let p = params_named(&out_dtypes, operands, in_place, "");
    let _ = writeln!(src, "extern \"C\" __global__ void {name}({p}) {{");
    let _ = writeln!(src, "  typedef {index} I;\n  const I R = {rows}, C = {cols};");
    if pad.is_some() {
        let _ = writeln!(src, "  const I W = {width};");
    }
    let _ = writeln!(src, "  const int lane = threadIdx.x % {group};");
    let mut gen = Gen {
        body: &body,
        class: &class,
        split,
        cached: &cached,
        loaded: Vec::new(),
        kept: &kept,
        pass: 0,
        unrolled,
        items,
        group,
        cols,
    };
    // Broadcast operands: read once.
    for &id in &read {
        if let Some(l) = body.leaves.get(&id) {
            if l.operand.is_some() && l.is_uniform() {
                let v = l.read_at(&l.access.offset_of("0"));
                let _ = writeln!(src, "  const {} u{} = {v};", types::compute(l.dtype), id.index());
            }
        }
    }
    let _ = writeln!(
        src,
        "  for (I row = (I)blockIdx.x * {rows_per_block} + threadIdx.x / {group}; row < R; row += (I)gridDim.x * {rows_per_block}) {{"
    );
    for &id in &read {
        if let Some(l) = body.leaves.get(&id) {
            if let (Some(_), false, Some(_)) = (l.operand, l.is_uniform(), l.access.single()) {
                let (rb, _) = l.access.split_offsets(split, "row", "0").unwrap_or_default();
                let _ = writeln!(src, "    const I rb{} = {rb};", id.index());
            }
        }
    }
    for &id in &cached {
        let l = &body.leaves[&id];
        let _ = writeln!(src, "    {} c{}[{items}];", types::compute(l.dtype), id.index());
    }
    for &(id, _) in &kept {
        let _ = writeln!(src, "    {} k{}[{items}];", types::compute(g.node(id).dtype), id.index());
    }
    for &id in &body.order {
        match (class[&id], &g.node(id).op) {
            (Class::Row, Op::Reduce { op, .. }) => match online.iter().find(|p| p.max == id || p.sum == id) {
                Some(pair) if pair.max == id => gen.online_max_sum(&mut src, pair)?,
                Some(_) => {} // computed with its max
                None => gen.reduction(&mut src, id, *op)?,
            },
            (Class::Row, _) => {
                let s = body.statement(id, &format!("r{}", id.index()), &|o| gen.row_operand(o))?;
                let _ = writeln!(src, "    {s}");
            }
            _ => {}
        }
    }
    if !full.is_empty() {
        let targets: Vec<NodeId> = full.iter().map(|&j| outputs[j]).collect();
        gen.column_pass(&mut src, &targets, &|gen, src, col_value, col| {
            for &j in &full {
                // A node's value: already what its dtype holds.
                let v = types::store_exact(out_dtypes[j], &col_value(gen, outputs[j]));
                let at = if j == 0 && pad.is_some() {
                    format!("row * W + {col}")
                } else {
                    format!("row * C + {col}")
                };
                let _ = writeln!(src, "        {}[{at}] = {v};", out_name(j));
            }
        })?;
    }
    if let Some(p) = &pad {
        pad_columns(&mut src, p, out_dtypes[0], group);
    }
    for &j in &per_row {
        let v = types::store_exact(out_dtypes[j], &gen.row_operand(outputs[j]));
        let _ = writeln!(src, "    if (lane == 0) {}[row] = {v};", out_name(j));
    }
    src.push_str("  }\n}\n");
    let grid = super::grid_for(rows, rows_per_block);
    Ok(Kernel::new(name, src, grid, block as u32, buffer_operands(operands)))
}

/// The constant columns `C..W` of a padded output's row, after its
/// value's columns (the lanes of the row's group take them in turn).
fn pad_columns(src: &mut String, pad: &Padded, dtype: DType, group: usize) {
    let _ = writeln!(src, "    for (I col = C + lane; col < W; col += {group}) {{");
    let mut end = pad.cols;
    let (last, init) = pad.fills.split_last().expect("a padded output has a fill");
    let mut value = String::new();
    for &(n, v) in init {
        end += n;
        let _ = write!(value, "col < {end} ? {} : ", types::literal(dtype, v));
    }
    value.push_str(&types::literal(dtype, last.1));
    let v = types::store(dtype, &format!("({value})"));
    let _ = writeln!(src, "      out[row * W + col] = {v};\n    }}");
}

/// Per-row or per-element, decided by structure (see the module docs of
/// `ir::fused`): reductions are per row, an expand of a per-row value is
/// per element, an op is per element if any operand is, per row if any
/// operand is, and an op of leaves alone goes by its shape.
fn classify(body: &Body<'_>, domain: &Shape) -> HashMap<NodeId, Class> {
    let mut class = HashMap::new();
    for &id in &body.order {
        let node = body.g.node(id);
        let c = if body.is_leaf(id) {
            Class::Leaf
        } else if matches!(node.op, Op::Reduce { .. }) {
            Class::Row
        } else if matches!(node.op, Op::Expand(_)) {
            Class::Full
        } else {
            let ops: Vec<Class> = body.g.operands(id).iter().map(|o| class[o]).collect();
            if ops.contains(&Class::Full) {
                Class::Full
            } else if ops.contains(&Class::Row) {
                Class::Row
            } else if node.shape == *domain {
                Class::Full
            } else {
                Class::Row
            }
        };
        class.insert(id, c);
    }
    class
}

/// A row's max and its sum of `exp(x - max)`, computed in one pass:
/// `max = max(a)`, `sum = sum(exp(a - expand(max)))`, all f32.
///
/// Each thread keeps a running max `m` and `s = Σ exp(a - m)` over its
/// columns, multiplying `s` by `exp(m - m')` when the max grows to `m'`
/// (by 1 when it does not: `-inf` to `-inf` must not make NaN); the group
/// combines the threads' `(m, s)` the same way. A column of `-inf` adds 0
/// (`exp(-inf - m)` is 0 for a finite `m`; before any finite column it
/// would be NaN). The two-pass sum is NaN exactly when the row's max is
/// not finite, and so is this one: a `+inf` column adds `exp(inf - inf)`,
/// a NaN makes the max NaN and the rescale `exp(m - NaN)`, and a row of
/// only `-inf` is set to NaN at the end. Otherwise the sums differ only in
/// rounding (each term is `exp` of a difference from another max, and a
/// chunk's terms add in float).
#[derive(Clone, Copy, Debug)]
struct OnlinePair {
    max: NodeId,
    sum: NodeId,
    operand: NodeId,
}

/// The online pairs of a body (see [`OnlinePair`]).
fn online_pairs(body: &Body<'_>) -> Vec<OnlinePair> {
    let g = body.g;
    let f32_node = |n: NodeId| !body.is_leaf(n) && g.node(n).dtype == DType::F32;
    let mut pairs = Vec::new();
    for &sum in &body.order {
        if !f32_node(sum) || !matches!(g.node(sum).op, Op::Reduce { op: ReduceOp::Sum, .. }) {
            continue;
        }
        let e = g.operands(sum)[0];
        if !f32_node(e) || !matches!(g.node(e).op, Op::Unary(UnaryOp::Exp)) {
            continue;
        }
        let d = g.operands(e)[0];
        if !f32_node(d) || !matches!(g.node(d).op, Op::Binary(BinaryOp::Sub)) {
            continue;
        }
        let (operand, b) = (g.operands(d)[0], g.operands(d)[1]);
        if !f32_node(b) || !matches!(g.node(b).op, Op::Expand(_)) {
            continue;
        }
        let max = g.operands(b)[0];
        if f32_node(max)
            && matches!(g.node(max).op, Op::Reduce { op: ReduceOp::Max, .. })
            && g.operands(max)[0] == operand
            && g.node(operand).dtype == DType::F32
            // One sum a max: its pass settles that one sum.
            && !pairs.iter().any(|p: &OnlinePair| p.max == max)
        {
            pairs.push(OnlinePair { max, sum, operand });
        }
    }
    pairs
}

/// The leaves a column pass computing `targets` reads, its cone ending at
/// the values `known` before it.
fn leaves_of(body: &Body<'_>, targets: &[NodeId], known: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
    let mut out = Vec::new();
    for &target in targets {
        if body.is_leaf(target) {
            out.push(target);
        }
        for n in body.cone(target, known) {
            out.extend(body.g.operands(n).into_iter().filter(|o| body.is_leaf(*o)));
        }
    }
    out
}

/// The nodes a column pass computes for `targets`, in body order, its
/// cone ending at the values `known` before it.
fn pass_cone(body: &Body<'_>, targets: &[NodeId], known: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
    let need: HashSet<NodeId> = targets.iter().flat_map(|&t| body.cone(t, known)).collect();
    body.order.iter().copied().filter(|n| need.contains(n)).collect()
}

/// True when pass `pass` finds `n` computed: a row value, or a value kept
/// by an earlier pass.
fn available(class: &HashMap<NodeId, Class>, kept: &[(NodeId, usize)], pass: usize, n: NodeId) -> bool {
    class[&n] == Class::Row || kept.iter().any(|&(k, p)| k == n && p < pass)
}

/// Per-column values computed in one pass and read again by later ones,
/// each with the pass that computes it, at most `room` of them: a later
/// pass reads `k<id>[it]` instead of computing the value again (and
/// reloading its operands). Only the frontier is kept: a value whose later
/// readers are not themselves recomputed (a layer norm keeps its residual
/// sum `x`, then `x - mean`; a softmax keeps `exp(x - max)`, not
/// `x - max` too). Expands of row values cost nothing and stay out.
///
/// A bf16 layer norm without it computed the residual sum and its rounding
/// in all three passes: measured alone (H200), one rounding less an
/// element is worth about a microsecond on BERT-base's `[4096, 768]`.
fn kept_values(
    body: &Body<'_>,
    class: &HashMap<NodeId, Class>,
    passes: &[Vec<NodeId>],
    room: usize,
) -> Vec<(NodeId, usize)> {
    let g = body.g;
    let mut kept: Vec<(NodeId, usize)> = Vec::new();
    for p in 0..passes.len() {
        let known = |n: NodeId| available(class, &kept, p + 1, n);
        let here: HashSet<NodeId> =
            pass_cone(body, &passes[p], &|n| available(class, &kept, p, n)).into_iter().collect();
        let later: HashSet<NodeId> =
            passes[p + 1..].iter().flat_map(|t| pass_cone(body, t, &known)).collect();
        let shared: Vec<NodeId> =
            body.order.iter().copied().filter(|n| here.contains(n) && later.contains(n)).collect();
        let mut keep = Vec::new();
        for &n in &shared {
            let read_later = passes[p + 1..].iter().any(|t| t.contains(&n))
                || later.iter().any(|&u| !shared.contains(&u) && g.operands(u).contains(&n));
            if read_later && !matches!(g.node(n).op, Op::Expand(_)) && kept.len() + keep.len() < room {
                keep.push((n, p));
            }
        }
        kept.extend(keep);
    }
    kept
}

/// Whether a thread sums its columns of an unrolled row (at most
/// [`MAX_ITEMS`]) in float before the group adds the threads' sums in
/// double. Each conversion to double issues at a quarter of float
/// arithmetic's rate, and one a column set the time of BERT-base's layer
/// norm (`[4096, 768]` bf16, H200, `benches/probes/layer_norm.py`: 11.5 us
/// with double terms, 9.9 with float partials; both with one conversion a
/// rounding). The online max-and-sum pass does the same with [`CHUNK`]
/// columns. What it costs: a partial of at most 16 floats rounds up to 15
/// times, a relative error of about `15 * 2^-24` of the sum of the
/// terms' magnitudes (a bf16 or f16 result cannot see it; an f32 one can,
/// in its last bits, where the CPU backend sums in double), and a partial
/// can overflow where a double would not (terms near `f32::MAX` that
/// cancel), as PyTorch's float accumulation does.
fn partial_in_float(op: ReduceOp, xd: DType) -> bool {
    matches!(op, ReduceOp::Sum | ReduceOp::Mean) && types::compute(xd) == "float"
}

/// Emission state: which cached operands the passes so far have loaded.
struct Gen<'b, 'a> {
    body: &'b Body<'a>,
    class: &'b HashMap<NodeId, Class>,
    split: usize,
    cached: &'b [NodeId],
    loaded: Vec<NodeId>,
    /// Computed values kept in `k<id>[]` (see [`kept_values`]), and the
    /// column pass being emitted.
    kept: &'b [(NodeId, usize)],
    pass: usize,
    unrolled: bool,
    items: usize,
    group: usize,
    cols: usize,
}

type ColValue<'x> = &'x dyn Fn(&Gen<'_, '_>, NodeId) -> String;

impl Gen<'_, '_> {
    /// A value in the row context (per-row values and leaves at column 0).
    fn row_operand(&self, id: NodeId) -> String {
        match self.body.leaves.get(&id) {
            Some(l) => self.leaf_at(id, l, None),
            None => format!("r{}", id.index()),
        }
    }

    /// A leaf's value at the current row and `col` (None: column 0).
    fn leaf_at(&self, id: NodeId, l: &Leaf, col: Option<&str>) -> String {
        if l.constant.is_some() {
            return l.read_at("0");
        }
        if l.arange.is_some() {
            // Computed at its offset: no pointer, no row base.
            let c = col.unwrap_or("0");
            let at = match l.access.split_offsets(self.split, "row", c) {
                Some((r, c)) => format!("{r} + {c}"),
                None => l.access.offset_of(&format!("(row * C + {c})")),
            };
            return l.read_at(&at);
        }
        if l.is_uniform() {
            return format!("u{}", id.index());
        }
        match (l.access.single(), col) {
            (Some(_), None) => l.read_at(&format!("rb{}", id.index())),
            (Some(_), Some(c)) => {
                let (_, co) = l.access.split_offsets(self.split, "row", c).unwrap_or_default();
                l.read_at(&format!("rb{} + {co}", id.index()))
            }
            (None, c) => l.read_at(&l.access.offset_of(&format!("(row * C + {})", c.unwrap_or("0")))),
        }
    }

    /// A value inside a column pass, at the pass's column `col`.
    fn col_operand(&self, id: NodeId) -> String {
        self.col_operand_at(id, 0)
    }

    /// A value inside a column pass for element `k` of a pair (see
    /// [`Gen::column_pass`]): 0 at `col` (item `it`), 1 at `col1` (item
    /// `it + 1`).
    fn col_operand_at(&self, id: NodeId, k: usize) -> String {
        let (col, item, suffix) = if k == 0 { ("col", "it", "") } else { ("col1", "it + 1", "_1") };
        match (self.class[&id], self.body.leaves.get(&id)) {
            (Class::Row, _) => format!("r{}", id.index()),
            _ if available(self.class, self.kept, self.pass, id) => format!("k{}[{item}]", id.index()),
            (_, Some(_)) if self.cached.contains(&id) && self.loaded.contains(&id) => {
                format!("c{}[{item}]", id.index())
            }
            (_, Some(l)) => self.leaf_at(id, l, Some(col)),
            _ => format!("v{}{suffix}", id.index()),
        }
    }

    /// One pass over the row's columns computing `targets` per column, then
    /// `finish(their values, the column)` inside the loop. Where every
    /// thread has an even number of whole columns and the pass rounds to a
    /// 16-bit float, the columns go two at a time (items `it` and `it + 1`,
    /// columns `col` and `col1`), their roundings paired (`super::paired`),
    /// and `finish` runs for each.
    fn column_pass(
        &mut self,
        src: &mut String,
        targets: &[NodeId],
        finish: &dyn Fn(&Gen<'_, '_>, &mut String, ColValue<'_>, &str),
    ) -> Result<(), String> {
        let (items, group, pass) = (self.items, self.group, self.pass);
        let known = |n: NodeId| available(self.class, self.kept, pass, n);
        let cone = pass_cone(self.body, targets, &known);
        let pair = self.unrolled && self.cols_exact() && items % 2 == 0 && paired::rounds(self.body, &cone);
        if pair {
            let _ = writeln!(src, "#pragma unroll\n    for (int it = 0; it < {items}; it += 2) {{");
            let _ = writeln!(src, "      const I col = lane + it * {group}, col1 = col + {group};\n      {{");
        } else if self.unrolled {
            let _ = writeln!(src, "#pragma unroll\n    for (int it = 0; it < {items}; ++it) {{");
            let _ = writeln!(src, "      const I col = lane + it * {group};");
            if !self.cols_exact() {
                let _ = writeln!(src, "      if (col < C) {{");
            } else {
                let _ = writeln!(src, "      {{");
            }
        } else {
            let _ = writeln!(src, "    for (I col = lane; col < C; col += {group}) {{\n      {{");
        }
        // Load the cached operands this pass is the first to read.
        let reads = leaves_of(self.body, targets, &known);
        for &id in self.cached {
            if reads.contains(&id) && !self.loaded.contains(&id) {
                let l = &self.body.leaves[&id];
                let _ = writeln!(src, "        c{}[it] = {};", id.index(), self.leaf_at(id, l, Some("col")));
                if pair {
                    let _ = writeln!(
                        src,
                        "        c{}[it + 1] = {};",
                        id.index(),
                        self.leaf_at(id, l, Some("col1"))
                    );
                }
                self.loaded.push(id);
            }
        }
        for n in cone {
            let v = format!("v{}", n.index());
            if pair {
                let (first, second) = (|o| self.col_operand_at(o, 0), |o| self.col_operand_at(o, 1));
                for line in paired::statements(self.body, n, [&v, &format!("{v}_1")], [&first, &second])? {
                    let _ = writeln!(src, "        {line}");
                }
            } else {
                let s = self.body.statement(n, &v, &|o| self.col_operand(o))?;
                let _ = writeln!(src, "        {s}");
            }
        }
        // Keep what later passes read again.
        for &(id, _) in self.kept.iter().filter(|&&(_, p)| p == pass) {
            let _ = writeln!(src, "        k{0}[it] = v{0};", id.index());
            if pair {
                let _ = writeln!(src, "        k{0}[it + 1] = v{0}_1;", id.index());
            }
        }
        finish(self, src, &|gen, id| gen.col_operand_at(id, 0), "col");
        if pair {
            finish(self, src, &|gen, id| gen.col_operand_at(id, 1), "col1");
        }
        src.push_str("      }\n    }\n");
        self.pass += 1;
        Ok(())
    }

    fn cols_exact(&self) -> bool {
        self.items * self.group == self.cols
    }

    /// An [`OnlinePair`]: one pass over the row, [`CHUNK`] columns a
    /// thread at a time: the chunk's values (`-inf` past the row's end),
    /// their max, the running sum rescaled to the new max once, the
    /// chunk's terms summed in float and added in double; then the group
    /// combines the threads' `(max, sum)` pairs. Settles both as `r<id>`.
    fn online_max_sum(&mut self, src: &mut String, pair: &OnlinePair) -> Result<(), String> {
        let (m, s, a) = (format!("a{}", pair.max.index()), format!("a{}", pair.sum.index()), pair.operand);
        let exp = |x: &str| expr::unary(UnaryOp::Exp, DType::F32, x);
        let neg_inf = types::lowest(DType::F32, true);
        let (g, n) = (self.group, CHUNK);
        let _ = writeln!(src, "    float {m} = {neg_inf};\n    double {s} = -0.0;");
        let _ = writeln!(src, "    for (I c0 = lane; c0 < C; c0 += {}) {{", n * g);
        let _ =
            writeln!(src, "      float xs[{n}];\n#pragma unroll\n      for (int it = 0; it < {n}; ++it) {{");
        let _ = writeln!(
            src,
            "        const I col = c0 + it * {g};\n        xs[it] = {neg_inf};\n        if (col < C) {{"
        );
        for id in pass_cone(self.body, &[a], &|n| self.class[&n] == Class::Row) {
            let st = self.body.statement(id, &format!("v{}", id.index()), &|o| self.col_operand(o))?;
            let _ = writeln!(src, "          {st}");
        }
        let _ = writeln!(src, "          xs[it] = {};\n        }}\n      }}", self.col_operand(a));
        let _ = writeln!(src, "      float cm = xs[0];\n#pragma unroll");
        let _ = writeln!(src, "      for (int it = 1; it < {n}; ++it) cm = kiln::Max()(cm, xs[it]);");
        let _ = writeln!(src, "      const float mx = kiln::Max()({m}, cm);");
        let _ = writeln!(
            src,
            "      {s} *= (double)(mx == {m} ? 1.f : {});\n      {m} = mx;",
            exp(&format!("{m} - mx"))
        );
        let _ = writeln!(src, "      float cs = 0.f;\n#pragma unroll");
        let _ = writeln!(
            src,
            "      for (int it = 0; it < {n}; ++it) cs += xs[it] == {neg_inf} ? 0.f : {};",
            exp("xs[it] - mx")
        );
        let _ = writeln!(src, "      {s} += (double)cs;\n    }}");
        let r = format!("r{}", pair.max.index());
        let _ = writeln!(src, "    const float {r} = kiln::group_reduce<{g}>({m}, kiln::Max());");
        let _ = writeln!(src, "    {s} *= (double)({m} == {r} ? 1.f : {});", exp(&format!("{m} - {r}")));
        let _ = writeln!(src, "    {s} = kiln::group_reduce<{g}>({s}, kiln::Sum());");
        // A row of only -inf: every rescale was skipped as "no change", so
        // nothing met the two-pass sum's `exp(-inf - -inf)`.
        let _ = writeln!(src, "    if ({r} == {neg_inf}) {s} = kiln::nan_f64();");
        let _ = writeln!(
            src,
            "    const float r{} = {};",
            pair.sum.index(),
            types::cast(DType::F64, DType::F32, &s)
        );
        Ok(())
    }

    /// A reduction node: accumulate over the columns, combine across the
    /// group, settle to the node's dtype as `r<id>`.
    fn reduction(&mut self, src: &mut String, id: NodeId, op: ReduceOp) -> Result<(), String> {
        let g = self.body.g;
        let x = g.operands(id)[0];
        let xd = g.node(x).dtype;
        let d = g.node(id).dtype;
        let ct = types::compute(xd);
        let float = xd.is_float();
        let (acc_ty, init, combine, functor) = match op {
            ReduceOp::Sum | ReduceOp::Mean if float => {
                ("double".to_string(), "-0.0".to_string(), "acc += (double)({X});".to_string(), "kiln::Sum()")
            }
            ReduceOp::Sum | ReduceOp::Mean => (
                "kiln::i64".into(),
                "0".into(),
                "acc = kiln::iadd(acc, (kiln::i64)({X}));".into(),
                "kiln::ISum()",
            ),
            ReduceOp::Max => (
                ct.to_string(),
                types::lowest(xd, true),
                "acc = kiln::Max()(acc, {X});".into(),
                "kiln::Max()",
            ),
            ReduceOp::Min => (
                ct.to_string(),
                types::lowest(xd, false),
                "acc = kiln::Min()(acc, {X});".into(),
                "kiln::Min()",
            ),
            ReduceOp::ArgMax => (
                format!("kiln::Arg<{ct}>"),
                format!("{{{}, (kiln::i64)9223372036854775807LL}}", types::lowest(xd, true)),
                format!("acc = kiln::ArgMax()(acc, kiln::Arg<{ct}>{{{{X}}, (kiln::i64)col}});"),
                "kiln::ArgMax()",
            ),
        };
        let acc = format!("a{}", id.index());
        // A thread's own columns (at most `MAX_ITEMS`) add in float, then
        // the threads' sums in double: one conversion a thread, not one a
        // column (see [`partial_in_float`]).
        let partial = self.unrolled && partial_in_float(op, xd);
        let (acc_ty, init, combine) = match partial {
            true => ("float".to_string(), "-0.0f".to_string(), "acc += {X};".to_string()),
            false => (acc_ty, init, combine),
        };
        let _ = writeln!(src, "    {acc_ty} {acc} = {init};");
        let combine = combine.replace("acc", &acc);
        self.column_pass(src, &[x], &|gen, src, value, _| {
            let _ = writeln!(src, "        {}", combine.replace("{X}", &value(gen, x)));
        })?;
        let group = self.group;
        match partial {
            true => {
                let _ = writeln!(
                    src,
                    "    const double {acc}d = kiln::group_reduce<{group}>((double){acc}, {functor});"
                );
            }
            false => {
                let _ = writeln!(src, "    {acc} = kiln::group_reduce<{group}>({acc}, {functor});");
            }
        }
        let acc = if partial { format!("{acc}d") } else { acc };
        let value = match op {
            ReduceOp::Sum if float => types::cast(DType::F64, d, &acc),
            ReduceOp::Mean => types::cast(DType::F64, d, &format!("({acc} / (double)C)")),
            ReduceOp::Sum => types::settle(d, &acc),
            ReduceOp::Max | ReduceOp::Min => acc.clone(),
            ReduceOp::ArgMax => format!("{acc}.i"),
        };
        let _ = writeln!(src, "    const {} r{} = {value};", types::compute(d), id.index());
        Ok(())
    }
}
