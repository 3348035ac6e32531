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
//!   with 16-byte loads (4 elements a lane, f32) and reduces its `M` sums
//!   with shuffles; lane 0 applies the epilogue.
//! - **Rows** (`b[k, n]` contiguous along `n`: Hugging Face's Conv1D
//!   `[in, out]`): a block owns 32 × 4 consecutive columns, its 8 warps
//!   split the keys' rows (`k`), each lane reading 4 columns of a row with
//!   one vector load, and the warps' sums meet in shared memory. When the
//!   columns alone make too few blocks to fill the card (768 columns are 6
//!   blocks), `k` is also split across blocks: each writes f32 partial
//!   sums to a workspace, and [`combine`] adds a column's partials in a
//!   fixed order and applies the epilogue (deterministic, no atomics).
//!
//! Sums are f32 for f32, f16 and bf16 (f64 stays on cuBLAS); the product is
//! rounded to its dtype before the epilogue reads it, as when the GEMM
//! stores it and the epilogue kernel loads it. Vector loads are used when
//! the weight's contiguous dim, leading dimension and offset are multiples
//! of 4 elements (buffers are 256-byte aligned); otherwise element loads.

use super::body::{Body, Operand, Source};
use super::types;
use super::{Kernel, BLOCK};
use crate::ir::{DType, Graph, NodeId, Op};
use std::fmt::Write;

/// Rows of the product at most for which these kernels are used.
pub(crate) const MAX_M: usize = 8;
/// Weight elements at least (`K * N`) for which they are used: below, a
/// product is launch-bound and cuBLAS (and its fused epilogues) keeps it.
pub(crate) const MIN_WEIGHT: usize = 1 << 16;
/// Blocks the row schedule aims for before it splits `k` (two per SM of an H100).
const TARGET_BLOCKS: usize = 264;
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

/// The epilogue of a matmul body: `g` computes the output from its
/// `input`s, `operands[product]` being the product (computed in registers,
/// never read from memory).
pub(crate) struct Epilogue<'a> {
    pub g: &'a Graph,
    pub operands: &'a [Operand],
    pub product: usize,
}

impl Spec {
    /// True when the weight is contiguous along `k` (the column schedule).
    fn columns(&self) -> bool {
        self.b.1 == 1 && self.b.2 != 1
    }

    /// Whether the weight can be read 4 elements at a time.
    fn vector(&self) -> bool {
        let (off, sk, sn) = self.b;
        if self.columns() {
            self.k % 4 == 0 && sn % 4 == 0 && off % 4 == 0
        } else {
            self.n % 4 == 0 && sk % 4 == 0 && off % 4 == 0
        }
    }

    /// Columns a row-schedule block owns.
    fn block_cols(&self) -> usize {
        if self.vector() {
            128
        } else {
            32
        }
    }

    /// (blocks along `n`, rows of `k` per block, blocks along `k`) of the row schedule.
    fn row_split(&self) -> (usize, usize, usize) {
        let cols = self.n.div_ceil(self.block_cols()).max(1);
        let want = TARGET_BLOCKS.div_ceil(cols).clamp(1, self.k.div_ceil(WARPS).max(1));
        let per = self.k.div_ceil(want).next_multiple_of(WARPS);
        (cols, per, self.k.div_ceil(per).max(1))
    }

    /// Blocks along `k` (more than 1: partial sums and [`combine`]).
    pub(crate) fn splits(&self) -> usize {
        if self.columns() {
            1
        } else {
            self.row_split().2
        }
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

/// Whether `epi` can run in registers: the product is read only as itself
/// (no view of it) and the output has the product's elements in order.
pub(crate) fn fusable(g: &Graph, product: usize, m: usize, n: usize) -> bool {
    let out = match g.outputs().first() {
        Some(&o) => o,
        None => return false,
    };
    let order = g.topo_order();
    let input = order.iter().find(|&&id| g.node(id).op == Op::Input(product as u32));
    let Some(&input) = input else { return false };
    g.node(out).shape.numel() == m * n
        && g.node(out).shape.0.last() == Some(&n)
        && g.node(out).shape == g.node(input).shape
        && order.iter().all(|&id| !(g.node(id).op.is_view() && g.operands(id).contains(&input)))
        && order.iter().all(|&id| {
            let node = g.node(id);
            matches!(node.op, Op::Input(_) | Op::Full(_))
                || node.op.is_view()
                || node.shape == g.node(out).shape
        })
}

/// The kernel's parameters: `out`, `a`, `b` (or the workspace and the
/// partial sums for [`combine`]), then the epilogue's buffers.
fn params(first: &[String], epi: Option<&Epilogue<'_>>) -> String {
    let mut p: Vec<String> = first.to_vec();
    if let Some(e) = epi {
        for (k, o) in e.operands.iter().enumerate() {
            if k != e.product && o.source == Source::Buffer {
                p.push(format!("const {}* in{k}", types::storage(o.dtype)));
            }
        }
    }
    p.join(", ")
}

/// Statements storing output element `i` from the product's sum `sum`
/// (f32), through the epilogue when there is one.
fn store(spec: &Spec, out: DType, epi: Option<&Epilogue<'_>>, sum: &str, i: &str) -> Result<String, String> {
    let pv = types::settle(spec.dtype, sum);
    let Some(e) = epi else {
        return Ok(format!("out[{i}] = {};", types::store(spec.dtype, &pv)));
    };
    let body = Body::new(e.g, e.operands)?;
    let mut s = format!("const float pv = {pv};");
    let product_leaf = |o: NodeId| body.g.node(o).op == Op::Input(e.product as u32);
    let operand = |o: NodeId| -> String {
        if product_leaf(o) {
            return "pv".into();
        }
        match body.leaves.get(&o) {
            Some(leaf) => leaf.read_at(&leaf.access.offset_of(i)),
            None => format!("v{}", o.index()),
        }
    };
    for id in body.cone(body.output, &|_| false) {
        let _ = write!(s, " {}", body.statement(id, &format!("v{}", id.index()), &operand)?);
    }
    let _ = write!(s, " out[{i}] = {};", types::store(out, &operand(body.output)));
    Ok(s)
}

/// The product kernel: the output, or with [`Spec::splits`] > 1 the
/// partial sums (then `out` is the f32 workspace and there is no epilogue).
pub(crate) fn gemv(
    name: &str,
    spec: &Spec,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<Kernel, String> {
    let st = types::storage(spec.dtype);
    let split = spec.splits() > 1;
    let out_param =
        if split { "float* __restrict__ ws".to_string() } else { format!("{}* out", types::storage(out)) };
    let first = [out_param, format!("const {st}* __restrict__ a"), format!("const {st}* __restrict__ b")];
    let mut s = format!(
        "extern \"C\" __global__ void {name}({}) {{\n",
        params(&first, if split { None } else { epi })
    );
    s.push_str("  typedef long long I;\n  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;\n");
    let Spec { m, n, k, .. } = *spec;
    let (boff, bsk, bsn) = spec.b;
    let grid = if spec.columns() {
        let _ = writeln!(s, "  const I col = (I)blockIdx.x * {WARPS} + w;\n  if (col >= {n}) return;");
        let _ = writeln!(s, "  const {st}* wcol = b + {boff}LL + col * {bsn}LL;");
        let _ =
            writeln!(s, "  float acc[{m}];\n  #pragma unroll\n  for (int r = 0; r < {m}; ++r) acc[r] = 0.f;");
        if spec.vector() {
            let _ = writeln!(s, "  #pragma unroll 4\n  for (int k0 = lane * 4; k0 < {k}; k0 += 128) {{");
            let _ = writeln!(s, "    const kiln::vec4<{st}> wv = kiln::load4(wcol + k0);");
            let _ = writeln!(s, "    #pragma unroll\n    for (int r = 0; r < {m}; ++r) {{");
            for e in 0..4 {
                let _ = writeln!(
                    s,
                    "      acc[r] += {} * {};",
                    types::load(spec.dtype, &format!("wv.v[{e}]")),
                    spec.a_at("r", &format!("k0 + {e}"))
                );
            }
            s.push_str("    }\n  }\n");
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
        let _ = writeln!(s, "      {}\n    }}\n  }}\n}}", store(spec, out, epi, "acc[r]", "i")?);
        n.div_ceil(WARPS)
    } else {
        let (cols, per, splits) = spec.row_split();
        let bc = spec.block_cols();
        let v = if spec.vector() { 4 } else { 1 };
        let _ = writeln!(s, "  const I cb = (I)blockIdx.x % {cols}, sb = (I)blockIdx.x / {cols};");
        let _ = writeln!(s, "  const I n0 = cb * {bc} + lane * {v};");
        let _ = writeln!(s, "  const I kb = sb * {per}, ke = kb + {per} < {k} ? kb + {per} : (I){k};");
        let _ = writeln!(s, "  float acc[{m}][{v}];");
        let _ = writeln!(
            s,
            "  #pragma unroll\n  for (int r = 0; r < {m}; ++r)\n    #pragma unroll\n    for (int e = 0; e < {v}; ++e) acc[r][e] = 0.f;"
        );
        let _ = writeln!(
            s,
            "  if (n0 < {n}) {{\n    #pragma unroll 4\n    for (I kk = kb + w; kk < ke; kk += {WARPS}) {{"
        );
        let _ = writeln!(s, "      const {st}* wrow = b + {boff}LL + kk * {bsk}LL + n0 * {bsn}LL;");
        if v == 4 {
            let _ = writeln!(s, "      const kiln::vec4<{st}> wv = kiln::load4(wrow);");
        }
        let _ = writeln!(s, "      #pragma unroll\n      for (int r = 0; r < {m}; ++r) {{");
        let _ = writeln!(s, "        const float x = {};", spec.a_at("r", "kk"));
        if v == 4 {
            for e in 0..4 {
                let _ = writeln!(
                    s,
                    "        acc[r][{e}] += x * {};",
                    types::load(spec.dtype, &format!("wv.v[{e}]"))
                );
            }
        } else {
            let _ = writeln!(s, "        acc[r][0] += x * {};", types::load(spec.dtype, "wrow[0]"));
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
        } else {
            let _ = writeln!(s, "      {}", store(spec, out, epi, "sum", "i")?);
        }
        s.push_str("    }\n  }\n}\n");
        cols * splits
    };
    let params_idx = if split { vec![0, 1] } else { epi_params(epi, 2) };
    Ok(Kernel::new(name, s, grid.max(1) as u32, BLOCK, params_idx))
}

/// Operand indices of the pointer parameters after `out`: `first` fixed
/// ones, then the epilogue's buffers.
fn epi_params(epi: Option<&Epilogue<'_>>, first: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..first).collect();
    if let Some(e) = epi {
        v.extend(
            e.operands
                .iter()
                .enumerate()
                .filter(|(k, o)| *k != e.product && o.source == Source::Buffer)
                .map(|(k, _)| first + k),
        );
    }
    v
}

/// Adds a column's partial sums (in split order) and stores the output
/// through the epilogue: one thread per output element.
pub(crate) fn combine(
    name: &str,
    spec: &Spec,
    out: DType,
    epi: Option<&Epilogue<'_>>,
) -> Result<Kernel, String> {
    let Spec { m, n, .. } = *spec;
    let total = m * n;
    let splits = spec.splits();
    let first = [format!("{}* out", types::storage(out)), "const float* __restrict__ ws".to_string()];
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", params(&first, epi));
    s.push_str("  typedef long long I;\n");
    let _ = writeln!(
        s,
        "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < {total}; i += (I)gridDim.x * blockDim.x) {{"
    );
    s.push_str("    float sum = 0.f;\n");
    let _ = writeln!(
        s,
        "    #pragma unroll 4\n    for (int x = 0; x < {splits}; ++x) sum += ws[(I)x * {total} + i];"
    );
    let _ = writeln!(s, "    {}\n  }}\n}}", store(spec, out, epi, "sum", "i")?);
    Ok(Kernel::new(name, s, super::grid_for(total, BLOCK as usize), BLOCK, epi_params(epi, 1)))
}
