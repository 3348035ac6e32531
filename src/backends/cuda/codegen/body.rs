//! A body graph prepared for code generation: its leaves resolved to
//! operands and accesses, its compute nodes as C statements.
//!
//! Bodies are the graphs of fused nodes, and the one-op graphs the lowering
//! builds for unfused ops, so one generator serves both. A *leaf* is an
//! `input k`, a `full`, or a view of a leaf: it is read where it lives (an
//! operand's buffer through an [`Access`], or a literal), never computed.

use super::expr;
use super::index::Access;
use super::types;
use crate::ir::{DType, Graph, NodeId, Op, Scalar};
use std::collections::HashMap;

/// Where a kernel operand's elements come from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Source {
    /// A pointer parameter of the kernel.
    Buffer,
    /// A constant: no memory, a literal in the source.
    Const(Scalar),
}

/// One operand of a generated kernel: `input k` of its body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Operand {
    /// Where the elements are.
    pub source: Source,
    /// How the operand's shape maps onto its storage.
    pub access: Access,
    /// Its dtype.
    pub dtype: DType,
}

/// A resolved leaf: operand `k` (or a constant) read through `access`.
#[derive(Clone, Debug)]
pub(crate) struct Leaf {
    pub operand: Option<usize>,
    pub constant: Option<Scalar>,
    /// `start, step` of an `arange` leaf: element `i` is computed, never
    /// loaded (see [`Leaf::read_at`]).
    pub arange: Option<(Scalar, Scalar)>,
    pub access: Access,
    pub dtype: DType,
}

impl Leaf {
    /// The parameter name of its operand.
    pub fn param(&self) -> String {
        format!("in{}", self.operand.unwrap_or(0))
    }

    /// True when every position reads one value (a constant, a broadcast
    /// of a buffer's element; an `arange` is computed where it is read).
    pub fn is_uniform(&self) -> bool {
        self.constant.is_some() || (self.arange.is_none() && self.access.is_uniform())
    }

    /// The compute value at storage offset `offset` (an expression): a
    /// literal, an `arange`'s element computed as its kernel computes it
    /// (the same expression, stored and loaded as its dtype), or a load.
    pub fn read_at(&self, offset: &str) -> String {
        match (self.constant, self.arange) {
            (Some(c), _) => types::literal(self.dtype, c),
            (None, Some((start, step))) => {
                let v = super::ops::arange_value(self.dtype, start, step, &format!("({offset})"));
                types::load(self.dtype, &types::store(self.dtype, &v))
            }
            (None, None) => types::load(self.dtype, &format!("{}[{offset}]", self.param())),
        }
    }
}

/// A body ready to emit.
pub(crate) struct Body<'a> {
    pub g: &'a Graph,
    /// The nodes the output needs, operands first.
    pub order: Vec<NodeId>,
    /// Every leaf node (views of leaves included).
    pub leaves: HashMap<NodeId, Leaf>,
    pub output: NodeId,
}

impl<'a> Body<'a> {
    /// Resolves the leaves of `g` (one output) against `operands`.
    pub fn new(g: &'a Graph, operands: &[Operand]) -> Result<Body<'a>, String> {
        let output = *g.outputs().first().ok_or("a body has one output")?;
        let order = g.topo_order();
        let mut leaves: HashMap<NodeId, Leaf> = HashMap::new();
        for &id in &order {
            let node = g.node(id);
            let leaf = match &node.op {
                Op::Input(k) => {
                    let o = operands.get(*k as usize).ok_or_else(|| {
                        format!("{id} reads input {k}, but only {} operand(s)", operands.len())
                    })?;
                    if o.access.shape() != &node.shape {
                        return Err(format!(
                            "{id}: operand {k} is {} but the body reads {}",
                            o.access.shape(),
                            node.shape
                        ));
                    }
                    Some(Leaf {
                        operand: (o.source == Source::Buffer).then_some(*k as usize),
                        constant: match o.source {
                            Source::Const(c) => Some(c),
                            Source::Buffer => None,
                        },
                        arange: None,
                        access: o.access.clone(),
                        dtype: node.dtype,
                    })
                }
                Op::Arange { start, step } => Some(Leaf {
                    operand: None,
                    constant: None,
                    arange: Some((*start, *step)),
                    access: Access::strided(crate::backends::Layout::contiguous(node.shape.clone())),
                    dtype: node.dtype,
                }),
                Op::Full(v) => Some(Leaf {
                    operand: None,
                    constant: Some(*v),
                    arange: None,
                    access: Access::strided(crate::backends::Layout {
                        shape: node.shape.clone(),
                        strides: vec![0; node.shape.rank()],
                        offset: 0,
                    }),
                    dtype: node.dtype,
                }),
                op if op.is_view() => {
                    let from = g.operands(id)[0];
                    leaves.get(&from).map(|l| Leaf {
                        access: l.access.view(op),
                        dtype: node.dtype,
                        ..l.clone()
                    })
                }
                _ => None,
            };
            if let Some(l) = leaf {
                leaves.insert(id, l);
            }
        }
        Ok(Body { g, order, leaves, output })
    }

    /// The C statement computing compute node `id` into `var`, reading its
    /// operands through `operand(id) -> expression`.
    pub fn statement(
        &self,
        id: NodeId,
        var: &str,
        operand: &dyn Fn(NodeId) -> String,
    ) -> Result<String, String> {
        let (e, round) = self.unsettled(id, operand)?;
        let e = match round {
            Some(half) => types::settle(half, &e),
            None => e,
        };
        Ok(format!("const {} {var} = {e};", types::compute(self.g.node(id).dtype)))
    }

    /// Compute node `id`'s expression before its rounding to a 16-bit
    /// float, and that type (`None`: the expression is its value already;
    /// f32, f64 and integer results are settled in it). Split so that two
    /// elements' roundings can be one conversion (`super::lanes`).
    pub fn unsettled(
        &self,
        id: NodeId,
        operand: &dyn Fn(NodeId) -> String,
    ) -> Result<(String, Option<DType>), String> {
        let node = self.g.node(id);
        let ops = self.g.operands(id);
        let arg = |k: usize| ops.get(k).map(|&o| operand(o)).ok_or_else(|| format!("{id} lacks operand {k}"));
        let d = node.dtype;
        let half = matches!(d, DType::F16 | DType::BF16).then_some(d);
        let settled = |e: String| match half {
            Some(_) => (e, half),
            None => (types::settle(d, &e), None),
        };
        Ok(match &node.op {
            Op::Unary(u) => settled(expr::unary_unsettled(*u, d, &arg(0)?)),
            Op::Binary(b) => settled(expr::binary_unsettled(*b, d, &arg(0)?, &arg(1)?)),
            Op::Compare(c) => (expr::compare(*c, &arg(0)?, &arg(1)?), None),
            Op::Where => (expr::select(&arg(0)?, &arg(1)?, &arg(2)?), None),
            Op::Cast(to) => {
                let from = self.g.node(ops[0]).dtype;
                // A float narrowed to a 16-bit float is one rounding of its
                // compute value (`types::cast`); other casts are final.
                match half {
                    Some(_) if from != *to && types::compute(from) == "float" => (arg(0)?, half),
                    _ => (expr::convert(from, *to, &arg(0)?), None),
                }
            }
            // An expand of a computed value: the value itself (a row value
            // read along its row, or an expand to the same shape).
            Op::Expand(_) => (arg(0)?, None),
            op => return Err(format!("{id} ({}) is not an elementwise op", op.mnemonic())),
        })
    }

    /// True if `id` is a leaf.
    pub fn is_leaf(&self, id: NodeId) -> bool {
        self.leaves.contains_key(&id)
    }

    /// The compute nodes among `order` that `target` needs, stopping at
    /// leaves and at nodes for which `stop` holds (values already known).
    pub fn cone(&self, target: NodeId, stop: &dyn Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut need: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
        let mut stack = vec![target];
        while let Some(n) = stack.pop() {
            if self.is_leaf(n) || stop(n) || !need.insert(n) {
                continue;
            }
            stack.extend(self.g.operands(n));
        }
        self.order.iter().copied().filter(|n| need.contains(n)).collect()
    }
}

/// The C declaration of a kernel's pointer parameters: one per output of
/// `outs` (`out`, then `out1`, `out2`, ... for a body's extra outputs),
/// then one per buffer operand, read-only; every name prefixed by
/// `prefix` (a multi-tensor kernel's member `i` is `m{i}_out, m{i}_in0,
/// ...`). `restrict` is left out when an output is computed in place of
/// an operand (then two parameters alias).
pub(crate) fn params_named(outs: &[DType], operands: &[Operand], in_place: bool, prefix: &str) -> String {
    let r = if in_place { "" } else { " __restrict__" };
    let mut p: Vec<String> = outs
        .iter()
        .enumerate()
        .map(|(j, &d)| format!("{}*{r} {prefix}{}", types::storage(d), out_name(j)))
        .collect();
    for (k, o) in operands.iter().enumerate() {
        if o.source == Source::Buffer {
            p.push(format!("const {}*{r} {prefix}in{k}", types::storage(o.dtype)));
        }
    }
    p.join(", ")
}

/// The parameter name of output `j`: `out`, `out1`, `out2`, ...
pub(crate) fn out_name(j: usize) -> String {
    match j {
        0 => "out".into(),
        j => format!("out{j}"),
    }
}

/// Indices of the operands that are pointer parameters, in order.
pub(crate) fn buffer_operands(operands: &[Operand]) -> Vec<usize> {
    operands.iter().enumerate().filter(|(_, o)| o.source == Source::Buffer).map(|(k, _)| k).collect()
}

/// Index values past this need 64-bit arithmetic (half of `int`'s range,
/// so sums of two in-range terms cannot overflow either).
const INDEX_LIMIT: u128 = (i32::MAX as u128) / 2;

/// `int` when every index and offset fits 31 bits, else 64-bit.
pub(crate) fn index_type(numel: usize, operands: &[Operand]) -> &'static str {
    let big = numel as u128 * 2 > INDEX_LIMIT || operands.iter().any(|o| o.access.extent() > INDEX_LIMIT);
    if big {
        "long long"
    } else {
        "int"
    }
}

impl Body<'_> {
    /// [`index_type`] over the operands *and every leaf*: a view inside
    /// the body (an expand, then a reshape that starts a new index stage,
    /// then a slice) can compute indices far past anything its operand or
    /// the output needs.
    pub fn index_type(&self, numel: usize, operands: &[Operand]) -> &'static str {
        if self.leaves.values().any(|l| l.access.extent() > INDEX_LIMIT) {
            "long long"
        } else {
            index_type(numel, operands)
        }
    }
}
