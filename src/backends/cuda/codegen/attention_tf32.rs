//! The f32 tensor-core attention kernel: f32 heads whose dims are
//! multiples of 16 up to 128, computed on the tensor cores at f32
//! accuracy ("3xTF32", `kiln::mma_1688_tf32x3` in `kiln_mma.cuh`): each
//! operand is split into a tf32 part and the tf32 of its remainder, and
//! three tf32 products (the small ones first) give each product to about
//! 2^-21 of its size. With TF32 off, PyTorch's f32 efficient attention
//! computes the same way (CUTLASS's `OpMultiplyAddFastF32`); one tf32
//! product alone would be off by up to 2^-10, which is what TF32 off
//! rules out.
//!
//! FlashAttention-2's schedule, as `attention_mma.rs` runs it for f16 and
//! bf16 (its masks, online softmax and row sums are that kernel's code):
//!
//! - A block of 4 warps owns 64 query rows of one (batch, head), 16 a
//!   warp. The queries stay in shared memory, f32, and each warp reads its
//!   fragments a 16-wide chunk of the head at a time (one 16-byte load a
//!   row, two k-steps), split once per chunk and used by every key group.
//! - Keys come in tiles of 64 (32 past head dim 64, where the output takes
//!   twice the registers and the shared memory is larger), one buffer of
//!   keys and one of values (`attention_mma.rs`'s split schedule): the
//!   values' copies are in flight during the scores and the next keys'
//!   during `p · v`. Queries and keys rows are `≡ 16 (mod 32)` floats
//!   apart, so the 16-byte loads of a quarter-warp (two rows) fill the 32
//!   banks; value rows are `≡ 4 (mod 32)` apart, so the 8 lanes reading
//!   rows `2c` and `2c + 1` of one column each hit their own bank.
//! - The tf32 product's reduction index may be relabelled freely as long
//!   as both operands agree, which keeps every load a plain one: for
//!   `q kᵀ`, lane `(g, c)` reads head elements `4c .. 4c + 3` of a chunk
//!   (elements `4c`, `4c + 1` are the first k-step's columns `c`, `c + 4`;
//!   `4c + 2`, `4c + 3` the second's); for `p · v`, the accumulator's keys
//!   `2c`, `2c + 1` are the A fragment's columns `c`, `c + 4`, so the
//!   probabilities never leave their registers, and the values are read
//!   at rows `2c`, `2c + 1`, one element a load. (Interleaving the
//!   output's columns by 4, so that a lane read 4 values with one 16-byte
//!   load, was 5% slower at head dim 64: measured in RESULTS.md.)
//! - NaN and inf behave as in the f16/bf16 kernel: the split keeps an
//!   infinite input's products infinite, not `0 · inf` (`kiln::tf32_split`
//!   says how), so `+inf` values and queries reach their rows as the plain
//!   products would.
//!
//! Queries, keys and values must be readable 16 bytes at a time (heads of
//! a projection, permuted or not); other layouts, and the few-block
//! prefills the register-tiled CUDA-core kernel splits over keys, take
//! `attention_simt.rs`. `KILN_CUDA_TF32_ATTENTION=0` turns the kernel off
//! (for measuring it against the CUDA-core kernels in one process).

use super::attention::{Spec, Strided};
use super::attention_mma::{finish_rows, one_tile_rows, online_softmax};
use super::Kernel;
use crate::ir::DType;
use std::fmt::Write;

/// Query rows of a block: 16 a warp.
const ROWS: usize = 64;
/// Threads of a block.
const THREADS: usize = 128;
/// The largest head dim the kernel takes.
pub(crate) const MAX_HEAD_DIM: usize = 128;

/// Whether the kernel takes `spec`: f32 heads of 16-128 in steps of 16,
/// read 16 bytes at a time, more than 32 queries (a block owns 64: at 32
/// or fewer the register-tiled kernel's 32-row blocks waste none), and not
/// a shape the register-tiled kernel splits over keys.
pub(crate) fn applies(spec: &Spec) -> bool {
    let fits = |n: usize| n % 16 == 0 && (16..=MAX_HEAD_DIM).contains(&n);
    spec.dtype == DType::F32
        && fits(spec.d)
        && fits(spec.dv)
        && spec.sq > 32
        && vectorized(&spec.q, spec.d)
        && vectorized(&spec.k, spec.d)
        && vectorized(&spec.v, spec.dv)
        && !(super::attention_simt::applies(spec) && super::attention_simt::splits(spec) > 1)
        && !std::env::var("KILN_CUDA_TF32_ATTENTION").is_ok_and(|v| v == "0")
}

/// Whether an operand's rows of `n` floats can be read 4 at a time (16
/// bytes, aligned: buffers are 256-byte aligned).
pub(crate) fn vectorized(x: &Strided, n: usize) -> bool {
    x.strides[3] == 1 && n % 4 == 0 && x.offset % 4 == 0 && x.strides[..3].iter().all(|s| s % 4 == 0)
}

/// Keys per tile.
fn keys(spec: &Spec) -> usize {
    if spec.d.max(spec.dv) <= 64 {
        64
    } else {
        32
    }
}

/// Floats between rows of queries or keys in shared memory: `d` padded to
/// `16 (mod 32)` (see the module docs).
fn qk_stride(d: usize) -> usize {
    d + (48 - d % 32) % 32
}

/// Floats between rows of values in shared memory: `dv` padded to `4 (mod
/// 32)`.
fn v_stride(dv: usize) -> usize {
    dv + (36 - dv % 32) % 32
}

/// Code that copies rows `start .. start + rows` (zeros past `len`) of
/// operand `x` (`n` floats a row) into `smem` (row stride `stride`) by
/// `cp.async`, 16 bytes a thread.
#[allow(clippy::too_many_arguments)]
fn rows_async(
    s: &mut String,
    smem: &str,
    x: &str,
    strided: &Strided,
    n: usize,
    stride: usize,
    rows: usize,
    start: &str,
    len: usize,
    ind: &str,
) {
    let per = n / 4;
    let _ = writeln!(s, "{ind}for (int e = t; e < {}; e += {THREADS}) {{", rows * per);
    let _ =
        writeln!(s, "{ind}  const int r = e / {per}, c4 = e % {per} * 4;\n{ind}  const I j = {start} + r;");
    let _ = writeln!(
        s,
        "{ind}  kiln::cp_async16(&{smem}[r * {stride} + c4], &{x}[{}], j < {len});\n{ind}}}",
        strided.at("b", "h", &format!("(j < {len} ? j : 0)"), "c4")
    );
}

/// The kernel for `spec` (which [`applies`]); with `lse`, it also writes
/// each row's log-sum-exp (an f32 `[b, h, sq]` parameter after `out`).
pub(crate) fn flash_tf32(name: &str, spec: &Spec, lse: bool) -> Kernel {
    let Spec { batch, heads, sq, sk, d, dv, .. } = *spec;
    let keys = keys(spec);
    let (qks, vst) = (qk_stride(d), v_stride(dv));
    let qblocks = sq.div_ceil(ROWS).max(1);
    let grid = (batch * heads * qblocks).max(1);
    let mut s =
        if lse { spec.flash_head_with(name, &["float* __restrict__ lse"]) } else { spec.flash_head(name) };
    s.push_str("  typedef long long I;\n  typedef kiln::u32 U;\n  typedef kiln::vec4<float> V4;\n");
    s.push_str("  const float NEG_INF = __int_as_float(0xff800000);\n");
    // Queries, then one tile of keys and one of values.
    let (q_elems, k_elems) = (ROWS * qks, keys * qks);
    let total = q_elems + k_elems + keys * vst;
    let _ = writeln!(s, "  KILN_DYNAMIC_SHARED(float, tiles_smem, {total});");
    let _ = writeln!(s, "  float* const qs = tiles_smem;");
    let _ = writeln!(s, "  float* const ks = tiles_smem + {q_elems};");
    let _ = writeln!(s, "  float* const vs = tiles_smem + {};", q_elems + k_elems);
    s.push_str("  const int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, c = lane % 4;\n");
    spec.query_block(&mut s, qblocks, ROWS);
    s.push_str("  const int r0 = w * 16 + g;\n  const int ia = (int)i0 + r0, ib = ia + 8;\n");
    // The queries and the first keys; the loop waits for them.
    rows_async(&mut s, "qs", "q", &spec.q, d, qks, ROWS, "i0", sq, "  ");
    rows_async(&mut s, "ks", "k", &spec.k, d, qks, keys, "0", sk, "  ");
    s.push_str("  kiln::cp_async_commit();\n");
    one_tile_rows(&mut s, dv);
    let end =
        if spec.causal { format!("i0 + {ROWS} < {sk} ? i0 + {ROWS} : (I){sk}") } else { format!("(I){sk}") };
    let _ = writeln!(s, "  const I kend = {end};");

    let _ = writeln!(s, "  for (I j0 = 0; j0 < kend; j0 += {keys}) {{");
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str("    __syncthreads();  // these keys (and the queries) are visible; the last values' readers are done\n");
    rows_async(&mut s, "vs", "v", &spec.v, dv, vst, keys, "j0", sk, "    ");
    s.push_str("    kiln::cp_async_commit();\n");
    scores(&mut s, d, qks, keys);
    online_softmax(&mut s, spec, 1, keys);
    s.push_str("    kiln::cp_async_wait<0>();\n");
    s.push_str("    __syncthreads();  // these values are visible; the keys' readers are done\n");
    let _ = writeln!(s, "    if (j0 + {keys} < kend) {{");
    rows_async(&mut s, "ks", "k", &spec.k, d, qks, keys, &format!("j0 + {keys}"), sk, "      ");
    s.push_str("      kiln::cp_async_commit();\n    }\n");
    probabilities_times_values(&mut s, dv, vst, keys);
    s.push_str("  }\n");

    // The row sums; the output, two floats of a row a lane.
    let (i_of, _, _) = finish_rows(&mut s, spec, 1, lse);
    let _ = writeln!(s, "  #pragma unroll\n  for (int n = 0; n < {}; ++n) {{", dv / 8);
    s.push_str("    #pragma unroll\n    for (int r = 0; r < 2; ++r) {\n");
    let _ = writeln!(s, "      const int i = {i_of};\n      if (i >= {sq}) continue;");
    let _ = writeln!(s, "      float* const at = &out[{} + n * 8 + 2 * c];", spec.out_row("bh", "i"));
    s.push_str("      at[0] = o[n][2 * r] * l[r];\n      at[1] = o[n][2 * r + 1] * l[r];\n");
    s.push_str("    }\n  }\n}\n");
    let bytes = 4 * total;
    Kernel::new(name, s, grid as u32, THREADS as u32, spec.flash_reads()).with_shared(bytes)
}

/// (In the key loop.) `sc[n]`, the scores of the warp's 16 rows and keys
/// `j0 + 8n .. j0 + 8n + 7`, from `qs` and `ks` (row stride `stride`), 16
/// head elements a step: one 16-byte load of each row's queries and each
/// key's elements `4c .. 4c + 3`, split, feeding two k-steps.
fn scores(s: &mut String, d: usize, stride: usize, keys: usize) {
    let groups = keys / 8;
    let _ = writeln!(s, "    float sc[{groups}][4];");
    let _ = writeln!(
        s,
        "    #pragma unroll\n    for (int n = 0; n < {groups}; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;"
    );
    let _ = writeln!(s, "    #pragma unroll\n    for (int kc = 0; kc < {}; ++kc) {{", d / 16);
    let _ = writeln!(s, "      const V4 qa = kiln::load4(&qs[r0 * {stride} + kc * 16 + 4 * c]);");
    let _ = writeln!(s, "      const V4 qb = kiln::load4(&qs[(r0 + 8) * {stride} + kc * 16 + 4 * c]);");
    s.push_str("      U ab[2][4], as[2][4];\n");
    s.push_str("      #pragma unroll\n      for (int x = 0; x < 2; ++x) {\n");
    s.push_str("        kiln::tf32_split(qa.v[2 * x], ab[x][0], as[x][0]);\n");
    s.push_str("        kiln::tf32_split(qb.v[2 * x], ab[x][1], as[x][1]);\n");
    s.push_str("        kiln::tf32_split(qa.v[2 * x + 1], ab[x][2], as[x][2]);\n");
    s.push_str("        kiln::tf32_split(qb.v[2 * x + 1], ab[x][3], as[x][3]);\n      }\n");
    let _ = writeln!(s, "      #pragma unroll\n      for (int n = 0; n < {groups}; ++n) {{");
    let _ = writeln!(s, "        const V4 kx = kiln::load4(&ks[(n * 8 + g) * {stride} + kc * 16 + 4 * c]);");
    s.push_str("        U bb[2][2], bs[2][2];\n");
    s.push_str("        #pragma unroll\n        for (int x = 0; x < 2; ++x) {\n");
    s.push_str("          kiln::tf32_split(kx.v[2 * x], bb[x][0], bs[x][0]);\n");
    s.push_str("          kiln::tf32_split(kx.v[2 * x + 1], bb[x][1], bs[x][1]);\n");
    s.push_str("          kiln::mma_1688_tf32x3(sc[n], ab[x], as[x], bb[x], bs[x]);\n        }\n");
    s.push_str("      }\n    }\n");
}

/// (In the key loop, after the softmax.) `o[n] += p · v` over the tile's
/// keys, 8 a k-step: the probabilities of keys `2c`, `2c + 1` of a group
/// are the A fragment's columns `c`, `c + 4`, the values read at those
/// rows of `vs` (row stride `stride`).
fn probabilities_times_values(s: &mut String, dv: usize, stride: usize, keys: usize) {
    let _ = writeln!(s, "    #pragma unroll\n    for (int kk = 0; kk < {}; ++kk) {{", keys / 8);
    s.push_str("      U pb[4], ps[4];\n");
    s.push_str("      kiln::tf32_split(sc[kk][0], pb[0], ps[0]);\n");
    s.push_str("      kiln::tf32_split(sc[kk][2], pb[1], ps[1]);\n");
    s.push_str("      kiln::tf32_split(sc[kk][1], pb[2], ps[2]);\n");
    s.push_str("      kiln::tf32_split(sc[kk][3], pb[3], ps[3]);\n");
    let _ = writeln!(s, "      const float* const v0 = &vs[(kk * 8 + 2 * c) * {stride} + g];");
    let _ = writeln!(s, "      #pragma unroll\n      for (int n = 0; n < {}; ++n) {{", dv / 8);
    s.push_str("        U bb[2], bs[2];\n");
    s.push_str("        kiln::tf32_split(v0[n * 8], bb[0], bs[0]);\n");
    let _ = writeln!(s, "        kiln::tf32_split(v0[{stride} + n * 8], bb[1], bs[1]);");
    s.push_str("        kiln::mma_1688_tf32x3(o[n], pb, ps, bb, bs);\n      }\n    }\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_padded_to_their_bank_classes() {
        for d in (16..=128).step_by(16) {
            assert_eq!(qk_stride(d) % 32, 16, "d = {d}");
            assert_eq!(v_stride(d) % 32, 4, "dv = {d}");
            assert!(qk_stride(d) >= d && qk_stride(d) < d + 32);
            assert!(v_stride(d) >= d && v_stride(d) < d + 32);
        }
    }
}
