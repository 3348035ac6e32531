//! The attention kernel: one generated flash-style kernel per shape, for
//! [`Op::Attention`](crate::ir::Op::Attention).
//!
//! A block owns `rows` consecutive query rows of one (batch, head), and
//! `split` threads per row (`rows` = the query length rounded up to a
//! warp, at most 128). It walks the keys in tiles of `tile` keys: the
//! block loads the tile's keys and values into shared memory (as f32),
//! then each thread takes every `split`-th key of the tile for its row:
//! it computes those scores into its row's column of a shared tile, their
//! maximum, one rescale of its running sum and output (the online
//! softmax), and adds `e^(s - m) v` for them. With `split > 1` the
//! threads of a row end with partial softmaxes over disjoint keys, merged
//! through shared memory (each rescaled to the row's maximum, as
//! FlashAttention's split-KV merge does), and the block writes its rows'
//! outputs as one contiguous run. Threads are split-major (thread
//! `sub * rows + row`), so a warp's 32 lanes read the same key: shared
//! memory broadcasts it. The `[sq, sk]` scores
//! exist only as that tile; global memory sees q, k, v (each read once per
//! block) and the output. f16, bf16 and f32 accumulate in f32, f64 in
//! f64; scores of removed keys are skipped, and a row with no key left
//! writes zeros, as the CPU kernel does. A NaN score makes the running
//! maximum NaN (`sc > tmax` alone would skip it, and a tile of NaN scores
//! would look like a tile of removed keys), so its row is NaN, as in
//! PyTorch; see `backends/cpu/attention.rs` for the rest of the rules.
//!
//! All threads of a block reach every `__syncthreads` (rows past the end
//! compute and write nothing), so the kernel runs as it is on the CPU
//! emulator. It is a CUDA-core kernel, for f64, the f32 head dims the
//! register-tiled kernel (`attention_simt.rs`) does not take, and the
//! f16/bf16 head dims the tensor-core kernel (`attention_mma.rs`) does not
//! take.

use super::{types, Kernel};
use crate::ir::{AttnLayout, AttnMask, DType};
use std::fmt::Write;

/// The largest head dim the kernel keeps in registers.
pub(crate) const MAX_HEAD_DIM: usize = 256;

/// One strided operand: element offset, strides of `[b, h, s, d]`.
#[derive(Clone, Debug)]
pub(crate) struct Strided {
    /// Element offset of `[0, 0, 0, 0]`.
    pub offset: usize,
    /// Element strides of the four dims (0 for a broadcast dim).
    pub strides: [usize; 4],
}

impl Strided {
    pub(crate) fn at(&self, b: &str, h: &str, s: &str, d: &str) -> String {
        let [s0, s1, s2, s3] = self.strides;
        let term = |x: &str, st: usize| if st == 0 { String::new() } else { format!(" + {x} * {st}LL") };
        format!("{}LL{}{}{}{}", self.offset, term(b, s0), term(h, s1), term(s, s2), term(d, s3))
    }
}

/// What the kernel is generated for.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub dtype: DType,
    pub batch: usize,
    pub heads: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
    pub scale: f64,
    pub causal: bool,
    pub mask: AttnMask,
    pub mask_dtype: DType,
    pub q: Strided,
    pub k: Strided,
    pub v: Strided,
    pub m: Option<Strided>,
    /// The output's order of dims (`[b, h, sq, dv]` or `[b, sq, h, dv]`).
    pub layout: AttnLayout,
}

impl Spec {
    /// The element offset in `out` of the output row of query `i` (an
    /// expression) of (batch, head) pair `bh` (an expression):
    /// `(bh * sq + i) * dv` in the `bhsd` layout, the row's place among
    /// its query's heads in the `bshd` one.
    pub(crate) fn out_row(&self, bh: &str, i: &str) -> String {
        let (h, sq, dv) = (self.heads, self.sq, self.dv);
        match self.layout {
            AttnLayout::Bhsd => format!("({bh} * {sq} + {i}) * {dv}"),
            AttnLayout::Bshd => format!("((({bh}) / {h} * {sq} + {i}) * {h} + ({bh}) % {h}) * {dv}"),
        }
    }

    /// [`Spec::out_row`] of the `row`-th row in `bhsd` order (`row = bh *
    /// sq + i`, an expression).
    pub(crate) fn out_row_of(&self, row: &str) -> String {
        let (sq, dv) = (self.sq, self.dv);
        match self.layout {
            AttnLayout::Bhsd => format!("{row} * {dv}"),
            AttnLayout::Bshd => self.out_row(&format!("({row}) / {sq}"), &format!("({row}) % {sq}")),
        }
    }

    /// The opening line of a flash kernel `name` (every kernel but the
    /// split-key decode one): `out, q, k, v` and the mask, if any.
    pub(crate) fn flash_head(&self, name: &str) -> String {
        self.flash_head_with(name, &[])
    }

    /// [`Spec::flash_head`] with parameters `after_out` between `out` and `q`
    /// (a split kernel's workspace and counters).
    pub(crate) fn flash_head_with(&self, name: &str, after_out: &[&str]) -> String {
        let st = types::storage(self.dtype);
        let mut p = vec![format!("{st}* __restrict__ out")];
        p.extend(after_out.iter().map(|x| x.to_string()));
        p.extend([
            format!("const {st}* __restrict__ q"),
            format!("const {st}* __restrict__ k"),
            format!("const {st}* __restrict__ v"),
        ]);
        if self.mask != AttnMask::None {
            p.push(format!("const {}* __restrict__ mask", types::storage(self.mask_dtype)));
        }
        format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "))
    }

    /// Declares the query block of a tiled kernel whose grid is `qblocks`
    /// blocks of `rows` query rows for each (batch, head): `qb`, `bh`, `b`,
    /// `h` and its first row `i0` (`I` is the kernel's 64-bit integer).
    /// Causal, the last query blocks walk the most keys: they run first,
    /// across every head, so the short ones fill in behind them.
    pub(crate) fn query_block(&self, s: &mut String, qblocks: usize, rows: usize) {
        let heads = self.heads.max(1);
        if self.causal {
            let bhs = (self.batch * heads).max(1);
            let _ = writeln!(
                s,
                "  const I qb = {} - (I)blockIdx.x / {bhs}, bh = (I)blockIdx.x % {bhs};",
                qblocks - 1
            );
        } else {
            let _ = writeln!(s, "  const I qb = (I)blockIdx.x % {qblocks}, bh = (I)blockIdx.x / {qblocks};");
        }
        let _ = writeln!(s, "  const I b = bh / {heads}, h = bh % {heads};");
        let _ = writeln!(s, "  const I i0 = qb * {rows};");
    }

    /// The parameters a flash kernel reads (all but `out`).
    pub(crate) fn flash_reads(&self) -> Vec<usize> {
        if self.mask == AttnMask::None {
            vec![0, 1, 2]
        } else {
            vec![0, 1, 2, 3]
        }
    }
}

/// The kernel for `spec` that also writes each query row's log-sum-exp
/// (an attention whose `extra` output 1 the plan reads), or why there is
/// none: the tensor-core kernels (f16/bf16, and f32 by 3xTF32) write it;
/// the others do not.
pub(crate) fn flash_with_lse(name: &str, spec: &Spec) -> Result<Kernel, String> {
    if super::attention_mma::applies(spec) {
        return Ok(super::attention_mma::flash_mma(name, spec, true));
    }
    if super::attention_tf32::applies(spec) {
        return Ok(super::attention_tf32::flash_tf32(name, spec, true));
    }
    Err(format!(
        "the CUDA attention writes its rows' log-sum-exp from the tensor-core kernels only (f16 and bf16 heads, and f32 heads of 16-128 in steps of 16 read 16 bytes at a time), got {} heads of {} and {}",
        spec.dtype, spec.d, spec.dv
    ))
}

/// The kernel for `spec`, or why there is none.
pub(crate) fn flash(name: &str, spec: &Spec) -> Result<Kernel, String> {
    if super::attention_mma::applies(spec) {
        return Ok(super::attention_mma::flash_mma(name, spec, false));
    }
    if super::attention_tf32::applies(spec) {
        return Ok(super::attention_tf32::flash_tf32(name, spec, false));
    }
    if super::attention_simt::applies(spec) {
        return Ok(super::attention_simt::flash_simt(name, spec));
    }
    let Spec { dtype, batch, heads, sq, sk, d, dv, .. } = *spec;
    if d.max(dv) > MAX_HEAD_DIM {
        return Err(format!(
            "the CUDA attention kernel keeps a head in registers and takes head dims up to {MAX_HEAD_DIM}, got {d} and {dv}"
        ));
    }
    let acc = if dtype == DType::F64 { "double" } else { "float" };
    // Rows a block: up to 128, fewer while that leaves fewer than two
    // blocks an H100 SM (264): a thread walks its row's keys alone, so a
    // 512-token prefill of 12 heads in blocks of 128 rows (48 blocks) left
    // most of the card idle.
    let mut rows = sq.div_ceil(32).clamp(1, 4) * 32;
    while rows > 32 && batch * heads * sq.div_ceil(rows) < 264 {
        rows /= 2;
    }
    // f32 heads whose dims are multiples of 4 read shared memory 16 bytes
    // at a time and sum a score over 4 chains (a 64-long chain of
    // dependent adds was the kernel's critical path).
    let vec4 = acc == "float" && d % 4 == 0 && dv % 4 == 0 && d > 0 && dv > 0;
    let mut tile = match d.max(dv) {
        0..=64 => 32,
        65..=128 => 16,
        _ => 8,
    };
    // Keys, values and scores of a tile within the 48 KiB of static shared
    // memory (f64 halves the tile).
    let width = if dtype == DType::F64 { 8 } else { 4 };
    while tile > 1 && tile * (d + dv + rows) * width > 48 * 1024 {
        tile /= 2;
    }
    let qblocks = sq.div_ceil(rows).max(1);
    let grid = (batch * heads * qblocks).max(1);
    let split = key_split(grid, rows, tile, dv, width);
    let threads = rows * split;
    let load = |e: &str| types::load(dtype, e);
    let inf = if acc == "double" {
        "__longlong_as_double(0xfff0000000000000LL)"
    } else {
        "__int_as_float(0xff800000)"
    };
    let ex = if acc == "double" { "exp" } else { "expf" };
    let mut s = spec.flash_head(name);
    let _ = writeln!(s, "  typedef long long I;\n  typedef {acc} A;");
    let _ = writeln!(s, "  const A NEG_INF = {inf};");
    // One shared array: a tile's keys, values and scores, then (split > 1)
    // the merge's outputs and running maxima and sums.
    let (kn, vn, sn) = (tile * d.max(1), tile * dv.max(1), tile * rows);
    let merge = if split > 1 { merge_len(rows, dv, split) } else { 0 };
    let _ = writeln!(s, "  __align__(16) __shared__ A smem[{}];", (kn + vn + sn).max(merge));
    let _ = writeln!(s, "  A* ks = smem;\n  A* vs = smem + {kn};");
    // A tile's scores, column `row` for the row's threads: in shared
    // memory rather than registers, so the loops over a tile's keys need
    // not be unrolled (unrolled, a 64-dim head took NVRTC about 9 s on the
    // H100).
    let _ = writeln!(s, "  A* scs = smem + {};", kn + vn);
    let _ = writeln!(s, "  const int t = threadIdx.x, row = t % {rows}, sub = t / {rows};");
    // The last query blocks of a causal attention walk the most keys:
    // they go first, so the short ones fill in behind them.
    let _ = writeln!(
        s,
        "  const I qb = {} - (I)blockIdx.x % {qblocks}, bh = (I)blockIdx.x / {qblocks};",
        qblocks - 1
    );
    let _ = writeln!(s, "  const I b = bh / {heads}, h = bh % {heads};", heads = heads.max(1));
    let _ = writeln!(s, "  const I i = qb * {rows} + row;\n  const bool active = i < {sq};");
    let _ = writeln!(s, "  A qr[{}], acc[{}];", d.max(1), dv.max(1));
    let _ = writeln!(s, "  A m = NEG_INF, l = 0;");
    // Every loop over a head dim is unrolled: the arrays stay in registers
    // only when no index is a run-time value.
    let _ = writeln!(
        s,
        "  #pragma unroll\n  for (int c = 0; c < {d}; ++c) qr[c] = active ? (A){} : (A)0;",
        load(&format!("q[{}]", spec.q.at("b", "h", "i", "c")))
    );
    let _ = writeln!(s, "  #pragma unroll\n  for (int c = 0; c < {dv}; ++c) acc[c] = 0;");
    // Causal: this block's rows never see keys past its last row.
    let end = if spec.causal {
        format!("(qb + 1) * {rows} < {sk} ? (qb + 1) * {rows} : (I){sk}")
    } else {
        format!("(I){sk}")
    };
    let _ = writeln!(s, "  const I kend = {end};");
    let _ = writeln!(s, "  for (I j0 = 0; j0 < kend; j0 += {tile}) {{");
    s.push_str("    __syncthreads();  // the previous tile's readers are done\n");
    // A tile's keys and values: the loop is unrolled so that a thread has
    // several loads in flight (one at a time, a 512-key prefill spent most
    // of its time waiting on them), 16 bytes each where the operand lies
    // contiguous and aligned along the head dim.
    for (arr, x, op, n) in [("ks", &spec.k, "k", d), ("vs", &spec.v, "v", dv)] {
        let wide = vec4
            && dtype == DType::F32
            && x.strides[3] == 1
            && x.offset % 4 == 0
            && x.strides[..3].iter().all(|st| st % 4 == 0);
        if wide {
            let _ = writeln!(
                s,
                "    #pragma unroll 8\n    for (int e = t * 4; e < {tile} * {n}; e += {}) {{",
                threads * 4
            );
            let _ = writeln!(s, "      const I r = e / {n}, c = e % {n}, j = j0 + r;");
            let _ = writeln!(
                s,
                "      kiln::vec4<A> x = {{}};\n      if (j < {sk}) x = kiln::load4(&{op}[{}]);",
                x.at("b", "h", "j", "c")
            );
            let _ = writeln!(s, "      *reinterpret_cast<kiln::vec4<A>*>(&{arr}[e]) = x;\n    }}");
        } else {
            let _ =
                writeln!(s, "    #pragma unroll 8\n    for (int e = t; e < {tile} * {n}; e += {threads}) {{");
            let _ = writeln!(s, "      const I r = e / {n}, c = e % {n}, j = j0 + r;", n = n.max(1));
            let _ = writeln!(
                s,
                "      {arr}[e] = j < {sk} ? (A){} : (A)0;\n    }}",
                load(&format!("{op}[{}]", x.at("b", "h", "j", "c")))
            );
        }
    }
    s.push_str("    __syncthreads();\n");
    let _ = writeln!(s, "    A tmax = NEG_INF;");
    let _ = writeln!(s, "    #pragma unroll 1\n    for (int r = sub; r < {tile}; r += {split}) {{");
    if vec4 {
        s.push_str("      const I j = j0 + r;\n      A d0 = 0, d1 = 0, d2 = 0, d3 = 0;\n");
        let _ = writeln!(s, "      #pragma unroll\n      for (int c = 0; c < {d}; c += 4) {{");
        let _ = writeln!(
            s,
            "        const kiln::vec4<A> kv = *reinterpret_cast<const kiln::vec4<A>*>(&ks[r * {d} + c]);"
        );
        s.push_str("        d0 += qr[c] * kv.v[0]; d1 += qr[c + 1] * kv.v[1];\n");
        s.push_str("        d2 += qr[c + 2] * kv.v[2]; d3 += qr[c + 3] * kv.v[3];\n      }\n");
        s.push_str("      const A dot = (d0 + d1) + (d2 + d3);\n");
    } else {
        s.push_str("      const I j = j0 + r;\n      A dot = 0;\n");
        let _ = writeln!(
            s,
            "      #pragma unroll\n      for (int c = 0; c < {d}; ++c) dot += qr[c] * ks[r * {d} + c];"
        );
    }
    let mut removed = format!("!active || j >= {sk}");
    if spec.causal {
        removed.push_str(" || j > i");
    }
    let mut score = format!("dot * (A){:?}", spec.scale);
    if let Some(m) = &spec.m {
        let at = format!("mask[{}]", m.at("b", "h", "i", "j"));
        match spec.mask {
            AttnMask::Keep => {
                let _ = writeln!(s, "      const bool keep = ({removed}) ? false : {at};");
                removed = "!keep".into();
            }
            AttnMask::Additive => {
                let _ = writeln!(
                    s,
                    "      const A add = ({removed}) ? (A)0 : (A){};",
                    types::load(spec.mask_dtype, &at)
                );
                score.push_str(" + add");
            }
            AttnMask::None => {}
        }
    }
    let _ = writeln!(s, "      const A sc = ({removed}) ? NEG_INF : {score};");
    let _ = writeln!(s, "      scs[r * {rows} + row] = sc;");
    // NaN wins: `sc != sc` is true for a NaN only (no fast math).
    s.push_str("      tmax = (sc > tmax || (sc != sc && tmax == tmax)) ? sc : tmax;\n    }\n");
    // One rescale per tile: the running maximum moves at most once (to
    // NaN too: then the correction and every term are NaN).
    s.push_str("    if (tmax != NEG_INF) {\n");
    s.push_str("      const A mn = (tmax > m || (tmax != tmax && m == m)) ? tmax : m;\n");
    let _ = writeln!(s, "      const A corr = {ex}(m - mn);");
    s.push_str("      m = mn;\n      l *= corr;\n");
    let _ = writeln!(s, "      #pragma unroll\n      for (int c = 0; c < {dv}; ++c) acc[c] *= corr;");
    let _ = writeln!(s, "      #pragma unroll 1\n      for (int r = sub; r < {tile}; r += {split}) {{");
    let _ = writeln!(s, "        const A sc = scs[r * {rows} + row];");
    s.push_str("        if (sc == NEG_INF) continue;\n");
    let _ = writeln!(s, "        const A p = {ex}(sc - m);");
    s.push_str("        l += p;\n");
    if vec4 {
        let _ = writeln!(s, "        #pragma unroll\n        for (int c = 0; c < {dv}; c += 4) {{");
        let _ = writeln!(
            s,
            "          const kiln::vec4<A> vv = *reinterpret_cast<const kiln::vec4<A>*>(&vs[r * {dv} + c]);"
        );
        s.push_str("          acc[c] += p * vv.v[0]; acc[c + 1] += p * vv.v[1];\n");
        s.push_str("          acc[c + 2] += p * vv.v[2]; acc[c + 3] += p * vv.v[3];\n        }\n");
    } else {
        let _ = writeln!(
            s,
            "        #pragma unroll\n        for (int c = 0; c < {dv}; ++c) acc[c] += p * vs[r * {dv} + c];"
        );
    }
    s.push_str("      }\n    }\n  }\n");
    let store = types::store(dtype, &format!("({})(x)", types::compute(dtype)));
    if split == 1 {
        s.push_str("  if (active) {\n    const A inv = l == 0 ? (A)0 : (A)1 / l;\n");
        let _ = writeln!(s, "    #pragma unroll\n    for (int c = 0; c < {dv}; ++c) {{");
        let row = spec.out_row("bh", "i");
        let _ = writeln!(s, "      const A x = acc[c] * inv;\n      out[{row} + c] = {store};");
        s.push_str("    }\n  }\n}\n");
    } else {
        merge_partials(&mut s, spec, rows, split, ex, &store);
    }
    Ok(Kernel::new(name, s, grid as u32, threads as u32, spec.flash_reads()))
}

/// Threads per query row: more while the grid leaves the card short of
/// threads (a 512-token prefill of 12 heads is 192 blocks of 32 rows, one
/// warp each on an H100 of 132 SMs, when a row's keys are one thread's),
/// up to 256 threads a block (a thread holds a query row and an output
/// row in registers), at least two of a tile's keys a thread, and while
/// the merge fits in the 48 KiB of static shared memory.
fn key_split(grid: usize, rows: usize, tile: usize, dv: usize, width: usize) -> usize {
    // About 16 warps an SM on 132 SMs.
    const ENOUGH_THREADS: usize = 132 * 512;
    let mut split = 1;
    while grid * rows * split < ENOUGH_THREADS
        && rows * split * 2 <= 256
        && split * 4 <= tile
        && merge_len(rows, dv, split * 2) * width <= 48 * 1024
    {
        split *= 2;
    }
    split
}

/// Elements of the merge's shared memory: each row's output, then each
/// thread's running maximum and sum, then each row's total sum.
fn merge_len(rows: usize, dv: usize, split: usize) -> usize {
    rows * dv.max(1) + 2 * rows * split + rows
}

/// The end of a kernel whose rows' keys were split over `split` threads:
/// each thread rescales its partial output and sum to the row's maximum
/// (a thread that saw no key, `m = -inf`, contributes zero; a NaN maximum
/// wins, so the row is NaN), the threads of a row add their outputs into
/// shared memory one split at a time, and the block writes its rows (one
/// contiguous run of `out`) with every thread.
fn merge_partials(s: &mut String, spec: &Spec, rows: usize, split: usize, ex: &str, store: &str) {
    let (dv, sq) = (spec.dv, spec.sq);
    let (ms, ls, tot) = (rows * dv, rows * dv + rows * split, rows * dv + 2 * rows * split);
    s.push_str("  __syncthreads();  // the last tile's readers are done\n");
    let _ = writeln!(s, "  smem[{ms} + t] = m;\n  smem[{ls} + t] = l;\n  __syncthreads();");
    s.push_str("  A mx = NEG_INF;\n");
    let _ = writeln!(s, "  for (int u = 0; u < {split}; ++u) {{");
    let _ = writeln!(s, "    const A x = smem[{ms} + u * {rows} + row];");
    s.push_str("    mx = (x > mx || (x != x && mx == mx)) ? x : mx;\n  }\n");
    let _ = writeln!(s, "  const A corr = m == NEG_INF ? (A)0 : {ex}(m - mx);");
    let _ = writeln!(s, "  for (int u = 0; u < {split}; ++u) {{");
    s.push_str("    if (sub == u) {\n");
    let _ = writeln!(s, "      #pragma unroll\n      for (int c = 0; c < {dv}; ++c)");
    let _ =
        writeln!(s, "        smem[row * {dv} + c] = (u == 0 ? (A)0 : smem[row * {dv} + c]) + acc[c] * corr;");
    let _ = writeln!(s, "      smem[{tot} + row] = (u == 0 ? (A)0 : smem[{tot} + row]) + l * corr;");
    s.push_str("    }\n    __syncthreads();\n  }\n");
    // The block's rows are `out[(bh * sq + qb * rows) * dv ..]`, contiguous
    // in the `bhsd` layout; in the `bshd` one each row goes to its place.
    let _ = writeln!(
        s,
        "  const I first = qb * {rows}, n = ({sq} - first < {rows} ? {sq} - first : {rows}) * {dv};"
    );
    let _ = writeln!(s, "  for (I e = t; e < n; e += {}) {{", rows * split);
    let _ = writeln!(s, "    const A lt = smem[{tot} + e / {}];", dv.max(1));
    s.push_str("    const A x = lt == 0 ? (A)0 : smem[e] / lt;\n");
    let at = match spec.layout {
        AttnLayout::Bhsd => format!("(bh * {sq} + first) * {dv} + e"),
        AttnLayout::Bshd => format!("{} + e % {dv}", spec.out_row("bh", &format!("first + e / {dv}"))),
    };
    let _ = writeln!(s, "    out[{at}] = {store};\n  }}\n}}");
}
