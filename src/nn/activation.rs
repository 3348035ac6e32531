//! Modules without parameters that apply a function elementwise or
//! reshape: `ReLU`, `GELU`, `Tanh`, `Sigmoid`, `Flatten`. They record in
//! the region of whoever calls them (they have no scope of their own).

use super::{Module, Params};
use crate::{Error, Location, Result, Tensor, Variable};

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => $method:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;

        impl Params for $name {
            fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
        }

        impl Module for $name {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(x.$method())
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)`.
    ReLU => relu;
    /// `x · Φ(x)` with the exact normal CDF (PyTorch's default `nn.GELU`).
    GELU => gelu;
    /// `tanh(x)`.
    Tanh => tanh;
    /// `1 / (1 + e^-x)`.
    Sigmoid => sigmoid;
}

/// Flattens every dimension after the first: `[n, ...] -> [n, prod(...)]`
/// (PyTorch's `nn.Flatten()`), a view.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Params for Flatten {
    fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
}

impl Module for Flatten {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.error().is_some() {
            return Ok(x.clone());
        }
        let Some((&n, rest)) = x.shape().split_first() else {
            return Err(Error::Shape {
                op: "Flatten",
                message: "Flatten needs a tensor of rank >= 1 (a batch dimension), got a scalar".into(),
                location: Location::caller(),
            });
        };
        Ok(x.reshape([n, rest.iter().product()]))
    }
}
