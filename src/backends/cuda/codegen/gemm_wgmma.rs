//! The Hopper GEMM with the matmul body's epilogue inside it: `out[m, n] =
//! epilogue(Σ_k a[m, k] b[n, k])` for f16 and bf16 products whose
//! epilogue cuBLASLt cannot take (the erf GELU of BERT's FFN, a cast, a
//! scale), on sm_90 devices (compiled for sm_90a, `nvrtc/mod.rs`).
//!
//! cuBLAS runs such a product at its full rate and then a second kernel
//! reads the product back from memory, applies the epilogue and writes it
//! again: BERT-base's `gelu(x W₁ᵀ + b₁)` over `[4096, 3072]` bf16 is a
//! ~32 µs GEMM and a ~19 µs epilogue kernel (benches/RESULTS.md). Here the
//! epilogue runs on the accumulators before the one store.
//!
//! The schedule (the operands as a linear layer gives them: `a` row-major
//! `[m, k]`, the weight `b` `[n, k]`, both contiguous along `k`, which is
//! what `wgmma` reads from shared memory without a transpose):
//!
//! - A block owns a `128 x cols` tile of the output (`cols` 128 or 256,
//!   [`Tile`]) and is two warpgroups, each accumulating 64 of its rows
//!   with `m64n{cols}k16` products whose A and B operands the tensor cores
//!   read from shared memory (the descriptors and the `cp.async` helper are
//!   `attention_wgmma.rs`'s, [`addressing`]).
//! - `k` goes in steps of 64 (one 128-byte row of halves: `wgmma`'s
//!   128-byte swizzle, chunk `c` of row `r` at chunk `(c ^ r) % 8`, as the
//!   attention's tiles), through a ring of `stages` buffers filled by
//!   `cp.async` `ahead` steps before they are read. One barrier a step
//!   makes a step's copies the block's; with `in_flight` 1 each warpgroup
//!   leaves its last step's products running while it issues the next
//!   ones, and the copies then target the buffer two steps back (every
//!   warpgroup has waited for those products before the barrier).
//! - Rows past `m`, columns past `n` and a last step past `k` are filled
//!   with zeros by `cp.async`'s source size, so every product is whole.
//! - The epilogue (`epilogue.rs`) runs on each accumulator in registers:
//!   the product rounded to its dtype, then the body, then one store of
//!   two neighbouring columns at once where the output's rows allow it.
//! - Blocks walk the output in groups of [`GROUP`] tile rows, so that
//!   blocks running together share their `b` tiles in L2.
//!
//! NaN and inf in the operands propagate through the products as in any
//! GEMM; the epilogue's own NaN rules are the body's.
//!
//! **Off by default** (`Target::wgmma_gemm`, `KILN_CUDA_WGMMA_GEMM=1`):
//! it loses to cuBLAS and a separate epilogue kernel. On an H200, 8 of
//! BERT-base's FFN up projections `[4096, 768] x [3072, 768]ᵀ` in bf16 a
//! captured call (benches/gpu_transformer.rs `linear`, benches/RESULTS.md,
//! the thirty-first measurement): cuBLAS alone 0.262-0.270 ms (about 580
//! TFLOP/s), cuBLAS and the bias + erf GELU kernel 0.422-0.427, this
//! kernel with that epilogue 0.526-0.539 (its best tile, 256 x 128, 4
//! buffers, one group of products in flight), and with a one-multiply
//! epilogue 0.461-0.467. Its products alone run at about 60% of
//! cuBLAS's. ncu (one launch, clocks locked) puts the difference in the
//! schedule, not in L2: cuBLAS runs `nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA`,
//! a persistent kernel (132 blocks) of 256 x 128 tiles, 4 buffers and
//! clusters of 2 whose TMA multicast shares the weight's tiles, in 39.2 us
//! with the SMs 70% busy, L2 29% busy and 163 MB read from L2; this kernel
//! with the same tile takes 66.2 us, the SMs 40% and L2 43% busy, 266 MB
//! read. What it lacks is what that kernel has: TMA loads issued by a
//! producer warp and waited for on mbarriers (here every thread issues
//! `cp.async` and one barrier a step holds all warpgroups together), a
//! persistent schedule that overlaps one tile's epilogue with the next
//! tile's products, and multicast.
//!
//! The emulator has no `wgmma`: the lowering picks this kernel only on an
//! sm_90 device (`Target::hopper`). `tests/ops/gemm_wgmma.rs` checks it
//! against f64 on the GPU.

use super::attention_wgmma::{addressing, fence_operands, product, wait, Operands};
use super::epilogue::{self, Epilogue};
use super::{types, Kernel};
use crate::ir::DType;
use std::fmt::Write;

/// Elements of `k` a step: one 128-byte swizzled row of halves.
const DEPTH: usize = 64;
/// Tile rows a group of blocks walks before the next columns (L2 reuse).
const GROUP: usize = 8;

/// A product this kernel computes: `a[m, k]` at `m * lda + k`, the weight
/// `b[n, k]` at `n * ldb + k` (elements, from the pointers passed).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Spec {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
}

/// The tile and pipeline of a kernel: output rows (64 a warpgroup) and
/// columns a block, buffers in the ring, and the products left running
/// across a step (0 or 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tile {
    pub rows: usize,
    pub cols: usize,
    pub stages: usize,
    pub in_flight: usize,
}

impl Tile {
    /// The tile used unless `KILN_GEMM_WGMMA_TILE` says otherwise.
    pub(crate) const DEFAULT: Tile = Tile { rows: 256, cols: 128, stages: 4, in_flight: 1 };

    /// `KILN_GEMM_WGMMA_TILE=rows,cols,stages,in_flight` (for measuring
    /// tiles against each other), else [`Tile::DEFAULT`]; a value that
    /// does not make a valid tile is ignored.
    pub(crate) fn from_env() -> Tile {
        let parsed = std::env::var("KILN_GEMM_WGMMA_TILE").ok().and_then(|v| {
            let x: Vec<usize> = v.split(',').filter_map(|p| p.trim().parse().ok()).collect();
            match x[..] {
                [rows, cols, stages, in_flight] => Some(Tile { rows, cols, stages, in_flight }),
                _ => None,
            }
        });
        parsed.filter(Tile::valid).unwrap_or(Tile::DEFAULT)
    }

    /// Whether the kernel can be built: 2 or 4 warpgroups of `m64n{cols}`
    /// products (128 or 256), at least one step loaded ahead, and a ring
    /// that fits an H100's 227 KiB of shared memory.
    fn valid(&self) -> bool {
        matches!(self.rows, 128 | 256)
            && matches!(self.cols, 128 | 256)
            && self.in_flight <= 1
            && self.stages >= 2 + self.in_flight
            && self.shared_bytes() <= 227 * 1024
    }

    /// Bytes of one buffer: `rows` rows of `a` then `cols` rows of `b`, 128 bytes each.
    fn stage_bytes(&self) -> usize {
        (self.rows + self.cols) * DEPTH * 2
    }

    /// Threads a block: a warpgroup per 64 rows.
    pub(crate) fn threads(&self) -> usize {
        self.rows * 2
    }

    /// Dynamic shared memory: the ring and 1 KiB to align it.
    fn shared_bytes(&self) -> usize {
        self.stages * self.stage_bytes() + 1024
    }

    /// Steps whose copies are issued before they are read.
    fn ahead(&self) -> usize {
        self.stages - 1 - self.in_flight
    }
}

/// Whether the kernel takes `spec`: f16 or bf16, `k`, the leading
/// dimensions (and, the lowering checks, the operands' offsets) multiples
/// of 8 elements, so that every 16-byte copy is aligned and wholly inside
/// or outside `k`.
pub(crate) fn applies(spec: &Spec) -> bool {
    matches!(spec.dtype, DType::F16 | DType::BF16)
        && spec.m > 0
        && spec.n > 0
        && spec.k >= 8
        && spec.k % 8 == 0
        && spec.lda % 8 == 0
        && spec.ldb % 8 == 0
        && spec.lda >= spec.k
        && spec.ldb >= spec.k
}

/// The kernel: `out` (of dtype `out`), `a`, `b`, then the epilogue's
/// buffers (`epilogue::params`).
pub(crate) fn gemm_wgmma(
    name: &str,
    spec: &Spec,
    tile: Tile,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<Kernel, String> {
    let Spec { dtype, m, n, k, lda, ldb } = *spec;
    let Tile { rows, cols, stages, in_flight } = tile;
    let threads = tile.threads();
    // Rows one pass of copies covers: 8 threads a row.
    let pass = threads / 8;
    let st = types::storage(dtype);
    let ab = if dtype == DType::BF16 { "bf16" } else { "f16" };
    let (tiles_m, tiles_n) = (m.div_ceil(rows), n.div_ceil(cols));
    let steps = k.div_ceil(DEPTH);
    let stage = tile.stage_bytes();
    let ahead = tile.ahead();
    let mut s = String::new();
    addressing(&mut s, name);
    product(&mut s, &format!("{name}_mma"), ab, cols, Operands::Shared);
    let first = [
        format!("{}* out", types::storage(out)),
        format!("const {st}* __restrict__ a"),
        format!("const {st}* __restrict__ b"),
    ];
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({threads}, 1) {name}({}) {{",
        epilogue::params(&first, epi)
    );
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n  typedef unsigned long long D;\n");
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned char, smem_raw, {});", tile.shared_bytes());
    s.push_str("  const unsigned raw_at = (unsigned)__cvta_generic_to_shared(smem_raw);\n");
    s.push_str("  const unsigned tiles = raw_at + ((1024u - (raw_at & 1023u)) & 1023u);\n");
    s.push_str(
        "  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4, wg = t / 128;\n",
    );
    // Groups of GROUP tile rows, walked column by column.
    let _ = writeln!(s, "  const int per_group = {GROUP} * {tiles_n}, group = blockIdx.x / per_group;");
    let _ = writeln!(s, "  const int first_m = group * {GROUP};");
    let _ =
        writeln!(s, "  const int rows_here = {tiles_m} - first_m < {GROUP} ? {tiles_m} - first_m : {GROUP};");
    s.push_str("  const int in_group = blockIdx.x % per_group;\n");
    let _ = writeln!(s, "  const I m0 = (I)(first_m + in_group % rows_here) * {rows};");
    let _ = writeln!(s, "  const I n0 = (I)(in_group / rows_here) * {cols};");
    // Each thread copies chunk cc (16 bytes) of rows rr, rr + pass, ...: the
    // rows it copies differ by multiples of 8, so its swizzled place in a
    // row is the same for each.
    s.push_str("  const int cc = t % 8, rr = t / 8;\n");
    s.push_str("  const unsigned at0 = rr * 128 + ((cc ^ rr) & 7) * 16;\n");
    let _ = writeln!(s, "  const {st}* const ag = a + (m0 + rr) * {lda}LL + cc * 8;");
    let _ = writeln!(s, "  const {st}* const bg = b + (n0 + rr) * {ldb}LL + cc * 8;");
    // The two operands' tiles: (name, first row, tile rows, rows in all,
    // leading dimension, shared address of the thread's first chunk).
    let operands = [("a", "m0", rows, m, lda, "sa"), ("b", "n0", cols, n, ldb, "sb")];
    // Which of the thread's rows lie inside the product: a bit each.
    s.push_str("  unsigned a_rows = 0u, b_rows = 0u;\n");
    for (x, first, tile_rows, all, _, _) in operands {
        let _ = writeln!(
            s,
            "  #pragma unroll\n  for (int i = 0; i < {}; ++i) {x}_rows |= (unsigned)({first} + rr + {pass} * i < {all}) << i;",
            tile_rows / pass
        );
    }
    // One step's copies into a buffer of the ring.
    let _ = writeln!(s, "  auto load = [&](int buf, int step) {{");
    let _ = writeln!(s, "    const unsigned sa = tiles + (unsigned)buf * {stage}u + at0;");
    let _ = writeln!(s, "    const unsigned sb = sa + {}u;", rows * 128);
    let _ = writeln!(s, "    const bool k_in = step * {DEPTH} + cc * 8 < {k};");
    s.push_str("    const I k0 = (I)step * 64;\n");
    for (x, _, tile_rows, _, ld, at) in operands {
        let _ = writeln!(s, "    #pragma unroll\n    for (int i = 0; i < {}; ++i) {{", tile_rows / pass);
        let _ = writeln!(s, "      const bool in = k_in && (({x}_rows >> i) & 1u);");
        let _ = writeln!(
            s,
            "      {name}_copy16({at} + i * {}u, in ? {x}g + i * {}LL + k0 : {x}, in ? 16 : 0);",
            pass * 128,
            pass * ld
        );
        s.push_str("    }\n");
    }
    s.push_str("  };\n");
    // Descriptors: the start address (16-byte units) is the low field; a
    // buffer's or a k-step's offset is added to the whole word.
    let _ = writeln!(s, "  const D a_desc = {name}_desc(tiles + wg * 8192u, 16, 1024);");
    let _ = writeln!(s, "  const D b_desc = {name}_desc(tiles + {}u, 16, 1024);", rows * 128);
    let _ = writeln!(
        s,
        "  float acc[{}][4];\n  #pragma unroll\n  for (int j = 0; j < {}; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;",
        cols / 8,
        cols / 8
    );
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int p = 0; p < {ahead}; ++p) {{\n    if (p < {steps}) load(p, p);\n    kiln::cp_async_commit();\n  }}"
    );
    let _ = writeln!(s, "  #pragma unroll 1\n  for (int step = 0; step < {steps}; ++step) {{");
    let _ = writeln!(s, "    kiln::cp_async_wait<{}>();  // this step's copies", ahead - 1);
    s.push_str("    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    s.push_str("    // The step's tile is the block's, and the buffer the next copies fill is\n");
    s.push_str("    // no product's: every warpgroup has waited for the products that read it.\n");
    s.push_str("    __syncthreads();\n");
    let _ = writeln!(
        s,
        "    {{\n      const int next = step + {ahead};\n      if (next < {steps}) load(next % {stages}, next);\n      kiln::cp_async_commit();\n    }}"
    );
    let _ = writeln!(s, "    const D off = (D)(((unsigned)(step % {stages}) * {stage}u) >> 4);");
    fence_operands(&mut s, "acc", cols / 8, "f", "    ");
    s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    let _ = writeln!(s, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk)", DEPTH / 16);
    let _ = writeln!(s, "      {name}_mma(acc, a_desc + off + (D)(kk * 2), b_desc + off + (D)(kk * 2), 1);");
    s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    wait(&mut s, in_flight, "    ");
    fence_operands(&mut s, "acc", cols / 8, "f", "    ");
    s.push_str("  }\n");
    wait(&mut s, 0, "  ");
    fence_operands(&mut s, "acc", cols / 8, "f", "  ");
    s.push_str("  kiln::cp_async_wait<0>();\n");
    store(&mut s, spec, cols, out, epi)?;
    s.push_str("}\n");
    let grid = (tiles_m * tiles_n).max(1);
    let params = epilogue::param_indices(epi, 2);
    Ok(Kernel::new(name, s, grid as u32, threads as u32, params).with_shared(tile.shared_bytes()))
}

/// The stores: each accumulator through the epilogue, two neighbouring
/// columns in one store where the output's element is 2 or 4 bytes and
/// its rows are even (so the pair is aligned).
fn store(
    s: &mut String,
    spec: &Spec,
    cols: usize,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<(), String> {
    let Spec { dtype, m, n, .. } = *spec;
    let one = |sum: &str, i: &str| -> Result<(String, String), String> {
        match epi {
            Some(e) => epilogue::value(dtype, e, sum, i),
            None => Ok((String::new(), types::settle(dtype, sum))),
        }
    };
    // The epilogue's index in 32 bits where the output allows: its
    // operands' offsets are divisions by the shape's dims.
    let ix = if m * n < i32::MAX as usize { "int" } else { "I" };
    s.push_str("  const I row0 = m0 + wg * 64 + (w % 4) * 16 + g;\n");
    let _ = writeln!(s, "  #pragma unroll\n  for (int j = 0; j < {}; ++j) {{", cols / 8);
    s.push_str("    const I col = n0 + j * 8 + 2 * c;\n");
    s.push_str("    #pragma unroll\n    for (int h = 0; h < 2; ++h) {\n");
    s.push_str("      const I row = row0 + 8 * h;\n");
    let _ = writeln!(s, "      if (row >= {m}) continue;");
    let pair = match out {
        DType::F16 | DType::BF16 => {
            Some(format!("*(U*)(out + i0) = kiln::pack2(r0, r1, {}());", types::storage(out)))
        }
        DType::F32 => Some("*(float2*)(out + i0) = make_float2(r0, r1);".to_string()),
        _ => None,
    };
    let (s0, v0) = one("acc[j][2 * h]", "i")?;
    let (s1, v1) = one("acc[j][2 * h + 1]", "i")?;
    let _ = writeln!(s, "      const I i0 = row * {n}LL + col;");
    if let (Some(pair), true) = (&pair, n % 2 == 0) {
        let _ = writeln!(s, "      if (col + 1 < {n}) {{\n        float r0, r1;");
        let _ = writeln!(s, "        {{ const {ix} i = ({ix})i0; {s0} r0 = {v0}; }}");
        let _ = writeln!(s, "        {{ const {ix} i = ({ix})i0 + 1; {s1} r1 = {v1}; }}");
        let _ = writeln!(s, "        {pair}\n        continue;\n      }}");
    }
    let _ = writeln!(
        s,
        "      if (col < {n}) {{ const {ix} i = ({ix})i0; {s0} out[i] = {}; }}",
        types::store(out, &v0)
    );
    let _ = writeln!(
        s,
        "      if (col + 1 < {n}) {{ const {ix} i = ({ix})i0 + 1; {s1} out[i] = {}; }}",
        types::store(out, &v1)
    );
    s.push_str("    }\n  }\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_that_do_not_fit_or_do_not_exist_are_refused() {
        assert!(Tile::DEFAULT.valid());
        let tile = |rows, cols, stages, in_flight| Tile { rows, cols, stages, in_flight };
        assert!(tile(128, 256, 4, 1).valid());
        assert!(tile(256, 128, 4, 1).valid());
        assert!(!tile(128, 256, 5, 1).valid(), "240 KiB");
        assert!(!tile(128, 192, 3, 0).valid());
        assert!(!tile(192, 128, 3, 0).valid());
        assert!(!tile(128, 128, 2, 1).valid(), "nothing loaded ahead");
        assert_eq!(tile(128, 128, 3, 0).ahead(), 2);
        assert_eq!(tile(256, 128, 3, 0).threads(), 512);
    }
}
