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
//! Rows are processed in blocks of [`BLOCK`] / `cols` rows (at least one),
//! blocks in parallel on rayon. Within a block every body node is a
//! scratch vector: *full* nodes (shape `D`) hold `rows * cols` elements,
//! *row* nodes (the row shape, reductions) one element per row. The body's
//! nodes run in topological order, each a plain loop over its block
//! ([`ops`]); reductions reduce each row's columns, an `expand` of a row
//! value broadcasts it along the row. Softmax and layernorm thus read
//! their input once and write the output once, and an elementwise chain
//! makes no full-size intermediate.
//!
//! Leaves (`input k`, `full`) are read through their view chain composed
//! into one strided layout over the actual buffer: a contiguous leaf is
//! read in place, a broadcast scalar (every stride 0, e.g. `full`) is
//! filled into scratch once per task, any other layout is gathered per
//! block. A `reshape` that cannot be a view of the buffer's layout is
//! copied to a dense buffer once per run (rare).
//!
//! # Sizes
//!
//! [`BLOCK`] is 4096 elements: a block of a few `f32` nodes (16 KB each)
//! stays in L2, and the per-block cost (one dispatch per node, a few
//! odometers) is small next to 4096 elements of work. It is fixed, never
//! derived from the thread count, so results never depend on it. A matmul
//! body multiplies [`GEMM_ROWS`] rows at a time (matrixmultiply repacks B
//! per call, so fewer rows would repeat that packing too often) and runs
//! the epilogue on that product in blocks of [`BLOCK`] elements while it
//! is in cache.
//!
//! # Semantics
//!
//! Elementwise nodes use the unfused kernels' element functions, so an
//! elementwise body is bit-identical fused and unfused. Reductions
//! accumulate as `reduce.rs` does (floats in `f64`, left to right in a
//! row); the unfused kernel sums very long rows of few-row tensors in
//! parallel segments, so those sums may differ in the last bits.

mod gemm;
mod leaf;
mod ops;

use super::layout::Layout;
use super::storage::HostSlice;
use super::storage::{dispatch, typed, Elem};
use super::{CpuBuffer, Storage};
use crate::backends::DeviceStats;
use crate::ir::fused::is_leaf_or_leaf_view;
use crate::ir::{
    BinaryOp, CompareOp, DType, Element, FusedBody, FusedKind, HostData, NodeId, Op, ReduceOp, Shape, UnaryOp,
};
use crate::{Error, Result};
use leaf::{leaf, resolve, Data, Leaf, Source, Src};
use ops::Arg;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// Elements of a full-size node per block (see the module docs).
pub(crate) const BLOCK: usize = 4096;
/// Rows of a matmul body's product computed per GEMM call.
pub(crate) const GEMM_ROWS: usize = 128;
/// Below this much work (elements of the domain) a kernel runs on one thread.
const PAR_WORK: usize = super::elementwise::PAR_THRESHOLD;

/// Whether a node holds one value per element of the domain or per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Full,
    Row,
}

/// One step of the compiled body; operands are earlier step indices.
#[derive(Clone, Debug)]
enum Step {
    Leaf(Leaf),
    Unary(UnaryOp, usize),
    Binary(BinaryOp, usize, usize),
    Compare(CompareOp, usize, usize),
    Where(usize, usize, usize),
    Cast(usize),
    Reduce(ReduceOp, usize),
    /// A row value broadcast along its row (`expand` of a reduced value).
    RowExpand(usize),
    /// An `expand` to the same shape.
    Copy(usize),
    MatMul(Leaf, Leaf),
}

#[derive(Clone, Debug)]
struct Instr {
    step: Step,
    dtype: DType,
    class: Class,
}

/// A fused node compiled for the CPU: the body flattened into steps over
/// a row-blocked domain. Built once per fused node when a plan is
/// compiled; [`FusedKernel::run`] runs it any number of times.
#[derive(Debug)]
pub(crate) struct FusedKernel {
    node: NodeId,
    kind: &'static str,
    rows: usize,
    cols: usize,
    instrs: Vec<Instr>,
    /// The step whose value is the output.
    output: usize,
    out_class: Class,
    out_dtype: DType,
    out_shape: Shape,
    /// Shape and dtype of each operand.
    inputs: Vec<(Shape, DType)>,
    /// Whether operand `k` may be computed in place (see [`FusedKernel::run`]).
    in_place_ok: Vec<bool>,
    /// Rows per block of the epilogue loop.
    block_rows: usize,
    /// Rows per parallel task (a multiple of nothing in particular: the
    /// last inner block of a task may be short).
    task_rows: usize,
}

impl FusedKernel {
    /// Compiles `body` (the body of fused node `node`, named in errors).
    /// A body that breaks the contract of [`crate::ir::fused`] is an error.
    pub(crate) fn compile(body: &FusedBody, node: NodeId) -> Result<FusedKernel> {
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
        for id in g.topo_order() {
            let n = g.node(id);
            let operands = g.operands(id);
            let operand = |i: usize| {
                operands
                    .get(i)
                    .and_then(|o| slot.get(o).copied())
                    .ok_or_else(|| err(format!("operand {i} of {id} is not computed before it")))
            };
            let same = |i: usize, class: Class| {
                let s = operand(i)?;
                // With one column a row value and a full value are the same.
                if instrs[s].class != class && cols != 1 {
                    return Err(err(format!("operand {i} of {id} is not at the shape of {id}")));
                }
                Ok(s)
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
                    Op::Reduce { op, dims, keepdim } => {
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
                            (Step::RowExpand(same(0, Class::Row)?), c)
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
            instrs.push(Instr { step, dtype: n.dtype, class });
        }
        let output = *slot.get(&out_id).ok_or_else(|| err("the body's output is not computed".into()))?;
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
        let in_place_ok = input_nodes
            .iter()
            .map(|&i| {
                let n = g.node(i);
                n.shape == out.shape
                    && n.dtype == out.dtype
                    && g.users(i).iter().all(|&u| !g.node(u).op.is_view() && Some(u) != mm)
                    && slot.get(&i).is_none_or(|&s| instrs[s].class == out_class || cols == 1)
            })
            .collect();
        let block_rows = (BLOCK / cols.max(1)).max(1);
        let task_rows = if mm.is_some() { block_rows.max(GEMM_ROWS) } else { block_rows };
        Ok(FusedKernel {
            node,
            kind,
            rows,
            cols,
            instrs,
            output,
            out_class,
            out_dtype: out.dtype,
            out_shape: out.shape.clone(),
            inputs,
            in_place_ok,
            block_rows,
            task_rows,
        })
    }

    /// Whether operand `k` may be computed in place (`run(.., Some(k), ..)`):
    /// the body reads it with identity indexing at the output's type.
    pub(crate) fn can_run_in_place(&self, k: usize) -> bool {
        self.in_place_ok.get(k).copied().unwrap_or(false)
    }

    /// Computes the node's value into `out` (dense row-major, the node's
    /// dtype `T`).
    ///
    /// `in_place`: `Some(k)` when the memory plan computes the output in
    /// the bytes of operand `k`; then `args[k]` is `None` and the kernel
    /// reads operand `k`'s elements from `out` itself (legal only where
    /// [`FusedKernel::can_run_in_place`] says so; otherwise an error). Each
    /// block copies its part of the operand out of `out` before it writes
    /// that part, so no element is read after it was overwritten.
    pub(crate) fn run<T: Elem>(
        &self,
        args: &[Option<&CpuBuffer>],
        in_place: Option<usize>,
        out: &mut [T],
    ) -> Result<()> {
        let err = |m: String| Error::Backend(format!("cpu: fused {}: {m}", self.node));
        if T::DTYPE != self.out_dtype || out.len() != self.out_shape.numel() {
            return Err(err(format!(
                "the output is {}{} but {} {} elements were given",
                self.out_dtype,
                self.out_shape,
                out.len(),
                T::DTYPE
            )));
        }
        if args.len() != self.inputs.len() {
            return Err(err(format!(
                "{} operand(s) given, the body reads {}",
                args.len(),
                self.inputs.len()
            )));
        }
        for (k, (a, (s, d))) in args.iter().zip(&self.inputs).enumerate() {
            match (a, in_place == Some(k)) {
                (None, true) if !self.can_run_in_place(k) => {
                    return Err(err(format!("operand {k} cannot be computed in place (it is not read elementwise at the output's type)")))
                }
                (None, true) => {}
                (Some(_), true) => return Err(err(format!("operand {k} is computed in place; pass None for it"))),
                (None, false) => return Err(err(format!("operand {k} is missing"))),
                (Some(b), false) if b.shape() != s || b.dtype() != *d => {
                    return Err(err(format!("operand {k} is {}{} but the body reads {d}{s}", b.dtype(), b.shape())))
                }
                (Some(_), false) => {}
            }
        }
        if in_place.is_some_and(|k| k >= args.len()) {
            return Err(err("the in-place operand is out of range".into()));
        }
        let blocks = self.rows.div_ceil(self.task_rows);
        let _span = tracing::trace_span!("fused", node = %self.node, kind = self.kind, blocks).entered();
        if out.is_empty() {
            return Ok(());
        }
        let ready = self.prepare(args, in_place)?;
        let per_row = if self.out_class == Class::Full { self.cols } else { 1 };
        let task_len = self.task_rows * per_row;
        let ready = &ready;
        if self.rows.saturating_mul(self.cols.max(1)) >= PAR_WORK && blocks > 1 {
            out.par_chunks_mut(task_len)
                .enumerate()
                .try_for_each_init(|| self.task(ready), |task, (i, c)| self.work(ready, task, i, c, per_row))
        } else {
            let mut task = self.task(ready);
            out.chunks_mut(task_len)
                .enumerate()
                .try_for_each(|(i, c)| self.work(ready, &mut task, i, c, per_row))
        }
    }

    /// Task block `i` (rows `i * task_rows ..`), whose output is `chunk`.
    fn work<'r, T: Elem>(
        &self,
        ready: &'r Ready<'_>,
        task: &mut Task<'r>,
        i: usize,
        chunk: &mut [T],
        per_row: usize,
    ) -> Result<()> {
        let r_begin = i * self.task_rows;
        let n_rows = chunk.len() / per_row;
        self.gemm(ready, task, r_begin, n_rows)?;
        let mut r = 0;
        while r < n_rows {
            let nb = self.block_rows.min(n_rows - r);
            let o = &mut chunk[r * per_row..(r + nb) * per_row];
            self.block(ready, task, r_begin + r, r * self.cols, nb, o)?;
            r += nb;
        }
        Ok(())
    }

    /// Resolves every leaf against this run's operands.
    fn prepare<'a>(&self, args: &[Option<&'a CpuBuffer>], in_place: Option<usize>) -> Result<Ready<'a>> {
        let mut srcs = Vec::with_capacity(self.instrs.len());
        let mut mm = Mm::None;
        for ins in &self.instrs {
            srcs.push(match &ins.step {
                Step::Leaf(Leaf { source: Source::Input(k), views, .. }) if in_place == Some(*k) => {
                    if !views.is_empty() {
                        return Err(Error::Backend(format!("cpu: fused {}: operand {k} is viewed", self.node)));
                    }
                    Src::InPlace
                }
                Step::Leaf(l) => {
                    let (data, layout) = resolve(l, ins.dtype, args)?;
                    if layout.numel() > 0 && layout.strides.iter().all(|&s| s == 0) {
                        let one = dispatch!(ins.dtype, E => E::into_host(vec![data.get().typed::<E>()?[layout.offset]]));
                        Src::Splat(one)
                    } else if layout.is_contiguous() {
                        Src::Dense(data, layout.offset)
                    } else {
                        Src::Strided(data, layout)
                    }
                }
                Step::MatMul(a, b) => {
                    mm = self.prepare_matmul(a, b, ins.dtype, args)?;
                    Src::None
                }
                _ => Src::None,
            });
        }
        Ok(Ready { srcs, mm })
    }

    fn prepare_matmul<'a>(
        &self,
        a: &Leaf,
        b: &Leaf,
        dtype: DType,
        args: &[Option<&'a CpuBuffer>],
    ) -> Result<Mm<'a>> {
        let (da, la) = resolve(a, dtype, args)?;
        let (db, lb) = resolve(b, dtype, args)?;
        if matches!(dtype, DType::F32 | DType::F64) {
            let p = gemm::Problem::checked(&la, da.get().len(), &lb, db.get().len())?;
            return Ok(Mm::Gemm { a: da, b: db, p, dtype });
        }
        // Other dtypes: the unfused kernel (f16/bf16 widened to f32 and
        // rounded once, integers wrapping), then the epilogue reads it.
        let stats = Arc::new(DeviceStats::default());
        let buffer = |d: Data<'a>, l: Layout| match d {
            Data::Arg(b, _) => b.with_layout(l),
            Data::Owned(h) => CpuBuffer { storage: Storage::new(h, &stats), layout: l },
        };
        let (a, b) = (buffer(da, la), buffer(db, lb));
        let (sa, sb) = (a.shape().0.clone(), b.shape().0.clone());
        let numel =
            sa[..sa.len().saturating_sub(1)].iter().product::<usize>() * sb.last().copied().unwrap_or(1);
        let product = dispatch!(dtype, E => {
            let mut v = vec![E::default(); numel];
            super::matmul::matmul(&a, &b, super::storage::Out::new(&mut v))?;
            E::into_host(v)
        });
        Ok(Mm::Done(product))
    }

    /// Per-task scratch: one vector per step, constants filled once.
    fn task<'r>(&self, ready: &'r Ready<'_>) -> Task<'r> {
        let len = |c: Class| if c == Class::Full { self.block_rows * self.cols } else { self.block_rows };
        let vals = self
            .instrs
            .iter()
            .zip(&ready.srcs)
            .map(|(ins, src)| match (src, &ready.mm, &ins.step) {
                (Src::Dense(d, off), _, _) => Val::Ref(d.get(), *off),
                (Src::Splat(one), _, _) => Val::Own(dispatch!(ins.dtype, E => {
                    let v = typed::<E>(one).ok().and_then(|s| s.first().copied()).unwrap_or_default();
                    E::into_host(vec![v; len(ins.class)])
                })),
                (_, Mm::Done(h), Step::MatMul(..)) => Val::Ref(h.into(), 0),
                (_, Mm::Gemm { .. }, Step::MatMul(..)) => Val::Gemm(0),
                _ => Val::Own(ops::scratch(ins.dtype, len(ins.class))),
            })
            .collect();
        let gemm = match &ready.mm {
            Mm::Gemm { dtype, .. } => ops::scratch(*dtype, 0),
            _ => HostData::U8(Vec::new()),
        };
        Task { vals, gemm }
    }

    /// The product rows `r0 .. r0 + n_rows` into the task's GEMM buffer
    /// (matmul bodies with an f32/f64 matmul; a no-op otherwise).
    fn gemm(&self, ready: &Ready<'_>, task: &mut Task<'_>, r0: usize, n_rows: usize) -> Result<()> {
        let Mm::Gemm { a, b, p, dtype } = &ready.mm else { return Ok(()) };
        let len = n_rows * p.n;
        if *dtype == DType::F32 {
            let (x, y) = (a.get().typed::<f32>()?, b.get().typed::<f32>()?);
            ops::with_out::<f32>(&mut task.gemm, len, |d| p.rows(x, y, r0, n_rows, d))
        } else {
            let (x, y) = (a.get().typed::<f64>()?, b.get().typed::<f64>()?);
            ops::with_out::<f64>(&mut task.gemm, len, |d| p.rows(x, y, r0, n_rows, d))
        }
    }

    /// One block: rows `r0 .. r0 + nb`, whose product (matmul bodies)
    /// starts at element `gemm_at` of the task's GEMM buffer.
    fn block<'r, T: Elem>(
        &self,
        ready: &'r Ready<'_>,
        task: &mut Task<'r>,
        r0: usize,
        gemm_at: usize,
        nb: usize,
        out: &mut [T],
    ) -> Result<()> {
        let cols = self.cols;
        for (i, ins) in self.instrs.iter().enumerate() {
            let (len, start) = match ins.class {
                Class::Full => (nb * cols, r0 * cols),
                Class::Row => (nb, r0),
            };
            let mut dst = match (&ins.step, &ready.srcs[i]) {
                (Step::Leaf(_), Src::Dense(d, off)) => {
                    task.vals[i] = Val::Ref(d.get(), off + start);
                    continue;
                }
                (Step::Leaf(_), Src::Splat(_)) => continue,
                (Step::MatMul(..), _) => {
                    task.vals[i] = match &ready.mm {
                        Mm::Done(h) => Val::Ref(h.into(), start),
                        _ => Val::Gemm(gemm_at),
                    };
                    continue;
                }
                _ => match std::mem::replace(&mut task.vals[i], Val::Gemm(0)) {
                    Val::Own(h) => h,
                    _ => return Err(Error::Backend("cpu: fused scratch missing".into())),
                },
            };
            let r = self.eval(ins, &ready.srcs[i], &*task, start, len, nb, &mut dst, out);
            task.vals[i] = Val::Own(dst);
            r?;
        }
        let v = task.arg(self.output).get::<T>(out.len())?;
        out.copy_from_slice(v);
        Ok(())
    }

    /// Computes step `ins` for one block into `dst`.
    #[allow(clippy::too_many_arguments)]
    fn eval<T: Elem>(
        &self,
        ins: &Instr,
        src: &Src<'_>,
        task: &Task<'_>,
        start: usize,
        len: usize,
        nb: usize,
        dst: &mut HostData,
        out: &[T],
    ) -> Result<()> {
        let a = |s: usize| task.arg(s);
        let d = ins.dtype;
        match &ins.step {
            Step::Leaf(_) => match src {
                Src::Strided(data, layout) => dispatch!(d, E => {
                    let from = data.get().typed::<E>()?;
                    ops::with_out::<E>(dst, len, |o| {
                        ops::gather(from, layout, start, o);
                        Ok(())
                    })
                }),
                Src::InPlace => {
                    let from =
                        out.get(..len).ok_or_else(|| Error::Backend("cpu: fused in-place block".into()))?;
                    ops::with_out::<T>(dst, len, |o| {
                        o.copy_from_slice(from);
                        Ok(())
                    })
                }
                _ => Err(Error::Backend("cpu: fused leaf without a source".into())),
            },
            Step::Unary(op, x) => ops::unary(*op, d, a(*x), dst, len),
            Step::Binary(op, x, y) => ops::binary(*op, d, a(*x), a(*y), dst, len),
            Step::Compare(op, x, y) => ops::compare(*op, self.instrs[*x].dtype, a(*x), a(*y), dst, len),
            Step::Where(c, x, y) => ops::where_(d, a(*c), a(*x), a(*y), dst, len),
            Step::Cast(x) => ops::cast(self.instrs[*x].dtype, d, a(*x), dst, len),
            Step::Copy(x) => ops::copy(d, a(*x), dst, len),
            Step::Reduce(op, x) => ops::reduce(*op, d, a(*x), dst, nb, self.cols),
            Step::RowExpand(x) => ops::row_expand(d, a(*x), dst, nb, self.cols),
            Step::MatMul(..) => Err(Error::Backend("cpu: fused matmul evaluated as a step".into())),
        }
    }
}

/// The matmul of a matmul body for this run.
enum Mm<'a> {
    None,
    /// f32/f64: multiplied per task block.
    Gemm {
        a: Data<'a>,
        b: Data<'a>,
        p: gemm::Problem,
        dtype: DType,
    },
    /// Other dtypes: the whole product, computed up front.
    Done(HostData),
}

/// Everything a run shares across tasks.
struct Ready<'a> {
    srcs: Vec<Src<'a>>,
    mm: Mm<'a>,
}

/// Where a step's value for the current block lives.
enum Val<'r> {
    /// Task scratch (first `len` elements).
    Own(HostData),
    /// Elements of run-wide storage from an offset.
    Ref(HostSlice<'r>, usize),
    /// The task's GEMM buffer from an offset.
    Gemm(usize),
}

/// One rayon task's scratch, reused across its blocks.
struct Task<'r> {
    vals: Vec<Val<'r>>,
    gemm: HostData,
}

impl Task<'_> {
    fn arg(&self, slot: usize) -> Arg<'_> {
        match &self.vals[slot] {
            Val::Own(h) => Arg { h: h.into(), start: 0 },
            Val::Ref(h, start) => Arg { h: *h, start: *start },
            Val::Gemm(start) => Arg { h: (&self.gemm).into(), start: *start },
        }
    }
}
