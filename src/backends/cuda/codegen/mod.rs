//! CUDA C generated from the IR: pure functions from graphs to source
//! text, with shapes baked in. Nothing here touches a device, so the
//! generated source of every test graph is an insta snapshot that CI (which
//! has no GPU) checks, and a change that claims no codegen change shows an
//! empty diff.
//!
//! - [`elementwise`]: fused elementwise bodies, unfused elementwise ops,
//!   view copies and matmul epilogues: one grid-stride loop, vector loads.
//! - [`reduction`]: fused row reductions (softmax, layer norm) and every
//!   unfused reduction: a thread, warp or block per row.
//! - [`ops`]: the ops no library runs and that are no body: random numbers,
//!   ranges, fills, gather, index_select, index_add, concatenation,
//!   integer matmul; [`pool_grad`]: a max pooling's input gradient.
//! - [`attention`]: the flash-style attention kernel (CUDA cores), and
//!   [`attention_mma`]: its tensor-core form for f16/bf16,
//!   [`attention_tf32`]: for f32 on tensor cores at f32 accuracy (3xTF32),
//!   [`attention_simt`]: the register-tiled f32 form on CUDA cores, and
//!   [`attention_decode`]: the split-key form for a few query rows.
//! - [`multi`]: the members of a launch group in one kernel (multi-tensor
//!   optimizer updates).
//! - [`gemv`]: products of a few rows (a decode step's projections) at
//!   memory bandwidth, with the matmul body's epilogue.
//!
//! Every kernel is `extern "C" __global__ void <name>(out, in0, in1, ...)`
//! with one pointer per buffer operand; its source starts with
//! `#include "kiln.cuh"` (`kernels/kiln.cuh`, inlined when compiled).

use crate::ir::DType;
use std::fmt;

pub(crate) mod argmax;
pub(crate) mod attention;
pub(crate) mod attention_decode;
pub(crate) mod attention_grad;
pub(crate) mod attention_grad_ds;
mod attention_grad_split;
pub(crate) mod attention_grad_wgmma;
pub(crate) mod attention_mma;
pub(crate) mod attention_simt;
pub(crate) mod attention_tf32;
mod attention_tiles;
pub(crate) mod attention_wgmma;
pub(crate) mod body;
pub(crate) mod columns;
pub(crate) mod elementwise;
pub(crate) mod epilogue;
mod expr;
pub(crate) mod gemm_wgmma;
mod gemm_wgmma_store;
pub(crate) mod gemv;
pub(crate) mod index;
pub(crate) mod index_add;
pub(crate) mod multi;
pub(crate) mod ops;
mod paired;
pub(crate) mod pool_grad;
pub(crate) mod reduction;
pub(crate) mod types;

/// The helpers every kernel includes: `kernels/kiln.cuh`, then the
/// tensor-core helpers of `kernels/kiln_mma.cuh`.
pub const KILN_CUH: &str =
    concat!(include_str!("../../../../kernels/kiln.cuh"), include_str!("../../../../kernels/kiln_mma.cuh"));

/// The line that includes [`KILN_CUH`]; replaced by its text when compiled.
pub const INCLUDE: &str = "#include \"kiln.cuh\"\n";

/// Threads per block of the one-dimensional kernels.
pub(crate) const BLOCK: u32 = 256;

/// Blocks at most in a grid; kernels loop over the rest (grid-stride).
const MAX_GRID: usize = 65_536;

/// The statements that end a block's first phase in the kernels whose
/// last block to arrive finishes the work (the split-`k` GEMV, the decode
/// attention's chunk merge, the argmax over blocks): after each block
/// wrote its partials, fence, take a ticket from the arrival counter
/// `counter` (thread `thread` of the block does), and return unless the
/// ticket says this block is the last of `arrivals`; then fence again
/// before the partials are read. CUDA's threadFenceReduction pattern; the
/// caller reads the partials with `__ldcg` and sets `counter` back to 0
/// ([`Region::Counters`](crate::backends::cuda::program::Region)).
pub(crate) fn last_to_arrive(s: &mut String, thread: &str, counter: &str, arrivals: usize) {
    s.push_str("  __threadfence();\n  __syncthreads();\n  __shared__ unsigned ticket;\n");
    take_ticket(s, thread, counter, arrivals);
}

/// [`last_to_arrive`] with `ticket` (a `__shared__ unsigned`) declared by
/// the caller: a kernel running several reductions declares it once.
pub(crate) fn arrive(s: &mut String, thread: &str, counter: &str, arrivals: usize) {
    s.push_str("  __threadfence();\n  __syncthreads();\n");
    take_ticket(s, thread, counter, arrivals);
}

fn take_ticket(s: &mut String, thread: &str, counter: &str, arrivals: usize) {
    s.push_str(&format!("  if ({thread} == 0) ticket = atomicAdd(&{counter}, 1u);\n  __syncthreads();\n"));
    s.push_str(&format!("  if (ticket != {}u) return;\n  __threadfence();\n", arrivals - 1));
}

/// Code that merges `split` partial softmaxes of one attention row, laid
/// out `[m, l, o_0 .. o_{w-3}]` (`w` values of type `ty` each) from pointer
/// `p`: declares `top`, the row's maximum over the partials (NaN winning;
/// a partial with no key has `m = NEG_INF` and weight 0), unless `top` is
/// `None` (the caller declared it), then `l` and `o`, the weighted sums
/// for column `c`, and `inv = 1 / l` (0 for a row with no key). `exp` is
/// the exponential to weigh with; `indent` prefixes every line. The
/// split-key kernels (`attention_simt`, `attention_decode`) share it.
pub(crate) fn merge_partials(
    s: &mut String,
    indent: &str,
    ty: &str,
    (split, w): (usize, usize),
    exp: &str,
    top: bool,
) {
    use std::fmt::Write as _;
    if top {
        let _ = writeln!(s, "{indent}{ty} top = NEG_INF;");
        let _ = writeln!(
            s,
            "{indent}for (int x = 0; x < {split}; ++x) {{\n{indent}  const {ty} y = __ldcg(p + x * {w});\n{indent}  top = (y > top || (y != y && top == top)) ? y : top;\n{indent}}}"
        );
    }
    let _ = writeln!(s, "{indent}{ty} l = 0, o = 0;\n{indent}for (int x = 0; x < {split}; ++x) {{");
    let _ =
        writeln!(s, "{indent}  const {ty} y = __ldcg(p + x * {w});\n{indent}  if (y == NEG_INF) continue;");
    let _ = writeln!(s, "{indent}  const {ty} f = {exp}(y - top);");
    let _ = writeln!(
        s,
        "{indent}  l += f * __ldcg(p + x * {w} + 1);\n{indent}  o += f * __ldcg(p + x * {w} + 2 + c);\n{indent}}}"
    );
    let _ = writeln!(s, "{indent}const {ty} inv = l == 0 ? ({ty})0 : ({ty})1 / l;");
}

/// A generated kernel and how to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The entry point's name.
    pub name: String,
    /// The whole source, starting with the `kiln.cuh` include.
    pub source: String,
    /// Blocks (x).
    pub grid: u32,
    /// Threads per block (x).
    pub block: u32,
    /// Which operands (by index) are pointer parameters after `out`, in order.
    pub params: Vec<usize>,
    /// Bytes of shared memory sized at launch (`KILN_DYNAMIC_SHARED` in
    /// `kiln.cuh`); 0 for kernels that declare all of theirs statically.
    /// Past 48 KiB the function must be allowed it first
    /// ([`Kernel::OPT_IN_SHARED`]).
    pub shared: u32,
    /// TMA tensor maps passed by value after the pointer parameters, in
    /// order: each describes the tile loads of one pointer argument, whose
    /// address is known only at launch (`tensor_map.rs` encodes them).
    pub maps: Vec<TensorMap>,
}

/// A two-dimensional TMA tensor map over one of a launch's pointer
/// arguments: `rows` rows of `cols` elements, `stride` elements apart,
/// loaded in boxes of `box_rows` rows of `box_cols` elements into shared
/// memory with the 128-byte swizzle (chunk `c` of row `r` at `c ^ r % 8`,
/// what `wgmma` descriptors read). Elements outside the tensor load as zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMap {
    /// The launch argument (an index into its pointer arguments) the map's
    /// address comes from.
    pub arg: usize,
    /// The elements' type (f16 or bf16).
    pub dtype: DType,
    /// Elements of a row the map covers.
    pub cols: u64,
    /// Rows the map covers.
    pub rows: u64,
    /// Elements from one row to the next (a multiple of 8: 16 bytes).
    pub stride: u64,
    /// Elements of a box's row (`box_cols * 2` bytes at most 128).
    pub box_cols: u32,
    /// Rows of a box (at most 256).
    pub box_rows: u32,
}

impl fmt::Display for TensorMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let TensorMap { arg, dtype, cols, rows, stride, box_cols, box_rows } = self;
        write!(f, "map(arg {arg} {dtype}[{rows}, {cols}] stride {stride} box {box_rows}x{box_cols})")
    }
}

impl Kernel {
    /// Shared memory a block may declare statically; dynamic shared memory
    /// beyond it needs the function's opt-in attribute.
    pub const STATIC_SHARED: u32 = 48 * 1024;
    /// The most shared memory (static and dynamic) a generated kernel may
    /// use: every sm_80+ device allows a block at least 99 KiB when opted in
    /// (sm_86/89: 99 KiB, sm_80: 163, sm_90: 227). Less than a device
    /// allows leaves room for several blocks an SM.
    pub const OPT_IN_SHARED: u32 = 96 * 1024;

    pub(crate) fn new(name: &str, body: String, grid: u32, block: u32, params: Vec<usize>) -> Kernel {
        Kernel {
            name: name.to_string(),
            source: format!("{INCLUDE}{body}"),
            grid,
            block,
            params,
            shared: 0,
            maps: Vec::new(),
        }
    }

    /// The kernel, launched with these tensor maps after its pointers.
    pub(crate) fn with_maps(mut self, maps: Vec<TensorMap>) -> Kernel {
        self.maps = maps;
        self
    }

    /// The kernel, launched with `bytes` of dynamic shared memory.
    pub(crate) fn with_shared(mut self, bytes: usize) -> Kernel {
        self.shared = u32::try_from(bytes).unwrap_or(u32::MAX);
        self
    }

    /// The source NVRTC compiles: the include replaced by `kiln.cuh`.
    pub fn compilable_source(&self) -> String {
        self.source.replacen(INCLUDE, &format!("{KILN_CUH}\n"), 1)
    }
}

/// Blocks for `work` units of `per_block` each, at least 1, at most [`MAX_GRID`].
pub(crate) fn grid_for(work: usize, per_block: usize) -> u32 {
    let per = per_block.max(1);
    work.div_ceil(per).clamp(1, MAX_GRID) as u32
}
