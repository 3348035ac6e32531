//! A row's max and its sum of `exp(x - max)` in one pass (softmax,
//! log-sum-exp, cross-entropy over rows too long for registers).

use super::emit::{Gen, SCALAR};
use super::passes::pass_cone;
use super::{Class, CHUNK};
use crate::backends::cuda::codegen::body::Body;
use crate::backends::cuda::codegen::{expr, types};
use crate::ir::{BinaryOp, DType, NodeId, Op, ReduceOp, UnaryOp};
use std::fmt::Write;

/// A row's max and its sum of `exp(x - max)`, computed in one pass:
/// `max = max(a)`, `sum = sum(exp(a - expand(max)))`, all f32.
///
/// Each thread keeps a running max `m` and `s = Σ exp(a - m)` over its
/// columns, multiplying `s` by `exp(m - m')` when the max grows to `m'`
/// (by 1 when it does not: `-inf` to `-inf` must not make NaN); the group
/// combines the threads' `(m, s)` the same way. A column of `-inf` adds 0
/// (`exp(-inf - m)` is 0 for a finite `m`; before any finite column it
/// would be NaN). The two-pass sum is NaN exactly when the row's max is
/// not finite, and so is this one: a `+inf` column adds `exp(inf - inf)`,
/// a NaN makes the max NaN and the rescale `exp(m - NaN)`, and a row of
/// only `-inf` is set to NaN at the end. Otherwise the sums differ only in
/// rounding (each term is `exp` of a difference from another max, and a
/// chunk's terms add in float).
#[derive(Clone, Copy, Debug)]
pub(super) struct OnlinePair {
    pub(super) max: NodeId,
    pub(super) sum: NodeId,
    operand: NodeId,
}

/// The online pairs of a body (see [`OnlinePair`]).
pub(super) fn online_pairs(body: &Body<'_>) -> Vec<OnlinePair> {
    let g = body.g;
    let f32_node = |n: NodeId| !body.is_leaf(n) && g.node(n).dtype == DType::F32;
    let mut pairs = Vec::new();
    for &sum in &body.order {
        if !f32_node(sum) || !matches!(g.node(sum).op, Op::Reduce { op: ReduceOp::Sum, .. }) {
            continue;
        }
        let e = g.operands(sum)[0];
        if !f32_node(e) || !matches!(g.node(e).op, Op::Unary(UnaryOp::Exp)) {
            continue;
        }
        let d = g.operands(e)[0];
        if !f32_node(d) || !matches!(g.node(d).op, Op::Binary(BinaryOp::Sub)) {
            continue;
        }
        let (operand, b) = (g.operands(d)[0], g.operands(d)[1]);
        if !f32_node(b) || !matches!(g.node(b).op, Op::Expand(_)) {
            continue;
        }
        let max = g.operands(b)[0];
        if f32_node(max)
            && matches!(g.node(max).op, Op::Reduce { op: ReduceOp::Max, .. })
            && g.operands(max)[0] == operand
            && g.node(operand).dtype == DType::F32
            // One sum a max: its pass settles that one sum.
            && !pairs.iter().any(|p: &OnlinePair| p.max == max)
        {
            pairs.push(OnlinePair { max, sum, operand });
        }
    }
    pairs
}

impl Gen<'_, '_> {
    /// An [`OnlinePair`]: one pass over the row, [`CHUNK`] columns a
    /// thread at a time: the chunk's values (`-inf` past the row's end),
    /// their max, the running sum rescaled to the new max once, the
    /// chunk's terms summed in float and added in double; then the group
    /// combines the threads' `(max, sum)` pairs. Settles both as `r<id>`.
    pub(super) fn online_max_sum(&mut self, src: &mut String, pair: &OnlinePair) -> Result<(), String> {
        let (m, s, a) = (format!("a{}", pair.max.index()), format!("a{}", pair.sum.index()), pair.operand);
        let exp = |x: &str| expr::unary(UnaryOp::Exp, DType::F32, x);
        let neg_inf = types::lowest(DType::F32, true);
        let (g, n) = (self.group, CHUNK);
        let _ = writeln!(src, "    float {m} = {neg_inf};\n    double {s} = -0.0;");
        let _ = writeln!(src, "    for (I c0 = lane; c0 < C; c0 += {}) {{", n * g);
        let _ =
            writeln!(src, "      float xs[{n}];\n#pragma unroll\n      for (int it = 0; it < {n}; ++it) {{");
        let _ = writeln!(
            src,
            "        const I col = c0 + it * {g};\n        xs[it] = {neg_inf};\n        if (col < C) {{"
        );
        for id in pass_cone(self.body, &[a], &|n| self.class[&n] == Class::Row) {
            let st =
                self.body.statement(id, &format!("v{}", id.index()), &|o| self.col_operand(o, &SCALAR))?;
            let _ = writeln!(src, "          {st}");
        }
        let _ = writeln!(src, "          xs[it] = {};\n        }}\n      }}", self.col_operand(a, &SCALAR));
        let _ = writeln!(src, "      float cm = xs[0];\n#pragma unroll");
        let _ = writeln!(src, "      for (int it = 1; it < {n}; ++it) cm = kiln::Max()(cm, xs[it]);");
        let _ = writeln!(src, "      const float mx = kiln::Max()({m}, cm);");
        let _ = writeln!(
            src,
            "      {s} *= (double)(mx == {m} ? 1.f : {});\n      {m} = mx;",
            exp(&format!("{m} - mx"))
        );
        let _ = writeln!(src, "      float cs = 0.f;\n#pragma unroll");
        let _ = writeln!(
            src,
            "      for (int it = 0; it < {n}; ++it) cs += xs[it] == {neg_inf} ? 0.f : {};",
            exp("xs[it] - mx")
        );
        let _ = writeln!(src, "      {s} += (double)cs;\n    }}");
        let r = format!("r{}", pair.max.index());
        let _ = writeln!(src, "    const float {r} = kiln::group_reduce<{g}>({m}, kiln::Max());");
        let _ = writeln!(src, "    {s} *= (double)({m} == {r} ? 1.f : {});", exp(&format!("{m} - {r}")));
        let _ = writeln!(src, "    {s} = kiln::group_reduce<{g}>({s}, kiln::Sum());");
        // A row of only -inf: every rescale was skipped as "no change", so
        // nothing met the two-pass sum's `exp(-inf - -inf)`.
        let _ = writeln!(src, "    if ({r} == {neg_inf}) {s} = kiln::nan_f64();");
        let _ = writeln!(
            src,
            "    const float r{} = {};",
            pair.sum.index(),
            types::cast(DType::F64, DType::F32, &s)
        );
        Ok(())
    }
}
