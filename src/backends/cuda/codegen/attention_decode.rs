//! Split-key ("flash-decoding") attention for short query lengths: a
//! decode step's one query over a KV cache, where the flash kernels of
//! `attention.rs` run one thread (or one 16-row warp tile) per query row
//! and so walk all of a head's keys on one or a few threads.
//!
//! A block of [`THREADS`] threads owns one query row of one (batch, head)
//! and one chunk of [`CHUNK`] keys: thread `t` computes key `t`'s score
//! (its own dot product over the head dim, the query in shared memory),
//! the block reduces the chunk's maximum and sum, and the threads then
//! split the value dims, each adding `e^(s - m) v` over the chunk's keys.
//! With one chunk (up to [`CHUNK`] keys) the block writes the output;
//! otherwise it writes its partial maximum, sum and unnormalized output
//! (f32, f64 for f64) to a workspace, and [`combine`] merges a row's
//! chunks: `out = Σ e^(m_s - M) o_s / Σ e^(m_s - M) l_s`.
//!
//! The rules are the CUDA-core kernel's (`attention.rs`): removed keys
//! (bounds, causal `j > i`, a false bool mask, an additive `-inf`) are
//! skipped, never weighted by 0, so a NaN value of a removed key stays out;
//! a row with no key left writes zeros; a NaN score makes its row NaN (the
//! maximum lets NaN win, and every term is then NaN). f16, bf16 and f32
//! accumulate in f32, f64 in f64.
//!
//! Every thread reaches every `__syncthreads`, so the kernels run as they
//! are on the CPU emulator.

use super::attention::Spec;
use super::{types, Kernel};
use crate::ir::{AttnMask, DType};
use std::fmt::Write;

/// Query rows at most for which the split-key kernel is used.
pub(crate) const MAX_QUERIES: usize = 16;
/// Keys at least for which it is used: with fewer, a row's keys are one
/// tile of the flash kernels, which keep them.
pub(crate) const MIN_KEYS: usize = 32;
/// Keys per block (one per thread when scoring).
pub(crate) const CHUNK: usize = 128;
/// Threads of a block.
const THREADS: usize = 128;

/// Whether the split-key kernel takes `spec`: few query rows, enough
/// keys, and a head the flash kernel also takes.
pub(crate) fn applies(spec: &Spec) -> bool {
    spec.sq <= MAX_QUERIES && spec.sk >= MIN_KEYS && spec.d.max(spec.dv) <= super::attention::MAX_HEAD_DIM
}

/// Key chunks per query row.
pub(crate) fn chunks(spec: &Spec) -> usize {
    spec.sk.div_ceil(CHUNK).max(1)
}

/// The accumulator's C type and its size in bytes.
pub(crate) fn acc_type(dtype: DType) -> (&'static str, usize) {
    if dtype == DType::F64 {
        ("double", 8)
    } else {
        ("float", 4)
    }
}

/// Workspace bytes when [`chunks`] > 1: per (row, chunk) the maximum, the
/// sum and `dv` output sums.
pub(crate) fn workspace_bytes(spec: &Spec) -> u64 {
    let rows = spec.batch * spec.heads * spec.sq;
    (rows * chunks(spec) * (spec.dv + 2) * acc_type(spec.dtype).1) as u64
}

/// The split-key kernel: `out` is the output (one chunk) or the workspace.
pub(crate) fn partial(name: &str, spec: &Spec) -> Kernel {
    let Spec { dtype, batch, heads, sq, sk, d, dv, .. } = *spec;
    let split = chunks(spec);
    let (acc, _) = acc_type(dtype);
    let st = types::storage(dtype);
    let load = |e: &str| types::load(dtype, e);
    let out_param =
        if split == 1 { format!("{st}* __restrict__ out") } else { format!("{acc}* __restrict__ ws") };
    let mut p = vec![
        out_param,
        format!("const {st}* __restrict__ q"),
        format!("const {st}* __restrict__ k"),
        format!("const {st}* __restrict__ v"),
    ];
    if spec.mask != AttnMask::None {
        p.push(format!("const {}* __restrict__ mask", types::storage(spec.mask_dtype)));
    }
    let (inf, ex) = if acc == "double" {
        ("__longlong_as_double(0xfff0000000000000LL)", "exp")
    } else {
        ("__int_as_float(0xff800000)", "expf")
    };
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "));
    let _ = writeln!(s, "  typedef long long I;\n  typedef {acc} A;\n  const A NEG_INF = {inf};");
    let _ = writeln!(s, "  __shared__ A qs[{}];\n  __shared__ A sc[{CHUNK}];", d.max(1));
    let _ = writeln!(s, "  __shared__ A red[{}];", THREADS / 32);
    s.push_str("  const int t = threadIdx.x, lane = t % 32, w = t / 32;\n");
    // Block = ((b * heads + h) * sq + i) * split + chunk.
    let _ = writeln!(s, "  const I chunk = (I)blockIdx.x % {split}, row = (I)blockIdx.x / {split};");
    let _ = writeln!(s, "  const I i = row % {sq}, bh = row / {sq};", sq = sq.max(1));
    let _ = writeln!(s, "  const I b = bh / {heads}, h = bh % {heads};", heads = heads.max(1));
    let _ = writeln!(
        s,
        "  for (int c = t; c < {d}; c += {THREADS}) qs[c] = (A){};",
        load(&format!("q[{}]", spec.q.at("b", "h", "i", "c")))
    );
    s.push_str("  __syncthreads();\n");
    // This thread's key and its score (NEG_INF when removed).
    let _ = writeln!(s, "  const I j = chunk * {CHUNK} + t;");
    let mut removed = format!("j >= {sk}");
    if spec.causal {
        removed.push_str(" || j > i");
    }
    let mut score = format!("dot * (A){:?}", spec.scale);
    let mut pre = String::new();
    if let Some(m) = &spec.m {
        let at = format!("mask[{}]", m.at("b", "h", "i", "j"));
        match spec.mask {
            AttnMask::Keep => {
                let _ = writeln!(pre, "  const bool keep = ({removed}) ? false : (bool){at};");
                removed = "!keep".into();
            }
            AttnMask::Additive => {
                let _ = writeln!(
                    pre,
                    "  const A add = ({removed}) ? (A)0 : (A){};",
                    types::load(spec.mask_dtype, &at)
                );
                score.push_str(" + add");
            }
            AttnMask::None => {}
        }
    }
    s.push_str(&pre);
    let _ = writeln!(s, "  A mine = NEG_INF;\n  if (!({removed})) {{\n    A dot = 0;");
    let _ = writeln!(
        s,
        "    #pragma unroll 8\n    for (int c = 0; c < {d}; ++c) dot += qs[c] * (A){};",
        load(&format!("k[{}]", spec.k.at("b", "h", "j", "c")))
    );
    let _ = writeln!(s, "    mine = {score};\n  }}");
    let _ = writeln!(s, "  if (t < {CHUNK}) sc[t] = mine;");
    // The chunk's maximum, NaN winning (`sc != sc` holds for NaN only).
    s.push_str("  A mx = mine;\n");
    s.push_str("  for (int o = 16; o > 0; o >>= 1) {\n");
    s.push_str("    const A y = kiln::shfl_xor(mx, o);\n");
    s.push_str("    mx = (y > mx || (y != y && mx == mx)) ? y : mx;\n  }\n");
    s.push_str("  if (lane == 0) red[w] = mx;\n  __syncthreads();\n");
    s.push_str("  mx = red[0];\n");
    let _ = writeln!(
        s,
        "  for (int x = 1; x < {}; ++x) mx = (red[x] > mx || (red[x] != red[x] && mx == mx)) ? red[x] : mx;",
        THREADS / 32
    );
    // Probabilities (0 for removed keys, which are skipped below) and the sum.
    let _ = writeln!(s, "  const A pr = mine == NEG_INF ? (A)0 : {ex}(mine - mx);");
    s.push_str("  A sum = pr;\n");
    s.push_str("  for (int o = 16; o > 0; o >>= 1) sum += kiln::shfl_xor(sum, o);\n");
    s.push_str("  __syncthreads();  // every thread has read red's maxima\n");
    s.push_str("  if (lane == 0) red[w] = sum;\n");
    let _ = writeln!(s, "  if (t < {CHUNK}) sc[t] = mine == NEG_INF ? NEG_INF : pr;");
    s.push_str("  __syncthreads();\n  sum = 0;\n");
    let _ = writeln!(s, "  for (int x = 0; x < {}; ++x) sum += red[x];", THREADS / 32);
    // Keys of this chunk that exist (the last chunk may be short).
    let _ = writeln!(
        s,
        "  const int n = {sk} - chunk * {CHUNK} < {CHUNK} ? (int)({sk} - chunk * {CHUNK}) : {CHUNK};"
    );
    let _ = writeln!(s, "  for (int c = t; c < {dv}; c += {THREADS}) {{\n    A o = 0;");
    s.push_str("    #pragma unroll 4\n    for (int r = 0; r < n; ++r) {\n");
    s.push_str("      const A pv = sc[r];\n      if (pv == NEG_INF) continue;\n");
    let _ = writeln!(
        s,
        "      o += pv * (A){};\n    }}",
        load(&format!("v[{}]", spec.v.at("b", "h", &format!("(chunk * {CHUNK} + r)"), "c")))
    );
    if split == 1 {
        s.push_str("    const A inv = sum == 0 ? (A)0 : (A)1 / sum;\n");
        let _ = writeln!(
            s,
            "    out[(bh * {sq} + i) * {dv} + c] = {};\n  }}\n}}",
            types::store(dtype, &format!("({})(o * inv)", types::compute(dtype)))
        );
    } else {
        // Workspace of (row, chunk): [max, sum, o_0 .. o_dv).
        let _ = writeln!(s, "    ws[(row * {split} + chunk) * {} + 2 + c] = o;\n  }}", dv + 2);
        let _ = writeln!(
            s,
            "  if (t == 0) {{\n    ws[(row * {split} + chunk) * {w}] = mx;\n    ws[(row * {split} + chunk) * {w} + 1] = sum;\n  }}\n}}",
            w = dv + 2
        );
    }
    let grid = (batch * heads * sq * split).max(1);
    Kernel::new(
        name,
        s,
        grid as u32,
        THREADS as u32,
        if spec.mask == AttnMask::None { vec![0, 1, 2] } else { vec![0, 1, 2, 3] },
    )
}

/// Merges the chunks of every row from the workspace into `out`: a block
/// per row, a thread per value dim.
pub(crate) fn combine(name: &str, spec: &Spec) -> Kernel {
    let Spec { dtype, batch, heads, sq, dv, .. } = *spec;
    let split = chunks(spec);
    let (acc, _) = acc_type(dtype);
    let st = types::storage(dtype);
    let (inf, ex) = if acc == "double" {
        ("__longlong_as_double(0xfff0000000000000LL)", "exp")
    } else {
        ("__int_as_float(0xff800000)", "expf")
    };
    let w = dv + 2;
    let mut s = format!(
        "extern \"C\" __global__ void {name}({st}* __restrict__ out, const {acc}* __restrict__ ws) {{\n"
    );
    let _ = writeln!(s, "  typedef long long I;\n  typedef {acc} A;\n  const A NEG_INF = {inf};");
    s.push_str("  const I row = blockIdx.x;\n");
    let _ = writeln!(s, "  const A* p = ws + row * {};", split * w);
    // The row's maximum over chunks, NaN winning; a chunk with no key has
    // NEG_INF and weight 0.
    s.push_str("  A mx = NEG_INF;\n");
    let _ = writeln!(s, "  for (int x = 0; x < {split}; ++x) {{");
    let _ =
        writeln!(s, "    const A y = p[x * {w}];\n    mx = (y > mx || (y != y && mx == mx)) ? y : mx;\n  }}");
    let _ = writeln!(s, "  for (int c = threadIdx.x; c < {dv}; c += blockDim.x) {{");
    s.push_str("    A sum = 0, o = 0;\n");
    let _ = writeln!(s, "    for (int x = 0; x < {split}; ++x) {{");
    let _ = writeln!(s, "      const A y = p[x * {w}];\n      if (y == NEG_INF) continue;");
    let _ = writeln!(s, "      const A f = {ex}(y - mx);");
    let _ = writeln!(s, "      sum += f * p[x * {w} + 1];\n      o += f * p[x * {w} + 2 + c];\n    }}");
    s.push_str("    const A inv = sum == 0 ? (A)0 : (A)1 / sum;\n");
    let _ = writeln!(
        s,
        "    out[row * {dv} + c] = {};\n  }}\n}}",
        types::store(dtype, &format!("({})(o * inv)", types::compute(dtype)))
    );
    let threads = dv.next_multiple_of(32).clamp(32, 256);
    Kernel::new(name, s, (batch * heads * sq).max(1) as u32, threads as u32, vec![0])
}
