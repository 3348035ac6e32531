//! `torch.index_add`'s scatter (an embedding's gradient), after `out`
//! holds a copy of `x`: `out[o, idx[j], c] += src[o, j, c]`.
//!
//! *Order.* No atomics: each element's additions run in index order, the
//! CPU kernel's order, so every run on every backend gives the same bits.
//!
//! *How.* A block owns a range of `ROWS` rows of `out` (of one outer
//! index `o`) and walks the whole index, 256 positions at a time: each
//! thread checks one position, and the positions whose row falls in the
//! block's range are compacted, in index order, into shared memory (a
//! warp ballot and the warps' counts). Then the threads, one per column,
//! add those positions' rows of `src` in that order; a run of positions
//! naming the same row keeps its sum in a register and stores it once.
//! The index is read once per block (from L2 after the first), and each
//! hit costs a row of loads and stores.
//!
//! *Why.* The earlier kernel gave each column one thread walking the whole
//! index: GPT-2 small's embedding gradient (4096 positions into 50257 rows
//! of 768) had 768 threads in all and took 1.67 ms of a 28 ms bf16
//! training step on an H100.
//!
//! A bad index is skipped and reported through `status` (its position in
//! the index) by the block that owns the first range.

use super::body::{index_type, Operand, Source};
use super::ops::{index_value, STATUS};
use super::{grid_for, types, Kernel};
use crate::ir::Shape;
use std::fmt::Write;

/// Threads per block, and index positions checked per step of the walk.
const THREADS: usize = 256;
/// Blocks to aim for: a few per multiprocessor of an H100.
const TARGET_BLOCKS: usize = 512;

/// The kernel adding `src`'s rows into `out` (shape `out`) at the rows
/// `idx` names along `dim`.
pub(crate) fn generate(name: &str, idx: &Operand, src: &Operand, dim: usize, out: &Shape) -> Kernel {
    let dtype = src.dtype;
    let (size, len) = (out.0[dim], idx.access.shape().0[0]);
    let outer: usize = out.0[..dim].iter().product();
    let inner: usize = out.0[dim + 1..].iter().product();
    let rows = size.div_ceil(TARGET_BLOCKS / outer.clamp(1, TARGET_BLOCKS)).max(1);
    let ranges = size.div_ceil(rows).max(1);
    let index = index_type(out.numel().max(src.access.shape().numel()), &[idx.clone(), src.clone()]);
    let acc = types::compute(dtype);
    let mut p = vec![format!("{}* __restrict__ out", types::storage(dtype))];
    if idx.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in1", types::storage(idx.dtype)));
    }
    if src.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in2", types::storage(dtype)));
    }
    p.push(STATUS.into());
    let warps = THREADS / 32;
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "));
    let _ = writeln!(s, "  typedef {index} I;");
    let _ = writeln!(
        s,
        "  __shared__ I hit_pos[{THREADS}], hit_row[{THREADS}];\n  __shared__ int counts[{warps}];"
    );
    s.push_str("  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n");
    let _ = writeln!(s, "  for (I b = blockIdx.x; b < {}; b += gridDim.x) {{", outer * ranges);
    let _ = writeln!(s, "    const I o = b / {ranges}, r0 = (b % {ranges}) * {rows};");
    let _ = writeln!(s, "    const I r1 = r0 + {rows} < {size} ? r0 + {rows} : {size};");
    let _ = writeln!(s, "    for (I j0 = 0; j0 < {len}; j0 += {THREADS}) {{");
    // Which of this step's positions fall in the range.
    let _ = writeln!(s, "      const I j = j0 + threadIdx.x;\n      I row = -1;");
    let _ = writeln!(
        s,
        "      if (j < {len}) {{\n        const kiln::i64 v = {};",
        index_value(idx, &idx.access, "j")
    );
    let _ = writeln!(
        s,
        "        if (v < 0 || v >= {size}LL) {{ if (b == 0) atomicMin(status, (unsigned long long)j); }}"
    );
    s.push_str("        else if (v >= r0 && v < r1) row = (I)v;\n      }\n");
    // Compacted in index order: the warps' counts, then a rank in the warp.
    s.push_str("      const unsigned mask = __ballot_sync(0xffffffffu, row >= 0);\n");
    s.push_str("      if (lane == 0) counts[warp] = __popc(mask);\n      __syncthreads();\n");
    let _ = writeln!(
        s,
        "      int before = 0, total = 0;\n      for (int w = 0; w < {warps}; ++w) {{ before += w < warp ? counts[w] : 0; total += counts[w]; }}"
    );
    s.push_str("      if (row >= 0) {\n        const int k = before + __popc(mask & ((1u << lane) - 1u));\n");
    s.push_str("        hit_pos[k] = j;\n        hit_row[k] = row;\n      }\n      __syncthreads();\n");
    // The hits, in order, one thread per column; a run of one row stays
    // in a register.
    let _ = writeln!(s, "      for (I c = threadIdx.x; c < {inner}; c += {THREADS}) {{");
    let _ = writeln!(s, "        I held = -1;\n        {acc} sum = 0;");
    s.push_str(
        "        for (int h = 0; h < total; ++h) {\n          const I r = hit_row[h], jj = hit_pos[h];\n",
    );
    let at = |row: &str| format!("(o * {size} + {row}) * {inner} + c");
    let add = match src.source {
        Source::Const(c) => types::literal(dtype, c),
        Source::Buffer => types::load(
            dtype,
            &format!("in2[{}]", src.access.offset_of(&format!("((o * {len} + jj) * {inner} + c)"))),
        ),
    };
    let _ = writeln!(
        s,
        "          if (r != held) {{\n            if (held >= 0) out[{}] = {};\n            held = r;\n            sum = {};\n          }}",
        at("held"),
        types::store(dtype, "sum"),
        types::load(dtype, &format!("out[{}]", at("r")))
    );
    let step = if dtype.is_float() { "sum + add".to_string() } else { "kiln::iadd(sum, add)".to_string() };
    let _ = writeln!(
        s,
        "          const {acc} add = {add};\n          sum = {};\n        }}",
        types::settle(dtype, &step)
    );
    let _ =
        writeln!(s, "        if (held >= 0) out[{}] = {};\n      }}", at("held"), types::store(dtype, "sum"));
    s.push_str("      __syncthreads();\n    }\n  }\n}\n");
    let mut params = Vec::new();
    if idx.source == Source::Buffer {
        params.push(1);
    }
    if src.source == Source::Buffer {
        params.push(2);
    }
    Kernel::new(name, s, grid_for(outer * ranges, 1), THREADS as u32, params)
}
