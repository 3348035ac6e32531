//! The argmax of a few long rows (greedy sampling over a vocabulary's
//! logits) over many blocks in one launch.
//!
//! The general reduction kernel gives a row one block: over GPT-2's 50257
//! logits, 1024 threads each walked 50 columns one load at a time, 23-26
//! µs on an H100, a twentieth of a bf16 decode step (unrolling that loop
//! did not help). Here a block owns [`COLS_PER_BLOCK`] columns of a row,
//! each thread loads its [`PER_THREAD`] columns at once, the block writes
//! its (value, index) to a workspace, and the last block of the row to
//! arrive (an arrival counter in
//! [`Region::Counters`](crate::backends::cuda::program::Region), set back
//! to zero by that block) combines the row's partials. `kiln::ArgMax`
//! breaks ties by the lower index and lets the first NaN win, so the
//! combination does not depend on which block came last, and the result
//! is the general kernel's (and PyTorch's) to the element.

use super::{types, Kernel};
use crate::ir::DType;
use std::fmt::Write;

/// Rows at most for which the kernel is used.
pub(crate) const MAX_ROWS: usize = 8;
/// Columns at least: below, one block a row is not latency-bound.
pub(crate) const MIN_COLS: usize = 16384;
/// Threads of a block.
const THREADS: usize = 256;
/// Columns a thread loads (all in flight together).
const PER_THREAD: usize = 8;
/// Columns a block owns.
const COLS_PER_BLOCK: usize = THREADS * PER_THREAD;

/// Whether the kernel takes an argmax over the last `cols` of `rows`
/// dense rows of `dtype`.
pub(crate) fn applies(dtype: DType, rows: usize, cols: usize) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && (1..=MAX_ROWS).contains(&rows)
        && cols >= MIN_COLS
}

/// Blocks a row.
fn splits(cols: usize) -> usize {
    cols.div_ceil(COLS_PER_BLOCK)
}

/// Workspace bytes: a `kiln::Arg<float>` (16 bytes) per block.
pub(crate) fn workspace_bytes(rows: usize, cols: usize) -> u64 {
    (rows * splits(cols) * 16) as u64
}

/// The kernel: `out` (i64, one a row), the workspace, the rows' arrival
/// counters, then `x` (`rows` dense rows of `cols` from element `offset`).
pub(crate) fn kernel(name: &str, dtype: DType, rows: usize, cols: usize, offset: usize) -> Kernel {
    let st = types::storage(dtype);
    let s = splits(cols);
    let mut k = format!(
        "extern \"C\" __global__ void {name}(kiln::i64* out, kiln::Arg<float>* ws, unsigned* counts, const {st}* __restrict__ x) {{\n"
    );
    k.push_str("  typedef long long I;\n  const int t = threadIdx.x;\n");
    let _ = writeln!(k, "  const I row = (I)blockIdx.x / {s}, b = (I)blockIdx.x % {s};");
    let _ = writeln!(k, "  const I c0 = b * {COLS_PER_BLOCK} + t, base = {offset}LL + row * {cols}LL;");
    let _ = writeln!(
        k,
        "  float v[{PER_THREAD}];\n  #pragma unroll\n  for (int u = 0; u < {PER_THREAD}; ++u) {{"
    );
    let _ = writeln!(
        k,
        "    const I c = c0 + u * {THREADS};\n    v[u] = c < {cols} ? {} : 0.f;\n  }}",
        types::load(dtype, "x[base + c]")
    );
    k.push_str("  const kiln::Arg<float> none = {(-kiln::inf_f32()), (kiln::i64)9223372036854775807LL};\n");
    k.push_str("  kiln::Arg<float> a = none;\n");
    let _ = writeln!(k, "  #pragma unroll\n  for (int u = 0; u < {PER_THREAD}; ++u) {{");
    let _ = writeln!(
        k,
        "    const I c = c0 + u * {THREADS};\n    if (c < {cols}) a = kiln::ArgMax()(a, kiln::Arg<float>{{v[u], (kiln::i64)c}});\n  }}"
    );
    let _ = writeln!(k, "  a = kiln::group_reduce<{THREADS}>(a, kiln::ArgMax());");
    let _ = writeln!(k, "  if (t == 0) ws[row * {s} + b] = a;");
    super::last_to_arrive(&mut k, "t", "counts[row]", s);
    k.push_str("  kiln::Arg<float> r = none;\n");
    let _ = writeln!(k, "  for (int p = t; p < {s}; p += {THREADS}) {{");
    let _ = writeln!(
        k,
        "    const kiln::Arg<float>* w = ws + row * {s} + p;\n    r = kiln::ArgMax()(r, kiln::Arg<float>{{__ldcg(&w->v), __ldcg(&w->i)}});\n  }}"
    );
    let _ = writeln!(k, "  r = kiln::group_reduce<{THREADS}>(r, kiln::ArgMax());");
    k.push_str("  if (t == 0) {\n    out[row] = r.i;\n    counts[row] = 0u;\n  }\n}\n");
    Kernel::new(name, k, (rows * s) as u32, THREADS as u32, vec![0, 1, 2])
}
