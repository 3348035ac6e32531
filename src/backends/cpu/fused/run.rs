//! Running a compiled fused kernel: operand checks, leaves resolved
//! against this run's buffers, tasks over row blocks with leased scratch,
//! and the per-block walk over the body's steps.

use super::super::codegen::{Mode, Ty};
use super::super::storage::{dispatch, Elem, HostSlice, Out};
use super::super::{CpuBuffer, Storage};
use super::leaf::{resolve, Data, Leaf, Source, Src};
use super::ops::{self, Arg, Blk, Dst};
use super::stream;
use super::{Class, FusedKernel, Instr, Opnd, Scratch, Step};
use crate::backends::layout::Layout;
use crate::backends::DeviceStats;
use crate::ir::{DType, Element, HostData};
use crate::{Error, Result};
use rayon::prelude::*;
use std::sync::Arc;

/// Outputs at least this large are written with streaming stores: they
/// cannot stay in this machine's caches anyway (32 MB of L3 for both
/// cores), so reading each line in before overwriting it (what a plain
/// store does) would only add a third of the memory traffic.
const STREAM_BYTES: usize = 32 << 20;

/// Below this much work (elements of the domain) a kernel runs on one thread.
const PAR_WORK: usize = super::super::elementwise::PAR_THRESHOLD;

/// Which steps a call of `block` runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Every step, in order.
    All,
    /// The leaves and the product only.
    Leaves,
    /// As `Leaves`, but for those read from an output (in place, or under
    /// an extra output written over them): generated code reads those
    /// from the output itself (`jit_block`).
    LeavesNotOver,
    /// The computed steps (the leaves are resolved), runs of them as
    /// generated segments.
    Rest,
}

/// Everything a run shares across tasks.
struct Ready<'a> {
    /// How each leaf is read (by leaf index).
    srcs: Vec<Src<'a>>,
    /// The product of a matmul body, computed before the loop.
    product: Option<HostData>,
    /// Whether a leaf is read from an output (in place, or an extra
    /// output written over it): then every leaf of a block is read before
    /// any step runs, so none is read after a step wrote its bytes.
    leaves_first: bool,
}

/// Where a leaf's or the product's value for the current block is (every
/// other step's is its scratch).
#[derive(Clone, Copy)]
enum Val<'r> {
    /// An operand of the block (see [`Arg`]).
    Arg(Arg<'r>),
    /// The step's scratch (flat).
    Scratch,
}

/// The values of one block that are not scratch: the leaves', and the product's.
struct Vals<'r> {
    leaves: Vec<Val<'r>>,
    product: Val<'r>,
}

/// A task's scratch, leased from the kernel's pool and given back when
/// the task ends.
struct Lease<'k, 'r> {
    kernel: &'k FusedKernel,
    scratch: Option<Scratch>,
    vals: Vals<'r>,
}

impl Drop for Lease<'_, '_> {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            if let Ok(mut pool) = self.kernel.pool.lock() {
                pool.push(s);
            }
        }
    }
}

impl FusedKernel {
    /// [`FusedKernel::run`] of an unpadded body.
    pub(super) fn run_dense<T: Elem>(
        &self,
        args: &[Option<&CpuBuffer>],
        in_place: Option<usize>,
        out: &mut [T],
        extras: Vec<Out<'_>>,
        over: &[Option<usize>],
    ) -> Result<()> {
        self.check_call((T::DTYPE, out.len()), args, in_place, &extras, over)?;
        let tasks = self.rows.div_ceil(self.block_rows);
        let _span = tracing::trace_span!("fused", node = %self.node, kind = self.kind, tasks).entered();
        if out.is_empty() {
            return Ok(());
        }
        let ready = self.prepare(args, in_place, over)?;
        let per_row = if self.out_class == Class::Full { self.cols } else { 1 };
        let stream = std::mem::size_of_val(out) >= STREAM_BYTES;
        let task_len = self.block_rows * per_row;
        // Each task's pieces of the extra outputs, next to its piece of `out`.
        let mut pieces: Vec<Vec<Out<'_>>> = (0..out.len().div_ceil(task_len)).map(|_| Vec::new()).collect();
        for (e, &(_, _, class)) in extras.into_iter().zip(&self.extras) {
            let len = if class == Class::Full { self.block_rows * self.cols } else { self.block_rows };
            for (t, piece) in e.chunks(len).into_iter().enumerate() {
                pieces[t].push(piece);
            }
        }
        let r = {
            let ready = &ready;
            if self.rows.saturating_mul(self.cols.max(1)) >= PAR_WORK && tasks > 1 {
                out.par_chunks_mut(task_len).zip(pieces).enumerate().try_for_each_init(
                    || self.lease(),
                    |lease, (i, (c, e))| self.work(ready, lease, i, c, e, per_row, stream),
                )
            } else {
                let mut lease = self.lease();
                out.chunks_mut(task_len)
                    .zip(pieces)
                    .enumerate()
                    .try_for_each(|(i, (c, e))| self.work(ready, &mut lease, i, c, e, per_row, stream))
            }
        };
        if let (Some(p), Ok(mut slot)) = (ready.product, self.product.lock()) {
            *slot = Some(p);
        }
        r
    }

    /// A scratch set from the pool, or a new (empty) one.
    fn lease<'r>(&self) -> Lease<'_, 'r> {
        let pooled = self.pool.lock().ok().and_then(|mut p| p.pop());
        let scratch = pooled.unwrap_or_else(|| Scratch {
            vals: self.instrs.iter().map(|ins| ops::scratch(ins.dtype)).collect(),
            row: Vec::new(),
        });
        let vals = Vals { leaves: vec![Val::Scratch; self.leaves.len()], product: Val::Scratch };
        Lease { kernel: self, scratch: Some(scratch), vals }
    }

    /// Task `i` (rows `i * block_rows ..`), whose output is `chunk` and
    /// whose pieces of the extra outputs are `extras`.
    #[allow(clippy::too_many_arguments)]
    fn work<'r, T: Elem>(
        &self,
        ready: &'r Ready<'_>,
        lease: &mut Lease<'_, 'r>,
        i: usize,
        chunk: &mut [T],
        extras: Vec<Out<'_>>,
        per_row: usize,
        stream: bool,
    ) -> Result<()> {
        let scratch =
            lease.scratch.as_mut().ok_or_else(|| Error::Backend("cpu: fused scratch missing".into()))?;
        let nb = chunk.len() / per_row;
        let mut extras = extras;
        let r0 = i * self.block_rows;
        if let Some(rows) = self.row_kernel {
            // The interpreter resolves the leaves; the row kernel does the rest.
            self.block(ready, scratch, &mut lease.vals, r0, nb, chunk, &mut extras, false, Pass::Leaves)?;
            let len = chunk.len();
            let mut own = std::mem::replace(&mut scratch.vals[self.output], HostData::U8(Vec::new()));
            let mut row = std::mem::take(&mut scratch.row);
            let (vals, s) = (&lease.vals, &*scratch);
            let arg = |a| self.arg(vals, s, a);
            let done = if stream {
                // Into the output step's scratch, then streamed out.
                let mut done = false;
                ops::with_out::<f32>(&mut own, len, |o| {
                    done = self.rows_block(rows, arg, nb, o, &mut row)?;
                    if done {
                        stream::stream_copy(Out::new(&mut *chunk).get::<f32>()?, o);
                        stream::stream_fence();
                    }
                    Ok(())
                })?;
                done
            } else {
                self.rows_block(rows, arg, nb, Out::new(&mut *chunk).get::<f32>()?, &mut row)?
            };
            scratch.vals[self.output] = own;
            scratch.row = row;
            if done {
                return Ok(());
            }
        }
        if let (Some(jit), false) = (&self.jit, stream) {
            // The interpreter resolves the leaves; generated code does the rest.
            let pass = Pass::LeavesNotOver;
            self.block(ready, scratch, &mut lease.vals, r0, nb, chunk, &mut extras, false, pass)?;
            let (vals, s) = (&lease.vals, &*scratch);
            let over = |o: Opnd| match (&self.instrs[o.slot], o.per_row) {
                (ins @ Instr { step: Step::Leaf(_), .. }, false) => match ready.srcs.get(ins.leaf) {
                    Some(Src::InPlace) => Some(0),
                    Some(Src::InPlaceExtra(e)) => Some(e + 1),
                    _ => None,
                },
                _ => None,
            };
            if self.jit_block(jit, |o| self.arg(vals, s, o), over, nb, Out::new(&mut *chunk), &mut extras)? {
                return Ok(());
            }
        }
        let r = if self.segments.is_empty() && !ready.leaves_first {
            self.block(ready, scratch, &mut lease.vals, r0, nb, chunk, &mut extras, stream, Pass::All)
        } else {
            // Leaves first: a segment reads those that come after its first
            // step, and an operand read from an output must be read before
            // any step writes there.
            let (vals, ex) = (&mut lease.vals, &mut extras);
            self.block(ready, scratch, vals, r0, nb, chunk, ex, stream, Pass::Leaves)
                .and_then(|()| self.block(ready, scratch, vals, r0, nb, chunk, ex, stream, Pass::Rest))
        };
        let r = r.and_then(|()| {
            for (mut e, &(s, d, class)) in extras.into_iter().zip(&self.extras) {
                let blk = Blk { rows: nb, cols: if class == Class::Full { self.cols } else { 1 } };
                let a = self.arg(&lease.vals, scratch, Opnd { slot: s, per_row: false });
                ops::copy(d, a, &mut Dst::Out(&mut e), blk)?;
            }
            Ok(())
        });
        if stream {
            stream::stream_fence();
        }
        r
    }

    /// Resolves every leaf against this run's operands.
    fn prepare<'a>(
        &self,
        args: &[Option<&'a CpuBuffer>],
        in_place: Option<usize>,
        over: &[Option<usize>],
    ) -> Result<Ready<'a>> {
        let mut srcs = Vec::with_capacity(self.leaves.len());
        for &i in &self.leaves {
            let ins = &self.instrs[i];
            srcs.push(match &ins.step {
                _ if !ins.live => Src::None,
                Step::Leaf(Leaf { source: Source::Input(k), views, .. })
                    if in_place == Some(*k) || over.contains(&Some(*k)) =>
                {
                    if !views.is_empty() {
                        return Err(Error::Backend(format!(
                            "cpu: fused {}: operand {k} is viewed",
                            self.node
                        )));
                    }
                    match over.iter().position(|&o| o == Some(*k)) {
                        Some(e) => Src::InPlaceExtra(e),
                        None => Src::InPlace,
                    }
                }
                Step::Leaf(l) => self.classify(ins, resolve(l, ins.dtype, args)?)?,
                _ => Src::None,
            });
        }
        let mut product = None;
        for ins in &self.instrs {
            if let Step::MatMul(a, b) = &ins.step {
                product = Some(self.product(a, b, ins.dtype, args)?);
            }
        }
        let leaves_first = in_place.is_some() || over.iter().any(Option::is_some);
        Ok(Ready { srcs, product, leaves_first })
    }

    /// How a leaf with this storage and layout is read: in place where
    /// its layout allows (dense, one value, a row broadcast over rows, a
    /// value per row), else gathered per block.
    fn classify<'a>(&self, ins: &Instr, (data, layout): (Data<'a>, Layout)) -> Result<Src<'a>> {
        if layout.numel() > 0 && layout.strides.iter().all(|&s| s == 0) {
            let one = dispatch!(ins.dtype, E => {
                let v = data.get().typed::<E>()?.get(layout.offset).copied();
                E::into_host(vec![v.ok_or_else(|| Error::Backend("cpu: fused leaf past its storage".into()))?])
            });
            return Ok(Src::Splat(one));
        }
        if layout.is_contiguous() {
            return Ok(Src::Dense(data, layout.offset));
        }
        if ins.class == Class::Full && self.cols > 1 && layout.shape == self.domain {
            let part = |lo: usize, hi: usize| Layout {
                shape: crate::ir::Shape(layout.shape.0[lo..hi].to_vec()),
                strides: layout.strides[lo..hi].to_vec(),
                offset: layout.offset,
            };
            let (rows, cols) = (part(0, self.split), part(self.split, layout.shape.rank()));
            if rows.strides.iter().all(|&s| s == 0) && cols.is_contiguous() {
                return Ok(Src::Cols(data, layout.offset));
            }
            if cols.strides.iter().all(|&s| s == 0) && rows.is_contiguous() {
                return Ok(Src::PerRow(data, layout.offset));
            }
        }
        Ok(Src::Strided(data, layout))
    }

    /// The whole product of a matmul body, by the unfused kernel (f32 on
    /// the parallel packed GEMM; f16/bf16 widened to f32 and rounded once;
    /// integers wrapping), into the kernel's product buffer (reused by
    /// every run); the epilogue then reads it block by block.
    fn product(&self, a: &Leaf, b: &Leaf, dtype: DType, args: &[Option<&CpuBuffer>]) -> Result<HostData> {
        let (da, la) = resolve(a, dtype, args)?;
        let (db, lb) = resolve(b, dtype, args)?;
        let stats = Arc::new(DeviceStats::default());
        let buffer = |d: Data<'_>, l: Layout| match d {
            Data::Arg(b, _) => b.with_layout(l),
            Data::Owned(h) => CpuBuffer { storage: Storage::new(h, &stats), layout: l, ready: None },
        };
        let (a, b) = (buffer(da, la), buffer(db, lb));
        let numel = self.rows * self.cols;
        let reuse = self.product.lock().ok().and_then(|mut p| p.take());
        Ok(dispatch!(dtype, E => {
            let mut v = reuse.and_then(E::from_host).unwrap_or_default();
            v.resize(numel, E::default());
            super::super::matmul::matmul(&a, &b, Out::new(&mut v))?;
            E::into_host(v)
        }))
    }

    /// One block: rows `r0 .. r0 + nb`. With `stream`, the output step
    /// writes scratch and the block is streamed out (see [`STREAM_BYTES`]).
    /// `pass` says which steps run (see [`Pass`]).
    #[allow(clippy::too_many_arguments)]
    fn block<'r, T: Elem>(
        &self,
        ready: &'r Ready<'_>,
        scratch: &mut Scratch,
        vals: &mut Vals<'r>,
        r0: usize,
        nb: usize,
        out: &mut [T],
        extras: &mut [Out<'_>],
        stream: bool,
        pass: Pass,
    ) -> Result<()> {
        let cols = self.cols;
        let mut out = Out::new(out);
        let mut direct = false;
        let mut skip_to = 0;
        for (i, ins) in self.instrs.iter().enumerate() {
            if !ins.live || i < skip_to {
                continue;
            }
            let computed = !matches!(ins.step, Step::Leaf(_) | Step::MatMul(..));
            let leaves = matches!(pass, Pass::Leaves | Pass::LeavesNotOver);
            if (leaves && computed) || (pass == Pass::Rest && !computed) {
                continue;
            }
            if pass == Pass::LeavesNotOver
                && matches!(ready.srcs.get(ins.leaf), Some(Src::InPlace | Src::InPlaceExtra(_)))
            {
                continue;
            }
            let (blk, start) = match ins.class {
                Class::Full => (Blk { rows: nb, cols }, r0 * cols),
                Class::Row => (Blk { rows: nb, cols: 1 }, r0),
            };
            match &ins.step {
                Step::Leaf(_) => {
                    let src =
                        ready.srcs.get(ins.leaf).ok_or_else(|| Error::Backend("cpu: fused leaf".into()))?;
                    vals.leaves[ins.leaf] = match src {
                        Src::Dense(d, off) => Val::Arg(Arg::Flat(d.get(), off + start)),
                        Src::Splat(one) => Val::Arg(Arg::Splat(one.into(), 0)),
                        Src::Cols(d, off) => Val::Arg(Arg::Cols(d.get(), *off)),
                        Src::PerRow(d, off) => Val::Arg(Arg::PerRow(d.get(), off + r0)),
                        Src::Strided(data, layout) => {
                            dispatch!(ins.dtype, E => {
                                let from = data.get().typed::<E>()?;
                                ops::with_out::<E>(&mut scratch.vals[i], blk.len(), |o| {
                                    ops::gather(from, layout, start, o);
                                    Ok(())
                                })?
                            });
                            Val::Scratch
                        }
                        Src::InPlace => {
                            // This block of the operand, read before the
                            // output (the last step) overwrites it.
                            let from = out.reborrow().get::<T>()?;
                            let from = from
                                .get(..blk.len())
                                .ok_or_else(|| Error::Backend("cpu: fused in-place block".into()))?;
                            ops::with_out::<T>(&mut scratch.vals[i], blk.len(), |o| {
                                o.copy_from_slice(from);
                                Ok(())
                            })?;
                            Val::Scratch
                        }
                        Src::InPlaceExtra(e) => {
                            // As `InPlace`, from the extra output's block.
                            let at = extras
                                .get_mut(*e)
                                .ok_or_else(|| Error::Backend("cpu: fused extra output missing".into()))?;
                            dispatch!(ins.dtype, E => {
                                let from = at.reborrow().get::<E>()?;
                                let from = from
                                    .get(..blk.len())
                                    .ok_or_else(|| Error::Backend("cpu: fused in-place block".into()))?;
                                ops::with_out::<E>(&mut scratch.vals[i], blk.len(), |o| {
                                    o.copy_from_slice(from);
                                    Ok(())
                                })?
                            });
                            Val::Scratch
                        }
                        Src::None => return Err(Error::Backend("cpu: fused leaf without a source".into())),
                    };
                }
                Step::MatMul(..) => {
                    let h = ready
                        .product
                        .as_ref()
                        .ok_or_else(|| Error::Backend("cpu: fused product missing".into()))?;
                    vals.product = Val::Arg(Arg::Flat(h.into(), start));
                }
                _ => {
                    if pass == Pass::Rest {
                        if let Some(seg) = self.segments.iter().find(|s| s.start == i) {
                            let blk = Blk { rows: nb, cols };
                            if let Some(to_out) = self.segment(seg, scratch, vals, blk, &mut out, !stream)? {
                                direct |= to_out;
                                skip_to = seg.end;
                                continue;
                            }
                        }
                    }
                    let to_out = i == self.output && !stream;
                    let mut own = std::mem::replace(&mut scratch.vals[i], HostData::U8(Vec::new()));
                    let r = {
                        let mut dst = if to_out { Dst::Out(&mut out) } else { Dst::Scratch(&mut own) };
                        self.eval(ins, scratch, vals, blk, &mut dst)
                    };
                    scratch.vals[i] = own;
                    r?;
                    direct |= to_out;
                }
            }
        }
        if !direct && !matches!(pass, Pass::Leaves | Pass::LeavesNotOver) {
            // The output is a leaf or the product itself, or is streamed:
            // copy it out.
            let ins = &self.instrs[self.output];
            let blk = match self.out_class {
                Class::Full => Blk { rows: nb, cols },
                Class::Row => Blk { rows: nb, cols: 1 },
            };
            let a = self.arg(vals, scratch, Opnd { slot: self.output, per_row: false });
            match a.typed::<T>(blk)? {
                ops::TArg::Flat(src) if stream => stream::stream_copy(out.reborrow().get::<T>()?, src),
                _ => ops::copy(ins.dtype, a, &mut Dst::Out(&mut out), blk)?,
            }
        }
        Ok(())
    }

    /// Computes step `ins` (not a leaf or the product) for one block into `dst`.
    fn eval(
        &self,
        ins: &Instr,
        scratch: &Scratch,
        vals: &Vals<'_>,
        b: Blk,
        dst: &mut Dst<'_, '_>,
    ) -> Result<()> {
        let a = |o: Opnd| self.arg(vals, scratch, o);
        let d = ins.dtype;
        match &ins.step {
            Step::Unary(op, x) => ops::unary(*op, d, a(*x), dst, b),
            Step::Binary(op, x, y) => ops::binary(*op, d, a(*x), a(*y), dst, b),
            Step::Compare(op, x, y) => ops::compare(*op, self.instrs[x.slot].dtype, a(*x), a(*y), dst, b),
            Step::Where(c, x, y) => ops::where_(d, a(*c), a(*x), a(*y), dst, b),
            Step::Cast(x) => ops::cast(self.instrs[x.slot].dtype, d, a(*x), dst, b),
            Step::Copy(x) => ops::copy(d, a(*x), dst, b),
            Step::Reduce(op, x) => ops::reduce(*op, d, a(*x), dst, Blk { rows: b.rows, cols: self.cols }),
            Step::Leaf(_) | Step::MatMul(..) => {
                Err(Error::Backend("cpu: fused leaf evaluated as a step".into()))
            }
        }
    }

    /// Operand `o` of a step for the current block.
    fn arg<'v>(&self, vals: &Vals<'v>, scratch: &'v Scratch, o: Opnd) -> Arg<'v> {
        let ins = &self.instrs[o.slot];
        let val = match ins.step {
            Step::Leaf(_) => vals.leaves.get(ins.leaf).copied().unwrap_or(Val::Scratch),
            Step::MatMul(..) => vals.product,
            _ => Val::Scratch,
        };
        let flat = match val {
            Val::Arg(a) => a,
            Val::Scratch => Arg::Flat(HostSlice::from(&scratch.vals[o.slot]), 0),
        };
        match (flat, o.per_row) {
            (Arg::Flat(h, s), true) => Arg::PerRow(h, s),
            (a, _) => a,
        }
    }
}

impl FusedKernel {
    /// Runs segment `seg` over a block: its outputs into their scratch (or
    /// the block's output, when it is one and `to_out_ok`). `Some(wrote
    /// the output)`, or `None` when it has no code (interpret its steps).
    fn segment(
        &self,
        seg: &super::jit::Segment,
        scratch: &mut Scratch,
        vals: &Vals<'_>,
        blk: Blk,
        out: &mut Out<'_>,
        to_out_ok: bool,
    ) -> Result<Option<bool>> {
        let len = blk.len();
        let mut ptrs = Vec::with_capacity(seg.jit.args().len() + seg.outputs.len());
        // Outputs first: growing scratch moves it, so no argument's
        // address is taken before every output has its room.
        let mut outs = Vec::with_capacity(seg.outputs.len());
        let mut to_out = false;
        for &s in &seg.outputs {
            let p: *mut u8 = if s == self.output && to_out_ok {
                to_out = true;
                super::jit::out_address(out.reborrow(), ty_of(self.instrs[s].dtype)?, len)?
            } else {
                let mut p = std::ptr::null_mut();
                dispatch!(self.instrs[s].dtype, E => ops::with_out::<E>(&mut scratch.vals[s], len, |o| {
                    p = o.as_mut_ptr().cast();
                    Ok(())
                })?);
                p
            };
            outs.push(p);
        }
        let mut modes = Vec::with_capacity(seg.jit.args().len());
        for (&o, &t) in seg.jit.args().iter().zip(&seg.jit.body().args) {
            let a = self.arg(vals, scratch, o);
            let (p, m) = match t {
                Ty::F32 => super::jit::address::<f32>(a, blk)?,
                Ty::Bool => super::jit::address::<bool>(a, blk)?,
            };
            ptrs.push(p);
            modes.push(m);
        }
        let Some(kernel) = seg.jit.kernel(self.node, &modes) else { return Ok(None) };
        ptrs.extend(outs);
        let (rows, cols) = if modes.iter().any(|m| matches!(m, Mode::Cols | Mode::PerRow)) {
            (blk.rows, blk.cols)
        } else {
            (1, len)
        };
        // SAFETY: every argument was checked against the block as its mode
        // reads it (`address`); each output is `len` elements of its type,
        // of the block's output (checked by `out_address`) or of its own
        // step's scratch (grown above, before any argument's address was
        // taken, and not touched until the call returns); the outputs are
        // the segment's own steps, which it does not read, so no output
        // overlaps an argument or another output.
        unsafe { kernel.call(&ptrs, rows, cols)? };
        Ok(Some(to_out))
    }
}

fn ty_of(d: DType) -> Result<Ty> {
    match d {
        DType::F32 => Ok(Ty::F32),
        DType::Bool => Ok(Ty::Bool),
        _ => Err(Error::Backend(format!("cpu: a generated segment writes {d}"))),
    }
}
