//! The test's element types and what the reference needs to know of them:
//! unit roundoff, ranges, rounding and wrapping.

/// An element type, the test's own (the reference must not lean on kiln's
/// types for its semantics; the runner maps it onto `kiln::DType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dt {
    F16,
    Bf16,
    F32,
    F64,
    U8,
    I32,
    I64,
    Bool,
}

impl Dt {
    pub const ALL: [Dt; 8] = [Dt::F16, Dt::Bf16, Dt::F32, Dt::F64, Dt::U8, Dt::I32, Dt::I64, Dt::Bool];

    pub fn is_float(self) -> bool {
        matches!(self, Dt::F16 | Dt::Bf16 | Dt::F32 | Dt::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(self, Dt::U8 | Dt::I32 | Dt::I64)
    }

    /// Unit roundoff: the largest relative error of rounding a real number
    /// (in range) to this type, half an ulp at 1.
    pub fn unit(self) -> f64 {
        match self {
            Dt::F16 => 2f64.powi(-11),
            Dt::Bf16 => 2f64.powi(-8),
            Dt::F32 => 2f64.powi(-24),
            Dt::F64 => 2f64.powi(-53),
            _ => 0.0,
        }
    }

    /// Unit roundoff of the type a kernel may compute and accumulate in:
    /// f32 for f16, bf16 and f32 (kiln widens halves to f32; a GPU
    /// accumulates in f32), f64 for f64.
    pub fn work_unit(self) -> f64 {
        match self {
            Dt::F64 => 2f64.powi(-53),
            _ => 2f64.powi(-24),
        }
    }

    /// The spacing of the subnormals: the absolute error of a result that
    /// underflows.
    pub fn tiny(self) -> f64 {
        match self {
            Dt::F16 => 2f64.powi(-24),
            // f32's exponent range with 7 fraction bits: 2^-126 * 2^-7
            // (2^-149 here made the bound of a bf16 result that rounds to
            // 0 from about 3e-44 too tight: long-run seed 51267, f64).
            Dt::Bf16 => 2f64.powi(-133),
            Dt::F32 => 2f64.powi(-149),
            Dt::F64 => f64::from_bits(1),
            _ => 0.0,
        }
    }

    /// The largest finite value.
    pub fn max_finite(self) -> f64 {
        match self {
            Dt::F16 => 65504.0,
            Dt::Bf16 => 3.389_531_389_251_535_5e38,
            Dt::F32 => f32::MAX as f64,
            Dt::F64 => f64::MAX,
            Dt::U8 => 255.0,
            Dt::I32 => i32::MAX as f64,
            Dt::I64 => i64::MAX as f64,
            Dt::Bool => 1.0,
        }
    }

    /// The smallest value (integers and bool).
    pub fn min_value(self) -> f64 {
        match self {
            Dt::U8 | Dt::Bool => 0.0,
            Dt::I32 => i32::MIN as f64,
            Dt::I64 => i64::MIN as f64,
            _ => -self.max_finite(),
        }
    }

    /// `v` rounded to this type (the nearest value; integers truncate and
    /// saturate, as a cast does; bool is `v != 0`).
    pub fn round(self, v: f64) -> f64 {
        match self {
            Dt::F16 => half::f16::from_f64(v).to_f64(),
            Dt::Bf16 => half::bf16::from_f64(v).to_f64(),
            Dt::F32 => v as f32 as f64,
            Dt::F64 => v,
            Dt::U8 => v as u8 as f64,
            Dt::I32 => v as i32 as f64,
            Dt::I64 => v as i64 as f64,
            Dt::Bool => (v != 0.0) as u8 as f64,
        }
    }

    /// An integer `v` wrapped to this type (two's complement).
    pub fn wrap(self, v: f64) -> f64 {
        let i = v as i128;
        match self {
            Dt::U8 => i as u8 as f64,
            Dt::I32 => i as i32 as f64,
            Dt::I64 => i as i64 as f64,
            Dt::Bool => (i != 0) as u8 as f64,
            _ => v,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dt::F16 => "f16",
            Dt::Bf16 => "bf16",
            Dt::F32 => "f32",
            Dt::F64 => "f64",
            Dt::U8 => "u8",
            Dt::I32 => "i32",
            Dt::I64 => "i64",
            Dt::Bool => "bool",
        }
    }
}
