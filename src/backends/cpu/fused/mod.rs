//! Fused kernels: one loop that computes a fused node's body (see
//! [`crate::ir::fused`] for the contract) without materializing its
//! intermediates.
//!
//! # The loop
//!
//! Every kind runs as one loop over *rows* of a domain `D` split at
//! `split`: `rows = prod(D[..split])`, `cols = prod(D[split..])`.
//!
//! - elementwise: `D` is the output, `split = rank` (each element is a row
//!   of one column);
//! - reduction: the body's domain and split;
//! - matmul: `D` is the matmul's shape, `split = rank - 1` (a row is a row
//!   of the product).
//!
//! Rows are processed in blocks of [`BLOCK`] / `cols` rows (at least one,
//! at most `rows`), blocks in parallel on rayon. Within a block every body
//! node that needs memory has a scratch vector of exactly the block's
//! size: *full* nodes (shape `D`) `rows * cols` elements, *row* nodes (the
//! row shape, reductions) one element per row. The body's nodes run in
//! topological order, each a plain loop over its block ([`ops`]);
//! reductions reduce each row's columns (vectorized, `lanes.rs`), and the
//! last node writes the kernel's output directly. Softmax and layer norm
//! thus read their input once and write the output once, and a row stays
//! in L1/L2 between the passes over it.
//!
//! An `expand` of a row value (a row's max, mean or scale) is not copied
//! out along the row: the nodes that read it take it as a per-row operand
//! (compiled away here, see [`Opnd`]). Leaves (`input k`, `full`) are read
//! through their view chain composed into one strided layout over the
//! actual buffer: a contiguous leaf is read in place, a broadcast scalar
//! (every stride 0, e.g. `full`) as one value, a row broadcast over rows (a
//! bias) or a value per row broadcast along it in place, any other layout
//! is gathered per block. A `reshape` that cannot be a view of the
//! buffer's layout is copied to a dense buffer once per run (rare).
//!
//! # Scratch
//!
//! Scratch belongs to the compiled kernel, as the arena belongs to the
//! compiled plan: each rayon task leases a set from the kernel's pool and
//! gives it back, so a run allocates nothing once the pool holds a set per
//! thread, and a tiny tensor costs tiny scratch (a 4,000-node chain on
//! one element holds 4,000 one-element vectors, not 4,000 blocks).
//!
//! # Sizes
//!
//! [`BLOCK`] is 4096 elements: a block of a few `f32` nodes (16 KB each)
//! stays in L1/L2, and the per-block cost (one dispatch per node) is small
//! next to 4096 elements of work. It is fixed, never derived from the
//! thread count, so results never depend on it. A matmul body computes its
//! whole product first with the unfused (parallel) GEMM, into a buffer the
//! kernel keeps, and runs the epilogue over it in blocks: the GEMM splits
//! its work over every core however few rows the product has (an MLP with
//! batch 128), which a GEMM per row block could not.
//!
//! # Semantics
//!
//! Elementwise nodes use the unfused kernels' element functions, so an
//! elementwise body is bit-identical fused and unfused. Reductions
//! accumulate as `reduce.rs` does (`lanes.rs`: floats in `f64` over
//! interleaved partial sums in a fixed order); the unfused kernel sums very
//! long rows of few-row tensors in parallel segments, so those sums may
//! differ in the last bits.

mod check;
mod jit;
mod leaf;
mod ops;
mod padded;
mod rows;
mod run;
mod softmax_avx512;
mod stream;

use super::codegen::Codegen;
use crate::ir::fused::is_leaf_or_leaf_view;
use crate::ir::{
    BinaryOp, CompareOp, DType, FusedBody, FusedKind, HostData, NodeId, Op, ReduceOp, Shape, UnaryOp,
};
use crate::{Error, Result};
use leaf::{leaf, Leaf};
use std::collections::HashMap;
use std::sync::Mutex;

/// Elements of a full-size node per block (see the module docs).
pub(crate) const BLOCK: usize = 4096;

/// Whether a node holds one value per element of the domain or per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Full,
    Row,
}

/// An operand of a step: the step it reads, and whether a row value is
/// read by a full-size step, broadcast along each row (the `expand` of a
/// row value, compiled away).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Opnd {
    slot: usize,
    per_row: bool,
}

/// One step of the compiled body; operands are earlier steps.
#[derive(Clone, Debug)]
enum Step {
    Leaf(Leaf),
    Unary(UnaryOp, Opnd),
    Binary(BinaryOp, Opnd, Opnd),
    Compare(CompareOp, Opnd, Opnd),
    Where(Opnd, Opnd, Opnd),
    Cast(Opnd),
    Reduce(ReduceOp, Opnd),
    /// A copy of its operand at the step's shape: an `expand` to the same
    /// shape, or a row value expanded along its row that some step reads
    /// as a full-size value.
    Copy(Opnd),
    MatMul(Leaf, Leaf),
}

impl Step {
    fn operands(&self) -> Vec<Opnd> {
        match self {
            Step::Leaf(_) | Step::MatMul(..) => vec![],
            Step::Unary(_, a) | Step::Cast(a) | Step::Reduce(_, a) | Step::Copy(a) => vec![*a],
            Step::Binary(_, a, b) | Step::Compare(_, a, b) => vec![*a, *b],
            Step::Where(a, b, c) => vec![*a, *b, *c],
        }
    }
}

#[derive(Clone, Debug)]
struct Instr {
    step: Step,
    dtype: DType,
    class: Class,
    /// False when no step reads it (an `expand` every reader takes per row).
    live: bool,
    /// For a leaf, its index among the leaves (what a run resolves).
    leaf: usize,
}

/// A fused node compiled for the CPU: the body flattened into steps over
/// a row-blocked domain. Built once per fused node when a plan is
/// compiled; [`FusedKernel::run`] runs it any number of times.
#[derive(Debug)]
pub(crate) struct FusedKernel {
    node: NodeId,
    kind: &'static str,
    /// The loop domain and where rows end and columns start.
    domain: Shape,
    split: usize,
    rows: usize,
    cols: usize,
    instrs: Vec<Instr>,
    /// The steps that are leaves, in order.
    leaves: Vec<usize>,
    /// The step whose value is the output.
    output: usize,
    /// The steps of the extra outputs (body outputs 1..), with their
    /// dtypes and classes: written block by block next to the output.
    extras: Vec<(usize, DType, Class)>,
    out_class: Class,
    out_dtype: DType,
    out_shape: Shape,
    /// Shape and dtype of each operand.
    inputs: Vec<(Shape, DType)>,
    /// Whether operand `k` may be computed in place (see [`FusedKernel::run`]).
    in_place_ok: Vec<bool>,
    /// `[j - 1][k]`: whether body output `j` may be written over operand
    /// `k` (see [`FusedKernel::run_over`]).
    extra_over_ok: Vec<Vec<bool>>,
    /// Rows per block of the loop (one block per parallel task).
    block_rows: usize,
    /// Scratch sets not leased by a running task (see the module docs).
    pool: Mutex<Vec<Scratch>>,
    /// A matmul body's product buffer, between runs.
    product: Mutex<Option<HostData>>,
    /// Generated code for the body, when it qualifies (see `jit.rs`).
    jit: Option<jit::Jit>,
    /// Else generated code for runs of its steps (by first step).
    segments: Vec<jit::Segment>,
    /// A softmax or layer norm body, run by a hand-fused row kernel
    /// (`rows.rs`) instead of the interpreter's walk.
    row_kernel: Option<rows::Rows>,
    /// A padded output 0: the steps compute the unpadded body, and each
    /// row is written into the wider output (`padded.rs`).
    pad: Option<crate::ir::Padded>,
    /// A padded output's unpadded rows, between runs (as `product`).
    unpadded: Mutex<Option<HostData>>,
}

/// One task's scratch: a vector per step (empty until a block needs it).
#[derive(Debug)]
struct Scratch {
    vals: Vec<HostData>,
    /// A row kernel's row of intermediates (`rows.rs`).
    row: Vec<f32>,
}

impl FusedKernel {
    /// Compiles `body` (the body of fused node `node`, named in errors).
    /// A body that breaks the contract of [`crate::ir::fused`] is an error,
    /// before any code is generated. `codegen` says whether a body that
    /// qualifies runs as generated code (`jit.rs`); the interpreter is the
    /// reference and the fallback.
    pub(crate) fn compile(body: &FusedBody, node: NodeId, codegen: Codegen) -> Result<FusedKernel> {
        if let Some(pad) = body.padded() {
            let inner = FusedKernel::compile(&body.unpadded(), node, codegen)?;
            return Ok(FusedKernel { pad: Some(pad), ..inner });
        }
        let err = |m: String| Error::Backend(format!("cpu: fused {node}: {m}"));
        let g = body.graph();
        let out_id = body.output();
        let (domain, split, kind, mm) = match body.kind() {
            FusedKind::Elementwise => {
                let d = g.node(out_id).shape.clone();
                let r = d.rank();
                (d, r, "elementwise", None)
            }
            FusedKind::Reduction { domain, split } => (domain.clone(), *split, "reduction", None),
            FusedKind::MatMul { matmul } => {
                let d = g.node(*matmul).shape.clone();
                let r = d.rank();
                if r < 2 || !g.contains(*matmul) {
                    return Err(err(format!("the matmul has shape {d}")));
                }
                (d, r - 1, "matmul", Some(*matmul))
            }
        };
        if split > domain.rank() {
            return Err(err(format!("split {split} is past the rank of {domain}")));
        }
        let row = Shape(domain.0.iter().enumerate().map(|(i, &d)| if i < split { d } else { 1 }).collect());
        let rows: usize = domain.0[..split].iter().product();
        let cols: usize = domain.0[split..].iter().product();
        let class_of = |id: NodeId| {
            let s = &g.node(id).shape;
            if *s == domain {
                Ok(Class::Full)
            } else if *s == row {
                Ok(Class::Row)
            } else {
                Err(err(format!("{id} has shape {s}, neither the domain {domain} nor the row shape {row}")))
            }
        };
        let mut slot: HashMap<NodeId, usize> = HashMap::new();
        let mut instrs: Vec<Instr> = Vec::new();
        let mut leaves: Vec<usize> = Vec::new();
        for id in g.topo_order() {
            let n = g.node(id);
            let operands = g.operands(id);
            let operand = |i: usize| {
                operands
                    .get(i)
                    .and_then(|o| slot.get(o).copied())
                    .ok_or_else(|| err(format!("operand {i} of {id} is not computed before it")))
            };
            // Operand `i` read at `class`: a row value expanded along its
            // row is read per row from the row value itself.
            let same = |i: usize, class: Class| {
                let s = operand(i)?;
                if let (Step::Copy(r), Class::Full) = (&instrs[s].step, class) {
                    if r.per_row {
                        return Ok(Opnd { slot: r.slot, per_row: true });
                    }
                }
                // With one column a row value and a full value are the same.
                if instrs[s].class != class && cols != 1 {
                    return Err(err(format!("operand {i} of {id} is not at the shape of {id}")));
                }
                Ok(Opnd { slot: s, per_row: false })
            };
            let (step, class) = if is_leaf_or_leaf_view(g, id) {
                let read =
                    id == out_id || g.users(id).iter().any(|&u| !g.node(u).op.is_view() && Some(u) != mm);
                if !read {
                    continue;
                }
                (Step::Leaf(leaf(g, id).map_err(err)?), class_of(id)?)
            } else {
                match &n.op {
                    Op::Unary(u) => {
                        let c = class_of(id)?;
                        (Step::Unary(*u, same(0, c)?), c)
                    }
                    Op::Binary(b) => {
                        let c = class_of(id)?;
                        (Step::Binary(*b, same(0, c)?, same(1, c)?), c)
                    }
                    Op::Compare(cmp) => {
                        let c = class_of(id)?;
                        (Step::Compare(*cmp, same(0, c)?, same(1, c)?), c)
                    }
                    Op::Where => {
                        let c = class_of(id)?;
                        (Step::Where(same(0, c)?, same(1, c)?, same(2, c)?), c)
                    }
                    Op::Cast(_) => {
                        let c = class_of(id)?;
                        (Step::Cast(same(0, c)?), c)
                    }
                    Op::Reduce { op, dims, keepdim, into: None } => {
                        let trailing: Vec<usize> = (split..domain.rank()).collect();
                        if kind != "reduction" || *dims != trailing || (!keepdim && id != out_id) {
                            return Err(err(format!("{id} ({}) does not reduce the rows", op.mnemonic())));
                        }
                        (Step::Reduce(*op, same(0, Class::Full)?), Class::Row)
                    }
                    Op::Expand(_) => {
                        let from = &g.node(operands[0]).shape;
                        let c = class_of(id)?;
                        if *from == n.shape {
                            (Step::Copy(same(0, c)?), c)
                        } else if c == Class::Full {
                            let r = same(0, Class::Row)?;
                            (Step::Copy(Opnd { slot: r.slot, per_row: true }), c)
                        } else {
                            return Err(err(format!("{id} expands a computed value to the row shape")));
                        }
                    }
                    Op::MatMul if mm == Some(id) => {
                        let (a, b) = (leaf(g, operands[0]).map_err(err)?, leaf(g, operands[1]).map_err(err)?);
                        (Step::MatMul(a, b), class_of(id)?)
                    }
                    op => return Err(err(format!("{id} ({}) cannot run in a fused kernel", op.mnemonic()))),
                }
            };
            slot.insert(id, instrs.len());
            let leaf = if matches!(step, Step::Leaf(_)) { leaves.len() } else { usize::MAX };
            if leaf != usize::MAX {
                leaves.push(instrs.len());
            }
            instrs.push(Instr { step, dtype: n.dtype, class, live: false, leaf });
        }
        let output = *slot.get(&out_id).ok_or_else(|| err("the body's output is not computed".into()))?;
        let mut extras = Vec::new();
        for &e in &body.outputs()[1..] {
            let s = *slot.get(&e).ok_or_else(|| err(format!("the extra output {e} is not computed")))?;
            if matches!(instrs[s].step, Step::Leaf(_) | Step::MatMul(..)) {
                return Err(err(format!("the extra output {e} is not computed")));
            }
            instrs[s].live = true;
            extras.push((s, instrs[s].dtype, instrs[s].class));
        }
        // A step is live when an output needs it (readers come later).
        instrs[output].live = true;
        for i in (0..instrs.len()).rev() {
            if instrs[i].live {
                for o in instrs[i].step.operands() {
                    instrs[o.slot].live = true;
                }
            }
        }
        let out = g.node(out_id);
        let out_class = match out.op {
            Op::Reduce { keepdim: false, .. } => Class::Row,
            _ => instrs[output].class,
        };
        let want = if out_class == Class::Full { rows * cols } else { rows };
        if out.shape.numel() != want {
            return Err(err(format!("the output {} does not fit the loop over {domain}", out.shape)));
        }
        let input_nodes = body.input_nodes();
        let inputs: Vec<(Shape, DType)> =
            input_nodes.iter().map(|&i| (g.node(i).shape.clone(), g.node(i).dtype)).collect();
        // Whether an output of `shape`, `dtype` and `class` may be written
        // over each input: read elementwise at that type, through no view.
        let writable_over = |shape: &Shape, dtype: DType, class: Class| -> Vec<bool> {
            input_nodes
                .iter()
                .map(|&i| {
                    let n = g.node(i);
                    n.shape == *shape
                        && n.dtype == dtype
                        && g.users(i).iter().all(|&u| !g.node(u).op.is_view() && Some(u) != mm)
                        && slot.get(&i).is_none_or(|&s| instrs[s].class == class || cols == 1)
                })
                .collect()
        };
        let in_place_ok = writable_over(&out.shape, out.dtype, out_class);
        // The same test for the extra outputs, each at its own type and class.
        let extra_over_ok = body.outputs()[1..]
            .iter()
            .zip(&extras)
            .map(|(&e, &(_, _, class))| writable_over(&g.node(e).shape, g.node(e).dtype, class))
            .collect();
        let block_rows = (BLOCK / cols.max(1)).clamp(1, rows.max(1));
        let row_kernel = rows::recognize(codegen, &instrs, output, &extras, cols);
        let jit = jit::Jit::new(codegen, node, &instrs, output, &extras, cols);
        let segments = if jit.is_none() && row_kernel.is_none() {
            jit::segments(codegen, node, &instrs, output, &extras, cols)
        } else {
            Vec::new()
        };
        Ok(FusedKernel {
            node,
            kind,
            domain,
            split,
            rows,
            cols,
            instrs,
            leaves,
            output,
            extras,
            out_class,
            out_dtype: out.dtype,
            out_shape: out.shape.clone(),
            inputs,
            in_place_ok,
            extra_over_ok,
            block_rows,
            pool: Mutex::new(Vec::new()),
            product: Mutex::new(None),
            jit,
            segments,
            row_kernel,
            pad: None,
            unpadded: Mutex::new(None),
        })
    }

    /// Whether the body runs as generated code (else interpreted).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_generated(&self) -> bool {
        self.jit.is_some()
    }

    /// How many runs of steps run as generated code (a body not generated whole).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn generated_segments(&self) -> usize {
        self.segments.len()
    }

    /// Which hand-fused row kernel runs the body, if one does (`rows.rs`).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn row_kernel_name(&self) -> Option<&'static str> {
        self.row_kernel.map(|r| match r {
            rows::Rows::Softmax { .. } => "softmax",
            rows::Rows::LayerNorm { .. } => "layer_norm",
        })
    }

    /// Computes the node's value into `out` (dense row-major, the node's
    /// dtype `T`; the loop is `run.rs`, a padded output's copy `padded.rs`).
    ///
    /// `in_place`: `Some(k)` when the memory plan computes the output in
    /// the bytes of operand `k`; then `args[k]` is `None` and the kernel
    /// reads operand `k`'s elements from `out` itself (legal only where
    /// [`FusedKernel::can_run_in_place`] says so; otherwise an error). Each
    /// block copies its part of the operand out of `out` before it writes
    /// that part, so no element is read after it was overwritten.
    ///
    /// `extras`: the destinations of body outputs 1.. (dense, their own
    /// bytes), written block by block with the output.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn run<T: super::storage::Elem>(
        &self,
        args: &[Option<&super::CpuBuffer>],
        in_place: Option<usize>,
        out: &mut [T],
        extras: Vec<super::storage::Out<'_>>,
    ) -> Result<()> {
        self.run_over(args, in_place, out, extras, &[])
    }

    /// [`FusedKernel::run`], with extra outputs written over operands:
    /// `over[j - 1] = Some(k)` when body output `j`'s destination (in
    /// `extras`) holds operand `k`'s elements; then `args[k]` is `None`
    /// and the kernel reads operand `k` from that destination, block by
    /// block before writing it, as it reads an in-place operand from
    /// `out` (legal only where [`FusedKernel::can_write_extra_over`] says
    /// so). An empty `over` writes over nothing.
    pub(crate) fn run_over<T: super::storage::Elem>(
        &self,
        args: &[Option<&super::CpuBuffer>],
        in_place: Option<usize>,
        out: &mut [T],
        extras: Vec<super::storage::Out<'_>>,
        over: &[Option<usize>],
    ) -> Result<()> {
        match &self.pad {
            Some(pad) => self.run_padded(pad, args, in_place, out, extras, over),
            None => self.run_dense(args, in_place, out, extras, over),
        }
    }

    /// Whether operand `k` may be computed in place (`run(.., Some(k), ..)`):
    /// the body reads it with identity indexing at the output's type.
    pub(crate) fn can_run_in_place(&self, k: usize) -> bool {
        self.pad.is_none() && self.in_place_ok.get(k).copied().unwrap_or(false)
    }

    /// Whether body output `j` (1.., an extra output) may be written over
    /// operand `k` (`run_over` with `over[j - 1] = Some(k)`): the body
    /// reads it with identity indexing at that output's type and class.
    pub(crate) fn can_write_extra_over(&self, j: usize, k: usize) -> bool {
        self.pad.is_none()
            && j >= 1
            && self.extra_over_ok.get(j - 1).and_then(|o| o.get(k)).copied().unwrap_or(false)
    }
}
