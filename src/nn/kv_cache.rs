//! A key/value cache for decoder attention: each layer's keys and values
//! live in one variable of `[2, batch, heads, max_len, head_dim]` (keys,
//! then values), written at a runtime offset ([`crate::Variable::write_at`])
//! and read whole, with a mask that hides what is not yet (or never) part
//! of a sequence.
//!
//! # Why keys and values share a variable
//!
//! A model whose projection gives the new keys and values as one view
//! (GPT-2's `qkv` output, `[2, batch, heads, s, head_dim]` once permuted:
//! [`KvCache::append_stacked`]) writes both with one `write_at`, one
//! kernel a layer instead of two: on an H100 each was 2.4 µs of a
//! 0.58 ms GPT-2 decode step, 24 a token.
//!
//! # Why fixed-size buffers and a mask
//!
//! Every shape a plan sees is fixed: the cache is `max_len` long however
//! many positions are filled, and the number of filled positions is a
//! runtime value (the offset of the next write). So one decode plan (one
//! captured step, one CUDA graph) serves every position, and nothing is
//! compiled per token. Attention reads all `max_len` keys and the mask
//! removes those past the query's position: a decode step costs the
//! bandwidth of the whole cache rather than of its filled part, which for
//! the lengths a cache is sized for is small next to reading the weights.
//!
//! # Sequences of different lengths
//!
//! A batch shares one write offset. Shorter prompts are left-padded: row
//! `b`'s sequence starts at cache index `starts[b]`, and the mask hides
//! the keys before it, so padding is never attended to. Positions (for a
//! position embedding) count from each row's start ([`KvCache::positions`]),
//! as Hugging Face computes them from an attention mask.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln::nn::KvCache;
//! let ctx = Context::cpu();
//! let cache = KvCache::new(&ctx, "cache", 1, 2, 1, 8, 4, DType::F32)?;
//! let starts = ctx.tensor(&[0i64, 5], [2]);          // row 1 is padded by 5
//! let k = ctx.randn([2, 1, 6, 4]);                   // a 6-token prefill
//! let (keys, _values) = cache.append(0, &ctx.scalar(0i64), &k, &k)?;
//! assert_eq!(keys.shape(), &[2, 1, 8, 4]);
//! let mask = cache.visible(&ctx.scalar(0i64), 6, &starts);
//! // Row 1's last query (index 5) sees only key 5; row 0's sees keys 0..=5.
//! let m = mask.cast(DType::I64).to_vec::<i64>()?;
//! assert_eq!(&m[5 * 8..6 * 8], &[1, 1, 1, 1, 1, 1, 0, 0]);
//! assert_eq!(&m[11 * 8..12 * 8], &[0, 0, 0, 0, 0, 1, 0, 0]);
//! # Ok::<(), kiln::Error>(())
//! ```

use crate::{Context, DType, Error, Location, Result, Tensor, Variable};

/// Per-layer keys and values of a decoder, `[batch, heads, max_len,
/// head_dim]` each, stacked in one variable a layer (see the module docs).
pub struct KvCache {
    ctx: Context,
    /// `[2, batch, heads, max_len, head_dim]` a layer: keys, then values.
    layers: Vec<Variable>,
    batch: usize,
    max_len: usize,
}

impl KvCache {
    /// A zeroed cache of `layers` layers in the scope `name` (variables
    /// `name/layer{i}/kv`). Make it before capturing a step that uses it
    /// (a captured step may not create variables).
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn new(
        ctx: &Context,
        name: &str,
        layers: usize,
        batch: usize,
        heads: usize,
        max_len: usize,
        head_dim: usize,
        dtype: DType,
    ) -> Result<KvCache> {
        let location = Location::caller();
        if layers == 0 || batch == 0 || heads == 0 || max_len == 0 || head_dim == 0 {
            return Err(Error::Argument {
                op: "KvCache::new",
                message: format!(
                    "every size must be positive: {layers} layers, batch {batch}, {heads} heads, max_len {max_len}, head_dim {head_dim}"
                ),
                location,
            });
        }
        let shape = [2, batch, heads, max_len, head_dim];
        ctx.scope(name, |ctx| {
            let mut kv = Vec::with_capacity(layers);
            for i in 0..layers {
                kv.push(
                    ctx.scope(&format!("layer{i}"), |ctx| ctx.variable("kv", ctx.zeros_dtype(shape, dtype)))?,
                );
            }
            // Computed now: a plan that reads a variable's first value
            // (a constant zeros node) differs from one that reads its
            // buffer, so a first prefill would compile again on a later
            // call of the same shape.
            let all: Vec<&Tensor> = kv.iter().map(|v| &**v).collect();
            ctx.realize(&all)?;
            Ok(KvCache { ctx: ctx.clone(), layers: kv, batch, max_len })
        })
    }

    /// Positions the cache holds.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Rows of the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Layers.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// The variables, one a layer: `[2, batch, heads, max_len,
    /// head_dim]`, keys then values.
    pub fn variables(&self) -> Vec<Variable> {
        self.layers.clone()
    }

    /// Writes layer `layer`'s new keys and values (`[batch, heads, s,
    /// head_dim]` each) at cache index `offset` (a 0-d i64 tensor: a
    /// step's argument, so that every position runs the same plan), and
    /// returns the layer's whole keys and values, new entries included, to
    /// attend over with [`KvCache::visible`]'s mask. The two are stacked
    /// for the write (a copy); [`KvCache::append_stacked`] takes them
    /// stacked already.
    #[track_caller]
    pub fn append(&self, layer: usize, offset: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.append_at(layer, offset, &Tensor::stack(&[k, v], 0), Location::caller())
    }

    /// [`KvCache::append`] of keys and values stacked, `[2, batch,
    /// heads, s, head_dim]`: one write, and no copy when `kv` is a view
    /// (of a projection's output, say).
    #[track_caller]
    pub fn append_stacked(&self, layer: usize, offset: &Tensor, kv: &Tensor) -> Result<(Tensor, Tensor)> {
        self.append_at(layer, offset, kv, Location::caller())
    }

    fn append_at(
        &self,
        layer: usize,
        offset: &Tensor,
        kv: &Tensor,
        location: Location,
    ) -> Result<(Tensor, Tensor)> {
        let Some(var) = self.layers.get(layer) else {
            return Err(Error::Argument {
                op: "KvCache::append",
                message: format!("layer {layer} of a cache of {} layers", self.layers.len()),
                location,
            });
        };
        var.write_at(3, offset, kv)?;
        let all = var.tensor();
        Ok((all.narrow(0, 0, 1).squeeze(0), all.narrow(0, 1, 1).squeeze(0)))
    }

    /// The attention mask of `queries` new positions written at `offset`:
    /// bool `[batch, 1, queries, max_len]`, true where query `i` (cache
    /// index `offset + i`) may see key `j`, that is `starts[b] <= j <=
    /// offset + i`. `starts` (i64 `[batch]`) is where each row's sequence
    /// begins (its left padding).
    pub fn visible(&self, offset: &Tensor, queries: usize, starts: &Tensor) -> Tensor {
        let (b, n) = (self.batch, self.max_len);
        let ctx = &self.ctx;
        let keys = ctx.arange(0i64, n as i64, 1).reshape([1, 1, 1, n]);
        let at = (ctx.arange(0i64, queries as i64, 1) + offset).reshape([1, 1, queries, 1]);
        let first = starts.reshape([b, 1, 1, 1]);
        // `minimum` of two bools is their `and`.
        keys.le(&at).minimum(keys.ge(&first))
    }

    /// Position ids `[batch, queries]` (i64) of `queries` new tokens
    /// written at `offset`: each row counts from its own start, as
    /// Hugging Face derives positions from an attention mask (padding
    /// gets position 0).
    pub fn positions(&self, offset: &Tensor, queries: usize, starts: &Tensor) -> Tensor {
        let at = (self.ctx.arange(0i64, queries as i64, 1) + offset).reshape([1, queries]);
        (at - starts.reshape([self.batch, 1])).maximum(0i64)
    }
}
