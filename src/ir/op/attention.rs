//! The settings of the attention ops ([`super::Op::Attention`] and its
//! gradient's): the mask operand's kind, the result's layout, which
//! gradient a node computes. Apart from `op.rs` because only the
//! attention ops and their passes read them.

/// What the optional fourth operand of an [`Op::Attention`] node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnMask {
    /// No mask operand.
    None,
    /// A float mask of the query's dtype, added to the scaled scores
    /// (`-inf` or a large negative value removes a key).
    Additive,
    /// A bool mask: `true` keeps the key, `false` removes it (PyTorch's
    /// boolean `attn_mask`).
    Keep,
}

impl AttnMask {
    /// The text IR's word for it (`mask=additive`).
    pub fn name(self) -> &'static str {
        match self {
            AttnMask::None => "none",
            AttnMask::Additive => "additive",
            AttnMask::Keep => "bool",
        }
    }
}

/// How an [`Op::Attention`] node lays out its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnLayout {
    /// `[b, h, sq, dv]`: each head's rows together, as the operands are
    /// (PyTorch's `scaled_dot_product_attention`).
    #[default]
    Bhsd,
    /// `[b, sq, h, dv]`: each query row's heads side by side, the order a
    /// model merges them in (`o.permute(0, 2, 1, 3).reshape(b, sq, h *
    /// dv)`), so the merge is a free reshape instead of a copy. Made by
    /// the `attention-layout` pass from such a permute; never recorded.
    Bshd,
}

impl AttnLayout {
    /// The text IR's word for it (`layout=bshd`; `bhsd` is not printed).
    pub fn name(self) -> &'static str {
        match self {
            AttnLayout::Bhsd => "bhsd",
            AttnLayout::Bshd => "bshd",
        }
    }
}

/// Which gradient an [`Op::AttentionGrad`] node computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttnWrt {
    /// The queries' gradient, `[b, h, sq, d]`.
    Query,
    /// The keys' and values' gradients side by side, `[b, h, sk, d + dv]`
    /// (the keys' in columns `0..d`): one kernel computes both, since
    /// both need the same probabilities.
    KeyValue,
    /// All three, laid out as a fused QKV projection's rows are:
    /// `[b, s, 3, h, d]`, the queries' heads, then the keys', then the
    /// values' (`s = sq = sk`, `d = dv`). The gradient of such a
    /// projection's output is this layout; computed as `q` and `kv` and
    /// then joined, a `cat` kernel copied both (GPT-2 small: 0.15 ms of a
    /// bf16 step on an H200). The `multi-output` pass makes that `cat`
    /// this node (`passes/multi_output/qkv.rs`), whose kernels write each
    /// gradient into its place.
    QueryKeyValue,
    /// The keys' and values' gradients (`[b, h, sk, d + dv]`, as
    /// [`AttnWrt::KeyValue`]), and the queries' as the node's `extra
    /// output=1` (`[b, h, sq, d]`). The `multi-output` pass makes a `q`
    /// and a `kv` node of one attention this one
    /// (`passes/multi_output/attention_pair.rs`): the `kv` kernel computes
    /// every score gradient `dS` that `dq = dS k` needs, so the queries'
    /// kernel can read them instead of computing `S`, `P` and `dP` again
    /// (three products of its four).
    KeyValueAndQuery,
}

impl AttnWrt {
    /// The text IR's word for it (`wrt=q`).
    pub fn name(self) -> &'static str {
        match self {
            AttnWrt::Query => "q",
            AttnWrt::KeyValue => "kv",
            AttnWrt::QueryKeyValue => "qkv",
            AttnWrt::KeyValueAndQuery => "kv+q",
        }
    }
}
