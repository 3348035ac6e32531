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
//! *How.* A block owns a tile of adjacent columns at a time: each lane of
//! a warp reads [`Tiling::width`] adjacent elements of one row (four, in
//! one vector load, where the columns and the value's offset allow;
//! otherwise one), so a warp reads one contiguous piece of the row, and
//! the block's warps take rows `w, w + warps, ...` in turn, each lane
//! accumulating its rows in order. A lane loads [`Tiling::unroll`] rows
//! before it adds the first: a thread keeps 64 bytes in flight, where one
//! element at a time (the first version) left GPT-2's sums latency-bound
//! at about a third of the H200's bandwidth (0.84 ms of a 10.3 ms bf16
//! step for 1.3 GB). The warps' partial results then meet in shared
//! memory and are combined in warp order. Float sums accumulate in double
//! from `-0.0`, integer sums wrap, as in the row kernel; the order of
//! additions is fixed by the shape alone, so a plan gives the same bits
//! every run.
//!
//! *Split rows.* GPT-2's 768 columns are 6 tiles of 128: 6 blocks on an
//! H100's 132 multiprocessors. While the tiles give fewer than two blocks
//! a multiprocessor and the rows allow it, the rows are split into
//! [`Tiling::chunks`] as well: each block writes its chunk's partial
//! column sums to a workspace, and the last block of a column tile to
//! arrive (an arrival counter) combines the chunks in chunk order, so the
//! bits still depend on the shape alone.

use super::body::{index_type, Operand, Source};
use super::{grid_for, types, Kernel};
use crate::ir::{DType, ReduceOp};
use std::fmt::Write;

/// Lanes of a warp: a tile is this many times a lane's columns wide.
const LANES: usize = 32;

/// Blocks to aim for: two per multiprocessor of an H100 (132).
const TARGET_BLOCKS: usize = 264;

/// How a column reduction of `rows` x `cols` is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tiling {
    rows: usize,
    cols: usize,
    /// Adjacent columns a lane reads at once: 4 (one vector load) when
    /// `cols` and the value's dense offset are multiples of four, else 1.
    width: usize,
    /// Rows a lane loads before it accumulates them: 64 bytes (f32: 4
    /// rows of 4 elements; bf16: 8 rows of 4) in flight a thread.
    unroll: usize,
    /// Row chunks: a power of two, 1 unless the column tiles alone give
    /// fewer than [`TARGET_BLOCKS`] blocks, and never fewer than 64 rows a
    /// chunk.
    chunks: usize,
}

impl Tiling {
    /// The tiling of dense `x` read as `rows` x `cols`.
    pub(crate) fn of(x: &Operand, rows: usize, cols: usize) -> Tiling {
        let base = x.access.dense_base().unwrap_or(1);
        let width = if cols % 4 == 0 && base % 4 == 0 { 4 } else { 1 };
        let unroll = (64 / (width * x.dtype.size())).clamp(1, 8);
        let tiles = cols.div_ceil(LANES * width);
        let mut chunks = 1;
        while tiles * chunks < TARGET_BLOCKS && rows / (2 * chunks) >= 64 {
            chunks *= 2;
        }
        Tiling { rows, cols, width, unroll, chunks }
    }

    /// Columns a block owns at a time.
    fn tile(&self) -> usize {
        LANES * self.width
    }

    fn tiles(&self) -> usize {
        self.cols.div_ceil(self.tile())
    }

    /// Whether the rows are split over blocks: a workspace and counters.
    pub(crate) fn split(&self) -> bool {
        self.chunks > 1
    }

    /// The workspace of a split kernel: one 8-byte partial per chunk and
    /// column.
    pub(crate) fn workspace_bytes(&self) -> u64 {
        (self.chunks * self.cols * 8) as u64
    }

    /// The arrival counters of a split kernel: one per column tile.
    pub(crate) fn counters(&self) -> usize {
        self.tiles()
    }

    /// Warps per block of the unsplit kernel: 32 (1024 threads) while
    /// there are fewer column tiles than about two per multiprocessor,
    /// so that a narrow sum still has enough loads in flight, 8 beyond;
    /// never more than there are rows.
    fn warps(&self) -> usize {
        let most = if self.tiles() < 256 { 32 } else { 8 };
        most.min(self.rows).max(1)
    }
}

/// Whether a column kernel computes `op` over `rows` x `cols`: a dense
/// buffer operand, at least two rows and a warp's worth of columns (with
/// fewer, the row kernel's reads are nearly contiguous anyway).
pub(crate) fn fits(x: &Operand, op: ReduceOp, rows: usize, cols: usize) -> bool {
    matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min)
        && rows >= 2
        && cols >= LANES
        && x.source == Source::Buffer
        && x.access.dense_base().is_some()
}

/// The kernel reducing dense `x` (`rows` x `cols`, row-major) over its
/// rows into `out` (`cols` elements of `out_dtype`). Call only when
/// [`fits`] says so; its parameters are `out, in0`, or `out, ws, counts,
/// in0` when [`Tiling::split`].
pub(crate) fn generate(
    name: &str,
    x: &Operand,
    op: ReduceOp,
    rows: usize,
    cols: usize,
    out_dtype: DType,
) -> Kernel {
    let tiling = Tiling::of(x, rows, cols);
    let xd = x.dtype;
    let acc = accumulate(op, xd);
    let value = types::store(out_dtype, &result(op, xd, rows, out_dtype));
    let index = index_type(rows * cols, std::slice::from_ref(x));
    let base = x.access.dense_base().unwrap_or(0);
    let code = Code { tiling, acc: &acc, xd, base, prefix: "" };
    if tiling.split() {
        let params = split_params("", &acc.acc_ty, xd, out_dtype);
        let mut s = format!("extern \"C\" __global__ void {name}({params}) {{\n");
        code.declare(&mut s, index, SPLIT_WARPS);
        code.split_block(&mut s, "(I)blockIdx.x", true, &value);
        s.push_str("}\n");
        let threads = (SPLIT_WARPS * LANES) as u32;
        return Kernel::new(name, s, (tiling.tiles() * tiling.chunks) as u32, threads, Vec::new());
    }
    let warps = tiling.warps();
    let tile = tiling.tile();
    let mut s = format!(
        "extern \"C\" __global__ void {name}({}* __restrict__ out, const {}* __restrict__ in0) {{\n",
        types::storage(out_dtype),
        types::storage(xd)
    );
    code.declare(&mut s, index, warps);
    let _ = writeln!(s, "  for (I c0 = (I)blockIdx.x * {tile}; c0 < {cols}; c0 += (I)gridDim.x * {tile}) {{");
    code.accumulate_rows(&mut s, "c0", ("0", &rows.to_string(), rows), warps);
    code.combine_warps(&mut s, "c0", warps, &format!("out[c] = {value};"));
    s.push_str("    __syncthreads();\n  }\n}\n");
    Kernel::new(name, s, grid_for(tiling.tiles(), 1), (warps * LANES) as u32, vec![0])
}

/// Warps per block of a split kernel (and of a group kernel's blocks).
const SPLIT_WARPS: usize = 8;

/// How a reduction accumulates: the accumulator's type, its start, and
/// how it combines two values (`A`, `B`).
struct Accumulate {
    acc_ty: String,
    init: String,
    combine: &'static str,
}

impl Accumulate {
    fn combine(&self, a: &str, b: &str) -> String {
        self.combine.replace('A', a).replace('B', b)
    }
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

/// The code of one column reduction: its pointers are `out, in0` (and
/// `ws, counts` when split) after `prefix`.
struct Code<'a> {
    tiling: Tiling,
    acc: &'a Accumulate,
    xd: DType,
    /// The dense offset of the value's first element.
    base: usize,
    prefix: &'a str,
}

impl Code<'_> {
    /// `I`, the shared `part` of `warps` warps, `lane` and `warp`.
    fn declare(&self, s: &mut String, index: &str, warps: usize) {
        let _ = writeln!(s, "  typedef {index} I;");
        let _ = writeln!(s, "  __shared__ {} part[{warps}][{}];", self.acc.acc_ty, self.tiling.tile());
        s.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
    }

    /// Each lane's partial results over rows `first + warp, first + warp
    /// + warps, ...` below `end` (at most `range` rows after `first`), for
    /// the `width` columns from `tile0 + lane * width`, stored into
    /// `part[warp]` after a barrier.
    fn accumulate_rows(
        &self,
        s: &mut String,
        tile0: &str,
        (first, end, range): (&str, &str, usize),
        warps: usize,
    ) {
        let Tiling { cols, width, unroll, .. } = self.tiling;
        let (acc, p, base) = (self.acc, self.prefix, self.base);
        let lane = if width == 1 { "lane".to_string() } else { format!("lane * {width}") };
        let _ = writeln!(s, "    const I c = {tile0} + {lane};");
        let _ = writeln!(s, "    {} acc[{width}];", acc.acc_ty);
        let _ = writeln!(s, "    for (int j = 0; j < {width}; ++j) acc[j] = {};", acc.init);
        let _ = writeln!(s, "    if (c < {cols}) {{\n      I r = {first} + warp;");
        // Rows `r, r + warps, ...`: loads first, then the additions in row
        // order (the same order as one row at a time).
        let load_row = |s: &mut String, k: usize, row: &str| match width {
            1 => {
                let _ = writeln!(
                    s,
                    "        const {} x{k} = {p}in0[{base} + ({row}) * {cols} + c];",
                    types::storage(self.xd)
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "        const kiln::vec4<{}> x{k} = kiln::load4({p}in0 + {base} + ({row}) * {cols} + c);",
                    types::storage(self.xd)
                );
            }
        };
        let add_row = |s: &mut String, k: usize| {
            for j in 0..width {
                let element = if width == 1 { format!("x{k}") } else { format!("x{k}.v[{j}]") };
                let _ = writeln!(
                    s,
                    "        acc[{j}] = {};",
                    acc.combine(&format!("acc[{j}]"), &types::load(self.xd, &element))
                );
            }
        };
        // Unrolled while a warp has `unroll` rows left (never, where the
        // range is too short for it).
        if unroll > 1 && (unroll - 1) * warps < range {
            let _ =
                writeln!(s, "      for (; r + {} < {end}; r += {}) {{", (unroll - 1) * warps, unroll * warps);
            for k in 0..unroll {
                load_row(s, k, &format!("r + {}", k * warps));
            }
            for k in 0..unroll {
                add_row(s, k);
            }
            s.push_str("      }\n");
        }
        let _ = writeln!(s, "      for (; r < {end}; r += {warps}) {{");
        load_row(s, 0, "r");
        add_row(s, 0);
        s.push_str("      }\n    }\n");
        let _ = writeln!(s, "    for (int j = 0; j < {width}; ++j) part[warp][{lane} + j] = acc[j];");
        s.push_str("    __syncthreads();\n");
    }

    /// Column `c = tile0 + x` of each `x` below the tile (threads in
    /// turn): `t`, the warps' partials combined in warp order, then
    /// `store` (which reads `c` and `t`).
    fn combine_warps(&self, s: &mut String, tile0: &str, warps: usize, store: &str) {
        let (tile, cols, acc) = (self.tiling.tile(), self.tiling.cols, self.acc);
        let _ = writeln!(s, "    for (int x = threadIdx.x; x < {tile}; x += blockDim.x) {{");
        let _ = writeln!(s, "      const I c = {tile0} + x;\n      if (c >= {cols}) break;");
        let _ = writeln!(s, "      {} t = part[0][x];", acc.acc_ty);
        let _ =
            writeln!(s, "      for (int w = 1; w < {warps}; ++w) t = {};", acc.combine("t", "part[w][x]"));
        let _ = writeln!(s, "      {store}\n    }}");
    }

    /// The code of split block `block`: its chunk's partial column sums
    /// into the workspace, then, in the last block of its column tile to
    /// arrive, the tile's results (`stored`: the store's value from `t`).
    /// Unless `standalone`, `ticket` is declared.
    fn split_block(&self, s: &mut String, block: &str, standalone: bool, stored: &str) {
        let Tiling { rows, cols, chunks, .. } = self.tiling;
        let (tile, tiles, p, acc) = (self.tiling.tile(), self.tiling.tiles(), self.prefix, self.acc);
        let per = rows.div_ceil(chunks);
        let _ = writeln!(s, "  const I tile = {block} % {tiles}, chunk = {block} / {tiles};");
        let _ = writeln!(
            s,
            "  const I r_end = chunk * {per} + {per} < {rows} ? chunk * {per} + {per} : (I){rows};"
        );
        s.push_str("  {\n");
        let rows_of_chunk = (&format!("chunk * {per}")[..], "r_end", per);
        self.accumulate_rows(s, &format!("tile * {tile}"), rows_of_chunk, SPLIT_WARPS);
        let write = format!("{p}ws[chunk * {cols} + c] = t;");
        self.combine_warps(s, &format!("tile * {tile}"), SPLIT_WARPS, &write);
        s.push_str("  }\n");
        let counter = format!("{p}counts[tile]");
        match standalone {
            true => super::last_to_arrive(s, "threadIdx.x", &counter, chunks),
            false => super::arrive(s, "threadIdx.x", &counter, chunks),
        }
        let _ = writeln!(s, "  for (int x = threadIdx.x; x < {tile}; x += blockDim.x) {{");
        let _ = writeln!(s, "    const I c = tile * {tile} + x;\n    if (c >= {cols}) break;");
        let _ = writeln!(s, "    {} t = __ldcg(&{p}ws[c]);", acc.acc_ty);
        let _ = writeln!(
            s,
            "    for (int k = 1; k < {chunks}; ++k) t = {};",
            acc.combine("t", &format!("__ldcg(&{p}ws[k * {cols} + c])"))
        );
        let _ = writeln!(s, "    {p}out[c] = {stored};\n  }}");
        let _ = writeln!(s, "  if (threadIdx.x == 0) {p}counts[tile] = 0u;");
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
    pub(crate) fn tiling(&self) -> Tiling {
        Tiling::of(&self.x, self.rows, self.cols)
    }

    /// Whether the member runs in a group kernel ([`generate_group`]): it
    /// [`fits`], its rows split into chunks (a group kernel is made of
    /// split blocks, [`SPLIT_WARPS`] warps each), and it accumulates
    /// floats in double (the group's shared partials are doubles). The
    /// others launch their own kernels.
    pub(crate) fn joins_group(&self) -> bool {
        fits(&self.x, self.op, self.rows, self.cols)
            && self.tiling().split()
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
/// kernel's code, so it computes the same bits; `part` (as wide as the
/// widest tile) and `ticket` are declared once for all.
pub(crate) fn generate_group(name: &str, members: &[&Member]) -> Kernel {
    let mut params = Vec::new();
    let mut bodies = String::new();
    let mut index = "int";
    let mut start = 0;
    let mut widest = LANES;
    for m in members {
        if index_type(m.rows * m.cols, std::slice::from_ref(&m.x)) != "int" {
            index = "long long";
        }
    }
    for (i, m) in members.iter().enumerate() {
        debug_assert!(m.joins_group(), "member {i} of a column group does not join it");
        let xd = m.x.dtype;
        let tiling = m.tiling();
        widest = widest.max(tiling.tile());
        let acc = accumulate(m.op, xd);
        let prefix = format!("m{i}_");
        params.push(split_params(&prefix, &acc.acc_ty, xd, m.out_dtype));
        let base = m.x.access.dense_base().unwrap_or(0);
        let code = Code { tiling, acc: &acc, xd, base, prefix: &prefix };
        let stored = types::store(m.out_dtype, &result(m.op, xd, m.rows, m.out_dtype));
        let end = start + tiling.tiles() * tiling.chunks;
        let _ = writeln!(bodies, "  {}if (b < {end}u) {{", if i == 0 { "" } else { "else " });
        let mut block = String::new();
        code.split_block(&mut block, &format!("(I)(b - {start}u)"), false, &stored);
        for line in block.lines() {
            let _ = writeln!(bodies, "  {line}");
        }
        bodies.push_str("  }\n");
        start = end;
    }
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", params.join(", "));
    let _ = writeln!(s, "  typedef {index} I;\n  __shared__ double part[{SPLIT_WARPS}][{widest}];");
    s.push_str("  __shared__ unsigned ticket;\n");
    s.push_str(
        "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n  const unsigned b = blockIdx.x;\n",
    );
    s.push_str(&bodies);
    s.push_str("}\n");
    Kernel::new(name, s, start as u32, (SPLIT_WARPS * LANES) as u32, Vec::new())
}

/// A split kernel's pointer parameters, each name after `prefix`.
fn split_params(prefix: &str, acc_ty: &str, xd: DType, out_dtype: DType) -> String {
    format!(
        "{}* __restrict__ {prefix}out, {acc_ty}* __restrict__ {prefix}ws, unsigned* __restrict__ {prefix}counts, const {}* __restrict__ {prefix}in0",
        types::storage(out_dtype),
        types::storage(xd)
    )
}
