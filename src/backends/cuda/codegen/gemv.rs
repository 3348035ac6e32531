//! Products of a few rows (`M` ≤ [`MAX_M`]) by a weight matrix: a decode
//! step's projections and LM head, which are matrix-vector products that
//! read every weight once. cuBLAS runs them as GEMMs tiled for large `M`,
//! at about a tenth of the memory bandwidth on an H100; these kernels are
//! written to stream the weight at bandwidth, with the matmul body's
//! elementwise epilogue (bias, activation, residual add) applied before
//! the one store, so the product never goes through memory.
//!
//! Two schedules, by how the weight `b` (`[K, N]`) lies in memory:
//!
//! - **Columns** (`b[k, n]` contiguous along `k`: a transposed view, as
//!   the LM head's `wte^T`): a warp per output column reads the column
//!   with 16-byte loads (4 elements a lane in f32, 8 in f16 and bf16) and
//!   reduces its `M` sums with shuffles; lane 0 applies the epilogue.
//! - **Rows** (`b[k, n]` contiguous along `n`: Hugging Face's Conv1D
//!   `[in, out]`): a block owns 32 × 4 (f32) or 32 × 8 consecutive
//!   columns, its 8 warps split the keys' rows (`k`), each lane reading 4
//!   or 8 columns of a row with one vector load, and the warps' sums meet
//!   in shared memory. When the
//!   columns alone make too few blocks to fill the card (768 columns are 6
//!   blocks), `k` is also split across blocks: each writes f32 partial
//!   sums to a workspace, and the last block of a column tile to finish
//!   adds the tile's partials in a fixed order and applies the epilogue
//!   (deterministic: an atomic counter picks the block, not the order).
//!
//! Sums are f32 for f32, f16 and bf16 (f64 stays on cuBLAS); the product is
//! rounded to its dtype before the epilogue reads it, as when the GEMM
//! stores it and the epilogue kernel loads it. Vector loads are used when
//! the weight's contiguous dim, leading dimension and offset are multiples
//! of the load's elements (buffers are 256-byte aligned); otherwise element
//! loads.

use super::epilogue::{self, Epilogue};
use super::types;
use super::{Kernel, BLOCK};
use crate::ir::DType;
use std::fmt::Write;

/// Rows of the product at most for which these kernels are used.
pub(crate) const MAX_M: usize = 8;
/// Weight elements at least (`K * N`) for which they are used: below, a
/// product is launch-bound and cuBLAS (and its fused epilogues) keeps it.
pub(crate) const MIN_WEIGHT: usize = 1 << 16;
/// Blocks the row schedule aims for before it splits `k` (two per SM of an H100).
const TARGET_BLOCKS: usize = 264;
/// Rows of the weight one warp reads at most in the row schedule (its
/// loads are all in flight at once, one register set each).
const MAX_WARP_ROWS: usize = 16;
/// Weight loads a lane of the column schedule has in flight at most (16
/// bytes each, in registers until the sums use them).
const MAX_LANE_LOADS: usize = 16;
/// Warps of a block.
const WARPS: usize = (BLOCK / 32) as usize;

/// A product `out[m, n] = Σ_k a[m, k] b[k, n]`, written densely.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    /// The operands' and the product's dtype.
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `a[m, k]` at `offset + m * sm + k * sk` (elements): (offset, sm, sk).
    pub a: (usize, usize, usize),
    /// `b[k, n]` at `offset + k * sk + n * sn` (elements): (offset, sk, sn).
    pub b: (usize, usize, usize),
}

impl Spec {
    /// True when the weight is contiguous along `k` (the column schedule).
    fn columns(&self) -> bool {
        self.b.1 == 1 && self.b.2 != 1
    }

    /// Elements of one 16-byte load: 4 in f32, 8 in f16 and bf16.
    fn width(&self) -> usize {
        16 / self.dtype.size()
    }

    /// Whether the weight can be read 16 bytes at a time.
    fn vector(&self) -> bool {
        let (off, sk, sn) = self.b;
        let v = self.width();
        if self.columns() {
            self.k % v == 0 && sn % v == 0 && off % v == 0
        } else {
            self.n % v == 0 && sk % v == 0 && off % v == 0
        }
    }

    /// Elements a lane loads at once: [`Spec::width`], or 1.
    fn lane_width(&self) -> usize {
        if self.vector() {
            self.width()
        } else {
            1
        }
    }

    /// Columns a row-schedule block owns.
    fn block_cols(&self) -> usize {
        32 * self.lane_width()
    }

    /// (blocks along `n`, rows of `k` per block, blocks along `k`) of the row schedule.
    fn row_split(&self) -> (usize, usize, usize) {
        let cols = self.n.div_ceil(self.block_cols()).max(1);
        let want = TARGET_BLOCKS
            .div_ceil(cols)
            .max(self.k.div_ceil(WARPS * MAX_WARP_ROWS))
            .clamp(1, self.k.div_ceil(WARPS).max(1));
        let per = self.k.div_ceil(want).next_multiple_of(WARPS);
        (cols, per, self.k.div_ceil(per).max(1))
    }

    /// Blocks along `k` (more than 1: partial sums, finished by the last block).
    pub(crate) fn splits(&self) -> usize {
        if self.columns() {
            1
        } else {
            self.row_split().2
        }
    }

    /// Column tiles of the row schedule: arrival counters of a split kernel.
    pub(crate) fn tiles(&self) -> usize {
        self.row_split().0
    }

    /// Workspace bytes of the partial sums when [`Spec::splits`] > 1.
    pub(crate) fn workspace_bytes(&self) -> u64 {
        (self.splits() * self.m * self.n * 4) as u64
    }

    /// `a[m, k]` as a float expression.
    fn a_at(&self, m: &str, k: &str) -> String {
        let (off, sm, sk) = self.a;
        types::load(self.dtype, &format!("a[{off}LL + (I)({m}) * {sm}LL + (I)({k}) * {sk}LL]"))
    }
}

/// Whether the kernels take a product of this dtype and these strides:
/// at most [`MAX_M`] rows, at least [`MIN_WEIGHT`] weight elements, a
/// float dtype other than f64, a weight contiguous along one of its dims.
pub(crate) fn applies(spec: &Spec) -> bool {
    matches!(spec.dtype, DType::F32 | DType::F16 | DType::BF16)
        && (1..=MAX_M).contains(&spec.m)
        && spec.k * spec.n >= MIN_WEIGHT
        && spec.n > 0
        && spec.k > 0
        && (spec.b.1 == 1 || spec.b.2 == 1)
}

/// The product kernel, its epilogue applied before the one store; with
/// [`Spec::splits`] > 1 it also takes the f32 workspace of the partial
/// sums and the column tiles' arrival counters (see `finish_split`).
pub(crate) fn gemv(
    name: &str,
    spec: &Spec,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<Kernel, String> {
    let st = types::storage(spec.dtype);
    let split = spec.splits() > 1;
    let mut first = vec![format!("{}* out", types::storage(out))];
    if split {
        first.push("float* ws".to_string());
        first.push("unsigned* counts".to_string());
    }
    first.push(format!("const {st}* __restrict__ a"));
    first.push(format!("const {st}* __restrict__ b"));
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", epilogue::params(&first, epi));
    s.push_str("  typedef long long I;\n  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;\n");
    let Spec { m, n, k, .. } = *spec;
    let (boff, bsk, bsn) = spec.b;
    let grid = if spec.columns() {
        let _ = writeln!(s, "  const I col = (I)blockIdx.x * {WARPS} + w;\n  if (col >= {n}) return;");
        let _ = writeln!(s, "  const {st}* wcol = b + {boff}LL + col * {bsn}LL;");
        let _ =
            writeln!(s, "  float acc[{m}];\n  #pragma unroll\n  for (int r = 0; r < {m}; ++r) acc[r] = 0.f;");
        if spec.vector() {
            // A lane's weight loads are issued a batch at a time (all of
            // them for `k` up to 16 loads a lane), into registers, before
            // the sums read them: a loop of load-then-sum had one or two
            // loads in flight, and GPT-2's `k` = 3072 projection took 8.2
            // µs in bf16 where its 768-wide ones took 4.
            let v = spec.lane_width();
            let step = 32 * v;
            let iters = k.div_ceil(step);
            let batches = iters.div_ceil(MAX_LANE_LOADS);
            let per = iters.div_ceil(batches);
            let vt = format!("kiln::vec{v}<{st}>");
            // `a` read 16 bytes at a time too where it lies contiguous
            // along `k` and aligned.
            let (aoff, asm, ask) = spec.a;
            let a_vector = ask == 1 && aoff % v == 0 && (m == 1 || asm % v == 0);
            let _ = writeln!(s, "  #pragma unroll 1\n  for (int c0 = 0; c0 < {iters}; c0 += {per}) {{");
            let _ = writeln!(s, "    {vt} wv[{per}];");
            let _ = writeln!(s, "    #pragma unroll\n    for (int x = 0; x < {per}; ++x) {{");
            let _ = writeln!(s, "      const int k0 = (c0 + x) * {step} + lane * {v};");
            let _ = writeln!(
                s,
                "      if (c0 + x < {iters} && k0 < {k}) wv[x] = kiln::load{v}(wcol + k0);\n    }}"
            );
            let _ = writeln!(s, "    #pragma unroll\n    for (int x = 0; x < {per}; ++x) {{");
            let _ = writeln!(s, "      const int k0 = (c0 + x) * {step} + lane * {v};");
            let _ = writeln!(s, "      if (c0 + x >= {iters} || k0 >= {k}) break;");
            let _ = writeln!(s, "      #pragma unroll\n      for (int r = 0; r < {m}; ++r) {{");
            if a_vector {
                let _ =
                    writeln!(s, "        const {vt} av = kiln::load{v}(a + {aoff}LL + (I)r * {asm}LL + k0);");
            }
            for e in 0..v {
                let x = if a_vector {
                    types::load(spec.dtype, &format!("av.v[{e}]"))
                } else {
                    spec.a_at("r", &format!("k0 + {e}"))
                };
                let _ = writeln!(
                    s,
                    "        acc[r] += {} * {x};",
                    types::load(spec.dtype, &format!("wv[x].v[{e}]"))
                );
            }
            s.push_str("      }\n    }\n  }\n");
        } else {
            let _ = writeln!(s, "  #pragma unroll 4\n  for (int kk = lane; kk < {k}; kk += 32) {{");
            let _ = writeln!(s, "    const float wk = {};", types::load(spec.dtype, "wcol[kk]"));
            let _ = writeln!(
                s,
                "    #pragma unroll\n    for (int r = 0; r < {m}; ++r) acc[r] += wk * {};\n  }}",
                spec.a_at("r", "kk")
            );
        }
        let _ = writeln!(
            s,
            "  #pragma unroll\n  for (int r = 0; r < {m}; ++r)\n    for (int o = 16; o > 0; o >>= 1) acc[r] += kiln::shfl_xor(acc[r], o);"
        );
        s.push_str("  if (lane == 0) {\n");
        let _ = writeln!(s, "    #pragma unroll\n    for (int r = 0; r < {m}; ++r) {{");
        let _ = writeln!(s, "      const I i = (I)r * {n} + col;");
        let _ =
            writeln!(s, "      {}\n    }}\n  }}\n}}", epilogue::store(spec.dtype, out, epi, "acc[r]", "i")?);
        n.div_ceil(WARPS)
    } else {
        let (cols, per, splits) = spec.row_split();
        let bc = spec.block_cols();
        let v = spec.lane_width();
        let _ = writeln!(s, "  const I cb = (I)blockIdx.x % {cols}, sb = (I)blockIdx.x / {cols};");
        let _ = writeln!(s, "  const I n0 = cb * {bc} + lane * {v};");
        let _ = writeln!(s, "  const I kb = sb * {per}, ke = kb + {per} < {k} ? kb + {per} : (I){k};");
        let _ = writeln!(s, "  float acc[{m}][{v}];");
        let _ = writeln!(
            s,
            "  #pragma unroll\n  for (int r = 0; r < {m}; ++r)\n    #pragma unroll\n    for (int e = 0; e < {v}; ++e) acc[r][e] = 0.f;"
        );
        // Every weight load of the warp is issued before the first sum uses
        // one: the rows a warp reads are few (at most `MAX_WARP_ROWS`) and
        // known here, so the loads are in flight together instead of a few
        // at a time (the loop form ran at a third of the bandwidth).
        let rows = per / WARPS;
        let vt = if v > 1 { format!("kiln::vec{v}<{st}>") } else { st.to_string() };
        let _ = writeln!(s, "  if (n0 < {n}) {{\n    {vt} wv[{rows}];");
        let _ = writeln!(s, "    #pragma unroll\n    for (int x = 0; x < {rows}; ++x) {{");
        let _ = writeln!(s, "      const I kk = kb + w + x * {WARPS};");
        let load = if v > 1 { format!("kiln::load{v}(wrow)") } else { "wrow[0]".to_string() };
        let _ = writeln!(
            s,
            "      const {st}* wrow = b + {boff}LL + kk * {bsk}LL + n0 * {bsn}LL;\n      if (kk < ke) wv[x] = {load};\n    }}"
        );
        let _ = writeln!(s, "    #pragma unroll\n    for (int x = 0; x < {rows}; ++x) {{");
        let _ = writeln!(s, "      const I kk = kb + w + x * {WARPS};\n      if (kk >= ke) break;");
        let _ = writeln!(s, "      #pragma unroll\n      for (int r = 0; r < {m}; ++r) {{");
        let _ = writeln!(s, "        const float xa = {};", spec.a_at("r", "kk"));
        if v > 1 {
            for e in 0..v {
                let _ = writeln!(
                    s,
                    "        acc[r][{e}] += xa * {};",
                    types::load(spec.dtype, &format!("wv[x].v[{e}]"))
                );
            }
        } else {
            let _ = writeln!(s, "        acc[r][0] += xa * {};", types::load(spec.dtype, "wv[x]"));
        }
        s.push_str("      }\n    }\n  }\n");
        let _ = writeln!(s, "  __shared__ float red[{}];", WARPS * bc);
        let _ = writeln!(s, "  #pragma unroll\n  for (int r = 0; r < {m}; ++r) {{");
        s.push_str("    __syncthreads();  // the previous row's readers are done\n");
        let _ = writeln!(
            s,
            "    #pragma unroll\n    for (int e = 0; e < {v}; ++e) red[w * {bc} + lane * {v} + e] = acc[r][e];"
        );
        s.push_str("    __syncthreads();\n");
        let _ = writeln!(s, "    const int c = threadIdx.x;\n    const I col = cb * {bc} + c;");
        let _ = writeln!(s, "    if (c < {bc} && col < {n}) {{\n      float sum = 0.f;");
        let _ = writeln!(
            s,
            "      #pragma unroll\n      for (int x = 0; x < {WARPS}; ++x) sum += red[x * {bc} + c];"
        );
        let _ = writeln!(s, "      const I i = (I)r * {n} + col;");
        if split {
            let _ = writeln!(s, "      ws[sb * {} + i] = sum;", m * n);
            s.push_str("    }\n  }\n");
            finish_split(&mut s, spec, out, epi)?;
        } else {
            let _ = writeln!(s, "      {}", epilogue::store(spec.dtype, out, epi, "sum", "i")?);
            s.push_str("    }\n  }\n}\n");
        }
        cols * splits
    };
    let params_idx = epilogue::param_indices(epi, if split { 4 } else { 2 });
    Ok(Kernel::new(name, s, grid.max(1) as u32, BLOCK, params_idx))
}

/// The end of a split-`k` row-schedule kernel, after each block wrote its
/// partial sums to `ws`: the last block of a column tile to arrive (its
/// ticket from `counts[cb]` says so) adds the tile's partials in split
/// order, so the sum does not depend on which block came last, applies the
/// epilogue, and sets the counter back to zero for the next launch
/// ([`Region::Counters`](crate::backends::cuda::program::Region)). The
/// fences make every block's partials visible before its arrival counts
/// (CUDA's threadFenceReduction pattern); `__ldcg` reads them from L2.
/// One launch instead of a product kernel and a combine kernel: on an H100
/// the combine cost ~4 µs of a ~1 ms decode step, 48 times a token.
fn finish_split(s: &mut String, spec: &Spec, out: DType, epi: Option<&Epilogue<'_>>) -> Result<(), String> {
    let Spec { m, n, .. } = *spec;
    let bc = spec.block_cols();
    let splits = spec.splits();
    super::last_to_arrive(s, "threadIdx.x", "counts[cb]", splits);
    let _ = writeln!(s, "  for (int t = threadIdx.x; t < {}; t += blockDim.x) {{", m * bc);
    let _ = writeln!(s, "    const int r = t / {bc}, c = t % {bc};\n    const I col = cb * {bc} + c;");
    let _ =
        writeln!(s, "    if (col >= {n}) continue;\n    const I i = (I)r * {n} + col;\n    float sum = 0.f;");
    let _ = writeln!(
        s,
        "    #pragma unroll 16\n    for (int x = 0; x < {splits}; ++x) sum += __ldcg(ws + (I)x * {} + i);",
        m * n
    );
    let _ = writeln!(s, "    {}\n  }}", epilogue::store(spec.dtype, out, epi, "sum", "i")?);
    s.push_str("  if (threadIdx.x == 0) counts[cb] = 0u;\n}\n");
    Ok(())
}
