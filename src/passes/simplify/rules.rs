//! Every rewrite rule of the simplify pass, as named data.
//!
//! A [`Rule`] has a kebab-case name, the kind of e-node it starts from, and
//! a function that, given one such e-node, returns the equal term to add to
//! its e-class (or `None`). The comment on each entry of [`RULES`] states
//! the identity and when it holds. Rules made with [`Rule::new`] are
//! exact, or check the dtype and [`Env::fast_math`] themselves where they
//! are exact for some dtypes only (integer reassociation); rules made with
//! [`Rule::fast_math_only`] exist only under fast math.
//!
//! Constants are e-classes whose analysis says "one value everywhere": a
//! `full` of the operand's shape, or views of a smaller `full` (the user
//! API's `x * 2.0` is `mul x, expand(full 2)`). A constant a rule makes
//! takes the same form as the one it replaces ([`const_like`]).

use super::lang::{Data, ENode, Kind, OpKey, SGraph, Term};
use crate::ir::{eval, BinaryOp, DType, Op, ReduceOp, Scalar, Shape, UnaryOp};
use egg::Id;

/// What a rule may assume about the compilation.
#[derive(Clone, Copy, Debug)]
pub struct Env {
    /// `PassOptions::fast_math`: float-inexact rules may fire.
    pub fast_math: bool,
}

/// One rewrite rule.
pub struct Rule {
    /// Kebab-case name: egg's rule name, what reports count.
    pub name: &'static str,
    /// The kind of e-node the rule starts from.
    pub root: Kind,
    /// True for rules that only exist under fast math.
    pub fast_math: bool,
    /// The term equal to the e-node, if the rule applies to it.
    pub rewrite: RewriteFn,
}

impl Rule {
    /// A rule that exists in every mode (it checks dtypes and
    /// [`Env::fast_math`] itself where it needs to).
    const fn new(name: &'static str, root: Kind, rewrite: RewriteFn) -> Rule {
        Rule { name, root, fast_math: false, rewrite }
    }

    /// A rule that exists only under fast math.
    const fn fast_math_only(name: &'static str, root: Kind, rewrite: RewriteFn) -> Rule {
        Rule { name, root, fast_math: true, rewrite }
    }
}

/// What a rule computes: the term equal to the e-node, if it applies.
type RewriteFn = fn(Env, &SGraph, &ENode) -> Option<Term>;

/// Every rule, in the order the runner applies them.
pub static RULES: &[Rule] = &[
    // x * 1 → x (1 in either slot). Exact for every dtype: IEEE `x * 1` is
    // x for every x, -0.0 and infinities included, and NaN for NaN;
    // integers trivially; f16/bf16 compute in f32 and round back to x.
    Rule::new("mul-one", Kind::Binary(BinaryOp::Mul), mul_one),
    // x + (-0.0) → x (either slot), floats only. Exact: x + -0.0 is x for
    // every x, and -0.0 + -0.0 is -0.0. NOT x + 0.0: -0.0 + 0.0 is +0.0.
    Rule::new("add-neg-zero", Kind::Binary(BinaryOp::Add), add_neg_zero),
    // x + 0 → x (either slot), integer dtypes only: exact.
    Rule::new("add-zero-int", Kind::Binary(BinaryOp::Add), add_zero_int),
    // x - 0 → x: for floats only with +0.0 (x - +0.0 is x + -0.0, exact;
    // x - -0.0 is x + 0.0, which is not), for integers with 0.
    Rule::new("sub-zero", Kind::Binary(BinaryOp::Sub), sub_zero),
    // neg(neg(x)) → x. Exact: a float negation flips the sign bit (NaN
    // too), and wrapping negation twice is the identity (even for MIN).
    Rule::new("neg-neg", Kind::Unary(UnaryOp::Neg), neg_neg),
    // permute(permute(x, p), q) → permute(x, r) with r[i] = p[q[i]].
    // Exact: views only re-index.
    Rule::new("permute-permute", Kind::Permute, permute_permute),
    // permute(x, [0, 1, ..]) → x. Exact.
    Rule::new("permute-identity", Kind::Permute, permute_identity),
    // reshape(reshape(x, a), b) → reshape(x, b): both are row-major
    // re-readings of x's elements. Exact.
    Rule::new("reshape-reshape", Kind::Reshape, reshape_reshape),
    // reshape(x, shape of x) → x. Exact.
    Rule::new("reshape-identity", Kind::Reshape, reshape_identity),
    // expand(expand(x, a), b) → expand(x, b): if x broadcasts to a and a to
    // b, x broadcasts to b element for element. Exact.
    Rule::new("expand-expand", Kind::Expand, expand_expand),
    // expand(x, shape of x) → x. Exact.
    Rule::new("expand-identity", Kind::Expand, expand_identity),
    // cast(x, dtype of x) → x. Exact.
    Rule::new("cast-identity", Kind::Cast, cast_identity),
    // cast(cast(x: A, B), C) → cast(x, C) when A → B keeps every value of
    // A exactly (f16/bf16 → f32 → f64, u8 → i32 → i64, i32 → f64, u8 → any
    // float, bool → anything): casts are functions of the value, and the
    // inner one does not change it. With C = A this removes exact round
    // trips (f32 → f64 → f32, i32 → i64 → i32). NOT f64 → f32 → f64.
    Rule::new("cast-exact-chain", Kind::Cast, cast_exact_chain),
    // cast(cat(a, b, ..), T) → cat(cast(a, T), cast(b, T), ..): a cast is
    // a function of each element, and a cat only moves elements. Exact.
    // Narrowing casts then run before the cat, which moves fewer bytes,
    // and fuse into the kernels that produce the pieces (the padded LM
    // head's gradient: an f32 cat of [4096, 50264] then a bf16 cast).
    Rule::new("cast-of-cat", Kind::Cast, cast_of_cat),
    // x / c → x * (1/c) when c = ±2^k and 1/c is representable in the
    // dtype (floats). Exact, subnormals included: x / 2^k and x * 2^-k are
    // the correctly rounded results of the same real number (f16/bf16
    // compute it exactly in f32 and round once either way).
    Rule::new("div-pow2", Kind::Binary(BinaryOp::Div), div_pow2),
    // permute_T(matmul(a, b)) → matmul(permute_T(b), permute_T(a)), T =
    // swap the last two dims: (AB)^T = B^T A^T, the same products summed
    // over the same k. A transposed operand is a zero-copy permute view
    // that the GEMM reads with strides (matrixmultiply takes any strides;
    // a cuBLAS backend maps it to transa/transb when lowering), so there is
    // no transpose flag on matmul: this rule and the next let the cost
    // model remove transposes that would otherwise be materialized around
    // a matmul, choosing between the two forms.
    Rule::new("transpose-of-matmul", Kind::Permute, transpose_of_matmul),
    // matmul(permute_T(p), permute_T(q)) → permute_T(matmul(q, p)): the same
    // identity read the other way.
    Rule::new("matmul-of-transposes", Kind::MatMul, matmul_of_transposes),
    // (x * c1) * c2 → x * (c1 * c2) (constants in either slot). Exact for
    // integers (wrapping multiplication is associative mod 2^n); for floats
    // it reassociates, so only under fast math.
    Rule::new("mul-mul-const", Kind::Binary(BinaryOp::Mul), mul_mul_const),
    // (x + c1) + c2 → x + (c1 + c2): exact for integers (wrapping), fast
    // math for floats.
    Rule::new("add-add-const", Kind::Binary(BinaryOp::Add), add_add_const),
    // sum(expand(x), dims) → expand(reshape(x)) * n when every summed dim
    // was made by the expand (a new leading dim or a size-1 dim of x), n =
    // the product of the summed sizes. Exact for integers (n wrapping
    // copies of v sum to n*v wrapped); for floats the f64 accumulation of
    // n copies need not equal one rounded product, so only under fast math.
    Rule::new("sum-of-expand", Kind::Reduce(ReduceOp::Sum), sum_of_expand),
    // sum(x, dims) → reshape(x) + 0 when every summed dim has size 1: the
    // sum of one element is 0 + x (so -0.0 sums to +0.0, as PyTorch's
    // does), exact in every dtype; integers drop the + 0. Autodiff's
    // scatter of a `gather` sums such a dim over a whole logits tensor.
    Rule::new("sum-of-one", Kind::Reduce(ReduceOp::Sum), reduce_of_one),
    // mean(x, dims) → reshape(x) + 0 likewise: (0 + x) / 1. Exact.
    Rule::new("mean-of-one", Kind::Reduce(ReduceOp::Mean), reduce_of_one),
    // max(x, dims) and min(x, dims) → reshape(x) when every reduced dim
    // has size 1: the one element, NaN and -0.0 included. Exact.
    Rule::new("max-of-one", Kind::Reduce(ReduceOp::Max), reduce_of_one),
    Rule::new("min-of-one", Kind::Reduce(ReduceOp::Min), reduce_of_one),
    // x / c → x * (1/c) for any finite non-zero c (1/c rounded to the
    // dtype): float-inexact, fast math only.
    Rule::fast_math_only("div-const", Kind::Binary(BinaryOp::Div), div_const),
];

fn data(g: &SGraph, id: Id) -> &Data {
    &g[id].data
}

fn constant(g: &SGraph, id: Id) -> Option<Scalar> {
    g[id].data.constant.as_ref().map(|c| c.value)
}

/// The first node of `op`'s kind in the class, for matching one level down.
fn find_child(g: &SGraph, id: Id, pred: impl Fn(&OpKey) -> bool) -> Option<&ENode> {
    g[id].nodes.iter().find(|n| pred(&n.op))
}

/// A constant of `value` in the same form as the constant class `like`:
/// a `full` of its shape, or an `expand` of a `full` of the base shape.
fn const_like(g: &SGraph, like: Id, value: Scalar) -> Option<Term> {
    let d = data(g, like);
    let c = d.constant.as_ref()?;
    if c.base != d.shape && c.base.broadcasts_to(&d.shape) {
        let base = Term::full(value, c.base.clone(), d.dtype);
        return Term::op(g, Op::Expand(d.shape.clone()), vec![base]);
    }
    Some(Term::full(value, d.shape.clone(), d.dtype))
}

fn pair(node: &ENode) -> Option<(Id, Id)> {
    match node.children[..] {
        [a, b] => Some((a, b)),
        _ => None,
    }
}

fn single(node: &ENode) -> Option<Id> {
    match node.children[..] {
        [x] => Some(x),
        _ => None,
    }
}

/// The operand that is not the constant satisfying `is`, checking the
/// right slot first.
fn other_than_const(g: &SGraph, node: &ENode, is: impl Fn(Scalar) -> bool) -> Option<Term> {
    let (a, b) = pair(node)?;
    if constant(g, b).is_some_and(&is) {
        Some(Term::Class(a))
    } else if constant(g, a).is_some_and(&is) {
        Some(Term::Class(b))
    } else {
        None
    }
}

fn is_one(v: Scalar) -> bool {
    match v {
        Scalar::Float(f) => f == 1.0,
        Scalar::Int(i) => i == 1,
        Scalar::Bool(b) => b,
    }
}

fn mul_one(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    other_than_const(g, node, is_one)
}

fn add_neg_zero(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    if !node.dtype.is_float() {
        return None;
    }
    other_than_const(g, node, |v| v.hash_bits() == Scalar::Float(-0.0).hash_bits())
}

fn add_zero_int(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    if !node.dtype.is_int() {
        return None;
    }
    other_than_const(g, node, |v| v == Scalar::Int(0))
}

fn sub_zero(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let (a, b) = pair(node)?;
    let zero = if node.dtype.is_float() { Scalar::Float(0.0) } else { Scalar::Int(0) };
    (constant(g, b)?.hash_bits() == zero.hash_bits()).then_some(Term::Class(a))
}

fn neg_neg(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let inner = find_child(g, single(node)?, |op| *op == OpKey::Unary(UnaryOp::Neg))?;
    Some(Term::Class(single(inner)?))
}

fn permute_permute(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let OpKey::Permute(q) = &node.op else { return None };
    let inner = find_child(g, single(node)?, |op| matches!(op, OpKey::Permute(_)))?;
    let OpKey::Permute(p) = &inner.op else { return None };
    let perm = q.iter().map(|&i| p.get(i).copied()).collect::<Option<Vec<_>>>()?;
    Term::op(g, Op::Permute(perm), vec![Term::Class(single(inner)?)])
}

fn permute_identity(_: Env, _: &SGraph, node: &ENode) -> Option<Term> {
    let OpKey::Permute(p) = &node.op else { return None };
    let x = single(node)?;
    p.iter().enumerate().all(|(i, &d)| i == d).then_some(Term::Class(x))
}

fn reshape_reshape(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let inner = find_child(g, single(node)?, |op| matches!(op, OpKey::Reshape(_)))?;
    Term::op(g, Op::Reshape(node.shape.clone()), vec![Term::Class(single(inner)?)])
}

/// A view of `x` to its own shape is `x`.
fn same_shape(g: &SGraph, node: &ENode) -> Option<Term> {
    let x = single(node)?;
    (data(g, x).shape == node.shape).then_some(Term::Class(x))
}

fn reshape_identity(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    same_shape(g, node)
}

fn expand_expand(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let inner = find_child(g, single(node)?, |op| matches!(op, OpKey::Expand(_)))?;
    Term::op(g, Op::Expand(node.shape.clone()), vec![Term::Class(single(inner)?)])
}

fn expand_identity(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    same_shape(g, node)
}

fn cast_identity(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let x = single(node)?;
    (data(g, x).dtype == node.dtype).then_some(Term::Class(x))
}

fn cast_of_cat(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let OpKey::Cast(to) = node.op else { return None };
    let cat = find_child(g, single(node)?, |op| matches!(op, OpKey::Cat { .. }))?;
    let OpKey::Cat { dim } = cat.op else { return None };
    // A constant piece (the zeros of a padding) is the constant cast.
    let piece = |c: Id| match constant(g, c) {
        Some(v) => Some(Term::full(v, data(g, c).shape.clone(), to)),
        None => Term::op(g, Op::Cast(to), vec![Term::Class(c)]),
    };
    let pieces = cat.children.iter().map(|&c| piece(c)).collect::<Option<Vec<_>>>()?;
    Term::op(g, Op::Cat { dim }, pieces)
}

/// True when every value of `from` converts to `to` unchanged (NaN, the
/// infinities and -0.0 included), so that casting on from `to` gives what
/// casting from `from` would.
pub fn keeps_every_value(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || match from {
            Bool => true,
            // 0..=255 fits every significand (bf16's 8 bits included).
            U8 => to != Bool,
            I32 => matches!(to, I64 | F64),
            F16 | BF16 => matches!(to, F32 | F64),
            F32 => to == F64,
            F64 | I64 => false,
        }
}

fn cast_exact_chain(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let inner = find_child(g, single(node)?, |op| matches!(op, OpKey::Cast(_)))?;
    let x = single(inner)?;
    if !keeps_every_value(data(g, x).dtype, inner.dtype) {
        return None;
    }
    Term::op(g, Op::Cast(node.dtype), vec![Term::Class(x)])
}

/// `1/c` when `c` is ±2^k and `1/c` is exactly representable in `dtype`.
fn exact_reciprocal(c: Scalar, dtype: DType) -> Option<Scalar> {
    let Scalar::Float(c) = c else { return None };
    if !dtype.is_float() || !c.is_finite() || c == 0.0 {
        return None;
    }
    let bits = c.abs().to_bits();
    let (exponent, fraction) = (bits >> 52, bits & ((1 << 52) - 1));
    // A power of two: a normal with no fraction bits, or a subnormal with
    // exactly one bit set.
    let pow2 = if exponent == 0 { fraction.is_power_of_two() } else { fraction == 0 };
    if !pow2 {
        return None;
    }
    // 1/c is exact in f64 for every power of two with a normal reciprocal;
    // the dtype must hold it unchanged (no overflow, no lost bits).
    let r = 1.0 / c;
    let exact = r.is_finite() && r != 0.0 && r * c == 1.0;
    Scalar::Float(r).to_dtype_exact(dtype).filter(|v| exact && v.as_f64().is_finite())
}

fn div_pow2(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let (x, c) = pair(node)?;
    let r = exact_reciprocal(constant(g, c)?, node.dtype)?;
    Term::op(g, Op::Binary(BinaryOp::Mul), vec![Term::Class(x), const_like(g, c, r)?])
}

fn div_const(env: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let (x, c) = pair(node)?;
    let v = constant(g, c)?;
    if !env.fast_math || !node.dtype.is_float() || exact_reciprocal(v, node.dtype).is_some() {
        return None;
    }
    let r = eval::binary(BinaryOp::Div, node.dtype, Scalar::Float(1.0), v);
    if !r.as_f64().is_finite() || r.as_f64() == 0.0 {
        return None;
    }
    Term::op(g, Op::Binary(BinaryOp::Mul), vec![Term::Class(x), const_like(g, c, r)?])
}

/// Whether reassociating `op` over constants is allowed for the dtype.
fn reassociates(env: Env, dtype: DType) -> bool {
    dtype.is_int() || (env.fast_math && dtype.is_float())
}

/// `(x op c1) op c2 → x op (c1 op c2)` for a commutative, associative `op`.
fn fold_constants(op: BinaryOp, env: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    if !reassociates(env, node.dtype) {
        return None;
    }
    let (a, b) = pair(node)?;
    let (inner_class, c2_class, c2) = match (constant(g, a), constant(g, b)) {
        (None, Some(c2)) => (a, b, c2),
        (Some(c2), None) => (b, a, c2),
        _ => return None,
    };
    for inner in g[inner_class].nodes.iter().filter(|n| n.op == OpKey::Binary(op)) {
        let (p, q) = pair(inner)?;
        let (x, c1) = match (constant(g, p), constant(g, q)) {
            (None, Some(c1)) => (p, c1),
            (Some(c1), None) => (q, c1),
            _ => continue,
        };
        let c = eval::binary(op, node.dtype, c1, c2);
        return Term::op(g, Op::Binary(op), vec![Term::Class(x), const_like(g, c2_class, c)?]);
    }
    None
}

fn mul_mul_const(env: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    fold_constants(BinaryOp::Mul, env, g, node)
}

fn add_add_const(env: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    fold_constants(BinaryOp::Add, env, g, node)
}

fn sum_of_expand(env: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    // A widening sum (`into=`) is left alone: its operand has another dtype.
    let OpKey::Reduce { op: ReduceOp::Sum, dims, keepdim, into: None } = &node.op else { return None };
    if !reassociates(env, node.dtype) {
        return None;
    }
    let expand = find_child(g, single(node)?, |op| matches!(op, OpKey::Expand(_)))?;
    let x = single(expand)?;
    let (s, t) = (&data(g, x).shape, &expand.shape);
    let lead = t.rank().checked_sub(s.rank())?;
    // x's dims, aligned with t's: None for the new leading dims.
    let x_dim = |d: usize| d.checked_sub(lead).map(|i| s.dims()[i]);
    let mut count: u64 = 1;
    let mut target = Vec::new();
    for (d, &size) in t.dims().iter().enumerate() {
        if dims.contains(&d) {
            if x_dim(d).is_some_and(|n| n != 1) {
                return None;
            }
            count = count.checked_mul(size as u64)?;
            if *keepdim {
                target.push(1);
            }
        } else {
            target.push(x_dim(d).unwrap_or(1));
        }
    }
    let count = i64::try_from(count).ok()?;
    let reshaped = Term::op(g, Op::Reshape(Shape::new(target)), vec![Term::Class(x)])?;
    let spread = Term::op(g, Op::Expand(node.shape.clone()), vec![reshaped])?;
    let n = Term::full(Scalar::Int(count), node.shape.clone(), node.dtype);
    Term::op(g, Op::Binary(BinaryOp::Mul), vec![spread, n])
}

fn reduce_of_one(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let OpKey::Reduce { op, dims, .. } = &node.op else { return None };
    let x = single(node)?;
    let d = data(g, x);
    if d.dtype != node.dtype || dims.iter().any(|&i| d.shape.dims().get(i) != Some(&1)) {
        return None;
    }
    let one = Term::op(g, Op::Reshape(node.shape.clone()), vec![Term::Class(x)])?;
    match op {
        ReduceOp::Sum | ReduceOp::Mean if node.dtype.is_float() => {
            let zero = Term::full(Scalar::Float(0.0), node.shape.clone(), node.dtype);
            Term::op(g, Op::Binary(BinaryOp::Add), vec![one, zero])
        }
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => Some(one),
        _ => None,
    }
}

/// The permutation that swaps the last two of `rank` dims.
fn transpose_perm(rank: usize) -> Option<Vec<usize>> {
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank.checked_sub(1)?, rank.checked_sub(2)?);
    Some(perm)
}

fn is_transpose(op: &OpKey, rank: usize) -> bool {
    matches!(op, OpKey::Permute(p) if rank >= 2 && Some(p) == transpose_perm(rank).as_ref())
}

fn transposed(g: &SGraph, t: Term, rank: usize) -> Option<Term> {
    Term::op(g, Op::Permute(transpose_perm(rank)?), vec![t])
}

fn transpose_of_matmul(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let rank = node.shape.rank();
    if !is_transpose(&node.op, rank) {
        return None;
    }
    let mm = find_child(g, single(node)?, |op| *op == OpKey::MatMul)?;
    let (a, b) = pair(mm)?;
    let (bt, at) = (transposed(g, Term::Class(b), rank)?, transposed(g, Term::Class(a), rank)?);
    Term::op(g, Op::MatMul, vec![bt, at])
}

fn matmul_of_transposes(_: Env, g: &SGraph, node: &ENode) -> Option<Term> {
    let rank = node.shape.rank();
    let (a, b) = pair(node)?;
    let p = single(find_child(g, a, |op| is_transpose(op, rank))?)?;
    let q = single(find_child(g, b, |op| is_transpose(op, rank))?)?;
    let product = Term::op(g, Op::MatMul, vec![Term::Class(q), Term::Class(p)])?;
    transposed(g, product, rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_kebab_case() {
        for (i, r) in RULES.iter().enumerate() {
            assert!(
                r.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{}",
                r.name
            );
            assert!(RULES[..i].iter().all(|o| o.name != r.name), "{} twice", r.name);
        }
    }

    #[test]
    fn exact_reciprocals() {
        let f = |v: f64, d: DType| exact_reciprocal(Scalar::Float(v), d).map(|s| s.as_f64());
        assert_eq!(f(2.0, DType::F32), Some(0.5));
        assert_eq!(f(-0.25, DType::F32), Some(-4.0));
        assert_eq!(f(3.0, DType::F32), None);
        assert_eq!(f(0.0, DType::F32), None);
        assert_eq!(f(f64::INFINITY, DType::F32), None);
        // 2^127 → 2^-127, a subnormal f32 that is exactly representable.
        assert_eq!(f(2f64.powi(127), DType::F32), Some(2f64.powi(-127)));
        // 2^-130 is a subnormal f32, but 2^130 overflows f32.
        assert_eq!(f(2f64.powi(-130), DType::F32), None);
        assert_eq!(f(2f64.powi(-130), DType::F64), Some(2f64.powi(130)));
        // f64 subnormal 2^-1074: 2^1074 overflows.
        assert_eq!(f(f64::from_bits(1), DType::F64), None);
        assert_eq!(f(2f64.powi(-20), DType::F16), None);
        assert_eq!(f(2f64.powi(14), DType::F16), Some(2f64.powi(-14)));
        assert_eq!(exact_reciprocal(Scalar::Int(2), DType::I32), None);
    }

    #[test]
    fn value_keeping_casts() {
        use DType::*;
        assert!(keeps_every_value(F32, F64) && keeps_every_value(I32, I64) && keeps_every_value(U8, BF16));
        assert!(
            !keeps_every_value(F64, F32) && !keeps_every_value(I32, F32) && !keeps_every_value(F16, BF16)
        );
        assert!(!keeps_every_value(U8, Bool) && keeps_every_value(Bool, F16));
    }
}
