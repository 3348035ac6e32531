//! Split-key ("flash-decoding") attention for short query lengths: a
//! decode step's one query over a KV cache, where the flash kernels of
//! `attention.rs` run one thread (or one 16-row warp tile) per query row
//! and so walk all of a head's keys on one or a few threads.
//!
//! A block of [`THREADS`] threads owns one query row of one (batch, head)
//! and one chunk of [`CHUNK`] keys: [`PER_KEY`] threads compute a key's
//! score (each a strided part of the dot product over the head dim, the
//! query in shared memory, joined by shuffles), the block reduces the
//! chunk's maximum and sum, and groups of threads then split the chunk's
//! keys and the value dims, each adding `e^(s - m) v`, the groups' sums
//! added in order. With one chunk the block writes the output; otherwise
//! it writes its partial maximum, sum and unnormalized output (f32, f64
//! for f64) to a workspace, and the last block of the row to finish (an
//! arrival counter in [`Region::Counters`](crate::backends::cuda::program::Region)
//! says which) merges the row's chunks in order:
//! `out = Σ e^(m_s - M) o_s / Σ e^(m_s - M) l_s`. One launch per attention.
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
/// Keys per block. Short chunks make more blocks and short serial
/// chains: with 128 (one key a thread) GPT-2's decode attention took 10 µs
/// a layer on an H100, its 12 blocks each walking up to 128 keys' values.
pub(crate) const CHUNK: usize = 32;
/// Threads of a block.
const THREADS: usize = 128;
/// Threads that share one key's dot product (over the head dim).
const PER_KEY: usize = THREADS / CHUNK;

/// Whether the split-key kernel takes `spec`: few query rows, enough
/// keys, and a head the flash kernel also takes.
pub(crate) fn applies(spec: &Spec) -> bool {
    spec.sq <= MAX_QUERIES && spec.sk >= MIN_KEYS && spec.d.max(spec.dv) <= super::attention::MAX_HEAD_DIM
}

/// Key chunks per query row.
pub(crate) fn chunks(spec: &Spec) -> usize {
    spec.sk.div_ceil(CHUNK).max(1)
}

/// Query rows of all (batch, head) pairs: one arrival counter each.
pub(crate) fn rows(spec: &Spec) -> usize {
    spec.batch * spec.heads * spec.sq
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

/// The split-key kernel. With one chunk it writes the output; with more,
/// each block writes its chunk's partial maximum, sum and output to `ws`,
/// and the last block of a row to arrive (counted in `counts`, which it
/// sets back to zero) merges the row's chunks in chunk order.
pub(crate) fn partial(name: &str, spec: &Spec) -> Kernel {
    let Spec { dtype, batch, heads, sq, sk, d, dv, .. } = *spec;
    let split = chunks(spec);
    let (acc, _) = acc_type(dtype);
    let st = types::storage(dtype);
    let load = |e: &str| types::load(dtype, e);
    let mut p = vec![format!("{st}* __restrict__ out")];
    if split > 1 {
        p.push(format!("{acc}* ws"));
        p.push("unsigned* counts".to_string());
    }
    p.extend([
        format!("const {st}* __restrict__ q"),
        format!("const {st}* __restrict__ k"),
        format!("const {st}* __restrict__ v"),
    ]);
    if spec.mask != AttnMask::None {
        p.push(format!("const {}* __restrict__ mask", types::storage(spec.mask_dtype)));
    }
    let (inf, ex) = if acc == "double" {
        ("__longlong_as_double(0xfff0000000000000LL)", "exp")
    } else {
        ("__int_as_float(0xff800000)", "expf")
    };
    let nan_max = |y: &str, m: &str| format!("{m} = ({y} > {m} || ({y} != {y} && {m} == {m})) ? {y} : {m};");
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "));
    let _ = writeln!(s, "  typedef long long I;\n  typedef {acc} A;\n  const A NEG_INF = {inf};");
    let _ = writeln!(s, "  __shared__ A qs[{}];\n  __shared__ A sc[{CHUNK}];", d.max(1));
    let _ = writeln!(s, "  __shared__ A red[{}];\n  __shared__ A po[{THREADS}];", THREADS / 32);
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
    // Key `key` of the chunk is scored by threads PER_KEY * key + sub.
    let _ = writeln!(s, "  const int key = t / {PER_KEY}, sub = t % {PER_KEY};");
    let _ = writeln!(s, "  const I j = chunk * {CHUNK} + key;");
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
    // Every lane reaches the shuffles that add the key's partial dots.
    let _ = writeln!(s, "  const bool removed = {removed};\n  A dot = 0;\n  if (!removed) {{");
    let _ = writeln!(
        s,
        "    #pragma unroll\n    for (int c = sub; c < {d}; c += {PER_KEY}) dot += qs[c] * (A){};\n  }}",
        load(&format!("k[{}]", spec.k.at("b", "h", "j", "c")))
    );
    let mut o = PER_KEY / 2;
    while o > 0 {
        let _ = writeln!(s, "  dot += kiln::shfl_xor(dot, {o});");
        o /= 2;
    }
    let _ = writeln!(s, "  const A mine = removed ? NEG_INF : {score};");
    // The chunk's maximum, NaN winning (`y != y` holds for NaN only).
    s.push_str(
        "  A mx = mine;\n  for (int o = 16; o > 0; o >>= 1) {\n    const A y = kiln::shfl_xor(mx, o);\n",
    );
    let _ = writeln!(s, "    {}\n  }}", nan_max("y", "mx"));
    s.push_str("  if (lane == 0) red[w] = mx;\n  __syncthreads();\n  mx = red[0];\n");
    let _ = writeln!(s, "  for (int x = 1; x < {}; ++x) {}", THREADS / 32, nan_max("red[x]", "mx"));
    // Probabilities (0 for removed keys, which are skipped below), each key
    // counted once (by its sub 0), and their sum.
    let _ = writeln!(s, "  const A pr = (sub != 0 || removed) ? (A)0 : {ex}(mine - mx);");
    s.push_str("  A sum = pr;\n  for (int o = 16; o > 0; o >>= 1) sum += kiln::shfl_xor(sum, o);\n");
    s.push_str("  __syncthreads();  // every thread has read red's maxima\n");
    s.push_str("  if (lane == 0) red[w] = sum;\n  if (sub == 0) sc[key] = removed ? NEG_INF : pr;\n");
    s.push_str("  __syncthreads();\n  sum = 0;\n");
    let _ = writeln!(s, "  for (int x = 0; x < {}; ++x) sum += red[x];", THREADS / 32);
    // Keys of this chunk that exist (the last chunk may be short).
    let _ = writeln!(
        s,
        "  const int n = {sk} - chunk * {CHUNK} < {CHUNK} ? (int)({sk} - chunk * {CHUNK}) : {CHUNK};"
    );
    // The values: `groups` groups of threads each add every groups-th key
    // for all value dims, then group 0 adds the groups' sums in order.
    let groups = (THREADS / dv.max(1)).max(1);
    let v_at = |r: &str, c: &str| {
        load(&format!("v[{}]", spec.v.at("b", "h", &format!("(chunk * {CHUNK} + {r})"), c)))
    };
    let finish = |s: &mut String, o: &str, c: &str| {
        if split == 1 {
            s.push_str("    const A inv = sum == 0 ? (A)0 : (A)1 / sum;\n");
            let _ = writeln!(
                s,
                "    out[{} + {c}] = {};",
                spec.out_row_of("row"),
                types::store(dtype, &format!("({})({o} * inv)", types::compute(dtype)))
            );
        } else {
            // Workspace of (row, chunk): [max, sum, o_0 .. o_dv).
            let _ = writeln!(s, "    ws[(row * {split} + chunk) * {} + 2 + {c}] = {o};", dv + 2);
        }
    };
    if groups > 1 {
        let _ = writeln!(s, "  {{\n    const int g = t / {dv}, c = t % {dv};\n    A o = 0;");
        // Unrolled over the chunk with the value loaded before the test,
        // so a thread's loads are in flight together; a removed key's
        // value (in bounds: r < n) is read but never weighted.
        let _ = writeln!(s, "    if (g < {groups}) {{\n      #pragma unroll\n      for (int r = g; r < {CHUNK}; r += {groups}) {{");
        let _ = writeln!(
            s,
            "        if (r >= n) break;\n        const A vr = (A){};\n        const A pv = sc[r];\n        if (pv != NEG_INF) o += pv * vr;\n      }}\n    }}",
            v_at("r", "c")
        );
        s.push_str("    po[t] = o;\n  }\n  __syncthreads();\n");
        let _ = writeln!(s, "  if (t < {dv}) {{\n    A o = po[t];");
        let _ = writeln!(s, "    for (int x = 1; x < {groups}; ++x) o += po[x * {dv} + t];");
        finish(&mut s, "o", "t");
        s.push_str("  }\n");
    } else {
        let _ = writeln!(s, "  for (int c = t; c < {dv}; c += {THREADS}) {{\n    A o = 0;");
        s.push_str("    #pragma unroll 4\n    for (int r = 0; r < n; ++r) {\n");
        let _ = writeln!(
            s,
            "      const A pv = sc[r];\n      if (pv == NEG_INF) continue;\n      o += pv * (A){};\n    }}",
            v_at("r", "c")
        );
        finish(&mut s, "o", "c");
        s.push_str("  }\n");
    }
    if split > 1 {
        let w = dv + 2;
        let _ = writeln!(
            s,
            "  if (t == 0) {{\n    ws[(row * {split} + chunk) * {w}] = mx;\n    ws[(row * {split} + chunk) * {w} + 1] = sum;\n  }}"
        );
        merge(&mut s, spec, ex);
    }
    s.push_str("}\n");
    let grid = (batch * heads * sq * split).max(1);
    Kernel::new(name, s, grid as u32, THREADS as u32, Vec::new())
}

/// The end of a split kernel: the last block of a row to arrive merges the
/// row's chunks from the workspace, `out = Σ e^(m_s - M) o_s / Σ e^(m_s -
/// M) l_s` in chunk order (so the result does not depend on which block
/// came last), and sets the row's counter back to zero. The fences make
/// each block's partials visible before its arrival counts; `__ldcg`
/// reads them from L2.
fn merge(s: &mut String, spec: &Spec, ex: &str) {
    let Spec { dtype, dv, .. } = *spec;
    let split = chunks(spec);
    let w = dv + 2;
    super::last_to_arrive(s, "t", "counts[row]", split);
    let _ = writeln!(s, "  const A* p = ws + row * {};", split * w);
    // The row's maximum once; then each column's weighted sums.
    let _ = writeln!(s, "  A top = NEG_INF;\n  for (int x = 0; x < {split}; ++x) {{\n    const A y = __ldcg(p + x * {w});\n    top = (y > top || (y != y && top == top)) ? y : top;\n  }}");
    let _ = writeln!(s, "  for (int c = t; c < {dv}; c += {THREADS}) {{");
    super::merge_partials(s, "    ", "A", (split, w), ex, false);
    let _ = writeln!(
        s,
        "    out[{} + c] = {};\n  }}",
        spec.out_row_of("row"),
        types::store(dtype, &format!("({})(o * inv)", types::compute(dtype)))
    );
    s.push_str("  if (t == 0) counts[row] = 0u;\n");
}
