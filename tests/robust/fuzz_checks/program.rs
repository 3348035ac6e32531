//! The api fuzzer's grammar: a [`Program`] of public-API [`Step`]s that
//! `arbitrary` decodes from the fuzzer's bytes, with the awkward values
//! (empty, huge and `usize::MAX` dims; NaN, infinities and -0 scalars)
//! spelled out so the fuzzer finds them often.

use arbitrary::Arbitrary;
use kiln::DType;

/// A recorded sequence of public-API calls.
#[derive(Arbitrary, Debug)]
pub struct Program {
    pub(super) seed: u8,
    pub(super) fast_math: bool,
    pub(super) streams: u8,
    pub(super) passes: Passes,
    pub(super) steps: Vec<Step>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Passes {
    Default,
    NoFusion,
    NoSimplify,
    NoMemory,
    NoViewFoldNoConstantFold,
    Unoptimized,
    Unknown,
}

impl Passes {
    pub(super) fn toggles(self) -> &'static str {
        match self {
            Passes::Default => "",
            Passes::NoFusion => "-fusion",
            Passes::NoSimplify => "-simplify",
            Passes::NoMemory => "-memory",
            Passes::NoViewFoldNoConstantFold => "-view-fold,-constant-fold",
            Passes::Unoptimized => "-view-fold,-constant-fold,-cse,-simplify,-dce,-fusion",
            Passes::Unknown => "-no-such-pass",
        }
    }
}

/// A dimension, an index or a count: mostly small (three of the nine
/// variants, as `arbitrary` picks variants evenly), sometimes empty, huge
/// or `usize::MAX`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Dim {
    Small(u8),
    Small2(u8),
    Small3(u8),
    Zero,
    One,
    Byte(u8),
    Pow2(u8),
    Huge(u64),
    Max,
}

impl Dim {
    pub(super) fn get(self) -> usize {
        match self {
            Dim::Small(x) | Dim::Small2(x) | Dim::Small3(x) => (x % 6) as usize,
            Dim::Zero => 0,
            Dim::One => 1,
            Dim::Byte(x) => x as usize,
            Dim::Pow2(x) => 1usize << (x % 64),
            Dim::Huge(x) => x as usize,
            Dim::Max => usize::MAX,
        }
    }
}

pub(super) fn dims(ds: &[Dim]) -> Vec<usize> {
    ds.iter().take(6).map(|d| d.get()).collect()
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Dt {
    F16,
    BF16,
    F32,
    F64,
    U8,
    I32,
    I64,
    Bool,
}

impl Dt {
    pub(super) fn get(self) -> DType {
        match self {
            Dt::F16 => DType::F16,
            Dt::BF16 => DType::BF16,
            Dt::F32 => DType::F32,
            Dt::F64 => DType::F64,
            Dt::U8 => DType::U8,
            Dt::I32 => DType::I32,
            Dt::I64 => DType::I64,
            Dt::Bool => DType::Bool,
        }
    }
}

/// A Rust scalar of any element type, with the awkward values spelled out
/// so the fuzzer finds them often.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Sc {
    F32(f32),
    F64(f64),
    I32(i32),
    I64(i64),
    U8(u8),
    Bool(bool),
    F16(u16),
    BF16(u16),
    Small(i8),
    Nan,
    Inf,
    NegInf,
    NegZero,
    Huge,
    I64Min,
}

/// Calls `$body` with `$v` bound to the scalar as its own Rust type.
macro_rules! with_scalar {
    ($sc:expr, $v:ident => $body:expr) => {
        match $sc {
            Sc::F32(x) => {
                let $v = x;
                $body
            }
            Sc::F64(x) => {
                let $v = x;
                $body
            }
            Sc::I32(x) => {
                let $v = x;
                $body
            }
            Sc::I64(x) => {
                let $v = x;
                $body
            }
            Sc::U8(x) => {
                let $v = x;
                $body
            }
            Sc::Bool(x) => {
                let $v = x;
                $body
            }
            Sc::F16(x) => {
                let $v = f16::from_bits(x);
                $body
            }
            Sc::BF16(x) => {
                let $v = bf16::from_bits(x);
                $body
            }
            Sc::Small(x) => {
                let $v = x as f32;
                $body
            }
            Sc::Nan => {
                let $v = f32::NAN;
                $body
            }
            Sc::Inf => {
                let $v = f64::INFINITY;
                $body
            }
            Sc::NegInf => {
                let $v = f32::NEG_INFINITY;
                $body
            }
            Sc::NegZero => {
                let $v = -0.0f32;
                $body
            }
            Sc::Huge => {
                let $v = 1e300f64;
                $body
            }
            Sc::I64Min => {
                let $v = i64::MIN;
                $body
            }
        }
    };
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Unary {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    Silu,
    Detach,
    Flatten,
    T,
    SumAll,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
}

/// What a read asks for: the tensor's own element type, or a fixed one
/// (an error when it differs).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum ReadAs {
    Own,
    Item,
    F32,
    I64,
    Bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub(super) enum Name {
    W,
    B,
    Grad,
    Empty,
    Slash,
    Dots,
    Space,
}

impl Name {
    pub(super) fn get(self) -> &'static str {
        match self {
            Name::W => "w",
            Name::B => "b",
            Name::Grad => "grad",
            Name::Empty => "",
            Name::Slash => "a/b",
            Name::Dots => "..",
            Name::Space => " w ",
        }
    }
}

/// One public-API call; tensor operands are indices into the tensors made
/// so far (taken modulo their count).
#[derive(Arbitrary, Debug)]
pub(super) enum Step {
    Zeros(Vec<Dim>, Dt),
    Ones(Vec<Dim>, Dt),
    Full(Vec<Dim>, Sc, Dt),
    Rand(Vec<Dim>, Dt),
    Randn(Vec<Dim>, Dt),
    Arange(Sc, Sc, Sc),
    FromVec(Vec<Dim>, Dt),
    Scalar(Sc),
    Unary(u8, Unary),
    Binary(u8, u8, Binary),
    BinaryScalar(u8, Sc, Binary),
    ScalarLhs(Sc, u8, Binary),
    Where(u8, u8, u8),
    WhereScalar(u8, u8, Sc, bool),
    Cast(u8, Dt),
    Reduce(u8, Reduce, Vec<Dim>, bool),
    Argmax(u8, Dim, bool),
    Softmax(u8, Dim, bool),
    LayerNorm(u8, u8, u8, f64),
    Reshape(u8, Vec<Dim>),
    Permute(u8, Vec<Dim>),
    Transpose(u8, Dim, Dim),
    BroadcastTo(u8, Vec<Dim>),
    Narrow(u8, Dim, Dim, Dim),
    Slice(u8, Dim, Dim, Dim, Dim),
    Squeeze(u8, Dim),
    Unsqueeze(u8, Dim),
    Cat(Vec<u8>, Dim, bool),
    Gather(u8, Dim, u8),
    IndexSelect(u8, Dim, u8),
    MatMul(u8, u8),
    Conv2d(u8, u8, Dim, Dim, Dim, Dim),
    Pool(u8, bool, Dim, Dim, Dim),
    Variable(Name, u8),
    Assign(u8, u8),
    Backward(u8),
    PushScope(Name),
    PopScope(Name),
    Read(u8, ReadAs),
    Realize(Vec<u8>),
    Explain(Vec<u8>),
    Drop(u8),
    ZeroGrad,
}
