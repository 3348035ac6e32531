//! The queries' gradient of an attention backward that computes every
//! gradient at once (`attention_grad wrt=kv+q`, or `wrt=qkv` packed) from
//! the score gradients the `dk, dv` kernel already computed, instead of
//! computing them again.
//!
//! `attention_grad.rs`'s `dq` kernel recomputes, per tile of 64 queries
//! and 64 keys, `S = q kᵀ`, `P`, `dP = g vᵀ` and `dS` before its one
//! useful product `dq += dS k`: three products where one is new, and
//! the `dk, dv` kernel has computed the same `dSᵀ` tile a moment before
//! (GPT-2 small's bf16 step on an H200: `dq` 51 µs a layer, `dk, dv` 71,
//! against 61 for FlashAttention-2's whole backward, which adds `dq`
//! with f32 atomics instead; at `[8, 16, 2048, 128]` the recomputing `dq`
//! took 1.79 ms, this one 0.70).
//!
//! Here the `dk, dv` kernel also stores each `dSᵀ` tile it computes, in
//! the input type (the rounding its own products and the `dq` product
//! apply), into a scratch of whole 64 × 64 tiles (see [`DsLayout`]); the
//! `dq` kernel below then walks the same tiles with one product each.
//! The two stay separate kernels, so the result does not depend on the
//! order blocks run in (no atomics), and it is bit for bit the
//! recomputing kernel's. The cost is the scratch: 2 bytes a score,
//! written once and read once. [`DsLayout::for_spec`] sizes it for as
//! many batches as fit [`DS_BUDGET`] bytes, and the lowering launches the
//! pair once per group of that many batches; where one batch does not
//! fit, `dq` recomputes.

use super::attention::{Spec, Strided};
use super::attention_grad::{block_rows, key_end, store_dq, zero_accumulator, GradSpec};
use super::attention_tiles::{self as tiles, tile_loop, Tile, PAD, TILE};
use super::{types, Kernel};
use std::fmt::Write;

/// The largest `dSᵀ` scratch one backward takes, in bytes: GPT-2 small's
/// 8 × 12 heads of 512 take 50 MB; `[8, 16, 2048, 128]` takes 1 GiB,
/// so it runs as four launches of two batches each. Past it for a single
/// batch (very long sequences), the `dq` kernel recomputes the scores.
pub(crate) const DS_BUDGET: u64 = 256 << 20;

/// Where the `dSᵀ` tiles of one attention backward live. A tile (64 keys
/// × 64 queries) is 4096 contiguous elements, the tiles of one query tile
/// in key order: tile (query tile `it`, key tile `jt`) of head `bh` starts
/// at element `bh · rows · cols + it · 64 · rows + jt · 4096`. Inside a
/// tile the 64
/// 8 × 8 blocks (key block `kb`, query block `qb`) are 64 elements each,
/// at `(8 kb + qb) · 64`, row-major (a key's 8 queries in a row): the
/// layout of the `mma` accumulator a warp holds, so a warp stores 128
/// contiguous bytes at once (a row-major `[keys, queries]` scratch had
/// 16-byte pieces 2 · sq bytes apart: the `dk, dv` kernel took 15 µs
/// longer a layer), and each block is one `ldmatrix` matrix for the
/// reader.
///
/// The scratch holds the heads of [`DsLayout::batches`] batches: the
/// lowering launches the pair of kernels once per group of that many
/// batches, each launch's operands and outputs moved on to its first
/// batch, and the scratch reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DsLayout {
    /// Keys, rounded up to a tile.
    pub rows: usize,
    /// Queries, rounded up to a tile.
    pub cols: usize,
    /// Heads of one launch, `batches · h`.
    pub heads: usize,
    /// Batches one launch covers: a divisor of the attention's batch, so
    /// every launch runs the same kernels on the same grid.
    pub batches: usize,
}

impl DsLayout {
    /// The layout for a backward whose `dq` may read `dSᵀ` (`wrt=qkv` or
    /// `wrt=kv+q`), or `None` where it is switched off
    /// (`KILN_CUDA_ATTENTION_DS=0`) or one batch's scratch is over
    /// [`DS_BUDGET`]. A launch takes the most batches whose scratch fits
    /// (at most `KILN_CUDA_ATTENTION_DS_BATCHES`, for tests of the
    /// launches' offsets).
    pub(crate) fn for_spec(spec: &GradSpec) -> Option<DsLayout> {
        let off = std::env::var("KILN_CUDA_ATTENTION_DS").is_ok_and(|v| v == "0");
        let cap = std::env::var("KILN_CUDA_ATTENTION_DS_BATCHES").ok().and_then(|v| v.parse::<usize>().ok());
        let Spec { batch, heads, sq, sk, .. } = spec.attn;
        let (rows, cols) = (sk.div_ceil(TILE).max(1) * TILE, sq.div_ceil(TILE).max(1) * TILE);
        let fits = |n: usize| 2 * (n * heads * rows * cols) as u64 <= DS_BUDGET && cap.is_none_or(|c| n <= c);
        let batches = (1..=batch.max(1)).rev().find(|&n| batch.max(1) % n == 0 && fits(n))?;
        (!off).then_some(DsLayout { rows, cols, heads: batches * heads, batches })
    }

    /// The scratch's size (2-byte elements).
    pub(crate) fn bytes(&self) -> u64 {
        2 * (self.heads * self.rows * self.cols) as u64
    }

    /// (In the `dk, dv` kernel's tile body, the block's keys from
    /// `r_start`, the tile's queries from `i0`.) Declares `ds_t`, where
    /// this lane's first element of its warp's blocks goes for the tile's
    /// queries from `q0` (a C expression, a multiple of 16): block (`kb =
    /// 2w + half`, `qb`) starts `(8 kb + qb) · 64` elements into the tile,
    /// so `ds_t` is `(16 w + q0 / 8) · 64` past it and each store of
    /// [`DsLayout::stores`] a constant past `ds_t`.
    pub(super) fn tile_pointer(&self, s: &mut String, storage: &str, q0: &str) {
        let from = if q0 == "0" { String::new() } else { format!(" + ({q0}) * 8") };
        let _ = writeln!(
            s,
            "    {storage}* const ds_t = ds + (bh * {}LL + i0 * {}LL + r_start * 64 + w * 1024 + lane * 2{from});",
            self.rows * self.cols,
            self.rows
        );
    }

    /// The stores of one k-step `kk` of the `dk += dSᵀ q` product (code
    /// for [`super::attention_tiles::mma_columns_of`]'s `after_pack`): its
    /// A fragments `pa[4]` are `dSᵀ` of this warp's keys (rows `ia`, `ib`)
    /// and queries `q0 + 16 kk ..` (two query blocks), already rounded to
    /// the input type for the product, each lane's two queries at `2
    /// lane`. Stored from the fragments, no value is kept alive for the
    /// stores alone. Every key and query of the tile is stored, padding
    /// included, so the `dq` kernel never reads what nothing wrote.
    pub(super) fn stores() -> String {
        let mut s = String::new();
        // `pa[0]`, `pa[1]`: rows ia, ib of query block 2kk; `pa[2]`,
        // `pa[3]` of block 2kk + 1.
        for (x, half, block) in [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)] {
            let _ = writeln!(s, "*(U*)&ds_t[({half} * 8 + 2 * kk + {block}) * 64] = pa[{x}];");
        }
        s
    }
}

/// The `dq` kernel reading `dSᵀ` from `ds`: a block owns 64 query rows
/// (16 a warp) and walks the key tiles they can see, loading the tile's
/// `dSᵀ` (4096 contiguous elements, into shared memory as 64 rows of one
/// block each) and its keys; per tile one product, `dq += dS k`, whose A
/// fragments are `ldmatrix.trans` loads of the stored blocks. The parameters are `wrt=q`'s (the queries,
/// values, gradient and stats go unread) and `ds`.
pub(crate) fn grad_q(name: &str, spec: &GradSpec, ds: &DsLayout) -> Kernel {
    let Spec { dtype, sq, sk, d, .. } = spec.attn;
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let (sst, kst) = (TILE + PAD, d + PAD);
    let mut s = spec.head_with(name, st, true, &[format!("const {st}* __restrict__ ds")]);
    // This query tile's `dSᵀ` tiles, one 8 × 8 block (64 elements) a
    // "row": block `r` of key tile `jt` is row `64 jt + r`, so the tile
    // loop's rows `j0 .. j0 + 64` are key tile `j0 / 64`. Every row up to
    // the padded length was written: nothing is zero-filled.
    let blocks = Strided { offset: 0, strides: [0, 0, TILE, 1] };
    let tiles = [
        Tile { smem: "ss", x: "dsr", strided: &blocks, n: TILE, len: Some(ds.rows) },
        Tile { smem: "ks", x: "k", strided: &spec.attn.k, n: d, len: None },
    ];
    let pipelined = tiles::pipelined(&tiles, 0);
    let shared = tiles::declare(&mut s, &tiles, pipelined, 0);
    let grid = block_rows(&mut s, spec, sq, false);
    let _ =
        writeln!(s, "  const {st}* const dsr = ds + bh * {}LL + r_start * {}LL;", ds.rows * ds.cols, ds.rows);
    let _ = writeln!(s, "  float acc[{}][4];", d / 8);
    zero_accumulator(&mut s, "acc", d / 8);
    key_end(&mut s, spec);
    let mut body = String::new();
    let _ = writeln!(body, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk) {{", TILE / 16);
    // A = dS, 16 queries × 16 keys: four stored 8 × 8 blocks of `dSᵀ`
    // (matrix `m = lane / 8`: key block `2kk + m / 2`, query block `2w + m
    // % 2`), each transposed by the load.
    body.push_str("      U af[4];\n");
    let _ = writeln!(
        body,
        "      kiln::ldsm_x4_trans(af, &(ss + ss_o)[((2 * kk + (lane >> 4)) * 8 + 2 * w + ((lane >> 3) & 1)) * {sst} + (lane & 7) * 8]);"
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
    store_dq(&mut s, spec, &tag);
    let mut reads = spec.reads(true);
    reads.push(reads.len());
    Kernel::new(name, s, grid as u32, tiles::THREADS as u32, reads).with_shared(shared)
}
