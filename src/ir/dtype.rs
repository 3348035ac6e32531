//! Element types, typed scalars and typed host data.
//!
//! A [`DType`] names how one element is stored. A [`Scalar`] is one value of
//! some dtype, kept in a wide carrier (`f64` for floats, `i64` for integers)
//! that holds every value of its dtype exactly. [`HostData`] is a typed host
//! vector: what users hand in and read out.

use half::{bf16, f16};
use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16: f32's exponent, 8 bits of mantissa.
    BF16,
    /// IEEE single precision; the default dtype.
    F32,
    /// IEEE double precision.
    F64,
    /// Unsigned byte.
    U8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer; the dtype of indices (`argmax`, `gather`).
    I64,
    /// Boolean, the result of comparisons.
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 8] =
        [DType::F16, DType::BF16, DType::F32, DType::F64, DType::U8, DType::I32, DType::I64, DType::Bool];

    /// The short name used in the text IR (`f32`, `bf16`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses a name printed by [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the four floating-point dtypes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True for `u8`, `i32` and `i64`.
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::I64)
    }

    /// True for dtypes with arithmetic (everything but `bool`).
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One value of some dtype. Floats are carried as `f64`, integers as `i64`;
/// a `Scalar` stored in a node always holds a value its node's dtype can
/// represent exactly (see [`Scalar::to_dtype_exact`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A floating-point value.
    Float(f64),
    /// An integer value.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl Scalar {
    /// The value as `f64` (booleans are 0 and 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Float(v) => v,
            Scalar::Int(v) => v as f64,
            Scalar::Bool(b) => b as u8 as f64,
        }
    }

    /// The value as `i64`, truncating floats toward zero (saturating).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::Float(v) => v as i64,
            Scalar::Int(v) => v,
            Scalar::Bool(b) => b as i64,
        }
    }

    /// Converts to `dtype` with the rounding of a cast (floats round to
    /// nearest, integers wrap, anything non-zero is `true`).
    pub fn cast(self, dtype: DType) -> Scalar {
        match dtype {
            DType::F64 => Scalar::Float(self.as_f64()),
            DType::F32 => Scalar::Float(self.as_f64() as f32 as f64),
            DType::F16 => Scalar::Float(f16::from_f64(self.as_f64()).to_f64()),
            DType::BF16 => Scalar::Float(bf16::from_f64(self.as_f64()).to_f64()),
            DType::I64 => Scalar::Int(self.as_i64()),
            DType::I32 => Scalar::Int(self.as_i64() as i32 as i64),
            DType::U8 => Scalar::Int(self.as_i64() as u8 as i64),
            DType::Bool => Scalar::Bool(match self {
                Scalar::Float(v) => v != 0.0,
                Scalar::Int(v) => v != 0,
                Scalar::Bool(b) => b,
            }),
        }
    }

    /// Converts to `dtype` only if the value survives unchanged; this is how
    /// Rust scalars in `x * 0.5` take the tensor's dtype without silently
    /// truncating `0.5` to an integer 0.
    pub fn to_dtype_exact(self, dtype: DType) -> Option<Scalar> {
        let converted = self.cast(dtype);
        let same = match (self, converted) {
            (Scalar::Float(a), Scalar::Float(b)) => a == b || (a.is_nan() && b.is_nan()),
            (Scalar::Float(a), Scalar::Int(b)) => a == b as f64,
            (Scalar::Int(a), Scalar::Float(b)) => a as f64 == b && b.abs() < 9.007_199_254_740_992e15,
            (Scalar::Int(a), Scalar::Int(b)) => a == b,
            (Scalar::Bool(a), Scalar::Bool(b)) => a == b,
            (Scalar::Int(a), Scalar::Bool(b)) => (a == 0 || a == 1) && (a == 1) == b,
            (Scalar::Float(a), Scalar::Bool(b)) => (a == 0.0 || a == 1.0) && (a == 1.0) == b,
            (Scalar::Bool(a), Scalar::Int(b)) => a as i64 == b,
            (Scalar::Bool(a), Scalar::Float(b)) => a as u8 as f64 == b,
        };
        same.then_some(converted)
    }

    /// Converts a user's Rust scalar to `dtype` the way `x * 0.05` means
    /// it: floats round to the nearest value of a float dtype (0.05 has no
    /// exact binary form in any of them), but a value that would change
    /// otherwise is refused: a fraction or out-of-range number for an
    /// integer dtype (`int_tensor * 0.5` must not silently become `* 0`), or
    /// a finite number that overflows to infinity (`1e6` as f16).
    pub fn fit_to(self, dtype: DType) -> Option<Scalar> {
        if dtype.is_float() && !matches!(self, Scalar::Bool(_)) {
            let converted = self.cast(dtype);
            let overflowed = self.as_f64().is_finite() && !converted.as_f64().is_finite();
            return (!overflowed).then_some(converted);
        }
        self.to_dtype_exact(dtype)
    }

    /// Bits that identify the value, for structural hashing (`-0.0` and
    /// `0.0` differ; every NaN payload is its own value).
    pub fn hash_bits(self) -> (u8, u64) {
        match self {
            Scalar::Float(v) => (0, v.to_bits()),
            Scalar::Int(v) => (1, v as u64),
            Scalar::Bool(b) => (2, b as u64),
        }
    }

    /// Prints the value as the text IR writes it for a node of `dtype`:
    /// the shortest text that parses back to the same value in that dtype.
    pub fn format(self, dtype: DType) -> String {
        match (self, dtype) {
            (Scalar::Float(v), DType::F32) => fmt_float(v as f32),
            (Scalar::Float(v), DType::F16) => fmt_float(f16::from_f64(v).to_f32()),
            (Scalar::Float(v), DType::BF16) => fmt_float(bf16::from_f64(v).to_f32()),
            (Scalar::Float(v), _) => fmt_float(v),
            (Scalar::Int(v), _) => v.to_string(),
            (Scalar::Bool(b), _) => b.to_string(),
        }
    }

    /// Parses text written by [`Scalar::format`] for a node of `dtype`.
    pub fn parse(text: &str, dtype: DType) -> Option<Scalar> {
        let value = if dtype.is_float() {
            let v = match text {
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                "nan" => f64::NAN,
                _ => text.parse::<f64>().ok()?,
            };
            Scalar::Float(v).cast(dtype)
        } else if dtype == DType::Bool {
            Scalar::Bool(text.parse::<bool>().ok()?)
        } else {
            Scalar::Int(text.parse::<i64>().ok()?).to_dtype_exact(dtype)?
        };
        Some(value)
    }
}

fn fmt_float<T: Into<f64> + fmt::Display + Copy>(v: T) -> String {
    let wide: f64 = v.into();
    if wide.is_nan() {
        "nan".into()
    } else if wide.is_infinite() {
        if wide > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else {
        // Display is Rust's shortest round-trip form for the type.
        format!("{v}")
    }
}

/// A typed, row-major host vector: what users pass to `ctx.tensor` and get
/// back from `to_vec`.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// `f16` elements.
    F16(Vec<f16>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `bool` elements.
    Bool(Vec<bool>),
}

impl HostData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::U8(_) => DType::U8,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::F32(v) => v.len(),
            HostData::F64(v) => v.len(),
            HostData::U8(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::I64(v) => v.len(),
            HostData::Bool(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Scalar`] (`None` past the end).
    pub fn get(&self, i: usize) -> Option<Scalar> {
        Some(match self {
            HostData::F16(v) => Scalar::Float(v.get(i)?.to_f64()),
            HostData::BF16(v) => Scalar::Float(v.get(i)?.to_f64()),
            HostData::F32(v) => Scalar::Float(*v.get(i)? as f64),
            HostData::F64(v) => Scalar::Float(*v.get(i)?),
            HostData::U8(v) => Scalar::Int(*v.get(i)? as i64),
            HostData::I32(v) => Scalar::Int(*v.get(i)? as i64),
            HostData::I64(v) => Scalar::Int(*v.get(i)?),
            HostData::Bool(v) => Scalar::Bool(*v.get(i)?),
        })
    }

    /// Every element widened to `f64` (booleans are 0 and 1); what tests
    /// compare against their f64 references.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.len()).filter_map(|i| self.get(i)).map(Scalar::as_f64).collect()
    }
}

/// A Rust type that is the element type of some [`DType`].
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// Wraps a vector of this type.
    fn into_host(v: Vec<Self>) -> HostData;
    /// Unwraps a vector of this type (`None` for another dtype).
    fn from_host(h: HostData) -> Option<Vec<Self>>;
    /// The value as a [`Scalar`].
    fn to_scalar(self) -> Scalar;
}

macro_rules! element {
    ($t:ty, $dt:ident, $variant:ident, $to:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$dt;
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$variant(v)
            }
            fn from_host(h: HostData) -> Option<Vec<Self>> {
                match h {
                    HostData::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn to_scalar(self) -> Scalar {
                let f: fn($t) -> Scalar = $to;
                f(self)
            }
        }
    };
}

element!(f16, F16, F16, |x| Scalar::Float(x.to_f64()));
element!(bf16, BF16, BF16, |x| Scalar::Float(x.to_f64()));
element!(f32, F32, F32, |x| Scalar::Float(x as f64));
element!(f64, F64, F64, Scalar::Float);
element!(u8, U8, U8, |x| Scalar::Int(x as i64));
element!(i32, I32, I32, |x| Scalar::Int(x as i64));
element!(i64, I64, I64, Scalar::Int);
element!(bool, Bool, Bool, Scalar::Bool);
