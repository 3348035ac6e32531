//! The Hopper GEMM with the matmul body's epilogue inside it: `out[m, n] =
//! epilogue(Σ_k a[m, k] b[n, k])` for f16 and bf16 products whose
//! epilogue cuBLASLt cannot take (the erf GELU of BERT's FFN, a cast, a
//! scale), on sm_90 devices (compiled for sm_90a, `nvrtc/mod.rs`).
//!
//! cuBLAS runs such a product at its full rate and then a second kernel
//! reads the product back from memory, applies the epilogue and writes it
//! again: BERT-base's `gelu(x W₁ᵀ + b₁)` over `[4096, 3072]` bf16 is a
//! ~33 µs GEMM and a ~20 µs epilogue kernel (benches/RESULTS.md). Here the
//! epilogue runs on the product before its one store.
//!
//! The schedule (the operands as a linear layer gives them: `a` row-major
//! `[m, k]`, the weight `b` `[n, k]`, both contiguous along `k`, which is
//! what `wgmma` reads from shared memory without a transpose), warp
//! specialized as Hopper GEMMs are:
//!
//! - A block is three warpgroups. Two *consumers* accumulate output tiles
//!   with one or two stacked `m64n{cols}k16` products a 16-deep slice,
//!   both operands read by the tensor cores from shared memory (the
//!   descriptors are `attention_wgmma.rs`'s, [`addressing`]). The third,
//!   the *producer*, gives up its registers to them (`setmaxnreg`) and one
//!   of its threads issues the loads.
//! - Who owns what ([`Tile`]): with `pingpong` (the default) each consumer
//!   takes every other tile of its block whole, and they take the ring's
//!   steps in turns, so that one's epilogue runs while the other's
//!   products do; otherwise both take half the rows of every tile and
//!   share its weight's loads. With `blocks` the grid is that many blocks,
//!   each walking the tiles `blocks` apart (persistent: by default one a
//!   multiprocessor, `Tile::for_device`); with none given, one block
//!   takes one tile (two with `pingpong`).
//! - `k` goes in steps of 64 (one 128-byte row of halves: `wgmma`'s
//!   128-byte swizzle, chunk `c` of row `r` at chunk `c ^ r % 8`), through
//!   a ring of `stages` buffers. Each step's two tiles are TMA box loads
//!   (`cp.async.bulk.tensor`, through the tensor maps the launch encodes,
//!   `tensor_map.rs`) that swizzle as they write and fill rows past `m`,
//!   columns past `n` and a last step past `k` with zeros, so every
//!   product is whole.
//! - No block-wide barrier after the start: a buffer's *full* mbarrier
//!   completes when its bytes land (the loads count them), and its
//!   *empty* one when the consumer threads that read it have seen their
//!   products finish; the producer waits for *empty* before it refills a
//!   buffer, the consumers for *full* before they multiply. A wait names
//!   a phase by its parity only, so no thread may wait two phases ahead
//!   of a barrier: that is why pingpong's consumers take turns. With
//!   `in_flight` 1 a consumer leaves a step's products running while it
//!   issues the next step's, and frees a buffer one step late.
//! - The epilogue (`epilogue.rs`): the consumer rounds its accumulators
//!   to the product's dtype into its own staging rows in shared memory,
//!   then each thread takes eight neighbouring columns of a row at a
//!   time, two elements at once (their roundings paired, `paired.rs`),
//!   and stores the eight with one vector store where the output's rows
//!   allow it. The epilogue is a short loop, not every accumulator's code
//!   unrolled, and the output is written in whole rows.
//! - Tiles are walked in groups of [`GROUP`] tile rows, so that blocks
//!   running together share their `b` tiles in L2.
//!
//! NaN and inf in the operands propagate through the products as in any
//! GEMM; the epilogue's own NaN rules are the body's.
//!
//! **On by default on sm_90** (`Target::wgmma_gemm`;
//! `KILN_CUDA_WGMMA_GEMM=0` keeps cuBLAS and an epilogue kernel). On an
//! H200, 8 of BERT-base's FFN up projections `[4096, 768] x [3072, 768]ᵀ`
//! in bf16 a captured call (benches/gpu_transformer.rs `linear`,
//! benches/RESULTS.md, the thirty-third measurement): cuBLAS alone
//! 0.263-0.268 ms; with a one-multiply epilogue this kernel 0.259-0.265
//! (the product at cuBLAS's speed) where cuBLAS and an epilogue kernel take
//! 0.345-0.349; with the bias and the erf GELU 0.359-0.364 against
//! 0.392-0.397. BERT-base and MiniLM bf16 encoders ran 3-5% faster with it
//! and GPT-2 small's bf16 training step the same. The erf GELU still
//! costs the product a quarter of its speed (issue 36 asks for a tenth):
//! the GELU's 31 instructions an element on the consumers' warps do not
//! hide behind the other consumer's products, and three more warps (the
//! producer warpgroup's idle ones) draining with them did not help
//! either.
//!
//! The emulator has no `wgmma`: the lowering picks this kernel only on an
//! sm_90 device (`Target::hopper`). `tests/ops/gemm_wgmma.rs` checks it
//! against f64 on the GPU.

use super::attention_wgmma::{addressing, fence_operands, product, wait, Operands};
use super::epilogue::{self, Epilogue};
use super::gemm_wgmma_store::store;
use super::{types, Kernel, TensorMap};
use crate::ir::DType;
use std::fmt::Write;

/// Elements of `k` a step: one 128-byte swizzled row of halves.
const DEPTH: usize = 64;
/// Tile rows a group of blocks walks before the next columns (L2 reuse).
const GROUP: usize = 8;
/// Warpgroups that multiply (a third loads).
const CONSUMERS: usize = 2;

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

/// The tile and pipeline of a kernel: a tile's output rows and columns,
/// buffers in the ring, the products left running across a step (0 or
/// 1), the blocks, and how the two consumer warpgroups share the work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tile {
    pub rows: usize,
    pub cols: usize,
    pub stages: usize,
    pub in_flight: usize,
    /// Blocks at most, each walking the tiles `blocks` apart (persistent:
    /// a block's next tile's loads overlap its epilogue); 0: one block a
    /// tile (`pingpong`: one a pair of tiles).
    pub blocks: usize,
    /// Each consumer takes every other tile of its block whole, so one's
    /// epilogue runs while the other's products do; else both take half
    /// the rows of every tile (and share its weight's loads).
    pub pingpong: bool,
    /// Chunks of eight columns of the epilogue's loop unrolled, so that a
    /// thread's loads of the epilogue's operands (a bias: global memory)
    /// for several are in flight at once.
    pub unroll: usize,
}

impl Tile {
    /// The tile used unless `KILN_GEMM_WGMMA_TILE` says otherwise (its grid
    /// set by [`Tile::for_device`]).
    pub(crate) const DEFAULT: Tile =
        Tile { rows: 128, cols: 128, stages: 4, in_flight: 1, blocks: 0, pingpong: true, unroll: 1 };

    /// The tile for a device of `sms` multiprocessors (0: unknown):
    /// `KILN_GEMM_WGMMA_TILE` if it is set to a valid tile, else
    /// [`Tile::DEFAULT`] on a persistent grid of one block a
    /// multiprocessor (the ring and the staging take 197 KiB: one block
    /// fits one). Persistent, a block's next tile's loads overlap its
    /// epilogue and no block waits for a second wave: on an H200, 8 of
    /// BERT-base's FFN up projections took 0.373-0.378 ms with bias and erf
    /// GELU against 0.409-0.415 with one block a pair of tiles
    /// (benches/RESULTS.md, the thirty-third measurement).
    pub(crate) fn for_device(sms: usize) -> Tile {
        Tile::from_env().unwrap_or(Tile { blocks: sms, ..Tile::DEFAULT })
    }

    /// `KILN_GEMM_WGMMA_TILE=rows,cols,stages,in_flight[,blocks[,pingpong[,unroll]]]`
    /// (for measuring tiles against each other; `pingpong` 0 or 1; blocks
    /// 0: one a tile, or a pair of tiles), if it is set to a valid tile.
    fn from_env() -> Option<Tile> {
        let parsed = std::env::var("KILN_GEMM_WGMMA_TILE").ok().and_then(|v| {
            let x: Vec<usize> = v.split(',').filter_map(|p| p.trim().parse().ok()).collect();
            let tile = |rows, cols, stages, in_flight, blocks, pingpong, unroll| Tile {
                rows,
                cols,
                stages,
                in_flight,
                blocks,
                pingpong: pingpong == 1,
                unroll,
            };
            let u = Tile::DEFAULT.unroll;
            match x[..] {
                [r, c, s, f] => Some(tile(r, c, s, f, 0, 0, u)),
                [r, c, s, f, b] => Some(tile(r, c, s, f, b, 0, u)),
                [r, c, s, f, b, p] => Some(tile(r, c, s, f, b, p, u)),
                [r, c, s, f, b, p, u] => Some(tile(r, c, s, f, b, p, u)),
                _ => None,
            }
        });
        parsed.filter(Tile::valid)
    }

    /// Rows of a tile one consumer warpgroup accumulates: 64 a stacked
    /// `m64n{cols}` product.
    pub(super) fn consumer_rows(&self) -> usize {
        if self.pingpong {
            self.rows
        } else {
            self.rows / CONSUMERS
        }
    }

    /// Whether the kernel can be built: one or two stacked `m64n{cols}`
    /// products a consumer (128 accumulators a thread at most), two
    /// buffers at least, and what it needs of shared memory within an
    /// H100's 227 KiB.
    fn valid(&self) -> bool {
        let rows = self.consumer_rows();
        matches!(rows, 64 | 128)
            && self.rows == rows * if self.pingpong { 1 } else { CONSUMERS }
            && matches!(self.cols, 128 | 256)
            && rows * self.cols <= 128 * 128
            && self.in_flight <= 1
            && self.stages >= 2
            && (1..=8).contains(&self.unroll)
            && self.shared_bytes() <= 227 * 1024
    }

    /// Bytes of one buffer: `rows` rows of `a` then `cols` rows of `b`, 128 bytes each.
    fn stage_bytes(&self) -> usize {
        (self.rows + self.cols) * DEPTH * 2
    }

    /// Bytes from one row of a consumer's staged product to the next: its
    /// halves and 16 bytes, so that the eight rows a warp's accumulators
    /// write at once fall in different banks.
    pub(super) fn staged_pitch(&self) -> usize {
        self.cols * 2 + 16
    }

    /// Threads a block: the consumers' warpgroups and the producer's.
    pub(crate) fn threads(&self) -> usize {
        (CONSUMERS + 1) * 128
    }

    /// Dynamic shared memory: the ring, each consumer's staged product, two
    /// barriers a buffer and the consumers' two turns, and 1 KiB to align
    /// the ring.
    fn shared_bytes(&self) -> usize {
        self.stages * (self.stage_bytes() + 16)
            + CONSUMERS * self.consumer_rows() * self.staged_pitch()
            + 16
            + 1024
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
/// buffers (`epilogue::params`), then the tensor maps of `a` and `b`
/// (the launch encodes them from the pointers, `tensor_map.rs`).
pub(crate) fn gemm_wgmma(
    name: &str,
    spec: &Spec,
    tile: Tile,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<Kernel, String> {
    let Spec { dtype, m, n, k, lda, ldb } = *spec;
    let Tile { rows, cols, stages, in_flight, pingpong, .. } = tile;
    let threads = tile.threads();
    let own = tile.consumer_rows();
    // m64 products a consumer stacks.
    let stacked = own / 64;
    let st = types::storage(dtype);
    let ab = if dtype == DType::BF16 { "bf16" } else { "f16" };
    let (tiles_m, tiles_n) = (m.div_ceil(rows), n.div_ceil(cols));
    let steps = k.div_ceil(DEPTH);
    let tiles = (tiles_m * tiles_n).max(1);
    let stage = tile.stage_bytes();
    let pitch = tile.staged_pitch();
    let mut s = String::new();
    addressing(&mut s, name);
    product(&mut s, &format!("{name}_mma"), ab, cols, Operands::Shared);
    barriers(&mut s, name);
    let first = [
        format!("{}* out", types::storage(out)),
        format!("const {st}* __restrict__ a"),
        format!("const {st}* __restrict__ b"),
    ];
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void __launch_bounds__({threads}, 1) {name}({}, const __grid_constant__ {name}_map a_map, const __grid_constant__ {name}_map b_map) {{",
        epilogue::params(&first, epi)
    );
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n  typedef unsigned long long D;\n");
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned char, smem_raw, {});", tile.shared_bytes());
    s.push_str("  const unsigned raw_at = (unsigned)__cvta_generic_to_shared(smem_raw);\n");
    s.push_str("  const unsigned tiles = raw_at + ((1024u - (raw_at & 1023u)) & 1023u);\n");
    let _ = writeln!(
        s,
        "  // The ring, then each consumer's staged product, then the barriers:\n  // buffer s is full when full + 8 s completes (its loads landed), empty\n  // when empty + 8 s does (the products that read it are done); with\n  // pingpong, consumer w may start its products when turn + 8 w completes.\n  const unsigned staged = tiles + {}u, full = staged + {}u, empty = full + {}u, turn = empty + {}u;",
        stages * stage,
        CONSUMERS * own * pitch,
        stages * 8,
        stages * 8
    );
    s.push_str("  const int t = threadIdx.x, lane = t % 32, g = lane / 4, c = lane % 4;\n");
    // The warp and warpgroup read from lane 0: the same values, but the
    // compiler then knows they are the same across the warp, so what
    // derives from them (a consumer's tiles, steps and buffers, the
    // `wgmma` descriptors) is computed in uniform registers, once a warp,
    // instead of in each thread's and moved over for every product (the
    // products' SASS had 16 `R2UR` moves a step; on an H200 the scaled
    // product's issue slots went from 34.6% to 27.5% busy, the thirty-third
    // measurement).
    s.push_str(
        "  const int w = __shfl_sync(0xffffffffu, t / 32, 0), wg = __shfl_sync(0xffffffffu, t / 128, 0);\n",
    );
    // Tile `tile`'s first row and column: groups of GROUP tile rows, each
    // walked column by column.
    s.push_str("  auto origin = [&](int tile, int& m0, int& n0) {\n");
    let _ =
        writeln!(s, "    const int per_group = {GROUP} * {tiles_n}, first_m = tile / per_group * {GROUP};");
    let _ = writeln!(
        s,
        "    const int rows_here = {tiles_m} - first_m < {GROUP} ? {tiles_m} - first_m : {GROUP}, in_group = tile % per_group;"
    );
    let _ = writeln!(s, "    m0 = (first_m + in_group % rows_here) * {rows};");
    let _ = writeln!(s, "    n0 = (in_group / rows_here) * {cols};\n  }};");
    let release = if pingpong { 128 } else { CONSUMERS * 128 };
    let _ = writeln!(
        s,
        "  if (t == 0) {{\n    #pragma unroll\n    for (int i = 0; i < {stages}; ++i) {{\n      {name}_init(full + 8 * i, 1);\n      {name}_init(empty + 8 * i, {release});\n    }}\n    {name}_init(turn, 128);\n    {name}_init(turn + 8, 128);\n    asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n  }}\n  __syncthreads();"
    );
    // The producer: one thread of the last warpgroup issues each step's two
    // tile loads once the consumers are done with the buffer's last step.
    // `it` counts the block's steps over all its tiles: buffer `it % stages`,
    // in the ring's round `it / stages`.
    let _ = writeln!(s, "  if (wg == {CONSUMERS}) {{");
    s.push_str("    asm volatile(\"setmaxnreg.dec.sync.aligned.u32 40;\");\n");
    let _ = writeln!(s, "    if (t == {}) {{", CONSUMERS * 128);
    let _ = writeln!(
        s,
        "      int it = 0;\n      #pragma unroll 1\n      for (int tile = blockIdx.x; tile < {tiles}; tile += gridDim.x) {{"
    );
    s.push_str("        int m0, n0;\n        origin(tile, m0, n0);\n");
    let _ =
        writeln!(s, "        #pragma unroll 1\n        for (int step = 0; step < {steps}; ++step, ++it) {{");
    let _ = writeln!(s, "          const int i = it % {stages};");
    let _ = writeln!(s, "          if (it >= {stages}) {name}_wait(empty + 8 * i, (it / {stages} + 1) & 1);");
    let _ = writeln!(s, "          const unsigned at = tiles + (unsigned)i * {stage}u;");
    let _ = writeln!(s, "          {name}_expect(full + 8 * i, {stage}u);");
    let _ = writeln!(s, "          {name}_load(at, &a_map, step * {DEPTH}, m0, full + 8 * i);");
    let _ =
        writeln!(s, "          {name}_load(at + {}u, &b_map, step * {DEPTH}, n0, full + 8 * i);", rows * 128);
    s.push_str("        }\n      }\n    }\n    return;\n  }\n");
    s.push_str("  asm volatile(\"setmaxnreg.inc.sync.aligned.u32 232;\");\n");
    // The consumer's rows of a tile, and its tiles: the `q`th tile of the
    // block is its `blockIdx.x + q gridDim.x`th, and its steps are the
    // ring's `q steps` on.
    let (row_in_tile, first_q, q_step) = if pingpong { ("0", "wg", 2) } else { ("wg * ", "0", 1) };
    let row_in_tile = if pingpong { row_in_tile.to_string() } else { format!("{row_in_tile}{own}") };
    let _ = writeln!(s, "  const int own0 = {row_in_tile};");
    // Descriptors: the start address (16-byte units) is the low field; a
    // buffer's or a k-step's offset is added to the whole word.
    let _ = writeln!(s, "  const D a_desc = {name}_desc(tiles + own0 * 128u, 16, 1024);");
    let _ = writeln!(s, "  const D b_desc = {name}_desc(tiles + {}u, 16, 1024);", rows * 128);
    let _ =
        writeln!(s, "  unsigned char* const mine = smem_raw + (staged - raw_at) + wg * {}u;", own * pitch);
    let _ = writeln!(s, "  float acc[{stacked}][{}][4];", cols / 8);
    if pingpong {
        s.push_str("  int turns = 0;\n");
    }
    let _ = writeln!(
        s,
        "  #pragma unroll 1\n  for (int q = {first_q}; blockIdx.x + q * gridDim.x < {tiles}; q += {q_step}) {{"
    );
    // The tile's body, written one level out and indented below.
    let outer = std::mem::take(&mut s);
    let _ = writeln!(s, "  int m0, n0, it = q * {steps};\n  origin(blockIdx.x + q * gridDim.x, m0, n0);");
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int r = 0; r < {stacked}; ++r)\n    #pragma unroll\n    for (int j = 0; j < {}; ++j) acc[r][j][0] = acc[r][j][1] = acc[r][j][2] = acc[r][j][3] = 0.f;",
        cols / 8
    );
    if pingpong {
        // A consumer's waits must each be for a buffer's next phase (a wait
        // for parity cannot tell a phase from the one two rounds later), so
        // the consumers take the ring's steps in turns: one starts its
        // tile's products when the other has waited for all of its own.
        s.push_str("  if (wg == 1 || q > 0) {\n");
        let _ = writeln!(s, "    {name}_wait(turn + 8 * wg, turns & 1);\n    ++turns;\n  }}");
    }
    let _ = writeln!(s, "  #pragma unroll 1\n  for (int step = 0; step < {steps}; ++step, ++it) {{");
    let _ = writeln!(s, "    const int i = it % {stages};");
    let _ = writeln!(s, "    {name}_wait(full + 8 * i, (it / {stages}) & 1);");
    let _ = writeln!(s, "    const D off = (D)(((unsigned)i * {stage}u) >> 4);");
    for r in 0..stacked {
        fence_operands(&mut s, &format!("acc[{r}]"), cols / 8, "f", "    ");
    }
    s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    let _ = writeln!(s, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk) {{", DEPTH / 16);
    for r in 0..stacked {
        let _ = writeln!(
            s,
            "      {name}_mma(acc[{r}], a_desc + off + (D)({} + kk * 2), b_desc + off + (D)(kk * 2), 1);",
            r * 512
        );
    }
    s.push_str("    }\n    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    wait(&mut s, in_flight, "    ");
    for r in 0..stacked {
        fence_operands(&mut s, &format!("acc[{r}]"), cols / 8, "f", "    ");
    }
    if in_flight == 0 {
        s.push_str("    // This step's products are done: its buffer may be refilled.\n");
        let _ = writeln!(s, "    {name}_arrive(empty + 8 * i);");
    } else {
        s.push_str("    // The step before's products are done: its buffer may be refilled.\n");
        let _ = writeln!(s, "    if (step > 0) {name}_arrive(empty + 8 * ((it - 1) % {stages}));");
    }
    s.push_str("  }\n");
    if pingpong {
        s.push_str("  // The other consumer's turn: its products run while this one's epilogue does.\n");
        let _ = writeln!(s, "  {name}_arrive(turn + 8 * (1 - wg));");
    }
    wait(&mut s, 0, "  ");
    for r in 0..stacked {
        fence_operands(&mut s, &format!("acc[{r}]"), cols / 8, "f", "  ");
    }
    if in_flight > 0 {
        s.push_str("  // And the tile's last step's.\n");
        let _ = writeln!(s, "  {name}_arrive(empty + 8 * ((it - 1) % {stages}));");
    }
    store(&mut s, spec, tile, out, epi)?;
    let body = std::mem::replace(&mut s, outer);
    for line in body.lines() {
        let _ = writeln!(s, "  {line}");
    }
    s.push_str("  }\n}\n");
    let pairs = if pingpong { tiles.div_ceil(2) } else { tiles };
    let grid = if tile.blocks > 0 { pairs.min(tile.blocks) } else { pairs };
    let params = epilogue::param_indices(epi, 2);
    let map = |arg: usize, rows_all: usize, ld: usize, box_rows: usize| TensorMap {
        arg,
        dtype,
        cols: k as u64,
        rows: rows_all as u64,
        stride: ld as u64,
        box_cols: DEPTH as u32,
        box_rows: box_rows as u32,
    };
    Ok(Kernel::new(name, s, grid as u32, threads as u32, params)
        .with_shared(tile.shared_bytes())
        .with_maps(vec![map(1, m, lda, rows), map(2, n, ldb, cols)]))
}

/// The kernel's barrier and TMA helpers, named after it: the tensor map's
/// parameter type (`tensor_map.rs` fills it), an mbarrier's
/// initialization, arrival, arrival expecting a load's bytes and wait for
/// a phase, and one box's load into shared memory, counted on a barrier.
fn barriers(s: &mut String, name: &str) {
    let _ = writeln!(s, "struct __align__(64) {name}_map {{ unsigned long long opaque[16]; }};");
    let _ = writeln!(s, "__device__ __forceinline__ void {name}_init(unsigned bar, unsigned count) {{");
    s.push_str("  asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"(bar), \"r\"(count) : \"memory\");\n}\n");
    let _ = writeln!(s, "__device__ __forceinline__ void {name}_arrive(unsigned bar) {{");
    s.push_str(
        "  asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"(bar) : \"memory\");\n}\n",
    );
    let _ = writeln!(s, "__device__ __forceinline__ void {name}_expect(unsigned bar, unsigned bytes) {{");
    s.push_str("  asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"(bar), \"r\"(bytes) : \"memory\");\n}\n");
    let _ = writeln!(s, "__device__ __forceinline__ void {name}_wait(unsigned bar, unsigned parity) {{");
    s.push_str("  unsigned done = 0;\n  while (!done)\n");
    s.push_str("    asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n\"\n");
    s.push_str("                 : \"=r\"(done) : \"r\"(bar), \"r\"(parity) : \"memory\");\n}\n");
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void {name}_load(unsigned at, const {name}_map* map, int x, int y, unsigned bar) {{"
    );
    s.push_str("  asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\"\n");
    s.push_str("               :: \"r\"(at), \"l\"(map), \"r\"(x), \"r\"(y), \"r\"(bar) : \"memory\");\n}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_that_do_not_fit_or_do_not_exist_are_refused() {
        assert!(Tile::DEFAULT.valid());
        let tile = |rows, cols, stages, pingpong| Tile {
            rows,
            cols,
            stages,
            in_flight: 1,
            blocks: 0,
            pingpong,
            unroll: 1,
        };
        assert!(tile(128, 256, 3, false).valid());
        assert!(tile(256, 128, 3, false).valid());
        assert!(tile(128, 128, 5, false).valid());
        assert!(tile(128, 128, 4, true).valid());
        assert!(tile(64, 256, 3, true).valid());
        assert!(!tile(256, 128, 4, false).valid(), "266 KiB with the staged product");
        assert!(!tile(128, 128, 6, false).valid(), "just past 227 KiB");
        assert!(!tile(256, 256, 2, false).valid(), "256 accumulators a thread");
        assert!(!tile(256, 128, 2, true).valid(), "256 accumulators a thread");
        assert!(!tile(128, 192, 3, false).valid());
        assert!(!tile(192, 128, 3, false).valid());
        assert!(!tile(258, 128, 3, false).valid());
        assert!(!tile(128, 128, 1, false).valid(), "one buffer");
        assert_eq!(tile(256, 128, 3, false).threads(), 384);
    }
}
