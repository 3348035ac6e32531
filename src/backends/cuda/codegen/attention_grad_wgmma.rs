//! The Hopper attention backward: `attention_grad.rs`'s `dk, dv` kernel
//! (a block owns 64 keys and walks the query tiles that see them) and
//! `attention_grad_ds.rs`'s `dq` kernel (reading the `dSᵀ` tiles the first
//! stored) with their products on `wgmma`, for f16 and bf16 heads of 64
//! and 128 on sm_90 devices. The `dk, dv` kernel was where the backward's
//! time went: at `[8, 16, 2048, 128]` the `mma.sync` one took 2.92 ms of
//! the backward's 3.6 (255 registers and spills; its `dq` kernel 0.70),
//! against 2.6 for FlashAttention-2's whole backward (benches/RESULTS.md,
//! the twenty-fourth measurement); here the two take 4 × 0.49 and 4 ×
//! 0.105 ms under ncu's clocks (the twenty-seventh).
//!
//! - A `dk, dv` block is one warpgroup (128 threads); its 64 keys are the
//!   rows of every accumulator (`m64nNk16`), 16 a warp, so the per-thread
//!   layout is `mma.sync`'s and the masks (`GradSpec::score`), the
//!   probabilities' rows and the `dSᵀ` stores ([`DsLayout::stores`]) are
//!   `attention_grad.rs`'s own.
//! - The block's keys and values are copied once into shared memory, and
//!   each query tile's queries and output gradients into one of two
//!   buffers, all in `attention_wgmma.rs`'s 128-byte swizzled layout. One
//!   tile of queries serves two products: `Sᵀ = k qᵀ` reads it K-major
//!   (its rows are the product's columns), `dk += dSᵀ q` MN-major (its
//!   rows are the k-steps), as the forward reads its keys and values; the
//!   output gradients likewise serve `dPᵀ = v gᵀ` and `dv += Pᵀ g`.
//! - Per query tile: wait for its copies, `fence.proxy.async`, one barrier
//!   (which also frees the other buffer: each warp waited for its own
//!   products), the next tile's copies and its rows' lse and delta into
//!   the other buffer, then the four products, each started as soon as
//!   its operands are ready so the elementwise work runs under them
//!   ([`tile_products`]). `Pᵀ` and `dSᵀ`, packed to the input type, are
//!   the A fragments of the gradient products; with a `dSᵀ` scratch, the
//!   packed `dSᵀ` is stored for the `dq` kernel.
//! - Shared memory: keys and values once and two buffers of queries and
//!   gradients, 96 KiB at heads of 128 (two blocks an SM; their
//!   accumulators, 128 registers a thread, keep a third off anyway), 48
//!   KiB at 64. ptxas: 237-242 registers at heads of 128, no spills; at
//!   64, capped at 168 for a third block an SM (16 bytes spilled).
//! - The `dq` kernel ([`grad_q`]) is a warpgroup owning 64 queries; per
//!   key tile, the stored `dSᵀ` tile gives its A fragments by
//!   `ldmatrix.trans` and the keys, swizzled, are B read MN-major.
//!
//! The emulator has no `wgmma`: the lowering takes these kernels only on an
//! sm_90 device ([`chosen`]); `tests/ops/attention_wgmma.rs` checks them
//! against f64 on the GPU (and asserts the plans hold them), and its child
//! process with `KILN_CUDA_WGMMA=0` the `mma.sync` kernels.
//!
//! [`DsLayout::stores`]: super::attention_grad_ds::DsLayout::stores

use super::attention::Spec;
use super::attention_grad::{
    block_rows, key_end, row_stats_tile, store_dkv, store_dq, zero_accumulator, GradSpec,
};
use super::attention_grad_ds::DsLayout;
use super::attention_tiles::{self as tiles, THREADS, TILE};
use super::attention_wgmma::{
    self as wgmma, addressing, copier, copies, fence_operands, product, wait, Operands, Rows,
};
use super::{types, Kernel};
use crate::ir::DType;
use std::fmt::Write;

/// Whether the kernel takes `spec`: where the forward's `wgmma` kernel
/// does (f16 or bf16, heads of 64 or 128, rows read 16 bytes at a time),
/// the output gradient read 16 bytes at a time too.
pub(crate) fn applies(spec: &GradSpec) -> bool {
    wgmma::applies(&spec.attn) && tiles::vectorized(&spec.g, spec.attn.dv)
}

/// Whether an sm_90 device runs `spec`'s `dk, dv` on this kernel:
/// wherever it [`applies`], unless `KILN_CUDA_WGMMA=0` (which keeps every
/// attention on `mma.sync`) or `KILN_CUDA_WGMMA_GRAD=0` (the backward
/// only, to compare the two side by side).
pub(crate) fn chosen(spec: &GradSpec) -> bool {
    let off = |var: &str| std::env::var(var).as_deref() == Ok("0");
    applies(spec) && !off("KILN_CUDA_WGMMA") && !off("KILN_CUDA_WGMMA_GRAD")
}

/// The `dk, dv` kernel for `spec` (which [`applies`]); with `ds`, it also
/// stores each tile's `dSᵀ` for `attention_grad_ds.rs`'s `dq` kernel.
pub(crate) fn grad_kv(name: &str, spec: &GradSpec, ds: Option<&DsLayout>) -> Kernel {
    let Spec { dtype, sq, sk, d, dv, .. } = spec.attn;
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let ab = if dtype == DType::BF16 { "bf16" } else { "f16" };
    // Bytes: the keys, the values, then two buffers of (queries, gradients);
    // every part a whole number of 1024-byte swizzle blocks.
    let (kt, vt) = (2 * TILE * d, 2 * TILE * dv);
    let (v_at, q_at) = (kt, kt + vt);
    let (g_at, step) = (q_at + kt, kt + vt);
    let total = q_at + 2 * step;
    let mut s = String::new();
    addressing(&mut s, name);
    product(&mut s, &format!("{name}_scores"), ab, TILE, Operands::Shared);
    product(&mut s, &format!("{name}_dv"), ab, dv, Operands::RegistersTransposedB);
    if d != dv {
        product(&mut s, &format!("{name}_dk"), ab, d, Operands::RegistersTransposedB);
    }
    let dk_product = if d != dv { format!("{name}_dk") } else { format!("{name}_dv") };
    let mut head = spec.kv_head(name, ds.is_some());
    // Heads of 64: 178 registers a thread keep a third block off an SM;
    // capped at 168 (`__launch_bounds__(128, 3)`) ptxas spills 16 bytes,
    // and fwd+bwd at `[32, 12, 512, 64]` ran 0.456-0.470 ms against
    // 0.485-0.494 (the twenty-seventh measurement). At 128 the
    // accumulators alone are 128 registers: two blocks either way.
    if d.max(dv) == 64 {
        head = head.replacen("__global__ void ", "__global__ void __launch_bounds__(128, 3) ", 1);
    }
    s.push_str(&head);
    s.push_str("  typedef unsigned long long D;\n");
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, smem_raw, {});", total / 2 + 512);
    s.push_str("  const unsigned raw_at = (unsigned)__cvta_generic_to_shared(smem_raw);\n");
    s.push_str("  const unsigned tiles = raw_at + ((1024u - (raw_at & 1023u)) & 1023u);\n");
    // Each buffer's rows' lse (log2 units) and delta.
    let _ = writeln!(s, "  __shared__ float slse[{}], sdl[{}];", 2 * TILE, 2 * TILE);
    let grid = block_rows(&mut s, spec, sk, true);
    let keys = Rows { x: "k", strided: &spec.attn.k, n: d, len: sk };
    let values = Rows { x: "v", strided: &spec.attn.v, n: dv, len: sk };
    let queries = Rows { x: "q", strided: &spec.attn.q, n: d, len: sq };
    let grads = Rows { x: "dout", strided: &spec.g, n: dv, len: sq };
    for rows in [keys, values, queries, grads] {
        copier(&mut s, dtype, rows);
    }
    // K-major descriptors for the score products (A: the block's keys or
    // values; B: a tile of queries or gradients), MN-major for the
    // gradient products' B (a k-step of 16 queries is 2 KiB on).
    for (x, at, lead) in [
        ("k", 0, 16),
        ("v", v_at, 16),
        ("q", q_at, 16),
        ("g", g_at, 16),
        ("qt", q_at, 8192),
        ("gt", g_at, 8192),
    ] {
        let _ = writeln!(s, "  const D {x}_desc = {name}_desc(tiles + {at}u, {lead}, 1024);");
    }
    copies(&mut s, name, dtype, keys, "r_start", "tiles", "  ");
    copies(&mut s, name, dtype, values, "r_start", &format!("tiles + {v_at}u"), "  ");
    // Causal: query i sees key j <= i, so the rows before the block's
    // first key see none of its keys.
    let start = if spec.attn.causal { "r_start / 64 * 64" } else { "0" };
    let _ = writeln!(s, "  const I q_start = {start};\n  if (q_start < {sq}) {{");
    copies(&mut s, name, dtype, queries, "q_start", &format!("tiles + {q_at}u"), "    ");
    copies(&mut s, name, dtype, grads, "q_start", &format!("tiles + {g_at}u"), "    ");
    s.push_str("  }\n  kiln::cp_async_commit();\n");
    row_stats_tile(&mut s, sq, "0", "q_start");
    let _ = writeln!(s, "  float dk[{}][4], dvv[{}][4];", d / 8, dv / 8);
    zero_accumulator(&mut s, "dk", d / 8);
    zero_accumulator(&mut s, "dvv", dv / 8);
    let _ = writeln!(s, "  float sc[{}][4], dp[{}][4];\n  U pf[4][4], dsf[4][4];", TILE / 8, TILE / 8);

    let _ = writeln!(s, "  for (I i0 = q_start; i0 < {sq}; i0 += 64) {{");
    s.push_str("    const unsigned odd = (unsigned)((i0 - q_start) / 64) & 1u;\n");
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str(
        "    // cp.async writes are the generic proxy's; the tensor cores read through the async one.\n",
    );
    s.push_str("    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    s.push_str("    // This tile and its stats are visible to the block, and the last tile's\n");
    s.push_str("    // products (the only readers of the other buffer) are done.\n");
    s.push_str("    __syncthreads();\n");
    let _ = writeln!(s, "    const unsigned next = tiles + (odd ^ 1u) * {step}u;");
    let _ = writeln!(s, "    if (i0 + 64 < {sq}) {{");
    copies(&mut s, name, dtype, queries, "i0 + 64", &format!("next + {q_at}u"), "      ");
    copies(&mut s, name, dtype, grads, "i0 + 64", &format!("next + {g_at}u"), "      ");
    let mut stats = String::new();
    row_stats_tile(&mut stats, sq, "(odd ^ 1u)", "i0 + 64");
    tiles::indent(&mut s, "    ", &stats);
    s.push_str("    }\n    kiln::cp_async_commit();\n");
    s.push_str(
        "    const float* const lse_t = slse + odd * 64;\n    const float* const dl_t = sdl + odd * 64;\n",
    );
    let _ = writeln!(s, "    const D at = (D)((odd * {step}u) >> 4);");
    tile_products(&mut s, name, spec, ds, &dk_product);
    s.push_str("  }\n  kiln::cp_async_wait<0>();  // no copy outlives the block\n");
    store_dkv(&mut s, spec, &tag);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.reads(true)).with_shared(total + 1024)
}

/// A query tile's products, each group started as soon as its operands
/// are ready so the elementwise work runs under the products of the same
/// warpgroup: `Sᵀ` and `dPᵀ` are two groups, `Pᵀ` is computed while
/// `dPᵀ` runs, `dv += Pᵀ g` is issued at once and runs while `dSᵀ` is
/// computed (and stored), then `dk += dSᵀ q`. Each product's operands are
/// pinned ([`fence_operands`]) around its issue and wait; ptxas serializes
/// none of them (no C7514 warning). Against waiting for `Sᵀ` and `dPᵀ`
/// together and then for `dv` and `dk` together: the `dk, dv` kernel
/// 0.56 → 0.49 ms at `[8, 16, 2048, 128]` bf16 under ncu (a launch of two
/// batches), fwd+bwd 2.91-2.95 → 2.77-2.79 ms (benches/RESULTS.md, the
/// twenty-seventh measurement).
fn tile_products(s: &mut String, name: &str, spec: &GradSpec, ds: Option<&DsLayout>, dk_product: &str) {
    let Spec { dtype, d, dv, .. } = spec.attn;
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let scores = |s: &mut String, acc: &str, a: &str, b: &str, n: usize| {
        s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
        let _ = writeln!(s, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk)", n / 16);
        let _ = writeln!(
            s,
            "      {name}_scores({acc}, {a} + (D)((kk / 4) * 512 + (kk % 4) * 2), {b} + at + (D)((kk / 4) * 512 + (kk % 4) * 2), kk > 0);"
        );
        s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    };
    scores(s, "sc", "k_desc", "q_desc", d);
    scores(s, "dp", "v_desc", "g_desc", dv);
    wait(s, 1, "    ");
    fence_operands(s, "sc", TILE / 8, "f", "    ");
    let walk = |s: &mut String, body: &str| {
        let _ = writeln!(s, "    #pragma unroll\n    for (int n = 0; n < {}; ++n) {{", TILE / 8);
        s.push_str("      #pragma unroll\n      for (int e = 0; e < 4; ++e) {\n");
        s.push_str("        const int q_at = n * 8 + 2 * c + (e & 1);\n");
        let _ = writeln!(s, "{body}      }}\n    }}");
    };
    let p = format!(
        "        const int i = (int)i0 + q_at, j = e < 2 ? ia : ib;\n        {}\n        sc[n][e] = sc[n][e] == NEG_INF ? 0.f : exp2f(sc[n][e] - lse_t[q_at]);\n",
        spec.score("sc[n][e]", "sc[n][e]")
    );
    walk(s, &p);
    let pack = |s: &mut String, frag: &str, acc: &str| {
        s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk) {\n");
        for (x, group, at) in [(0, "2 * kk", 0), (1, "2 * kk", 2), (2, "2 * kk + 1", 0), (3, "2 * kk + 1", 2)]
        {
            let _ = writeln!(
                s,
                "      {frag}[kk][{x}] = kiln::pack2({acc}[{group}][{at}], {acc}[{group}][{}], {tag});",
                at + 1
            );
        }
        s.push_str("    }\n");
    };
    // A gradient product's group: `acc += frag · (B at desc)`, 4 k-steps of
    // 16 queries (2 KiB on, MN-major), its operands pinned for the issue.
    let gradient = |s: &mut String, product: &str, acc: &str, groups: usize, frag: &str, desc: &str| {
        fence_operands(s, frag, 4, "r", "    ");
        fence_operands(s, acc, groups, "f", "    ");
        s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
        s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk)\n");
        let _ = writeln!(s, "      {product}({acc}, {frag}[kk], {desc} + at + (D)(kk * 128), 1);");
        s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    };
    pack(s, "pf", "sc");
    gradient(s, &format!("{name}_dv"), "dvv", dv / 8, "pf", "gt_desc");
    wait(s, 1, "    ");
    fence_operands(s, "dp", TILE / 8, "f", "    ");
    walk(s, "        dp[n][e] = sc[n][e] * (dp[n][e] - dl_t[q_at]);\n");
    pack(s, "dsf", "dp");
    if let Some(ds) = ds {
        ds.tile_pointer(s, st, "0");
        s.push_str(
            "    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk) {\n      const U* const pa = dsf[kk];\n",
        );
        tiles::indent(s, "      ", &DsLayout::stores());
        s.push_str("    }\n");
    }
    gradient(s, dk_product, "dk", d / 8, "dsf", "qt_desc");
    wait(s, 0, "    ");
    for (x, groups, kind) in [("dvv", dv / 8, "f"), ("dk", d / 8, "f"), ("pf", 4, "r"), ("dsf", 4, "r")] {
        fence_operands(s, x, groups, kind, "    ");
    }
}

/// The `dq` kernel reading `dSᵀ` from `ds` (`attention_grad_ds.rs`'s,
/// on `wgmma`): a block is one warpgroup owning 64 queries, the rows of
/// its `dq` accumulator, and walks the key tiles they see; per tile one
/// group of 4 products `dq += dS k` (`m64n{d}k16`). The tile's keys are
/// copied into the 128-byte swizzle and read MN-major (a k-step of 16
/// keys is 2 KiB on), as the forward reads its values. Its `dSᵀ` tile (64
/// stored 8 × 8 blocks, 8 KiB contiguous) is copied as it lies, and each
/// warp loads its A fragments (16 queries × 16 keys a k-step) with
/// `ldmatrix.trans`, as the `mma.sync` kernel does: a block of keys ×
/// queries, transposed by the load, is a fragment of `dS`. Both are
/// double-buffered; 49 KiB of shared memory at heads of 128.
pub(crate) fn grad_q(name: &str, spec: &GradSpec, ds: &DsLayout) -> Kernel {
    let Spec { dtype, sq, sk, d, .. } = spec.attn;
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let ab = if dtype == DType::BF16 { "bf16" } else { "f16" };
    // Bytes: two buffers of (keys, dSᵀ), each part 1024-byte aligned.
    let (kt, dt) = (2 * TILE * d, 2 * TILE * TILE);
    let step = kt + dt;
    let total = 2 * step;
    let mut s = String::new();
    addressing(&mut s, name);
    product(&mut s, &format!("{name}_dq"), ab, d, Operands::RegistersTransposedB);
    s.push_str(&spec.head_with(name, st, true, &[format!("const {st}* __restrict__ ds")]));
    s.push_str("  typedef unsigned long long D;\n");
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, smem_raw, {});", total / 2 + 512);
    s.push_str("  const unsigned raw_at = (unsigned)__cvta_generic_to_shared(smem_raw);\n");
    s.push_str("  const unsigned tiles = raw_at + ((1024u - (raw_at & 1023u)) & 1023u);\n");
    let grid = block_rows(&mut s, spec, sq, false);
    key_end(&mut s, spec);
    let keys = Rows { x: "k", strided: &spec.attn.k, n: d, len: sk };
    copier(&mut s, dtype, keys);
    // This query tile's `dSᵀ` tiles: key tile `jt` is 4096 elements at `64 j0`.
    let _ = writeln!(
        s,
        "  const {st}* const dsr = ds + bh * {}LL + r_start * {}LL + t * 8;",
        ds.rows * ds.cols,
        ds.rows
    );
    let _ = writeln!(s, "  const D k_desc = {name}_desc(tiles, 8192, 1024);");
    // Lane l of warp w reads row l % 8 of matrix m = l / 8 of a k-step
    // `kk`: block (key block 2kk + m / 2, query block 2w + m % 2), 128
    // bytes at 128 (8 kb + qb).
    s.push_str(
        "  const unsigned a_at = ((lane >> 4) * 8 + 2 * w + ((lane >> 3) & 1)) * 128 + (lane & 7) * 16;\n",
    );
    let issue = |s: &mut String, from: &str, buf: &str, ind: &str| {
        copies(s, name, dtype, keys, from, buf, ind);
        let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int i = 0; i < 4; ++i)");
        let _ = writeln!(
            s,
            "{ind}  {name}_copy16({buf} + {kt}u + (t + i * 128) * 16, dsr + ({from}) * 64LL + i * 1024, 16);"
        );
    };
    s.push_str("  if (kend > 0) {\n");
    issue(&mut s, "0", "tiles", "    ");
    s.push_str("  }\n  kiln::cp_async_commit();\n");
    let _ = writeln!(s, "  float acc[{}][4];\n  U af[4][4];", d / 8);
    zero_accumulator(&mut s, "acc", d / 8);
    s.push_str("  for (I j0 = 0; j0 < kend; j0 += 64) {\n");
    s.push_str("    const unsigned odd = (unsigned)(j0 / 64) & 1u;\n");
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str(
        "    // cp.async writes are the generic proxy's; the tensor cores read through the async one.\n",
    );
    s.push_str("    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    s.push_str("    // This tile is visible to the block, and the last tile's readers are done.\n");
    s.push_str("    __syncthreads();\n");
    s.push_str("    if (j0 + 64 < kend) {\n");
    let _ = writeln!(s, "      const unsigned next = tiles + (odd ^ 1u) * {step}u;");
    issue(&mut s, "j0 + 64", "next", "      ");
    s.push_str("    }\n    kiln::cp_async_commit();\n");
    let _ = writeln!(s, "    const unsigned here = tiles + odd * {step}u;");
    s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk)\n");
    let _ = writeln!(
        s,
        "      asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\" : \"=r\"(af[kk][0]), \"=r\"(af[kk][1]), \"=r\"(af[kk][2]), \"=r\"(af[kk][3]) : \"r\"(here + {kt}u + a_at + kk * 2048u) : \"memory\");"
    );
    fence_operands(&mut s, "af", 4, "r", "    ");
    fence_operands(&mut s, "acc", d / 8, "f", "    ");
    s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    let _ = writeln!(s, "    const D kd = k_desc + (D)((odd * {step}u) >> 4);");
    s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk)\n");
    let _ = writeln!(s, "      {name}_dq(acc, af[kk], kd + (D)(kk * 128), 1);");
    s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    wait(&mut s, 0, "    ");
    fence_operands(&mut s, "acc", d / 8, "f", "    ");
    fence_operands(&mut s, "af", 4, "r", "    ");
    s.push_str("  }\n  kiln::cp_async_wait<0>();  // no copy outlives the block\n");
    store_dq(&mut s, spec, &tag);
    let mut reads = spec.reads(true);
    reads.push(reads.len());
    Kernel::new(name, s, grid as u32, THREADS as u32, reads).with_shared(total + 1024)
}
