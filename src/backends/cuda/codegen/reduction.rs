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
use super::{types, Kernel};
use crate::ir::{BinaryOp, DType, Graph, NodeId, Op, Padded, ReduceOp, Shape, UnaryOp};
use std::collections::HashMap;
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
    // Operands read in more than one pass stay in registers.
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for p in &passes {
        let mut seen = leaves_of(&body, p, &class);
        seen.sort();
        seen.dedup();
        for l in seen {
            *uses.entry(l).or_default() += 1;
        }
    }
    // Only rows too long for registers: a row in registers reads memory
    // once however many passes it takes.
    let online = if unrolled { Vec::new() } else { online_pairs(&body) };
    let mut cached: Vec<NodeId> = Vec::new();
    if unrolled {
        for &id in &read {
            let cacheable = body.leaves.get(&id).is_some_and(|l| l.operand.is_some() && !l.is_uniform());
            if cacheable
                && uses.get(&id).copied().unwrap_or(0) >= 2
                && (cached.len() + 1) * items <= MAX_CACHED
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
        gen.column_pass(&mut src, &targets, &|gen, src, col_value| {
            for &j in &full {
                let v = types::store(out_dtypes[j], &col_value(gen, outputs[j]));
                let at = if j == 0 && pad.is_some() { "row * W + col" } else { "row * C + col" };
                let _ = writeln!(src, "        {}[{at}] = {v};", out_name(j));
            }
        })?;
    }
    if let Some(p) = &pad {
        pad_columns(&mut src, p, out_dtypes[0], group);
    }
    for &j in &per_row {
        let v = types::store(out_dtypes[j], &gen.row_operand(outputs[j]));
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

/// The leaves a column pass computing `targets` reads.
fn leaves_of(body: &Body<'_>, targets: &[NodeId], class: &HashMap<NodeId, Class>) -> Vec<NodeId> {
    let mut out = Vec::new();
    for &target in targets {
        if body.is_leaf(target) {
            out.push(target);
        }
        for n in body.cone(target, &|n| class[&n] == Class::Row) {
            out.extend(body.g.operands(n).into_iter().filter(|o| body.is_leaf(*o)));
        }
    }
    out
}

/// The nodes a column pass computes for `targets`, in body order.
fn pass_cone(body: &Body<'_>, targets: &[NodeId], class: &HashMap<NodeId, Class>) -> Vec<NodeId> {
    let need: std::collections::HashSet<NodeId> =
        targets.iter().flat_map(|&t| body.cone(t, &|n| class[&n] == Class::Row)).collect();
    body.order.iter().copied().filter(|n| need.contains(n)).collect()
}

/// Emission state: which cached operands the passes so far have loaded.
struct Gen<'b, 'a> {
    body: &'b Body<'a>,
    class: &'b HashMap<NodeId, Class>,
    split: usize,
    cached: &'b [NodeId],
    loaded: Vec<NodeId>,
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

    /// A value inside a column pass.
    fn col_operand(&self, id: NodeId) -> String {
        match (self.class[&id], self.body.leaves.get(&id)) {
            (Class::Row, _) => format!("r{}", id.index()),
            (_, Some(l)) if self.cached.contains(&id) && self.loaded.contains(&id) => {
                let _ = l;
                format!("c{}[it]", id.index())
            }
            (_, Some(l)) => self.leaf_at(id, l, Some("col")),
            _ => format!("v{}", id.index()),
        }
    }

    /// One pass over the row's columns computing `targets` per column, then
    /// `finish(their values)` inside the loop.
    fn column_pass(
        &mut self,
        src: &mut String,
        targets: &[NodeId],
        finish: &dyn Fn(&Gen<'_, '_>, &mut String, ColValue<'_>),
    ) -> Result<(), String> {
        let (items, group) = (self.items, self.group);
        if self.unrolled {
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
        let reads = leaves_of(self.body, targets, self.class);
        for &id in self.cached {
            if reads.contains(&id) && !self.loaded.contains(&id) {
                let l = &self.body.leaves[&id];
                let v = self.leaf_at(id, l, Some("col"));
                let _ = writeln!(src, "        c{}[it] = {v};", id.index());
                self.loaded.push(id);
            }
        }
        for n in pass_cone(self.body, targets, self.class) {
            let s = self.body.statement(n, &format!("v{}", n.index()), &|o| self.col_operand(o))?;
            let _ = writeln!(src, "        {s}");
        }
        finish(self, src, &|gen, id| gen.col_operand(id));
        src.push_str("      }\n    }\n");
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
        for id in pass_cone(self.body, &[a], self.class) {
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
        let _ = writeln!(src, "    {acc_ty} {acc} = {init};");
        let combine = combine.replace("acc", &acc);
        self.column_pass(src, &[x], &|gen, src, value| {
            let _ = writeln!(src, "        {}", combine.replace("{X}", &value(gen, x)));
        })?;
        let _ = writeln!(src, "    {acc} = kiln::group_reduce<{}>({acc}, {functor});", self.group);
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
