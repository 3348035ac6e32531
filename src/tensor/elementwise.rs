//! Elementwise ops: unary math, binary arithmetic with numpy broadcasting,
//! comparisons, `where`, `cast`.
//!
//! Mixed dtypes between tensors are an error (cast one side); a Rust
//! scalar takes the tensor's dtype: it rounds to a float dtype, and must
//! be exact for an integer one (`int_tensor * 0.5` is an error, never a
//! silent `* 0`).

use super::Tensor;
use crate::ir::{BinaryOp, CompareOp, DType, Element, Op, Scalar, Shape, UnaryOp};
use crate::{Error, Location};

/// The right-hand side of a binary op: a tensor or a Rust scalar.
#[derive(Clone, Debug)]
pub enum Operand {
    /// A tensor, broadcast against the other side.
    Tensor(Tensor),
    /// A scalar, which takes the other side's dtype.
    Scalar(Scalar),
}

/// Anything that can stand on one side of a binary op: `Tensor`,
/// `&Tensor`, or a Rust number (`f32`, `f64`, `i32`, `i64`, `u8`, `bool`,
/// `f16`, `bf16`).
pub trait IntoOperand {
    /// Converts to an [`Operand`].
    fn into_operand(self) -> Operand;
}

impl IntoOperand for Tensor {
    fn into_operand(self) -> Operand {
        Operand::Tensor(self)
    }
}

impl IntoOperand for &Tensor {
    fn into_operand(self) -> Operand {
        Operand::Tensor(self.clone())
    }
}

impl<T: Element> IntoOperand for T {
    fn into_operand(self) -> Operand {
        Operand::Scalar(self.to_scalar())
    }
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Tensor {
                    self.unary_at(UnaryOp::$op, Location::caller())
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x` (integers wrap).
    neg => Neg;
    /// `|x|` (integers wrap: `abs(i32::MIN) == i32::MIN`).
    abs => Abs;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm.
    log => Log;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// `1 / x`.
    recip => Recip;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid;
    /// `max(x, 0)`.
    relu => Relu;
    /// `x * Φ(x)` with the exact normal CDF (PyTorch's default `gelu`).
    gelu => Gelu;
    /// The tanh approximation of GELU, `0.5 x (1 + tanh(√(2/π) (x +
    /// 0.044715 x³)))`: PyTorch's `gelu(x, approximate="tanh")`, GPT-2's
    /// `gelu_new`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let y = ctx.tensor(&[-1.0f32, 0.0, 2.0], [3]).gelu_tanh();
    /// let v = y.to_vec::<f32>()?;
    /// assert!((v[0] + 0.158_808).abs() < 1e-5 && v[1] == 0.0 && (v[2] - 1.954_598).abs() < 1e-5);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    gelu_tanh => GeluTanh;
    /// `x * sigmoid(x)`.
    silu => Silu;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, rhs: impl IntoOperand) -> Tensor {
                    self.binary_at(rhs.into_operand(), BinaryOp::$op, false, Location::caller())
                }
            )*
        }
    };
}

binary_methods! {
    /// `self + rhs`, broadcasting.
    add => Add;
    /// `self - rhs`, broadcasting.
    sub => Sub;
    /// `self * rhs`, broadcasting.
    mul => Mul;
    /// `self / rhs`, broadcasting (integers truncate; `x / 0 == 0`).
    div => Div;
    /// `self ^ rhs`, broadcasting.
    pow => Pow;
    /// Elementwise maximum (NaN wins), broadcasting.
    maximum => Maximum;
    /// Elementwise minimum (NaN wins), broadcasting.
    minimum => Minimum;
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, rhs: impl IntoOperand) -> Tensor {
                    self.compare_at(rhs.into_operand(), CompareOp::$op, Location::caller())
                }
            )*
        }
    };
}

compare_methods! {
    /// `self == rhs` as a bool tensor, broadcasting.
    eq => Eq;
    /// `self != rhs` (true where either is NaN).
    ne => Ne;
    /// `self < rhs`.
    lt => Lt;
    /// `self <= rhs`.
    le => Le;
    /// `self > rhs`.
    gt => Gt;
    /// `self >= rhs`.
    ge => Ge;
}

impl Tensor {
    pub(crate) fn unary_at(&self, op: UnaryOp, location: Location) -> Tensor {
        Tensor::record(&[self], Op::Unary(op), None, location)
    }

    /// `self op rhs` (or `rhs op self` when `reversed`).
    pub(crate) fn binary_at(&self, rhs: Operand, op: BinaryOp, reversed: bool, location: Location) -> Tensor {
        let rhs = match self.operand_like(rhs, op.mnemonic(), location) {
            Ok(t) => t,
            Err(failed) => return failed,
        };
        let (a, b) = if reversed { (&rhs, self) } else { (self, &rhs) };
        match broadcast_pair(a, b, op.mnemonic(), location) {
            Ok((a, b)) => Tensor::record(&[&a, &b], Op::Binary(op), None, location),
            Err(failed) => failed,
        }
    }

    pub(crate) fn compare_at(&self, rhs: Operand, op: CompareOp, location: Location) -> Tensor {
        let rhs = match self.operand_like(rhs, op.mnemonic(), location) {
            Ok(t) => t,
            Err(failed) => return failed,
        };
        match broadcast_pair(self, &rhs, op.mnemonic(), location) {
            Ok((a, b)) => Tensor::record(&[&a, &b], Op::Compare(op), None, location),
            Err(failed) => failed,
        }
    }

    /// A tensor for `operand`: itself, or a scalar of `self`'s dtype
    /// (recorded as a one-element `full`, broadcast later).
    fn operand_like(&self, operand: Operand, op: &'static str, location: Location) -> Result<Tensor, Tensor> {
        match operand {
            Operand::Tensor(t) => Ok(t),
            Operand::Scalar(s) => self.scalar_like(s, op, location),
        }
    }

    pub(crate) fn scalar_like(
        &self,
        value: Scalar,
        op: &'static str,
        location: Location,
    ) -> Result<Tensor, Tensor> {
        let (ctx, _) = self.live().map_err(|_| self.clone())?;
        let dtype = self.dtype();
        match value.fit_to(dtype) {
            Some(v) => Ok(ctx.full_at(Shape::scalar(), v, dtype, location)),
            None => Err(Tensor::failed(Error::DType {
                op,
                message: format!(
                    "the scalar {} does not fit {dtype} (the tensor's dtype); cast the tensor first (e.g. .cast(DType::F32))",
                    value.format(DType::F64)
                ),
                location,
            })),
        }
    }

    /// `self ? on_true : on_false` elementwise; `self` must be bool. The
    /// three broadcast together; a scalar branch takes the other branch's
    /// dtype.
    #[track_caller]
    pub fn where_cond(&self, on_true: impl IntoOperand, on_false: impl IntoOperand) -> Tensor {
        self.where_at(on_true.into_operand(), on_false.into_operand(), Location::caller())
    }

    pub(crate) fn where_at(&self, on_true: Operand, on_false: Operand, location: Location) -> Tensor {
        let (t, f) = match (on_true, on_false) {
            (Operand::Tensor(t), Operand::Tensor(f)) => (t, f),
            (Operand::Tensor(t), Operand::Scalar(s)) => match t.scalar_like(s, "where", location) {
                Ok(f) => (t, f),
                Err(failed) => return failed,
            },
            (Operand::Scalar(s), Operand::Tensor(f)) => match f.scalar_like(s, "where", location) {
                Ok(t) => (t, f),
                Err(failed) => return failed,
            },
            (Operand::Scalar(_), Operand::Scalar(_)) => {
                return self.fail_shape(
                    "where",
                    "where needs at least one tensor branch to take its dtype from".into(),
                    location,
                )
            }
        };
        let shape = match broadcast_shape(&[self, &t, &f], "where", location) {
            Ok(s) => s,
            Err(failed) => return failed,
        };
        let (c, t, f) = (
            self.broadcast_at(shape.clone(), location),
            t.broadcast_at(shape.clone(), location),
            f.broadcast_at(shape, location),
        );
        Tensor::record(&[&c, &t, &f], Op::Where, None, location)
    }

    /// Converts to `dtype` (floats round to nearest; float to integer
    /// truncates toward zero and saturates, NaN gives 0; integers wrap;
    /// non-zero is `true`).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        if self.error().is_none() && self.dtype() == dtype {
            return self.clone();
        }
        Tensor::record(&[self], Op::Cast(dtype), None, Location::caller())
    }
}

/// Broadcasts two tensors to their common shape.
fn broadcast_pair(
    a: &Tensor,
    b: &Tensor,
    op: &'static str,
    location: Location,
) -> Result<(Tensor, Tensor), Tensor> {
    let shape = broadcast_shape(&[a, b], op, location)?;
    Ok((a.broadcast_at(shape.clone(), location), b.broadcast_at(shape, location)))
}

/// The numpy broadcast of several tensors' shapes, or the failed tensor.
pub(crate) fn broadcast_shape(ts: &[&Tensor], op: &'static str, location: Location) -> Result<Shape, Tensor> {
    if let Some(failed) = ts.iter().find(|t| t.error().is_some()) {
        return Err((*failed).clone());
    }
    let mut shape = ts[0].shape_ir();
    for t in &ts[1..] {
        shape = shape
            .broadcast(&t.shape_ir())
            .map_err(|message| Tensor::failed(Error::Shape { op, message, location }))?;
    }
    Ok(shape)
}
