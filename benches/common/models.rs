//! What the GPU benches share: the models they time (built the way
//! `benches/torch_*.py` builds PyTorch's side) and the median. Included by
//! path (`#[path = "common/models.rs"] mod models;`), so it is no bench
//! target of its own; a bench uses what it needs.
#![allow(dead_code)]

use kiln::nn::{LayerNorm, Linear, Module, ReLU, Residual, Sequential, GELU};
use kiln::prelude::*;

/// The LN-MLP blocks' width, hidden width and count.
pub const D: usize = 256;
pub const HIDDEN: usize = 1024;
pub const BLOCKS: usize = 16;

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// 784-1024x3-10 with ReLUs (PyTorch's `mlp()`).
pub fn mlp(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "mlp", |ctx| {
        Ok(vec![
            Linear::new(ctx, "0", 784, 1024)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "2", 1024, 1024)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "4", 1024, 1024)?.boxed(),
            ReLU.boxed(),
            Linear::new(ctx, "6", 1024, 10)?.boxed(),
        ])
    })
}

/// [`BLOCKS`] residual blocks x + fc2(gelu(fc1(layer_norm(x)))) of width
/// [`D`] (PyTorch's `blocks()`).
pub fn blocks(ctx: &Context) -> Result<Sequential> {
    Sequential::new(ctx, "blocks", |ctx| {
        (0..BLOCKS)
            .map(|b| {
                let block = Sequential::new(ctx, &format!("{b}"), |ctx| {
                    Ok(vec![
                        LayerNorm::new(ctx, "ln", D)?.boxed(),
                        Linear::new(ctx, "fc1", D, HIDDEN)?.boxed(),
                        GELU.boxed(),
                        Linear::new(ctx, "fc2", HIDDEN, D)?.boxed(),
                    ])
                })?;
                Ok(Residual::new(block).boxed())
            })
            .collect()
    })
}
