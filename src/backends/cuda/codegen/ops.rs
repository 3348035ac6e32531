//! Kernels for the ops that are neither a body nor a library call: fills,
//! ranges, random numbers, gather, index_select, concatenation and integer
//! matmul. Each is one grid-stride loop over the output's elements, with
//! the semantics of the CPU backend's kernel of the same op.

use super::body::{buffer_operands, index_type, Operand, Source};
use super::index::Access;
use super::{grid_for, types, Kernel, BLOCK};
use crate::backends::Layout;
use crate::ir::{DType, Distribution, Scalar, Shape};
use std::fmt::Write;

/// Opens `extern "C" __global__ void name(params) {` and the loop over
/// `i < n`.
fn open(name: &str, params: &str, index: &str, numel: usize) -> String {
    let mut s = format!("extern \"C\" __global__ void {name}({params}) {{\n");
    let _ = writeln!(s, "  typedef {index} I;\n  const I n = {numel};");
    s.push_str(
        "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {\n",
    );
    s
}

fn close(name: &str, mut src: String, numel: usize, params: Vec<usize>) -> Kernel {
    src.push_str("  }\n}\n");
    Kernel::new(name, src, grid_for(numel, BLOCK as usize), BLOCK, params)
}

fn small_index(numel: usize) -> &'static str {
    index_type(numel, &[])
}

/// Every element of a dense output equal to `value`.
pub(crate) fn fill(name: &str, dtype: DType, numel: usize, value: Scalar) -> Kernel {
    let params = format!("{}* __restrict__ out", types::storage(dtype));
    let mut src = open(name, &params, small_index(numel), numel);
    let _ = writeln!(src, "    out[i] = {};", types::store(dtype, &types::literal(dtype, value)));
    close(name, src, numel, vec![])
}

/// `start + i * step`: in double for float dtypes, in wrapping 64-bit
/// integers for the others (as the CPU's `arange`).
pub(crate) fn arange(name: &str, dtype: DType, numel: usize, start: Scalar, step: Scalar) -> Kernel {
    let params = format!("{}* __restrict__ out", types::storage(dtype));
    let mut src = open(name, &params, small_index(numel), numel);
    let v = arange_value(dtype, start, step, "i");
    let _ = writeln!(src, "    out[i] = {};", types::store(dtype, &v));
    close(name, src, numel, vec![])
}

/// Element `i` (an expression) of `arange start step` in `dtype`'s compute
/// type: the arange kernel stores it, and a fused row kernel that reads an
/// arange computes it in place of the load (`Leaf::read_at`), the same
/// expression either way.
pub(crate) fn arange_value(dtype: DType, start: Scalar, step: Scalar, i: &str) -> String {
    if dtype.is_float() {
        let e = format!("({:?} + (double){i} * {:?})", start.as_f64(), step.as_f64());
        types::cast(DType::F64, dtype, &e)
    } else {
        let e = format!("kiln::iadd({}LL, kiln::imul((kiln::i64){i}, {}LL))", start.as_i64(), step.as_i64());
        types::settle(dtype, &e)
    }
}

/// Random numbers: element `i` of a run stream, exactly as
/// `backends::philox` defines them. The kernel reads the seed and the
/// stream's number through two pointers into the run's parameter block,
/// so every random tensor of one dtype, distribution and size shares one
/// kernel (a model's initializers are dozens of them, and each costs ptxas
/// 15-50 ms). Uniform values that round up to 1 in a narrow dtype become
/// the largest value below 1.
pub(crate) fn random(name: &str, dtype: DType, numel: usize, dist: Distribution) -> Kernel {
    let params = format!(
        "{}* __restrict__ out, const unsigned long long* __restrict__ seed_at, const unsigned long long* __restrict__ stream_at",
        types::storage(dtype)
    );
    let mut src = format!("extern \"C\" __global__ void {name}({params}) {{\n");
    let _ = writeln!(src, "  typedef {} I;\n  const I n = {numel};", small_index(numel));
    src.push_str("  const unsigned long long seed = *seed_at, stream = *stream_at;\n");
    src.push_str(
        "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {\n",
    );
    let draw = match dist {
        Distribution::Uniform => "kiln::uniform(seed, stream, (unsigned long long)i)",
        Distribution::Normal => "kiln::normal(seed, stream, (unsigned long long)i)",
    };
    let _ = writeln!(src, "    const double u = {draw};");
    let below_one = dist == Distribution::Uniform;
    let line = match dtype {
        DType::F64 => "out[i] = u;".to_string(),
        DType::F32 if below_one => "const float r = (float)u;\n    out[i] = r >= 1.0f ? 0.99999994f : r;".into(),
        DType::F32 => "out[i] = (float)u;".into(),
        DType::F16 if below_one => {
            "kiln::f16 h = kiln::f16_from(u);\n    if (kiln::to_float(h) >= 1.0f) h.bits = 0x3bff;\n    out[i] = h;"
                .into()
        }
        DType::F16 => "out[i] = kiln::f16_from(u);".into(),
        DType::BF16 if below_one => {
            "kiln::bf16 h = kiln::bf16_from(u);\n    if (kiln::to_float(h) >= 1.0f) h.bits = 0x3f7f;\n    out[i] = h;"
                .into()
        }
        DType::BF16 => "out[i] = kiln::bf16_from(u);".into(),
        // infer() keeps random numbers to float dtypes.
        d => format!("out[i] = {};", types::store(d, "(kiln::i64)0")),
    };
    let _ = writeln!(src, "    {line}");
    src.push_str("  }\n}\n");
    Kernel::new(name, src, grid_for(numel, BLOCK as usize), BLOCK, vec![])
}

/// An index kernel's bad-index report: `status[0]` is the smallest output
/// position whose index was out of range (all ones when none was), and a
/// second kernel copies that index into `status[1]`.
pub(crate) const STATUS: &str = "unsigned long long* __restrict__ status";

/// The index operand's value at `pos` as a 64-bit integer.
pub(crate) fn index_value(idx: &Operand, idx_access: &Access, pos: &str) -> String {
    match idx.source {
        Source::Const(c) => types::literal(DType::I64, c),
        Source::Buffer => format!("(kiln::i64)in1[{}]", idx_access.offset_of(pos)),
    }
}

fn index_params(out: DType, x: &Operand, idx: &Operand) -> String {
    let mut p = vec![format!("{}* __restrict__ out", types::storage(out))];
    if x.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in0", types::storage(x.dtype)));
    }
    if idx.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in1", types::storage(idx.dtype)));
    }
    p.push(STATUS.into());
    p.join(", ")
}

/// `torch.gather(x, dim, idx)` over the index's shape; an index outside
/// `0..size` writes 0 and is reported through `status`.
pub(crate) fn gather(name: &str, x: &Operand, idx: &Operand, dim: usize) -> Kernel {
    let shape = idx.access.shape().clone();
    let xl = x.access.single().cloned().unwrap_or_else(|| Layout::contiguous(x.access.shape().clone()));
    let mut strides = xl.strides.clone();
    let stride = strides[dim];
    strides[dim] = 0;
    let base = Access::strided(Layout { shape: shape.clone(), strides, offset: xl.offset });
    let size = xl.shape.0[dim];
    index_kernel(name, x, idx, &shape, &idx.access.clone(), &base, stride, size)
}

/// `torch.index_select(x, dim, idx)`: position `p` reads `x` at `p` with
/// coordinate `dim` replaced by `idx[p[dim]]`.
pub(crate) fn index_select(name: &str, x: &Operand, idx: &Operand, dim: usize, out: &Shape) -> Kernel {
    let xl = x.access.single().cloned().unwrap_or_else(|| Layout::contiguous(x.access.shape().clone()));
    let mut strides = xl.strides.clone();
    let stride = strides[dim];
    strides[dim] = 0;
    let base = Access::strided(Layout { shape: out.clone(), strides, offset: xl.offset });
    let il = idx.access.single().cloned().unwrap_or_else(|| Layout::contiguous(idx.access.shape().clone()));
    let mut istrides = vec![0; out.rank()];
    istrides[dim] = il.strides[0];
    let idx_access = Access::strided(Layout { shape: out.clone(), strides: istrides, offset: il.offset });
    let size = xl.shape.0[dim];
    index_kernel(name, x, idx, out, &idx_access, &base, stride, size)
}

#[allow(clippy::too_many_arguments)]
fn index_kernel(
    name: &str,
    x: &Operand,
    idx: &Operand,
    out: &Shape,
    idx_access: &Access,
    base: &Access,
    stride: usize,
    size: usize,
) -> Kernel {
    let numel = out.numel();
    let index = index_type(numel, &[x.clone(), idx.clone()]);
    let mut src = open(name, &index_params(x.dtype, x, idx), index, numel);
    let _ = writeln!(src, "    const kiln::i64 v = {};", index_value(idx, idx_access, "i"));
    let _ = writeln!(src, "    if (v < 0 || v >= {size}LL) {{");
    src.push_str("      atomicMin(status, (unsigned long long)i);\n");
    let _ =
        writeln!(src, "      out[i] = {};", types::store(x.dtype, &types::literal(x.dtype, Scalar::Int(0))));
    src.push_str("    } else {\n");
    let read = match x.source {
        // A literal is in the compute type (float for f16 and bf16): it is
        // stored as the output's storage type, as the out-of-range branch
        // does. A buffer element is already in that type.
        Source::Const(c) => types::store(x.dtype, &types::literal(x.dtype, c)),
        Source::Buffer => format!("in0[{} + (I)v * {stride}]", base.offset_of("i")),
    };
    let _ = writeln!(src, "      out[i] = {read};\n    }}");
    close(name, src, numel, buffer_operands(&[x.clone(), idx.clone()]))
}

/// The follow-up of an index kernel: copies the bad index at position
/// `status[0]` (if any) into `status[1]`, while the index is still alive.
/// The status block is this kernel's `out`.
pub(crate) fn index_report(name: &str, idx: &Operand, idx_access_over_out: &Access) -> Kernel {
    let mut p = vec![STATUS.to_string()];
    if idx.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in1", types::storage(idx.dtype)));
    }
    let mut src = format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "));
    src.push_str("  const unsigned long long p = status[0];\n");
    src.push_str("  if (threadIdx.x == 0 && blockIdx.x == 0 && p != ~0ULL) {\n");
    src.push_str("    typedef long long I;\n    const I i = (I)p;\n");
    let _ =
        writeln!(src, "    status[1] = (unsigned long long){};", index_value(idx, idx_access_over_out, "i"));
    src.push_str("  }\n}\n");
    let params = if idx.source == Source::Buffer { vec![1] } else { vec![] };
    Kernel::new(name, src, 1, 32, params)
}

/// The index operand's access over the output's positions, for
/// [`index_report`]: gather reads it at the same position, index_select
/// at the position's coordinate along `dim`.
pub(crate) fn index_access(gather: bool, idx: &Operand, dim: usize, out: &Shape) -> Access {
    if gather {
        return idx.access.clone();
    }
    let il = idx.access.single().cloned().unwrap_or_else(|| Layout::contiguous(idx.access.shape().clone()));
    let mut strides = vec![0; out.rank()];
    strides[dim] = il.strides[0];
    Access::strided(Layout { shape: out.clone(), strides, offset: il.offset })
}

/// Concatenation along `dim`: each output position reads the operand its
/// coordinate along `dim` falls in.
pub(crate) fn cat(name: &str, parts: &[Operand], dim: usize, out: &Shape) -> Kernel {
    if let Some(kernel) = cat4(name, parts, dim, out) {
        return kernel;
    }
    if let Some(kernel) = cat_last4(name, parts, dim, out) {
        return kernel;
    }
    let numel = out.numel();
    let dtype = parts.first().map_or(DType::F32, |p| p.dtype);
    let inner: usize = out.0[dim + 1..].iter().product();
    let total = out.0[dim];
    let index = index_type(numel, parts);
    let mut src = open(name, &cat_params(dtype, parts), index, numel);
    let _ = writeln!(
        src,
        "    const I outer = i / {}, c = (i / {inner}) % {}, in = i % {inner};",
        (total * inner).max(1),
        total.max(1)
    );
    let mut start = 0usize;
    for (k, o) in parts.iter().enumerate() {
        let size = o.access.shape().0[dim];
        let pos = format!("(outer * {} + (c - {start}) * {inner} + in)", size * inner);
        let v = match o.source {
            Source::Const(c) => types::store(dtype, &types::literal(dtype, c)),
            Source::Buffer => format!("in{k}[{}]", o.access.offset_of(&pos)),
        };
        let guard = piece_guard(k, parts.len(), start + size);
        let _ = writeln!(src, "    {guard}out[i] = {v};");
        start += size;
    }
    close(name, src, numel, buffer_operands(parts))
}

/// A `cat` kernel's parameters: the output, then each part read from a
/// buffer (`in<k>`, numbered by part; constant parts are literals).
fn cat_params(dtype: DType, parts: &[Operand]) -> String {
    let mut p = vec![format!("{}* __restrict__ out", types::storage(dtype))];
    for (k, o) in parts.iter().enumerate() {
        if o.source == Source::Buffer {
            p.push(format!("const {}* __restrict__ in{k}", types::storage(o.dtype)));
        }
    }
    p.join(", ")
}

/// The branch of a `cat` kernel that takes part `k` of `parts` (whose
/// positions end before `end` along the joined dim): `if`, `else if` or
/// `else`, none for a single part.
fn piece_guard(k: usize, parts: usize, end: usize) -> String {
    match (k, k + 1 == parts) {
        (0, true) => String::new(),
        (0, false) => format!("if (c < {end}) "),
        (_, true) => "else ".to_string(),
        (_, false) => format!("else if (c < {end}) "),
    }
}

/// `cat` four elements at a time (one 8- or 16-byte load and store, one
/// index computation for the four), when the joined dim is not the last,
/// the last dim is a multiple of 4 and every part reads its storage
/// through one strided layout whose last dim is contiguous and whose
/// offset and other strides are multiples of 4 (so every run of four is
/// aligned). GPT-2's qkv gradient joins `dq`, `dk`, `dv` read through
/// permuted views: element by element, each with its own index
/// arithmetic, it took 33 µs for 19 MB on an H100.
fn cat4(name: &str, parts: &[Operand], dim: usize, out: &Shape) -> Option<Kernel> {
    let rank = out.rank();
    let last = *out.0.last()?;
    if dim + 1 >= rank || last % 4 != 0 || parts.is_empty() {
        return None;
    }
    let aligned = |o: &Operand| {
        matches!(o.source, Source::Const(_))
            || o.access.single().is_some_and(|l| {
                l.strides.last() == Some(&1)
                    && l.offset % 4 == 0
                    && l.strides[..rank - 1].iter().zip(&l.shape.0).all(|(&st, &d)| st % 4 == 0 || d == 1)
            })
    };
    if !parts.iter().all(aligned) {
        return None;
    }
    let numel = out.numel();
    let dtype = parts[0].dtype;
    let st = types::storage(dtype);
    let inner: usize = out.0[dim + 1..].iter().product();
    let total = out.0[dim];
    let index = index_type(numel, parts);
    let quads = numel / 4;
    let mut src = open(name, &cat_params(dtype, parts), index, quads);
    src.push_str("    const I e = i * 4;\n");
    let _ = writeln!(
        src,
        "    const I outer = e / {}, c = (e / {inner}) % {}, in = e % {inner};",
        (total * inner).max(1),
        total.max(1)
    );
    let mut start = 0usize;
    for (k, o) in parts.iter().enumerate() {
        let size = o.access.shape().0[dim];
        let pos = format!("(outer * {} + (c - {start}) * {inner} + in)", size * inner);
        let guard = piece_guard(k, parts.len(), start + size);
        let quad = match o.source {
            Source::Const(c) => {
                format!("kiln::splat4<{st}>({})", types::store(dtype, &types::literal(dtype, c)))
            }
            Source::Buffer => format!("kiln::load4(in{k} + {})", o.access.offset_of(&pos)),
        };
        let _ = writeln!(src, "    {guard}kiln::store4(out + e, {quad});");
        start += size;
    }
    Some(close(name, src, quads, buffer_operands(parts)))
}

/// `cat` along the last dim, four output elements a thread (one 8- or
/// 16-byte store), when that dim is a multiple of 4 and parts are not
/// (so [`cat4`] cannot load them four at a time): each element reads its
/// part on its own, and a run of four never crosses a row. GPT-2's
/// padded LM head pads the logits' gradient, `[4096, 50257]` bf16, with
/// 7 zero columns: element by element, with a 2-byte store each, it took
/// 0.47 ms for 0.8 GB on an H100.
fn cat_last4(name: &str, parts: &[Operand], dim: usize, out: &Shape) -> Option<Kernel> {
    let rank = out.rank();
    let total = *out.0.last()?;
    if dim + 1 != rank || total % 4 != 0 || parts.is_empty() {
        return None;
    }
    let numel = out.numel();
    let dtype = parts[0].dtype;
    let st = types::storage(dtype);
    let index = index_type(numel, parts);
    let quads = numel / 4;
    let mut src = open(name, &cat_params(dtype, parts), index, quads);
    src.push_str("    const I e = i * 4;\n");
    let _ = writeln!(src, "    const I outer = e / {total}, c0 = e % {total};");
    let _ = writeln!(src, "    kiln::vec4<{st}> q;\n#pragma unroll\n    for (int j = 0; j < 4; ++j) {{");
    src.push_str("      const I c = c0 + j;\n");
    let mut start = 0usize;
    for (k, o) in parts.iter().enumerate() {
        let size = o.access.shape().0[rank - 1];
        let pos = format!("(outer * {size} + (c - {start}))");
        let v = match o.source {
            Source::Const(c) => types::store(dtype, &types::literal(dtype, c)),
            Source::Buffer => format!("in{k}[{}]", o.access.offset_of(&pos)),
        };
        let guard = piece_guard(k, parts.len(), start + size);
        let _ = writeln!(src, "      {guard}q.v[j] = {v};");
        start += size;
    }
    src.push_str("    }\n    kiln::store4(out + e, q);\n");
    Some(close(name, src, quads, buffer_operands(parts)))
}

/// `[.., m, k] x [.., k, n]` for integer dtypes: one thread per output
/// element, a wrapping 64-bit sum (cuBLAS has no integer GEMM of these
/// types).
pub(crate) fn int_matmul(name: &str, a: &Operand, b: &Operand, out: &Shape) -> Kernel {
    let r = out.rank();
    let (m, n) = (out.0[r - 2], out.0[r - 1]);
    let k = a.access.shape().0[r - 1];
    let numel = out.numel();
    let dtype = a.dtype;
    let index = index_type(
        numel.max(a.access.shape().numel()).max(b.access.shape().numel()),
        &[a.clone(), b.clone()],
    );
    let p = format!(
        "{}* __restrict__ out, const {t}* __restrict__ in0, const {t}* __restrict__ in1",
        types::storage(dtype),
        t = types::storage(dtype)
    );
    let mut src = open(name, &p, index, numel);
    let _ =
        writeln!(src, "    const I bm = i / {n}, j = i % {n}, bat = bm / {m};", m = m.max(1), n = n.max(1));
    src.push_str("    kiln::i64 acc = 0;\n");
    let _ = writeln!(src, "    for (I l = 0; l < {k}; ++l) {{");
    let av = types::load(dtype, &format!("in0[{}]", a.access.offset_of(&format!("(bm * {k} + l)"))));
    let bv =
        types::load(dtype, &format!("in1[{}]", b.access.offset_of(&format!("((bat * {k} + l) * {n} + j)"))));
    let _ = writeln!(src, "      acc = kiln::iadd(acc, kiln::imul({av}, {bv}));\n    }}");
    let _ = writeln!(src, "    out[i] = {};", types::store(dtype, &types::settle(dtype, "acc")));
    close(name, src, numel, vec![0, 1])
}

/// `write_at`'s window: one thread per element of `value` (operand 1),
/// written at the clamped offset (operand 2, read by every thread) along
/// `dim` of `out`, which already holds the target (copied there first, or
/// the target itself when the write runs in place).
pub(crate) fn write_at(name: &str, value: &Operand, offset: &Operand, dim: usize, out: &Shape) -> Kernel {
    let dtype = value.dtype;
    let vshape = value.access.shape().clone();
    let (size, len) = (out.0[dim], vshape.0[dim]);
    let inner: usize = out.0[dim + 1..].iter().product();
    let numel = vshape.numel();
    let index = index_type(out.numel().max(numel), std::slice::from_ref(value));
    let mut p = vec![format!("{}* __restrict__ out", types::storage(dtype))];
    if value.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in1", types::storage(dtype)));
    }
    if offset.source == Source::Buffer {
        p.push(format!("const {}* __restrict__ in2", types::storage(offset.dtype)));
    }
    let mut s = open(name, &p.join(", "), index, numel);
    let at = match offset.source {
        Source::Const(c) => types::literal(DType::I64, c),
        Source::Buffer => format!("(kiln::i64)in2[{}]", offset.access.offset_of("0")),
    };
    let last = size - len;
    let _ = writeln!(s, "    const kiln::i64 a = {at};");
    let _ = writeln!(s, "    const I start = (I)(a < 0 ? 0 : (a > {last}LL ? {last}LL : a));");
    let (inner, len) = (inner.max(1), len.max(1));
    let _ = writeln!(s, "    const I o = i / {}, j = (i / {inner}) % {len}, c = i % {inner};", len * inner);
    let read = match value.source {
        Source::Const(c) => types::store(dtype, &types::literal(dtype, c)),
        Source::Buffer => format!("in1[{}]", value.access.offset_of("i")),
    };
    let _ = writeln!(s, "    out[(o * {size} + start + j) * {inner} + c] = {read};");
    let mut params = Vec::new();
    if value.source == Source::Buffer {
        params.push(1);
    }
    if offset.source == Source::Buffer {
        params.push(2);
    }
    close(name, s, numel, params)
}
