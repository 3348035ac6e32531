//! C types of kiln dtypes, and the conversions between storage and compute
//! values that make generated kernels compute what `ir::eval` defines.
//!
//! Each dtype has a *storage* type (what memory holds: `kiln::f16`,
//! `float`, `kiln::u8`, ...) and a *compute* type (what arithmetic runs
//! in): `float` for f16, bf16 and f32, `double` for f64, `kiln::i64` for
//! every integer, `bool` for bool. A value of an f16 node is kept in float
//! but rounded to f16 after every op, as the CPU backend stores it.

use crate::ir::{DType, Scalar};

/// The C type memory holds for `d`.
pub(crate) fn storage(d: DType) -> &'static str {
    match d {
        DType::F16 => "kiln::f16",
        DType::BF16 => "kiln::bf16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::U8 => "kiln::u8",
        DType::I32 => "int",
        DType::I64 => "kiln::i64",
        DType::Bool => "bool",
    }
}

/// The C type arithmetic on `d` runs in.
pub(crate) fn compute(d: DType) -> &'static str {
    match d {
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
        DType::U8 | DType::I32 | DType::I64 => "kiln::i64",
        DType::Bool => "bool",
    }
}

/// A stored element (`e`, of storage type) as its compute value.
pub(crate) fn load(d: DType, e: &str) -> String {
    match d {
        DType::F16 | DType::BF16 => format!("kiln::to_float({e})"),
        DType::U8 | DType::I32 => format!("(kiln::i64)({e})"),
        DType::F32 | DType::F64 | DType::I64 | DType::Bool => e.to_string(),
    }
}

/// A compute value of dtype `d` as the element to store.
pub(crate) fn store(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("kiln::f16_from({v})"),
        DType::BF16 => format!("kiln::bf16_from({v})"),
        DType::U8 => format!("(kiln::u8)({v})"),
        DType::I32 => format!("(int)({v})"),
        DType::F32 | DType::F64 | DType::I64 | DType::Bool => v.to_string(),
    }
}

/// [`store`] of a compute value that `d` holds exactly (any node's value:
/// each is settled to its dtype): a bf16 is then the float's high half,
/// with no conversion (`kiln::bf16_exact`). Not for wider values (a
/// double sum, a float accumulator), which need [`store`]'s rounding.
pub(crate) fn store_exact(d: DType, v: &str) -> String {
    match d {
        DType::BF16 => format!("kiln::bf16_exact({v})"),
        _ => store(d, v),
    }
}

/// A freshly computed value of dtype `d` (in its compute type) rounded to
/// what `d` can hold: f16/bf16 round once, integers wrap, others are as is.
pub(crate) fn settle(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("kiln::rnd_f16({v})"),
        DType::BF16 => format!("kiln::rnd_bf16({v})"),
        DType::U8 => format!("(kiln::i64)(kiln::u8)({v})"),
        DType::I32 => format!("(kiln::i64)(int)({v})"),
        DType::F32 | DType::F64 | DType::I64 | DType::Bool => v.to_string(),
    }
}

/// `v` (compute value of `from`) converted to dtype `to` with cast
/// semantics: to a float through `double` (as the CPU's `from_f64`), to
/// bool as `!= 0`, float to integer truncating and saturating (NaN -> 0),
/// integer to integer wrapping. The result is a compute value of `to`.
///
/// Between the float types computed in `float` (f16, bf16, f32) the
/// detour through `double` is left out: widening a float to double is
/// exact, so rounding the float itself gives the same value, and each
/// conversion to or from a 64-bit type issues at a quarter of the rate
/// of float arithmetic (16 a cycle per multiprocessor on sm_80/sm_90).
/// A bf16 training step casts most of its elements at least once.
pub(crate) fn cast(from: DType, to: DType, v: &str) -> String {
    if from == to {
        return v.to_string();
    }
    let from_float = matches!(from, DType::F16 | DType::BF16 | DType::F32);
    match to {
        DType::Bool => format!("({v} != 0)"),
        DType::F64 => format!("(double)({v})"),
        DType::F32 if from_float => v.to_string(),
        // Exact in double, so one rounding either way; an i64 may not be.
        DType::F32 if matches!(from, DType::Bool | DType::U8 | DType::I32) => format!("(float)({v})"),
        DType::F32 => format!("(float)(double)({v})"),
        DType::F16 if from_float => format!("kiln::rnd_f16({v})"),
        DType::F16 => format!("kiln::to_float(kiln::f16_from((double)({v})))"),
        DType::BF16 if from_float => format!("kiln::rnd_bf16({v})"),
        DType::BF16 => format!("kiln::to_float(kiln::bf16_from((double)({v})))"),
        DType::U8 | DType::I32 | DType::I64 if from.is_float() => {
            let f = match to {
                DType::U8 => "kiln::f2u8",
                DType::I32 => "kiln::f2i32",
                _ => "kiln::f2i64",
            };
            format!("(kiln::i64){f}((double)({v}))")
        }
        // From an integer (or bool, 0/1): wrap.
        DType::U8 => format!("(kiln::i64)(kiln::u8)({v})"),
        DType::I32 => format!("(kiln::i64)(int)({v})"),
        DType::I64 => format!("(kiln::i64)({v})"),
    }
}

/// A constant as a compute-type literal of dtype `d` (rounded to `d` first,
/// as the CPU backend's `from_scalar`).
pub(crate) fn literal(d: DType, s: Scalar) -> String {
    match s.cast(d) {
        Scalar::Float(f) => float_literal(d, f),
        Scalar::Int(i) => int_literal(i),
        Scalar::Bool(b) => b.to_string(),
    }
}

fn int_literal(i: i64) -> String {
    if i == i64::MIN {
        "(kiln::i64)(-9223372036854775807LL - 1)".into()
    } else {
        format!("(kiln::i64){i}LL")
    }
}

/// A float literal that reads back exactly (Rust's shortest round trip).
fn float_literal(d: DType, f: f64) -> String {
    let double = d == DType::F64;
    if f.is_nan() {
        return if double { "kiln::nan_f64()".into() } else { "kiln::nan_f32()".into() };
    }
    if f.is_infinite() {
        let inf = if double { "kiln::inf_f64()" } else { "kiln::inf_f32()" };
        return if f > 0.0 { inf.into() } else { format!("(-{inf})") };
    }
    if double {
        format!("{:?}", f)
    } else {
        // f16/bf16/f32 values are exact in f32 once rounded by `cast`.
        let v = f as f32;
        let text = format!("{v:?}");
        if text.contains('e') || text.contains('.') {
            format!("{text}f")
        } else {
            format!("{text}.0f")
        }
    }
}

/// The most negative (for max) or most positive (for min) value of a
/// compute type: the identity a max or min reduction starts from.
pub(crate) fn lowest(d: DType, want_max: bool) -> String {
    match (compute(d), want_max) {
        ("float", true) => "(-kiln::inf_f32())".into(),
        ("float", false) => "kiln::inf_f32()".into(),
        ("double", true) => "(-kiln::inf_f64())".into(),
        ("double", false) => "kiln::inf_f64()".into(),
        ("bool", true) => "false".into(),
        ("bool", false) => "true".into(),
        (_, true) => "(kiln::i64)(-9223372036854775807LL - 1)".into(),
        (_, false) => "(kiln::i64)9223372036854775807LL".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_read_back_exactly() {
        assert_eq!(literal(DType::F32, Scalar::Float(0.1)), "0.1f");
        assert_eq!(literal(DType::F32, Scalar::Float(2.0)), "2.0f");
        assert_eq!(literal(DType::F64, Scalar::Float(0.1)), "0.1");
        assert_eq!(literal(DType::F32, Scalar::Float(1e30)), "1e30f");
        assert_eq!(literal(DType::F32, Scalar::Float(f64::NEG_INFINITY)), "(-kiln::inf_f32())");
        assert_eq!(literal(DType::I32, Scalar::Int(-3)), "(kiln::i64)-3LL");
        assert_eq!(literal(DType::I64, Scalar::Int(i64::MIN)), "(kiln::i64)(-9223372036854775807LL - 1)");
        assert_eq!(literal(DType::Bool, Scalar::Int(2)), "true");
        // f16 rounds the constant first: 0.1 is not an f16.
        assert_eq!(literal(DType::F16, Scalar::Float(0.1)), "0.099975586f");
    }

    #[test]
    fn casts_follow_the_cpu_rules() {
        assert_eq!(cast(DType::F32, DType::I32, "x"), "(kiln::i64)kiln::f2i32((double)(x))");
        assert_eq!(cast(DType::I64, DType::U8, "x"), "(kiln::i64)(kiln::u8)(x)");
        assert_eq!(cast(DType::I64, DType::F32, "x"), "(float)(double)(x)");
        assert_eq!(cast(DType::F32, DType::Bool, "x"), "(x != 0)");
        // Between float types, and from small integers, without the double.
        assert_eq!(cast(DType::F32, DType::BF16, "x"), "kiln::rnd_bf16(x)");
        assert_eq!(cast(DType::BF16, DType::F16, "x"), "kiln::rnd_f16(x)");
        assert_eq!(cast(DType::F16, DType::F32, "x"), "x");
        assert_eq!(cast(DType::Bool, DType::F32, "x"), "(float)(x)");
        assert_eq!(cast(DType::F64, DType::BF16, "x"), "kiln::to_float(kiln::bf16_from((double)(x)))");
        assert_eq!(cast(DType::I32, DType::BF16, "x"), "kiln::to_float(kiln::bf16_from((double)(x)))");
    }
}
