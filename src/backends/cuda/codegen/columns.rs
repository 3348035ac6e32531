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
//! *Wide loads.* A lane reads adjacent columns 16 bytes at a time where
//! the columns and the base allow it (8 of bf16 or f16, 4 of f32), so a
//! warp reads 512 bytes of a row per load where it read 64 (bf16) or 128
//! (f32), and a lane has several loads in flight: the bias and layer-norm
//! sums of GPT-2 small's bf16 step took 0.97 ms for 99 sums, about 2.5x
//! the time their bytes take at the copy bandwidth. Each column's
//! additions keep their order.
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

/// Lanes of a warp, each with its own column (or [`width`] of them).
const COLUMNS: usize = 32;

/// Adjacent columns a lane reads with one 16-byte load: 8 of a 2-byte
/// float, 4 of f32, else 1 (other types, or columns or a base that do not
/// keep the loads aligned: buffers are 64-byte aligned).
fn width(x: &Operand, cols: usize) -> usize {
    let w = match x.dtype {
        DType::F16 | DType::BF16 => 8,
        DType::F32 => 4,
        _ => 1,
    };
    let base = x.access.dense_base().unwrap_or(1);
    if cols % w == 0 && base % w == 0 {
        w
    } else {
        1
    }
}

/// Warps per block for `rows` x `cols` read `w` columns a lane: 32 (1024
/// threads) while there are fewer column tiles than about two per
/// multiprocessor of an H100, so that a narrow sum (GPT-2's 768) still
/// has enough loads in flight, 8 beyond or with wide loads (their partial
/// sums fill shared memory faster); never more than there are rows.
fn warps_for(rows: usize, cols: usize, w: usize) -> usize {
    let most = if w == 1 && cols.div_ceil(COLUMNS) < 256 { 32 } else { 8 };
    most.min(rows).max(1)
}

/// Blocks to aim for: two per multiprocessor of an H100 (132).
const TARGET_BLOCKS: usize = 264;

/// Row chunks for `x` (`rows` x `cols`): a power of two, 1 unless the
/// column tiles alone give fewer than [`TARGET_BLOCKS`] blocks, and never
/// fewer than 64 rows a chunk.
pub(crate) fn chunks(x: &Operand, rows: usize, cols: usize) -> usize {
    let tiles = cols.div_ceil(COLUMNS * width(x, cols));
    let mut chunks = 1;
    while tiles * chunks < TARGET_BLOCKS && rows / (2 * chunks) >= 64 {
        chunks *= 2;
    }
    chunks
}

/// The workspace of a split kernel: one 8-byte partial per chunk and
/// column.
pub(crate) fn workspace_bytes(x: &Operand, rows: usize, cols: usize) -> u64 {
    (chunks(x, rows, cols) * cols * 8) as u64
}

/// The arrival counters of a split kernel: one per column tile.
pub(crate) fn counters(x: &Operand, cols: usize) -> usize {
    cols.div_ceil(COLUMNS * width(x, cols))
}

/// Code that sets `v[u]` (`u < w`, declared by the caller as the compute
/// type) to columns `c .. c + w` of row `r` of `in0` (base `base`).
fn load_row(xd: DType, w: usize, base: usize, cols: usize) -> String {
    let at = format!("in0[{base} + r * {cols} + c]");
    match (w, xd) {
        (1, _) => format!("v[0] = {};", types::load(xd, &at)),
        (_, DType::F32) => {
            format!("{{ const kiln::u16x8 x8 = *(const kiln::u16x8*)&{at};\n          #pragma unroll\n          for (int u = 0; u < 4; ++u) v[u] = __int_as_float((int)x8.w[u]); }}")
        }
        _ => format!(
            "{{ const kiln::u16x8 x8 = *(const kiln::u16x8*)&{at};\n          #pragma unroll\n          for (int u = 0; u < 8; ++u) v[u] = kiln::half_at(x8.w[u / 2], u % 2, {}()); }}",
            types::storage(xd)
        ),
    }
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
    let w = width(x, cols);
    let load = load_row(xd, w, base, cols);
    let chunks = chunks(x, rows, cols);
    let layout = Layout { rows, cols, w, acc_ty: &acc_ty, init: &init, index, ct };
    if chunks > 1 {
        return Split { layout, chunks }.generate(name, xd, out_dtype, &combine, &load, &value);
    }
    let warps = warps_for(rows, cols, w);
    let span = COLUMNS * w;
    let mut s = format!(
        "extern \"C\" __global__ void {name}({}* __restrict__ out, const {}* __restrict__ in0) {{\n",
        types::storage(out_dtype),
        types::storage(xd)
    );
    layout.opening(&mut s, warps);
    let _ = writeln!(s, "  for (I t0 = (I)blockIdx.x * {span}; t0 < {cols}; t0 += (I)gridDim.x * {span}) {{");
    let _ = writeln!(s, "    const I c = t0 + lane * {w};");
    layout.accumulate(&mut s, "    ", &format!("(I)warp"), &format!("(I){rows}"), warps, &combine, &load);
    s.push_str("    __syncthreads();\n");
    // Every thread combines the warps' partials of one column.
    let _ = writeln!(s, "    for (int cc = threadIdx.x; cc < {span}; cc += {}) {{", warps * 32);
    let _ = writeln!(s, "      if (t0 + cc >= {cols}) break;\n      {acc_ty} t = part[0][cc];");
    let _ = writeln!(s, "      for (int x = 1; x < {warps}; ++x) t = {};", combine("t", "part[x][cc]"));
    let _ = writeln!(s, "      out[t0 + cc] = {};\n    }}", types::store(out_dtype, &value));
    s.push_str("    __syncthreads();\n  }\n}\n");
    Kernel::new(name, s, grid_for(cols.div_ceil(span), 1), (warps * 32) as u32, vec![0])
}

/// How a column kernel walks its input: `w` adjacent columns a lane, the
/// accumulator type and its start, the index type and the compute type.
struct Layout<'a> {
    rows: usize,
    cols: usize,
    w: usize,
    acc_ty: &'a str,
    init: &'a str,
    index: &'static str,
    ct: &'static str,
}

impl Layout<'_> {
    /// The index typedef, the warps' shared partial sums and the lane.
    fn opening(&self, s: &mut String, warps: usize) {
        let (acc_ty, index) = (self.acc_ty, self.index);
        let _ =
            writeln!(s, "  typedef {index} I;\n  __shared__ {acc_ty} part[{warps}][{}];", COLUMNS * self.w);
        s.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
    }

    /// At `ind`: each lane's sums of its `w` columns from `c` over rows
    /// `first, first + warps, ..` before `end`, stored to `part[warp]`.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &self,
        s: &mut String,
        ind: &str,
        first: &str,
        end: &str,
        warps: usize,
        combine: &dyn Fn(&str, &str) -> String,
        load: &str,
    ) {
        let Layout { cols, w, acc_ty, init, ct, .. } = *self;
        let _ = writeln!(s, "{ind}{acc_ty} acc[{w}];\n{ind}#pragma unroll\n{ind}for (int u = 0; u < {w}; ++u) acc[u] = {init};");
        let _ = writeln!(s, "{ind}if (c < {cols})\n{ind}  for (I r = {first}; r < {end}; r += {warps}) {{");
        let _ = writeln!(s, "{ind}    {ct} v[{w}];\n{ind}    {load}");
        let _ = writeln!(
            s,
            "{ind}    #pragma unroll\n{ind}    for (int u = 0; u < {w}; ++u) acc[u] = {};\n{ind}  }}",
            combine("acc[u]", "v[u]")
        );
        let _ = writeln!(
            s,
            "{ind}#pragma unroll\n{ind}for (int u = 0; u < {w}; ++u) part[warp][lane * {w} + u] = acc[u];"
        );
    }
}

/// A column reduction with its rows split into chunks (module docs).
struct Split<'a> {
    layout: Layout<'a>,
    chunks: usize,
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
        let Layout { rows, cols, w, acc_ty, .. } = self.layout;
        let chunks = self.chunks;
        let warps = Self::WARPS.min(rows).max(1);
        let span = COLUMNS * w;
        let tiles = cols.div_ceil(span);
        let per = rows.div_ceil(chunks);
        let mut s = format!(
            "extern \"C\" __global__ void {name}({}* __restrict__ out, {acc_ty}* __restrict__ ws, unsigned* __restrict__ counts, const {}* __restrict__ in0) {{\n",
            types::storage(out_dtype),
            types::storage(xd)
        );
        self.layout.opening(&mut s, warps);
        let _ = writeln!(s, "  const I tile = (I)blockIdx.x % {tiles}, chunk = (I)blockIdx.x / {tiles};");
        let _ = writeln!(s, "  const I c = tile * {span} + lane * {w}, r_end = chunk * {per} + {per} < {rows} ? chunk * {per} + {per} : (I){rows};");
        self.layout.accumulate(&mut s, "  ", &format!("chunk * {per} + warp"), "r_end", warps, combine, load);
        s.push_str("  __syncthreads();\n");
        // Every thread combines the warps' partials of one column (one
        // warp doing all of a wide tile's columns serialized them).
        let threads = warps * 32;
        let _ = writeln!(s, "  for (int cc = threadIdx.x; cc < {span}; cc += {threads}) {{");
        let _ = writeln!(s, "    if (tile * {span} + cc >= {cols}) break;\n    {acc_ty} t = part[0][cc];");
        let _ = writeln!(s, "    for (int x = 1; x < {warps}; ++x) t = {};", combine("t", "part[x][cc]"));
        let _ = writeln!(s, "    ws[chunk * {cols} + tile * {span} + cc] = t;\n  }}");
        super::last_to_arrive(&mut s, "threadIdx.x", "counts[tile]", chunks);
        let _ = writeln!(s, "  for (int cc = threadIdx.x; cc < {span}; cc += {threads}) {{");
        let _ = writeln!(s, "    const I col = tile * {span} + cc;\n    if (col >= {cols}) break;");
        let _ = writeln!(s, "    {acc_ty} t = __ldcg(&ws[col]);\n    #pragma unroll 8");
        let _ = writeln!(
            s,
            "    for (int x = 1; x < {chunks}; ++x) t = {};",
            combine("t", &format!("__ldcg(&ws[x * {cols} + col])"))
        );
        let _ = writeln!(s, "    out[col] = {};\n  }}", types::store(out_dtype, value));
        s.push_str("  if (threadIdx.x == 0) counts[tile] = 0u;\n}\n");
        Kernel::new(name, s, (tiles * chunks) as u32, (warps * 32) as u32, Vec::new())
    }
}
