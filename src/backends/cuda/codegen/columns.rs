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
    let ct = types::compute(xd);
    let float = xd.is_float();
    let (acc_ty, init, combine) = match op {
        ReduceOp::Sum | ReduceOp::Mean if float => {
            ("double".to_string(), "-0.0".to_string(), "A + (double)(B)")
        }
        ReduceOp::Sum | ReduceOp::Mean => ("kiln::i64".into(), "0".into(), "kiln::iadd(A, (kiln::i64)(B))"),
        ReduceOp::Max => (ct.to_string(), types::lowest(xd, true), "kiln::Max()(A, B)"),
        _ => (ct.to_string(), types::lowest(xd, false), "kiln::Min()(A, B)"),
    };
    let combine = |a: &str, b: &str| combine.replace('A', a).replace('B', b);
    let value = match op {
        ReduceOp::Sum if float => types::cast(DType::F64, out_dtype, "t"),
        ReduceOp::Mean => types::cast(DType::F64, out_dtype, &format!("(t / (double){rows})")),
        ReduceOp::Sum => types::settle(out_dtype, "t"),
        _ => "t".to_string(),
    };
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
        let Split { rows, cols, chunks, acc_ty, init, index } = *self;
        let warps = Self::WARPS;
        let tiles = cols.div_ceil(COLUMNS);
        let per = rows.div_ceil(chunks);
        let mut s = format!(
            "extern \"C\" __global__ void {name}({}* __restrict__ out, {acc_ty}* __restrict__ ws, unsigned* __restrict__ counts, const {}* __restrict__ in0) {{\n",
            types::storage(out_dtype),
            types::storage(xd)
        );
        let _ = writeln!(s, "  typedef {index} I;\n  __shared__ {acc_ty} part[{warps}][{COLUMNS}];");
        s.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
        let _ = writeln!(s, "  const I tile = (I)blockIdx.x % {tiles}, chunk = (I)blockIdx.x / {tiles};");
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
        let _ = writeln!(s, "    ws[chunk * {cols} + c] = t;\n  }}");
        super::last_to_arrive(&mut s, "threadIdx.x", "counts[tile]", chunks);
        let _ = writeln!(s, "  if (warp == 0 && c < {cols}) {{\n    {acc_ty} t = __ldcg(&ws[c]);");
        let _ = writeln!(
            s,
            "    for (int x = 1; x < {chunks}; ++x) t = {};",
            combine("t", &format!("__ldcg(&ws[x * {cols} + c])"))
        );
        let _ = writeln!(s, "    out[c] = {};\n  }}", types::store(out_dtype, value));
        s.push_str("  if (threadIdx.x == 0) counts[tile] = 0u;\n}\n");
        Kernel::new(name, s, (tiles * chunks) as u32, (warps * 32) as u32, Vec::new())
    }
}
