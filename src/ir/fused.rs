//! Fused nodes: one kernel that computes a small graph of ops without
//! materializing its intermediates.
//!
//! A `fused` node's body is a [`Graph`] whose `input k` nodes stand for the
//! fused node's operand `k` and whose one output is the fused node's value.
//! The fusion pass builds bodies; backends run them as one loop. Which
//! bodies are legal is decided here, by [`FusedBody::kind`], so the pass,
//! the verifier and every backend agree on one contract:
//!
//! - **Leaves** are `input k` and `full`. A **leaf view** is a view
//!   (`reshape`, `permute`, `expand`, `slice`) of a leaf or of a leaf view:
//!   a backend reads it with strides. Every other node is a **compute**
//!   node: elementwise ops and casts, and, by kind, reductions or one
//!   matmul. A view of a compute node is only allowed as the `expand` of a
//!   reduced row back over the domain (reduction kind).
//! - [`FusedKind::Elementwise`]: every compute node has the output's shape
//!   (the *domain*). One chunked loop over the domain.
//! - [`FusedKind::Reduction`]: every reduction reduces the same trailing
//!   dims `split..rank` of one domain `D` with `keepdim`, and is `sum`,
//!   `mean`, `max` or `min`. Every compute node has shape `D` or the row
//!   shape (`D` with the reduced dims 1); an `expand` takes a row value back
//!   to `D`. The output may instead be a reduction without `keepdim`. A
//!   backend runs one task per block of rows and keeps each row in cache:
//!   softmax and layernorm become one kernel.
//! - [`FusedKind::MatMul`]: one `matmul` of leaves (or leaf views, e.g. a
//!   transposed weight) followed by elementwise compute nodes of the
//!   matmul's shape (bias, activation, residual): a GEMM with an epilogue.
//!
//! Bodies never nest and never hold `random`, `arange` or `buffer`. A body
//! has one output, except an elementwise or reduction body, which may have
//! extra outputs: computed values of the domain's shape (or, in a
//! reduction body, of the row shape). Output 0 is the fused node's value,
//! output `j > 0` the value of an `extra %fused output=j` node
//! ([`Op::Extra`]). The
//! `multi-output` pass builds them, so that a value that several kernels
//! read is written by the kernel that computes it, not recomputed or
//! written by a kernel of its own and read back (AdamW's moments and its
//! parameter update become one kernel).
//!
//! A row kernel over the last dim may write its output 0 *padded*: the
//! body's output 0 is then `cat %v, %full.. dim=last`, its rows followed
//! by constant columns, so that a slice's zero-padded gradient is written
//! where it is computed ([`padded`]).

mod padded;

use super::{Graph, NodeId, Op, ReduceOp, Shape};
use std::collections::HashMap;
use std::fmt;

pub use padded::{padded_output, without_cat, Padded};

/// The body of a `fused` node. Compared by its printed text, so two fused
/// nodes are equal exactly when their bodies print the same.
#[derive(Clone, Debug)]
pub struct FusedBody {
    graph: Graph,
    kind: FusedKind,
    inputs: usize,
    /// Per output, the operand whose bytes it may be written over (an
    /// assigned variable's old value; see [`FusedBody::over`]).
    over: Vec<Option<usize>>,
}

/// What loop a backend runs for a fused body (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FusedKind {
    /// One loop over the output's elements.
    Elementwise,
    /// Rows of a domain `D`, each reduced over its trailing dims.
    Reduction {
        /// The domain every full-size compute node has.
        domain: Shape,
        /// The first reduced dim: dims `split..` are reduced.
        split: usize,
    },
    /// A matmul and an elementwise epilogue on its result.
    MatMul {
        /// The matmul node inside the body.
        matmul: NodeId,
    },
}

impl FusedKind {
    /// The word the text IR prints: `elementwise`, `reduction`, `matmul`.
    pub fn name(&self) -> &'static str {
        match self {
            FusedKind::Elementwise => "elementwise",
            FusedKind::Reduction { .. } => "reduction",
            FusedKind::MatMul { .. } => "matmul",
        }
    }
}

impl PartialEq for FusedBody {
    fn eq(&self, other: &FusedBody) -> bool {
        self.inputs == other.inputs && super::text::print(&self.graph) == super::text::print(&other.graph)
    }
}

impl fmt::Display for FusedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&super::text::print(&self.graph))
    }
}

impl FusedBody {
    /// Checks `graph` against the contract and wraps it; the message says
    /// which node breaks which rule.
    pub fn new(graph: Graph) -> Result<FusedBody, String> {
        let (kind, inputs) = classify(&graph)?;
        let over = vec![None; graph.outputs().len()];
        Ok(FusedBody { graph, kind, inputs, over })
    }

    /// This body, with its result marked as writable over operand `k`:
    /// an elementwise body whose `input k` has the output's shape and
    /// dtype. The `assign` pass marks the value of an assignment that
    /// reads the variable's old value (`over=k` in the text IR).
    pub fn with_over(self, k: usize) -> Result<FusedBody, String> {
        self.with_output_over(0, k)
    }

    /// [`FusedBody::with_over`] for output `j` (`over=[k0,_,k2]` in the
    /// text IR). Two outputs never write over one operand.
    pub fn with_output_over(mut self, j: usize, k: usize) -> Result<FusedBody, String> {
        if self.kind != FusedKind::Elementwise {
            return Err(format!(
                "only an elementwise body writes over an operand, not a {} one",
                self.kind.name()
            ));
        }
        let input = *self.input_nodes().get(k).ok_or_else(|| format!("the body has no input {k}"))?;
        let output = *self.outputs().get(j).ok_or_else(|| format!("the body has no output {j}"))?;
        let (i, out) = (self.graph.node(input), self.graph.node(output));
        if i.shape != out.shape || i.dtype != out.dtype {
            return Err(format!(
                "input {k} is {}{} but output {j} is {}{}",
                i.dtype, i.shape, out.dtype, out.shape
            ));
        }
        if self.over.iter().enumerate().any(|(o, &over)| o != j && over == Some(k)) {
            return Err(format!("two outputs are written over input {k}"));
        }
        self.over[j] = Some(k);
        Ok(self)
    }

    /// The operand the result may be written over, if the `assign` pass
    /// marked one: the memory pass then places the result over that
    /// operand's input when nothing else needs its old bytes
    /// (`Facts::over_input_refusal`).
    pub fn over(&self) -> Option<usize> {
        self.over[0]
    }

    /// [`FusedBody::over`] of output `j` (`None` past the last output).
    pub fn output_over(&self, j: usize) -> Option<usize> {
        self.over.get(j).copied().flatten()
    }

    /// The body graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Which loop runs it.
    pub fn kind(&self) -> &FusedKind {
        &self.kind
    }

    /// How many operands the fused node takes (`input 0 .. input n-1`).
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// The body's output 0: the fused node's own value.
    pub fn output(&self) -> NodeId {
        self.graph.outputs()[0]
    }

    /// Every output node: the fused node's value, then its extra outputs
    /// ([`Op::Extra`]).
    pub fn outputs(&self) -> &[NodeId] {
        self.graph.outputs()
    }

    /// The `input k` node of each slot, in slot order.
    pub fn input_nodes(&self) -> Vec<NodeId> {
        let mut slots = vec![None; self.inputs];
        for id in self.graph.topo_order() {
            if let Op::Input(k) = self.graph.node(id).op {
                slots[k as usize] = Some(id);
            }
        }
        slots.into_iter().flatten().collect()
    }
}

/// The graph with every fused node replaced by the ops of its body (in the
/// fused node's region): what a fused graph means, written without fused
/// nodes. Tests use it as the reference a fused kernel must agree with.
pub fn inline_fused(graph: &Graph) -> Graph {
    let mut out = graph.empty_like();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    // The inlined value of every output of each fused node, for its extras.
    let mut extras: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
    for id in graph.topo_order() {
        let node = graph.node(id);
        let operands: Vec<NodeId> = graph.operands(id).iter().map(|o| map[o]).collect();
        let new = match &node.op {
            Op::Extra { output } => {
                let fused = graph.operands(id)[0];
                extras[&fused][*output]
            }
            Op::Fused(body) => {
                let g = body.graph();
                let mut inner: HashMap<NodeId, NodeId> = HashMap::new();
                for b in g.topo_order() {
                    let bn = g.node(b);
                    let mapped = match bn.op {
                        Op::Input(k) => operands[k as usize],
                        _ => {
                            let ops: Vec<NodeId> = g.operands(b).iter().map(|o| inner[o]).collect();
                            out.add_unchecked(super::Node { region: node.region, ..bn.clone() }, &ops)
                        }
                    };
                    inner.insert(b, mapped);
                }
                extras.insert(id, body.outputs().iter().map(|o| inner[o]).collect());
                inner[&body.output()]
            }
            _ => out.add_unchecked(node.clone(), &operands),
        };
        map.insert(id, new);
    }
    out.set_outputs(graph.outputs().iter().map(|o| map[o]).collect());
    out
}

/// Whether `id` is a leaf or a view of leaves (read with strides).
pub fn is_leaf_or_leaf_view(graph: &Graph, id: NodeId) -> bool {
    let mut cur = id;
    loop {
        let op = &graph.node(cur).op;
        if matches!(op, Op::Input(_) | Op::Full(_)) {
            return true;
        }
        if !op.is_view() {
            return false;
        }
        cur = graph.operands(cur)[0];
    }
}

fn classify(graph: &Graph) -> Result<(FusedKind, usize), String> {
    let outputs = graph.outputs();
    if outputs.is_empty() {
        return Err("a fused body has an output, this one has none".into());
    }
    for (j, &o) in outputs.iter().enumerate() {
        if outputs[..j].contains(&o) {
            return Err(format!("output {j} repeats an earlier output ({o})"));
        }
    }
    super::verify(graph).map_err(|e| format!("the body is not a valid graph: {e}"))?;
    if let Some(p) = padded::form(graph)? {
        let inner = padded::without_cat(graph, p.value);
        let (kind, inputs) = classify(&inner)?;
        padded::check_kind(graph, &p, &kind)?;
        return Ok((kind, inputs));
    }
    let order = graph.topo_order();
    let out = graph.outputs()[0];
    let out_shape = &graph.node(out).shape;
    let mut slots: Vec<bool> = Vec::new();
    let mut reductions = Vec::new();
    let mut matmuls = Vec::new();
    for &id in &order {
        let node = graph.node(id);
        let describe = || format!("{id} ({})", node.op.mnemonic());
        match &node.op {
            Op::Input(k) => {
                let k = *k as usize;
                if slots.len() <= k {
                    slots.resize(k + 1, false);
                }
                if std::mem::replace(&mut slots[k], true) {
                    return Err(format!("{}: input slot {k} appears twice in the body", describe()));
                }
            }
            Op::Full(_) => {}
            op if op.is_view() => {
                let operand = graph.operands(id)[0];
                if !is_leaf_or_leaf_view(graph, operand) && !matches!(op, Op::Expand(_)) {
                    return Err(format!(
                        "{}: inside a fused body only leaves are viewed (a computed value can only be expanded)",
                        describe()
                    ));
                }
            }
            op if op.is_elementwise() => {}
            Op::Reduce { op: ReduceOp::ArgMax, .. } => {
                return Err(format!("{}: argmax is not fused", describe()));
            }
            Op::Reduce { into: Some(_), .. } => {
                return Err(format!("{}: a widening reduction (into=) is not fused", describe()));
            }
            Op::Reduce { .. } => reductions.push(id),
            Op::MatMul => matmuls.push(id),
            _ => return Err(format!("{}: this op cannot be part of a fused body", describe())),
        }
    }
    if let Some(k) = slots.iter().position(|&seen| !seen) {
        return Err(format!("input slot {k} is missing from the body (slots must be 0..n)"));
    }
    let computed = |id: NodeId| !is_leaf_or_leaf_view(graph, id);
    let kind = match (reductions.is_empty(), matmuls.len()) {
        (true, 0) => {
            for &id in &order {
                let node = graph.node(id);
                if computed(id) && node.shape != *out_shape {
                    return Err(format!(
                        "{id} ({}): an elementwise body computes everything at the output shape {out_shape}, not {}",
                        node.op.mnemonic(),
                        node.shape
                    ));
                }
            }
            if let Some(&leaf) = outputs.iter().skip(1).find(|&&o| !computed(o)) {
                return Err(format!(
                    "{leaf}: an extra output is computed in the body, not a leaf or its view"
                ));
            }
            FusedKind::Elementwise
        }
        (false, 0) => classify_reduction(graph, &order, &reductions)?,
        (true, 1) => {
            let mm = matmuls[0];
            let mm_shape = &graph.node(mm).shape;
            for operand in graph.operands(mm) {
                if computed(operand) {
                    return Err(format!(
                        "{mm} (matmul): a fused matmul reads only body inputs or their views"
                    ));
                }
            }
            for &id in &order {
                let node = graph.node(id);
                if computed(id) && node.shape != *mm_shape {
                    return Err(format!(
                        "{id} ({}): a matmul epilogue computes at the matmul's shape {mm_shape}, not {}",
                        node.op.mnemonic(),
                        node.shape
                    ));
                }
                if computed(id) && id != mm && !graph.reaches(mm, id) {
                    return Err(format!(
                        "{id} ({}): every computed value of a matmul body follows the matmul",
                        node.op.mnemonic()
                    ));
                }
            }
            FusedKind::MatMul { matmul: mm }
        }
        _ => {
            return Err(
                "a fused body holds either reductions or one matmul, not both or several matmuls".into()
            )
        }
    };
    match &kind {
        FusedKind::MatMul { .. } if outputs.len() > 1 => {
            return Err("a matmul body has one output".into());
        }
        FusedKind::Reduction { domain, split } => {
            let row =
                Shape(domain.0.iter().enumerate().map(|(i, &d)| if i < *split { d } else { 1 }).collect());
            for &o in &outputs[1..] {
                let s = &graph.node(o).shape;
                if !computed(o) || (*s != *domain && *s != row) || matches!(graph.node(o).op, Op::Expand(_)) {
                    return Err(format!(
                        "{o}: an extra output of a reduction body is computed at {domain} or {row}, not {s}"
                    ));
                }
            }
        }
        _ => {}
    }
    Ok((kind, slots.len()))
}

fn classify_reduction(graph: &Graph, order: &[NodeId], reductions: &[NodeId]) -> Result<FusedKind, String> {
    let first = reductions[0];
    let domain = graph.node(graph.operands(first)[0]).shape.clone();
    let split = match &graph.node(first).op {
        Op::Reduce { dims, .. } => dims.first().copied().unwrap_or(domain.rank()),
        _ => unreachable!("reductions holds reduce nodes"),
    };
    let trailing: Vec<usize> = (split..domain.rank()).collect();
    let row = Shape(domain.0.iter().enumerate().map(|(i, &d)| if i < split { d } else { 1 }).collect());
    let out = graph.outputs()[0];
    for &r in reductions {
        let Op::Reduce { dims, keepdim, .. } = &graph.node(r).op else { unreachable!("reduce node") };
        let operand = &graph.node(graph.operands(r)[0]).shape;
        if *operand != domain || *dims != trailing {
            return Err(format!(
                "{r} ({}): every reduction of a fused body reduces dims {trailing:?} of {domain}, not {dims:?} of {operand}",
                graph.node(r).op.mnemonic()
            ));
        }
        if !keepdim && r != out {
            return Err(format!(
                "{r} ({}): inside a fused body reductions keep their dims (only the output may drop them)",
                graph.node(r).op.mnemonic()
            ));
        }
    }
    for &id in order {
        let node = graph.node(id);
        // Leaf views take the shape of the compute nodes they feed, and
        // reductions were checked above.
        if is_leaf_or_leaf_view(graph, id) || reductions.contains(&id) {
            continue;
        }
        if node.shape != domain && node.shape != row {
            return Err(format!(
                "{id} ({}): a reduction body computes at {domain} or {row}, not {}",
                node.op.mnemonic(),
                node.shape
            ));
        }
        if let Op::Expand(_) = node.op {
            let from = &graph.node(graph.operands(id)[0]).shape;
            if *from != row || node.shape != domain {
                return Err(format!(
                    "{id} (expand): a computed value is only expanded from the row shape {row} to {domain}"
                ));
            }
        }
    }
    Ok(FusedKind::Reduction { domain, split })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    fn kind(src: &str) -> Result<FusedKind, String> {
        FusedBody::new(parse(src).expect("parses")).map(|b| b.kind().clone())
    }

    #[test]
    fn kinds() {
        let ew = "%a: f32[4,3] = input 0\n%b: f32[3] = input 1\n%c: f32[4,3] = expand %b\n\
                  %d: f32[4,3] = add %a, %c\n%e: f32[4,3] = exp %d\nreturn %e\n";
        assert_eq!(kind(ew), Ok(FusedKind::Elementwise));
        let softmax = "%x: f32[4,3] = input 0\n%m: f32[4,1] = max %x dims=[1] keepdim\n\
                       %mb: f32[4,3] = expand %m\n%d: f32[4,3] = sub %x, %mb\n%e: f32[4,3] = exp %d\n\
                       %s: f32[4,1] = sum %e dims=[1] keepdim\n%sb: f32[4,3] = expand %s\n\
                       %y: f32[4,3] = div %e, %sb\nreturn %y\n";
        assert_eq!(kind(softmax), Ok(FusedKind::Reduction { domain: Shape::new([4, 3]), split: 1 }));
        let mm = "%a: f32[4,3] = input 0\n%w: f32[5,3] = input 1\n%wt: f32[3,5] = permute %w perm=[1,0]\n\
                  %b: f32[5] = input 2\n%m: f32[4,5] = matmul %a, %wt\n%bb: f32[4,5] = expand %b\n\
                  %y: f32[4,5] = add %m, %bb\n%r: f32[4,5] = relu %y\nreturn %r\n";
        assert!(matches!(kind(mm), Ok(FusedKind::MatMul { .. })));
    }

    #[test]
    fn illegal_bodies_say_why() {
        let view_of_computed = "%a: f32[4,3] = input 0\n%e: f32[4,3] = exp %a\n\
                                %p: f32[3,4] = permute %e perm=[1,0]\nreturn %p\n";
        assert!(kind(view_of_computed).unwrap_err().contains("only leaves are viewed"));
        let whole = "%x: f32[4,3] = input 0\n%s: f32[1,1] = sum %x dims=[0,1] keepdim\n\
                     %e: f32[1,1] = exp %s\nreturn %e\n";
        assert!(kind(whole).is_ok(), "reducing every dim is a single row");
        let leading = "%x: f32[4,3] = input 0\n%s: f32[1,3] = sum %x dims=[0] keepdim\n\
                       %e: f32[1,3] = exp %s\nreturn %e\n";
        assert!(kind(leading).unwrap_err().contains("every reduction"));
        let mixed = "%x: f32[4,3] = input 0\n%s: f32[4,1] = sum %x dims=[1] keepdim\n\
                     %t: f32[1,3] = sum %x dims=[0] keepdim\n%sb: f32[4,3] = expand %s\n\
                     %tb: f32[4,3] = expand %t\n%y: f32[4,3] = add %sb, %tb\nreturn %y\n";
        assert!(kind(mixed).unwrap_err().contains("every reduction"));
        let gap = "%x: f32[4] = input 1\n%e: f32[4] = exp %x\nreturn %e\n";
        assert!(kind(gap).unwrap_err().contains("slot 0 is missing"));
    }

    #[test]
    fn several_outputs() {
        let ew = "%a: f32[4,3] = input 0\n%e: f32[4,3] = exp %a\n%n: f32[4,3] = neg %e\nreturn %n, %e\n";
        assert_eq!(kind(ew), Ok(FusedKind::Elementwise));
        let leaf = "%a: f32[4,3] = input 0\n%e: f32[4,3] = exp %a\nreturn %e, %a\n";
        assert!(kind(leaf).unwrap_err().contains("an extra output is computed"));
        let twice = "%a: f32[4,3] = input 0\n%e: f32[4,3] = exp %a\nreturn %e, %e\n";
        assert!(kind(twice).unwrap_err().contains("repeats"));
        let norm = "%x: f32[4,3] = input 0\n%m: f32[4,1] = mean %x dims=[1] keepdim\n\
                    %mb: f32[4,3] = expand %m\n%c: f32[4,3] = sub %x, %mb\n%e: f32[4,3] = exp %c\n\
                    return %e, %m, %c\n";
        assert_eq!(kind(norm), Ok(FusedKind::Reduction { domain: Shape::new([4, 3]), split: 1 }));
        let expand_out = "%x: f32[4,3] = input 0\n%m: f32[4,1] = mean %x dims=[1] keepdim\n\
                          %mb: f32[4,3] = expand %m\n%c: f32[4,3] = sub %x, %mb\nreturn %c, %mb\n";
        assert!(kind(expand_out).unwrap_err().contains("an extra output of a reduction body"));
        let mm = "%a: f32[4,3] = input 0\n%w: f32[3,5] = input 1\n%m: f32[4,5] = matmul %a, %w\n\
                  %r: f32[4,5] = relu %m\nreturn %r, %m\n";
        assert!(kind(mm).unwrap_err().contains("a matmul body has one output"));
        // Two outputs are never written over one operand.
        let body = FusedBody::new(parse(ew).unwrap()).unwrap().with_output_over(1, 0).unwrap();
        assert!(body.clone().with_output_over(0, 0).unwrap_err().contains("two outputs"));
        assert_eq!((body.over(), body.output_over(1)), (None, Some(0)));
    }

    #[test]
    fn extras_parse_print_and_verify() {
        let src = "%x: f32[4] = input 0\n%y: f32[4] = input 1\n\
                   %f: f32[4] = fused %x, %y kind=elementwise over=[0,1] {\n\
                   %0: f32[4] = input 0\n%1: f32[4] = input 1\n%2: f32[4] = add %0, %1\n\
                   %3: f32[4] = mul %0, %1\nreturn %2, %3\n}\n\
                   %e: f32[4] = extra %f output=1\nreturn %f, %e\n";
        let g = parse(src).expect("parses");
        crate::ir::verify(&g).expect("verifies");
        let printed = crate::ir::text::print(&g);
        assert!(printed.contains("over=[0,1]") && printed.contains("extra %2 output=1"), "{printed}");
        assert_eq!(crate::ir::text::print(&parse(&printed).expect("reparses")), printed);
        let bad = |from: &str, to: &str| parse(&src.replace(from, to)).map(|_| ()).unwrap_err().to_string();
        assert!(bad("output=1", "output=2").contains("extra outputs 1..2 only"));
        assert!(bad("output=1", "output=0").contains("the node itself"));
        assert!(bad("%e: f32[4] = extra %f", "%e: f64[4] = extra %f").contains("is f32[4]"));
        assert!(bad("extra %f output", "extra %x output").contains("has no extra outputs"));
        assert!(bad("over=[0,1]", "over=[0]").contains("over lists 1 entries"));
        assert!(bad("over=[0,1]", "over=[0,0]").contains("two outputs are written over input 0"));
        let only_extra = parse(&src.replace("over=[0,1]", "over=[_,1]")).expect("parses `_`");
        assert!(crate::ir::text::print(&only_extra).contains("over=[_,1]"));
    }
}
