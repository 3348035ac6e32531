//! The e-graph language of the simplify pass and the analysis that types
//! its e-classes.
//!
//! An [`ENode`] is one kiln op with every attribute in it ([`OpKey`]:
//! permutations, shapes, dims, the target dtype, scalar values by their
//! bits), its output shape and dtype, and its operands' e-classes in slot
//! order. Two e-nodes are equal only when all of that is, so e-nodes with
//! different attributes never merge. The type of a non-source node follows
//! from its op and operands; it is stored anyway so the analysis never
//! re-infers it, and since it is a function of the rest it never splits
//! an e-class.

use crate::ir::{
    infer, AttnLayout, AttnMask, AttnWrt, BinaryOp, BufferId, Collective, CompareOp, DType, Distribution, Op,
    PoolKind, ReduceOp, Scalar, Shape, UnaryOp,
};
use egg::{Analysis, DidMerge, EGraph, Id, Language};

/// The e-graph the pass saturates.
pub type SGraph = EGraph<ENode, Types>;

/// A scalar by its bits: `Scalar` is only `PartialEq` (floats), this is
/// `Eq + Ord + Hash`. `0.0` and `-0.0` differ; NaNs are equal only with the
/// same payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScalarBits(u8, u64);

impl ScalarBits {
    /// The bits of a scalar.
    pub fn of(s: Scalar) -> ScalarBits {
        let (tag, bits) = s.hash_bits();
        ScalarBits(tag, bits)
    }

    /// The scalar back, bit for bit.
    pub fn scalar(self) -> Scalar {
        match self.0 {
            0 => Scalar::Float(f64::from_bits(self.1)),
            1 => Scalar::Int(self.1 as i64),
            _ => Scalar::Bool(self.1 != 0),
        }
    }
}

/// [`Op`] with scalars keyed by their bits, so it can be hashed and
/// ordered. Converts to and from `Op` without loss.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum OpKey {
    Input(u32),
    Buffer(BufferId),
    Full(ScalarBits),
    Arange {
        start: ScalarBits,
        step: ScalarBits,
    },
    Random {
        dist: Distribution,
        stream: u64,
    },
    Reshape(Shape),
    Permute(Vec<usize>),
    Expand(Shape),
    Slice {
        dim: usize,
        start: usize,
        step: usize,
        len: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    Where,
    Cast(DType),
    Reduce {
        op: ReduceOp,
        dims: Vec<usize>,
        keepdim: bool,
        into: Option<DType>,
    },
    MatMul,
    Conv2d {
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    },
    Pool2d {
        kind: PoolKind,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    MaxPool2dGrad {
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    Gather {
        dim: usize,
    },
    IndexSelect {
        dim: usize,
    },
    IndexAdd {
        dim: usize,
    },
    WriteAt {
        dim: usize,
    },
    Assign,
    AttentionDelta,
    Extra {
        output: usize,
    },
    /// The scale keyed by its bits.
    Attention {
        scale: u64,
        causal: bool,
        mask: AttnMask,
        layout: AttnLayout,
    },
    AttentionStats {
        scale: u64,
        causal: bool,
        mask: AttnMask,
    },
    AttentionGrad {
        scale: u64,
        causal: bool,
        mask: AttnMask,
        wrt: AttnWrt,
    },
    Cat {
        dim: usize,
    },
    Fused(FusedKey),
    Collective(Collective, u64),
}

/// A fused body keyed by its printed text (simplify runs before fusion,
/// but a hand-written graph may already hold fused nodes: they are opaque
/// e-nodes, never rewritten inside).
#[derive(Clone, Debug)]
pub struct FusedKey(std::sync::Arc<crate::ir::FusedBody>, String);

impl PartialEq for FusedKey {
    fn eq(&self, other: &FusedKey) -> bool {
        self.1 == other.1
    }
}
impl Eq for FusedKey {}
impl std::hash::Hash for FusedKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.1.hash(h)
    }
}
impl PartialOrd for FusedKey {
    fn partial_cmp(&self, other: &FusedKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for FusedKey {
    fn cmp(&self, other: &FusedKey) -> std::cmp::Ordering {
        self.1.cmp(&other.1)
    }
}

impl From<&Op> for OpKey {
    fn from(op: &Op) -> OpKey {
        match op {
            Op::Input(k) => OpKey::Input(*k),
            Op::Buffer(b) => OpKey::Buffer(*b),
            Op::Full(v) => OpKey::Full(ScalarBits::of(*v)),
            Op::Arange { start, step } => {
                OpKey::Arange { start: ScalarBits::of(*start), step: ScalarBits::of(*step) }
            }
            Op::Random { dist, stream } => OpKey::Random { dist: *dist, stream: *stream },
            Op::Reshape(s) => OpKey::Reshape(s.clone()),
            Op::Permute(p) => OpKey::Permute(p.clone()),
            Op::Expand(s) => OpKey::Expand(s.clone()),
            Op::Slice { dim, start, step, len } => {
                OpKey::Slice { dim: *dim, start: *start, step: *step, len: *len }
            }
            Op::Unary(u) => OpKey::Unary(*u),
            Op::Binary(b) => OpKey::Binary(*b),
            Op::Compare(c) => OpKey::Compare(*c),
            Op::Where => OpKey::Where,
            Op::Cast(d) => OpKey::Cast(*d),
            Op::Reduce { op, dims, keepdim, into } => {
                OpKey::Reduce { op: *op, dims: dims.clone(), keepdim: *keepdim, into: *into }
            }
            Op::MatMul => OpKey::MatMul,
            Op::Conv2d { stride, padding, dilation, groups } => {
                OpKey::Conv2d { stride: *stride, padding: *padding, dilation: *dilation, groups: *groups }
            }
            Op::Pool2d { kind, kernel, stride, padding } => {
                OpKey::Pool2d { kind: *kind, kernel: *kernel, stride: *stride, padding: *padding }
            }
            Op::MaxPool2dGrad { kernel, stride, padding } => {
                OpKey::MaxPool2dGrad { kernel: *kernel, stride: *stride, padding: *padding }
            }
            Op::Gather { dim } => OpKey::Gather { dim: *dim },
            Op::IndexSelect { dim } => OpKey::IndexSelect { dim: *dim },
            Op::IndexAdd { dim } => OpKey::IndexAdd { dim: *dim },
            Op::WriteAt { dim } => OpKey::WriteAt { dim: *dim },
            Op::Assign => OpKey::Assign,
            Op::AttentionDelta => OpKey::AttentionDelta,
            Op::Extra { output } => OpKey::Extra { output: *output },
            Op::Attention { scale, causal, mask, layout } => {
                OpKey::Attention { scale: scale.to_bits(), causal: *causal, mask: *mask, layout: *layout }
            }
            Op::AttentionStats { scale, causal, mask } => {
                OpKey::AttentionStats { scale: scale.to_bits(), causal: *causal, mask: *mask }
            }
            Op::AttentionGrad { scale, causal, mask, wrt } => {
                OpKey::AttentionGrad { scale: scale.to_bits(), causal: *causal, mask: *mask, wrt: *wrt }
            }
            Op::Cat { dim } => OpKey::Cat { dim: *dim },
            Op::Fused(body) => OpKey::Fused(FusedKey(body.clone(), body.to_string())),
            Op::Collective { what, seq } => OpKey::Collective(*what, *seq),
        }
    }
}

impl OpKey {
    /// The op, scalars restored bit for bit.
    pub fn to_op(&self) -> Op {
        match self {
            OpKey::Input(k) => Op::Input(*k),
            OpKey::Buffer(b) => Op::Buffer(*b),
            OpKey::Full(v) => Op::Full(v.scalar()),
            OpKey::Arange { start, step } => Op::Arange { start: start.scalar(), step: step.scalar() },
            OpKey::Random { dist, stream } => Op::Random { dist: *dist, stream: *stream },
            OpKey::Reshape(s) => Op::Reshape(s.clone()),
            OpKey::Permute(p) => Op::Permute(p.clone()),
            OpKey::Expand(s) => Op::Expand(s.clone()),
            OpKey::Slice { dim, start, step, len } => {
                Op::Slice { dim: *dim, start: *start, step: *step, len: *len }
            }
            OpKey::Unary(u) => Op::Unary(*u),
            OpKey::Binary(b) => Op::Binary(*b),
            OpKey::Compare(c) => Op::Compare(*c),
            OpKey::Where => Op::Where,
            OpKey::Cast(d) => Op::Cast(*d),
            OpKey::Reduce { op, dims, keepdim, into } => {
                Op::Reduce { op: *op, dims: dims.clone(), keepdim: *keepdim, into: *into }
            }
            OpKey::MatMul => Op::MatMul,
            OpKey::Conv2d { stride, padding, dilation, groups } => {
                Op::Conv2d { stride: *stride, padding: *padding, dilation: *dilation, groups: *groups }
            }
            OpKey::Pool2d { kind, kernel, stride, padding } => {
                Op::Pool2d { kind: *kind, kernel: *kernel, stride: *stride, padding: *padding }
            }
            OpKey::MaxPool2dGrad { kernel, stride, padding } => {
                Op::MaxPool2dGrad { kernel: *kernel, stride: *stride, padding: *padding }
            }
            OpKey::Fused(key) => Op::Fused(key.0.clone()),
            OpKey::Gather { dim } => Op::Gather { dim: *dim },
            OpKey::IndexSelect { dim } => Op::IndexSelect { dim: *dim },
            OpKey::IndexAdd { dim } => Op::IndexAdd { dim: *dim },
            OpKey::WriteAt { dim } => Op::WriteAt { dim: *dim },
            OpKey::Assign => Op::Assign,
            OpKey::AttentionDelta => Op::AttentionDelta,
            OpKey::Extra { output } => Op::Extra { output: *output },
            OpKey::Attention { scale, causal, mask, layout } => {
                Op::Attention { scale: f64::from_bits(*scale), causal: *causal, mask: *mask, layout: *layout }
            }
            OpKey::AttentionStats { scale, causal, mask } => {
                Op::AttentionStats { scale: f64::from_bits(*scale), causal: *causal, mask: *mask }
            }
            OpKey::AttentionGrad { scale, causal, mask, wrt } => {
                Op::AttentionGrad { scale: f64::from_bits(*scale), causal: *causal, mask: *mask, wrt: *wrt }
            }
            OpKey::Cat { dim } => Op::Cat { dim: *dim },
            OpKey::Collective(what, seq) => Op::Collective { what: *what, seq: *seq },
        }
    }

    /// The coarse kind rules are indexed by (egg's discriminant).
    pub fn kind(&self) -> Kind {
        match self {
            OpKey::Input(_)
            | OpKey::Buffer(_)
            | OpKey::Full(_)
            | OpKey::Arange { .. }
            | OpKey::Random { .. } => Kind::Source,
            OpKey::Reshape(_) => Kind::Reshape,
            OpKey::Permute(_) => Kind::Permute,
            OpKey::Expand(_) => Kind::Expand,
            OpKey::Unary(u) => Kind::Unary(*u),
            OpKey::Binary(b) => Kind::Binary(*b),
            OpKey::Cast(_) => Kind::Cast,
            OpKey::Reduce { op, .. } => Kind::Reduce(*op),
            OpKey::MatMul => Kind::MatMul,
            _ => Kind::Other,
        }
    }
}

/// What a rule looks for at the root of its match: egg indexes e-classes
/// by it, so a rule visits only the e-classes that hold such a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Kind {
    Source,
    Reshape,
    Permute,
    Expand,
    Unary(UnaryOp),
    Binary(BinaryOp),
    Cast,
    Reduce(ReduceOp),
    MatMul,
    /// Every op no rule starts from (slice, compare, where, conv, ...).
    Other,
}

/// One e-node: an op with its attributes, its type and its operands'
/// e-classes in slot order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ENode {
    /// The op and every attribute.
    pub op: OpKey,
    /// The output shape.
    pub shape: Shape,
    /// The output dtype.
    pub dtype: DType,
    /// The operands' e-classes, in slot order.
    pub children: Vec<Id>,
}

impl Language for ENode {
    type Discriminant = Kind;

    fn discriminant(&self) -> Kind {
        self.op.kind()
    }

    fn matches(&self, other: &ENode) -> bool {
        self.op == other.op
            && self.shape == other.shape
            && self.dtype == other.dtype
            && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

/// The analysis: every e-class's type, and its value when it is one known
/// constant everywhere.
#[derive(Clone, Copy, Debug, Default)]
pub struct Types;

/// What the analysis knows about an e-class.
#[derive(Clone, Debug)]
pub struct Data {
    /// The shape every node of the class produces.
    pub shape: Shape,
    /// The dtype every node of the class produces.
    pub dtype: DType,
    /// Set when the class is a `full` or a view of one.
    pub constant: Option<Constant>,
}

/// A class whose every element is one value: a `full`, possibly seen
/// through views (`expand` of a smaller `full` is how the user API spells
/// `x * 2.0`).
#[derive(Clone, Debug)]
pub struct Constant {
    /// The value (of the class's dtype).
    pub value: Scalar,
    /// The shape of the `full` under the views.
    pub base: Shape,
}

impl Analysis<ENode> for Types {
    type Data = Data;

    fn make(egraph: &mut SGraph, enode: &ENode) -> Data {
        let constant = match &enode.op {
            OpKey::Full(v) => Some(Constant { value: v.scalar(), base: enode.shape.clone() }),
            OpKey::Reshape(_) | OpKey::Permute(_) | OpKey::Expand(_) | OpKey::Slice { .. } => {
                enode.children.first().and_then(|&c| egraph[c].data.constant.clone())
            }
            _ => None,
        };
        Data { shape: enode.shape.clone(), dtype: enode.dtype, constant }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        // The type is the same on both sides (every rule keeps it); only
        // the constant can be learnt from the other side.
        match (&a.constant, b.constant) {
            (None, Some(c)) => {
                a.constant = Some(c);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            _ => DidMerge(false, false),
        }
    }
}

/// The right-hand side of a rule: existing e-classes and new nodes over
/// them, built (and type-checked) before anything is added.
#[derive(Clone, Debug)]
pub enum Term {
    /// An existing e-class.
    Class(Id),
    /// A new node.
    Node(Box<ENodeTerm>),
}

/// A new node of a [`Term`], its type already inferred.
#[derive(Clone, Debug)]
pub struct ENodeTerm {
    op: OpKey,
    shape: Shape,
    dtype: DType,
    children: Vec<Term>,
}

impl Term {
    /// The term's type.
    fn ty<'a>(&'a self, g: &'a SGraph) -> (&'a Shape, DType) {
        match self {
            Term::Class(id) => (&g[*id].data.shape, g[*id].data.dtype),
            Term::Node(n) => (&n.shape, n.dtype),
        }
    }

    /// `op` applied to the operands, typed by [`infer`]; `None` when the
    /// op does not accept them (a rule then does not fire).
    pub fn op(g: &SGraph, op: Op, children: Vec<Term>) -> Option<Term> {
        let types: Vec<(&Shape, DType)> = children.iter().map(|c| c.ty(g)).collect();
        let (shape, dtype) = infer(&op, &types).ok()??;
        Some(Term::Node(Box::new(ENodeTerm { op: OpKey::from(&op), shape, dtype, children })))
    }

    /// A `full` of the value (converted to the dtype's carrier).
    pub fn full(value: Scalar, shape: Shape, dtype: DType) -> Term {
        let op = OpKey::Full(ScalarBits::of(value.cast(dtype)));
        Term::Node(Box::new(ENodeTerm { op, shape, dtype, children: Vec::new() }))
    }

    /// Adds the term's new nodes to the e-graph and returns its e-class.
    pub fn add(self, g: &mut SGraph) -> Id {
        match self {
            Term::Class(id) => id,
            Term::Node(n) => {
                let ENodeTerm { op, shape, dtype, children } = *n;
                let children = children.into_iter().map(|c| c.add(g)).collect();
                g.add(ENode { op, shape, dtype, children })
            }
        }
    }
}
