//! The tensor-core attention kernel, for f16 and bf16 heads whose dims are
//! multiples of 16 (queries and keys) and 8 (values), up to 128: every
//! BERT, GPT and Llama head. Other shapes and f32/f64 take the CUDA-core
//! kernel of `attention.rs`.
//!
//! FlashAttention-2's schedule, written with `kiln::mma_16816` (one
//! warp-wide 16×16 by 16×8 product, f32 accumulation; see `kiln_mma.cuh`):
//!
//! - A block of 4 warps owns 128 query rows of one (batch, head) where
//!   the head dims are at most 64 and the tiles are double-buffered: each
//!   warp owns two query tiles of 16 rows, so every key or value fragment
//!   it reads from shared memory feeds two products (with one tile a
//!   warp, shared memory could not feed the tensor cores). Elsewhere a
//!   block owns 64 rows, 16 a warp. The block stages its queries through
//!   shared memory once, and each warp keeps its query tiles in registers
//!   as `mma` fragments. Wider heads (up to 128) with more than 64 queries
//!   take the *split* schedule ([`split_schedule`]): two query tiles a
//!   warp too, their fragments left in shared memory and read a k-step
//!   at a time, one buffer of keys and one of values, the values' copies
//!   in flight during the scores and the next keys' during `p · v`.
//! - The block walks the keys in tiles of 64 (`attention_tiles.rs`): the
//!   tile's keys and values sit in shared memory row-major, rows padded by
//!   8 elements, double-buffered where they fit, so that `cp.async` brings
//!   the next tile during this one's products. The keys' fragments are
//!   `ldmatrix` loads along their rows, the values' `ldmatrix.trans` down
//!   their columns. (The values were stored transposed, two bytes a store
//!   with 8-way bank conflicts, and every fragment took two 32-bit loads.)
//! - Each warp computes each query tile's 16×64 scores with `mma` into registers, masks
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
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let (kst, vst) = (d + PAD, dv + PAD);
    let mut s =
        if lse { spec.flash_head_with(name, &["float* __restrict__ lse"]) } else { spec.flash_head(name) };
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n");
    s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
    // Keys (and, before the first tile, the queries) and values, both
    // row-major, double-buffered where they fit.
    let tiles = [
        Tile { smem: "ks", x: "k", strided: &spec.k, n: d, len: None },
        Tile { smem: "vs", x: "v", strided: &spec.v, n: dv, len: None },
    ];
    let pipelined = tiles::pipelined(&tiles, 0);
    let split = split_schedule(spec);
    let qt = if split { 2 } else { query_tiles(spec, pipelined) };
    let rows = 64 * qt;
    let qblocks = sq.div_ceil(rows).max(1);
    let grid = (batch * heads * qblocks).max(1);
    let shared = if split {
        // Queries, then one tile of keys and one of values.
        let (q_elems, k_elems) = (rows * kst, TILE * kst);
        let total = q_elems + k_elems + TILE * vst;
        let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, tiles_smem, {total});");
        let _ = writeln!(s, "  unsigned short* const qs = tiles_smem;");
        let _ = writeln!(s, "  unsigned short* const ks = tiles_smem + {q_elems};");
        let _ = writeln!(s, "  unsigned short* const vs = tiles_smem + {};", q_elems + k_elems);
        2 * total
    } else {
        tiles::declare(&mut s, &tiles, pipelined, 0)
    };
    s.push_str("  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;\n");
    spec.query_block(&mut s, qblocks, rows);
    // This thread's two rows of each query tile's scores and output:
    // tile tq's are ia[tq] and ib[tq] = ia[tq] + 8.
    let r0 = if qt > 1 { "r0[tq]" } else { "r0" };
    if qt > 1 {
        let _ = writeln!(s, "  int r0[{qt}], ia[{qt}], ib[{qt}];");
        let _ = writeln!(s, "  #pragma unroll\n  for (int tq = 0; tq < {qt}; ++tq) {{");
        let _ = writeln!(
            s,
            "    r0[tq] = w * {} + tq * 16 + g;\n    ia[tq] = (int)i0 + r0[tq];\n    ib[tq] = ia[tq] + 8;\n  }}",
            16 * qt
        );
    } else {
        s.push_str("  const int r0 = w * 16 + g;\n  const int ia = (int)i0 + r0, ib = ia + 8;\n");
    }

    // Queries: staged through `ks` (both buffers for two query tiles a
    // warp), then held as A fragments; or, split, kept in `qs`.
    for part in 0..qt {
        let (start, at) = (format!("i0 + {}", 64 * part), format!("{}", part * TILE * kst));
        let (start, at) = if part == 0 { ("i0".to_string(), "0".to_string()) } else { (start, at) };
        tile_load(&mut s, "q", &spec.q, d, &start, sq, if split { "qs" } else { "ks" }, &at);
    }
    let dims = |inner: String| if qt > 1 { format!("[{qt}]{inner}") } else { inner };
    if split {
        // The first keys' copies start now; the loop waits for them.
        tiles::tile_load_async(&mut s, &tiles[0], "0", sk, "0");
        s.push_str("  kiln::cp_async_commit();\n");
    } else {
        s.push_str("  __syncthreads();\n");
        let _ = writeln!(s, "  U qf{};", dims(format!("[{}][4]", d / 16)));
        let qf = if qt > 1 { "qf[tq]" } else { "qf" };
        let mut frag = String::new();
        let _ = writeln!(frag, "#pragma unroll\nfor (int kk = 0; kk < {}; ++kk) {{", d / 16);
        for (x, row, col) in [(0, "", "0"), (1, " + 8", "0"), (2, "", "8"), (3, " + 8", "8")] {
            let _ = writeln!(
                frag,
                "  {qf}[kk][{x}] = *(const U*)&ks[({r0}{row}) * {kst} + kk * 16 + {col} + 2 * c];"
            );
        }
        frag.push_str("}\n");
        tiles::each_tile(&mut s, "  ", qt, &frag);
    }
    let o = if qt > 1 { "o[tq]" } else { "o" };
    let _ = writeln!(s, "  float o{};", dims(format!("[{}][4]", dv / 8)));
    tiles::each_tile(
        &mut s,
        "  ",
        qt,
        &format!(
            "#pragma unroll\nfor (int n = 0; n < {}; ++n) {o}[n][0] = {o}[n][1] = {o}[n][2] = {o}[n][3] = 0.f;\n",
            dv / 8
        ),
    );
    // Running maximum and sum of each of the thread's rows: 2qt + r is row r of tile tq.
    let nr = 2 * qt;
    let inits = |x: &str| vec![x; nr].join(", ");
    let _ = writeln!(s, "  float m[{nr}] = {{{}}}, l[{nr}] = {{{}}};", inits("NEG_INF"), inits("0.f"));
    let end =
        if spec.causal { format!("i0 + {rows} < {sk} ? i0 + {rows} : (I){sk}") } else { format!("(I){sk}") };
    let _ = writeln!(s, "  const I kend = {end};");
    // The loop body, built apart and handed to the tile loop.
    let s_outer = std::mem::take(&mut s);
    // Scores: sc[n] is keys j0 + 8n .. j0 + 8n + 7.
    let _ = writeln!(s, "    float sc{};", dims(format!("[{}][4]", KEYS / 8)));
    if split {
        tiles::mma_rows_shared_a(&mut s, "sc", KEYS / 8, d / 16, ("qs", kst), "ks", kst, &tag, qt);
    } else {
        mma_rows(&mut s, "sc", "qf", KEYS / 8, d / 16, "ks + ks_o", kst, &tag, qt);
    }
    online_softmax(&mut s, spec, qt, KEYS);
    let scores = std::mem::take(&mut s);
    // p · v: the scores of keys 16kk .. 16kk + 15 are the A fragment.
    mma_columns(&mut s, "o", "sc", dv / 8, if split { "vs" } else { "vs + vs_o" }, vst, &tag, qt);
    let pv = std::mem::replace(&mut s, s_outer);
    if split {
        split_loop(&mut s, &tiles, sk, &scores, &pv);
    } else {
        let body = format!("{scores}{pv}");
        tile_loop(&mut s, "j0", ("0", "kend"), sk, &tiles, pipelined, |_, _, _| {}, |s| s.push_str(&body));
    }

    // The row sums, combined over a row's 4 lanes; the output, in pairs.
    let rows_of = finish_rows(&mut s, spec, qt, lse);
    store_rows(&mut s, spec, qt, &tag, rows_of);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.flash_reads()).with_shared(shared)
}

/// Declares a warp's running state for one query tile of 16 rows: the
/// output accumulator `o` (`dv / 8` column groups, zeroed) and each of the
/// thread's two rows' maximum `m` and sum `l`. The kernels with one query
/// tile a warp (`attention_tf32.rs`, `attention_wgmma.rs`) open with it.
pub(super) fn one_tile_rows(s: &mut String, dv: usize) {
    let _ = writeln!(s, "  float o[{}][4];", dv / 8);
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int n = 0; n < {}; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;",
        dv / 8
    );
    s.push_str("  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};\n");
}

/// (In the key loop, after a tile's scores `sc[n][e]`, `mma` accumulators
/// of `keys` keys, each warp's `qt` query tiles.) The masks, the scale and
/// the online softmax: each row's tile maximum, the rescale of its running
/// sum `l` and output `o` (`mma` accumulators of `dv / 8` column groups),
/// and the scores made `e^(s - m)`. Shared by the f16/bf16 kernel and the
/// f32 one (`attention_tf32.rs`), whose accumulators have the same layout.
pub(super) fn online_softmax(s: &mut String, spec: &Spec, qt: usize, keys: usize) {
    let Spec { sq, sk, dv, .. } = *spec;
    let log2e = std::f64::consts::LOG2_E;
    let nr = 2 * qt;
    let inits = |x: &str| vec![x; nr].join(", ");
    let (sc, ia, ib) = if qt > 1 { ("sc[tq]", "ia[tq]", "ib[tq]") } else { ("sc", "ia", "ib") };
    // Masks, the scale, and each row's tile maximum. Rows past the end
    // compute from zero queries and are never stored, so only keys are
    // checked; a tile wholly inside the keys (and, causal, wholly at or
    // below the block's first row) and without a mask skips the checks.
    let _ = writeln!(s, "    float mx[{nr}] = {{{}}};", inits("NEG_INF"));
    let scale = format!("{:?}f", (spec.scale * log2e) as f32);
    let mut removed = format!("j >= {sk}");
    if spec.causal {
        removed.push_str(" || j > i");
    }
    let mut check = String::new();
    let mut score = format!("{sc}[n][e] * {scale}");
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
    let _ = writeln!(check, "{sc}[n][e] = ({removed}) ? NEG_INF : {score};");
    let row = if qt > 1 { "2 * tq + e / 2" } else { "e / 2" };
    let walk = |s: &mut String, body: &str, ind: &str| {
        let mut w = String::new();
        let _ = writeln!(w, "#pragma unroll\nfor (int n = 0; n < {}; ++n) {{", keys / 8);
        let _ = writeln!(w, "  #pragma unroll\n  for (int e = 0; e < 4; ++e) {{");
        for line in body.lines() {
            let _ = writeln!(w, "    {line}");
        }
        let _ = writeln!(w, "    mx[{row}] = {sc}[n][e] > mx[{row}] ? {sc}[n][e] : mx[{row}];\n  }}\n}}");
        tiles::each_tile(s, ind, qt, &w);
    };
    let checked =
        format!("const int i = e < 2 ? {ia} : {ib}, j = (int)j0 + n * 8 + 2 * c + (e & 1);\n{check}");
    if spec.m.is_some() {
        walk(s, &checked, "    ");
    } else {
        let mut edge = format!("j0 + {keys} > {sk}");
        if spec.causal {
            let _ = write!(edge, " || j0 + {} > i0", keys - 1);
        }
        let _ = writeln!(s, "    if ({edge}) {{");
        walk(s, &checked, "      ");
        s.push_str("    } else {\n");
        walk(s, &format!("{sc}[n][e] *= {scale};"), "      ");
        s.push_str("    }\n");
    }
    // The online softmax, per row: the 4 lanes of a row share its maximum.
    let _ = writeln!(s, "    float base[{nr}];");
    let _ = writeln!(s, "    #pragma unroll\n    for (int r = 0; r < {nr}; ++r) {{");
    s.push_str("      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));\n");
    s.push_str("      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));\n");
    s.push_str("      const float mn = m[r] > mx[r] ? m[r] : mx[r];\n");
    // A row with no key yet keeps corr = 1 and exponent base 0 (its scores
    // are all -inf, so every p is 0).
    s.push_str("      const float corr = mn == NEG_INF ? 1.f : exp2f(m[r] - mn);\n");
    s.push_str("      base[r] = mn == NEG_INF ? 0.f : mn;\n      m[r] = mn;\n      l[r] *= corr;\n");
    let (oo, rr) = if qt > 1 { ("o[r / 2]", "(r % 2)") } else { ("o", "r") };
    let _ = writeln!(
        s,
        "      #pragma unroll\n      for (int n = 0; n < {}; ++n) {{ {oo}[n][2 * {rr}] *= corr; {oo}[n][2 * {rr} + 1] *= corr; }}\n    }}",
        dv / 8
    );
    let mut exps = String::new();
    let _ = writeln!(exps, "#pragma unroll\nfor (int n = 0; n < {}; ++n) {{", keys / 8);
    exps.push_str("  #pragma unroll\n  for (int e = 0; e < 4; ++e) {\n");
    let _ = writeln!(
        exps,
        "    {sc}[n][e] = exp2f({sc}[n][e] - base[{row}]);\n    l[{row}] += {sc}[n][e];\n  }}\n}}"
    );
    tiles::each_tile(s, "    ", qt, &exps);
}

/// (After the key loop.) Each row's sum combined over the 4 lanes that
/// hold the row, its log-sum-exp stored where `lse`, and `l[r]` made the
/// reciprocal of the sum (0 for a row with no key). Returns the C
/// expressions of row `r`'s query index, its output array and its row
/// within that array, for the kernel's stores.
pub(super) fn finish_rows(
    s: &mut String,
    spec: &Spec,
    qt: usize,
    lse: bool,
) -> (&'static str, &'static str, &'static str) {
    let (sq, nr) = (spec.sq, 2 * qt);
    let (i_of, o_of, r_of) = if qt > 1 {
        ("r % 2 == 0 ? ia[r / 2] : ib[r / 2]", "o[r / 2]", "(r % 2)")
    } else {
        ("r == 0 ? ia : ib", "o", "r")
    };
    let _ = writeln!(s, "  #pragma unroll\n  for (int r = 0; r < {nr}; ++r) {{");
    s.push_str("    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);\n");
    s.push_str("    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);\n");
    if lse {
        // As the stats kernel computes it: ln 2 · (m + log2 l), m in log2 units.
        let _ = writeln!(s, "    const int i = {i_of};\n    if (c == 0 && i < {sq})");
        let _ = writeln!(
            s,
            "      lse[bh * {sq} + i] = m[r] == NEG_INF ? __int_as_float(0x7f800000) : (m[r] + log2f(l[r])) * {:?}f;",
            std::f64::consts::LN_2 as f32
        );
    }
    s.push_str("    l[r] = l[r] == 0.f ? 0.f : 1.f / l[r];\n  }\n");
    (i_of, o_of, r_of)
}

/// (After [`finish_rows`], which returned `rows_of`.) The kernel's end:
/// each output row, normalized, stored two elements (`tag`'s type) at a
/// time.
pub(super) fn store_rows(s: &mut String, spec: &Spec, qt: usize, tag: &str, rows_of: (&str, &str, &str)) {
    let (i_of, o_of, r_of) = rows_of;
    let _ = writeln!(s, "  #pragma unroll\n  for (int n = 0; n < {}; ++n) {{", spec.dv / 8);
    let _ = writeln!(s, "    #pragma unroll\n    for (int r = 0; r < {}; ++r) {{", 2 * qt);
    let _ = writeln!(s, "      const int i = {i_of};\n      if (i >= {}) continue;", spec.sq);
    let row = spec.out_row("bh", "i");
    let _ = writeln!(
        s,
        "      *(U*)&out[{row} + n * 8 + 2 * c] = kiln::pack2({o_of}[n][2 * {r_of}] * l[r], {o_of}[n][2 * {r_of} + 1] * l[r], {tag});"
    );
    s.push_str("    }\n  }\n}\n");
}

/// Whether `spec` takes the split schedule: heads wider than 64 (two
/// tiles of query fragments would not fit the registers beside the
/// scores and the output), more than 64 queries, keys and values read 16
/// bytes at a time, and the queries of two tiles a warp plus one tile of
/// keys and one of values within the shared memory a block may have.
/// The queries stay in shared memory, and the loop issues the values'
/// copies before the scores and the next keys' before `p · v`
/// (FlashAttention-2's order): each load hides under the other product,
/// with one buffer of each (both double-buffered beside the queries
/// would take 104 KiB at head dim 128).
fn split_schedule(spec: &Spec) -> bool {
    let bytes = 2 * (128 * (spec.d + PAD) + TILE * (spec.d + PAD) + TILE * (spec.dv + PAD));
    (spec.d > 64 || spec.dv > 64)
        && spec.sq > 64
        && tiles::vectorized(&spec.k, spec.d)
        && tiles::vectorized(&spec.v, spec.dv)
        && bytes <= tiles::SMEM_BYTES
}

/// The split schedule's key loop ([`split_schedule`]): `scores` (the
/// scores and the online softmax of keys `j0 .. j0 + 64`, from `ks`) and
/// `pv` (their `p · v`, from `vs`), with the values' copies in flight
/// during `scores` and the next keys' during `pv`. The first keys'
/// copies were issued before the loop.
fn split_loop(s: &mut String, tiles: &[Tile<'_>; 2], sk: usize, scores: &str, pv: &str) {
    s.push_str("  for (I j0 = 0; j0 < kend; j0 += 64) {\n");
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str("    __syncthreads();  // these keys (and the queries) are visible; the last values' readers are done\n");
    let issue = |s: &mut String, tile: &Tile<'_>, start: &str, ind: &str| {
        let mut load = String::new();
        tiles::tile_load_async(&mut load, tile, start, sk, "0");
        load.push_str("  kiln::cp_async_commit();\n");
        tiles::indent(s, ind, &load);
    };
    issue(s, &tiles[1], "j0", "  ");
    s.push_str(scores);
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str("    __syncthreads();  // these values are visible; the keys' readers are done\n");
    s.push_str("    if (j0 + 64 < kend) {\n");
    issue(s, &tiles[0], "j0 + 64", "    ");
    s.push_str("    }\n");
    s.push_str(pv);
    s.push_str("  }\n");
}

/// Query tiles of 16 rows a warp: two where the queries can be staged
/// through both key buffers (pipelined), a warp's two tiles of queries,
/// scores and outputs fit its registers (head dims up to 64), and there
/// are more than 64 queries (else half the block would idle), so that
/// each key or value fragment read from shared memory feeds twice the
/// products (FlashAttention-2's warps own 32 or more rows); else one.
fn query_tiles(spec: &Spec, pipelined: bool) -> usize {
    if pipelined && spec.d <= 64 && spec.dv <= 64 && spec.sq > 64 {
        2
    } else {
        1
    }
}
