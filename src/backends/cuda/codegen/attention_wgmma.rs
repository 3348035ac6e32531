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
//! - The queries are copied once into shared memory, and `S = q kᵀ` is
//!   `d / 16` products of `m64n64k16` per tile of 64 keys with both
//!   operands read from there by the tensor cores. The probabilities,
//!   rounded to the input type, are the A fragments of `p · v` (4 products
//!   of `m64n{dv}k16` a tile) without leaving registers.
//! - Queries, keys and values lie in shared memory in `wgmma`'s 128-byte
//!   swizzled layout (which is why the kernel takes heads of 64 and 128
//!   only): a tile is column blocks of 64 elements, each 64 rows of 128
//!   bytes, the 16-byte chunk `c` of row `r` stored at chunk `(c ^ r) % 8`
//!   of its row, from a 1024-byte aligned base. Queries and keys are read
//!   K-major (a k-step is 32 bytes on within a row, the next column block
//!   8 KiB on), the values MN-major (`transposed`; a k-step of 16 keys is
//!   2 KiB on, the column blocks 8 KiB apart). `cp.async` writes each
//!   row's 8 chunks as a permutation of its 128 bytes, without bank
//!   conflicts. The first layout, unswizzled core matrices of 128
//!   contiguous bytes, gave the same values at 1.84 ms against 1.17-1.20
//!   for the swizzled one (`[8,16,2048,128]`): the tensor cores' reads met
//!   bank conflicts.
//! - Keys and values are double-buffered. Per tile: its copies are waited
//!   for (`cp.async`; a `fence.proxy.async` makes those generic-proxy
//!   writes visible to the tensor cores' async-proxy reads), one barrier
//!   makes them the block's and frees the other buffer (each warp has
//!   waited for the last tile's products), the next tile's copies start
//!   into it, and this tile's score products, softmax and value products
//!   run, each group of products waited for at once. That keeps 98-154
//!   registers (ptxas), so three or four blocks share an SM and overlap
//!   one another's softmax and products. Leaving the next tile's scores in
//!   flight during the softmax (FlashAttention-3's overlap within one
//!   warpgroup) made ptxas serialize every product (C7514) and ran 5-7%
//!   slower (benches/RESULTS.md, the twenty-fifth measurement).
//! - Addresses are computed once: each thread's rows, chunks and swizzled
//!   places in a tile ([`copier`]), and the matrix descriptors, to which a
//!   tile's or a k-step's offset is added ([`copies`] skips the row checks
//!   of a tile wholly inside its rows). Computed per copy and per product,
//!   they kept the integer pipe 60% busy and the tensor cores waiting: the
//!   same schedule ran 1.02 ms at `[8,16,2048,128]` against 0.60 now (ncu,
//!   the twenty-sixth measurement, where the tensor pipe is now the
//!   busiest, at 49%).
//! - Heads of 128 keep one buffer of values ([`single_values`]): two
//!   would take 81 KiB a block, and an SM would hold two blocks, not
//!   three (1.020-1.024 ms against 1.100-1.183 at `[8,16,2048,128]` before
//!   the addresses above were computed once, the
//!   twenty-sixth measurement).
//! - Registers that the products read or write asynchronously (the
//!   accumulators and the probabilities' fragments) are pinned by empty
//!   `asm` statements around each issue and wait, as CUTLASS's
//!   `warpgroup_fence_operand` does. The queries are not fragments in
//!   registers: held there across the tile loop, ptxas gave their
//!   registers to the probabilities' fragments as well at values of 64,
//!   and every tile after the first multiplied the wrong queries (its SASS,
//!   the twenty-fifth measurement); empty `asm` statements around them did
//!   not change that.
//!
//! NaN, inf and removed keys behave as in `attention_mma.rs` (a removed
//! key inside a tile meets the product with weight 0).
//!
//! The emulator has no `wgmma`: the lowering picks this kernel only on an
//! sm_90 device (`Target::hopper`), and there wherever it [`applies`]
//! ([`chosen`]).
//! `tests/ops/attention_wgmma.rs` checks it against f64 on the GPU.

use super::attention::{Spec, Strided};
use super::attention_mma::{finish_rows, one_tile_rows, online_softmax, store_rows};
use super::attention_tiles::{self as tiles, THREADS};
use super::{types, Kernel};
use crate::ir::DType;
use std::fmt::Write;

/// Keys per tile (the `N` of the score products).
const KEYS: usize = 64;
/// Query rows a block: one warpgroup's `wgmma` accumulator.
const ROWS: usize = 64;

/// Whether the Hopper kernel takes `spec`: f16 or bf16 heads of 64 or 128
/// (whole 128-byte rows of the swizzled tiles; other widths keep the
/// `mma.sync` kernel), queries, keys and values read 16 bytes at a time
/// (`cp.async`).
pub(crate) fn applies(spec: &Spec) -> bool {
    matches!(spec.dtype, DType::F16 | DType::BF16)
        && matches!(spec.d, 64 | 128)
        && matches!(spec.dv, 64 | 128)
        && tiles::vectorized(&spec.q, spec.d)
        && tiles::vectorized(&spec.k, spec.d)
        && tiles::vectorized(&spec.v, spec.dv)
}

/// Whether an sm_90 device runs `spec` on this kernel: wherever it
/// [`applies`], unless `KILN_CUDA_WGMMA=0`. It measured faster than the
/// `mma.sync` kernel on every row of benches/RESULTS.md's attention table
/// (the twenty-sixth measurement: 0.52x at `[8,16,2048,128]`, 0.65x at
/// `[32,12,512,64]`); the switch keeps the other kernel a variable away,
/// to compare or to rule this one out.
pub(crate) fn chosen(spec: &Spec) -> bool {
    applies(spec) && std::env::var("KILN_CUDA_WGMMA").as_deref() != Ok("0")
}

/// Whether the values of `spec` get one buffer instead of two: where two
/// buffers of keys and values and the queries would keep a third block
/// off an SM (heads of 128: 81 KiB a block, where an H100's or H200's 227
/// KiB hold two). A tile's values are then copied after the barrier that
/// opens it (every warp is past the last tile's value products), while
/// its scores and softmax run, and a second barrier waits for them.
fn single_values(spec: &Spec) -> bool {
    let double = 2 * 2 * KEYS * (spec.d + spec.dv) + 2 * ROWS * spec.d + 1024;
    3 * double > 227 * 1024
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
    // Two buffers, each a tile of keys then a tile of values, then the
    // queries: every part a whole number of 1024-byte swizzle blocks.
    let (kt, vt, qt) = (KEYS * d, KEYS * dv, ROWS * d);
    let single = single_values(spec);
    // Double-buffered: two (keys, values) buffers, then the queries.
    // Single values: two key buffers, one value buffer, the queries. Every
    // part is a whole number of 1024-byte swizzle blocks. In bytes:
    let (total, q_at, k_step, v_at, v_step) = if single {
        (2 * kt + vt + qt, 2 * kt + vt, kt, 2 * kt, 0)
    } else {
        (2 * (kt + vt) + qt, 2 * (kt + vt), kt + vt, kt, kt + vt)
    };
    let (q_at, k_step, v_at, v_step) = (2 * q_at, 2 * k_step, 2 * v_at, 2 * v_step);
    let mut s = String::new();
    helpers(&mut s, name, ab, dv);
    s.push_str(&if lse {
        spec.flash_head_with(name, &["float* __restrict__ lse"])
    } else {
        spec.flash_head(name)
    });
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n  typedef unsigned long long D;\n");
    s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
    // The swizzled tiles start 1024-byte aligned (the swizzle repeats every
    // 8 rows of 128 bytes, from an aligned address). Shared memory is
    // addressed by its 32-bit shared-window address from here on.
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(unsigned short, smem_raw, {});", total + 512);
    s.push_str("  const unsigned raw_at = (unsigned)__cvta_generic_to_shared(smem_raw);\n");
    s.push_str("  const unsigned tiles = raw_at + ((1024u - (raw_at & 1023u)) & 1023u);\n");
    s.push_str("  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;\n");
    spec.query_block(&mut s, qblocks, ROWS);
    s.push_str("  const int r0 = w * 16 + g;\n  const int ia = (int)i0 + r0, ib = ia + 8;\n");
    let end =
        if spec.causal { format!("i0 + {ROWS} < {sk} ? i0 + {ROWS} : (I){sk}") } else { format!("(I){sk}") };
    let _ = writeln!(s, "  const I kend = {end};");
    // Each thread's row, chunk and place in a tile, once: the copies and
    // descriptors below are these plus constants (an ALU-bound kernel
    // otherwise, ncu: the integer pipe 60% busy).
    for part in [Part::Queries, Part::Keys, Part::Values] {
        copier(&mut s, dtype, part_of(spec, part));
    }
    // Descriptors: the 14-bit start address (16-byte units) is the low
    // field, so an offset below 256 KiB is added to the whole word.
    let _ = writeln!(s, "  const D q_desc = {name}_desc(tiles + {q_at}u, 16, 1024);");
    let _ = writeln!(s, "  const D k_desc = {name}_desc(tiles, 16, 1024);");
    let _ = writeln!(s, "  const D v_desc = {name}_desc(tiles + {v_at}u, 8192, 1024);");
    // The queries and the first tile's keys (and values).
    copies(&mut s, name, dtype, part_of(spec, Part::Queries), "i0", &format!("tiles + {q_at}u"), "  ");
    s.push_str("  if (kend > 0) {\n");
    copies(&mut s, name, dtype, part_of(spec, Part::Keys), "0", "tiles", "    ");
    if !single {
        copies(&mut s, name, dtype, part_of(spec, Part::Values), "0", &format!("tiles + {v_at}u"), "    ");
    }
    s.push_str("  }\n  kiln::cp_async_commit();\n");
    one_tile_rows(&mut s, dv);
    let _ = writeln!(s, "  float sc[{}][4];\n  U pf[4][4];", KEYS / 8);

    s.push_str("  for (I j0 = 0; j0 < kend; j0 += 64) {\n");
    s.push_str("    const unsigned odd = (unsigned)(j0 / 64) & 1u;\n");
    let _ = writeln!(
        s,
        "    const unsigned ks = tiles + odd * {k_step}u, ks_next = tiles + (odd ^ 1u) * {k_step}u;"
    );
    if single {
        let _ = writeln!(s, "    const unsigned vs = tiles + {v_at}u;");
    }
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str(
        "    // cp.async writes are the generic proxy's; the tensor cores read through the async one.\n",
    );
    s.push_str("    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
    if single {
        s.push_str("    // These keys are visible to the block, and the last tile's products (the\n");
        s.push_str("    // only readers of ks_next and vs) are done: each warp waited for its own.\n");
        s.push_str("    __syncthreads();\n");
        copies(&mut s, name, dtype, part_of(spec, Part::Values), "j0", "vs", "    ");
        s.push_str("    kiln::cp_async_commit();\n    if (j0 + 64 < kend) {\n");
        copies(&mut s, name, dtype, part_of(spec, Part::Keys), "j0 + 64", "ks_next", "      ");
    } else {
        s.push_str("    // This tile is visible to the block, and the last tile's products (the\n");
        s.push_str("    // only readers of the other buffer) are done: each warp waited for its own.\n");
        s.push_str("    __syncthreads();\n");
        s.push_str("    if (j0 + 64 < kend) {\n");
        copies(&mut s, name, dtype, part_of(spec, Part::Keys), "j0 + 64", "ks_next", "      ");
        copies(
            &mut s,
            name,
            dtype,
            part_of(spec, Part::Values),
            "j0 + 64",
            &format!("ks_next + {v_at}u"),
            "      ",
        );
    }
    s.push_str("    }\n    kiln::cp_async_commit();\n");
    // S = q kᵀ: both operands from shared memory, K-major, a k-step 32
    // bytes on within a row (2 in descriptor units) and the next column
    // block 8 KiB on (512).
    let _ = writeln!(s, "    const D kd = k_desc + (D)((odd * {k_step}u) >> 4);");
    s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    let _ = writeln!(s, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk)", d / 16);
    let _ = writeln!(
        s,
        "      {name}_scores(sc, q_desc + (D)((kk / 4) * 512 + (kk % 4) * 2), kd + (D)((kk / 4) * 512 + (kk % 4) * 2), kk > 0);"
    );
    s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    wait(&mut s, 0, "    ");
    fence_operands(&mut s, "sc", KEYS / 8, "f", "    ");
    online_softmax(&mut s, spec, 1, KEYS);
    // p · v: keys 16kk .. 16kk + 15 are two 8-key groups of the scores;
    // the values read MN-major, a k-step of 16 keys 2 KiB on (128 units).
    s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk) {\n");
    let _ = writeln!(s, "      pf[kk][0] = kiln::pack2(sc[2 * kk][0], sc[2 * kk][1], {tag});");
    let _ = writeln!(s, "      pf[kk][1] = kiln::pack2(sc[2 * kk][2], sc[2 * kk][3], {tag});");
    let _ = writeln!(s, "      pf[kk][2] = kiln::pack2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], {tag});");
    let _ =
        writeln!(s, "      pf[kk][3] = kiln::pack2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], {tag});\n    }}");
    if single {
        s.push_str("    kiln::cp_async_wait<1>();  // these values (the next keys may stay in flight)\n");
        s.push_str("    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n");
        s.push_str("    __syncthreads();\n");
    }
    // Every write of the fragments and the rescale of `o` happen before
    // the products start, and nothing touches them until their wait.
    fence_operands(&mut s, "pf", 4, "r", "    ");
    fence_operands(&mut s, "o", dv / 8, "f", "    ");
    let _ = writeln!(s, "    const D vd = v_desc + (D)((odd * {v_step}u) >> 4);");
    s.push_str("    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n");
    s.push_str("    #pragma unroll\n    for (int kk = 0; kk < 4; ++kk)\n");
    let _ = writeln!(s, "      {name}_values(o, pf[kk], vd + (D)(kk * 128), 1);");
    s.push_str("    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    wait(&mut s, 0, "    ");
    fence_operands(&mut s, "o", dv / 8, "f", "    ");
    fence_operands(&mut s, "pf", 4, "r", "    ");
    s.push_str("  }\n  kiln::cp_async_wait<0>();  // no copy outlives the block (no keys: the queries')\n");

    let rows = finish_rows(&mut s, spec, 1, lse);
    store_rows(&mut s, spec, 1, &tag, rows);
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.flash_reads()).with_shared(2 * total + 1024)
}

/// Which tile of the forward [`copies`] fills.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    /// The block's 64 query rows (zeros past the queries).
    Queries,
    /// A tile of keys.
    Keys,
    /// A tile of values.
    Values,
}

/// The rows the forward copies for `part`.
fn part_of(spec: &Spec, part: Part) -> Rows<'_> {
    match part {
        Part::Queries => Rows { x: "q", strided: &spec.q, n: spec.d, len: spec.sq },
        Part::Keys => Rows { x: "k", strided: &spec.k, n: spec.d, len: spec.sk },
        Part::Values => Rows { x: "v", strided: &spec.v, n: spec.dv, len: spec.sk },
    }
}

/// A `[b, h, len, n]` operand that tiles of 64 of its rows are copied
/// from into the swizzled layout: its parameter's name `x` in the kernel
/// (`b` and `h` in scope), strides, row length (64 or 128) and rows.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub x: &'static str,
    pub strided: &'a Strided,
    pub n: usize,
    pub len: usize,
}

/// Declares what each thread's copies of `rows` start from: a thread
/// copies chunk `xc` (16 bytes) of rows `xr`, `xr + THREADS / per`, ...
/// of a tile, to byte `x_at` (then a constant step) of it in the swizzled
/// layout of the module docs (the rows it copies differ by a multiple of
/// 8, so the swizzle's `(c ^ r) % 8` is the same for each), and from
/// `xg`, its chunk of row 0.
pub(super) fn copier(s: &mut String, dtype: DType, rows: Rows<'_>) {
    let Rows { x, strided, n, .. } = rows;
    let st = types::storage(dtype);
    let per = n / 8;
    let _ = writeln!(s, "  const int {x}r = t / {per}, {x}c = t % {per};");
    // Columns of 64 elements a block of 64 rows (8 KiB), 128 bytes a row,
    // chunk c of row r at chunk (c ^ r) % 8 of it: the 128-byte swizzle.
    let _ =
        writeln!(s, "  const unsigned {x}_at = ({x}c / 8) * 8192 + {x}r * 128 + (({x}c ^ {x}r) & 7) * 16;");
    let _ =
        writeln!(s, "  const {st}* const {x}g = {x} + {};", strided.at("b", "h", "0", &format!("{x}c * 8")));
}

/// 64 rows `start ..` of `rows` (zeros past their end) by `cp.async` into
/// the tile at shared address `buf` (see [`copier`]); a tile wholly inside
/// the rows skips the checks.
pub(super) fn copies(
    s: &mut String,
    name: &str,
    dtype: DType,
    rows: Rows<'_>,
    start: &str,
    buf: &str,
    ind: &str,
) {
    let Rows { x, strided, n, len } = rows;
    let st = types::storage(dtype);
    let step = THREADS / (n / 8);
    let passes = KEYS / step;
    let rs = strided.strides[2];
    let _ = writeln!(s, "{ind}{{\n{ind}  const I j = {start} + {x}r;");
    let _ = writeln!(s, "{ind}  const {st}* const p = {x}g + j * {rs}LL;");
    let _ = writeln!(s, "{ind}  const unsigned at = {buf} + {x}_at;");
    let _ = writeln!(s, "{ind}  if ({start} + 64 <= {len}) {{\n{ind}    #pragma unroll\n{ind}    for (int i = 0; i < {passes}; ++i)");
    let _ = writeln!(s, "{ind}      {name}_copy16(at + i * {}u, p + i * {}LL, 16);", step * 128, step * rs);
    let _ = writeln!(
        s,
        "{ind}  }} else {{\n{ind}    #pragma unroll\n{ind}    for (int i = 0; i < {passes}; ++i) {{"
    );
    let _ = writeln!(s, "{ind}      const bool in = j + i * {step} < {len};");
    let _ = writeln!(
        s,
        "{ind}      {name}_copy16(at + i * {}u, in ? p + i * {}LL : {x}g, in ? 16 : 0);\n{ind}    }}\n{ind}  }}\n{ind}}}",
        step * 128,
        step * rs
    );
}

/// Waits until at most `pending` groups of this warpgroup's products are
/// in flight.
pub(super) fn wait(s: &mut String, pending: usize, ind: &str) {
    let _ = writeln!(s, "{ind}asm volatile(\"wgmma.wait_group.sync.aligned {pending};\" ::: \"memory\");");
}

/// Keeps the compiler from moving reads or writes of an array `x`
/// (`[groups][4]` of constraint `kind`: `f` floats, `r` 32-bit) across the
/// asynchronous products' issue and wait, which do not name them: the
/// accumulators, and the A fragments, whose registers must not be reused
/// before the products that read them are done.
pub(super) fn fence_operands(s: &mut String, x: &str, groups: usize, kind: &str, ind: &str) {
    let _ = writeln!(s, "{ind}#pragma unroll\n{ind}for (int n = 0; n < {groups}; ++n)");
    let _ = writeln!(
        s,
        "{ind}  asm volatile(\"\" : \"+{kind}\"({x}[n][0]), \"+{kind}\"({x}[n][1]), \"+{kind}\"({x}[n][2]), \"+{kind}\"({x}[n][3]) :: \"memory\");"
    );
}

/// The kernel's `wgmma` helpers, named after it (a program compiles
/// several kernels): the shared-memory matrix descriptor of a shared
/// address (128-byte swizzle; byte offsets in 16-byte units), a 16-byte
/// `cp.async` to a shared address, the score product (both
/// operands from shared memory) and the value product (A, the
/// probabilities, from registers).
fn helpers(s: &mut String, name: &str, ab: &str, dv: usize) {
    addressing(s, name);
    product(s, &format!("{name}_scores"), ab, KEYS, Operands::Shared);
    product(s, &format!("{name}_values"), ab, dv, Operands::RegistersTransposedB);
}

/// The opening of a `wgmma` kernel's source: the error that keeps it off
/// targets other than sm_90a, the shared-memory matrix descriptor of a
/// shared address (128-byte swizzle; byte offsets in 16-byte units) and a
/// 16-byte `cp.async` to a shared address, named after the kernel.
pub(super) fn addressing(s: &mut String, name: &str) {
    s.push_str("#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)\n");
    s.push_str("#error \"wgmma kernels are compiled for sm_90a only\"\n#endif\n");
    let _ = writeln!(
        s,
        "__device__ __forceinline__ unsigned long long {name}_desc(unsigned at, unsigned lead, unsigned stride) {{"
    );
    s.push_str("  return (unsigned long long)((at >> 4) & 0x3fffu) | ((unsigned long long)((lead >> 4) & 0x3fffu) << 16)\n");
    s.push_str("       | ((unsigned long long)((stride >> 4) & 0x3fffu) << 32) | (1ull << 62);\n}\n");
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void {name}_copy16(unsigned at, const void* g, int bytes) {{"
    );
    s.push_str("  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(at), \"l\"(g), \"r\"(bytes));\n}\n");
}

/// Where a product's operands are: both in shared memory, K-major (the
/// scores: queries and keys), or A in registers and B MN-major in shared
/// memory (the values).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Operands {
    Shared,
    RegistersTransposedB,
}

/// `D (+)= A B` for a warpgroup: `m64nNk16`, f32 accumulators `d[N / 8][4]`,
/// B (and A, where [`Operands::Shared`]) by descriptor, and D accumulated
/// where `accumulate` is nonzero (else D = A B).
pub(super) fn product(s: &mut String, fname: &str, ab: &str, n: usize, operands: Operands) {
    let regs = n / 2;
    let a_param = match operands {
        Operands::Shared => "unsigned long long a",
        Operands::RegistersTransposedB => "const kiln::u32 (&a)[4]",
    };
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void {fname}(float (&d)[{}][4], {a_param}, unsigned long long b, int accumulate) {{",
        n / 8
    );
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let a0 = regs;
    let (a, bd, tail) = match operands {
        Operands::Shared => (format!("%{a0}"), a0 + 1, "1, 1, 0, 0"),
        Operands::RegistersTransposedB => {
            (format!("{{%{a0}, %{}, %{}, %{}}}", a0 + 1, a0 + 2, a0 + 3), a0 + 4, "1, 1, 1")
        }
    };
    let p = bd + 1;
    let _ = writeln!(
        s,
        "  asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p}, 0;\\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ab}.{ab} {{{}}}, {a}, %{bd}, p, {tail};\\n}}\\n\"",
        list.join(", "),
    );
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{}][{}])", i / 4, i % 4)).collect();
    let _ = writeln!(s, "    : {}", outs.join(", "));
    let ins = match operands {
        Operands::Shared => "\"l\"(a)",
        Operands::RegistersTransposedB => "\"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3])",
    };
    let _ = writeln!(s, "    : {ins}, \"l\"(b), \"r\"(accumulate));\n}}");
}
