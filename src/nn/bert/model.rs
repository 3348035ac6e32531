//! The BERT encoder: embeddings, then post-norm transformer layers.
//!
//! Each layer is, with `x` of shape `[batch, seq, width]`:
//!
//! ```text
//! a = norm(x + out(attention(query(x), key(x), value(x), padding)))
//! y = norm(a + down(gelu(up(a))))
//! ```
//!
//! where attention is one [`Tensor::scaled_dot_product_attention`] node
//! over the heads (`[batch, heads, seq, width / heads]`, a permuted view of
//! the projection, no copy) and a padded key is removed by a bool mask.
//! The parameters are created in the dtype the model is built in, so a
//! bf16 model runs bf16 GEMMs and a bf16 attention kernel end to end.

use super::BertConfig;
use crate::attention::key_padding_mask;
use crate::nn::layers::Norm;
use crate::nn::Params;
use crate::{Context, DType, Error, Location, Result, Tensor, Variable};

/// `x wᵀ + b` with `w` `[out, in]` (PyTorch's layout, as checkpoints hold it).
struct Dense {
    weight: Variable,
    bias: Variable,
}

impl Dense {
    fn new(ctx: &Context, name: &str, n_in: usize, n_out: usize, dtype: DType) -> Result<Dense> {
        ctx.scope(name, |ctx| {
            Ok(Dense {
                weight: ctx.variable("weight", (ctx.randn([n_out, n_in]) * 0.02).cast(dtype))?,
                bias: ctx.variable("bias", ctx.zeros_dtype([n_out], dtype))?,
            })
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.matmul(&self.weight.t()) + &*self.bias
    }
}

struct Layer {
    query: Dense,
    key: Dense,
    value: Dense,
    output: Dense,
    attention_norm: Norm,
    up: Dense,
    down: Dense,
    ffn_norm: Norm,
}

/// A BERT encoder with its parameters in the scope it was built in.
pub struct Bert {
    ctx: Context,
    name: String,
    config: BertConfig,
    dtype: DType,
    word: Variable,
    position: Variable,
    token_type: Variable,
    norm: Norm,
    layers: Vec<Layer>,
}

impl Bert {
    /// A randomly initialized encoder (`N(0, 0.02)` weights, as BERT's
    /// initializer) of `config`'s sizes in `dtype` (a float dtype), its
    /// parameters under the scope `name`. Load a checkpoint into it with
    /// [`crate::nn::load_mapped`] and [`super::hf_name`].
    #[track_caller]
    pub fn new(ctx: &Context, name: &str, config: &BertConfig, dtype: DType) -> Result<Bert> {
        let location = Location::caller();
        if !dtype.is_float() {
            return Err(Error::Argument {
                op: "Bert::new",
                message: format!("a BERT encoder computes in a float dtype, not {dtype}"),
                location,
            });
        }
        let c = config;
        let (w, heads) = (c.hidden_size, c.num_attention_heads);
        if heads == 0 || w % heads != 0 {
            return Err(Error::Argument {
                op: "Bert::new",
                message: format!("width {w} does not divide into {heads} attention heads"),
                location,
            });
        }
        let _span = tracing::info_span!("Bert::new", layers = c.num_hidden_layers, width = w).entered();
        ctx.scope(name, |ctx| {
            let table = |ctx: &Context, rows: usize| (ctx.randn([rows, w]) * 0.02).cast(dtype);
            let (word, position, token_type, norm) = ctx.scope("embeddings", |ctx| {
                Ok((
                    ctx.scope("word", |ctx| ctx.variable("weight", table(ctx, c.vocab_size)))?,
                    ctx.scope("position", |ctx| {
                        ctx.variable("weight", table(ctx, c.max_position_embeddings))
                    })?,
                    ctx.scope("token_type", |ctx| ctx.variable("weight", table(ctx, c.type_vocab_size)))?,
                    Norm::new(ctx, "norm", w, c.layer_norm_eps, dtype)?,
                ))
            })?;
            let mut layers = Vec::with_capacity(c.num_hidden_layers);
            for i in 0..c.num_hidden_layers {
                layers.push(ctx.scope(&format!("layer{i}"), |ctx| {
                    let (query, key, value, output, attention_norm) = ctx.scope("attention", |ctx| {
                        Ok((
                            Dense::new(ctx, "query", w, w, dtype)?,
                            Dense::new(ctx, "key", w, w, dtype)?,
                            Dense::new(ctx, "value", w, w, dtype)?,
                            Dense::new(ctx, "output", w, w, dtype)?,
                            Norm::new(ctx, "norm", w, c.layer_norm_eps, dtype)?,
                        ))
                    })?;
                    let (up, down, ffn_norm) = ctx.scope("ffn", |ctx| {
                        Ok((
                            Dense::new(ctx, "up", w, c.intermediate_size, dtype)?,
                            Dense::new(ctx, "down", c.intermediate_size, w, dtype)?,
                            Norm::new(ctx, "norm", w, c.layer_norm_eps, dtype)?,
                        ))
                    })?;
                    Ok(Layer { query, key, value, output, attention_norm, up, down, ffn_norm })
                })?);
            }
            Ok(Bert {
                ctx: ctx.clone(),
                name: name.to_string(),
                config: c.clone(),
                dtype,
                word,
                position,
                token_type,
                norm,
                layers,
            })
        })
    }

    /// The sizes it was built with.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The dtype it computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The last layer's token vectors `[batch, seq, width]` for token ids
    /// `[batch, seq]` (i64 or i32) and an attention mask of the same shape
    /// (1 for a token, 0 for padding; any numeric or bool dtype). All
    /// token types are 0 (single-sentence inputs).
    #[track_caller]
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        // A failed input returns its own error: the checks below read
        // shapes, and a failed tensor's is `[]`.
        if let Some(e) = ids.error().or(mask.error()) {
            return Err(e.clone());
        }
        let shape = ids.shape().to_vec();
        if shape.len() != 2 || mask.shape() != shape.as_slice() {
            return Err(Error::Shape {
                op: "Bert::forward",
                message: format!(
                    "BERT takes ids and a mask of shape [batch, seq], got {:?} and {:?}",
                    ids.shape(),
                    mask.shape()
                ),
                location,
            });
        }
        let (b, s) = (shape[0], shape[1]);
        if s > self.config.max_position_embeddings {
            return Err(Error::Shape {
                op: "Bert::forward",
                message: format!(
                    "{s} tokens are more than the model's {} positions; truncate the input",
                    self.config.max_position_embeddings
                ),
                location,
            });
        }
        let (w, heads) = (self.config.hidden_size, self.config.num_attention_heads);
        let hd = w / heads;
        self.ctx.scope(&self.name, |_| {
            let words = self.word.index_select(0, &ids.flatten()).reshape([b, s, w]);
            let pos = self.position.narrow(0, 0, s);
            let typ = self.token_type.narrow(0, 0, 1);
            let mut x = self.norm.forward(&(words + pos + typ));
            let keep = key_padding_mask(mask);
            for (i, l) in self.layers.iter().enumerate() {
                x = self.ctx.scope(&format!("layer{i}"), |_| {
                    let split = |t: Tensor| t.reshape([b, s, heads, hd]).permute(&[0, 2, 1, 3]);
                    let (q, k, v) =
                        (split(l.query.forward(&x)), split(l.key.forward(&x)), split(l.value.forward(&x)));
                    let a = q.scaled_dot_product_attention(&k, &v, Some(&keep), false, None);
                    let a = a.permute(&[0, 2, 1, 3]).reshape([b, s, w]);
                    let a = l.attention_norm.forward(&(&x + l.output.forward(&a)));
                    let f = l.down.forward(&l.up.forward(&a).gelu());
                    Ok(l.ffn_norm.forward(&(&a + f)))
                })?;
            }
            Ok(x)
        })
    }
}

impl Params for Bert {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(&self.word);
        f(&self.position);
        f(&self.token_type);
        f(&self.norm.weight);
        f(&self.norm.bias);
        for l in &self.layers {
            for d in [&l.query, &l.key, &l.value, &l.output] {
                f(&d.weight);
                f(&d.bias);
            }
            f(&l.attention_norm.weight);
            f(&l.attention_norm.bias);
            for d in [&l.up, &l.down] {
                f(&d.weight);
                f(&d.bias);
            }
            f(&l.ffn_norm.weight);
            f(&l.ffn_norm.bias);
        }
    }
}
