//! Column reductions: `sum`, `mean`, `max` or `min` over the leading dims
//! of a dense value, keeping its trailing ones (`[rows, cols] → [cols]`).
//!
//! *Why a kernel of its own.* A bias's or a layer norm's parameter
//! gradient sums `[batch, positions, width]` over batch and positions.
//! The row-reduction kernel (`reduction.rs`) sees that as `width` rows of
//! `batch * positions` elements each, `width` elements apart in memory:
//! every load of its threads is a 32-byte sector of its own, and GPT-2
//! small's 98 such sums took 4 ms of a 37 ms bf16 training step on an
//! H100 (40-105 µs each, where reading the bytes once takes 5-20).
//!
//! *How.* A block owns 32 adjacent columns at a time: the 32 lanes of each
//! warp read 32 adjacent elements of one row (one coalesced 128-byte
//! line for f32), and the block's `warps` warps take rows `w, w + warps,
//! ...` in turn, each lane accumulating its rows in order. The warps'
//! partial results then meet in shared memory and warp 0 combines them in
//! warp order. Float sums accumulate in double from `-0.0`, integer sums
//! wrap, as in the row kernel; the order of additions is fixed by the
//! shape alone, so a plan gives the same bits every run.
//!
//! *Split rows.* GPT-2's 768 columns are 24 column tiles: 24 blocks on an
//! H100's 132 multiprocessors, so its 72 layer-norm and bias sums of
//! `[4096, 768]` took 11 µs each where the read takes 4 (and the 2304-
//! and 3072-wide ones 26-32). While the tiles give fewer than two blocks
//! a multiprocessor and the rows allow it, the rows are split into
//! [`chunks`] as well: each block writes its chunk's partial column sums
//! to a workspace, and the last block of a column tile to arrive (an
//! arrival counter) combines the chunks in chunk order, so the bits still
//! depend on the shape alone.

use super::body::{index_type, Operand, Source};
use super::{grid_for, types, Kernel};
use crate::ir::{DType, ReduceOp};
use std::fmt::Write;

/// Columns a block handles at a time: one per lane of a warp.
const COLUMNS: usize = 32;

/// Warps per block for `rows` x `cols`: 32 (1024 threads) while there are
/// fewer column tiles than about two per multiprocessor of an H100, so
/// that a narrow sum (GPT-2's 768) still has enough loads in flight, 8
/// beyond; never more than there are rows.
fn warps_for(rows: usize, cols: usize) -> usize {
    let most = if cols.div_ceil(COLUMNS) < 256 { 32 } else { 8 };
    most.min(rows).max(1)
}

/// Blocks to aim for: two per multiprocessor of an H100 (132).
const TARGET_BLOCKS: usize = 264;

/// Row chunks for `rows` x `cols`: a power of two, 1 unless the column
/// tiles alone give fewer than [`TARGET_BLOCKS`] blocks, and never fewer
/// than 64 rows a chunk.
pub(crate) fn chunks(rows: usize, cols: usize) -> usize {
    let tiles = cols.div_ceil(COLUMNS);
    let mut chunks = 1;
    while tiles * chunks < TARGET_BLOCKS && rows / (2 * chunks) >= 64 {
        chunks *= 2;
    }
    chunks
}

/// The workspace of a split kernel: one 8-byte partial per chunk and
/// column.
pub(crate) fn workspace_bytes(rows: usize, cols: usize) -> u64 {
    (chunks(rows, cols) * cols * 8) as u64
}

/// The arrival counters of a split kernel: one per column tile.
pub(crate) fn counters(cols: usize) -> usize {
    cols.div_ceil(COLUMNS)
}

/// Whether a column kernel computes `op` over `rows` x `cols`: a dense
/// buffer operand, at least two rows and a warp's worth of columns (with
/// fewer, the row kernel's reads are nearly contiguous anyway).
pub(crate) fn fits(x: &Operand, op: ReduceOp, rows: usize, cols: usize) -> bool {
    matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min)
        && rows >= 2
        && cols >= COLUMNS
        && x.source == Source::Buffer
        && x.access.dense_base().is_some()
}

/// The kernel reducing dense `x` (`rows` x `cols`, row-major) over its
/// rows into `out` (`cols` elements of `out_dtype`). Call only when
/// [`fits`] says so.
pub(crate) fn generate(
    name: &str,
    x: &Operand,
    op: ReduceOp,
    rows: usize,
    cols: usize,
    out_dtype: DType,
) -> Kernel {
    let xd = x.dtype;
    let Accumulate { acc_ty, init, combine } = accumulate(op, xd);
    let combine = |a: &str, b: &str| combine.replace('A', a).replace('B', b);
    let value = result(op, xd, rows, out_dtype);
    let base = x.access.dense_base().unwrap_or(0);
    let index = index_type(rows * cols, std::slice::from_ref(x));
    let chunks = chunks(rows, cols);
    if chunks > 1 {
        let load = types::load(xd, &format!("in0[{base} + r * {cols} + c]"));
        let split = Split { rows, cols, chunks, acc_ty: &acc_ty, init: &init, index };
        return split.generate(name, xd, out_dtype, &combine, &load, &value);
    }
    let warps = warps_for(rows, cols);
    let mut s = format!(
        "extern \"C\" __global__ void {name}({}* __restrict__ out, const {}* __restrict__ in0) {{\n",
        types::storage(out_dtype),
        types::storage(xd)
    );
    let _ = writeln!(s, "  typedef {index} I;\n  __shared__ {acc_ty} part[{warps}][{COLUMNS}];");
    s.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
    let _ = writeln!(
        s,
        "  for (I c0 = (I)blockIdx.x * {COLUMNS}; c0 < {cols}; c0 += (I)gridDim.x * {COLUMNS}) {{"
    );
    let _ = writeln!(s, "    const I c = c0 + lane;\n    {acc_ty} acc = {init};");
    let _ = writeln!(s, "    if (c < {cols}) {{");
    let load = types::load(xd, &format!("in0[{base} + r * {cols} + c]"));
    let _ = writeln!(s, "      for (I r = warp; r < {rows}; r += {warps}) acc = {};", combine("acc", &load));
    s.push_str("    }\n    part[warp][lane] = acc;\n    __syncthreads();\n");
    let _ = writeln!(s, "    if (warp == 0 && c < {cols}) {{\n      {acc_ty} t = part[0][lane];");
    let _ = writeln!(s, "      for (int w = 1; w < {warps}; ++w) t = {};", combine("t", "part[w][lane]"));
    let _ = writeln!(s, "      out[c] = {};\n    }}", types::store(out_dtype, &value));
    s.push_str("    __syncthreads();\n  }\n}\n");
    Kernel::new(name, s, grid_for(cols.div_ceil(COLUMNS), 1), (warps * 32) as u32, vec![0])
}

/// How a reduction accumulates: the accumulator's type, its start, and
/// how it combines two values (`A`, `B`).
struct Accumulate {
    acc_ty: String,
    init: String,
    combine: &'static str,
}

/// Float sums accumulate in double from `-0.0`, integer sums wrap in i64,
/// max and min stay in the compute type.
fn accumulate(op: ReduceOp, xd: DType) -> Accumulate {
    let ct = types::compute(xd);
    let (acc_ty, init, combine) = match op {
        ReduceOp::Sum | ReduceOp::Mean if xd.is_float() => {
            ("double".to_string(), "-0.0".to_string(), "A + (double)(B)")
        }
        ReduceOp::Sum | ReduceOp::Mean => ("kiln::i64".into(), "0".into(), "kiln::iadd(A, (kiln::i64)(B))"),
        ReduceOp::Max => (ct.to_string(), types::lowest(xd, true), "kiln::Max()(A, B)"),
        _ => (ct.to_string(), types::lowest(xd, false), "kiln::Min()(A, B)"),
    };
    Accumulate { acc_ty, init, combine }
}

/// The value stored from the accumulated `t` (a mean divides by `rows`).
fn result(op: ReduceOp, xd: DType, rows: usize, out_dtype: DType) -> String {
    match op {
        ReduceOp::Sum if xd.is_float() => types::cast(DType::F64, out_dtype, "t"),
        ReduceOp::Mean => types::cast(DType::F64, out_dtype, &format!("(t / (double){rows})")),
        ReduceOp::Sum => types::settle(out_dtype, "t"),
        _ => "t".to_string(),
    }
}

/// One member of a launch group of column reductions
/// ([`crate::ir::GroupKind::Columns`]): dense `x` (`rows` x `cols`)
/// reduced over its rows into `cols` elements of `out_dtype`.
pub(crate) struct Member {
    pub x: Operand,
    pub op: ReduceOp,
    pub rows: usize,
    pub cols: usize,
    pub out_dtype: DType,
}

impl Member {
    /// Whether the member runs in a group kernel ([`generate_group`]): it
    /// [`fits`], its rows split into chunks (a group kernel is made of
    /// split blocks, [`Split::WARPS`] warps each), and it accumulates
    /// floats in double (the group's shared partials are doubles). The
    /// others launch their own kernels.
    pub(crate) fn joins_group(&self) -> bool {
        fits(&self.x, self.op, self.rows, self.cols)
            && chunks(self.rows, self.cols) > 1
            && self.x.dtype.is_float()
            && matches!(self.op, ReduceOp::Sum | ReduceOp::Mean)
    }
}

/// One kernel computing `members` (each [`Member::joins_group`]), as
/// PyTorch's multi-tensor kernels run many tensors' updates: a layer
/// norm's `dγ` and `dβ` and the bias gradient before it, each a few
/// microseconds of latency over a few MB when alone, overlap.
///
/// The grid is the members' split blocks one after another (block `b`
/// finds its member by comparing with the starts), and member `i`'s
/// pointers are `m{i}_out, m{i}_ws, m{i}_counts, m{i}_in0`: its workspace
/// and counters as its own kernel's. Each member's blocks run its own
/// kernel's code, so it computes the same bits; `part` and `ticket` are
/// declared once for all.
pub(crate) fn generate_group(name: &str, members: &[&Member]) -> Kernel {
    let mut params = Vec::new();
    let mut bodies = String::new();
    let mut index = "int";
    let mut start = 0;
    for (i, m) in members.iter().enumerate() {
        debug_assert!(m.joins_group(), "member {i} of a column group does not join it");
        let xd = m.x.dtype;
        let Accumulate { acc_ty, init, combine } = accumulate(m.op, xd);
        let combine = |a: &str, b: &str| combine.replace('A', a).replace('B', b);
        let prefix = format!("m{i}_");
        params.push(split_params(&prefix, &acc_ty, xd, m.out_dtype));
        if index_type(m.rows * m.cols, std::slice::from_ref(&m.x)) != "int" {
            index = "long long";
        }
        let split = Split {
            rows: m.rows,
            cols: m.cols,
            chunks: chunks(m.rows, m.cols),
            acc_ty: &acc_ty,
            init: &init,
            index,
        };
        let base = m.x.access.dense_base().unwrap_or(0);
        let load = types::load(xd, &format!("{prefix}in0[{base} + r * {} + c]", m.cols));
        let stored = types::store(m.out_dtype, &result(m.op, xd, m.rows, m.out_dtype));
        let end = start + split.blocks();
        let _ = writeln!(bodies, "  {}if (b < {end}u) {{", if i == 0 { "" } else { "else " });
        let block = format!("(I)(b - {start}u)");
        let mut code = String::new();
        split.block(&mut code, (&prefix, &block), false, &combine, &load, &stored);
        for line in code.lines() {
            let _ = writeln!(bodies, "  {line}");
        }
        bodies.push_str("  }\n");
        start = end;
    }
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", params.join(", "));
    let _ = writeln!(s, "  typedef {index} I;\n  __shared__ double part[{}][{COLUMNS}];", Split::WARPS);
    s.push_str("  __shared__ unsigned ticket;\n");
    s.push_str(
        "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n  const unsigned b = blockIdx.x;\n",
    );
    s.push_str(&bodies);
    s.push_str("}\n");
    Kernel::new(name, s, start as u32, (Split::WARPS * 32) as u32, Vec::new())
}

/// A column reduction with its rows split into chunks (module docs).
struct Split<'a> {
    rows: usize,
    cols: usize,
    chunks: usize,
    acc_ty: &'a str,
    init: &'a str,
    index: &'static str,
}

impl Split<'_> {
    /// Warps per block of a split kernel.
    const WARPS: usize = 8;

    /// The kernel: `out, ws, counts, in0`, one block per (column tile,
    /// chunk).
    fn generate(
        &self,
        name: &str,
        xd: DType,
        out_dtype: DType,
        combine: &dyn Fn(&str, &str) -> String,
        load: &str,
        value: &str,
    ) -> Kernel {
        let Split { acc_ty, index, .. } = *self;
        let params = split_params("", acc_ty, xd, out_dtype);
        let mut s = format!("extern \"C\" __global__ void {name}({params}) {{\n");
        let _ = writeln!(s, "  typedef {index} I;\n  __shared__ {acc_ty} part[{}][{COLUMNS}];", Self::WARPS);
        s.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
        let value = types::store(out_dtype, value);
        self.block(&mut s, ("", "(I)blockIdx.x"), true, combine, load, &value);
        s.push_str("}\n");
        Kernel::new(name, s, self.blocks() as u32, (Self::WARPS * 32) as u32, Vec::new())
    }

    /// Blocks: one per (column tile, chunk).
    fn blocks(&self) -> usize {
        self.cols.div_ceil(COLUMNS) * self.chunks
    }

    /// The code of block `block`: its chunk's partial column sums into the
    /// workspace, then, in the last block of its column tile to arrive,
    /// the tile's results (`stored`: the store's value from `t`). Its
    /// pointers are `out, ws, counts, in0` after `prefix`; `part`, `lane`,
    /// `warp`, `I` and, unless `standalone`, `ticket` are declared.
    fn block(
        &self,
        s: &mut String,
        (p, block): (&str, &str),
        standalone: bool,
        combine: &dyn Fn(&str, &str) -> String,
        load: &str,
        stored: &str,
    ) {
        let Split { rows, cols, chunks, acc_ty, init, .. } = *self;
        let warps = Self::WARPS;
        let tiles = cols.div_ceil(COLUMNS);
        let per = rows.div_ceil(chunks);
        let _ = writeln!(s, "  const I tile = {block} % {tiles}, chunk = {block} / {tiles};");
        let _ = writeln!(s, "  const I c = tile * {COLUMNS} + lane, r_end = chunk * {per} + {per} < {rows} ? chunk * {per} + {per} : (I){rows};");
        let _ = writeln!(s, "  {acc_ty} acc = {init};");
        let _ = writeln!(
            s,
            "  if (c < {cols})\n    for (I r = chunk * {per} + warp; r < r_end; r += {warps}) acc = {};",
            combine("acc", load)
        );
        s.push_str("  part[warp][lane] = acc;\n  __syncthreads();\n");
        let _ = writeln!(s, "  if (warp == 0 && c < {cols}) {{\n    {acc_ty} t = part[0][lane];");
        let _ = writeln!(s, "    for (int w = 1; w < {warps}; ++w) t = {};", combine("t", "part[w][lane]"));
        let _ = writeln!(s, "    {p}ws[chunk * {cols} + c] = t;\n  }}");
        let counter = format!("{p}counts[tile]");
        match standalone {
            true => super::last_to_arrive(s, "threadIdx.x", &counter, chunks),
            false => super::arrive(s, "threadIdx.x", &counter, chunks),
        }
        let _ = writeln!(s, "  if (warp == 0 && c < {cols}) {{\n    {acc_ty} t = __ldcg(&{p}ws[c]);");
        let _ = writeln!(
            s,
            "    for (int x = 1; x < {chunks}; ++x) t = {};",
            combine("t", &format!("__ldcg(&{p}ws[x * {cols} + c])"))
        );
        let _ = writeln!(s, "    {p}out[c] = {stored};\n  }}");
        let _ = writeln!(s, "  if (threadIdx.x == 0) {p}counts[tile] = 0u;");
    }
}

/// A split kernel's pointer parameters, each name after `prefix`.
fn split_params(prefix: &str, acc_ty: &str, xd: DType, out_dtype: DType) -> String {
    format!(
        "{}* __restrict__ {prefix}out, {acc_ty}* __restrict__ {prefix}ws, unsigned* __restrict__ {prefix}counts, const {}* __restrict__ {prefix}in0",
        types::storage(out_dtype),
        types::storage(xd)
    )
}
