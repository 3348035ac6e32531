//! Variables: persistent, named, mutable tensors, and runtime scalars.
//!
//! The design is functional, so that it is the same on every backend: a
//! variable is a buffer the context holds by name; a plan reads it as an
//! `input`, and an assignment is one more output of the next plan, whose
//! buffer becomes the variable's value after the run. `v.assign(x)`
//! records; the next read (of anything) runs every pending assignment in
//! the same plan as what it reads, so a training step's forward pass,
//! backward pass and updates compile and run as one graph. Ops see a
//! variable's value at the point they are recorded: a tensor computed
//! before an assignment keeps the old value, one computed after sees the
//! new one (program order). A `write_at` into a variable, and an
//! assignment whose value is computed elementwise from the old one (an
//! optimizer update, an EMA: `assign`, see `passes/assign.rs`), is written
//! over the variable's own buffer when nothing else can read the old value
//! (buffer donation, `donate.rs`); nothing in the graph depends on that.

use super::workspace::{check_name, VarEntry, VarId};
use super::{scope::where_, Context, State};
use crate::ir::{Element, NodeId, Op, RegionId, Shape};
use crate::tensor::{IntoOperand, Operand, Tensor, VarRef};
use crate::{Error, Location, Result};
use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

/// A persistent, named, mutable tensor of a context's workspace. It derefs
/// to a [`Tensor`] that always reads the variable's latest value, so every
/// tensor op takes it (`x.matmul(&w)`, `&w * 2.0`).
///
/// ```
/// use kiln::prelude::*;
/// let ctx = Context::cpu();
/// let w = ctx.variable("w", ctx.ones([3]))?;
/// let before = &w * 1.0;          // sees the value now
/// w.assign(&w + 1.0)?;            // recorded; runs with the next read
/// assert_eq!(w.to_vec::<f32>()?, vec![2.0, 2.0, 2.0]);
/// assert_eq!(before.to_vec::<f32>()?, vec![1.0, 1.0, 1.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone)]
pub struct Variable {
    /// A variable tensor (it reads the latest value when used).
    tensor: Tensor,
    ctx: Context,
    id: VarId,
}

impl Deref for Variable {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.tensor
    }
}

impl Borrow<Tensor> for Variable {
    fn borrow(&self) -> &Tensor {
        &self.tensor
    }
}

impl AsRef<Tensor> for Variable {
    fn as_ref(&self) -> &Tensor {
        &self.tensor
    }
}

impl fmt::Debug for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Variable({} {}{})", self.name(), self.dtype(), self.tensor.shape_ir())
    }
}

impl Variable {
    /// True if both handles name the same variable of the same context.
    /// (Not `PartialEq`: `v.eq(x)` must stay the elementwise comparison
    /// that `Deref` to `Tensor` gives.)
    pub fn same(&self, other: &Variable) -> bool {
        self.ctx.same(&other.ctx) && self.id == other.id
    }

    pub(crate) fn id(&self) -> VarId {
        self.id
    }

    pub(crate) fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The full scoped name (`encoder/layer1/w`), which is also its name in
    /// a safetensors checkpoint.
    pub fn name(&self) -> String {
        self.ctx().state().ws.var(self.id()).name.clone()
    }

    /// The variable as a plain [`Tensor`] handle (it keeps reading the
    /// latest value; use [`Tensor::detach`] for a snapshot).
    pub fn tensor(&self) -> Tensor {
        self.tensor.clone()
    }

    /// Records `value` as the variable's new value: every op recorded
    /// afterwards sees it, and the next read computes it (in the same plan
    /// as that read). `value` must have the variable's shape and dtype.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let step = ctx.variable("step", ctx.zeros_dtype([], DType::I64))?;
    /// for _ in 0..3 {
    ///     step.assign(&step + 1)?;
    /// }
    /// assert_eq!(step.item::<i64>()?, 3);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn assign(&self, value: impl Borrow<Tensor>) -> Result<()> {
        self.assign_at(value.borrow(), Location::caller())
    }

    fn assign_at(&self, value: &Tensor, location: Location) -> Result<()> {
        let (ctx, r) = value.live()?;
        if !ctx.same(self.ctx()) {
            return Err(Error::Device {
                message: format!(
                    "assign of a tensor on {} to a variable on {}; copy it with `.to(&ctx)`",
                    ctx.label(),
                    self.ctx().label()
                ),
                location,
            });
        }
        let mut state = self.ctx().state();
        let var = state.ws.var(self.id()).clone();
        if value.shape() != var.shape.dims() {
            return Err(Error::Shape {
                op: "assign",
                message: format!(
                    "variable \"{}\" has shape {} but the value has {} (broadcast_to it first)",
                    var.name,
                    var.shape,
                    value.shape_ir()
                ),
                location,
            });
        }
        if value.dtype() != var.dtype {
            return Err(Error::DType {
                op: "assign",
                message: format!(
                    "variable \"{}\" holds {} but the value is {}; cast it first (e.g. .cast(DType::{:?}))",
                    var.name,
                    var.dtype,
                    value.dtype(),
                    var.dtype
                ),
                location,
            });
        }
        let source = state.resolve(r);
        // Over a realized value that the new one is computed from (an
        // update), the new one is an `assign`, which a run may compute into
        // the old value's bytes (see `passes/assign.rs`). A value that does
        // not read the old one does not bind it, so a failed old value
        // stays unread.
        let old = state.ws.value(self.id());
        let update = matches!(state.graph.node(old).op, Op::Buffer(_))
            && old != source
            && reads_within(&state.graph, source, old, UPDATE_DEPTH);
        let node = if update {
            state
                .graph
                .add(Op::Assign, &[old, source], None, var.region)
                .map_err(|m| Error::Backend(format!("recording an assignment: {m}")))?
        } else {
            fresh_value(&mut state, source, &var.shape, var.region)?
        };
        state.ws.set_value(self.id(), node);
        Ok(())
    }
}

impl Variable {
    /// Writes `value` over the window at `offset` along `dim` of the
    /// variable (see [`Tensor::write_at`]): recorded like
    /// [`Variable::assign`], and run with the next read.
    ///
    /// The offset may be a host number (checked now, uploaded as a
    /// runtime value) or a 0-d integer tensor such as a captured step's
    /// argument: either way every offset runs the same plan. When nothing
    /// else can read the old value any more, the run writes the window into
    /// the variable's own buffer and copies nothing (see
    /// `context/donate.rs`); a tensor that read the old value (a
    /// `detach`ed snapshot, an op recorded before the write) keeps it,
    /// and the run then writes over a copy. A KV cache:
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let keys = ctx.variable("keys", ctx.zeros([1, 4, 2]))?; // [batch, positions, dim]
    /// for pos in 0..3 {
    ///     let k = ctx.full([1, 1, 2], (pos + 1) as f32);
    ///     keys.write_at(1, pos, &k)?;
    /// }
    /// assert_eq!(keys.to_vec::<f32>()?, vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 0.0, 0.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn write_at(
        &self,
        dim: impl crate::IntoDim,
        offset: impl Into<crate::Offset>,
        value: &Tensor,
    ) -> Result<()> {
        let location = Location::caller();
        let written = self.tensor.write_at(dim, offset, value);
        if let Some(e) = written.error() {
            return Err(e.clone());
        }
        self.assign_at(&written, location)
    }
}

/// How many operand steps below a new value [`reads_within`] looks for
/// the old one: an optimizer's update reads it within two (`p - lr * g`,
/// `b * 0.9 + g`, `p * (1 - lr * wd) - ...`), and a bounded look costs the
/// recording of an assignment nothing next to a walk of the whole step.
const UPDATE_DEPTH: usize = 3;

/// Whether `value` reads `old` within `depth` operand steps.
fn reads_within(graph: &crate::ir::Graph, value: NodeId, old: NodeId, depth: usize) -> bool {
    let mut level = vec![value];
    for _ in 0..depth {
        let mut next = Vec::new();
        for n in level {
            for o in graph.operands(n) {
                if o == old {
                    return true;
                }
                next.push(o);
            }
        }
        level = next;
    }
    false
}

/// An identity node reading `source` in `region`: a variable's new value,
/// distinct from every node the user holds, so that it alone is the
/// variable's gradient leaf (view folding removes it from plans).
pub(crate) fn fresh_value(
    state: &mut State,
    source: NodeId,
    shape: &Shape,
    region: RegionId,
) -> Result<NodeId> {
    state
        .graph
        .add(Op::Reshape(shape.clone()), &[source], None, region)
        .map_err(|m| Error::Backend(format!("recording a variable's value: {m}")))
}

impl Context {
    /// The variable `name` of the current scope: made with the value
    /// `init` the first time, and the same variable on every later call
    /// (then `init` is not computed; it must still have the variable's
    /// shape and dtype). A name bound into the scope
    /// ([`Context::scope_with`]) returns the bound variable.
    #[track_caller]
    pub fn variable(&self, name: &str, init: impl Borrow<Tensor>) -> Result<Variable> {
        let location = Location::caller();
        let init = init.borrow();
        let fail = |message: String| Error::Workspace { op: "variable", message, location };
        check_name("variable", name).map_err(fail)?;
        let (ctx, r) = init.live()?;
        if !ctx.same(self) {
            return Err(Error::Device {
                message: "a variable's initial value from another context; make it on this one".into(),
                location,
            });
        }
        let (shape, dtype) = (init.shape_ir(), init.dtype());
        let mut state = self.state();
        let scope = state.ws.current();
        if let Some(id) = state.ws.lookup(name) {
            let v = state.ws.var(id);
            if v.shape != shape || v.dtype != dtype {
                return Err(fail(format!(
                    "variable \"{}\" exists as {}{}; it cannot be made again as {dtype}{shape} (another shape or dtype needs another name)",
                    v.name, v.dtype, v.shape
                )));
            }
            return Ok(self.variable_handle(&state, id));
        }
        let path = state.ws.scope(scope).path.clone();
        if state.ws.scope(scope).children.contains_key(name) {
            return Err(fail(format!(
                "\"{name}\" is already a scope in {}, so it cannot also name a variable there",
                where_(&path)
            )));
        }
        let full = if path.is_empty() { name.to_string() } else { format!("{path}/{name}") };
        let region = state.ws.scope(scope).region;
        let source = state.resolve(r);
        let value = fresh_value(&mut state, source, &shape, region)?;
        let id = VarId(state.ws.vars.len() as u32);
        state.ws.vars.push(VarEntry { name: full, scope, shape, dtype, region, value });
        state.ws.leaves.insert(value, id);
        state.ws.scope_mut(scope).vars.insert(name.to_string(), id);
        Ok(self.variable_handle(&state, id))
    }

    /// The existing variable `name` as the current scope sees it (its own,
    /// bound into it, or `child/.../name` in a scope below it).
    #[track_caller]
    pub fn get_variable(&self, name: &str) -> Result<Variable> {
        let location = Location::caller();
        let state = self.state();
        match state.ws.lookup_path(name) {
            Some(id) => Ok(self.variable_handle(&state, id)),
            None => Err(Error::Workspace {
                op: "get_variable",
                message: format!(
                    "{} has no variable \"{name}\" (names resolve in the scope and what is bound into it, not in parent scopes; bind it with scope_with)",
                    where_(&state.ws.scope(state.ws.current()).path)
                ),
                location,
            }),
        }
    }

    /// Every variable of the current scope and the scopes below it, by
    /// full name: what an optimizer updates.
    pub fn variables(&self) -> Vec<Variable> {
        let state = self.state();
        let ids = state.ws.subtree_vars(state.ws.current());
        ids.into_iter().map(|id| self.variable_handle(&state, id)).collect()
    }

    /// Every variable of the context, each with its current value node
    /// and a handle on that value (a snapshot: later assignments do not
    /// change what the handle reads).
    pub(crate) fn variable_snapshot(&self) -> Vec<(Variable, NodeId, Tensor)> {
        let mut state = self.state();
        (0..state.ws.vars.len() as u32)
            .map(|i| {
                let id = VarId(i);
                let v = state.ws.var(id).clone();
                let value = self.handle(&mut state, v.value, v.shape.clone(), v.dtype);
                (self.variable_handle(&state, id), v.value, value)
            })
            .collect()
    }

    /// The node a variable's value is now.
    pub(crate) fn value_node(&self, var: &Variable) -> NodeId {
        self.state().ws.value(var.id())
    }

    pub(crate) fn variable_handle(&self, state: &State, id: VarId) -> Variable {
        let v = state.ws.var(id);
        let var = VarRef { ctx: self.clone(), id, shape: v.shape.clone(), dtype: v.dtype };
        Variable { tensor: Tensor::from_var(var), ctx: self.clone(), id }
    }

    /// A runtime scalar: a 0-d tensor of `T`'s dtype whose value is data,
    /// not part of the compiled graph. A value that changes every step (a
    /// learning rate, a schedule, a step count) must be one of these or a
    /// variable: a Rust number in an op (`g * 0.01`) is a constant of the
    /// graph, so each new value compiles a new plan.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let g = ctx.ones([4]);
    /// for step in 0..5 {
    ///     let lr = ctx.scalar(0.1f32 / (1.0 + step as f32));
    ///     (&g * &lr).to_vec::<f32>()?;
    /// }
    /// assert_eq!(ctx.stats().compiles, 1);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn scalar<T: Element>(&self, value: T) -> Tensor {
        self.tensor(&[value], Shape::scalar())
    }
}

impl IntoOperand for &Variable {
    fn into_operand(self) -> Operand {
        Operand::Tensor(self.tensor.clone())
    }
}

impl IntoOperand for Variable {
    fn into_operand(self) -> Operand {
        Operand::Tensor(self.tensor)
    }
}

macro_rules! variable_ops {
    ($($trait:ident $method:ident;)*) => {$(
        impl<R: IntoOperand> std::ops::$trait<R> for &Variable {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                std::ops::$trait::$method(&self.tensor, rhs)
            }
        }
        impl<R: IntoOperand> std::ops::$trait<R> for Variable {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: R) -> Tensor {
                std::ops::$trait::$method(&self.tensor, rhs)
            }
        }
    )*};
}

variable_ops! {
    Add add;
    Sub sub;
    Mul mul;
    Div div;
}

impl std::ops::Neg for &Variable {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        -&self.tensor
    }
}
