//! Layers with parameters or state: `Linear`, `LayerNorm`, `Embedding`,
//! and `Dropout`.

use super::{check_arg, uniform, Module, Params};
use crate::{Context, DType, Error, Location, Result, Tensor, Variable};

/// `y = x · weightᵀ + bias` over the last dimension of `x` (PyTorch's
/// `nn.Linear`): `weight` is `[out, in]`, `bias` `[out]`, both from
/// `U(-1/√in, 1/√in)`. The transpose is a view the GEMM reads with
/// strides, not a copy.
pub struct Linear {
    ctx: Context,
    name: String,
    /// `[out_features, in_features]`.
    pub weight: Variable,
    /// `[out_features]`, if the layer has one.
    pub bias: Option<Variable>,
}

impl Linear {
    /// A linear layer with a bias, its parameters in the scope `name`.
    #[track_caller]
    pub fn new(ctx: &Context, name: &str, in_features: usize, out_features: usize) -> Result<Linear> {
        Linear::build(ctx, name, in_features, out_features, true, Location::caller())
    }

    /// A linear layer without a bias.
    #[track_caller]
    pub fn without_bias(
        ctx: &Context,
        name: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Linear> {
        Linear::build(ctx, name, in_features, out_features, false, Location::caller())
    }

    fn build(
        ctx: &Context,
        name: &str,
        n_in: usize,
        n_out: usize,
        bias: bool,
        location: Location,
    ) -> Result<Linear> {
        check_arg(n_in > 0 && n_out > 0, "Linear::new", location, || {
            format!(
                "Linear \"{name}\" needs at least one input and one output feature, got {n_in} -> {n_out}"
            )
        })?;
        let bound = 1.0 / (n_in as f64).sqrt();
        let (weight, bias) = ctx.scope(name, |ctx| {
            let weight = ctx.variable("weight", uniform(ctx, &[n_out, n_in], bound))?;
            let bias = if bias { Some(ctx.variable("bias", uniform(ctx, &[n_out], bound))?) } else { None };
            Ok((weight, bias))
        })?;
        Ok(Linear { ctx: ctx.clone(), name: name.to_string(), weight, bias })
    }
}

impl Params for Linear {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(&self.weight);
        if let Some(b) = &self.bias {
            f(b);
        }
    }
}

impl Module for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        let n_in = self.weight.shape()[1];
        if x.error().is_none() && x.shape().last() != Some(&n_in) {
            return Err(Error::Shape {
                op: "Linear",
                message: format!(
                    "Linear \"{}\" takes inputs [..., {n_in}] but was given {:?}",
                    self.weight.name().trim_end_matches("/weight"),
                    x.shape()
                ),
                location,
            });
        }
        self.ctx.scope(&self.name, |_| {
            let y = x.matmul(&self.weight.t());
            Ok(match &self.bias {
                Some(b) => y + b,
                None => y,
            })
        })
    }
}

/// Layer normalization over the last dimension (PyTorch's
/// `nn.LayerNorm(dim)`, eps 1e-5): weight starts at 1, bias at 0.
pub struct LayerNorm {
    ctx: Context,
    name: String,
    /// `[dim]`, starts at ones.
    pub weight: Variable,
    /// `[dim]`, starts at zeros.
    pub bias: Variable,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm over a last dimension of size `dim`.
    #[track_caller]
    pub fn new(ctx: &Context, name: &str, dim: usize) -> Result<LayerNorm> {
        let location = Location::caller();
        check_arg(dim > 0, "LayerNorm::new", location, || format!("LayerNorm \"{name}\" needs dim > 0"))?;
        let (weight, bias) = ctx.scope(name, |ctx| {
            Ok((ctx.variable("weight", ctx.ones([dim]))?, ctx.variable("bias", ctx.zeros([dim]))?))
        })?;
        Ok(LayerNorm { ctx: ctx.clone(), name: name.to_string(), weight, bias, eps: 1e-5 })
    }
}

impl Params for LayerNorm {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(&self.weight);
        f(&self.bias);
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.ctx.scope(&self.name, |_| Ok(x.layer_norm(&self.weight, &self.bias, self.eps)))
    }
}

/// A lookup table (PyTorch's `nn.Embedding`): integer ids of any shape
/// give rows of `weight` (`[num, dim]`, from `N(0, 1)`), shape
/// `ids.shape + [dim]`. Its gradient is `index_select`'s, a scatter-add
/// (`index_add`) of the output gradient's rows into zeros: linear in the
/// number of ids, whatever the vocabulary's size.
pub struct Embedding {
    ctx: Context,
    name: String,
    /// `[num_embeddings, dim]`.
    pub weight: Variable,
}

impl Embedding {
    /// A table of `num` rows of size `dim`.
    #[track_caller]
    pub fn new(ctx: &Context, name: &str, num: usize, dim: usize) -> Result<Embedding> {
        let location = Location::caller();
        check_arg(num > 0 && dim > 0, "Embedding::new", location, || {
            format!("Embedding \"{name}\" needs at least one row and one column, got {num} x {dim}")
        })?;
        let weight = ctx.scope(name, |ctx| ctx.variable("weight", ctx.randn([num, dim])))?;
        Ok(Embedding { ctx: ctx.clone(), name: name.to_string(), weight })
    }
}

impl Params for Embedding {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(&self.weight)
    }
}

impl Module for Embedding {
    #[track_caller]
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        if ids.error().is_none() && !matches!(ids.dtype(), DType::I64 | DType::I32) {
            return Err(Error::DType {
                op: "Embedding",
                message: format!("Embedding ids must be i64 or i32, got {}", ids.dtype()),
                location,
            });
        }
        let mut shape = ids.shape().to_vec();
        shape.push(self.weight.shape()[1]);
        self.ctx.scope(&self.name, |_| Ok(self.weight.index_select(0, &ids.flatten()).reshape(shape)))
    }
}

/// Zeroes each element with probability `p` and scales the rest by
/// `1 / (1 - p)` in training mode; the identity in evaluation mode.
/// The mask comes from the context's counter-based generator (Philox),
/// a fresh draw every step without a new compile.
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`.
    #[track_caller]
    pub fn new(p: f64) -> Result<Dropout> {
        check_arg((0.0..=1.0).contains(&p), "Dropout::new", Location::caller(), || {
            format!("the dropout probability must be in [0, 1], got {p}")
        })?;
        Ok(Dropout { p, training: true })
    }

    /// Whether it drops (training mode).
    pub fn training(&self) -> bool {
        self.training
    }
}

impl Params for Dropout {
    fn visit(&self, _: &mut dyn FnMut(&Variable)) {}
}

impl Module for Dropout {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let Some(ctx) = x.context() else { return Ok(x.clone()) };
        if !x.dtype().is_float() {
            return Err(Error::DType {
                op: "Dropout",
                message: format!("dropout needs a float tensor, got {}", x.dtype()),
                location,
            });
        }
        if self.p == 1.0 {
            return Ok(x * 0.0);
        }
        let keep = ctx.rand_dtype(x.shape().to_vec(), x.dtype()).ge(self.p);
        Ok(keep.where_cond(x * (1.0 / (1.0 - self.p)), 0.0))
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Layer norm over the last dim with its own epsilon, in the model's
/// dtype, its `weight` and `bias` in the scope `name`: the norm of the
/// pretrained models (`bert`, `gpt2`), whose checkpoint names map onto
/// those. (`LayerNorm` is the f32 module users build.)
pub(crate) struct Norm {
    pub(crate) weight: Variable,
    pub(crate) bias: Variable,
    eps: f64,
}

impl Norm {
    pub(crate) fn new(ctx: &Context, name: &str, width: usize, eps: f64, dtype: DType) -> Result<Norm> {
        ctx.scope(name, |ctx| {
            Ok(Norm {
                weight: ctx.variable("weight", ctx.ones_dtype([width], dtype))?,
                bias: ctx.variable("bias", ctx.zeros_dtype([width], dtype))?,
                eps,
            })
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }
}
