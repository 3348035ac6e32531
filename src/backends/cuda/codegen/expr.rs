//! Elementwise ops as C expressions over compute values, with the
//! semantics of `ir::eval` (which the CPU backend and constant folding
//! share): the same formulas, the same NaN and integer rules.
//!
//! Operands are variable names (never compound expressions), so repeating
//! one costs nothing. Results are *settled* to the node's dtype (f16 and
//! bf16 round once, integers wrap), so a fused chain rounds exactly where
//! the unfused kernels store.

use super::types::{cast, compute, settle};
use crate::ir::eval::{GELU_TANH_C, GELU_TANH_K};
use crate::ir::{BinaryOp, CompareOp, DType, UnaryOp};

/// `op(x)` for a value of dtype `d`.
pub(crate) fn unary(op: UnaryOp, d: DType, x: &str) -> String {
    settle(d, &unary_unsettled(op, d, x))
}

/// [`unary`] before its result is settled to `d`.
pub(crate) fn unary_unsettled(op: UnaryOp, d: DType, x: &str) -> String {
    match compute(d) {
        // The exact GELU of a value rounded to 16 bits next: from erfc,
        // within one ulp of the exact value where the erf form cancels
        // (its negative tail; kiln.cuh says by how much).
        "float" if op == UnaryOp::Gelu && matches!(d, DType::F16 | DType::BF16) => {
            format!("kiln::gelu_erf_half({x})")
        }
        "float" => float_unary(op, x, "f", "f"),
        "double" => float_unary(op, x, "", ""),
        "bool" => x.to_string(),
        _ => match op {
            UnaryOp::Neg => format!("kiln::ineg({x})"),
            UnaryOp::Abs => format!("kiln::iabs({x})"),
            UnaryOp::Relu => format!("({x} < 0 ? (kiln::i64)0 : {x})"),
            // infer() rejects the float-only ops on integers.
            _ => x.to_string(),
        },
    }
}

/// `suffix` picks the float (`f`) or double (``) libm functions and
/// literals.
fn float_unary(op: UnaryOp, x: &str, func: &str, lit: &str) -> String {
    let one = format!("1.0{lit}");
    let frac_1_sqrt_2 = if lit == "f" { "0.70710677f" } else { "0.7071067811865476" };
    match op {
        UnaryOp::Neg => format!("(-{x})"),
        UnaryOp::Abs => format!("fabs{func}({x})"),
        UnaryOp::Exp => format!("exp{func}({x})"),
        UnaryOp::Log => format!("log{func}({x})"),
        UnaryOp::Sqrt => format!("sqrt{func}({x})"),
        UnaryOp::Rsqrt => format!("({one} / sqrt{func}({x}))"),
        UnaryOp::Recip => format!("({one} / {x})"),
        UnaryOp::Sin => format!("sin{func}({x})"),
        UnaryOp::Cos => format!("cos{func}({x})"),
        UnaryOp::Tanh => format!("tanh{func}({x})"),
        UnaryOp::Sigmoid => format!("({one} / ({one} + exp{func}(-{x})))"),
        UnaryOp::Relu => format!("({x} < 0.0{lit} ? 0.0{lit} : {x})"),
        UnaryOp::Gelu => format!("(0.5{lit} * {x} * ({one} + erf{func}({x} * {frac_1_sqrt_2})))"),
        UnaryOp::GeluTanh => {
            let (k, c) = if lit == "f" {
                (format!("{}f", GELU_TANH_K as f32), format!("{}f", GELU_TANH_C as f32))
            } else {
                (format!("{GELU_TANH_K:?}"), format!("{GELU_TANH_C:?}"))
            };
            format!("(0.5{lit} * {x} * ({one} + tanh{func}({k} * ({x} + {c} * {x} * {x} * {x}))))")
        }
        UnaryOp::Silu => format!("({x} / ({one} + exp{func}(-{x})))"),
    }
}

/// `op(a, b)` for values of dtype `d`, before the result is settled to
/// `d` (`types::settle`).
pub(crate) fn binary_unsettled(op: BinaryOp, d: DType, a: &str, b: &str) -> String {
    match compute(d) {
        "float" | "double" => {
            let func = if compute(d) == "float" { "f" } else { "" };
            match op {
                BinaryOp::Add => format!("({a} + {b})"),
                BinaryOp::Sub => format!("({a} - {b})"),
                BinaryOp::Mul => format!("({a} * {b})"),
                BinaryOp::Div => format!("({a} / {b})"),
                BinaryOp::Pow => format!("pow{func}({a}, {b})"),
                BinaryOp::Maximum => format!("kiln::fmaxn({a}, {b})"),
                BinaryOp::Minimum => format!("kiln::fminn({a}, {b})"),
                BinaryOp::GeluTanhGrad => {
                    let (k, c) = if func == "f" {
                        (format!("{}f", GELU_TANH_K as f32), format!("{}f", GELU_TANH_C as f32))
                    } else {
                        (format!("{GELU_TANH_K:?}"), format!("{GELU_TANH_C:?}"))
                    };
                    format!("kiln::gelu_tanh_grad({a}, {b}, {k}, {c})")
                }
                BinaryOp::GeluGrad => {
                    let frac = std::f64::consts::FRAC_1_SQRT_2;
                    let beta = std::f64::consts::FRAC_2_SQRT_PI * frac * 0.5;
                    if func == "f" {
                        format!("kiln::gelu_grad({a}, {b}, {}f, {}f)", frac as f32, beta as f32)
                    } else {
                        format!("kiln::gelu_grad({a}, {b}, {frac:?}, {beta:?})")
                    }
                }
                BinaryOp::SiluGrad => format!("kiln::silu_grad({a}, {b})"),
            }
        }
        "bool" => match op {
            BinaryOp::Maximum => format!("({a} || {b})"),
            _ => format!("({a} && {b})"),
        },
        _ => match op {
            BinaryOp::Add => format!("kiln::iadd({a}, {b})"),
            BinaryOp::Sub => format!("kiln::isub({a}, {b})"),
            BinaryOp::Mul => format!("kiln::imul({a}, {b})"),
            BinaryOp::Div => format!("kiln::idiv({a}, {b})"),
            BinaryOp::Pow => format!("kiln::ipow({a}, {b})"),
            BinaryOp::Maximum => format!("({a} > {b} ? {a} : {b})"),
            BinaryOp::Minimum => format!("({a} < {b} ? {a} : {b})"),
            // infer() rejects the activation gradients on integers.
            BinaryOp::GeluTanhGrad | BinaryOp::GeluGrad | BinaryOp::SiluGrad => "0".to_string(),
        },
    }
}

/// `a op b` for operands of dtype `d`: a bool.
pub(crate) fn compare(op: CompareOp, a: &str, b: &str) -> String {
    let sym = match op {
        CompareOp::Eq => "==",
        CompareOp::Ne => "!=",
        CompareOp::Lt => "<",
        CompareOp::Le => "<=",
        CompareOp::Gt => ">",
        CompareOp::Ge => ">=",
    };
    format!("({a} {sym} {b})")
}

/// `cond ? a : b`.
pub(crate) fn select(c: &str, a: &str, b: &str) -> String {
    format!("({c} ? {a} : {b})")
}

/// `x` (of dtype `from`) converted to `to`.
pub(crate) fn convert(from: DType, to: DType, x: &str) -> String {
    cast(from, to, x)
}
