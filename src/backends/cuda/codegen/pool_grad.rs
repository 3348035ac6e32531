//! `max_pool2d_grad`: the input gradient of a max pooling (see
//! `Op::MaxPool2dGrad` for which element of a window gets its gradient).
//!
//! *How.* One thread per input element, gathering: it visits the windows
//! that hold its element (at most `ceil(k / s)` per axis), finds each
//! window's maximum in `x` again (row-major, the index moving on `v > best
//! || v != v`, as PyTorch's kernels and the CPU's move it) and adds the
//! window's gradient when the maximum is its own element. Every element is
//! written once, its terms added in window order, so there are no atomics
//! and every run gives the same bits. Windows are small (a CNN's 2x2 or
//! 3x3), so reading each one again per element costs a few loads from L1.
//!
//! cuDNN's pooling backward is not used: it takes the forward's output,
//! routes a window's gradient to every tied maximum in some versions and
//! says nothing about NaN, where this op follows PyTorch's choice.

use super::body::{index_type, Operand, Source};
use super::{grid_for, types, Kernel, BLOCK};
use crate::ir::Shape;
use std::fmt::Write;

/// The kernel writing the gradient of `x` (shape `xs`, NCHW) from `g`
/// (`[n, c, oh, ow]`); `x` is operand 0 (`in0`), `g` operand 1 (`in1`).
pub(crate) fn generate(
    name: &str,
    x: &Operand,
    g: &Operand,
    xs: &Shape,
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [ph, pw]: [usize; 2],
) -> Kernel {
    let dtype = x.dtype;
    let (h, w) = (xs.0[2], xs.0[3]);
    let gs = g.access.shape().clone();
    let (oh, ow) = (gs.0[2], gs.0[3]);
    let numel = xs.numel();
    let index = index_type(numel.max(gs.numel()), &[x.clone(), g.clone()]);
    let acc = types::compute(dtype);
    let mut p = vec![format!("{}* __restrict__ out", types::storage(dtype))];
    for (k, o) in [x, g].iter().enumerate() {
        if o.source == Source::Buffer {
            p.push(format!("const {}* __restrict__ in{k}", types::storage(dtype)));
        }
    }
    // `lin` is parenthesized: `offset_of` divides and takes it modulo.
    let read = |o: &Operand, k: usize, lin: &str| match o.source {
        Source::Const(c) => types::literal(dtype, c),
        Source::Buffer => types::load(dtype, &format!("in{k}[{}]", o.access.offset_of(lin))),
    };
    let mut s = format!("extern \"C\" __global__ void {name}({}) {{\n", p.join(", "));
    let _ = writeln!(s, "  typedef {index} I;\n  typedef {acc} A;\n  const I n = {numel};");
    s.push_str(
        "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {\n",
    );
    let _ = writeln!(s, "    const I plane = i / {}, iy = (i / {w}) % {h}, ix = i % {w};", h * w);
    // The windows holding row iy: oy * sh - ph <= iy <= oy * sh - ph + kh - 1.
    for (o, at, k, st, pad, out) in [("oy", "iy", kh, sh, ph, oh), ("ox", "ix", kw, sw, pw, ow)] {
        let _ = writeln!(
            s,
            "    const I {o}0 = {at} + {pad} + 1 > {k} ? ({at} + {pad} + 1 - {k} + {st} - 1) / {st} : 0;"
        );
        let _ = writeln!(
            s,
            "    const I {o}1 = ({at} + {pad}) / {st} < {out} ? ({at} + {pad}) / {st} + 1 : {out};"
        );
    }
    let _ = writeln!(s, "    A sum = 0;\n    for (I oy = oy0; oy < oy1; ++oy) {{");
    let _ = writeln!(
        s,
        "      const I y0 = oy * {sh} < {ph} ? 0 : oy * {sh} - {ph};\n      const I y1 = oy * {sh} + {kh} - {ph} < {h} ? oy * {sh} + {kh} - {ph} : {h};"
    );
    s.push_str("      for (I ox = ox0; ox < ox1; ++ox) {\n");
    let _ = writeln!(
        s,
        "        const I x0 = ox * {sw} < {pw} ? 0 : ox * {sw} - {pw};\n        const I x1 = ox * {sw} + {kw} - {pw} < {w} ? ox * {sw} + {kw} - {pw} : {w};"
    );
    let _ = writeln!(s, "        A best = {};\n        I at = y0 * {w} + x0;", types::lowest(dtype, true));
    s.push_str("        for (I y = y0; y < y1; ++y) {\n          for (I xx = x0; xx < x1; ++xx) {\n");
    let _ =
        writeln!(s, "            const A v = {};", read(x, 0, &format!("((plane * {h} + y) * {w} + xx)")));
    let _ = writeln!(s, "            if (v > best || v != v) {{ best = v; at = y * {w} + xx; }}");
    s.push_str("          }\n        }\n");
    let _ = writeln!(
        s,
        "        if (at == iy * {w} + ix) sum += {};",
        read(g, 1, &format!("((plane * {oh} + oy) * {ow} + ox)"))
    );
    s.push_str("      }\n    }\n");
    let _ = writeln!(s, "    out[i] = {};\n  }}\n}}", types::store(dtype, "sum"));
    let params =
        [x, g].iter().enumerate().filter(|(_, o)| o.source == Source::Buffer).map(|(k, _)| k).collect();
    Kernel::new(name, s, grid_for(numel, BLOCK as usize), BLOCK, params)
}
