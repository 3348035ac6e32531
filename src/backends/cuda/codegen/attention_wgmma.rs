//! The Hopper attention forward: `attention_mma.rs`'s schedule with its
//! products on `wgmma`, for f16 and bf16 heads on sm_90 devices (the
//! kernel is compiled for sm_90a, `nvrtc/mod.rs`).
//!
//! `mma.sync` on an H100 or H200 runs at about half the tensor cores' rate;
//! `wgmma` (one product issued by a warpgroup of 4 warps, its B operand
//! read from shared memory by the tensor cores themselves, asynchronously)
//! is how FlashAttention-3 and cuBLAS reach the rest. The schedule:
//!
//! - A block is one warpgroup (128 threads) owning 64 query rows of one
//!   (batch, head), 16 a warp: the rows of a `wgmma` accumulator
//!   (`m64nNk16`), whose per-warp layout is `mma.sync`'s, so the masks,
//!   the online softmax and the stores are `attention_mma.rs`'s own
//!   ([`online_softmax`], [`finish_rows`], [`store_rows`]).
//! - The queries are staged through shared memory once and held as A
//!   fragments in registers (the `wgmma` A-from-registers form): `S = q kᵀ`
//!   is `d / 16` products of `m64n64k16` per tile of 64 keys. The
//!   probabilities, rounded to the input type, are the A fragments of `p ·
//!   v` (4 products of `m64n{dv}k16` a tile) without leaving registers.
//! - Keys and values are double-buffered in shared memory in `wgmma`'s
//!   128-byte swizzled layout (which is why the kernel takes heads of 64
//!   and 128 only): a tile is column blocks of 64 elements, each 64 rows of
//!   128 bytes, the 16-byte chunk `c` of row `r` stored at chunk `(c ^ r) %
//!   8` of its row, from a 1024-byte aligned base. The keys are the score
//!   products' B operand read K-major (a k-step is 32 bytes on within a
//!   row, the next column block 8 KiB on), the values the value products'
//!   B read MN-major (`transposed`; a k-step of 16 keys is 2 KiB on, the
//!   column blocks 8 KiB apart). `cp.async` writes each row's 8 chunks as
//!   a permutation of its 128 bytes, without bank conflicts.
//!   The first layout, unswizzled core matrices of 128 contiguous bytes,
//!   gave the same values at 1.84 ms against this one's 1.17-1.20 ms
//!   (`[8,16,2048,128]`): the tensor cores' reads met bank conflicts.
//! - Per tile: this tile's values and the next tile's keys are waited for
//!   (`cp.async`; a `fence.proxy.async` makes those generic-proxy writes
//!   visible to the tensor cores' async-proxy reads), the next tile's
//!   score products are issued, the tile after's keys and the next tile's
//!   values are copied (into the buffers the last products read), this
//!   tile's softmax runs and its value products are issued. Each group of
//!   products is waited for at once, unless `KILN_CUDA_WGMMA_OVERLAP=1`
//!   ([`overlap`]; see there for why not).
//! - Registers that the products read or write asynchronously (the
//!   accumulators and the probabilities' fragments) are pinned by empty
//!   `asm` statements around each issue and wait, as CUTLASS's
//!   `warpgroup_fence_operand` does: without them, a fragment register
//!   was reused while a product still read it, and heads with values of
//!   64 came out wrong (the first build, on the GPU test).
//!
//! NaN, inf and removed keys behave as in `attention_mma.rs` (a removed
//! key inside a tile meets the product with weight 0).
//!
//! The emulator has no `wgmma`: the lowering picks this kernel only on an
//! sm_90 device (`Target::hopper`), and there only where [`chosen`]
//! (by default where it measured faster than the `mma.sync` kernel).
//! `tests/ops/attention_wgmma.rs` checks it against f64 on the GPU.

use super::attention::Spec;
use super::attention_mma::{finish_rows, one_tile_rows, online_softmax, store_rows};
use super::attention_tiles::{self as tiles, tile_load, PAD, THREADS};
use super::{types, Kernel};
use crate::ir::DType;
use std::fmt::Write;

/// Keys per tile (the `N` of the score products).
const KEYS: usize = 64;
/// Query rows a block: one warpgroup's `wgmma` accumulator.
const ROWS: usize = 64;

/// Whether the Hopper kernel takes `spec`: f16 or bf16 heads of 64 or 128
/// (whole 128-byte rows of the swizzled tiles; other widths keep the
/// `mma.sync` kernel), keys and values read 16 bytes at a time
/// (`cp.async`).
pub(crate) fn applies(spec: &Spec) -> bool {
    matches!(spec.dtype, DType::F16 | DType::BF16)
        && matches!(spec.d, 64 | 128)
        && matches!(spec.dv, 64 | 128)
        && tiles::vectorized(&spec.k, spec.d)
        && tiles::vectorized(&spec.v, spec.dv)
}

/// Whether an sm_90 device runs `spec` on this kernel: `KILN_CUDA_WGMMA=1`
/// wherever it [`applies`], `KILN_CUDA_WGMMA=0` nowhere, and by default
/// only where it measured faster than the `mma.sync` kernel side by side
/// (benches/RESULTS.md, the twenty-fifth measurement): causal heads of 64,
/// 0.101 against 0.110 ms at `[32,12,512,64]`. Elsewhere it measured 2-4%
/// slower (heads of 64 and 128, not causal) or the same (causal at 128).
pub(crate) fn chosen(spec: &Spec) -> bool {
    if !applies(spec) {
        return false;
    }
    match std::env::var("KILN_CUDA_WGMMA").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => spec.causal && spec.d == 64 && spec.dv == 64,
    }
}

/// Whether the next tile's score products are left in flight during this
/// tile's softmax (FlashAttention-3's overlap within a warpgroup),
/// `KILN_CUDA_WGMMA_OVERLAP=1`. Off by default: ptxas then serializes every
/// product of the kernel (C7514, "non wgmma instructions reading
/// accumulator registers ... between start and end of the pipeline
/// stage"), and it measured 5-7% slower than waiting for each group.
fn overlap() -> bool {
    std::env::var("KILN_CUDA_WGMMA_OVERLAP").is_ok_and(|v| v == "1")
}

/// The kernel for `spec` (which [`applies`]); with `lse`, it also writes
/// each row's log-sum-exp (an f32 `[b, h, sq]` parameter after `out`).
pub(crate) fn flash_wgmma(name: &str, spec: &Spec, lse: bool) -> Kernel {
    let Spec { dtype, batch, heads, sq, sk, d, dv, .. } = *spec;
    let st = types::storage(dtype);
    let tag = format!("{st}()");
    let ab = if dtype == DType::BF16 { "bf16" } else { "f16" };
    let qblocks = sq.div_ceil(ROWS).max(1);
    let grid = (batch * heads * qblocks).max(1);
    // Two buffers, each a tile of keys then a tile of values.
    let (kt, vt) = (KEYS * d, KEYS * dv);
    let total = 2 * (kt + vt);
    let mut s = String::new();
    s.push_str("#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)\n");
    s.push_str("#error \"the wgmma attention kernel is compiled for sm_90a only\"\n#endif\n");
    helpers(&mut s, name, ab, dv);
    s.push_str(&if lse {
        spec.flash_head_with(name, &["float* __restrict__ lse"])
    } else {
        spec.flash_head(name)
    });
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n");
    s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
    // The swizzled tiles start 1024-byte aligned (the swizzle repeats every
    // 8 rows of 128 bytes, from an aligned address).
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, smem_raw, {});", total + 512);
    s.push_str("  unsigned short* const tiles_smem = smem_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(smem_raw) & 1023u)) & 1023u) / 2;\n");
    s.push_str("  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;\n");
    spec.query_block(&mut s, qblocks, ROWS);
    s.push_str("  const int r0 = w * 16 + g;\n  const int ia = (int)i0 + r0, ib = ia + 8;\n");
    let end =
        if spec.causal { format!("i0 + {ROWS} < {sk} ? i0 + {ROWS} : (I){sk}") } else { format!("(I){sk}") };
    let _ = writeln!(s, "  const I kend = {end};");
    // The first tile's keys and values, then the queries staged in buffer
    // 1 (rows padded, as `attention_mma.rs` stages them) and held as
    // fragments, then the second tile's keys.
    s.push_str("  if (kend > 0) {\n");
    copies(&mut s, spec, Part::Keys, "0", "tiles_smem", "    ");
    copies(&mut s, spec, Part::Values, "0", "tiles_smem", "    ");
    s.push_str("  }\n  kiln::cp_async_commit();\n");
    let _ = writeln!(s, "  unsigned short* const qs = tiles_smem + {};", kt + vt);
    tile_load(&mut s, "q", &spec.q, d, "i0", sq, "qs", "0");
    s.push_str("  __syncthreads();\n");
    let kst = d + PAD;
    let _ = writeln!(s, "  U qf[{}][4];", d / 16);
    let _ = writeln!(s, "  #pragma unroll\n  for (int kk = 0; kk < {}; ++kk) {{", d / 16);
    for (x, row, col) in [(0, "", "0"), (1, " + 8", "0"), (2, "", "8"), (3, " + 8", "8")] {
        let _ = writeln!(s, "    qf[kk][{x}] = *(const U*)&qs[(r0{row}) * {kst} + kk * 16 + {col} + 2 * c];");
    }
    s.push_str("  }\n  __syncthreads();  // the staged queries are read before buffer 1 fills\n");
    s.push_str("  if (kend > 64) {\n");
    copies(&mut s, spec, Part::Keys, "64", "qs", "    ");
    s.push_str("  }\n  kiln::cp_async_commit();\n");
    one_tile_rows(&mut s, dv);
    // sc: this tile's scores; sn: the next tile's, in flight during this
    // tile's softmax. pf: the probabilities, in flight during the next
    // tile's first steps.
    let _ = writeln!(s, "  float sc[{g}][4], sn[{g}][4];\n  U pf[4][4] = {{}};", g = KEYS / 8);
    let scores = |s: &mut String, acc: &str, keys: &str, ind: &str| {
        let _ = writeln!(s, "{ind}asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");");
        let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int kk = 0; kk < {}; ++kk)", d / 16);
        let _ = writeln!(
            s,
            "{ind}  {name}_scores({acc}, qf[kk], {name}_desc({keys} + (kk / 4) * 4096 + (kk % 4) * 16, 16, 1024), kk > 0);"
        );
        let _ = writeln!(s, "{ind}asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");");
    };
    s.push_str("  if (kend > 0) {\n    kiln::cp_async_wait<1>();\n");
    s.push_str(
        "    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n    __syncthreads();\n",
    );
    scores(&mut s, "sc", "tiles_smem", "    ");
    wait(&mut s, 0, "    ");
    fence_operands(&mut s, "sc", KEYS / 8, "f", "    ");
    s.push_str("  }\n");

    // Tile j: its scores are in sc; the next keys' and these values'
    // copies are in flight, and so is the last tile's p · v.
    s.push_str("  for (I j0 = 0; j0 < kend; j0 += 64) {\n");
    let _ = writeln!(s, "    unsigned short* const kv = tiles_smem + (int)((j0 / 64) & 1) * {};", kt + vt);
    let _ = writeln!(
        s,
        "    unsigned short* const kv_next = tiles_smem + (int)((j0 / 64 + 1) & 1) * {};",
        kt + vt
    );
    s.push_str("    const bool more = j0 + 64 < kend;\n");
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str(
        "    // cp.async writes are the generic proxy's; the tensor cores read through the async one.\n",
    );
    s.push_str("    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    s.push_str("    __syncthreads();  // the next keys and these values are visible to the block\n");
    let sync = !overlap();
    s.push_str("    if (more) {\n");
    scores(&mut s, "sn", "kv_next", "      ");
    wait(&mut s, if sync { 0 } else { 1 }, "      ");
    s.push_str("    } else {\n");
    wait(&mut s, 0, "      ");
    s.push_str("    }\n");
    fence_operands(&mut s, "o", dv / 8, "f", "    ");
    fence_operands(&mut s, "pf", 4, "r", "    ");
    s.push_str("    __syncthreads();  // the last values' readers are done\n");
    s.push_str("    if (j0 + 128 < kend) {\n");
    copies(&mut s, spec, Part::Keys, "j0 + 128", "kv", "      ");
    s.push_str("    }\n    if (more) {\n");
    copies(&mut s, spec, Part::Values, "j0 + 64", "kv_next", "      ");
    s.push_str("    }\n    kiln::cp_async_commit();\n");
    online_softmax(&mut s, spec, 1, KEYS);
    // p · v: keys 16kk .. 16kk + 15 are two 8-key groups of the values, 32 dv bytes on.
    s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk) {\n");
    let _ = writeln!(s, "      pf[kk][0] = kiln::pack2(sc[2 * kk][0], sc[2 * kk][1], {tag});");
    let _ = writeln!(s, "      pf[kk][1] = kiln::pack2(sc[2 * kk][2], sc[2 * kk][3], {tag});");
    let _ = writeln!(s, "      pf[kk][2] = kiln::pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], {tag});");
    let _ =
        writeln!(s, "      pf[kk][3] = kiln::pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], {tag});\n    }}");
    // Every read of the scores and every write of the fragments happens
    // before the products start: ptxas serializes all of a kernel's
    // products (C7514) when other instructions touch an accumulator inside
    // a product's stage.
    fence_operands(&mut s, "sc", KEYS / 8, "f", "    ");
    fence_operands(&mut s, "pf", 4, "r", "    ");
    s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk)\n");
    let _ = writeln!(s, "      {name}_values(o, pf[kk], {name}_desc(kv + {kt} + kk * 1024, 8192, 1024), 1);");
    s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    if sync {
        wait(&mut s, 0, "    ");
    }
    s.push_str("    if (more) {\n");
    wait(&mut s, if sync { 0 } else { 1 }, "      ");
    fence_operands(&mut s, "sn", KEYS / 8, "f", "      ");
    let _ = writeln!(
        s,
        "      #pragma unroll\n      for (int n = 0; n < {}; ++n) {{ sc[n][0] = sn[n][0]; sc[n][1] = sn[n][1]; sc[n][2] = sn[n][2]; sc[n][3] = sn[n][3]; }}",
        KEYS / 8
    );
    s.push_str("    }\n  }\n");
    wait(&mut s, 0, "  ");
    fence_operands(&mut s, "o", dv / 8, "f", "  ");
    fence_operands(&mut s, "pf", 4, "r", "  ");

    let rows = finish_rows(&mut s, spec, 1, lse);
    store_rows(&mut s, spec, 1, &tag, rows);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.flash_reads()).with_shared(2 * total + 1024)
}

/// Which half of a key-value buffer [`copies`] fills.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Keys,
    Values,
}

/// A 64-key tile of keys or values, rows `start ..` (zeros past the
/// keys), into the key-value buffer `buf` (a pointer to its keys; the
/// values follow) by `cp.async`, in the swizzled layout of the module
/// docs.
fn copies(s: &mut String, spec: &Spec, part: Part, start: &str, buf: &str, ind: &str) {
    let sk = spec.sk;
    let (x, strided, n, at) = match part {
        Part::Keys => ("k", &spec.k, spec.d, 0),
        Part::Values => ("v", &spec.v, spec.dv, KEYS * spec.d),
    };
    let per = n / 8;
    let _ = writeln!(s, "{ind}#pragma unroll 4\n{ind}for (int e = t; e < {}; e += {THREADS}) {{", KEYS * per);
    let _ = writeln!(s, "{ind}  const int r = e / {per}, c = e % {per};");
    let _ = writeln!(s, "{ind}  const I j = {start} + r;");
    // Columns of 64 elements a block of 64 rows (8 KiB), 128 bytes a row,
    // chunk c of row r at chunk (c ^ r) % 8 of it: the 128-byte swizzle.
    let _ = writeln!(s, "{ind}  const int at = {at} + (c / 8) * 4096 + r * 64 + ((c ^ r) & 7) * 8;");
    let _ = writeln!(
        s,
        "{ind}  kiln::cp_async16(&{buf}[at], &{x}[{}], j < {sk});\n{ind}}}",
        strided.at("b", "h", &format!("(j < {sk} ? j : 0)"), "c * 8")
    );
}

/// Waits until at most `pending` groups of this warpgroup's products are
/// in flight.
fn wait(s: &mut String, pending: usize, ind: &str) {
    let _ = writeln!(s, "{ind}asm volatile(\"wgmma.wait_group.sync.aligned {pending};\" ::: \"memory\");");
}

/// Keeps the compiler from moving reads or writes of an array `x`
/// (`[groups][4]` of constraint `kind`: `f` floats, `r` 32-bit) across the
/// asynchronous products' issue and wait, which do not name them: the
/// accumulators, and the A fragments, whose registers must not be reused
/// before the products that read them are done.
fn fence_operands(s: &mut String, x: &str, groups: usize, kind: &str, ind: &str) {
    let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int n = 0; n < {groups}; ++n)");
    let _ = writeln!(
        s,
        "{ind}  asm volatile(\"\" : \"+{kind}\"({x}[n][0]), \"+{kind}\"({x}[n][1]), \"+{kind}\"({x}[n][2]), \"+{kind}\"({x}[n][3]) :: \"memory\");"
    );
}

/// The kernel's `wgmma` helpers, named after it (a program compiles
/// several kernels): the shared-memory matrix descriptor (no swizzle; byte
/// offsets in 16-byte units) and the two products, A from registers.
fn helpers(s: &mut String, name: &str, ab: &str, dv: usize) {
    let _ = writeln!(
        s,
        "__device__ __forceinline__ unsigned long long {name}_desc(const unsigned short* p, unsigned lead, unsigned stride) {{"
    );
    s.push_str("  const unsigned at = (unsigned)__cvta_generic_to_shared(p);\n");
    s.push_str("  return (unsigned long long)((at >> 4) & 0x3fffu) | ((unsigned long long)((lead >> 4) & 0x3fffu) << 16)\n");
    s.push_str("       | ((unsigned long long)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);\n}\n");
    product(s, &format!("{name}_scores"), ab, KEYS, false);
    product(s, &format!("{name}_values"), ab, dv, true);
}

/// `D (+)= A B` for a warpgroup: `m64nNk16`, f32 accumulators `d[N / 8][4]`,
/// A fragments in registers, B by descriptor (`transposed`: MN-major),
/// and D accumulated where `accumulate` is nonzero (else D = A B).
fn product(s: &mut String, fname: &str, ab: &str, n: usize, transposed: bool) {
    let regs = n / 2;
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void {fname}(float (&d)[{}][4], const kiln::u32 (&a)[4], unsigned long long b, int accumulate) {{",
        n / 8
    );
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let (a0, bd, p) = (regs, regs + 4, regs + 5);
    let _ = writeln!(
        s,
        "  asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p}, 0;\\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {{{}}}, {{%{a0}, %{}, %{}, %{}}}, %{bd}, p, 1, 1, {};\\n}}\\n\"",
        list.join(", "),
        a0 + 1,
        a0 + 2,
        a0 + 3,
        u8::from(transposed)
    );
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{}][{}])", i / 4, i % 4)).collect();
    let _ = writeln!(s, "    : {}", outs.join(", "));
    let _ = writeln!(
        s,
        "    : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(b), \"r\"(accumulate));\n}}"
    );
}
