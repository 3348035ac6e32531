//! Reverse-mode autodiff on tensors: `backward`, `backward_with`, `detach`.
//! The gradient graph is recorded by `passes::autodiff` into `grad/...`
//! regions of the recording graph and kept in the context's gradient
//! workspaces (see `Context::zero_grad`).

use super::Tensor;
use crate::context::Gradients;
use crate::ir::Op;
use crate::{Location, Result};

impl Tensor {
    /// Records the gradient of this scalar with respect to every variable
    /// it depends on and returns them ([`Gradients`]). Nothing runs yet:
    /// the gradients are lazy tensors, computed by the next read together
    /// with the forward pass. Called again before [`crate::Context::zero_grad`],
    /// it adds to the gradients held (accumulation). A tensor with more
    /// than one element needs a seed: [`Tensor::backward_with`].
    ///
    /// A value that was already read or realized is a stored buffer, no
    /// longer the ops that made it, so no gradient flows through it: call
    /// `backward` before reading the loss (the read then computes the
    /// loss, the gradients and the updates in one plan).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let w = ctx.variable("w", ctx.tensor(&[3.0f32], [1]))?;
    /// let loss = (&w * &*w).sum_all();
    /// loss.backward()?;
    /// let g = loss.backward()?;                     // accumulates: 6 + 6
    /// assert_eq!(g.get(&w).unwrap().to_vec::<f32>()?, vec![12.0]);
    /// ctx.zero_grad();
    /// assert_eq!(loss.backward()?.get(&w).unwrap().to_vec::<f32>()?, vec![6.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn backward(&self) -> Result<Gradients> {
        let location = Location::caller();
        let (ctx, _) = self.live()?;
        ctx.clone().backward_at(self, None, location)
    }

    /// [`Tensor::backward`] of a tensor of any shape, given `seed`, the
    /// gradient of the final result with respect to this tensor (same
    /// shape and dtype): the vector of the vector-Jacobian product.
    #[track_caller]
    pub fn backward_with(&self, seed: &Tensor) -> Result<Gradients> {
        let location = Location::caller();
        let (ctx, _) = self.live()?;
        ctx.clone().backward_at(self, Some(seed), location)
    }

    /// The same value with no gradient behind it: a backward pass treats
    /// it as a constant. (For a variable: a snapshot of its current value.)
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let w = ctx.variable("w", ctx.tensor(&[3.0f32], [1]))?;
    /// let loss = (&w * &w.detach()).sum_all();     // d/dw = w, not 2w
    /// assert_eq!(loss.backward()?.get(&w).unwrap().to_vec::<f32>()?, vec![3.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn detach(&self) -> Tensor {
        let location = Location::caller();
        let out = Tensor::record(&[self], Op::Reshape(self.shape_ir()), None, location);
        out.mark_detached();
        out
    }

    /// Makes this tensor's node a stop for gradients (used for the row
    /// maximum of softmax, which cannot change the result).
    pub(crate) fn mark_detached(&self) {
        if let Ok((ctx, super::NodeRef::Node(id))) = self.live() {
            ctx.state().ws.stops.insert(id);
        }
    }
}
