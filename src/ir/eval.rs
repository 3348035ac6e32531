//! What every elementwise op computes, element by element, per dtype.
//!
//! This is the single definition of elementwise semantics: the CPU backend's
//! kernels and constant folding both call these functions, so a folded
//! constant is bit-identical to the value a kernel would have computed.
//!
//! - `f16` and `bf16` compute in `f32` and round the result once.
//! - Integers wrap (two's complement). Integer division truncates toward
//!   zero and division by zero gives 0 (it never traps). `pow` with a
//!   negative exponent gives `1/a` truncated (0 unless `a` is 1 or -1).
//! - `maximum`/`minimum` propagate NaN; on `bool` they are or/and.
//! - Comparisons with NaN are false, except `ne`.
//! - `f32` `exp` and `tanh` (and the `exp` inside `sigmoid` and `silu`) are
//!   the branch-free, vectorizable kernels of [`super::fast_math`] (within
//!   2 ulp of the `f64` result); `f64` uses std.

use super::fast_math;
use super::{BinaryOp, CompareOp, DType, Scalar, UnaryOp};
use half::{bf16, f16};

/// A float type kernels compute in (`f32` or `f64`).
pub trait Real: Copy + PartialOrd + std::ops::Neg<Output = Self> + Send + Sync + 'static {
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Applies a unary op.
    fn unary(op: UnaryOp, x: Self) -> Self;
    /// Applies a binary op.
    fn binary(op: BinaryOp, a: Self, b: Self) -> Self;
    /// Widens to f64 exactly.
    fn to_f64(self) -> f64;
    /// Rounds from f64.
    fn from_f64(v: f64) -> Self;
}

/// `√(2/π)`, the tanh GELU's scale (`UnaryOp::GeluTanh`).
pub(crate) const GELU_TANH_K: f64 = 0.797_884_560_802_865_4;
/// The tanh GELU's cubic coefficient.
pub(crate) const GELU_TANH_C: f64 = 0.044_715;

macro_rules! real {
    ($t:ty, $exp:path, $tanh:path, $erf:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn unary(op: UnaryOp, x: Self) -> Self {
                match op {
                    UnaryOp::Neg => -x,
                    UnaryOp::Abs => x.abs(),
                    UnaryOp::Exp => $exp(x),
                    UnaryOp::Log => x.ln(),
                    UnaryOp::Sqrt => x.sqrt(),
                    UnaryOp::Rsqrt => 1.0 / x.sqrt(),
                    UnaryOp::Recip => 1.0 / x,
                    UnaryOp::Sin => x.sin(),
                    UnaryOp::Cos => x.cos(),
                    UnaryOp::Tanh => $tanh(x),
                    UnaryOp::Sigmoid => 1.0 / (1.0 + $exp(-x)),
                    UnaryOp::Relu => {
                        if x < 0.0 {
                            0.0
                        } else {
                            x
                        }
                    }
                    UnaryOp::Gelu => 0.5 * x * (1.0 + $erf(x * std::f64::consts::FRAC_1_SQRT_2 as $t)),
                    UnaryOp::GeluTanh => {
                        let k = GELU_TANH_K as $t;
                        0.5 * x * (1.0 + $tanh(k * (x + GELU_TANH_C as $t * x * x * x)))
                    }
                    UnaryOp::Silu => x / (1.0 + $exp(-x)),
                }
            }
            #[inline(always)]
            fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
                match op {
                    BinaryOp::Add => a + b,
                    BinaryOp::Sub => a - b,
                    BinaryOp::Mul => a * b,
                    BinaryOp::Div => a / b,
                    BinaryOp::Pow => a.powf(b),
                    BinaryOp::Maximum => {
                        if a.is_nan() || b.is_nan() {
                            Self::NAN
                        } else if a > b {
                            a
                        } else {
                            b
                        }
                    }
                    BinaryOp::Minimum => {
                        if a.is_nan() || b.is_nan() {
                            Self::NAN
                        } else if a < b {
                            a
                        } else {
                            b
                        }
                    }
                    // PyTorch's GeluBackward (tanh) and silu_backward, term
                    // for term: a = x, b = g.
                    BinaryOp::GeluTanhGrad => {
                        let (k, c) = (GELU_TANH_K as $t, GELU_TANH_C as $t);
                        let x_sq = a * a;
                        // The forward's tanh argument, associated as
                        // `UnaryOp::GeluTanh` (and kiln.cuh) write it.
                        let t = $tanh(k * (a + c * a * a * a));
                        let left = 0.5 * a;
                        let right = 1.0 + t;
                        let left_derivative = 0.5 * right;
                        let tanh_derivative = 1.0 - t * t;
                        let inner_derivative = k * (1.0 + 3.0 * c * x_sq);
                        b * (left_derivative + left * tanh_derivative * inner_derivative)
                    }
                    BinaryOp::GeluGrad => {
                        let cdf = 0.5 * (1.0 + $erf(a * std::f64::consts::FRAC_1_SQRT_2 as $t));
                        let beta =
                            (std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2 * 0.5) as $t;
                        let pdf = beta * $exp(a * a * -0.5);
                        b * (cdf + a * pdf)
                    }
                    BinaryOp::SiluGrad => {
                        let s = 1.0 / (1.0 + $exp(-a));
                        b * s * (1.0 + a * (1.0 - s))
                    }
                }
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

real!(f32, fast_math::exp_f32, fast_math::tanh_f32, fast_math::erf_f32);
real!(f64, f64::exp, f64::tanh, libm::erf);

/// A unary op on an integer, in `i64`; the caller wraps to its dtype.
#[inline(always)]
pub fn unary_int(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Relu => x.max(0),
        // infer() rejects the float-only ops on integers.
        _ => x,
    }
}

/// A binary op on integers, in `i64`; the caller wraps to its dtype (the
/// wrapped result equals the dtype's own wrapping arithmetic).
#[inline(always)]
pub fn binary_int(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::Pow => {
            if b < 0 {
                match a {
                    1 => 1,
                    -1 => {
                        if b % 2 == 0 {
                            1
                        } else {
                            -1
                        }
                    }
                    _ => 0,
                }
            } else {
                a.wrapping_pow(b.min(u32::MAX as i64) as u32)
            }
        }
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        // infer() rejects the activation gradients on integers.
        BinaryOp::GeluTanhGrad | BinaryOp::GeluGrad | BinaryOp::SiluGrad => 0,
    }
}

/// A comparison of two values of one type.
#[inline(always)]
pub fn compare<T: PartialOrd>(op: CompareOp, a: T, b: T) -> bool {
    match op {
        CompareOp::Eq => a == b,
        CompareOp::Ne => a != b,
        CompareOp::Lt => a < b,
        CompareOp::Le => a <= b,
        CompareOp::Gt => a > b,
        CompareOp::Ge => a >= b,
    }
}

/// A unary op on a scalar of `dtype` (the value must be of that dtype).
pub fn unary(op: UnaryOp, dtype: DType, x: Scalar) -> Scalar {
    match dtype {
        DType::F64 => Scalar::Float(f64::unary(op, x.as_f64())),
        DType::F32 => Scalar::Float(f32::unary(op, x.as_f64() as f32) as f64),
        DType::F16 => Scalar::Float(f16::from_f32(f32::unary(op, x.as_f64() as f32)).to_f64()),
        DType::BF16 => Scalar::Float(bf16::from_f32(f32::unary(op, x.as_f64() as f32)).to_f64()),
        DType::Bool => x,
        _ => Scalar::Int(unary_int(op, x.as_i64())).cast(dtype),
    }
}

/// A binary op on two scalars of `dtype`.
pub fn binary(op: BinaryOp, dtype: DType, a: Scalar, b: Scalar) -> Scalar {
    match dtype {
        DType::F64 => Scalar::Float(f64::binary(op, a.as_f64(), b.as_f64())),
        DType::F32 => Scalar::Float(f32::binary(op, a.as_f64() as f32, b.as_f64() as f32) as f64),
        DType::F16 | DType::BF16 => {
            Scalar::Float(f32::binary(op, a.as_f64() as f32, b.as_f64() as f32) as f64).cast(dtype)
        }
        DType::Bool => {
            let (x, y) = (a.as_i64() != 0, b.as_i64() != 0);
            Scalar::Bool(match op {
                BinaryOp::Maximum => x | y,
                _ => x & y,
            })
        }
        _ => Scalar::Int(binary_int(op, a.as_i64(), b.as_i64())).cast(dtype),
    }
}

/// A comparison of two scalars of `dtype`.
pub fn compare_scalar(op: CompareOp, dtype: DType, a: Scalar, b: Scalar) -> bool {
    if dtype.is_float() {
        compare(op, a.as_f64(), b.as_f64())
    } else {
        compare(op, a.as_i64(), b.as_i64())
    }
}
