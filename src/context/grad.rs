//! Gradients: `loss.backward()` records the reverse-mode gradient graph
//! (`passes::autodiff`) on the recording graph and adds each variable's
//! gradient to its scope's gradient workspace; [`Gradients`] is what it
//! returns.
//!
//! A gradient workspace (`grad/<scope>`) holds the accumulated gradients
//! of one scope's variables. It is made the first time a backward pass
//! reaches a variable of that scope, so they are made in the order the
//! backward pass meets the scopes (the last scope of the forward pass
//! first), and they are released newest first (LIFO), as Caffe2 pops its
//! gradient workspaces: [`Context::pop_grad_workspace`] releases one and
//! says which one is next, [`Context::zero_grad`] releases all. A second
//! `backward` before that adds to the gradients held (accumulation).
//!
//! Held gradients are values like variables: a read computes the pending
//! ones along with what it reads. A training step that releases its
//! gradients after recording its updates (`zero_grad` before the read)
//! never writes them out; one that keeps them (to accumulate over several
//! batches) gets them as buffers, so the next step adds to stored values
//! instead of recomputing the earlier batches.

use super::workspace::{ScopeId, VarId};
use super::{Context, State, Variable};
use crate::ir::NodeId;
use crate::passes::{grad_region, gradients, GradRequest};
use crate::tensor::Tensor;
use crate::{Error, Location, Result};
use std::collections::BTreeMap;

/// The gradients a backward pass found, by variable. Each is the
/// accumulated gradient (what the variable's gradient workspace holds
/// after this pass), a lazy tensor like any other.
///
/// ```
/// use kiln::prelude::*;
/// let ctx = Context::cpu();
/// let w = ctx.variable("w", ctx.tensor(&[1.0f32, 2.0], [2]))?;
/// let loss = (&w * &*w).sum_all();                 // sum of w²
/// let grads = loss.backward()?;
/// assert_eq!(grads.get(&w).unwrap().to_vec::<f32>()?, vec![2.0, 4.0]);
/// assert!(grads.by_name("w").is_some());
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Gradients {
    /// `(variable, gradient)`, by the variable's full name.
    entries: Vec<(String, Variable, Tensor)>,
}

impl Gradients {
    /// The gradient of `var`, if the loss depends on it.
    pub fn get(&self, var: &Variable) -> Option<&Tensor> {
        self.entries.iter().find(|(_, v, _)| v.same(var)).map(|(_, _, g)| g)
    }

    /// The gradient of the variable with this full scoped name.
    pub fn by_name(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _, _)| n == name).map(|(_, _, g)| g)
    }

    /// `(variable, gradient)` pairs, by the variable's full name: what an
    /// optimizer walks.
    pub fn iter(&self) -> impl Iterator<Item = (&Variable, &Tensor)> {
        self.entries.iter().map(|(_, v, g)| (v, g))
    }

    /// The variables' full names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|(n, _, _)| n.as_str()).collect()
    }

    /// How many variables have a gradient.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the loss depends on no variable.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Context {
    /// Records the gradient of `loss` (seeded by `seed`, or ones for a
    /// scalar) with respect to every variable it depends on, adds each to
    /// the variable's gradient workspace, and returns them.
    pub(crate) fn backward_at(
        &self,
        loss: &Tensor,
        seed: Option<&Tensor>,
        location: Location,
    ) -> Result<Gradients> {
        let (ctx, loss_ref) = loss.live()?;
        if !ctx.same(self) {
            return Err(Error::Device {
                message: "backward of a tensor from another context".into(),
                location,
            });
        }
        let shape = loss.shape_ir();
        if !loss.dtype().is_float() {
            return Err(Error::DType {
                op: "backward",
                message: format!(
                    "backward needs a float tensor, got {}; gradients exist only for floats",
                    loss.dtype()
                ),
                location,
            });
        }
        let seed_ref = match seed {
            None if shape.numel() != 1 => {
                return Err(Error::Shape {
                    op: "backward",
                    message: format!(
                        "backward of a tensor of shape {shape} needs a seed (the gradient of the result with respect to it): call backward_with(seed) with a tensor of that shape, or reduce it to one element first (e.g. .sum_all() or .mean(...))"
                    ),
                    location,
                })
            }
            None => None,
            Some(seed) => {
                let (sctx, r) = seed.live()?;
                if !sctx.same(self) {
                    return Err(Error::Device { message: "a backward seed from another context".into(), location });
                }
                if seed.shape() != loss.shape() || seed.dtype() != loss.dtype() {
                    return Err(Error::Shape {
                        op: "backward",
                        message: format!(
                            "the seed is {}{} but the tensor is {}{}; they must match",
                            seed.dtype(),
                            seed.shape_ir(),
                            loss.dtype(),
                            shape
                        ),
                        location,
                    });
                }
                Some(r)
            }
        };
        let mut state = self.state();
        let st: &mut State = &mut state;
        let out = st.resolve(loss_ref);
        let seed = match seed_ref {
            Some(r) => st.resolve(r),
            None => {
                let loss_region = st.graph.node(out).region;
                let region = grad_region(&mut st.graph, loss_region);
                let value = crate::ir::Scalar::Int(1).cast(loss.dtype());
                st.graph
                    .add(crate::ir::Op::Full(value), &[], Some((shape.clone(), loss.dtype())), region)
                    .map_err(Error::Backend)?
            }
        };
        // Leaves in the order the backward sweep meets them (reverse topological).
        let leaves: Vec<NodeId> = st
            .graph
            .topo_order_from(&[out])
            .into_iter()
            .rev()
            .filter(|id| st.ws.leaves.contains_key(id))
            .collect();
        let found =
            gradients(&mut st.graph, &GradRequest { out, seed, leaves: &leaves, stops: &st.ws.stops })?;
        // Sum per variable (a variable read before and after an assignment
        // has two leaves), in the order the sweep met them.
        let mut order: Vec<VarId> = Vec::new();
        let mut per_var: BTreeMap<VarId, NodeId> = BTreeMap::new();
        for (leaf, g) in leaves.iter().zip(found) {
            let Some(g) = g else { continue };
            let var = st.ws.leaves[leaf];
            let total = match per_var.get(&var) {
                Some(&sum) => add_in_grad_region(st, var, sum, g)?,
                None => {
                    order.push(var);
                    g
                }
            };
            per_var.insert(var, total);
        }
        // Accumulate into the gradient workspaces.
        for &var in &order {
            let g = per_var[&var];
            let total = match st.ws.grad_of(var) {
                Some(old) => add_in_grad_region(st, var, old, g)?,
                None => g,
            };
            let scope = st.ws.var(var).scope;
            st.ws.grad_workspace(scope).grads.insert(var, total);
        }
        let held: Vec<(VarId, NodeId)> =
            order.iter().map(|&var| (var, st.ws.grad_of(var).unwrap_or(per_var[&var]))).collect();
        Ok(self.gradients_of(st, &held))
    }

    /// Handles on the given `(variable, gradient node)` pairs, by name.
    fn gradients_of(&self, state: &mut State, held: &[(VarId, NodeId)]) -> Gradients {
        let mut entries = Vec::with_capacity(held.len());
        for &(var, node) in held {
            let name = state.ws.var(var).name.clone();
            let variable = self.variable_handle(state, var);
            entries.push((name, variable, self.node_handle(state, node)));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        Gradients { entries }
    }

    fn node_handle(&self, state: &mut State, node: NodeId) -> Tensor {
        let (shape, dtype) = (state.graph.node(node).shape.clone(), state.graph.node(node).dtype);
        self.handle(state, node, shape, dtype)
    }

    /// The gradient a gradient workspace holds for `var`, if any.
    pub fn grad(&self, var: &Variable) -> Option<Tensor> {
        let mut state = self.state();
        let node = state.ws.grad_of(var.id())?;
        Some(self.node_handle(&mut state, node))
    }

    /// Every held gradient as `(variable, gradient)`, workspace by
    /// workspace (oldest first): what a loss scaler unscales.
    pub(crate) fn held_gradients(&self) -> Vec<(Variable, Tensor)> {
        let mut state = self.state();
        let held: Vec<(VarId, NodeId)> =
            state.ws.grads.iter().flat_map(|w| w.grads.iter().map(|(&v, &n)| (v, n))).collect();
        held.into_iter()
            .map(|(v, n)| (self.variable_handle(&state, v), self.node_handle(&mut state, n)))
            .collect()
    }

    /// Makes `value` the gradient held for `var` (what the optimizer's
    /// next step reads). `var` must hold a gradient, and `value` must have
    /// its shape and dtype.
    pub(crate) fn replace_grad(&self, var: &Variable, value: &Tensor, location: Location) -> Result<()> {
        let (ctx, r) = value.live()?;
        let mut state = self.state();
        let var_entry = state.ws.var(var.id()).clone();
        let fail = |message: String| Error::Workspace { op: "replace_grad", message, location };
        if !ctx.same(self) {
            return Err(fail(format!("a gradient for \"{}\" from another context", var_entry.name)));
        }
        if value.shape() != var_entry.shape.dims() || value.dtype() != var_entry.dtype {
            return Err(fail(format!(
                "variable \"{}\" is {}{} but the gradient given is {}{}",
                var_entry.name,
                var_entry.dtype,
                var_entry.shape,
                value.dtype(),
                value.shape_ir()
            )));
        }
        let node = state.resolve(r);
        for w in &mut state.ws.grads {
            if let Some(g) = w.grads.get_mut(&var.id()) {
                *g = node;
                return Ok(());
            }
        }
        Err(fail(format!("no gradient of \"{}\" is held", var_entry.name)))
    }

    /// Releases every gradient workspace, newest first: the next
    /// `backward` starts from zero. Tensors already taken from a
    /// [`Gradients`] keep their values.
    pub fn zero_grad(&self) {
        let mut state = self.state();
        while state.ws.grads.pop().is_some() {}
    }

    /// The gradient workspaces (`grad/<scope>`, `grad` for the root),
    /// oldest first; [`Context::pop_grad_workspace`] releases the last.
    pub fn grad_workspaces(&self) -> Vec<String> {
        let state = self.state();
        state.ws.grads.iter().map(|w| state.ws.grad_name(w.scope)).collect()
    }

    /// Releases the newest gradient workspace, which must be the one of
    /// the scope `scope` (its path; `""` for the root), and returns the
    /// gradients it held. Gradient workspaces are released in LIFO order.
    #[track_caller]
    pub fn pop_grad_workspace(&self, scope: &str) -> Result<Gradients> {
        let location = Location::caller();
        let mut state = self.state();
        let fail = |message: String| Error::Workspace { op: "pop_grad_workspace", message, location };
        let wanted: Option<ScopeId> = state.ws.scope_by_path(scope);
        let asked = if scope.is_empty() { "grad".to_string() } else { format!("grad/{scope}") };
        let Some(top) = state.ws.grads.last() else {
            return Err(fail(format!("cannot release {asked}: no gradient workspace is held")));
        };
        if Some(top.scope) != wanted {
            let held: Vec<String> = state.ws.grads.iter().map(|w| state.ws.grad_name(w.scope)).collect();
            let message = if held.contains(&asked) {
                format!(
                    "cannot release {asked} yet: gradient workspaces are released newest first, and {} is newer (held, oldest first: {})",
                    state.ws.grad_name(top.scope),
                    held.join(", ")
                )
            } else {
                format!("cannot release {asked}: it is not held (held, oldest first: {})", held.join(", "))
            };
            return Err(fail(message));
        }
        let Some(top) = state.ws.grads.pop() else {
            return Err(fail(format!("cannot release {asked}: no gradient workspace is held")));
        };
        let held: Vec<(VarId, NodeId)> = top.grads.into_iter().collect();
        Ok(self.gradients_of(&mut state, &held))
    }
}

/// `a + b` in the gradient region of `var`'s scope.
fn add_in_grad_region(state: &mut State, var: VarId, a: NodeId, b: NodeId) -> Result<NodeId> {
    let home = state.ws.var(var).region;
    let region = grad_region(&mut state.graph, home);
    state
        .graph
        .add(crate::ir::Op::Binary(crate::ir::BinaryOp::Add), &[a, b], None, region)
        .map_err(|m| Error::Backend(format!("accumulating a gradient: {m}")))
}
