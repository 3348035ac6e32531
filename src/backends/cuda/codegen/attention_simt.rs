//! The register-tiled CUDA-core attention kernel, for f32 heads whose dims
//! are multiples of 16 up to 64 (GPT-2's, BERT's and MiniLM's): f32 has no
//! tensor cores without TF32, so this is FlashAttention-2's schedule on
//! FMA units, tiled as a SIMT GEMM is.
//!
//! - A block of 128 threads owns 32 query rows of one (batch, head) and
//!   stages them in shared memory once. It walks the keys in tiles of 32:
//!   keys (row-major) and values into shared memory, rows of keys and
//!   queries padded by 4 floats (a row stride of 4 modulo 32 banks, so the
//!   8 lanes of a quarter-warp reading 8 different keys' 16-byte pieces
//!   hit 8 different bank groups).
//! - Thread `t` computes a 4 × 2 block of the scores (rows `4 (t / 16) +
//!   a`, keys `t % 16 + 16 e`) from 16-byte loads of both operands: 8 FMAs
//!   per query load and 4 per key load, where the one-row kernel
//!   (`attention.rs`) did 4 per load.
//! - The online softmax per row: a row's 32 scores lie in the 16 lanes of
//!   a half-warp, whose maximum comes from 4 shuffles; each lane keeps a
//!   partial row sum (the rescales are the same for all of a row's lanes),
//!   added with shuffles at the end.
//! - The probabilities go through shared memory (`[key][row]`, so `p · v`
//!   reads a key's 4 rows in one load) and each thread accumulates a 4 ×
//!   `dv / 16` block of the output (columns `t % 16 + 16 u`: a warp's
//!   loads of a value row and its stores of an output row are contiguous).
//!
//! - Split keys: when a shape has too few blocks to fill the card (a
//!   prefill of one prompt: GPT-2's 512 tokens are 12 heads × 16 blocks,
//!   192 blocks of 4 warps on 132 SMs, and a causal block walks up to 16
//!   tiles in a row), each block's key tiles are split over [`splits`]
//!   blocks. Each writes its rows' partial maximum, sum and unnormalized
//!   output to a workspace, and the last of them to arrive (an arrival
//!   counter per query block) merges them in split order, as the decode
//!   kernel (`attention_decode.rs`) merges its chunks. The longest serial
//!   chain falls from 16 tiles to 4, and the card holds 2.5 times the warps.
//!
//! Semantics are the one-row kernel's (NaN wins the row maximum, a row
//! whose keys are all removed is zeros, `+inf` scores give NaN rows),
//! except that a removed key inside a tile meets `p · v` with `p = 0`, so
//! a NaN or inf *value* of a removed key may reach its row, as in the
//! tensor-core kernel (not specified; see `tests/ops/attention_nonfinite.rs`).
//! Keys past the end are loaded as zeros.

use super::attention::{Spec, Strided};
use super::{types, Kernel};
use crate::ir::{AttnMask, DType};
use std::fmt::Write;

/// Query rows of a block.
const ROWS: usize = 32;
/// Keys per tile.
const KEYS: usize = 32;
/// Threads of a block: 8 groups of 4 rows, 16 lanes a row group.
const THREADS: usize = 128;
/// Padding of a query or key row in shared memory, in floats.
const PAD: usize = 4;

/// Blocks in flight that fill an H100 (132 SMs, a few 4-warp blocks
/// each): below it, a block's keys are split.
const FILL: usize = 4 * 132;
/// Key tiles a split block walks at least, so that its partials and the
/// merge stay a small part of its work.
const MIN_TILES: usize = 4;

/// Whether this kernel takes `spec`.
pub(crate) fn applies(spec: &Spec) -> bool {
    let fits = |n: usize| n % 16 == 0 && (16..=64).contains(&n);
    spec.dtype == DType::F32 && fits(spec.d) && fits(spec.dv)
}

/// Whether [`flash`](super::attention::flash) picks this kernel for `spec`.
pub(crate) fn uses(spec: &Spec) -> bool {
    applies(spec) && !super::attention_mma::applies(spec) && !super::attention_tf32::applies(spec)
}

/// Query blocks of `spec`.
fn query_blocks(spec: &Spec) -> usize {
    spec.sq.div_ceil(ROWS).max(1)
}

/// The blocks each query block's key tiles are split over: 1 when the
/// unsplit grid fills the card or the keys are few, else enough to fill
/// it, each split keeping at least [`MIN_TILES`] tiles of the longest
/// block (`KILN_CUDA_ATTENTION_SPLIT=n` forces `n`, for tests and
/// measurements).
pub(crate) fn splits(spec: &Spec) -> usize {
    let blocks = spec.batch * spec.heads * query_blocks(spec);
    let tiles = spec.sk.div_ceil(KEYS);
    if let Some(n) = std::env::var("KILN_CUDA_ATTENTION_SPLIT").ok().and_then(|v| v.parse::<usize>().ok()) {
        return n.clamp(1, tiles.max(1));
    }
    if blocks == 0 || blocks >= FILL {
        return 1;
    }
    FILL.div_ceil(blocks).min(tiles / MIN_TILES).max(1)
}

/// Arrival counters of a split kernel: one per query block.
pub(crate) fn counters(spec: &Spec) -> usize {
    spec.batch * spec.heads * query_blocks(spec)
}

/// Workspace bytes of a split kernel: per (query row, split) the row's
/// maximum, sum and `dv` unnormalized output sums, in f32.
pub(crate) fn workspace_bytes(spec: &Spec) -> u64 {
    let rows = counters(spec) * ROWS;
    (rows * splits(spec) * (spec.dv + 2) * 4) as u64
}

/// Whether an operand's rows of `n` floats can be read 4 at a time (16
/// bytes, aligned: buffers are 256-byte aligned).
fn vectorized(x: &Strided, n: usize) -> bool {
    x.strides[3] == 1 && n % 4 == 0 && x.offset % 4 == 0 && x.strides[..3].iter().all(|s| s % 4 == 0)
}

/// The kernel for `spec` (which [`applies`]).
pub(crate) fn flash_simt(name: &str, spec: &Spec) -> Kernel {
    let Spec { batch, heads, sq, sk, d, dv, .. } = *spec;
    let qblocks = query_blocks(spec);
    let split = splits(spec);
    let grid = (batch * heads * qblocks * split).max(1);
    let (qst, kst, pst) = (d + PAD, d + PAD, ROWS + PAD);
    let cols = dv / 16;
    // A split kernel's workspace and arrival counters come right after `out`.
    let mut s = if split > 1 {
        spec.flash_head_with(name, &["float* ws", "unsigned* counts"])
    } else {
        spec.flash_head(name)
    };
    s.push_str("  typedef long long I;\n  typedef kiln::vec4<float> V4;\n");
    s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
    let _ = writeln!(s, "  __align__(16) __shared__ float qs[{}];", ROWS * qst);
    let _ = writeln!(s, "  __align__(16) __shared__ float ks[{}];", KEYS * kst);
    let _ = writeln!(s, "  __align__(16) __shared__ float vs[{}];", KEYS * dv);
    let _ = writeln!(s, "  __align__(16) __shared__ float ps[{}];", KEYS * pst);
    s.push_str("  const int t = threadIdx.x, ry = t / 16, kx = t % 16;\n");
    // The last query blocks of a causal attention walk the most keys:
    // they go first, so the short ones fill in behind them.
    // Block = ((b * heads + h) * qblocks + (qblocks - 1 - qb)) * split + sp.
    if split > 1 {
        let _ = writeln!(s, "  const I sp = (I)blockIdx.x % {split}, cb = (I)blockIdx.x / {split};");
        let _ = writeln!(s, "  const I qb = {} - cb % {qblocks}, bh = cb / {qblocks};", qblocks - 1);
    } else {
        let _ = writeln!(
            s,
            "  const I qb = {} - (I)blockIdx.x % {qblocks}, bh = (I)blockIdx.x / {qblocks};",
            qblocks - 1
        );
    }
    let _ = writeln!(s, "  const I b = bh / {heads}, h = bh % {heads};", heads = heads.max(1));
    let _ = writeln!(s, "  const I i0 = qb * {ROWS};");
    tile_load(&mut s, "q", &spec.q, d, "i0", sq, "qs", qst);
    let _ = writeln!(s, "  float o[4][{cols}], m[4], l[4];");
    s.push_str("  #pragma unroll\n  for (int a = 0; a < 4; ++a) {\n    m[a] = NEG_INF; l[a] = 0.f;\n");
    let _ = writeln!(s, "    #pragma unroll\n    for (int u = 0; u < {cols}; ++u) o[a][u] = 0.f;\n  }}");
    let end =
        if spec.causal { format!("i0 + {ROWS} < {sk} ? i0 + {ROWS} : (I){sk}") } else { format!("(I){sk}") };
    let _ = writeln!(s, "  const I kend = {end};");
    if split > 1 {
        // This block's share of the tiles: [t0, t1) of the query block's.
        let _ = writeln!(s, "  const I tiles = (kend + {}) / {KEYS};", KEYS - 1);
        let _ = writeln!(s, "  const I t0 = sp * tiles / {split}, t1 = (sp + 1) * tiles / {split};");
        let _ = writeln!(s, "  for (I j0 = t0 * {KEYS}; j0 < t1 * {KEYS}; j0 += {KEYS}) {{");
    } else {
        let _ = writeln!(s, "  for (I j0 = 0; j0 < kend; j0 += {KEYS}) {{");
    }
    s.push_str("    __syncthreads();  // the previous tile's readers are done\n");
    let mut tiles = String::new();
    tile_load(&mut tiles, "k", &spec.k, d, "j0", sk, "ks", kst);
    tile_load(&mut tiles, "v", &spec.v, dv, "j0", sk, "vs", dv);
    for line in tiles.lines() {
        let _ = writeln!(s, "  {line}");
    }
    s.push_str("    __syncthreads();\n");

    // Scores: sc[a][e] is row 4 ry + a, key kx + 16 e.
    s.push_str("    float sc[4][2] = {{0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}};\n");
    let _ = writeln!(s, "    #pragma unroll 4\n    for (int c = 0; c < {d}; c += 4) {{");
    let _ = writeln!(s, "      const V4 k0 = *(const V4*)&ks[kx * {kst} + c];");
    let _ = writeln!(s, "      const V4 k1 = *(const V4*)&ks[(kx + 16) * {kst} + c];");
    s.push_str("      #pragma unroll\n      for (int a = 0; a < 4; ++a) {\n");
    let _ = writeln!(s, "        const V4 qv = *(const V4*)&qs[(ry * 4 + a) * {qst} + c];");
    s.push_str("        sc[a][0] += qv.v[0] * k0.v[0] + qv.v[1] * k0.v[1] + qv.v[2] * k0.v[2] + qv.v[3] * k0.v[3];\n");
    s.push_str("        sc[a][1] += qv.v[0] * k1.v[0] + qv.v[1] * k1.v[1] + qv.v[2] * k1.v[2] + qv.v[3] * k1.v[3];\n");
    s.push_str("      }\n    }\n");

    // Masks and the scale; then each row's tile maximum (NaN wins).
    let mut removed = format!("j >= {sk}");
    if spec.causal {
        removed.push_str(" || j > i");
    }
    let mut score = format!("sc[a][e] * (float){:?}", spec.scale);
    s.push_str("    float mx[4];\n");
    s.push_str("    #pragma unroll\n    for (int a = 0; a < 4; ++a) {\n      mx[a] = NEG_INF;\n");
    s.push_str("      #pragma unroll\n      for (int e = 0; e < 2; ++e) {\n");
    s.push_str("        const I i = i0 + ry * 4 + a, j = j0 + kx + 16 * e;\n");
    if let Some(mk) = &spec.m {
        let at = format!("mask[{}]", mk.at("b", "h", "i", "j"));
        let outside = format!("j >= {sk} || i >= {sq}");
        match spec.mask {
            AttnMask::Keep => {
                let _ = writeln!(s, "        const bool keep = ({outside}) ? false : {at};");
                removed = if spec.causal { "!keep || j > i".into() } else { "!keep".into() };
            }
            AttnMask::Additive => {
                let _ = writeln!(
                    s,
                    "        const float add = ({outside}) ? 0.f : (float){};",
                    types::load(spec.mask_dtype, &at)
                );
                score.push_str(" + add");
            }
            AttnMask::None => {}
        }
    }
    let _ = writeln!(s, "        sc[a][e] = ({removed}) ? NEG_INF : {score};");
    s.push_str("        mx[a] = (sc[a][e] > mx[a] || sc[a][e] != sc[a][e]) ? sc[a][e] : mx[a];\n      }\n");
    for off in [8, 4, 2, 1] {
        let _ = writeln!(s, "      {{ const float x = __shfl_xor_sync(0xffffffffu, mx[a], {off});");
        s.push_str("        mx[a] = (x > mx[a] || x != x) ? x : mx[a]; }\n");
    }
    // The online softmax: one rescale per row and tile (to NaN too), the
    // probabilities into shared memory.
    s.push_str("      if (mx[a] != NEG_INF) {\n");
    s.push_str("        const float mn = (mx[a] > m[a] || mx[a] != mx[a]) ? mx[a] : m[a];\n");
    s.push_str("        const float corr = expf(m[a] - mn);\n        m[a] = mn;\n        l[a] *= corr;\n");
    let _ = writeln!(
        s,
        "        #pragma unroll\n        for (int u = 0; u < {cols}; ++u) o[a][u] *= corr;\n      }}"
    );
    s.push_str("      #pragma unroll\n      for (int e = 0; e < 2; ++e) {\n");
    s.push_str("        const float pr = sc[a][e] == NEG_INF ? 0.f : expf(sc[a][e] - m[a]);\n");
    let _ = writeln!(
        s,
        "        l[a] += pr;\n        ps[(kx + 16 * e) * {pst} + ry * 4 + a] = pr;\n      }}\n    }}"
    );
    s.push_str("    __syncthreads();\n");
    // p · v: a key's 4 probabilities of this thread's rows in one load.
    let _ = writeln!(s, "    #pragma unroll 4\n    for (int r = 0; r < {KEYS}; ++r) {{");
    let _ = writeln!(s, "      const V4 pv = *(const V4*)&ps[r * {pst} + ry * 4];");
    let _ = writeln!(s, "      #pragma unroll\n      for (int u = 0; u < {cols}; ++u) {{");
    let _ = writeln!(s, "        const float x = vs[r * {dv} + kx + 16 * u];");
    s.push_str("        o[0][u] += pv.v[0] * x; o[1][u] += pv.v[1] * x; o[2][u] += pv.v[2] * x; o[3][u] += pv.v[3] * x;\n");
    s.push_str("      }\n    }\n  }\n");

    // Each row's sum over its 16 lanes; the rows this block owns.
    s.push_str("  #pragma unroll\n  for (int a = 0; a < 4; ++a) {\n");
    for off in [8, 4, 2, 1] {
        let _ = writeln!(s, "    l[a] += __shfl_xor_sync(0xffffffffu, l[a], {off});");
    }
    s.push_str("    const I i = i0 + ry * 4 + a;\n");
    let _ = writeln!(s, "    if (i >= {sq}) continue;");
    if split == 1 {
        s.push_str("    const float inv = l[a] == 0.f ? 0.f : 1.f / l[a];\n");
        let _ = writeln!(s, "    #pragma unroll\n    for (int u = 0; u < {cols}; ++u)");
        let row = spec.out_row("bh", "i");
        let _ = writeln!(s, "      out[{row} + kx + 16 * u] = o[a][u] * inv;\n  }}\n}}");
        return Kernel::new(name, s, grid as u32, THREADS as u32, spec.flash_reads());
    }
    // Split: the partials of (row, sp) are [max, sum, o_0 .. o_dv) at
    // ws + ((cb * ROWS + r) * split + sp) * (dv + 2).
    let w = dv + 2;
    let _ = writeln!(s, "    float* p = ws + ((cb * {ROWS} + ry * 4 + a) * {split} + sp) * {w};");
    s.push_str("    if (kx == 0) { p[0] = m[a]; p[1] = l[a]; }\n");
    let _ = writeln!(
        s,
        "    #pragma unroll\n    for (int u = 0; u < {cols}; ++u) p[2 + kx + 16 * u] = o[a][u];\n  }}"
    );
    merge(&mut s, spec, split);
    s.push_str("}\n");
    Kernel::new(name, s, grid as u32, THREADS as u32, Vec::new())
}

/// The end of a split kernel: the last block of a query block to arrive
/// merges each row's splits from the workspace, `out = Σ e^(m_s - M) o_s /
/// Σ e^(m_s - M) l_s` in split order (so the result does not depend on
/// which block came last; a split with no key of the row has `m = -inf`
/// and is skipped, a NaN maximum makes the row NaN), and sets the counter
/// back to zero.
fn merge(s: &mut String, spec: &Spec, split: usize) {
    let Spec { sq, dv, .. } = *spec;
    let w = dv + 2;
    super::last_to_arrive(s, "t", "counts[cb]", split);
    let _ = writeln!(s, "  for (int e = t; e < {}; e += {THREADS}) {{", ROWS * dv);
    let _ = writeln!(s, "    const int r = e / {dv}, c = e % {dv};\n    const I i = i0 + r;");
    let _ = writeln!(s, "    if (i >= {sq}) continue;");
    let _ = writeln!(s, "    const float* p = ws + (cb * {ROWS} + r) * {};", split * w);
    super::merge_partials(s, "    ", "float", (split, w), "expf", true);
    let _ = writeln!(s, "    out[{} + c] = o * inv;\n  }}", spec.out_row("bh", "i"));
    s.push_str("  if (t == 0) counts[cb] = 0u;\n");
}

/// Code that loads rows `start .. start + 32` (zeros past `len`) of
/// operand `x` (`n` floats each) into shared array `dst` at row stride
/// `stride`, 16 bytes at a time where the operand allows.
#[allow(clippy::too_many_arguments)]
fn tile_load(
    s: &mut String,
    x: &str,
    strided: &Strided,
    n: usize,
    start: &str,
    len: usize,
    dst: &str,
    stride: usize,
) {
    if vectorized(strided, n) {
        let per = n / 4;
        let _ = writeln!(s, "  #pragma unroll\n  for (int e = t; e < {}; e += {THREADS}) {{", ROWS * per);
        let _ = writeln!(s, "    const int r = e / {per}, c4 = e % {per} * 4;\n    const I j = {start} + r;");
        s.push_str("    V4 x4 = {};\n");
        let _ =
            writeln!(s, "    if (j < {len}) x4 = kiln::load4(&{x}[{}]);", strided.at("b", "h", "j", "c4"));
        let _ = writeln!(s, "    *(V4*)&{dst}[r * {stride} + c4] = x4;\n  }}");
    } else {
        let _ = writeln!(s, "  for (int e = t; e < {}; e += {THREADS}) {{", ROWS * n);
        let _ = writeln!(s, "    const int r = e / {n}, cc = e % {n};\n    const I j = {start} + r;");
        let _ = writeln!(
            s,
            "    {dst}[r * {stride} + cc] = j < {len} ? {x}[{}] : 0.f;\n  }}",
            strided.at("b", "h", "j", "cc")
        );
    }
}
