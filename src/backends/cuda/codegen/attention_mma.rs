//! The tensor-core attention kernel, for f16 and bf16 heads whose dims are
//! multiples of 16 (queries and keys) and 8 (values), up to 128: every
//! BERT, GPT and Llama head. Other shapes and f32/f64 take the CUDA-core
//! kernel of `attention.rs`.
//!
//! FlashAttention-2's schedule, written with `kiln::mma_16816` (one
//! warp-wide 16×16 by 16×8 product, f32 accumulation; see `kiln.cuh`):
//!
//! - A block of 4 warps owns 64 query rows of one (batch, head); each warp
//!   owns 16 of them. The block stages its queries through shared memory
//!   once, and each warp keeps its 16×d query tile in registers as `mma`
//!   fragments.
//! - The block walks the keys in tiles of 64 (`attention_tiles.rs`): the
//!   tile's keys and values sit in shared memory row-major, rows padded by
//!   8 elements, double-buffered where they fit, so that `cp.async` brings
//!   the next tile during this one's products. The keys' fragments are
//!   `ldmatrix` loads along their rows, the values' `ldmatrix.trans` down
//!   their columns. (The values were stored transposed, two bytes a store
//!   with 8-way bank conflicts, and every fragment took two 32-bit loads.)
//! - Each warp computes its 16×64 scores with `mma` into registers, masks
//!   them (bounds, causal, bool or additive mask), and updates the online
//!   softmax per row: the row maximum and sum are spread over the 4 lanes
//!   that hold a row and combined with two shuffles. The probabilities,
//!   rounded to the input type, become the A operand of `p · v` without
//!   leaving registers (the score accumulator's layout is the A
//!   fragment's).
//! - The output tile is divided by the row sum once at the end and stored;
//!   a row whose keys are all removed stores zeros. Where the plan reads
//!   it (`extra %attention output=1`), each row's log-sum-exp `ln Σ e^s`
//!   (`+inf` for a row with no key) is stored too, f32, for the
//!   backward's `attention_delta`: the stats kernel of
//!   `attention_grad.rs` would recompute every score to find it.
//! - NaN propagates without a test of its own: the row maximum skips a
//!   NaN score (`>` and `fmaxf` do), but its `exp2f(NaN - base)` is NaN,
//!   and so are the row sum and the row. Unlike the CUDA-core and CPU
//!   kernels, a removed key inside a tile still meets `mma` with weight 0,
//!   so a NaN or inf *value* of a removed key may reach its row (`0 · NaN`,
//!   as in PyTorch's math path; not specified, see `attention/mod.rs`).
//!
//! Scores are scaled by `scale · log2(e)` so that the softmax runs on
//! `exp2`. Global loads are 16 bytes wide where an operand's head dim is
//! contiguous and its other strides are multiples of 8 (heads of a
//! projection, permuted or not); otherwise element by element.

use super::attention::Spec;
use super::attention_tiles::{
    self as tiles, mma_columns, mma_rows, tile_load, tile_loop, Tile, PAD, THREADS, TILE,
};
use super::{types, Kernel};
use crate::ir::{AttnMask, DType};
use std::fmt::Write;

/// Query rows of a block (16 per warp): the queries are staged through
/// the first tile of `ks`, so a block's rows are one tile.
const ROWS: usize = TILE;
/// Keys per tile: the tile loop's step.
const KEYS: usize = TILE;
/// The largest head dim the kernel keeps in registers.
pub(crate) const MAX_MMA_HEAD_DIM: usize = 128;

/// Whether the tensor-core kernel takes `spec`.
pub(crate) fn applies(spec: &Spec) -> bool {
    matches!(spec.dtype, DType::F16 | DType::BF16)
        && spec.d % 16 == 0
        && spec.dv % 8 == 0
        && (16..=MAX_MMA_HEAD_DIM).contains(&spec.d)
        && (8..=MAX_MMA_HEAD_DIM).contains(&spec.dv)
}

/// The kernel for `spec` (which [`applies`]); with `lse`, it also writes
/// each row's log-sum-exp (an f32 `[b, h, sq]` parameter after `out`).
pub(crate) fn flash_mma(name: &str, spec: &Spec, lse: bool) -> Kernel {
    let Spec { dtype, batch, heads, sq, sk, d, dv, .. } = *spec;
    let qblocks = sq.div_ceil(ROWS).max(1);
    let grid = (batch * heads * qblocks).max(1);
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let (kst, vst) = (d + PAD, dv + PAD);
    let log2e = std::f64::consts::LOG2_E;
    let mut s =
        if lse { spec.flash_head_with(name, &["float* __restrict__ lse"]) } else { spec.flash_head(name) };
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n");
    s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
    // Keys (and, before the first tile, the queries: ROWS == KEYS) and
    // values, both row-major, double-buffered where they fit.
    let tiles = [
        Tile { smem: "ks", x: "k", strided: &spec.k, n: d, len: None },
        Tile { smem: "vs", x: "v", strided: &spec.v, n: dv, len: None },
    ];
    let pipelined = tiles::pipelined(&tiles, 0);
    let shared = tiles::declare(&mut s, &tiles, pipelined, 0);
    s.push_str("  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;\n");
    // Causal: the last query blocks walk the most keys; they run first
    // across every head, so the short ones fill in behind them.
    if spec.causal {
        let bhs = (spec.batch * heads).max(1);
        let _ = writeln!(
            s,
            "  const I qb = {} - (I)blockIdx.x / {bhs}, bh = (I)blockIdx.x % {bhs};",
            qblocks - 1
        );
    } else {
        let _ = writeln!(s, "  const I qb = (I)blockIdx.x % {qblocks}, bh = (I)blockIdx.x / {qblocks};");
    }
    let _ = writeln!(s, "  const I b = bh / {heads}, h = bh % {heads};", heads = heads.max(1));
    let _ = writeln!(s, "  const I i0 = qb * {ROWS};");
    // This thread's two rows of the scores and the output.
    s.push_str("  const int r0 = w * 16 + g;\n  const int ia = (int)i0 + r0, ib = ia + 8;\n");

    // Queries: staged through `ks`, then held as A fragments.
    tile_load(&mut s, "q", &spec.q, d, "i0", sq, "ks", "0");
    s.push_str("  __syncthreads();\n");
    let _ = writeln!(s, "  U qf[{}][4];", d / 16);
    let _ = writeln!(s, "  #pragma unroll\n  for (int kk = 0; kk < {}; ++kk) {{", d / 16);
    for (x, row, col) in [(0, "r0", "0"), (1, "r0 + 8", "0"), (2, "r0", "8"), (3, "r0 + 8", "8")] {
        let _ = writeln!(s, "    qf[kk][{x}] = *(const U*)&ks[({row}) * {kst} + kk * 16 + {col} + 2 * c];");
    }
    s.push_str("  }\n");
    let _ = writeln!(s, "  float o[{}][4];", dv / 8);
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int n = 0; n < {}; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;",
        dv / 8
    );
    s.push_str("  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};\n");
    let end =
        if spec.causal { format!("i0 + {ROWS} < {sk} ? i0 + {ROWS} : (I){sk}") } else { format!("(I){sk}") };
    let _ = writeln!(s, "  const I kend = {end};");
    // The loop body, built apart and handed to the tile loop.
    let s_outer = std::mem::take(&mut s);
    // Scores: sc[n] is keys j0 + 8n .. j0 + 8n + 7.
    let _ = writeln!(s, "    float sc[{}][4];", KEYS / 8);
    mma_rows(&mut s, "sc", "qf", KEYS / 8, d / 16, "ks + ks_o", kst, &tag);

    // Masks, the scale, and each row's tile maximum. Rows past the end
    // compute from zero queries and are never stored, so only keys are
    // checked; a tile wholly inside the keys (and, causal, wholly at or
    // below the block's first row) and without a mask skips the checks.
    s.push_str("    float mx[2] = {NEG_INF, NEG_INF};\n");
    let scale = format!("{:?}f", (spec.scale * log2e) as f32);
    let mut removed = format!("j >= {sk}");
    if spec.causal {
        removed.push_str(" || j > i");
    }
    let mut check = String::new();
    let mut score = format!("sc[n][e] * {scale}");
    if let Some(mk) = &spec.m {
        let at = format!("mask[{}]", mk.at("b", "h", "i", "j"));
        let outside = format!("j >= {sk} || i >= {sq}");
        match spec.mask {
            AttnMask::Keep => {
                let _ = writeln!(check, "const bool keep = ({outside}) ? false : {at};");
                removed = if spec.causal { "!keep || j > i".into() } else { "!keep".into() };
            }
            AttnMask::Additive => {
                let _ = writeln!(
                    check,
                    "const float add = ({outside}) ? 0.f : (float){};",
                    types::load(spec.mask_dtype, &at)
                );
                let _ = write!(score, " + add * {:?}f", log2e as f32);
            }
            AttnMask::None => {}
        }
    }
    let _ = writeln!(check, "sc[n][e] = ({removed}) ? NEG_INF : {score};");
    let walk = |s: &mut String, body: &str, ind: &str| {
        let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int n = 0; n < {}; ++n) {{", KEYS / 8);
        let _ = writeln!(s, "{ind}  #pragma unroll\n{ind}  for (int e = 0; e < 4; ++e) {{");
        for line in body.lines() {
            let _ = writeln!(s, "{ind}    {line}");
        }
        let _ = writeln!(
            s,
            "{ind}    mx[e / 2] = sc[n][e] > mx[e / 2] ? sc[n][e] : mx[e / 2];\n{ind}  }}\n{ind}}}"
        );
    };
    let checked = format!("const int i = e < 2 ? ia : ib, j = (int)j0 + n * 8 + 2 * c + (e & 1);\n{check}");
    if spec.m.is_some() {
        walk(&mut s, &checked, "    ");
    } else {
        let mut edge = format!("j0 + {KEYS} > {sk}");
        if spec.causal {
            let _ = write!(edge, " || j0 + {} > i0", KEYS - 1);
        }
        let _ = writeln!(s, "    if ({edge}) {{");
        walk(&mut s, &checked, "      ");
        s.push_str("    } else {\n");
        walk(&mut s, &format!("sc[n][e] *= {scale};"), "      ");
        s.push_str("    }\n");
    }
    // The online softmax, per row: the 4 lanes of a row share its maximum.
    s.push_str("    float base[2];\n");
    s.push_str("    #pragma unroll\n    for (int r = 0; r < 2; ++r) {\n");
    s.push_str("      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));\n");
    s.push_str("      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));\n");
    s.push_str("      const float mn = m[r] > mx[r] ? m[r] : mx[r];\n");
    // A row with no key yet keeps corr = 1 and exponent base 0 (its scores
    // are all -inf, so every p is 0).
    s.push_str("      const float corr = mn == NEG_INF ? 1.f : exp2f(m[r] - mn);\n");
    s.push_str("      base[r] = mn == NEG_INF ? 0.f : mn;\n      m[r] = mn;\n      l[r] *= corr;\n");
    let _ = writeln!(
        s,
        "      #pragma unroll\n      for (int n = 0; n < {}; ++n) {{ o[n][2 * r] *= corr; o[n][2 * r + 1] *= corr; }}\n    }}",
        dv / 8
    );
    let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n) {{", KEYS / 8);
    s.push_str("      #pragma unroll\n      for (int e = 0; e < 4; ++e) {\n");
    s.push_str(
        "        sc[n][e] = exp2f(sc[n][e] - base[e / 2]);\n        l[e / 2] += sc[n][e];\n      }\n    }\n",
    );
    // p · v: the scores of keys 16kk .. 16kk + 15 are the A fragment.
    mma_columns(&mut s, "o", "sc", dv / 8, "vs + vs_o", vst, &tag);
    let body = std::mem::replace(&mut s, s_outer);
    tile_loop(&mut s, "j0", ("0", "kend"), sk, &tiles, pipelined, |_, _, _| {}, |s| s.push_str(&body));

    // The row sums, combined over a row's 4 lanes; the output, in pairs.
    s.push_str("  #pragma unroll\n  for (int r = 0; r < 2; ++r) {\n");
    s.push_str("    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);\n");
    s.push_str("    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);\n");
    if lse {
        // As the stats kernel computes it: ln 2 · (m + log2 l), m in log2 units.
        let _ = writeln!(s, "    const int i = r == 0 ? ia : ib;\n    if (c == 0 && i < {sq})");
        let _ = writeln!(
            s,
            "      lse[bh * {sq} + i] = m[r] == NEG_INF ? __int_as_float(0x7f800000) : (m[r] + log2f(l[r])) * {:?}f;",
            std::f64::consts::LN_2 as f32
        );
    }
    s.push_str("    l[r] = l[r] == 0.f ? 0.f : 1.f / l[r];\n  }\n");
    let _ = writeln!(s, "  #pragma unroll\n  for (int n = 0; n < {}; ++n) {{", dv / 8);
    s.push_str("    #pragma unroll\n    for (int r = 0; r < 2; ++r) {\n");
    let _ = writeln!(s, "      const int i = r == 0 ? ia : ib;\n      if (i >= {sq}) continue;");
    let _ = writeln!(
        s,
        "      *(U*)&out[(bh * {sq} + i) * {dv} + n * 8 + 2 * c] = kiln::pack2(o[n][2 * r] * l[r], o[n][2 * r + 1] * l[r], {tag});"
    );
    s.push_str("    }\n  }\n}\n");
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.flash_reads()).with_shared(shared)
}
