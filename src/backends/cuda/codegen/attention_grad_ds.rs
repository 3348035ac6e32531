//! The queries' gradient of a packed attention backward (`attention_grad
//! wrt=qkv`) from the score gradients the `dk, dv` kernel already
//! computed, instead of computing them again.
//!
//! `attention_grad.rs`'s `dq` kernel recomputes, per tile of 64 queries
//! and 64 keys, `S = q kᵀ`, `P`, `dP = g vᵀ` and `dS` before its one
//! useful product `dq += dS k`: three products where one is new, and
//! the `dk, dv` kernel has computed the same `dSᵀ` tile a moment before
//! (GPT-2 small's bf16 step on an H200: `dq` 51 µs a layer, `dk, dv` 71,
//! against 61 for FlashAttention-2's whole backward, which adds `dq`
//! with f32 atomics instead).
//!
//! Here the `dk, dv` kernel also stores each `dSᵀ` tile it computes, in
//! the input type (the rounding its own products and the `dq` product
//! apply), into a scratch `[b · h, sk', sq']` (both lengths rounded up to
//! 64, so that every tile a kernel touches lies inside); the `dq` kernel
//! below then walks the same tiles with one product each. The two stay
//! separate kernels, so the result does not depend on the order blocks
//! run in (no atomics). The cost is the scratch: 2 bytes a score, written
//! once and read once; [`DsLayout::for_spec`] takes it only up to
//! [`DS_BUDGET`] bytes, and recomputes beyond.

use super::attention::{Spec, Strided};
use super::attention_grad::{block_rows, key_end, out_row, GradSpec};
use super::attention_tiles::{self as tiles, tile_loop, Tile, PAD, TILE};
use super::{types, Kernel};
use std::fmt::Write;

/// The largest `dSᵀ` scratch the packed backward takes, in bytes: GPT-2
/// small's 8 × 12 heads of 512 take 50 MB. Past it (long sequences),
/// the `dq` kernel recomputes the scores instead.
pub(crate) const DS_BUDGET: u64 = 256 << 20;

/// Where the `dSᵀ` tiles of one attention backward live: head `bh`'s
/// element (key `j`, query `i`) at `(bh · rows + j) · cols + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DsLayout {
    /// Keys, rounded up to a tile.
    pub rows: usize,
    /// Queries, rounded up to a tile.
    pub cols: usize,
    /// Heads of every batch, `b · h`.
    pub heads: usize,
}

impl DsLayout {
    /// The layout for `spec`'s packed backward, or `None` where it does
    /// not pay or is switched off (`KILN_CUDA_ATTENTION_DS=0`): not
    /// packed, or a scratch over [`DS_BUDGET`].
    pub(crate) fn for_spec(spec: &GradSpec) -> Option<DsLayout> {
        let off = std::env::var("KILN_CUDA_ATTENTION_DS").is_ok_and(|v| v == "0");
        let Spec { batch, heads, sq, sk, .. } = spec.attn;
        let ds = DsLayout {
            rows: sk.div_ceil(TILE).max(1) * TILE,
            cols: sq.div_ceil(TILE).max(1) * TILE,
            heads: batch * heads,
        };
        (spec.packed && !off && ds.bytes() <= DS_BUDGET).then_some(ds)
    }

    /// The scratch's size (2-byte elements).
    pub(crate) fn bytes(&self) -> u64 {
        2 * (self.heads * self.rows * self.cols) as u64
    }

    /// (In the `dk, dv` kernel's tile body.) Stores the tile `acc[n][e]`
    /// of `dSᵀ` (rows: this thread's keys `ia`, `ib`; columns: queries
    /// `i0 + 8n + 2c + (e & 1)`) rounded to `tag`'s type, two queries a
    /// store. Every key and query row of the tile is stored, padding
    /// included, so the `dq` kernel never reads what nothing wrote.
    pub(super) fn store(&self, s: &mut String, acc: &str, tag: &str) {
        let (rows, cols) = (self.rows, self.cols);
        let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n) {{", TILE / 8);
        for (row, e) in [("ia", 0), ("ib", 2)] {
            let _ = writeln!(
                s,
                "      *(U*)&ds[(bh * {rows} + {row}) * {cols}LL + i0 + n * 8 + 2 * c] = kiln::pack2({acc}[n][{e}], {acc}[n][{}], {tag});",
                e + 1
            );
        }
        s.push_str("    }\n");
    }
}

/// The `dq` kernel reading `dSᵀ` from `ds`: a block owns 64 query rows
/// (16 a warp) and walks the key tiles they can see, loading the tile's
/// `dSᵀ` (keys × this block's 64 queries) and its keys; per tile one
/// product, `dq += dS k`, whose A fragments are `ldmatrix.trans` loads of
/// the stored transpose. The parameters are `wrt=q`'s (the queries,
/// values, gradient and stats go unread) and `ds`.
pub(crate) fn grad_q(name: &str, spec: &GradSpec, ds: &DsLayout) -> Kernel {
    let Spec { dtype, sq, sk, d, .. } = spec.attn;
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let (sst, kst) = (TILE + PAD, d + PAD);
    let mut s = spec.head_with(name, st, true, &[format!("const {st}* __restrict__ ds")]);
    // Row j of a head's `dSᵀ`, from this block's first query on.
    let rows = Strided { offset: 0, strides: [0, 0, ds.cols, 1] };
    let tiles = [
        Tile { smem: "ss", x: "dsr", strided: &rows, n: TILE },
        Tile { smem: "ks", x: "k", strided: &spec.attn.k, n: d },
    ];
    let pipelined = tiles::pipelined(&tiles, 0);
    tiles::declare(&mut s, &tiles, pipelined);
    let grid = block_rows(&mut s, spec, sq);
    let _ = writeln!(s, "  const {st}* const dsr = ds + bh * {}LL + r_start;", ds.rows * ds.cols);
    let _ = writeln!(s, "  float acc[{}][4];", d / 8);
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int n = 0; n < {}; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;",
        d / 8
    );
    key_end(&mut s, spec);
    let mut body = String::new();
    let _ = writeln!(body, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk) {{", TILE / 16);
    // A = dS, 16 queries × 16 keys: the four 8 × 8 tiles of the stored
    // transpose (keys down, queries across), each transposed by the load.
    body.push_str("      U af[4];\n");
    let _ = writeln!(
        body,
        "      kiln::ldsm_x4_trans(af, &(ss + ss_o)[(kk * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * {sst} + w * 16 + ((lane >> 3) & 1) * 8]);"
    );
    let _ = writeln!(body, "      #pragma unroll\n      for (int n = 0; n < {}; n += 2) {{", d / 8);
    body.push_str("        U bf[4];\n");
    let _ = writeln!(
        body,
        "        kiln::ldsm_x4_trans(bf, &(ks + ks_o)[(kk * 16 + (lane & 15)) * {kst} + (n + (lane >> 4)) * 8]);"
    );
    let _ = writeln!(body, "        kiln::mma_16816(acc[n], af, bf, {tag});");
    let _ = writeln!(body, "        kiln::mma_16816(acc[n + 1], af, bf + 2, {tag});\n      }}\n    }}");
    tile_loop(&mut s, "j0", ("0", "kend"), sk, &tiles, pipelined, |_, _, _| {}, |s| s.push_str(&body));
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
    let mut reads = spec.reads(true);
    reads.push(reads.len());
    Kernel::new(name, s, grid as u32, tiles::THREADS as u32, reads)
}
