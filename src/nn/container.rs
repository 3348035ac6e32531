//! Modules made of modules: `Sequential` (a chain, with a scope of its
//! own) and `Residual` (`x + f(x)`).

use super::{Module, Params};
use crate::{Context, Result, Tensor, Variable};

/// Modules applied one after the other, inside the scope `name` (PyTorch's
/// `nn.Sequential`; name the children `"0"`, `"1"`, ... as PyTorch does
/// and the checkpoint names match a PyTorch state dict).
pub struct Sequential {
    ctx: Context,
    name: String,
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// Builds the children with `build`, run inside the scope `name`, so
    /// their parameters are named `name/<child>/...`.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::nn::{Linear, Module, Params, Sequential, Tanh};
    /// let ctx = Context::cpu();
    /// let net = Sequential::new(&ctx, "net", |ctx| {
    ///     Ok(vec![Linear::new(ctx, "0", 2, 2)?.boxed(), Tanh.boxed()])
    /// })?;
    /// assert_eq!(net.len(), 2);
    /// assert_eq!(net.parameters()[0].name(), "net/0/weight");
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn new(
        ctx: &Context,
        name: &str,
        build: impl FnOnce(&Context) -> Result<Vec<Box<dyn Module>>>,
    ) -> Result<Sequential> {
        let layers = ctx.scope(name, build)?;
        Ok(Sequential { ctx: ctx.clone(), name: name.to_string(), layers })
    }

    /// How many children.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True with no children (then `forward` is the identity).
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// The children, in order.
    pub fn layers(&self) -> &[Box<dyn Module>] {
        &self.layers
    }
}

impl Params for Sequential {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.layers.iter().for_each(|l| l.visit(f))
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.ctx.scope(&self.name, |_| self.layers.iter().try_fold(x.clone(), |h, layer| layer.forward(&h)))
    }

    fn set_training(&mut self, training: bool) {
        self.layers.iter_mut().for_each(|l| l.set_training(training))
    }
}

/// `x + inner(x)`: a skip connection around a module whose output has its
/// input's shape (broadcasting applies as for `+`).
pub struct Residual<M> {
    /// The wrapped module.
    pub inner: M,
}

impl<M: Module> Residual<M> {
    /// Wraps `inner`.
    pub fn new(inner: M) -> Residual<M> {
        Residual { inner }
    }
}

impl<M: Module> Params for Residual<M> {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        self.inner.visit(f)
    }
}

impl<M: Module> Module for Residual<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x + self.inner.forward(x)?)
    }

    fn set_training(&mut self, training: bool) {
        self.inner.set_training(training)
    }
}
