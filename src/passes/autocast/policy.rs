//! The autocast policy: which precision each op runs in, as named data.
//!
//! Each [`PolicyEntry`] names a group of ops, the [`Precision`] they run
//! in and, in its comment, why. An op no entry names *follows* its
//! operands. The table is what `KILN_DUMP` prints at the head of the
//! autocast dump ([`policy_text`]), so a dump says which rule made each
//! cast.
//!
//! The composites the user API records as primitives are covered through
//! those primitives: softmax and log-softmax are max, exp, sum, log and
//! elementwise ops, layer norm is two means, an rsqrt and elementwise ops,
//! the losses are means and sums of elementwise ops. Their reductions and
//! transcendental functions are `f32` entries, and the elementwise ops
//! between them follow those `f32` operands, so the composites stay `f32`
//! from their input on (a low-precision input is widened once, where the
//! first reduction reads it). An optimizer's update stays `f32` by the
//! pass's output rule: a value that reaches a graph output (an assignment
//! is one) through elementwise ops only is computed in its recorded type.

use crate::ir::{BinaryOp, DType, Op, ReduceOp, UnaryOp};

/// The precision an op runs in under autocast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// The low type (`bf16` or `f16`): the op's float operands are cast to
    /// it and so is its result. Backends accumulate products of low types
    /// in `f32` (cuBLAS and cuDNN with an f32 compute type; the CPU widens
    /// to f32 and rounds the result once).
    Low,
    /// The type the op was recorded in (`f32`): low operands are widened.
    Recorded,
    /// The widest type among the operands that decide (see
    /// [`super::Autocast`]); operands that do not decide are cast to it.
    Follow,
}

impl Precision {
    fn word(self) -> &'static str {
        match self {
            Precision::Low => "low",
            Precision::Recorded => "f32",
            Precision::Follow => "follow",
        }
    }
}

/// An op a policy entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKey {
    /// `matmul`.
    MatMul,
    /// `conv2d`.
    Conv2d,
    /// `attention` (its two products; softmax inside the kernel is f32).
    Attention,
    /// A reduction (`sum`, `mean`, `max`, `min`).
    Reduce(ReduceOp),
    /// A unary elementwise function.
    Unary(UnaryOp),
    /// A binary elementwise function.
    Binary(BinaryOp),
    /// `gather`.
    Gather,
}

impl OpKey {
    fn matches(self, op: &Op) -> bool {
        match (self, op) {
            (OpKey::MatMul, Op::MatMul)
            | (OpKey::Conv2d, Op::Conv2d { .. })
            | (
                OpKey::Attention,
                Op::Attention { .. }
                | Op::AttentionStats { .. }
                | Op::AttentionDelta
                | Op::AttentionGrad { .. },
            ) => true,
            (OpKey::Reduce(a), Op::Reduce { op: b, .. }) => a == *b,
            (OpKey::Unary(a), Op::Unary(b)) => a == *b,
            (OpKey::Binary(a), Op::Binary(b)) => a == *b,
            (OpKey::Gather, Op::Gather { .. }) => true,
            _ => false,
        }
    }

    fn mnemonic(self) -> &'static str {
        match self {
            OpKey::MatMul => "matmul",
            OpKey::Conv2d => "conv2d",
            OpKey::Attention => "attention",
            OpKey::Reduce(r) => r.mnemonic(),
            OpKey::Unary(u) => u.mnemonic(),
            OpKey::Binary(b) => b.mnemonic(),
            OpKey::Gather => "gather",
        }
    }
}

/// One rule of the policy: a named group of ops and their precision.
#[derive(Debug)]
pub struct PolicyEntry {
    /// Kebab-case name, as the dump prints it.
    pub name: &'static str,
    /// The precision.
    pub precision: Precision,
    /// The ops it covers.
    pub ops: &'static [OpKey],
}

/// The policy, in the order the dump prints it. Ops no entry names follow
/// their operands ([`Precision::Follow`]).
pub static POLICY: &[PolicyEntry] = &[
    // Products: tensor cores run bf16/f16 GEMMs and convolutions at about
    // 15x the f32 rate and half the bytes; every backend accumulates them
    // in f32 and rounds once, so the error is one rounding of the inputs
    // and one of the result (PyTorch's autocast "lower" list). Attention is
    // two products around a softmax that every backend keeps in f32 inside
    // the one kernel (online max and sum in f32), as PyTorch's autocast
    // runs scaled_dot_product_attention in the low type.
    PolicyEntry {
        name: "products",
        precision: Precision::Low,
        ops: &[OpKey::MatMul, OpKey::Conv2d, OpKey::Attention],
    },
    // Reductions: a sum of n low-precision terms rounded to 8 mantissa bits
    // loses every term below 2^-8 of the total (a bias gradient over a
    // batch, a mean). max and min are exact in any type, but softmax's max
    // feeds `x - max`, which must be exact before exp: they widen too, so
    // softmax, log-softmax and layer norm widen their input once.
    PolicyEntry {
        name: "reductions",
        precision: Precision::Recorded,
        ops: &[
            OpKey::Reduce(ReduceOp::Sum),
            OpKey::Reduce(ReduceOp::Mean),
            OpKey::Reduce(ReduceOp::Max),
            OpKey::Reduce(ReduceOp::Min),
        ],
    },
    // Transcendentals with range or conditioning problems: exp overflows
    // f16 above 11.09, and exp/log/pow turn an input error of one low ulp
    // into a relative error of |x| ulps (softmax, log-softmax, losses,
    // Adam's bias correction).
    PolicyEntry {
        name: "transcendentals",
        precision: Precision::Recorded,
        ops: &[OpKey::Unary(UnaryOp::Exp), OpKey::Unary(UnaryOp::Log), OpKey::Binary(BinaryOp::Pow)],
    },
    // Normalizers: layer norm's rsqrt(var + eps), Adam's sqrt(v): a
    // variance of small gradients underflows f16, and the reciprocal
    // amplifies relative error.
    PolicyEntry {
        name: "normalizers",
        precision: Precision::Recorded,
        ops: &[OpKey::Unary(UnaryOp::Rsqrt), OpKey::Unary(UnaryOp::Sqrt), OpKey::Unary(UnaryOp::Recip)],
    },
    // Picks for a loss: gather is exact in any type, but a cross-entropy
    // gathers its target logits next to a log-sum-exp that widens them
    // (reductions and exp, above). Gathering the widened logits too keeps
    // one f32 copy, which the GEMM's epilogue writes; gathering the low
    // GEMM output instead needed it kept and a widening kernel of its own
    // (GPT-2 small: 0.4 ms and 412 MB a step).
    PolicyEntry { name: "picks", precision: Precision::Recorded, ops: &[OpKey::Gather] },
];

/// The precision `op` runs in, and the name of the entry that says so
/// (`None` for ops that follow by default).
pub fn precision_of(op: &Op) -> (Precision, Option<&'static str>) {
    for entry in POLICY {
        if entry.ops.iter().any(|k| k.matches(op)) {
            return (entry.precision, Some(entry.name));
        }
    }
    (Precision::Follow, None)
}

/// Whether operand `slot` of `op` keeps its recorded type whatever
/// precision the op runs in: the f32 row statistics of an attention's
/// gradient (a log-sum-exp near 10 in bf16 is off by 0.03, so every
/// probability would be off by 3%).
pub fn operand_keeps_type(op: &Op, slot: usize) -> bool {
    matches!(op, Op::AttentionGrad { .. }) && slot == 4
}

/// The policy as one line for `low`, as the autocast dump's header prints
/// it: `autocast bf16: products=low(matmul conv2d attention) reductions=f32(...) ...
/// else=follow; outputs keep their dtype`.
pub fn policy_text(low: DType) -> String {
    let mut s = format!("autocast {low}:");
    for e in POLICY {
        let ops: Vec<&str> = e.ops.iter().map(|k| k.mnemonic()).collect();
        let word = if e.precision == Precision::Low { low.name() } else { e.precision.word() };
        s.push_str(&format!(" {}={}({})", e.name, word, ops.join(" ")));
    }
    s.push_str(
        " else=follow(widest operand that decides; broadcast leaves and constants do not decide); \
         values reaching an output through elementwise ops only stay f32; outputs keep their dtype",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_one_precision() {
        // No op is named by two entries: the table order never matters.
        let mut seen: Vec<OpKey> = Vec::new();
        for e in POLICY {
            for k in e.ops {
                assert!(!seen.contains(k), "{} names {} twice", e.name, k.mnemonic());
                seen.push(*k);
            }
        }
        assert_eq!(precision_of(&Op::MatMul), (Precision::Low, Some("products")));
        assert_eq!(precision_of(&Op::Unary(UnaryOp::Relu)), (Precision::Follow, None));
        let sum = Op::Reduce { op: ReduceOp::Sum, dims: vec![0], keepdim: false, into: None };
        assert_eq!(precision_of(&sum).0, Precision::Recorded);
        let argmax = Op::Reduce { op: ReduceOp::ArgMax, dims: vec![0], keepdim: false, into: None };
        assert_eq!(precision_of(&argmax).0, Precision::Follow);
    }

    #[test]
    fn the_text_names_every_entry() {
        let t = policy_text(DType::BF16);
        assert!(t.starts_with(
            "autocast bf16: products=bf16(matmul conv2d attention) reductions=f32(sum mean max min)"
        ));
        for e in POLICY {
            assert!(t.contains(e.name));
        }
        assert!(!t.contains('\n'));
    }
}
