//! The tensor-core attention backward's kernels that keep a block's own
//! rows in shared memory (`attention_grad.rs` has the others, the stats
//! and the layout of the products): the `dk, dv` kernel at head dims of
//! 64 and more, the `dq` kernel past 64.
//!
//! `attention_grad.rs`'s kernels hold each warp's 16 own rows (keys and
//! values, or queries and output gradients) as `mma` fragments. At head
//! dim 128 the `dk, dv` kernel's fragments are 64 registers beside the two
//! accumulators (128) and the two score tiles (64): 256 values in 255
//! registers, so `ptxas` spilled 11.7 GB of local loads a call at `[8,
//! 16, 2048, 128]` (ncu, H200: 3.63 ms, the tensor pipe 24% busy, against
//! 1.83 ms for the `dq` kernel's three products).
//!
//! Here, as in the forward's split schedule (`attention_mma.rs`):
//!
//! - **Own rows in shared memory.** The block's 64 rows are staged once,
//!   and each product reads its A fragments from there a k-step at a time
//!   (one `ldmatrix` of this warp's 16 rows).
//! - **One buffer of each operand that moves, copies under products.**
//!   `dk, dv`: one tile of queries and one of output gradients; a tile's
//!   gradients are copied during its `Sᵀ = k qᵀ`, the next tile's queries
//!   (and their lse and delta) during `dv += Pᵀ g`, once `dk += dSᵀ q`
//!   has read these. `dq`: one tile of keys and one of values; the values
//!   are read first (`dP = g vᵀ`), so the next ones are copied during `S
//!   = q kᵀ` and `dq += dS k`, and the next keys, issued once `dq` has
//!   read these, during the next `dP`. 70 KiB of shared memory at head dim
//!   128 (two buffers of both beside the own rows would take 104).
//! - **`dk, dv` in halves.** The kernel takes a tile's 64 queries 32 at a
//!   time, so its score tiles are 32 registers, not 64, and the keys' and
//!   values' fragments are read twice a tile. With all 64 at once, `ptxas`
//!   still spilled (7.6 GB) and the kernel took as long as before.
//!
//! Measured (ncu, H200, bf16; `[8, 16, 2048, 128]` then `[32, 12, 512,
//! 64]`, causal in brackets): `dk, dv` 3.63 → 2.74 ms (2.39 → 1.48), 355 →
//! 321 µs (223 → 198); `dq` 1.83 → 1.78-1.81 ms (0.99 → 0.92). Kept apart
//! from this file: `dq` at head dim 64 (216 → 249 µs when split; the
//! fragments fit there) and the `dq` kernel in halves of 32 keys (2.18
//! ms); `__launch_bounds__(128, 3)` (168 registers, 3 blocks a
//! multiprocessor) spilled in both kernels: at 128, `dk, dv` 4.08 ms,
//! `dq` 2.27 (6.2 GB of local loads). At 64, where `dk, dv` stores `dSᵀ`
//! for a `dq` that reads it, that cap pays (see [`capped`]).

use super::attention::Spec;
use super::attention_grad::{
    block_rows, key_end, probabilities_t, row_stats_tile, score_gradients, store_dkv, store_dq,
    thread_row_stats, zero_accumulator, GradSpec,
};
use super::attention_grad_ds::DsLayout;
use super::attention_tiles::{self as tiles, Tile, PAD, THREADS, TILE};
use super::{types, Kernel};
use std::fmt::Write;

/// Queries a `dk, dv` product takes at a time.
const HALF: usize = TILE / 2;

/// Whether `spec`'s operands allow these kernels: every one read 16
/// bytes at a time (the copies are `cp.async`), four tiles and the rows'
/// statistics within a block's shared memory, and not switched off
/// (`KILN_CUDA_ATTENTION_SPLIT_GRAD=0`, for side-by-side runs).
fn fits(spec: &GradSpec) -> bool {
    let Spec { d, dv, .. } = spec.attn;
    let off = std::env::var("KILN_CUDA_ATTENTION_SPLIT_GRAD").is_ok_and(|v| v == "0");
    let bytes = 2 * 2 * TILE * (d + PAD + dv + PAD) + 2 * TILE * 4;
    let vectorized = tiles::vectorized(&spec.attn.q, d)
        && tiles::vectorized(&spec.attn.k, d)
        && tiles::vectorized(&spec.attn.v, dv)
        && tiles::vectorized(&spec.g, dv);
    !off && vectorized && bytes <= tiles::SMEM_BYTES
}

/// Whether [`grad_kv`] takes `spec`: heads of 64 and wider. Measured at
/// 64 and 128; narrower heads keep the fragment kernel.
pub(crate) fn takes_kv(spec: &GradSpec) -> bool {
    spec.attn.d.max(spec.attn.dv) >= 64 && fits(spec)
}

/// Whether [`grad_kv`] for `spec` (`ds`: storing `dSᵀ` too) is capped at
/// 168 registers a thread (`__launch_bounds__(128, 3)`), for a third
/// block a multiprocessor: heads of 64 that store `dSᵀ`. The stores take
/// it from 162 registers to 169, two blocks; capped, it spills 289 MB a
/// launch at `[32,12,512,64]` but runs in 358 µs against 432 uncapped and
/// 373 for the fragment kernel (which needs 249 registers with the
/// stores; fwd+bwd 0.669-0.680 ms against 0.684-0.689, causal
/// 0.459-0.468 against 0.480-0.483; GPT-2 small's step unchanged,
/// 9.837-9.942 against 9.827-9.944). At 128 every cap measured spilled
/// more than it gained (the twenty-third measurement).
fn capped(spec: &GradSpec, ds: bool) -> bool {
    ds && spec.attn.d.max(spec.attn.dv) == 64
}

/// Whether [`grad_q`] takes `spec`: heads wider than 64.
pub(crate) fn takes_q(spec: &GradSpec) -> bool {
    spec.attn.d.max(spec.attn.dv) > 64 && fits(spec)
}

/// The opening both kernels share: the dynamic shared memory carved into
/// `names` (each a tile of 64 rows of the given row stride), in order.
/// Returns the bytes to launch with.
fn carve(s: &mut String, names: [(&str, usize); 4]) -> usize {
    let total: usize = names.iter().map(|(_, stride)| TILE * stride).sum();
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, tiles_smem, {total});");
    let mut at = 0;
    for (name, stride) in names {
        let _ = writeln!(s, "  unsigned short* const {name} = tiles_smem + {at};");
        at += TILE * stride;
    }
    2 * total
}

/// `code` at indent `ind` inside `if ({cond}) { .. }`.
fn guarded(s: &mut String, ind: &str, cond: &str, code: &str) {
    let _ = writeln!(s, "{ind}if ({cond}) {{");
    tiles::indent(s, &format!("{ind}  "), code);
    let _ = writeln!(s, "{ind}}}");
}

/// The `dk, dv` kernel (see the module docs); with `ds`, it also stores
/// each tile's `dSᵀ` for `attention_grad_ds.rs`'s `dq` kernel.
pub(crate) fn grad_kv(name: &str, spec: &GradSpec, ds: Option<&DsLayout>) -> Kernel {
    let Spec { dtype, sq, sk, d, dv, .. } = spec.attn;
    let tag = format!("{}()", types::storage(dtype));
    let (kst, vst) = (d + PAD, dv + PAD);
    let mut s = spec.kv_head(name, ds.is_some());
    if capped(spec, ds.is_some()) {
        s = s.replacen("__global__ void ", "__global__ void __launch_bounds__(128, 3) ", 1);
    }
    // Keys, values, then one tile of queries (rows like a key's) and one
    // of output gradients (like a value's).
    let shared = carve(&mut s, [("ks", kst), ("vs", vst), ("qs", kst), ("gs", vst)]);
    let _ = writeln!(s, "  __shared__ float slse[{TILE}], sdl[{TILE}];");
    s.push_str("  const float* const lse_t = slse;\n  const float* const dl_t = sdl;\n");
    let grid = block_rows(&mut s, spec, sk, true);
    let queries = Tile { smem: "qs", x: "q", strided: &spec.attn.q, n: d, len: None };
    let grads = Tile { smem: "gs", x: "dout", strided: &spec.g, n: dv, len: None };
    tiles::tile_load(&mut s, "k", &spec.attn.k, d, "r_start", sk, "ks", "0");
    tiles::tile_load(&mut s, "v", &spec.attn.v, dv, "r_start", sk, "vs", "0");
    for (acc, n) in [("dk", d / 8), ("dvv", dv / 8)] {
        let _ = writeln!(s, "  float {acc}[{n}][4];");
        zero_accumulator(&mut s, acc, n);
    }
    let issue = |s: &mut String, tile: &Tile<'_>, from: &str, stats: bool| {
        tiles::tile_load_async(s, tile, from, sq, "0");
        if stats {
            row_stats_tile(s, sq, "0", from);
        }
        s.push_str("  kiln::cp_async_commit();\n");
    };
    // Causal: query i sees key j <= i, so the rows before the block's
    // first key see none of its keys.
    let start = if spec.attn.causal { "r_start / 64 * 64" } else { "0" };
    let _ = writeln!(s, "  I i0 = {start};");
    issue(&mut s, &queries, "i0", true);
    let _ = writeln!(s, "  for (; i0 < {sq}; i0 += {TILE}) {{");
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str("    __syncthreads();  // the queries and their stats are visible; the last gradients' readers are done\n");
    let mut copy = String::new();
    issue(&mut copy, &grads, "i0", false);
    tiles::indent(&mut s, "  ", &copy);
    // The tile's queries `hq * 32 ..`: its rows of `qs` and `gs`.
    let half = |tile: &str, stride: usize| format!("{tile} + hq * {HALF} * {stride}");
    let _ = writeln!(s, "    #pragma unroll 1\n    for (int hq = 0; hq < {}; ++hq) {{", TILE / HALF);
    let mut body = String::new();
    // Sᵀ and dPᵀ: rows are this warp's keys, columns the queries.
    let _ = writeln!(body, "    float sc[{}][4], dp[{}][4];", HALF / 8, HALF / 8);
    tiles::mma_rows_shared_a(&mut body, "sc", HALF / 8, d / 16, ("ks", kst), &half("qs", kst), kst, &tag, 1);
    let wait = "kiln::cp_async_wait<0>();\n__syncthreads();  // the gradients are visible\n";
    guarded(&mut body, "    ", "hq == 0", wait);
    tiles::mma_rows_shared_a(&mut body, "dp", HALF / 8, dv / 16, ("vs", vst), &half("gs", vst), vst, &tag, 1);
    let q0 = format!("hq * {HALF}");
    probabilities_t(&mut body, spec, HALF, &q0);
    // With `ds`, each k-step's `dSᵀ` fragments are stored as they are packed.
    if let Some(ds) = ds {
        ds.tile_pointer(&mut body, types::storage(dtype), &q0);
    }
    let stores = if ds.is_some() { DsLayout::stores() } else { String::new() };
    tiles::mma_columns_of(&mut body, ("dk", "dp", HALF), d / 8, &half("qs", kst), kst, &tag, 1, &stores);
    // The next queries' copies, once every warp has read these.
    let mut next = String::from("__syncthreads();  // the queries' readers are done\n");
    let mut copy = String::new();
    issue(&mut copy, &queries, &format!("i0 + {TILE}"), true);
    guarded(&mut next, "", &format!("i0 + {TILE} < {sq}"), &copy);
    guarded(&mut body, "    ", &format!("hq == {}", TILE / HALF - 1), &next);
    tiles::mma_columns_of(&mut body, ("dvv", "sc", HALF), dv / 8, &half("gs", vst), vst, &tag, 1, "");
    tiles::indent(&mut s, "  ", &body);
    s.push_str("    }\n  }\n");
    store_dkv(&mut s, spec, &tag);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.reads(true)).with_shared(shared)
}

/// The `dq` kernel (see the module docs): the block's 64 queries and
/// their output gradients stay in shared memory as the A fragments of `S
/// = q kᵀ` and `dP = g vᵀ`, leaving the registers to `dq`'s accumulator
/// and the two score tiles.
pub(crate) fn grad_q(name: &str, spec: &GradSpec) -> Kernel {
    let Spec { dtype, sq, sk, d, dv, .. } = spec.attn;
    let tag = format!("{}()", types::storage(dtype));
    let (kst, vst) = (d + PAD, dv + PAD);
    let mut s = spec.head_with(name, types::storage(dtype), true, &[]);
    let shared = carve(&mut s, [("qs", kst), ("gs", vst), ("ks", kst), ("vs", vst)]);
    let grid = block_rows(&mut s, spec, sq, false);
    tiles::tile_load(&mut s, "q", &spec.attn.q, d, "r_start", sq, "qs", "0");
    tiles::tile_load(&mut s, "dout", &spec.g, dv, "r_start", sq, "gs", "0");
    thread_row_stats(&mut s, sq);
    let _ = writeln!(s, "  float acc[{}][4];", d / 8);
    zero_accumulator(&mut s, "acc", d / 8);
    key_end(&mut s, spec);
    let keys = Tile { smem: "ks", x: "k", strided: &spec.attn.k, n: d, len: None };
    let values = Tile { smem: "vs", x: "v", strided: &spec.attn.v, n: dv, len: None };
    let issue = |tile: &Tile<'_>, from: &str| {
        let mut s = String::new();
        tiles::tile_load_async(&mut s, tile, from, sk, "0");
        s.push_str("  kiln::cp_async_commit();\n");
        s
    };
    // The first values' copies, then the first keys': a group each.
    s.push_str(&issue(&values, "0"));
    s.push_str(&issue(&keys, "0"));
    s.push_str("  for (I j0 = 0; j0 < kend; j0 += 64) {\n");
    s.push_str("    kiln::cp_async_wait<1>();\n");
    s.push_str("    __syncthreads();  // these values (and the queries, gradients) are visible\n");
    let _ = writeln!(s, "    float sc[{}][4], dp[{}][4];", TILE / 8, TILE / 8);
    tiles::mma_rows_shared_a(&mut s, "dp", TILE / 8, dv / 16, ("gs", vst), "vs", vst, &tag, 1);
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str("    __syncthreads();  // these keys are visible; the values' readers are done\n");
    guarded(&mut s, "    ", "j0 + 64 < kend", &issue(&values, "j0 + 64"));
    tiles::mma_rows_shared_a(&mut s, "sc", TILE / 8, d / 16, ("qs", kst), "ks", kst, &tag, 1);
    score_gradients(&mut s, spec);
    tiles::mma_columns(&mut s, "acc", "sc", d / 8, "ks", kst, &tag, 1);
    s.push_str("    __syncthreads();  // the keys' readers are done\n");
    guarded(&mut s, "    ", "j0 + 64 < kend", &issue(&keys, "j0 + 64"));
    s.push_str("  }\n");
    store_dq(&mut s, spec, &tag);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.reads(true)).with_shared(shared)
}
