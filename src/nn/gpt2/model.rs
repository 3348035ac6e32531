//! The GPT-2 decoder: token and position embeddings, pre-norm blocks,
//! a final layer norm, and the LM head tied to the token embedding.
//!
//! Each block is, with `x` of shape `[batch, seq, width]`:
//!
//! ```text
//! (q, k, v) = split(qkv(norm1(x)))               Block::project
//! x = x + output(attention(q, k, v, causal))     Block::attend
//! x = x + down(act(up(norm2(x))))
//! ```
//!
//! The projections are Hugging Face's Conv1D layers, `x W + b`, with `W`
//! held `[out, in]` (as `nn::Linear` holds it; the product reads `Wᵀ`
//! as a view) where Hugging Face's checkpoints store `[in, out]`: the
//! loader transposes once ([`super::hf_name`] says which tensors). A
//! decode step's products are matrix-vector products, and with `[out,
//! in]` each output's weights are one contiguous row: the CUDA GEMV then
//! gives each output a warp that streams its row and sums with shuffles,
//! where `[in, out]` had to split the inputs across blocks and add their
//! partial sums through global memory (a second round trip per product,
//! 48 a token for GPT-2 small). Attention is
//! one [`Tensor::scaled_dot_product_attention`] node over
//! `[batch, heads, seq, head_dim]` (a permuted view of the projection).
//!
//! **The KV seam.** A block's keys and values come out of
//! `Block::project` as a [`KeyValues`] and go into `Block::attend`;
//! between the two, [`Gpt2::hidden`] passes them through the caller's
//! `kv` hook with the layer's index. The plain forward pass hands them
//! straight on. A KV cache is a hook that writes this step's keys and
//! values into its per-layer `[batch, heads, max_len, head_dim]`
//! variables at the step's offset and returns the cache's first `len`
//! positions, with an [`Attend`] that masks keys by position instead of
//! the square causal mask.

use super::{Activation, Gpt2Config};
use crate::attention::key_padding_mask;
use crate::nn::layers::Norm;
use crate::nn::Params;
use crate::{Context, DType, Error, Location, Result, Tensor, Variable};

/// `x Wᵀ + b` with `W` `[out, in]`: Hugging Face's `Conv1D`, with the
/// weight held as `nn::Linear` holds it (see the module docs).
struct Conv1d {
    weight: Variable,
    bias: Variable,
}

impl Conv1d {
    fn new(ctx: &Context, name: &str, n_in: usize, n_out: usize, dtype: DType) -> Result<Conv1d> {
        ctx.scope(name, |ctx| {
            Ok(Conv1d {
                weight: ctx.variable("weight", (ctx.randn([n_out, n_in]) * 0.02).cast(dtype))?,
                bias: ctx.variable("bias", ctx.zeros_dtype([n_out], dtype))?,
            })
        })
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.matmul(&self.weight.t()) + &*self.bias
    }
}

/// One layer's keys and values, each `[batch, heads, keys, head_dim]`:
/// what [`Gpt2::hidden`]'s `kv` hook sees and returns.
#[derive(Clone, Debug)]
pub struct KeyValues {
    /// `[batch, heads, keys, head_dim]`.
    pub keys: Tensor,
    /// `[batch, heads, keys, head_dim]`.
    pub values: Tensor,
    /// The same keys and values stacked, `[2, batch, heads, keys,
    /// head_dim]`, when the model has them as one view (a block's
    /// projection does): a KV cache then writes both at once
    /// ([`crate::nn::KvCache::append_stacked`]). `None` for a pair made
    /// apart ([`KeyValues::new`]).
    pub stacked: Option<Tensor>,
}

impl KeyValues {
    /// Keys and values made apart.
    pub fn new(keys: Tensor, values: Tensor) -> KeyValues {
        KeyValues { keys, values, stacked: None }
    }

    /// `[2, batch, heads, keys, head_dim]`: [`KeyValues::stacked`], or
    /// the two stacked now.
    pub fn both(&self) -> Tensor {
        match &self.stacked {
            Some(kv) => kv.clone(),
            None => Tensor::stack(&[&self.keys, &self.values], 0),
        }
    }
}

/// Which keys each query attends to.
#[derive(Clone, Debug)]
pub struct Attend {
    /// Query `i` sees key `j` only if `j <= i` (queries and keys counted
    /// from the same first position).
    pub causal: bool,
    /// A mask that broadcasts to `[batch, heads, queries, keys]`: bool
    /// (`true` keeps a key) or additive, as
    /// [`Tensor::scaled_dot_product_attention`] takes it; `None` keeps all.
    pub mask: Option<Tensor>,
}

/// Where the position embedding of each token comes from.
pub enum Positions<'a> {
    /// `0, 1, .., seq - 1` in every row.
    FromZero,
    /// `[batch, seq]` integer positions.
    Given(&'a Tensor),
}

struct Block {
    attention_norm: Norm,
    qkv: Conv1d,
    output: Conv1d,
    ffn_norm: Norm,
    up: Conv1d,
    down: Conv1d,
    /// The attention scale of this layer.
    scale: f64,
}

impl Block {
    /// This block's queries, keys and values of the normalized input
    /// `x` `[batch, seq, width]`, each `[batch, heads, seq, head_dim]`.
    fn project(&self, x: &Tensor, heads: usize) -> (Tensor, KeyValues) {
        let (b, s, w) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let qkv = self.qkv.forward(x).reshape([b, s, 3, heads, w / heads]);
        let part = |i: usize| qkv.narrow(2, i, 1).squeeze(2).permute(&[0, 2, 1, 3]);
        let stacked = qkv.narrow(2, 1, 2).permute(&[2, 0, 3, 1, 4]);
        (part(0), KeyValues { keys: part(1), values: part(2), stacked: Some(stacked) })
    }

    /// The attention of `q` over `kv`, merged back to `[batch, seq, width]`
    /// and projected (the residual is the caller's).
    fn attend(&self, q: &Tensor, kv: &KeyValues, attend: &Attend) -> Tensor {
        let (b, h, s, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let a = q.scaled_dot_product_attention(
            &kv.keys,
            &kv.values,
            attend.mask.as_ref(),
            attend.causal,
            Some(self.scale),
        );
        self.output.forward(&a.permute(&[0, 2, 1, 3]).reshape([b, s, h * d]))
    }

    fn feed_forward(&self, x: &Tensor, activation: Activation) -> Tensor {
        let u = self.up.forward(&self.ffn_norm.forward(x));
        let u = match activation {
            Activation::GeluTanh => u.gelu_tanh(),
            Activation::Gelu => u.gelu(),
            Activation::Relu => u.relu(),
            Activation::Silu => u.silu(),
        };
        self.down.forward(&u)
    }
}

/// A GPT-2 language model (Hugging Face's `GPT2LMHeadModel`) with its
/// parameters in the scope it was built in.
pub struct Gpt2 {
    ctx: Context,
    name: String,
    config: Gpt2Config,
    dtype: DType,
    token: Variable,
    position: Variable,
    layers: Vec<Block>,
    norm: Norm,
}

impl Gpt2 {
    /// A randomly initialized model (`N(0, 0.02)` weights, unit layer
    /// norms, zero biases: GPT-2's initializer without its residual
    /// scaling) of `config`'s sizes in `dtype` (a float dtype), its
    /// parameters under the scope `name`. Load a checkpoint into it with
    /// [`crate::nn::load_mapped`] and [`super::hf_name`], or use
    /// [`Gpt2::from_pretrained`].
    #[track_caller]
    pub fn new(ctx: &Context, name: &str, config: &Gpt2Config, dtype: DType) -> Result<Gpt2> {
        let location = Location::caller();
        let fail = |message: String| Error::Argument { op: "Gpt2::new", message, location };
        if !dtype.is_float() {
            return Err(fail(format!("GPT-2 computes in a float dtype, not {dtype}")));
        }
        let c = config;
        let (w, heads) = (c.n_embd, c.n_head);
        if heads == 0 || w % heads != 0 {
            return Err(fail(format!("width {w} does not divide into {heads} attention heads")));
        }
        if c.vocab_size == 0 || c.n_positions == 0 {
            return Err(fail(format!(
                "a vocabulary of {} tokens and {} positions: both must be at least 1",
                c.vocab_size, c.n_positions
            )));
        }
        let _span = tracing::info_span!("Gpt2::new", layers = c.n_layer, width = w).entered();
        let head_scale = if c.scale_attn_weights { 1.0 / ((w / heads) as f64).sqrt() } else { 1.0 };
        ctx.scope(name, |ctx| {
            let table = |ctx: &Context, rows: usize| (ctx.randn([rows, w]) * 0.02).cast(dtype);
            let (token, position) = ctx.scope("embeddings", |ctx| {
                Ok((
                    ctx.scope("token", |ctx| ctx.variable("weight", table(ctx, c.vocab_size)))?,
                    ctx.scope("position", |ctx| ctx.variable("weight", table(ctx, c.n_positions)))?,
                ))
            })?;
            let mut layers = Vec::with_capacity(c.n_layer);
            for i in 0..c.n_layer {
                layers.push(ctx.scope(&format!("layer{i}"), |ctx| {
                    let (attention_norm, qkv, output) = ctx.scope("attention", |ctx| {
                        Ok((
                            Norm::new(ctx, "norm", w, c.layer_norm_epsilon, dtype)?,
                            Conv1d::new(ctx, "qkv", w, 3 * w, dtype)?,
                            Conv1d::new(ctx, "output", w, w, dtype)?,
                        ))
                    })?;
                    let (ffn_norm, up, down) = ctx.scope("ffn", |ctx| {
                        Ok((
                            Norm::new(ctx, "norm", w, c.layer_norm_epsilon, dtype)?,
                            Conv1d::new(ctx, "up", w, c.n_inner, dtype)?,
                            Conv1d::new(ctx, "down", c.n_inner, w, dtype)?,
                        ))
                    })?;
                    let scale = if c.scale_attn_by_inverse_layer_idx {
                        head_scale / (i + 1) as f64
                    } else {
                        head_scale
                    };
                    Ok(Block { attention_norm, qkv, output, ffn_norm, up, down, scale })
                })?);
            }
            let norm = Norm::new(ctx, "norm", w, c.layer_norm_epsilon, dtype)?;
            Ok(Gpt2 {
                ctx: ctx.clone(),
                name: name.to_string(),
                config: c.clone(),
                dtype,
                token,
                position,
                layers,
                norm,
            })
        })
    }

    /// Reads a Hugging Face model folder: `config.json` and
    /// `model.safetensors` (or its `model-*.safetensors` parts), into a
    /// model in scope `gpt2` computing in `dtype` (an f32 checkpoint
    /// loads into bf16 or f16, rounding once). Every parameter must be in
    /// the checkpoint; an error names the missing ones.
    #[track_caller]
    pub fn from_pretrained(ctx: &Context, dir: impl AsRef<std::path::Path>, dtype: DType) -> Result<Gpt2> {
        let dir = dir.as_ref();
        let _span = tracing::info_span!("Gpt2::from_pretrained", dir = %dir.display()).entered();
        let config = Gpt2Config::from_file(dir.join("config.json"))?;
        let model = Gpt2::new(ctx, "gpt2", &config, dtype)?;
        let files = crate::nn::checkpoint_files(dir)?;
        crate::nn::load_mapped(&model, &files, |n| super::hf_name("gpt2", n))?;
        Ok(model)
    }

    /// The scope its parameters live in.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// The sizes it was built with.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The dtype it computes in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The context its parameters live on.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Logits `[batch, seq, vocab]` (the model's dtype) of token ids
    /// `[batch, seq]` (i64 or i32).
    ///
    /// Without a mask every token is real and positions count from 0.
    /// With an attention mask `[batch, seq]` (1 for a token, 0 for
    /// padding; any numeric or bool dtype), padded keys are removed and
    /// positions count the real tokens before each one (`cumsum(mask) -
    /// 1`, 0 at padding), as Hugging Face's `generate` computes them: a
    /// left-padded row then gives the logits of the row alone at its real
    /// positions. Logits at padded positions are unspecified.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let location = Location::caller();
        if let Some(e) = ids.error().or(mask.and_then(Tensor::error)) {
            return Err(e.clone());
        }
        let shape = ids.shape().to_vec();
        if shape.len() != 2 || mask.is_some_and(|m| m.shape() != shape.as_slice()) {
            return Err(Error::Shape {
                op: "Gpt2::forward",
                message: format!(
                    "GPT-2 takes ids (and a mask) of shape [batch, seq], got {:?}{}",
                    ids.shape(),
                    mask.map(|m| format!(" and {:?}", m.shape())).unwrap_or_default()
                ),
                location,
            });
        }
        let h = match mask {
            None => self.hidden_at(ids, Positions::FromZero, &plain_causal(), location)?,
            Some(mask) => {
                let positions = positions_from_mask(mask);
                let attend = Attend { causal: true, mask: Some(key_padding_mask(mask)) };
                self.hidden_at(ids, Positions::Given(&positions), &attend, location)?
            }
        };
        self.lm_head(&h)
    }

    /// The last block's output after the final layer norm, `[batch, seq,
    /// width]`, for ids `[batch, seq]`, positions and the attention
    /// pattern. `kv` sees layer `i`'s keys and values of these tokens and
    /// returns the ones its queries attend over (the identity for a plain
    /// forward pass; a KV cache's view for decoding).
    #[track_caller]
    pub fn hidden(
        &self,
        ids: &Tensor,
        positions: Positions,
        attend: &Attend,
        kv: &mut dyn FnMut(usize, KeyValues) -> Result<KeyValues>,
    ) -> Result<Tensor> {
        self.hidden_with(ids, positions, attend, kv, Location::caller())
    }

    fn hidden_at(
        &self,
        ids: &Tensor,
        positions: Positions,
        attend: &Attend,
        location: Location,
    ) -> Result<Tensor> {
        self.hidden_with(ids, positions, attend, &mut |_, kv| Ok(kv), location)
    }

    fn hidden_with(
        &self,
        ids: &Tensor,
        positions: Positions,
        attend: &Attend,
        kv: &mut dyn FnMut(usize, KeyValues) -> Result<KeyValues>,
        location: Location,
    ) -> Result<Tensor> {
        if let Some(e) = ids.error() {
            return Err(e.clone());
        }
        let fail = |message: String| Error::Shape { op: "Gpt2::forward", message, location };
        if ids.rank() != 2 {
            return Err(fail(format!("GPT-2 takes ids of shape [batch, seq], got {:?}", ids.shape())));
        }
        let (b, s) = (ids.shape()[0], ids.shape()[1]);
        let c = &self.config;
        if s > c.n_positions {
            return Err(fail(format!(
                "{s} tokens are more than the model's {} positions; shorten the input",
                c.n_positions
            )));
        }
        let w = c.n_embd;
        self.ctx.scope(&self.name, |_| {
            let tokens = self.token.index_select(0, &ids.flatten()).reshape([b, s, w]);
            let pos = match positions {
                Positions::FromZero => self.position.narrow(0, 0, s),
                Positions::Given(p) => {
                    if p.shape() != [b, s] {
                        return Err(fail(format!(
                            "positions {:?} do not match the ids {:?}",
                            p.shape(),
                            ids.shape()
                        )));
                    }
                    self.position.index_select(0, &p.flatten()).reshape([b, s, w])
                }
            };
            let mut x = tokens + pos;
            for (i, l) in self.layers.iter().enumerate() {
                x = self.ctx.scope(&format!("layer{i}"), |_| {
                    let (q, own) = l.project(&l.attention_norm.forward(&x), c.n_head);
                    let seen = kv(i, own)?;
                    let x = &x + l.attend(&q, &seen, attend);
                    Ok(&x + l.feed_forward(&x, c.activation))
                })?;
            }
            Ok(self.norm.forward(&x))
        })
    }

    /// Logits of hidden states `[.., width]`: `h · wteᵀ` (the LM head is
    /// the token embedding, tied), `[.., vocab]`.
    ///
    /// **A padded vocabulary for many rows.** GPT-2's 50257 logits make
    /// rows that are not a multiple of 16 bytes, and cuBLAS then has no
    /// tensor-core GEMM for the product or the two products of its
    /// gradient: on an H100 in bf16, 4096 rows took 3.37 ms for the logits
    /// and 2.36 and 2.13 for the gradients, against 0.45, 0.41 and 0.41
    /// with 50264 (PyTorch's cuBLAS alike: 3.43 ms at 50257;
    /// `torch.compile` pads such products, its `pad_mm`). So from
    /// [`PAD_HEAD_ROWS`] rows on (a training step, the logits of every
    /// position of a full forward), the embedding gets zero rows up to a
    /// multiple of [`HEAD_ALIGN`] for the product, and the logits are its
    /// first `vocab` columns: the same values, a view whose rows are
    /// aligned, and a gradient whose product reads aligned rows too. A
    /// decode step's few rows read the embedding as it is (the copy would
    /// cost more than the GEMV).
    pub fn lm_head(&self, h: &Tensor) -> Result<Tensor> {
        self.ctx.scope(&self.name, |ctx| {
            let [vocab, width] = [self.token.shape()[0], self.token.shape()[1]];
            let rows = h.shape().iter().rev().skip(1).product::<usize>();
            let padded = vocab.next_multiple_of(HEAD_ALIGN);
            if rows < PAD_HEAD_ROWS || padded == vocab {
                return Ok(h.matmul(&self.token.t()));
            }
            let zeros = ctx.zeros_dtype([padded - vocab, width], self.token.dtype());
            let w = Tensor::cat(&[&*self.token, &zeros], 0);
            Ok(h.matmul(&w.t()).narrow(-1, 0, vocab))
        })
    }
}

/// The row count from which [`Gpt2::lm_head`] pads the vocabulary.
pub const PAD_HEAD_ROWS: usize = 64;

/// The multiple [`Gpt2::lm_head`] pads the vocabulary to: 8 elements
/// make a bf16 or f16 row a multiple of 16 bytes, what cuBLAS's
/// tensor-core kernels need (GPT-2's 50257 becomes 50264).
pub const HEAD_ALIGN: usize = 8;

/// Causal attention over the tokens themselves, nothing padded.
fn plain_causal() -> Attend {
    Attend { causal: true, mask: None }
}

/// `cumsum(mask) - 1` at real tokens and 0 at padding, i64 `[batch, seq]`,
/// computed on the device exactly (integer sums of `mask[.., i]` over
/// `i <= j`).
fn positions_from_mask(mask: &Tensor) -> Tensor {
    let Some(ctx) = mask.context() else { return mask.clone() };
    let (b, s) = (mask.shape()[0], mask.shape()[1]);
    let real = key_padding_mask(mask).reshape([b, s]);
    let before = ctx.ones_dtype([s, s], DType::I64).tril(0);
    let count = (real.cast(DType::I64).unsqueeze(1) * before).sum(&[2], false);
    real.where_cond(count - 1i64, 0i64)
}

impl Params for Gpt2 {
    fn visit(&self, f: &mut dyn FnMut(&Variable)) {
        f(&self.token);
        f(&self.position);
        for l in &self.layers {
            for v in [
                &l.attention_norm.weight,
                &l.attention_norm.bias,
                &l.qkv.weight,
                &l.qkv.bias,
                &l.output.weight,
                &l.output.bias,
                &l.ffn_norm.weight,
                &l.ffn_norm.bias,
                &l.up.weight,
                &l.up.bias,
                &l.down.weight,
                &l.down.bias,
            ] {
                f(v);
            }
        }
        f(&self.norm.weight);
        f(&self.norm.bias);
    }
}

/// GPT-2 as a [`Module`](crate::nn::Module): `forward(ids)` is the logits
/// of unpadded token ids ([`Gpt2::forward`] without a mask), so the model
/// trains wherever a module does, as in [`crate::dist::DataParallel`]:
///
/// ```no_run
/// # use kiln::prelude::*;
/// # use kiln::nn::gpt2::{Gpt2, Gpt2Config};
/// # fn main() -> kiln::Result<()> {
/// use kiln::dist::DataParallel;
/// use kiln::optim::{AdamConfig, AdamW};
/// let ctxs = [Context::cuda(0)?, Context::cuda(1)?];
/// let build = |ctx: &Context| {
///     let model = Gpt2::new(ctx, "gpt", &Gpt2Config::gpt2_small(), DType::F32)?;
///     let opt = AdamW::new(&model, AdamConfig::adamw())?;
///     Ok((model, opt))
/// };
/// let mut dp = DataParallel::new(&ctxs, build, |m: &Gpt2, b: &[Tensor]| {
///     let logits = kiln::nn::Module::forward(m, &b[0])?;
///     let rows = b[1].shape().iter().product::<usize>();
///     kiln::nn::cross_entropy(&logits.reshape([rows, logits.shape()[2]]), &b[1].reshape([rows]))
/// })?;
/// # Ok(()) }
/// ```
impl crate::nn::Module for Gpt2 {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Gpt2::forward(self, ids, None)
    }
}
