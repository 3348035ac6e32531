//! `Tensor`: a cheap handle to a recorded value, and the user-facing ops.
//!
//! Ops record nodes and return at once; nothing runs until a value is read
//! (`to_vec`, `item`, `realize`). An op given tensors it cannot accept
//! (shapes that do not broadcast, mixed dtypes) does not panic: it returns
//! a *failed* tensor carrying the error and the caller's location, every
//! op on a failed tensor returns the same failure, and reading it returns
//! the error.
//!
//! Ops are grouped by kind: [`creation`](Context::zeros), views, elementwise,
//! reductions, linear algebra and convolution, indexing.

mod creation;
mod dim;
mod display;
mod elementwise;
mod grad;
mod index;
mod linalg;
mod mask;
mod operators;
mod reduce;
mod split;
mod view;
mod write;

pub use dim::IntoDim;
pub use elementwise::{IntoOperand, Operand};
pub use write::Offset;

use crate::context::{Context, VarId};
use crate::ir::{DType, Element, NodeId, Op, Shape};
use crate::{Error, Location, Result};
use std::fmt;
use std::sync::Arc;

/// A handle to a value recorded on a [`Context`]. Cloning is cheap; every
/// clone names the same value.
///
/// ```
/// use kiln::prelude::*;
/// let ctx = Context::cpu();
/// let a = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
/// let b = (&a + 1.0).relu().sum(&[1], false);
/// assert_eq!(b.to_vec::<f32>()?, vec![5.0, 9.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    Node(Arc<TensorNode>),
    /// A variable: every op and read sees its value at that point in the
    /// program (the value after every earlier `assign`).
    Var(Arc<VarRef>),
    Failed(Arc<Error>),
}

/// A handle on a variable of a context (what a `Variable` derefs to).
pub(crate) struct VarRef {
    pub(crate) ctx: Context,
    pub(crate) id: VarId,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
}

/// An operand as a live tensor names it: a node, or a variable whose
/// current node the context looks up when it records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NodeRef {
    Node(NodeId),
    Var(VarId),
}

/// What a live handle points at. The context keeps a weak reference to
/// each, to know which nodes users can still read.
pub(crate) struct TensorNode {
    pub(crate) ctx: Context,
    pub(crate) id: NodeId,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
}

impl Tensor {
    pub(crate) fn from_node(node: Arc<TensorNode>) -> Tensor {
        Tensor { repr: Repr::Node(node) }
    }

    pub(crate) fn failed(error: Error) -> Tensor {
        Tensor { repr: Repr::Failed(Arc::new(error)) }
    }

    pub(crate) fn from_var(var: VarRef) -> Tensor {
        Tensor { repr: Repr::Var(Arc::new(var)) }
    }

    /// The shape. A failed tensor (see [`Tensor::error`]) has shape `[]`.
    pub fn shape(&self) -> &[usize] {
        match &self.repr {
            Repr::Node(n) => n.shape.dims(),
            Repr::Var(v) => v.shape.dims(),
            Repr::Failed(_) => &[],
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// The element type. A failed tensor reports `f32`.
    pub fn dtype(&self) -> DType {
        match &self.repr {
            Repr::Node(n) => n.dtype,
            Repr::Var(v) => v.dtype,
            Repr::Failed(_) => DType::F32,
        }
    }

    /// The error, if an op that made this tensor (or one it depends on)
    /// was given invalid operands.
    pub fn error(&self) -> Option<&Error> {
        match &self.repr {
            Repr::Node(_) | Repr::Var(_) => None,
            Repr::Failed(e) => Some(e),
        }
    }

    /// The context the tensor was recorded on (`None` for a failed tensor).
    pub fn context(&self) -> Option<&Context> {
        match &self.repr {
            Repr::Node(n) => Some(&n.ctx),
            Repr::Var(v) => Some(&v.ctx),
            Repr::Failed(_) => None,
        }
    }

    /// The context and the operand reference, or the tensor's error.
    pub(crate) fn live(&self) -> Result<(&Context, NodeRef)> {
        match &self.repr {
            Repr::Node(n) => Ok((&n.ctx, NodeRef::Node(n.id))),
            Repr::Var(v) => Ok((&v.ctx, NodeRef::Var(v.id))),
            Repr::Failed(e) => Err((**e).clone()),
        }
    }

    /// The node the tensor reads now (a variable's current value).
    pub(crate) fn current_node(&self) -> Result<NodeId> {
        let (ctx, r) = self.live()?;
        Ok(ctx.state().resolve(r))
    }

    /// The node id, checking the tensor belongs to `ctx`; `location` is
    /// the user's call that asked.
    pub(crate) fn node_in(&self, ctx: &Context, location: Location) -> Result<NodeId> {
        let (own, _) = self.live()?;
        if !own.same(ctx) {
            return Err(Error::Device {
                message: format!(
                    "the tensor belongs to {}, not {}; copy it with `.to(&ctx)`",
                    own.label(),
                    ctx.label()
                ),
                location,
            });
        }
        self.current_node()
    }

    pub(crate) fn shape_ir(&self) -> Shape {
        Shape::new(self.shape())
    }

    /// Records `op` over `operands` (the first is `self`'s context). Any
    /// failed operand's error passes through; operands from two contexts
    /// are a device error.
    pub(crate) fn record(
        operands: &[&Tensor],
        op: Op,
        declared: Option<(Shape, DType)>,
        location: Location,
    ) -> Tensor {
        let mut nodes = Vec::with_capacity(operands.len());
        let mut ctx: Option<&Context> = None;
        for t in operands {
            match t.live() {
                Err(_) => return (*t).clone(),
                Ok((own, node)) => {
                    if let Some(c) = ctx {
                        if !c.same(own) {
                            return Tensor::failed(Error::Device {
                                message: format!(
                                    "{} of tensors from two different contexts, {} and {}; copy one with `.to(&ctx)`",
                                    op.mnemonic(),
                                    c.label(),
                                    own.label()
                                ),
                                location,
                            });
                        }
                    }
                    ctx = Some(own);
                    nodes.push(node);
                }
            }
        }
        match ctx {
            Some(ctx) => ctx.record(op, &nodes, declared, location),
            None => Tensor::failed(Error::Backend(format!("{} recorded with no operands", op.mnemonic()))),
        }
    }

    /// Computes the tensor and copies it to the host. `T` must be the
    /// tensor's element type (`f32` for `DType::F32`); use `cast` first to
    /// read another type.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.read("to_vec", Location::caller())
    }

    /// Realizes and downloads; `op` names the user's call in errors.
    #[track_caller]
    fn read<T: Element>(&self, op: &'static str, location: Location) -> Result<Vec<T>> {
        let (ctx, _) = self.live()?;
        self.check_read_dtype::<T>(op, location)?;
        let buffer = ctx.realize_nodes(&[self.current_node()?])?.remove(0);
        let host = ctx.inner.backend.download(&buffer)?;
        T::from_host(host).ok_or_else(|| Error::Backend("the backend returned another dtype".into()))
    }

    /// An error unless the tensor holds `T`s.
    pub(crate) fn check_read_dtype<T: Element>(&self, op: &'static str, location: Location) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType {
                op,
                message: format!(
                    "the tensor holds {} but {} was asked for; read it as its own type or .cast(DType::{:?}) first",
                    self.dtype(),
                    T::DTYPE,
                    T::DTYPE
                ),
                location,
            });
        }
        Ok(())
    }

    /// The value of a one-element tensor.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let location = Location::caller();
        if self.error().is_none() && self.numel() != 1 {
            return Err(Error::Shape {
                op: "item",
                message: format!("item needs a tensor with one element, got shape {}", self.shape_ir()),
                location,
            });
        }
        let v = self.read::<T>("item", location)?;
        v.into_iter().next().ok_or_else(|| Error::Backend("no element came back".into()))
    }

    /// Computes the tensor now and keeps the value: later reads and ops
    /// start from it instead of recomputing it.
    #[track_caller]
    pub fn realize(&self) -> Result<&Tensor> {
        let (ctx, _) = self.live()?;
        ctx.realize_nodes(&[self.current_node()?])?;
        Ok(self)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Node(n) => write!(f, "Tensor({}{}, {})", n.dtype, n.shape, n.id),
            Repr::Var(v) => write!(f, "Tensor({}{}, variable {})", v.dtype, v.shape, v.id.0),
            Repr::Failed(e) => write!(f, "Tensor(failed: {e})"),
        }
    }
}
