//! The tensor-core attention backward: [`Op::AttentionStats`] and
//! [`Op::AttentionGrad`] for f16 and bf16 heads whose dims are multiples
//! of 16 up to 128 (the shapes the `attention-grad` pass keeps fused).
//! FlashAttention-2's backward, as three kernels that never hold more
//! than a 64 × 64 tile of the `[sq, sk]` scores, each warp-wide product
//! a `kiln::mma_16816` (see `attention_mma.rs` for the fragment layout):
//!
//! - **stats**: a block of 4 warps owns 64 query rows (16 a warp), walks
//!   the keys in tiles of 64 and keeps each row's running maximum and sum
//!   (the forward's online softmax without `p v`); it writes each row's
//!   log-sum-exp and `delta = o · g`.
//! - **dq** (`wrt=q`): the same blocks; per key tile, `S = q kᵀ`, `P =
//!   2^(S scale log2 e - lse log2 e)`, `dP = g vᵀ` and `dS = P (dP -
//!   delta)` stay in registers, and `dq += dS k` (`dS` rounded to the
//!   input type, as the forward rounds `P` for `p v`).
//! - **dkv** (`wrt=kv`): a block owns 64 keys (16 a warp, held as `mma`
//!   fragments with their values) and walks the query tiles that can see
//!   them; per tile it computes the transposed `Sᵀ = k qᵀ` and `dPᵀ = v gᵀ`,
//!   then `dv += Pᵀ g` and `dk += dSᵀ q`. No atomics: `dq` and `dk, dv` are
//!   separate kernels, so the results do not depend on scheduling.
//!
//! At head dims of 64 and more the `dk, dv` kernel (and past 64 the `dq`
//! kernel) keeps the block's own rows in shared memory instead of as
//! fragments: `attention_grad_split.rs` (which says where exactly).
//!
//! A backward of every gradient at once (`wrt=kv+q`, or `wrt=qkv`
//! packed) runs `dk, dv` first, storing each `dSᵀ` tile, and then a `dq`
//! kernel with one product a tile that reads them
//! (`attention_grad_ds.rs`), per group of batches its scratch holds.
//!
//! Tiles sit in shared memory row-major with rows padded by 8 elements
//! (rows stay 16-byte aligned), and the per-tile loop is double-buffered
//! with `cp.async` where the tiles fit (`attention_tiles.rs`). The
//! operands an `mma` reads along their rows (`k` for `S`, `v` for `dP`,
//! `q` and `g` for the transposed products) are `ldmatrix` loads of four
//! 8 × 8 tiles; the ones it reads down a column (`k` for `dq`, `g` and `q`
//! for `dv` and `dk`) the same with `.trans`.
//! Removed keys (past the end, causal, masked) and query rows past the
//! end get `P = 0`; a query row with no key left has `lse = +inf`, so
//! every `P` of it is 0 and so are its gradients, as the forward writes
//! zeros there. NaN flows through the arithmetic (a NaN score makes its
//! row's `lse` NaN).
//!
//! [`Op::AttentionStats`]: crate::ir::Op::AttentionStats
//! [`Op::AttentionGrad`]: crate::ir::Op::AttentionGrad

use super::attention::{Spec, Strided};
use super::attention_grad_ds::DsLayout;
use super::attention_tiles::{
    self as tiles, mma_columns, mma_rows, tile_load, tile_loop, vectorized, Tile, PAD, THREADS, TILE,
};
use super::{types, Kernel};
use crate::ir::{AttnMask, AttnWrt};
use std::fmt::Write;

/// Rows (queries or keys) a block owns, 16 per warp: they are staged
/// through the first tile of a tile array, so they are one tile.
const ROWS: usize = TILE;

/// What the three kernels are generated for: the attention's own [`Spec`]
/// (whose `v` is the forward's output `o` for the stats kernel) and the
/// output's gradient.
#[derive(Clone, Debug)]
pub(crate) struct GradSpec {
    pub attn: Spec,
    /// The output's gradient.
    pub g: Strided,
    /// Whether the gradients go to `[b, s, 3, h, d]` (`wrt=qkv`: a fused
    /// QKV projection's layout, each kernel writing its part) rather than
    /// `[b, h, sq, d]` (`wrt=q`) or `[b, h, sk, d + dv]` (`wrt=kv`).
    pub packed: bool,
}

/// Whether the kernels take `spec`: the rule of the `attention-grad` pass.
pub(crate) fn applies(spec: &GradSpec) -> bool {
    crate::attention::fused_grad_takes(spec.attn.dtype, spec.attn.d, spec.attn.dv)
}

impl GradSpec {
    /// The kernel's opening: `out`, then `q, k, v|o, g`, the stats (for
    /// `wrt`) and the mask.
    fn head(&self, name: &str, out: &str, stats: bool) -> String {
        self.head_with(name, out, stats, &[])
    }

    /// [`GradSpec::head`] with more parameters after the mask.
    pub(super) fn head_with(&self, name: &str, out: &str, stats: bool, more: &[String]) -> String {
        let st = types::storage(self.attn.dtype);
        let mut p = vec![format!("{out}* __restrict__ out")];
        for x in ["q", "k", "v", "dout"] {
            p.push(format!("const {st}* __restrict__ {x}"));
        }
        if stats {
            p.push("const float* __restrict__ stats".into());
        }
        if self.attn.mask != AttnMask::None {
            p.push(format!("const {}* __restrict__ mask", types::storage(self.attn.mask_dtype)));
        }
        p.extend(more.iter().cloned());
        let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "));
        s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n");
        s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
        s.push_str("  const float POS_INF = __int_as_float(0x7f800000);\n");
        s.push_str("  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;\n");
        s
    }

    /// A `dk, dv` kernel's opening: [`GradSpec::head`] with the stats,
    /// and `ds`, the `dSᵀ` scratch, where it stores one.
    pub(super) fn kv_head(&self, name: &str, ds: bool) -> String {
        let st = types::storage(self.attn.dtype);
        let more: Vec<String> = ds.then(|| format!("{st}* __restrict__ ds")).into_iter().collect();
        self.head_with(name, st, true, &more)
    }

    /// The parameters the kernel reads (all but `out`).
    pub(super) fn reads(&self, stats: bool) -> Vec<usize> {
        let n = 4 + stats as usize + (self.attn.mask != AttnMask::None) as usize;
        (0..n).collect()
    }

    /// Code that sets `x` (declared by the caller) to the score of query
    /// `i` and key `j` from the raw product `raw`, in log2 units, or
    /// `NEG_INF` for a removed pair. `i`, `j` are ints in scope.
    pub(super) fn score(&self, raw: &str, x: &str) -> String {
        let log2e = std::f64::consts::LOG2_E;
        let scale = format!("{:?}f", (self.attn.scale * log2e) as f32);
        let mut removed = format!("j >= {} || i >= {}", self.attn.sk, self.attn.sq);
        if self.attn.causal {
            removed.push_str(" || j > i");
        }
        let mut s = String::new();
        let mut value = format!("{raw} * {scale}");
        if let Some(mk) = &self.attn.m {
            let at = format!("mask[{}]", mk.at("b", "h", "i", "j"));
            match self.attn.mask {
                AttnMask::Keep => {
                    let _ = write!(removed, " || !{at}");
                }
                AttnMask::Additive => {
                    let add = types::load(self.attn.mask_dtype, &at);
                    let _ = write!(value, " + (float){add} * {:?}f", log2e as f32);
                }
                AttnMask::None => {}
            }
        }
        // The mask is read only for pairs inside both lengths (`?:`
        // evaluates one side).
        let _ = write!(s, "{x} = ({removed}) ? NEG_INF : {value};");
        s
    }
}

/// Loads the A fragments `name[n / 16][4]` of this warp's 16 rows of the
/// shared tile `tile` (stride `stride`, `n` columns).
pub(super) fn fragments(s: &mut String, name: &str, tile: &str, stride: usize, n: usize) {
    let _ = writeln!(s, "  U {name}[{}][4];", n / 16);
    let _ = writeln!(s, "  #pragma unroll\n  for (int kk = 0; kk < {}; ++kk) {{", n / 16);
    for (x, row, col) in [(0, "r0", "0"), (1, "r0 + 8", "0"), (2, "r0", "8"), (3, "r0 + 8", "8")] {
        let _ = writeln!(
            s,
            "    {name}[kk][{x}] = *(const U*)&{tile}[({row}) * {stride} + kk * 16 + {col} + 2 * c];"
        );
    }
    s.push_str("  }\n");
}

/// The opening every kernel shares: the block's (batch, head), its first
/// row `r_start` (of the keys for `keys`, else of the queries) and this
/// thread's two rows `ia`, `ib`.
///
/// A causal attention's blocks differ in work: the first key block and
/// the last query block see every tile of the other side, the opposite
/// ones one tile. There the blocks run longest first across every head
/// (`rb` the slow index of `blockIdx.x`), so the short ones fill in behind
/// them; head-major, the long blocks of the last heads ran alone at the
/// end (GPT-2 small's `dk, dv` kernel: a quarter of its time with its
/// multiprocessors partly idle, by ncu's active cycles).
pub(super) fn block_rows(s: &mut String, spec: &GradSpec, len: usize, keys: bool) -> usize {
    let blocks = len.div_ceil(ROWS).max(1);
    let bhs = (spec.attn.batch * spec.attn.heads).max(1);
    let _ = match (spec.attn.causal, keys) {
        (false, _) => writeln!(s, "  const I rb = (I)blockIdx.x % {blocks}, bh = (I)blockIdx.x / {blocks};"),
        (true, true) => writeln!(s, "  const I rb = (I)blockIdx.x / {bhs}, bh = (I)blockIdx.x % {bhs};"),
        (true, false) => {
            writeln!(s, "  const I rb = {} - (I)blockIdx.x / {bhs}, bh = (I)blockIdx.x % {bhs};", blocks - 1)
        }
    };
    let _ = writeln!(s, "  const I b = bh / {heads}, h = bh % {heads};", heads = spec.attn.heads.max(1));
    let _ = writeln!(s, "  const I r_start = rb * {ROWS};");
    s.push_str("  const int r0 = w * 16 + g;\n  const int ia = (int)r_start + r0, ib = ia + 8;\n");
    (spec.attn.batch * spec.attn.heads * blocks).max(1)
}

/// The stats kernel: f32 `[b, h, sq, 2]` of (lse, delta).
pub(crate) fn stats(name: &str, spec: &GradSpec) -> Kernel {
    let Spec { dtype, sq, sk, d, dv, .. } = spec.attn;
    let tag = format!("{}()", types::storage(dtype));
    let kst = d + PAD;
    let mut s = spec.head(name, "float", false);
    let tiles = [Tile { smem: "ks", x: "k", strided: &spec.attn.k, n: d, len: None }];
    let pipelined = tiles::pipelined(&tiles, 0);
    let shared = tiles::declare(&mut s, &tiles, pipelined, 0);
    let grid = block_rows(&mut s, spec, sq, false);
    tile_load(&mut s, "q", &spec.attn.q, d, "r_start", sq, "ks", "0");
    s.push_str("  __syncthreads();\n");
    fragments(&mut s, "qf", "ks", kst, d);
    s.push_str("  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};\n");
    key_end(&mut s, spec);
    let outer = std::mem::take(&mut s);
    let _ = writeln!(s, "    float sc[{}][4];", TILE / 8);
    mma_rows(&mut s, "sc", "qf", TILE / 8, d / 16, "ks + ks_o", kst, &tag, 1);
    s.push_str("    float mx[2] = {NEG_INF, NEG_INF};\n");
    scores_walk(
        &mut s,
        spec,
        "ia",
        "ib",
        "(int)j0 + n * 8 + 2 * c + (e & 1)",
        "mx[e / 2] = sc[n][e] > mx[e / 2] ? sc[n][e] : mx[e / 2];",
    );
    s.push_str("    #pragma unroll\n    for (int r = 0; r < 2; ++r) {\n");
    s.push_str("      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));\n");
    s.push_str("      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));\n");
    s.push_str("      const float mn = m[r] > mx[r] ? m[r] : mx[r];\n");
    s.push_str("      if (mn != NEG_INF) { l[r] *= exp2f(m[r] - mn); m[r] = mn; }\n    }\n");
    let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n)", TILE / 8);
    s.push_str("      #pragma unroll\n      for (int e = 0; e < 4; ++e)\n");
    s.push_str("        if (m[e / 2] != NEG_INF) l[e / 2] += exp2f(sc[n][e] - m[e / 2]);\n");
    let body = std::mem::replace(&mut s, outer);
    tile_loop(&mut s, "j0", ("0", "kend"), sk, &tiles, pipelined, |_, _, _| {}, |s| s.push_str(&body));
    // lse (natural log) and delta = o · g per row; a row's 4 lanes split
    // its columns.
    s.push_str("  #pragma unroll\n  for (int r = 0; r < 2; ++r) {\n");
    s.push_str("    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);\n");
    s.push_str("    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);\n");
    s.push_str("    const int i = r == 0 ? ia : ib;\n    float dl = 0.f;\n");
    let (o_at, g_at) = (spec.attn.v.at("b", "h", "i", "col"), spec.g.at("b", "h", "i", "col"));
    let _ = writeln!(
        s,
        "    if (i < {sq})\n      for (int col = c; col < {dv}; col += 4) dl += {} * {};",
        types::load(dtype, &format!("v[{o_at}]")),
        types::load(dtype, &format!("dout[{g_at}]"))
    );
    s.push_str("    dl += __shfl_xor_sync(0xffffffffu, dl, 1);\n");
    s.push_str("    dl += __shfl_xor_sync(0xffffffffu, dl, 2);\n");
    let _ = writeln!(s, "    if (i < {sq} && c == 0) {{");
    let _ = writeln!(
        s,
        "      out[(bh * {sq} + i) * 2] = m[r] == NEG_INF ? POS_INF : (m[r] + log2f(l[r])) * {:?}f;",
        std::f64::consts::LN_2 as f32
    );
    let _ = writeln!(s, "      out[(bh * {sq} + i) * 2 + 1] = dl;\n    }}\n  }}\n}}");
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.reads(false)).with_shared(shared)
}

/// `kend`: the keys a block of query rows starting at `r_start` can see.
pub(super) fn key_end(s: &mut String, spec: &GradSpec) {
    let sk = spec.attn.sk;
    let end = if spec.attn.causal {
        format!("r_start + {ROWS} < {sk} ? r_start + {ROWS} : (I){sk}")
    } else {
        format!("(I){sk}")
    };
    let _ = writeln!(s, "  const I kend = {end};");
}

/// Walks the tile `sc[n][e]` of raw products of this thread's query rows
/// (`ia`, `ib`) and keys `j` (an expression of `n`, `e`), turning each
/// into its log2 score (or `-inf`), then runs `then`.
fn scores_walk(s: &mut String, spec: &GradSpec, ia: &str, ib: &str, j: &str, then: &str) {
    let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n) {{", TILE / 8);
    s.push_str("      #pragma unroll\n      for (int e = 0; e < 4; ++e) {\n");
    let _ = writeln!(s, "        const int i = e < 2 ? {ia} : {ib}, j = {j};");
    let _ = writeln!(s, "        {}", spec.score("sc[n][e]", "sc[n][e]"));
    let _ = writeln!(s, "        {then}\n      }}\n    }}");
}

/// The `wrt=q` or `wrt=kv` kernel (`spec.packed`: its part of `wrt=qkv`,
/// which launches both).
pub(crate) fn grad(name: &str, spec: &GradSpec, wrt: AttnWrt) -> Result<Kernel, String> {
    match wrt {
        AttnWrt::Query => Ok(grad_q(name, spec)),
        AttnWrt::KeyValue => Ok(grad_kv(name, spec, None)),
        AttnWrt::QueryKeyValue => Err("wrt=qkv launches the q and kv kernels, packed".into()),
        AttnWrt::KeyValueAndQuery => Err("wrt=kv+q launches the kv and q kernels".into()),
    }
}

/// The `dq` kernels' ending: this thread's rows of `acc` (`[d / 8][4]`
/// accumulator tiles) times the scale, rounded to `tag`'s type, into
/// `out`; then the kernel's closing brace.
pub(super) fn store_dq(s: &mut String, spec: &GradSpec, tag: &str) {
    let Spec { sq, d, .. } = spec.attn;
    let scale = format!("{:?}f", spec.attn.scale as f32);
    let _ = writeln!(s, "  #pragma unroll\n  for (int n = 0; n < {}; ++n) {{", d / 8);
    s.push_str("    #pragma unroll\n    for (int r = 0; r < 2; ++r) {\n");
    let _ = writeln!(s, "      const int i = r == 0 ? ia : ib;\n      if (i >= {sq}) continue;");
    let _ = writeln!(
        s,
        "      *(U*)&out[{} + n * 8 + 2 * c] = kiln::pack2(acc[n][2 * r] * {scale}, acc[n][2 * r + 1] * {scale}, {tag});",
        out_row(spec, 0, "i", d)
    );
    s.push_str("    }\n  }\n}\n");
}

/// Where row `row` (a query for `part` 0, a key for 1 and 2) of the
/// `(b, h) = bh` head's gradient `part` (q, k, v) starts in `out`; `w`
/// is a dense row's width (`d`, or `d + dv` for k and v side by side).
pub(super) fn out_row(spec: &GradSpec, part: usize, row: &str, w: usize) -> String {
    let Spec { heads, sq, sk, d, .. } = spec.attn;
    if spec.packed {
        let h3 = 3 * heads;
        return format!("((bh / {heads} * {sq} + {row}) * {h3} + {} + bh % {heads}) * {d}", part * heads);
    }
    match part {
        0 => format!("(bh * {sq} + {row}) * {w}"),
        1 => format!("(bh * {sk} + {row}) * {w}"),
        _ => format!("(bh * {sk} + {row}) * {w} + {d}"),
    }
}

/// Loads `lse · log2 e` and delta of query row `i` into `lse`, `dl` (a
/// row past the end: `+inf` and 0, so its probabilities are 0).
fn row_stats(i: &str, sq: usize) -> String {
    format!("{i} < {sq} ? stats[(bh * {sq} + {i}) * 2] * {:?}f : POS_INF", std::f64::consts::LOG2_E as f32)
}

/// `lse[2]` and `dl[2]`: the lse (log2 units) and delta of this thread's
/// query rows `ia` and `ib`.
pub(super) fn thread_row_stats(s: &mut String, sq: usize) {
    let _ = writeln!(s, "  const float lse[2] = {{{}, {}}};", row_stats("ia", sq), row_stats("ib", sq));
    let _ = writeln!(
        s,
        "  const float dl[2] = {{ia < {sq} ? stats[(bh * {sq} + ia) * 2 + 1] : 0.f, ib < {sq} ? stats[(bh * {sq} + ib) * 2 + 1] : 0.f}};"
    );
}

/// The scores walk of a `dq` kernel's key tile: `sc` (`S`) becomes `dS =
/// P (dP - delta)`, with `dp` holding `dP`.
pub(super) fn score_gradients(s: &mut String, spec: &GradSpec) {
    scores_walk(
        s,
        spec,
        "ia",
        "ib",
        "(int)j0 + n * 8 + 2 * c + (e & 1)",
        "const float p = sc[n][e] == NEG_INF ? 0.f : exp2f(sc[n][e] - lse[e / 2]);\n        sc[n][e] = p * (dp[n][e] - dl[e / 2]);",
    );
}

fn grad_q(name: &str, spec: &GradSpec) -> Kernel {
    if super::attention_grad_split::takes_q(spec) {
        return super::attention_grad_split::grad_q(name, spec);
    }
    let Spec { dtype, sq, sk, d, dv, .. } = spec.attn;
    let tag = format!("{}()", types::storage(dtype));
    let (kst, vst) = (d + PAD, dv + PAD);
    let mut s = spec.head(name, types::storage(dtype), true);
    let tiles = [
        Tile { smem: "ks", x: "k", strided: &spec.attn.k, n: d, len: None },
        Tile { smem: "vs", x: "v", strided: &spec.attn.v, n: dv, len: None },
    ];
    let pipelined = tiles::pipelined(&tiles, 0);
    let shared = tiles::declare(&mut s, &tiles, pipelined, 0);
    let grid = block_rows(&mut s, spec, sq, false);
    tile_load(&mut s, "q", &spec.attn.q, d, "r_start", sq, "ks", "0");
    tile_load(&mut s, "dout", &spec.g, dv, "r_start", sq, "vs", "0");
    s.push_str("  __syncthreads();\n");
    fragments(&mut s, "qf", "ks", kst, d);
    fragments(&mut s, "gf", "vs", vst, dv);
    thread_row_stats(&mut s, sq);
    let _ = writeln!(s, "  float acc[{}][4];", d / 8);
    zero_accumulator(&mut s, "acc", d / 8);
    key_end(&mut s, spec);
    let outer = std::mem::take(&mut s);
    let _ = writeln!(s, "    float sc[{}][4], dp[{}][4];", TILE / 8, TILE / 8);
    mma_rows(&mut s, "sc", "qf", TILE / 8, d / 16, "ks + ks_o", kst, &tag, 1);
    mma_rows(&mut s, "dp", "gf", TILE / 8, dv / 16, "vs + vs_o", vst, &tag, 1);
    score_gradients(&mut s, spec);
    mma_columns(&mut s, "acc", "sc", d / 8, "ks + ks_o", kst, &tag, 1);
    let body = std::mem::replace(&mut s, outer);
    tile_loop(&mut s, "j0", ("0", "kend"), sk, &tiles, pipelined, |_, _, _| {}, |s| s.push_str(&body));
    store_dq(&mut s, spec, &tag);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.reads(true)).with_shared(shared)
}

/// The `wrt=kv` kernel; with `ds`, it also stores each tile's `dSᵀ`
/// (rounded to the input type, as its products use it) for the `dq`
/// kernel of `attention_grad_ds.rs`. Heads of 64 and more take
/// `attention_grad_split.rs`'s.
pub(crate) fn grad_kv(name: &str, spec: &GradSpec, ds: Option<&DsLayout>) -> Kernel {
    if super::attention_grad_split::takes_kv(spec) {
        return super::attention_grad_split::grad_kv(name, spec, ds);
    }
    let Spec { dtype, sq, sk, d, dv, .. } = spec.attn;
    let tag = format!("{}()", types::storage(dtype));
    let (qst, gst) = (d + PAD, dv + PAD);
    let mut s = spec.kv_head(name, ds.is_some());
    let tiles = [
        Tile { smem: "qs", x: "q", strided: &spec.attn.q, n: d, len: None },
        Tile { smem: "gs", x: "dout", strided: &spec.g, n: dv, len: None },
    ];
    // Each row's lse and delta beside the tiles, as many buffers.
    let row_stats_bytes = 2 * 2 * TILE * 4;
    let pipelined = tiles::pipelined(&tiles, row_stats_bytes);
    let shared = tiles::declare(
        &mut s,
        &tiles,
        pipelined,
        if pipelined { row_stats_bytes } else { row_stats_bytes / 2 },
    );
    let buffers = if pipelined { 2 } else { 1 };
    let _ = writeln!(s, "  __shared__ float slse[{}], sdl[{}];", buffers * TILE, buffers * TILE);
    let grid = block_rows(&mut s, spec, sk, true);
    // This block's keys and values, staged through the tiles once.
    tile_load(&mut s, "k", &spec.attn.k, d, "r_start", sk, "qs", "0");
    tile_load(&mut s, "v", &spec.attn.v, dv, "r_start", sk, "gs", "0");
    s.push_str("  __syncthreads();\n");
    fragments(&mut s, "kf", "qs", qst, d);
    fragments(&mut s, "vf", "gs", gst, dv);
    let _ = writeln!(s, "  float dk[{}][4], dvv[{}][4];", d / 8, dv / 8);
    zero_accumulator(&mut s, "dk", d / 8);
    zero_accumulator(&mut s, "dvv", dv / 8);
    // Causal: query i sees key j <= i, so the rows before the block's
    // first key see none of its keys.
    let start = if spec.attn.causal { "r_start / 64 * 64" } else { "0" };
    let row_stats_load = |s: &mut String, buffer: &str, from: &str| row_stats_tile(s, sq, buffer, from);
    let outer = std::mem::take(&mut s);
    let _ = writeln!(
        s,
        "    const float* const lse_t = slse + buf_rows;\n    const float* const dl_t = sdl + buf_rows;"
    );
    // Sᵀ and dPᵀ: rows are this warp's keys, columns the tile's queries.
    let _ = writeln!(s, "    float sc[{}][4], dp[{}][4];", TILE / 8, TILE / 8);
    mma_rows(&mut s, "sc", "kf", TILE / 8, d / 16, "qs + qs_o", qst, &tag, 1);
    mma_rows(&mut s, "dp", "vf", TILE / 8, dv / 16, "gs + gs_o", gst, &tag, 1);
    probabilities_t(&mut s, spec, TILE, "0");
    mma_columns(&mut s, "dvv", "sc", dv / 8, "gs + gs_o", gst, &tag, 1);
    // With `ds`, each k-step's `dSᵀ` fragments are stored as they are packed.
    if let Some(ds) = ds {
        ds.tile_pointer(&mut s, types::storage(dtype), "0");
    }
    let stores = if ds.is_some() { DsLayout::stores() } else { String::new() };
    tiles::mma_columns_of(&mut s, ("dk", "dp", TILE), d / 8, "qs + qs_o", qst, &tag, 1, &stores);
    let body = std::mem::replace(&mut s, outer);
    let rows_at = if pipelined { format!("buf * {TILE}") } else { "0".to_string() };
    tile_loop(&mut s, "i0", (start, &sq.to_string()), sq, &tiles, pipelined, row_stats_load, |s| {
        let _ = writeln!(s, "    const int buf_rows = {rows_at};");
        s.push_str(&body);
    });
    store_dkv(&mut s, spec, &tag);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.reads(true)).with_shared(shared)
}

/// Zeroes the `mma` accumulator `acc[groups][4]` (declared by the caller).
pub(super) fn zero_accumulator(s: &mut String, acc: &str, groups: usize) {
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int n = 0; n < {groups}; ++n) {acc}[n][0] = {acc}[n][1] = {acc}[n][2] = {acc}[n][3] = 0.f;"
    );
}

/// Loads the lse (in log2 units) and delta of query rows `from .. from +
/// 64` into `slse` and `sdl` at buffer `buffer` (a C expression), by plain
/// stores: rows past the end get `+inf` and 0.
pub(super) fn row_stats_tile(s: &mut String, sq: usize, buffer: &str, from: &str) {
    let _ = writeln!(s, "  for (int e = t; e < {TILE}; e += {THREADS}) {{");
    let _ =
        writeln!(s, "    const I i = {from} + e;\n    slse[{buffer} * {TILE} + e] = {};", row_stats("i", sq));
    let _ = writeln!(
        s,
        "    sdl[{buffer} * {TILE} + e] = i < {sq} ? stats[(bh * {sq} + i) * 2 + 1] : 0.f;\n  }}"
    );
}

/// (In a `dk, dv` kernel's tile body.) Turns the transposed products of
/// `queries` queries from `i0 + q0` (`q0` a C expression) into `sc = Pᵀ`
/// and `dp = dSᵀ = Pᵀ (dPᵀ - delta)`: element `(n, e)` is key `ia`/`ib`
/// (`e < 2` / `e >= 2`) and query `i0 + q0 + 8n + 2c + (e & 1)`, whose
/// lse and delta are at that offset in `lse_t` and `dl_t`.
pub(super) fn probabilities_t(s: &mut String, spec: &GradSpec, queries: usize, q0: &str) {
    let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n) {{", queries / 8);
    s.push_str("      #pragma unroll\n      for (int e = 0; e < 4; ++e) {\n");
    let q0 = if q0 == "0" { String::new() } else { format!("{q0} + ") };
    let _ = writeln!(s, "        const int q_at = {q0}n * 8 + 2 * c + (e & 1);");
    s.push_str("        const int i = (int)i0 + q_at, j = e < 2 ? ia : ib;\n");
    let _ = writeln!(s, "        {}", spec.score("sc[n][e]", "sc[n][e]"));
    s.push_str("        const float p = sc[n][e] == NEG_INF ? 0.f : exp2f(sc[n][e] - lse_t[q_at]);\n");
    s.push_str("        sc[n][e] = p;\n        dp[n][e] = p * (dp[n][e] - dl_t[q_at]);\n      }\n    }\n");
}

/// A `dk, dv` kernel's ending: this thread's rows `ia`, `ib` of the
/// accumulators `dk` (times the scale) and `dvv`, rounded to `tag`'s
/// type, into `out`; then the kernel's closing brace.
pub(super) fn store_dkv(s: &mut String, spec: &GradSpec, tag: &str) {
    let Spec { sk, d, dv, .. } = spec.attn;
    let scale = format!("{:?}f", spec.attn.scale as f32);
    let w = d + dv;
    s.push_str("  #pragma unroll\n  for (int r = 0; r < 2; ++r) {\n");
    let _ = writeln!(s, "    const int j = r == 0 ? ia : ib;\n    if (j >= {sk}) continue;");
    let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n)", d / 8);
    let _ = writeln!(
        s,
        "      *(U*)&out[{} + n * 8 + 2 * c] = kiln::pack2(dk[n][2 * r] * {scale}, dk[n][2 * r + 1] * {scale}, {tag});",
        out_row(spec, 1, "j", w)
    );
    let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n)", dv / 8);
    let _ = writeln!(
        s,
        "      *(U*)&out[{} + n * 8 + 2 * c] = kiln::pack2(dvv[n][2 * r], dvv[n][2 * r + 1], {tag});",
        out_row(spec, 2, "j", w)
    );
    s.push_str("  }\n}\n");
}

/// Threads that share one row of `attention_delta`.
const DELTA_LANES: usize = 8;
/// Threads of an `attention_delta` block.
const DELTA_THREADS: usize = 256;

/// `attention_delta o, g, lse`: the `[b, h, sq, 2]` stats (lse, `o · g`)
/// of an attention whose forward wrote its rows' log-sum-exp. A
/// bandwidth-bound row kernel: 8 lanes a row, 16-byte loads where `o` and
/// `g` allow them, the partial dots combined with three shuffles. `o`
/// and `g` are `[b, h, sq, dv]` through their strides, `lse` dense.
pub(crate) fn delta(
    name: &str,
    dtype: crate::ir::DType,
    dims: [usize; 4],
    o: &Strided,
    g: &Strided,
) -> Kernel {
    let [batch, heads, sq, dv] = dims;
    let rows = batch * heads * sq;
    let st = types::storage(dtype);
    let acc = if dtype == crate::ir::DType::F64 { "double" } else { "float" };
    let mut s = format!(
        "extern \"C\" __global__ void {name}({acc}* __restrict__ out, const {st}* __restrict__ o, const {st}* __restrict__ g, const {acc}* __restrict__ lse) {{\n"
    );
    s.push_str("  typedef long long I;\n");
    let _ = writeln!(s, "  const I row = ((I)blockIdx.x * {DELTA_THREADS} + threadIdx.x) / {DELTA_LANES};");
    let _ = writeln!(s, "  const int part = threadIdx.x % {DELTA_LANES};");
    // Every lane reaches the shuffles; rows past the end read nothing.
    let _ = writeln!(s, "  const bool live = row < {rows}LL;");
    let _ = writeln!(
        s,
        "  const I bh = row / {sq}, i = row % {sq}, b = bh / {heads}, h = bh % {heads};",
        sq = sq.max(1),
        heads = heads.max(1)
    );
    let _ = writeln!(s, "  {acc} dl = 0;");
    let narrow = matches!(dtype, crate::ir::DType::F16 | crate::ir::DType::BF16);
    if narrow && vectorized(o, dv) && vectorized(g, dv) {
        let _ =
            writeln!(s, "  if (live)\n    for (int c8 = part * 8; c8 < {dv}; c8 += {}) {{", 8 * DELTA_LANES);
        let _ = writeln!(
            s,
            "      const kiln::u16x8 a = *(const kiln::u16x8*)&o[{}];",
            o.at("b", "h", "i", "c8")
        );
        let _ = writeln!(
            s,
            "      const kiln::u16x8 e = *(const kiln::u16x8*)&g[{}];",
            g.at("b", "h", "i", "c8")
        );
        s.push_str("      #pragma unroll\n      for (int u = 0; u < 8; ++u)\n");
        let _ = writeln!(
            s,
            "        dl += kiln::half_at(a.w[u / 2], u % 2, {st}()) * kiln::half_at(e.w[u / 2], u % 2, {st}());\n    }}"
        );
    } else {
        let _ = writeln!(s, "  if (live)\n    for (int c = part; c < {dv}; c += {DELTA_LANES})");
        let _ = writeln!(
            s,
            "      dl += ({acc}){} * ({acc}){};",
            types::load(dtype, &format!("o[{}]", o.at("b", "h", "i", "c"))),
            types::load(dtype, &format!("g[{}]", g.at("b", "h", "i", "c")))
        );
    }
    let mut width = DELTA_LANES / 2;
    while width > 0 {
        let _ = writeln!(s, "  dl += __shfl_xor_sync(0xffffffffu, dl, {width});");
        width /= 2;
    }
    s.push_str(
        "  if (live && part == 0) {\n    out[row * 2] = lse[row];\n    out[row * 2 + 1] = dl;\n  }\n}\n",
    );
    let grid = (rows * DELTA_LANES).div_ceil(DELTA_THREADS).max(1);
    Kernel::new(name, s, grid as u32, DELTA_THREADS as u32, vec![0, 1, 2])
}
