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
