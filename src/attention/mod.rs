//! Attention: `softmax(scale · q kᵀ + mask) v` as one op.
//!
//! [`Tensor::scaled_dot_product_attention`] records a single
//! [`Op::Attention`] node over `[batch, heads, seq, dim]` tensors (PyTorch's
//! `F.scaled_dot_product_attention`), with an optional mask (bool: `true`
//! keeps a key; float: added to the scores) and an optional causal mask.
//! Being one node is the point: the fusion pass leaves it alone (the
//! projections around it stay matmuls for the GEMM library), and each
//! backend runs it as one kernel that streams keys and values in blocks
//! and keeps a running softmax, so the `[sq, sk]` score matrix is never
//! stored:
//!
//! - CPU (`backends/cpu/attention.rs`): blocks of 16 query rows × 64
//!   keys, rayon over (batch, head, query block).
//! - CUDA (`backends/cuda/codegen/attention.rs`): one generated
//!   flash-style kernel per shape, K/V tiles through shared memory.
//!
//! Both accumulate in f32 for f16, bf16 and f32 (f64 in f64), use the
//! online softmax (running maximum, rescaled running sum), and give zeros
//! for a query row whose keys are all removed. The gradient
//! (`passes/autodiff/attention.rs`) is three more nodes that never store
//! the scores either: each query row's log-sum-exp, then `dq` and `dk, dv`
//! (FlashAttention-2's backward; on CUDA tensor-core kernels for f16 and
//! bf16, `backends/cuda/codegen/attention_grad.rs`).
//!
//! ```
//! use kiln::prelude::*;
//! let ctx = Context::cpu().with_seed(0);
//! let (q, k, v) = (ctx.randn([2, 4, 8, 16]), ctx.randn([2, 4, 8, 16]), ctx.randn([2, 4, 8, 16]));
//! let out = q.scaled_dot_product_attention(&k, &v, None, true, None);
//! assert_eq!(out.shape(), &[2, 4, 8, 16]);
//! // The first query of a causal attention sees only the first key.
//! let first = out.narrow(2, 0, 1).to_vec::<f32>()?;
//! assert_eq!(first, v.narrow(2, 0, 1).to_vec::<f32>()?);
//! # Ok::<(), kiln::Error>(())
//! ```

use crate::ir::{AttnMask, DType, Op, Shape};

/// The largest head dim the fused attention-gradient kernels take.
pub const MAX_FUSED_GRAD_HEAD_DIM: usize = 128;

/// Whether an attention's gradient runs fused (the `attention_stats` and
/// `attention_grad` nodes kept, on CUDA as tensor-core kernels) for
/// queries of `dtype` and head dims `d` (queries, keys) and `dv`
/// (values): f16 or bf16, both multiples of 16 from 16 to
/// [`MAX_FUSED_GRAD_HEAD_DIM`]. The `attention-grad` pass expands every
/// other one; the CUDA backend refuses them.
pub fn fused_grad_takes(dtype: DType, d: usize, dv: usize) -> bool {
    let fits = |n: usize| n % 16 == 0 && (16..=MAX_FUSED_GRAD_HEAD_DIM).contains(&n);
    matches!(dtype, DType::F16 | DType::BF16) && fits(d) && fits(dv)
}
use crate::{Error, Location, Tensor};

impl Tensor {
    /// Scaled dot-product attention of queries `self` `[b, h, sq, d]` over
    /// keys `[b, h, sk, d]` and values `[b, h, sk, dv]`, giving
    /// `[b, h, sq, dv]` (PyTorch's `F.scaled_dot_product_attention`).
    ///
    /// - `mask` broadcasts to `[b, h, sq, sk]` (numpy rules, so a
    ///   key-padding mask is `[b, 1, 1, sk]`: see [`key_padding_mask`]).
    ///   A bool mask keeps the keys where it is `true`; a float mask (the
    ///   queries' dtype) is added to the scaled scores.
    /// - `causal` also removes key `j > i` from query `i`.
    /// - `scale` defaults to `1 / sqrt(d)`.
    ///
    /// A query whose keys are all removed gives zeros (PyTorch's math
    /// backend gives NaN there).
    ///
    /// NaN and inf propagate as in PyTorch: a NaN in query row `i` makes
    /// output row `i` NaN; a NaN in key `j` makes every row that keeps key
    /// `j` NaN (a bool or causal mask that removes it replaces its score;
    /// an additive mask adds to it, so `NaN + -inf` is still NaN); a NaN
    /// in value `j` makes every row that keeps key `j` NaN; a `+inf` score
    /// makes its row NaN (`e^(inf - inf)`); a score of `-inf` from the
    /// data weighs 0. Whether a NaN or inf value of a *removed* key
    /// reaches the row is not specified (PyTorch's backends differ too).
    #[track_caller]
    pub fn scaled_dot_product_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
        scale: Option<f64>,
    ) -> Tensor {
        let location = Location::caller();
        let op = "scaled_dot_product_attention";
        for t in [self, key, value].into_iter().chain(mask) {
            if t.error().is_some() {
                return t.clone();
            }
        }
        let fail = |message: String| Tensor::failed(Error::Shape { op, message, location });
        if self.rank() != 4 || key.rank() != 4 || value.rank() != 4 {
            return fail(format!(
                "attention takes [batch, heads, seq, dim] queries, keys and values, got {}, {} and {}",
                self.shape_ir(),
                key.shape_ir(),
                value.shape_ir()
            ));
        }
        let d = self.shape()[3];
        let scale = scale.unwrap_or(1.0 / (d.max(1) as f64).sqrt());
        if !scale.is_finite() {
            return fail(format!("the attention scale must be finite, got {scale}"));
        }
        let (b, h, sq, sk) = (self.shape()[0], self.shape()[1], self.shape()[2], key.shape()[2]);
        let full = Shape::new([b, h, sq, sk]);
        let (kind, mask) = match mask {
            None => (AttnMask::None, None),
            Some(m) => {
                let kind = if m.dtype() == DType::Bool { AttnMask::Keep } else { AttnMask::Additive };
                if !m.shape_ir().broadcasts_to(&full) {
                    return fail(format!(
                        "the attention mask {} does not broadcast to [batch, heads, queries, keys] = {full}; a key-padding mask of [batch, keys] is reshaped to [batch, 1, 1, keys] (kiln::attention::key_padding_mask)",
                        m.shape_ir()
                    ));
                }
                (kind, Some(m.broadcast_at(full, location)))
            }
        };
        let op = Op::Attention { scale, causal, mask: kind, layout: crate::ir::AttnLayout::Bhsd };
        match &mask {
            Some(m) => Tensor::record(&[self, key, value, m], op, None, location),
            None => Tensor::record(&[self, key, value], op, None, location),
        }
    }
}

/// A `[batch, keys]` attention mask as tokenizers give it (1 or `true`
/// for a real token, 0 or `false` for padding, any numeric or bool dtype)
/// as the bool `[batch, 1, 1, keys]` mask
/// [`Tensor::scaled_dot_product_attention`] broadcasts over heads and
/// queries.
#[track_caller]
pub fn key_padding_mask(mask: &Tensor) -> Tensor {
    let location = Location::caller();
    if mask.error().is_some() {
        return mask.clone();
    }
    if mask.rank() != 2 {
        return Tensor::failed(Error::Shape {
            op: "key_padding_mask",
            message: format!("a key-padding mask is [batch, keys], got {}", mask.shape_ir()),
            location,
        });
    }
    let (b, s) = (mask.shape()[0], mask.shape()[1]);
    let keep = if mask.dtype() == DType::Bool {
        mask.clone()
    } else {
        mask.compare_at(
            crate::tensor::Operand::Scalar(crate::ir::Scalar::Int(0)),
            crate::ir::CompareOp::Ne,
            location,
        )
    };
    keep.reshape_at(Shape::new([b, 1, 1, s]), location)
}
