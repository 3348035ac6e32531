//! The operations a node can perform.
//!
//! Elementwise operations (`Unary`, `Binary`, `Compare`, `Where`) take
//! operands of exactly the node's shape: broadcasting is always an explicit
//! `Expand`, so backends and passes never re-derive broadcast rules. The
//! user API inserts those expands.

use super::{DType, FusedBody, Scalar, Shape};
use std::sync::Arc;

mod attention;
mod collective;
pub use attention::{AttnLayout, AttnMask, AttnWrt};
pub use collective::Collective;

/// Identifies a realized buffer owned by a `Context`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// Elementwise functions of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// The exact (erf) form, PyTorch's default.
    Gelu,
    /// The tanh approximation, `0.5 x (1 + tanh(√(2/π) (x + 0.044715
    /// x³)))`: PyTorch's `gelu(approximate="tanh")`, GPT-2's `gelu_new`
    /// (its own op, not the formula in elementwise ops, so cuBLASLt's GELU
    /// epilogue, which computes it, can finish a GEMM with it).
    GeluTanh,
    Silu,
}

/// Elementwise functions of two operands of one dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    /// NaN-propagating, as `torch.maximum`.
    Maximum,
    /// NaN-propagating, as `torch.minimum`.
    Minimum,
    /// `g · gelu'(x)` for operands x, g (floats only): the tanh GELU's
    /// gradient as one op, computed as PyTorch's `gelu_backward` computes
    /// it (in f32 for f16/bf16, rounded once). Autodiff records it rather
    /// than the derivative's dozen ops, which under autocast each ran in
    /// bf16 and rounded (see `passes/autodiff/rules.rs`).
    GeluTanhGrad,
    /// `g · gelu'(x)` of the erf GELU, as [`BinaryOp::GeluTanhGrad`].
    GeluGrad,
    /// `g · silu'(x)`, as [`BinaryOp::GeluTanhGrad`].
    SiluGrad,
}

impl BinaryOp {
    /// True for the activation gradients, which are defined on floats only.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::GeluTanhGrad | BinaryOp::GeluGrad | BinaryOp::SiluGrad)
    }
}

/// Elementwise comparisons; the result is `bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Reductions over a set of dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum, in the input dtype (integers wrap).
    Sum,
    /// Arithmetic mean; float dtypes only.
    Mean,
    /// Maximum; NaN wins.
    Max,
    /// Minimum; NaN wins.
    Min,
    /// Index (`i64`) of the first maximum along exactly one dimension.
    ArgMax,
}

/// The distribution of a `Random` node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Distribution {
    /// Uniform on `[0, 1)`.
    Uniform,
    /// Standard normal.
    Normal,
}

/// The kind of a pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Maximum over the window; padding never wins.
    Max,
    /// Mean over the window, padding counted as zeros (`count_include_pad`).
    Avg,
}

/// One operation. Source ops (`Input`, `Buffer`, `Full`, `Arange`,
/// `Random`) take their shape and dtype from the node; every other op's
/// shape and dtype follow from its operands ([`super::infer`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Input slot `k` of a compiled graph: a realized buffer, bound per run.
    Input(u32),
    /// A realized buffer, as it appears in a context's recording graph.
    /// Extraction turns these into `Input`s, so plans never contain one.
    Buffer(BufferId),
    /// Every element equal to the value.
    Full(Scalar),
    /// `start, start + step, ...`, as many as the (1-D) node shape holds.
    Arange {
        /// First value.
        start: Scalar,
        /// Increment.
        step: Scalar,
    },
    /// Counter-based random numbers. `stream` selects the random stream: in
    /// a context graph it is the context's per-node counter, in a compiled
    /// graph the index into the run's stream table (so one compiled plan
    /// serves every iteration of a loop).
    Random {
        /// The distribution.
        dist: Distribution,
        /// The stream (see above).
        stream: u64,
    },
    /// Same elements, new shape (row-major order). Copies only when the
    /// operand's layout cannot be re-viewed.
    Reshape(Shape),
    /// Reorders dimensions: output dim `i` is operand dim `perm[i]`.
    Permute(Vec<usize>),
    /// Numpy broadcast to the shape (dims of size 1 repeat, new leading dims).
    Expand(Shape),
    /// Elements `start, start + step, ...` of dimension `dim`; the count is
    /// the node's size along `dim`.
    Slice {
        /// The sliced dimension.
        dim: usize,
        /// First index.
        start: usize,
        /// Step between kept indices (>= 1).
        step: usize,
        /// Number of kept indices.
        len: usize,
    },
    /// `f(x)` elementwise.
    Unary(UnaryOp),
    /// `f(a, b)` elementwise.
    Binary(BinaryOp),
    /// `a ? b` elementwise, to `bool`.
    Compare(CompareOp),
    /// `cond ? a : b` elementwise; operands `cond` (bool), `a`, `b`.
    Where,
    /// Converts to the dtype (floats round to nearest, float to int
    /// truncates and saturates, integers wrap, non-zero is `true`).
    Cast(DType),
    /// Reduces the dimensions (sorted, distinct); kept as size 1 if `keepdim`.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// The reduced dimensions.
        dims: Vec<usize>,
        /// Whether reduced dimensions stay as size 1.
        keepdim: bool,
        /// The result's dtype when it is wider than the operand's (a
        /// `sum` or `mean` of f16/bf16 values into f32, or of f32 into
        /// f64); `None` for the operand's. Printed `into=f32`. The
        /// elements are widened as they are read, so the result is
        /// bit for bit `sum(cast(x))`; fusion's `wide_sum.rs` makes
        /// these from autocast's f32 column sums of bf16 gradients, so
        /// that nothing writes the widened copy.
        into: Option<DType>,
    },
    /// `[.., m, k] x [.., k, n] -> [.., m, n]`, batch dimensions equal.
    MatMul,
    /// NCHW input, OIHW weight (`I = C / groups`), no bias.
    Conv2d {
        /// Stride (height, width).
        stride: [usize; 2],
        /// Zero padding on each side (height, width).
        padding: [usize; 2],
        /// Dilation (height, width).
        dilation: [usize; 2],
        /// Channel groups.
        groups: usize,
    },
    /// Pooling over NCHW windows.
    Pool2d {
        /// Max or average.
        kind: PoolKind,
        /// Window (height, width).
        kernel: [usize; 2],
        /// Stride (height, width).
        stride: [usize; 2],
        /// Padding on each side (height, width).
        padding: [usize; 2],
    },
    /// The input gradient of a max pooling: operands x (the pooling's
    /// NCHW input) and g (the gradient of its result, `[n, c, oh, ow]`);
    /// the result has x's shape and dtype. Each window's gradient goes to
    /// the window's maximum, found again from x as the forward found it:
    /// the first of tied maxima, the last NaN of a window holding any
    /// (PyTorch's kernels update the index on every NaN), the window's
    /// first element inside the input when every element is `-inf`;
    /// overlapping windows add. PyTorch's
    /// `max_pool2d_with_indices_backward` without the indices. Autodiff
    /// records it for [`Op::Pool2d`] of [`PoolKind::Max`]: one pass over
    /// the gradient, where the rule written with views, selects and joins
    /// ran `kernel²` of each (the digits CNN's 32 `cat` nodes a step).
    MaxPool2dGrad {
        /// Window (height, width), as the forward's.
        kernel: [usize; 2],
        /// Stride (height, width), as the forward's.
        stride: [usize; 2],
        /// Padding on each side (height, width), as the forward's.
        padding: [usize; 2],
    },
    /// `torch.gather(input, dim, index)`: operands input, index (i64/i32,
    /// same rank); the result has the index's shape.
    Gather {
        /// The indexed dimension.
        dim: usize,
    },
    /// `torch.index_select(input, dim, index)`: operands input, 1-D index.
    IndexSelect {
        /// The indexed dimension.
        dim: usize,
    },
    /// `torch.index_add(x, dim, index, src)`: operands x, 1-D index (i64
    /// or i32), src (x's shape with `dim` resized to the index's length);
    /// the result is `x` with `src[.., i, ..]` added at `index[i]` along
    /// `dim`, in index order. The scatter-add that `index_select`'s
    /// gradient (an embedding's) is.
    IndexAdd {
        /// The indexed dimension.
        dim: usize,
    },
    /// Scaled dot-product attention over `[batch, heads, seq, dim]`:
    /// operands q `[b, h, sq, d]`, k `[b, h, sk, d]`, v `[b, h, sk, dv]`
    /// and, unless `mask` is `None`, a mask of shape `[b, h, sq, sk]`
    /// (usually an expand of a `[b, 1, 1, sk]` key-padding mask). The
    /// result `[b, h, sq, dv]` is `softmax(scale * q kᵀ + mask) v`, one
    /// node so that backends run it as one kernel that never stores the
    /// `[sq, sk]` scores (see `crate::attention`). A query row whose keys
    /// are all removed gives zeros. With `layout` [`AttnLayout::Bshd`]
    /// the result is `[b, sq, h, dv]`, the same values permuted.
    Attention {
        /// The factor on `q kᵀ` (usually `1 / sqrt(d)`).
        scale: f64,
        /// Also remove key `j > i` from query row `i` (top-left aligned,
        /// as PyTorch's `is_causal`).
        causal: bool,
        /// What the fourth operand is, if any.
        mask: AttnMask,
        /// The result's order of dims.
        layout: AttnLayout,
    },
    /// The two per-row numbers the attention backward needs, as
    /// `[b, h, sq, 2]` in the type attention accumulates in (f64 for f64
    /// queries, f32 for the others): the log-sum-exp `lse = ln Σ_j e^(scale q·k_j +
    /// mask)` over the keys row `i` keeps (`+inf` for a row that keeps
    /// none, so that its probabilities `e^(s - lse)` are 0), and `delta =
    /// Σ_c o[c] g[c]`, the row's output dotted with its gradient.
    /// Operands q, k, o (the attention's output), g (its gradient) and the
    /// mask as in [`Op::Attention`]. Autodiff records it for the
    /// attention's gradient; see `passes/autodiff/attention.rs`.
    AttentionStats {
        /// As the forward's.
        scale: f64,
        /// As the forward's.
        causal: bool,
        /// As the forward's.
        mask: AttnMask,
    },
    /// [`Op::AttentionStats`] of an attention whose forward already wrote
    /// its rows' log-sum-exp: operands o (the attention's output `[b, h,
    /// sq, dv]`), g (its gradient, o's type) and lse (`[b, h, sq]`, the
    /// forward's `extra %attention output=1`, in the stats' type). The
    /// result is the same `[b, h, sq, 2]` of (lse, `Σ_c o[c] g[c]`): the
    /// stats kernel would have recomputed every score to find the `lse`
    /// the forward had in hand, so the multi-output pass has the forward
    /// write it and the backward read it (FlashAttention's split).
    AttentionDelta,
    /// A gradient of [`Op::Attention`] without the `[sq, sk]` matrices:
    /// operands q, k, v, g (the output's gradient), the
    /// [`Op::AttentionStats`] of the same attention, and the mask as in
    /// [`Op::Attention`]. With `P = e^(scale q kᵀ + mask - lse)`, `dP = g
    /// vᵀ` and `dS = P ⊙ (dP - delta)`: `dq = scale dS k`, `dk = scale dSᵀ
    /// q`, `dv = Pᵀ g`, in the dtype of q (see [`AttnWrt`] for the shape).
    AttentionGrad {
        /// As the forward's.
        scale: f64,
        /// As the forward's.
        causal: bool,
        /// As the forward's.
        mask: AttnMask,
        /// Which gradient.
        wrt: AttnWrt,
    },
    /// `x` with `value` written over the window that starts at a runtime
    /// offset along `dim` (XLA's `dynamic_update_slice` on one dim):
    /// operands x, value (x's shape except along `dim`, where it is no
    /// longer than x), offset (a 0-d i64 or i32 tensor). The offset is
    /// clamped to `0..=x.size(dim) - value.size(dim)`, so the window is
    /// always inside `x` (as XLA clamps; the tensor API checks a host
    /// offset before recording). The value is pure like every node's:
    /// backends copy `x` and write the window over the copy. (Writing in
    /// place of `x` when `x` is a donated input nothing else reads, which
    /// would save a KV cache that copy, is not done yet.)
    WriteAt {
        /// The dimension the window moves along.
        dim: usize,
    },
    /// `assign %old, %value`: the value of `%value`, a variable's new value
    /// that a run may write over the bytes of `%old`, the value the
    /// variable held (recorded by `Variable::assign` when that was a
    /// realized buffer). No backend runs it: the `assign` pass replaces it
    /// by `%value`, marking a fused elementwise value that reads `%old` so
    /// that the memory pass may place it over `%old`'s input
    /// ([`super::FusedBody::over`]). XLA calls this an input/output alias.
    Assign,
    /// Concatenation of two or more operands along `dim`.
    Cat {
        /// The joined dimension.
        dim: usize,
    },
    /// A body of ops run as one kernel (see [`super::fused`]); operand `k`
    /// is the body's `input k`.
    Fused(Arc<FusedBody>),
    /// `extra %f output=j`: output `j` (at least 1) of node `%f`, which
    /// writes several: a fused node whose body has several outputs
    /// ([`FusedBody::outputs`]), or an attention, whose output 1 is its
    /// rows' log-sum-exp (read by [`Op::AttentionDelta`]). `%f`'s kernel
    /// writes it; no backend runs anything for it. Its type is declared
    /// on the node and checked by the verifier ([`super::extra_type`]).
    /// XLA calls this a get-tuple-element of a multi-output fusion.
    Extra {
        /// The body output this node is.
        output: usize,
    },
    /// A collective across the ranks of the context's process group; the
    /// result has the operand's dtype, and its shape (a reduce-scatter's
    /// and an all-gather's dim 0 divided or multiplied by the group size). An effect ([`Op::is_effect`]):
    /// never merged, dropped, folded, fused or moved across another
    /// collective, since its value depends on other ranks and every rank
    /// must run the same ones in the same order.
    Collective {
        /// Which collective.
        what: Collective,
        /// Its place in the recorded program: collectives run in ascending
        /// `seq` order, and two collectives of one graph never share one
        /// (so two with equal operands are still two). A context numbers
        /// them as it records them; extraction renumbers a plan's from 0.
        seq: u64,
    },
}

impl Op {
    /// The mnemonic the text IR prints (`add`, `matmul`, `max_pool2d`).
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Input(_) => "input",
            Op::Buffer(_) => "buffer",
            Op::Full(_) => "full",
            Op::Arange { .. } => "arange",
            Op::Random { dist: Distribution::Uniform, .. } => "rand",
            Op::Random { dist: Distribution::Normal, .. } => "randn",
            Op::Reshape(_) => "reshape",
            Op::Permute(_) => "permute",
            Op::Expand(_) => "expand",
            Op::Slice { .. } => "slice",
            Op::Unary(u) => u.mnemonic(),
            Op::Binary(b) => b.mnemonic(),
            Op::Compare(c) => c.mnemonic(),
            Op::Where => "where",
            Op::Cast(_) => "cast",
            Op::Reduce { op, .. } => op.mnemonic(),
            Op::MatMul => "matmul",
            Op::Conv2d { .. } => "conv2d",
            Op::Pool2d { kind: PoolKind::Max, .. } => "max_pool2d",
            Op::Pool2d { kind: PoolKind::Avg, .. } => "avg_pool2d",
            Op::MaxPool2dGrad { .. } => "max_pool2d_grad",
            Op::Gather { .. } => "gather",
            Op::IndexSelect { .. } => "index_select",
            Op::IndexAdd { .. } => "index_add",
            Op::WriteAt { .. } => "write_at",
            Op::Assign => "assign",
            Op::Attention { .. } => "attention",
            Op::AttentionStats { .. } => "attention_stats",
            Op::AttentionDelta => "attention_delta",
            Op::AttentionGrad { .. } => "attention_grad",
            Op::Cat { .. } => "cat",
            Op::Fused(_) => "fused",
            Op::Extra { .. } => "extra",
            Op::Collective { what, .. } => what.mnemonic(),
        }
    }

    /// True for ops with no operands whose type is declared on the node.
    pub fn is_source(&self) -> bool {
        matches!(self, Op::Input(_) | Op::Buffer(_) | Op::Full(_) | Op::Arange { .. } | Op::Random { .. })
    }

    /// True for ops that only re-index their operand (no arithmetic): a
    /// backend may answer them with a new layout over the same bytes.
    pub fn is_view(&self) -> bool {
        matches!(self, Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. })
    }

    /// True for elementwise ops (one output element per input position).
    pub fn is_elementwise(&self) -> bool {
        matches!(self, Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Where | Op::Cast(_))
    }

    /// True for collectives (their value depends on other ranks).
    pub fn is_collective(&self) -> bool {
        matches!(self, Op::Collective { .. })
    }

    /// True for effects: ops whose running is observable beyond their
    /// value (today the collectives: the other ranks wait for them). A
    /// graph runs every effect it holds, used or not, once, in ascending
    /// [`Op::effect_seq`] order; no pass merges, drops or reorders them
    /// (see [`super::Graph::effects`]).
    pub fn is_effect(&self) -> bool {
        self.is_collective()
    }

    /// An effect's sequence number (`None` for every other op).
    pub fn effect_seq(&self) -> Option<u64> {
        match self {
            Op::Collective { seq, .. } => Some(*seq),
            _ => None,
        }
    }

    /// The number of operands the op takes; `None` for `Cat` (two or more).
    pub fn arity(&self) -> Option<usize> {
        Some(match self {
            Op::Input(_) | Op::Buffer(_) | Op::Full(_) | Op::Arange { .. } | Op::Random { .. } => 0,
            Op::Reshape(_)
            | Op::Permute(_)
            | Op::Expand(_)
            | Op::Slice { .. }
            | Op::Unary(_)
            | Op::Cast(_)
            | Op::Reduce { .. }
            | Op::Pool2d { .. }
            | Op::Extra { .. }
            | Op::Collective { .. } => 1,
            Op::Binary(_)
            | Op::Compare(_)
            | Op::MatMul
            | Op::Conv2d { .. }
            | Op::MaxPool2dGrad { .. }
            | Op::Gather { .. }
            | Op::IndexSelect { .. }
            | Op::Assign => 2,
            Op::Where | Op::IndexAdd { .. } | Op::WriteAt { .. } | Op::AttentionDelta => 3,
            Op::Attention { mask: AttnMask::None, .. } => 3,
            Op::Attention { .. } => 4,
            Op::AttentionStats { mask: AttnMask::None, .. } => 4,
            Op::AttentionStats { .. } => 5,
            Op::AttentionGrad { mask: AttnMask::None, .. } => 5,
            Op::AttentionGrad { .. } => 6,
            Op::Fused(body) => body.inputs(),
            Op::Cat { .. } => return None,
        })
    }
}

macro_rules! mnemonics {
    ($ty:ident { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];
            /// The text IR mnemonic.
            pub fn mnemonic(self) -> &'static str {
                match self { $($ty::$variant => $name),* }
            }
        }
    };
}

mnemonics!(UnaryOp {
    Neg => "neg", Abs => "abs", Exp => "exp", Log => "log", Sqrt => "sqrt", Rsqrt => "rsqrt",
    Recip => "recip", Sin => "sin", Cos => "cos", Tanh => "tanh", Sigmoid => "sigmoid",
    Relu => "relu", Gelu => "gelu", GeluTanh => "gelu_tanh", Silu => "silu",
});
mnemonics!(BinaryOp {
    Add => "add", Sub => "sub", Mul => "mul", Div => "div", Pow => "pow",
    Maximum => "maximum", Minimum => "minimum", GeluTanhGrad => "gelu_tanh_grad", GeluGrad => "gelu_grad",
    SiluGrad => "silu_grad",
});
mnemonics!(CompareOp { Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge" });
mnemonics!(ReduceOp { Sum => "sum", Mean => "mean", Max => "max", Min => "min", ArgMax => "argmax" });

impl UnaryOp {
    /// True if the op is defined on integer dtypes too (the rest need floats).
    pub fn allows_int(self) -> bool {
        matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu)
    }
}
