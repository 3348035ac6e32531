//! `+ - * /` and unary `-` on `Tensor` and `&Tensor`, with tensors and
//! Rust scalars on either side. Locations point at the operator in the
//! user's code.

use super::elementwise::{IntoOperand, Operand};
use super::Tensor;
use crate::ir::{BinaryOp, Element, UnaryOp};
use crate::Location;
use half::{bf16, f16};
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! tensor_ops {
    ($($trait:ident $method:ident $op:ident;)*) => {$(
        impl<R: IntoOperand> $trait<R> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                self.binary_at(rhs.into_operand(), BinaryOp::$op, false, Location::caller())
            }
        }
        impl<R: IntoOperand> $trait<R> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                self.binary_at(rhs.into_operand(), BinaryOp::$op, false, Location::caller())
            }
        }
    )*};
}

tensor_ops! {
    Add add Add;
    Sub sub Sub;
    Mul mul Mul;
    Div div Div;
}

macro_rules! scalar_lhs_ops {
    ($($scalar:ty),*) => {$(
        scalar_lhs_ops!(@one $scalar, Add add Add);
        scalar_lhs_ops!(@one $scalar, Sub sub Sub);
        scalar_lhs_ops!(@one $scalar, Mul mul Mul);
        scalar_lhs_ops!(@one $scalar, Div div Div);
    )*};
    (@one $scalar:ty, $trait:ident $method:ident $op:ident) => {
        impl $trait<Tensor> for $scalar {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                rhs.binary_at(Operand::Scalar(self.to_scalar()), BinaryOp::$op, true, Location::caller())
            }
        }
        impl $trait<&Tensor> for $scalar {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                rhs.binary_at(Operand::Scalar(self.to_scalar()), BinaryOp::$op, true, Location::caller())
            }
        }
    };
}

scalar_lhs_ops!(f32, f64, i32, i64, u8, f16, bf16);

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary_at(UnaryOp::Neg, Location::caller())
    }
}

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary_at(UnaryOp::Neg, Location::caller())
    }
}
