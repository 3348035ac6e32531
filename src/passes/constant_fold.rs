//! Constant folding: nodes that compute one known value everywhere become
//! a `Full` of that value.
//!
//! *Does.* Walks the needed nodes operands-first; a node whose operands are
//! all `Full` is rewritten in place to `Full(v)` (same shape, dtype, region)
//! when `v` is exactly what a kernel would compute for every element:
//! - `unary`, `binary`, `compare` of `Full`s: `v` comes from [`crate::ir::eval`]
//!   (`eval::unary`, `eval::binary`, `eval::compare_scalar`), the functions the
//!   CPU kernels call, so the folded value is bit-identical, NaN included.
//! - `cast`: [`Scalar::cast`], except float → integer when the value is NaN,
//!   infinite or outside the target's range (the truncate-and-saturate rule
//!   is the kernel's business; folding there would bake in one reading).
//! - `where` with a `Full` condition: the node is replaced by the chosen
//!   branch, whatever it is (the kernel copies that branch). A collective
//!   in the other branch stays in the graph and still runs: it is an
//!   effect, a root of the graph whether read or not ([`Graph::roots`]).
//! - views (`reshape`, `permute`, `expand`, `slice`) of a `Full`: the same
//!   value in the view's shape. View folding leaves these to this pass.
//! - `cat` of `Full`s whose values are bit-identical.
//! - reductions of a `Full(c)` over `n` elements per output (`n` = product of
//!   the reduced dims): `max`/`min` → `c`; `argmax` → `0` (the first maximum;
//!   NaN wins at index 0 too); integer `sum` → `n*c` wrapped to the dtype
//!   (what any order of wrapping adds gives); float `sum` → `round(n*c)` and
//!   float `mean` → `round((n*c)/n)` only when `c` is finite and not `-0.0`,
//!   `n >= 1`, and `n*c` is exact in f64 in a way that makes every partial
//!   sum `k*c` (`k <= n`) exact too: `n` times the odd part of `c`'s
//!   significand below 2^53, and `n*c` finite. Then the kernel's f64 accumulation
//!   gives exactly `n*c` in any order or chunking, and rounds once to the
//!   dtype, as the fold does.
//!
//! *Does not.* Fold `input`, `buffer`, `random`, `arange` (an arange is not
//! one value), `matmul`, `conv2d`, pooling, `gather`/`index_select` (an
//! out-of-range index is an error at run time that folding would hide),
//! float `sum`/`mean` of `-0.0` (the result's sign depends on whether the
//! kernel starts from `+0.0`), of NaN or infinity, or over zero elements,
//! or any rewrite that needs algebra (`x * 0` is not `0` for NaN, inf, -0.0).
//! Never folds a collective, even of a constant: its value is the other
//! ranks' too, and every rank must run it.
//!
//! *Preserves.* Every value the outputs see, bit for bit; node ids (folding
//! is in place); regions.
//!
//! *Invalidates.* Operand edges of folded nodes (they become sources; their
//! former operands may turn dead and are left for DCE).
//!
//! *Assumes.* A verified graph whose `Full` values are representable in
//! their node's dtype; the kernels' elementwise semantics are those of
//! `ir::eval`, float reductions accumulate in f64 and round once, and
//! `mean` divides that f64 sum by `n` before rounding.

use super::{Changed, Pass, PassCtx};
use crate::ir::{eval, DType, Graph, NodeId, Op, ReduceOp, Scalar};
use crate::Result;

/// Folds nodes of `Full` operands into `Full`s (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct ConstantFold;

impl Pass for ConstantFold {
    fn name(&self) -> &'static str {
        "constant-fold"
    }

    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed> {
        let mut changed = Changed::No;
        // Folded nodes lose their operand edges all at once at the end
        // (`fold` looks only at operands' ops, so stale edges of a node
        // already turned `Full` mislead nothing).
        let mut folded = Vec::new();
        for id in graph.topo_order() {
            match fold(graph, id) {
                Fold::Keep => continue,
                Fold::Value(v) => {
                    graph.node_mut(id).op = Op::Full(v);
                    folded.push(id);
                }
                Fold::Forward(operand) => graph.replace_all_uses(id, operand),
            }
            cx.rewrite();
            changed = Changed::Yes;
        }
        graph.clear_operands(&folded);
        Ok(changed)
    }
}

/// What to do with one node.
enum Fold {
    Keep,
    /// Becomes `Full` of the value.
    Value(Scalar),
    /// Every use reads this operand instead.
    Forward(NodeId),
}

fn full(graph: &Graph, id: NodeId) -> Option<Scalar> {
    match graph.node(id).op {
        Op::Full(v) => Some(v),
        _ => None,
    }
}

fn fold(graph: &Graph, id: NodeId) -> Fold {
    let node = graph.node(id);
    if node.op.is_source() || node.op.is_effect() {
        return Fold::Keep;
    }
    let operands = graph.operands(id);
    if let (Op::Where, Some(c)) = (&node.op, operands.first().and_then(|&c| full(graph, c))) {
        let pick = if c.cast(DType::Bool) == Scalar::Bool(true) { 1 } else { 2 };
        return operands.get(pick).map_or(Fold::Keep, |&o| Fold::Forward(o));
    }
    let Some(values) = operands.iter().map(|&o| full(graph, o)).collect::<Option<Vec<_>>>() else {
        return Fold::Keep;
    };
    let Some(&first) = values.first() else { return Fold::Keep };
    let in_dtype = graph.node(operands[0]).dtype;
    let value = match &node.op {
        Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. } => Some(first),
        Op::Unary(u) => Some(eval::unary(*u, node.dtype, first)),
        Op::Binary(b) => values.get(1).map(|&second| eval::binary(*b, node.dtype, first, second)),
        Op::Compare(c) => {
            values.get(1).map(|&second| Scalar::Bool(eval::compare_scalar(*c, in_dtype, first, second)))
        }
        Op::Cast(to) => cast(first, in_dtype, *to),
        Op::Cat { .. } => values.iter().all(|v| v.hash_bits() == first.hash_bits()).then_some(first),
        Op::Reduce { op, dims, .. } => {
            let shape = &graph.node(operands[0]).shape;
            let n = dims
                .iter()
                .try_fold(1u64, |acc, &d| shape.dims().get(d).and_then(|&s| acc.checked_mul(s as u64)));
            n.and_then(|n| reduce(*op, node.dtype, first, n))
        }
        _ => None,
    };
    value.map_or(Fold::Keep, Fold::Value)
}

/// A cast of one value, or `None` where folding would guess the kernel's
/// handling of NaN, infinities or out-of-range floats.
fn cast(v: Scalar, from: DType, to: DType) -> Option<Scalar> {
    if from.is_float() && to.is_int() {
        let x = v.as_f64().trunc();
        let (lo, hi) = match to {
            DType::U8 => (0.0, u8::MAX as f64),
            DType::I32 => (i32::MIN as f64, i32::MAX as f64),
            // i64::MAX as f64 rounds up to 2^63, which is out of range.
            _ => (i64::MIN as f64, 9_223_372_036_854_774_784.0),
        };
        if !(x >= lo && x <= hi) {
            return None;
        }
    }
    Some(v.cast(to))
}

/// A reduction of `n` copies of `c` (see the module docs for the rules).
fn reduce(op: ReduceOp, dtype: DType, c: Scalar, n: u64) -> Option<Scalar> {
    match op {
        ReduceOp::Max | ReduceOp::Min => Some(c),
        ReduceOp::ArgMax => Some(Scalar::Int(0)),
        ReduceOp::Sum if dtype.is_int() => Some(Scalar::Int(c.as_i64().wrapping_mul(n as i64)).cast(dtype)),
        ReduceOp::Sum | ReduceOp::Mean if dtype.is_float() => {
            let total = exact_multiple(c.as_f64(), n)?;
            let v = if op == ReduceOp::Sum { total } else { total / n as f64 };
            Some(Scalar::Float(v).cast(dtype))
        }
        _ => None,
    }
}

/// `n * c` when every partial sum `k * c` (`1 <= k <= n`) is exact in f64, so
/// that any summation order yields exactly `n * c`; `None` otherwise, and
/// for `-0.0`, NaN, infinities and `n == 0`.
fn exact_multiple(c: f64, n: u64) -> Option<f64> {
    if n == 0 || !c.is_finite() || (c == 0.0 && c.is_sign_negative()) {
        return None;
    }
    if c == 0.0 {
        return Some(0.0);
    }
    // c = m * 2^e with m odd; every k*c (k <= n) is exact when n*m < 2^53.
    let bits = c.to_bits();
    let exponent = (bits >> 52) & 0x7ff;
    let fraction = bits & ((1 << 52) - 1);
    let mantissa = if exponent == 0 { fraction } else { fraction | (1 << 52) };
    let odd = mantissa >> mantissa.trailing_zeros();
    if (odd as u128) * (n as u128) >= 1 << 53 {
        return None;
    }
    let total = n as f64 * c;
    total.is_finite().then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, CompareOp, RegionId, Shape, UnaryOp};

    fn full_node(g: &mut Graph, v: Scalar, dtype: DType, dims: &[usize]) -> NodeId {
        g.add(Op::Full(v), &[], Some((Shape::new(dims), dtype)), RegionId::ROOT).unwrap()
    }

    fn add(g: &mut Graph, op: Op, operands: &[NodeId]) -> NodeId {
        g.add(op, operands, None, RegionId::ROOT).unwrap()
    }

    /// Folds `op` applied to the operands and returns the output's op.
    fn folded(g: &mut Graph, op: Op, operands: &[NodeId]) -> Op {
        let id = add(g, op, operands);
        g.set_outputs(vec![id]);
        ConstantFold.run(g, &mut PassCtx::default()).unwrap();
        g.node(g.outputs()[0]).op.clone()
    }

    fn bits(op: &Op) -> Option<(u8, u64)> {
        match op {
            Op::Full(v) => Some(v.hash_bits()),
            _ => None,
        }
    }

    #[test]
    fn binary_of_fulls_uses_eval() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(0.1f32 as f64), DType::F32, &[2]);
        let b = full_node(&mut g, Scalar::Float(0.2f32 as f64), DType::F32, &[2]);
        let op = folded(&mut g, Op::Binary(BinaryOp::Add), &[a, b]);
        assert_eq!(op, Op::Full(Scalar::Float((0.1f32 + 0.2f32) as f64)));
    }

    #[test]
    fn f16_unary_rounds_once_like_the_kernel() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(1.0), DType::F16, &[3]);
        let op = folded(&mut g, Op::Unary(UnaryOp::Exp), &[a]);
        let expected = half::f16::from_f32(1f32.exp()).to_f64();
        assert_eq!(bits(&op), Some(Scalar::Float(expected).hash_bits()));
    }

    #[test]
    fn integer_overflow_wraps() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Int(i32::MAX as i64), DType::I32, &[2]);
        let b = full_node(&mut g, Scalar::Int(1), DType::I32, &[2]);
        assert_eq!(
            folded(&mut g, Op::Binary(BinaryOp::Add), &[a, b]),
            Op::Full(Scalar::Int(i32::MIN as i64))
        );
    }

    #[test]
    fn nan_compare_is_false() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(f64::NAN), DType::F32, &[2]);
        let op = folded(&mut g, Op::Compare(CompareOp::Eq), &[a, a]);
        assert_eq!(op, Op::Full(Scalar::Bool(false)));
    }

    #[test]
    fn negative_zero_survives_neg() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(0.0), DType::F32, &[2]);
        let op = folded(&mut g, Op::Unary(UnaryOp::Neg), &[a]);
        assert_eq!(bits(&op), Some(Scalar::Float(-0.0).hash_bits()));
    }

    #[test]
    fn where_with_known_condition_forwards_the_branch() {
        let mut g = Graph::new();
        let c = full_node(&mut g, Scalar::Bool(false), DType::Bool, &[2]);
        let x = g.add(Op::Input(0), &[], Some((Shape::new([2]), DType::F32)), RegionId::ROOT).unwrap();
        let y = g.add(Op::Input(1), &[], Some((Shape::new([2]), DType::F32)), RegionId::ROOT).unwrap();
        folded(&mut g, Op::Where, &[c, x, y]);
        assert_eq!(g.outputs(), &[y]);
    }

    #[test]
    fn out_of_range_and_nan_casts_to_int_stay() {
        for v in [f64::NAN, f64::INFINITY, 3e9, -1.0] {
            let mut g = Graph::new();
            let a = full_node(&mut g, Scalar::Float(v), DType::F32, &[2]);
            let to = if v == -1.0 { DType::U8 } else { DType::I32 };
            assert_eq!(folded(&mut g, Op::Cast(to), &[a]), Op::Cast(to), "{v}");
        }
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(-2.75), DType::F32, &[2]);
        assert_eq!(folded(&mut g, Op::Cast(DType::I32), &[a]), Op::Full(Scalar::Int(-2)));
    }

    #[test]
    fn views_of_full_and_equal_cats_fold() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(2.0), DType::F32, &[3, 1]);
        let e = add(&mut g, Op::Expand(Shape::new([3, 4])), &[a]);
        let b = full_node(&mut g, Scalar::Float(2.0), DType::F32, &[3, 4]);
        let op = folded(&mut g, Op::Cat { dim: 0 }, &[e, b]);
        assert_eq!(op, Op::Full(Scalar::Float(2.0)));
        assert_eq!(g.node(g.outputs()[0]).shape, Shape::new([6, 4]));
    }

    #[test]
    fn cat_of_zero_and_negative_zero_stays() {
        let mut g = Graph::new();
        let a = full_node(&mut g, Scalar::Float(0.0), DType::F32, &[1]);
        let b = full_node(&mut g, Scalar::Float(-0.0), DType::F32, &[1]);
        assert_eq!(folded(&mut g, Op::Cat { dim: 0 }, &[a, b]), Op::Cat { dim: 0 });
    }

    fn reduced(v: Scalar, dtype: DType, dims: &[usize], op: ReduceOp, over: Vec<usize>) -> Op {
        let mut g = Graph::new();
        let a = full_node(&mut g, v, dtype, dims);
        folded(&mut g, Op::Reduce { op, dims: over, keepdim: false, into: None }, &[a])
    }

    #[test]
    fn reductions() {
        use ReduceOp::*;
        let f = |v: f64| Op::Full(Scalar::Float(v));
        assert_eq!(
            reduced(Scalar::Float(0.1f32 as f64), DType::F32, &[3, 4], Sum, vec![1]),
            f((4.0 * (0.1f32 as f64)) as f32 as f64)
        );
        assert_eq!(reduced(Scalar::Float(1.5), DType::F32, &[3, 4], Mean, vec![0, 1]), f(1.5));
        assert_eq!(reduced(Scalar::Float(f64::NAN), DType::F32, &[3], Max, vec![0]).mnemonic(), "full");
        assert_eq!(reduced(Scalar::Float(2.0), DType::F32, &[3], ArgMax, vec![0]), Op::Full(Scalar::Int(0)));
        // i32: 3 * 2^30 wraps.
        assert_eq!(
            reduced(Scalar::Int(1 << 30), DType::I32, &[3], Sum, vec![0]),
            Op::Full(Scalar::Int((3i64 << 30) as i32 as i64))
        );
        // u8: 300 -> 44.
        assert_eq!(reduced(Scalar::Int(100), DType::U8, &[3], Sum, vec![0]), Op::Full(Scalar::Int(44)));
        // Must not fold: -0.0, NaN, an inexact f64 multiple, zero elements.
        let keep = |op: &Op| op.mnemonic() != "full";
        assert!(keep(&reduced(Scalar::Float(-0.0), DType::F32, &[3], Sum, vec![0])));
        assert!(keep(&reduced(Scalar::Float(f64::NAN), DType::F32, &[3], Sum, vec![0])));
        assert!(keep(&reduced(Scalar::Float(0.1), DType::F64, &[3], Sum, vec![0])));
        assert!(keep(&reduced(Scalar::Float(0.1), DType::F64, &[3], Mean, vec![0])));
        assert!(keep(&reduced(Scalar::Float(1.0), DType::F32, &[2, 0], Sum, vec![1])));
    }

    #[test]
    fn exact_multiple_rule() {
        assert_eq!(exact_multiple(0.5, 3), Some(1.5));
        assert_eq!(exact_multiple(0.0, 3), Some(0.0));
        assert_eq!(exact_multiple(-0.0, 3), None);
        assert_eq!(exact_multiple(1.0, 1 << 52), Some((1u64 << 52) as f64));
        assert_eq!(exact_multiple(1.0, 1 << 53), None);
        assert_eq!(exact_multiple(f64::MAX, 1), Some(f64::MAX));
        assert_eq!(exact_multiple(0.1, 2), Some(0.2));
        assert_eq!(exact_multiple(0.1, 3), None);
        assert_eq!(exact_multiple(2f64.powi(1023), 2), None);
        assert_eq!(exact_multiple(f64::from_bits(1), 1000), Some(f64::from_bits(1000)));
    }

    #[test]
    fn sources_never_fold() {
        let mut g = Graph::new();
        let r = g
            .add(
                Op::Random { dist: crate::ir::Distribution::Uniform, stream: 0 },
                &[],
                Some((Shape::new([2]), DType::F32)),
                RegionId::ROOT,
            )
            .unwrap();
        let a = g
            .add(
                Op::Arange { start: Scalar::Float(0.0), step: Scalar::Float(0.0) },
                &[],
                Some((Shape::new([2]), DType::F32)),
                RegionId::ROOT,
            )
            .unwrap();
        g.set_outputs(vec![r, a]);
        assert_eq!(ConstantFold.run(&mut g, &mut PassCtx::default()).unwrap(), Changed::No);
    }
}
