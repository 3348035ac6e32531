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
//! When each thread has at most 16 columns, the row stays in registers
//! between passes (`passes`): per-column values a later pass reads again
//! are kept (a residual sum, `x - mean`, a softmax's `exp`), and operands
//! read by several passes are cached, so softmax reads its input once and
//! writes its output once. A thread's columns then add in float and the
//! threads' sums in double (the CPU backend sums in double throughout;
//! see `passes::partial_in_float` for what that costs), integer sums wrap.
//! A thread takes its columns in runs of up to 8 adjacent ones (16 bytes
//! of a 16-bit row, see `vector_width`): each operand whose layout allows
//! it is read with one vector load a run and each per-element output
//! written with one store, and where the body rounds to bf16 or f16 the
//! run's elements go two at a time, rounded with one conversion
//! (`emit::Gen::column_pass`, `super::paired`).
//!
//! Longer rows are read from memory in every pass (their column passes
//! in runs too, a row's last columns past its whole runs one at a time),
//! and a row's max and its sum of `exp(x - max)` (softmax, log-sum-exp,
//! cross-entropy) take one pass between them, `CHUNK` columns a thread at
//! a time, the sum rescaled whenever the running max grows (see
//! [`online::OnlinePair`]).
//!
//! A body with extra outputs (`out1`, `out2`, ...) writes the per-element
//! ones in the same last pass as the output, and the per-row ones once
//! per row: a layer norm writes its rows' mean and inverse deviation for
//! the backward pass next to its output.

mod emit;
mod online;
mod passes;

use super::body::{buffer_operands, out_name, params_named, Body, Operand};
use super::{paired, types, Kernel};
use crate::ir::{DType, Graph, NodeId, Op, Padded, Shape};
use emit::Gen;
use online::online_pairs;
use passes::{available, kept_values, leaves_of};
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
/// passes), a block beyond: exactly 8 columns a thread where the row
/// splits into whole warps of them (`cols / 8` threads, 96 for a 768-wide
/// row), else about 8 (a power of two, 128 to 1024 threads). A warp over a
/// 768-wide layer norm row (GPT-2's) had 24 columns a lane, read from
/// memory in each of its three passes: 6.3 µs a row on an H100, a sixth of
/// a decode step's kernel time. Eight a thread make a 16-byte run of a
/// 16-bit row (see [`vector_width`]): BERT-base's bf16 residual add and
/// layer norm over `[4096, 768]`, alone on an H200
/// (`benches/probes/layer_norm.py`), took 8.2-8.5 µs with 96 threads of 8
/// columns against 8.8-8.9 with 128 threads of 6.
fn group_for(cols: usize) -> usize {
    if cols <= 16 {
        1
    } else if cols <= 32 * MAX_ITEMS {
        32
    } else if cols % 256 == 0 && cols / 8 <= 1024 {
        cols / 8
    } else {
        (cols.div_ceil(8)).next_power_of_two().clamp(128, 1024)
    }
}

/// Columns a thread takes at once (one vector load or store of each
/// operand whose layout allows it): the most of 8, 4 and 2 that divides
/// its `items` columns with a run of every column-read operand and
/// output, `sizes` bytes an element, at most 16 bytes (the widest load);
/// 1 when none does, or when the row is not whole runs of the group.
fn vector_width(items: usize, exact: bool, sizes: impl Iterator<Item = usize>) -> usize {
    let widest = sizes.max().unwrap_or(4).max(1);
    match exact {
        true => [8, 4, 2].into_iter().find(|&w| items % w == 0 && w * widest <= 16).unwrap_or(1),
        false => 1,
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
    let (block, rows_per_block) = if group > 32 { (group, 1) } else { (256, 256 / group) };
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
    // Leaves that vary by row only (a layer norm's saved mean, `[rows, 1]`
    // expanded over the columns): read once a row, into `h<id>`.
    let per_row_leaves: Vec<NodeId> = read
        .iter()
        .copied()
        .filter(|id| {
            body.leaves.get(id).is_some_and(|l| {
                l.operand.is_some()
                    && !l.is_uniform()
                    && l.access.split_offsets(split, "row", "col").is_some_and(|(_, c)| c == "0")
            })
        })
        .collect();
    let mut cached: Vec<NodeId> = Vec::new();
    if unrolled {
        for &id in &read {
            let cacheable = body.leaves.get(&id).is_some_and(|l| l.operand.is_some() && !l.is_uniform())
                && !per_row_leaves.contains(&id);
            if cacheable
                && uses.get(&id).copied().unwrap_or(0) >= 2
                && (kept.len() + cached.len() + 1) * items <= MAX_CACHED
            {
                cached.push(id);
            }
        }
    }

    // Columns a thread takes at once: as wide as the widest element read
    // or written per column allows, where that pays (a vector load or
    // store, or paired roundings).
    let column_leaves: Vec<&super::body::Leaf> = read
        .iter()
        .filter(|id| !per_row_leaves.contains(id))
        .filter_map(|id| body.leaves.get(id))
        .filter(|l| l.operand.is_some() && !l.is_uniform())
        .collect();
    let sizes =
        column_leaves.iter().map(|l| l.dtype.size()).chain(full.iter().map(|&j| out_dtypes[j].size()));
    // A long row takes runs too, its last columns (past its whole runs)
    // one at a time.
    let run = match unrolled {
        true => vector_width(items, items * group == cols, sizes),
        false => vector_width(CHUNK, true, sizes),
    };
    let rounds = paired::rounds(&body, &body.order);
    let run =
        match !full.is_empty() || rounds || column_leaves.iter().any(|l| l.access.column_runs(split, run)) {
            true => run,
            false => 1,
        };

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
        per_row: &per_row_leaves,
        loaded: Vec::new(),
        kept: &kept,
        pass: 0,
        width: run,
        pairs: run > 1 && rounds,
        vectors: Vec::new(),
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
    for &id in &per_row_leaves {
        let l = &body.leaves[&id];
        let _ = writeln!(
            src,
            "    const {} h{} = {};",
            types::compute(l.dtype),
            id.index(),
            gen.leaf_at(id, l, None)
        );
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
        let row_at = |j: usize| if j == 0 && pad.is_some() { "row * W" } else { "row * C" };
        // In a vector pass, outputs whose runs are aligned (a padded
        // output's rows must be too) are stored once a run.
        let aligned = |j: usize| match (j, &pad) {
            (0, Some(p)) => p.width % run == 0,
            _ => cols % run == 0,
        };
        let vectored: Vec<usize> = match run > 1 {
            true => full.iter().copied().filter(|&j| aligned(j)).collect(),
            false => Vec::new(),
        };
        let stores: Vec<emit::VectorOut> = vectored
            .iter()
            .map(|&j| emit::VectorOut {
                name: format!("o{j}"),
                storage: types::storage(out_dtypes[j]),
                at: format!("{} + {} + col", out_name(j), row_at(j)),
            })
            .collect();
        gen.column_pass(&mut src, &targets, &stores, &|gen, src, col_value, e| {
            for &j in &full {
                // A node's value: already what its dtype holds.
                let v = types::store_exact(out_dtypes[j], &col_value(gen, outputs[j]));
                // A long row's last columns are stored one at a time.
                match vectored.contains(&j) && !e.slot.is_empty() {
                    true => {
                        let _ = writeln!(src, "        o{j}.v[{}] = {v};", e.slot);
                    }
                    false => {
                        let _ = writeln!(src, "        {}[{} + {}] = {v};", out_name(j), row_at(j), e.col);
                    }
                }
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
