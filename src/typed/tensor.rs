//! The typed handle: `Tensor<S, E>` is a [`crate::Tensor`] plus its shape
//! as a value of type `S` and its element type `E`; creation on a
//! [`Context`], checked conversion from and to untyped tensors, reads and
//! gradients.
//!
//! The handle adds nothing to the graph: every method records exactly
//! what the untyped method it calls records.

use super::shape::Shape;
use crate::{Context, Element, Error, Gradients, Location, Result};
use std::fmt;
use std::marker::PhantomData;

/// A tensor whose shape `S` (a tuple of [`super::Const`] and `usize` dims)
/// and element type `E` are part of its type. A cheap handle, like
/// [`crate::Tensor`], which it wraps.
///
/// ```
/// use kiln::typed::*;
/// let ctx = Context::cpu().with_seed(0);
/// let batch = 4; // known when the program runs
/// let x: Tensor<(usize, Const<3>)> = ctx.randn_typed((batch, Const));
/// let w: Tensor<Rank2<3, 2>> = ctx.randn_typed(Default::default());
/// let y = x.matmul(&w).relu(); // (usize, Const<2>)
/// assert_eq!(y.dims(), vec![4, 2]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct Tensor<S: Shape, E: Element = f32> {
    shape: S,
    inner: crate::Tensor,
    element: PhantomData<fn() -> E>,
}

impl<S: Shape, E: Element> Clone for Tensor<S, E> {
    fn clone(&self) -> Self {
        Tensor { shape: self.shape, inner: self.inner.clone(), element: PhantomData }
    }
}

impl<S: Shape, E: Element> fmt::Debug for Tensor<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "typed::Tensor<{}, {}>({:?})", S::type_text(), E::DTYPE, self.inner)
    }
}

impl<S: Shape, E: Element> Tensor<S, E> {
    /// Wraps `inner`, whose shape the caller's type rule computed as
    /// `shape`. When an untyped op could still fail at run time (two
    /// `usize` dims that differ), `inner` carries that error and `shape`
    /// is what the types promised.
    pub(crate) fn wrap(inner: crate::Tensor, shape: S) -> Self {
        Tensor { shape, inner, element: PhantomData }
    }

    /// The untyped tensor `t` as a typed one, after checking its dims fit
    /// `S` (its rank, and every `Const` dim's size) and its dtype is `E`'s.
    /// A tensor that carries an error returns that error.
    ///
    /// ```
    /// use kiln::typed::*;
    /// let ctx = Context::cpu();
    /// let t = ctx.zeros([8, 3]);
    /// let x = Tensor::<(usize, Const<3>)>::from_untyped(t.clone())?;
    /// assert_eq!(x.shape().0, 8);
    /// assert!(Tensor::<Rank2<8, 4>>::from_untyped(t).is_err());
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn from_untyped(t: crate::Tensor) -> Result<Self> {
        let location = Location::caller();
        if let Some(e) = t.error() {
            return Err(e.clone());
        }
        if t.dtype() != E::DTYPE {
            return Err(Error::DType {
                op: "typed::Tensor::from_untyped",
                message: format!(
                    "the tensor holds {} but the type says {}; .cast(DType::{:?}) it first",
                    t.dtype(),
                    E::DTYPE,
                    E::DTYPE
                ),
                location,
            });
        }
        match S::from_dims(t.shape()) {
            Some(shape) => Ok(Tensor::wrap(t, shape)),
            None => Err(Error::Shape {
                op: "typed::Tensor::from_untyped",
                message: format!(
                    "a tensor of shape {:?} does not fit the type {}",
                    t.shape(),
                    S::type_text()
                ),
                location,
            }),
        }
    }

    /// The untyped handle (no copy: the same recorded value).
    pub fn untyped(&self) -> &crate::Tensor {
        &self.inner
    }

    /// The untyped handle, by value.
    pub fn into_untyped(self) -> crate::Tensor {
        self.inner
    }

    /// The shape as a value of its type (`x.shape().0` is the batch size
    /// of a `(usize, Const<784>)` tensor).
    pub fn shape(&self) -> &S {
        &self.shape
    }

    /// The sizes of the dims, outermost first.
    pub fn dims(&self) -> Vec<usize> {
        self.shape.dims()
    }

    /// The error, if an op that made this tensor failed (only possible
    /// where dims are `usize`, or dtypes do not fit an op).
    pub fn error(&self) -> Option<&Error> {
        self.inner.error()
    }

    /// The context it was recorded on (`None` for a failed tensor).
    pub fn context(&self) -> Option<&Context> {
        self.inner.context()
    }

    /// Computes the tensor and copies it to the host, row-major.
    #[track_caller]
    pub fn to_vec(&self) -> Result<Vec<E>> {
        self.inner.to_vec::<E>()
    }

    /// Computes the tensor now and keeps the value.
    pub fn realize(&self) -> Result<&Self> {
        self.inner.realize()?;
        Ok(self)
    }

    /// Converts to element type `E2` (`cast` of the untyped tensor).
    #[track_caller]
    pub fn cast<E2: Element>(&self) -> Tensor<S, E2> {
        Tensor::wrap(self.inner.cast(E2::DTYPE), self.shape)
    }

    /// The same value without a gradient path.
    pub fn detach(&self) -> Self {
        Tensor::wrap(self.inner.detach(), self.shape)
    }

    /// Records the backward pass of this tensor (see
    /// [`crate::Tensor::backward`]).
    #[track_caller]
    pub fn backward(&self) -> Result<Gradients> {
        self.inner.backward()
    }
}

impl<E: Element> Tensor<(), E> {
    /// The value of a scalar tensor.
    #[track_caller]
    pub fn item(&self) -> Result<E> {
        self.inner.item::<E>()
    }
}

impl<S: Shape, E: Element> From<Tensor<S, E>> for crate::Tensor {
    fn from(t: Tensor<S, E>) -> crate::Tensor {
        t.inner
    }
}

impl<S: Shape, E: Element> AsRef<crate::Tensor> for Tensor<S, E> {
    fn as_ref(&self) -> &crate::Tensor {
        &self.inner
    }
}

/// Typed creation: the shape is a value of the shape type, so runtime
/// dims are given where they are known (`(batch, Const::<784>)`) and a
/// shape of `Const` dims is `Default::default()` (or `(Const, Const)`).
impl Context {
    /// `f32` zeros.
    #[track_caller]
    pub fn zeros_typed<S: Shape>(&self, shape: S) -> Tensor<S> {
        Tensor::wrap(self.zeros(shape.dims()), shape)
    }

    /// `f32` ones.
    #[track_caller]
    pub fn ones_typed<S: Shape>(&self, shape: S) -> Tensor<S> {
        Tensor::wrap(self.ones(shape.dims()), shape)
    }

    /// `f32` numbers uniform on `[0, 1)`.
    #[track_caller]
    pub fn rand_typed<S: Shape>(&self, shape: S) -> Tensor<S> {
        Tensor::wrap(self.rand(shape.dims()), shape)
    }

    /// `f32` standard normal numbers.
    #[track_caller]
    pub fn randn_typed<S: Shape>(&self, shape: S) -> Tensor<S> {
        Tensor::wrap(self.randn(shape.dims()), shape)
    }

    /// A tensor holding `data` (row-major); `data.len()` must be the
    /// shape's element count (a runtime check, as for [`Context::tensor`]).
    #[track_caller]
    pub fn tensor_typed<S: Shape, E: Element>(&self, data: &[E], shape: S) -> Tensor<S, E> {
        Tensor::wrap(self.tensor(data, shape.dims()), shape)
    }

    /// A runtime scalar (see [`Context::scalar`]).
    #[track_caller]
    pub fn scalar_typed<E: Element>(&self, value: E) -> Tensor<(), E> {
        Tensor::wrap(self.scalar(value), ())
    }
}
