//! One step of a compiled plan: the kernel of its op, written where its
//! [`Place`] says (a fresh allocation or the plan's arena).

use super::arena::Arena;
use super::exec::{CpuExecutable, Place, Step};
use super::storage::{dispatch, Elem, Out, Storage};
use super::{
    attention, attention_grad, conv, elementwise, index, pool, pool_grad, reduce, source, CpuBuffer, Layout,
};
use crate::backends::RngArgs;
use crate::ir::{DType, Element, HostData, NodeId, Op, Shape};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl CpuExecutable {
    /// Runs `step`'s kernel on `args` (its operands, in slot order) and
    /// returns its value.
    ///
    /// A fused node with several outputs also writes its extra outputs,
    /// which it pushes to `extras` as (step position, value) for the
    /// `extra` steps to take.
    pub(super) fn launch(
        &self,
        step: &Step,
        args: &[CpuBuffer],
        inputs: &super::run::Inputs,
        rng: &RngArgs,
        arena: Option<&Arc<Arena>>,
        extras: &mut Vec<(usize, CpuBuffer)>,
    ) -> Result<CpuBuffer> {
        let node = self.plan.graph.node(step.id);
        let shape = &node.shape;
        let x = || args.first().ok_or_else(|| Error::Backend(format!("cpu: {} has no operand", step.id)));
        let y = || args.get(1).ok_or_else(|| Error::Backend(format!("cpu: {} lacks operand 1", step.id)));
        // Runs `$body` with `$out: Out` over the step's destination.
        macro_rules! write {
            (|$out:ident| $body:expr) => {
                dispatch!(node.dtype, T => self.write::<T>(step, arena, |$out: Out<'_>| $body))
            };
        }
        match &node.op {
            Op::Input(k) => {
                let b = inputs.bind(*k as usize, self.plan.donated.contains(k))?;
                if b.shape() != shape || b.dtype() != node.dtype {
                    return Err(Error::Backend(format!(
                        "cpu: input {k} is {}{} but the plan expects {}{shape}",
                        b.dtype(),
                        b.shape(),
                        node.dtype
                    )));
                }
                Ok(b)
            }
            Op::Buffer(_) => Err(Error::Backend(format!("cpu: buffer node {} in a plan", step.id))),
            // One element viewed with all strides 0: a constant costs one
            // element of memory whatever its shape, and kernels read it as
            // they read any broadcast.
            Op::Full(v) if step.place == Place::Auto => {
                let one = dispatch!(node.dtype, T => {
                    let mut data = vec![T::default(); 1];
                    source::full(*v, Out::new(&mut data));
                    CpuBuffer::dense(T::into_host(data), Shape::scalar(), &self.stats)?
                });
                let layout = one.layout.expand(shape);
                Ok(one.with_layout(layout))
            }
            Op::Full(v) => write!(|out| {
                source::full(*v, out);
                Ok(())
            }),
            Op::Arange { start, step: inc } => write!(|out| {
                source::arange(*start, *inc, out);
                Ok(())
            }),
            Op::Random { dist, stream } => {
                let s = rng.streams.get(*stream as usize).copied().ok_or_else(|| {
                    Error::Backend(format!(
                        "cpu: random stream {stream} is not bound ({} given)",
                        rng.streams.len()
                    ))
                })?;
                write!(|out| source::random(*dist, rng.seed, s, out))
            }
            Op::Reshape(_) | Op::Permute(_) | Op::Expand(_) | Op::Slice { .. } => {
                let a = x()?;
                let layout = match &node.op {
                    Op::Reshape(target) => a.layout.reshape(target),
                    Op::Permute(perm) => Some(a.layout.permute(perm)),
                    Op::Expand(target) => Some(a.layout.expand(target)),
                    Op::Slice { dim, start, step: s, len } => Some(a.layout.slice(*dim, *start, *s, *len)),
                    _ => None,
                };
                match (layout, step.place) {
                    (Some(l), Place::Auto) => Ok(a.with_layout(l)),
                    (layout, place) => {
                        // A copy: the plan gave the view bytes of its own, or
                        // a reshape cannot be a view on this layout.
                        if place == Place::Auto {
                            self.stats.view_copies.fetch_add(1, Ordering::Relaxed);
                        }
                        // A reshape copies its operand's elements in order;
                        // any other view copies the view's elements.
                        let src = match layout {
                            Some(l) if !matches!(node.op, Op::Reshape(_)) => a.with_layout(l),
                            _ => a.clone(),
                        };
                        write!(|out| {
                            dispatch!(src.dtype(), S => elementwise::copy_into(src.view::<S>()?, out.get::<S>()?));
                            Ok(())
                        })
                    }
                }
            }
            Op::Unary(u) => write!(|out| elementwise::unary(x()?, *u, out)),
            Op::Binary(b) => write!(|out| elementwise::binary(x()?, y()?, *b, out)),
            Op::Compare(c) => write!(|out| elementwise::compare(x()?, y()?, *c, out)),
            Op::Where => {
                let z = args.get(2).ok_or_else(|| Error::Backend("cpu: where lacks operand 2".into()))?;
                write!(|out| elementwise::where_(x()?, y()?, z, out))
            }
            Op::Cast(_) => write!(|out| elementwise::cast(x()?, out)),
            Op::Reduce { op, dims, into: None, .. } => write!(|out| reduce::reduce(x()?, *op, dims, out)),
            Op::Reduce { op, dims, into: Some(to), .. } => {
                // Widened into scratch first, so the bits are exactly
                // `sum(cast(x))`'s; the CPU keeps the copy the CUDA column
                // kernel avoids (it widens as it loads).
                let a = x()?;
                let wide = dispatch!(*to, B => {
                    let mut data = vec![B::default(); a.shape().numel()];
                    elementwise::cast(a, Out::new(&mut data))?;
                    CpuBuffer::dense(B::into_host(data), a.shape().clone(), &self.stats)?
                });
                write!(|out| reduce::reduce(&wide, *op, dims, out))
            }
            Op::MatMul => write!(|out| super::matmul::matmul(x()?, y()?, out)),
            Op::Conv2d { stride, padding, dilation, groups } => {
                let p = conv::ConvParams {
                    stride: *stride,
                    padding: *padding,
                    dilation: *dilation,
                    groups: *groups,
                };
                write!(|out| conv::conv2d(x()?, y()?, p, out))
            }
            Op::Pool2d { kind, kernel, stride, padding } => {
                let p = conv::PoolParams { kind: *kind, kernel: *kernel, stride: *stride, padding: *padding };
                write!(|out| conv::pool2d(x()?, p, out))
            }
            Op::MaxPool2dGrad { kernel, stride, padding } => {
                let kind = crate::ir::PoolKind::Max;
                let p = conv::PoolParams { kind, kernel: *kernel, stride: *stride, padding: *padding };
                write!(|out| pool_grad::max_pool2d_grad(x()?, y()?, p, out))
            }
            Op::Gather { dim } => write!(|out| index::gather(x()?, y()?, *dim, step.id, out)),
            Op::IndexSelect { dim } => write!(|out| index::index_select(x()?, y()?, *dim, step.id, out)),
            Op::IndexAdd { dim } => {
                let z = args.get(2).ok_or_else(|| Error::Backend("cpu: index_add lacks operand 2".into()))?;
                write!(|out| index::index_add(x()?, y()?, z, *dim, step.id, out))
            }
            Op::WriteAt { dim } => {
                let offset =
                    args.get(2).ok_or_else(|| Error::Backend("cpu: write_at lacks its offset".into()))?;
                write!(|out| index::write_at(Some(x()?), y()?, offset, *dim, shape, out))
            }
            Op::Attention { scale, causal, mask, layout } => {
                let k = args.get(1).ok_or_else(|| Error::Backend("cpu: attention lacks its keys".into()))?;
                let v =
                    args.get(2).ok_or_else(|| Error::Backend("cpu: attention lacks its values".into()))?;
                // The rows' log-sum-exp, where an `extra` step reads it.
                let mut lse = self.extra_output(step, arena)?;
                let value = write!(|out| {
                    let lse_out = lse.as_mut().map(|(_, d)| d.out());
                    attention::attention(
                        x()?,
                        k,
                        v,
                        args.get(3),
                        *mask,
                        *scale,
                        *causal,
                        *layout,
                        out,
                        lse_out,
                    )
                })?;
                if let Some((p, d)) = lse {
                    extras.push((p, d.finish(&self.stats)?));
                }
                Ok(value)
            }
            Op::AttentionDelta => {
                let [o, g, lse] = operands::<3>(args, "attention_delta")?;
                write!(|out| attention_grad::delta(o, g, lse, out))
            }
            Op::AttentionStats { scale, causal, mask } => {
                let [q, k, o, g] = operands::<4>(args, "attention_stats")?;
                write!(|out| attention_grad::stats(q, k, o, g, args.get(4), *mask, *scale, *causal, out))
            }
            Op::AttentionGrad { scale, causal, mask, wrt } => {
                let ops = operands::<5>(args, "attention_grad")?;
                // `wrt=kv+q`: the queries' gradient, where an `extra` reads it.
                let mut dq = self.extra_output(step, arena)?;
                let value = write!(|out| {
                    let dq_out = dq.as_mut().map(|(_, d)| d.out());
                    attention_grad::grad(ops, args.get(5), *mask, *scale, *causal, *wrt, out, dq_out)
                })?;
                if let Some((p, d)) = dq {
                    extras.push((p, d.finish(&self.stats)?));
                }
                Ok(value)
            }
            Op::Collective { what, .. } => {
                let member = self.member.as_ref().ok_or_else(|| {
                    Error::Backend(format!(
                        "cpu: {} in a plan of a context in no process group",
                        what.mnemonic()
                    ))
                })?;
                let operand = x()?;
                let sent = operand.to_host()?;
                let got = member.host.exchange(member.rank, *what, operand.shape(), sent)?;
                write!(|out| {
                    let dst = out.get::<T>()?;
                    let src = super::storage::typed::<T>(&got)?;
                    // A reduce-scatter's rank takes its chunk of the shared result.
                    let at = what.result_offset(member.rank, dst.len());
                    let src = src.get(at..at + dst.len()).ok_or_else(|| {
                        Error::Backend(format!(
                            "cpu: {} returned {} elements, rank {} needs {}..{}",
                            what.mnemonic(),
                            src.len(),
                            member.rank,
                            at,
                            at + dst.len()
                        ))
                    })?;
                    dst.copy_from_slice(src);
                    Ok(())
                })
            }
            Op::Cat { dim } => {
                let parts: Vec<&CpuBuffer> = args.iter().collect();
                write!(|out| index::cat(&parts, *dim, shape, out))
            }
            // In a graph run without the pipeline (the pass tests run their
            // inputs so): the value itself. The assign pass lowers every one.
            Op::Assign if step.place == Place::Auto => Ok(y()?.clone()),
            Op::Assign => Err(Error::Backend(format!("cpu: assign {} placed in memory", step.id))),
            Op::Fused(body) => {
                let in_place = match step.place {
                    Place::InPlaceOf { slot, .. } => Some(slot),
                    _ => None,
                };
                let operands: Vec<Option<&CpuBuffer>> =
                    args.iter().enumerate().map(|(k, a)| (Some(k) != in_place).then_some(a)).collect();
                self.fused(step, body, &operands, Vec::new(), arena, extras)
            }
            Op::Extra { .. } => Err(Error::Backend(format!(
                "cpu: extra {} has no value: its fused node did not write it",
                step.id
            ))),
        }
    }

    /// Runs a `write_at` placed over its donated target ([`Place::OverInput`])
    /// in the target's own storage: only the window is written. Gives the
    /// target back (`Err`) when the run does not hold the only reference
    /// to a dense storage of exactly the target's elements; the caller
    /// then runs the copying kernel.
    pub(super) fn write_over(
        &self,
        step: &Step,
        mut target: CpuBuffer,
        rest: &[CpuBuffer],
    ) -> Result<std::result::Result<CpuBuffer, CpuBuffer>> {
        let node = self.plan.graph.node(step.id);
        let Op::WriteAt { dim } = node.op else {
            return Err(Error::Backend(format!(
                "cpu: {} is placed over an input but is no write_at",
                step.id
            )));
        };
        let (Some(value), Some(offset)) = (rest.first(), rest.get(1)) else {
            return Err(Error::Backend(format!("cpu: write_at {} lacks its operands", step.id)));
        };
        let numel = node.shape.numel();
        let dense =
            target.layout.is_contiguous() && target.layout.offset == 0 && target.shape() == &node.shape;
        if !dense || target.dtype() != node.dtype {
            return Ok(Err(target));
        }
        let Some(data) = Storage::exclusive(&mut target.storage, numel) else { return Ok(Err(target)) };
        dispatch!(node.dtype, T => {
            let elems = T::vec_mut(data)
                .ok_or_else(|| Error::Backend(format!("cpu: write_at {} over storage of another dtype", step.id)))?;
            index::write_at(None, value, offset, dim, &node.shape, Out::new(elems.as_mut_slice()))?;
        });
        Ok(Ok(target))
    }

    /// The destination of output 1 of `step`'s attention node (its
    /// log-sum-exp, or a `kv+q` gradient's queries' gradient), with the
    /// position of the `extra` step that reads it; `None` where none does.
    fn extra_output<'a>(
        &self,
        step: &Step,
        arena: Option<&'a Arc<Arena>>,
    ) -> Result<Option<(usize, Dest<'a>)>> {
        let Some(p) = self.extras.get(&step.id).and_then(|s| s.first().copied().flatten()) else {
            return Ok(None);
        };
        let (shape, dt) = crate::ir::extra_type(&self.plan.graph, step.id, 1).map_err(Error::Backend)?;
        let (id, place) = (self.steps[p].id, self.steps[p].place);
        Ok(Some((p, dispatch!(dt, E => Dest::new::<E>(place, &shape, arena, id))?)))
    }

    /// Calls `kernel` on the step's destination of `T`s and wraps it as the
    /// step's value: a fresh (pooled) allocation for [`Place::Auto`], the
    /// step's arena range otherwise.
    pub(super) fn write<T: Elem>(
        &self,
        step: &Step,
        arena: Option<&Arc<Arena>>,
        kernel: impl FnOnce(Out<'_>) -> Result<()>,
    ) -> Result<CpuBuffer> {
        let shape = &self.plan.graph.node(step.id).shape;
        let mut dest = Dest::new::<T>(step.place, shape, arena, step.id)?;
        kernel(dest.out())?;
        dest.finish(&self.stats)
    }
}

/// Where a step's kernel writes its value, before it does: fresh (pooled)
/// elements for [`Place::Auto`] (and a value the plan puts over an input,
/// which gets its own bytes here), or the step's arena range.
pub(super) struct Dest<'a> {
    shape: Shape,
    dtype: DType,
    bytes: Bytes<'a>,
}

enum Bytes<'a> {
    Fresh(HostData),
    Arena { arena: &'a Arc<Arena>, offset: usize, len: usize },
}

impl<'a> Dest<'a> {
    /// The destination of a `T` value of `shape` placed at `place` (node
    /// `id`, for errors), its range checked against the arena.
    pub(super) fn new<T: Elem>(
        place: Place,
        shape: &Shape,
        arena: Option<&'a Arc<Arena>>,
        id: NodeId,
    ) -> Result<Dest<'a>> {
        let (offset, len) = match place {
            Place::Auto | Place::OverInput => {
                let data = pool::vec_for_overwrite::<T>(shape.numel())?;
                let bytes = Bytes::Fresh(T::into_host(data));
                return Ok(Dest { shape: shape.clone(), dtype: T::DTYPE, bytes });
            }
            Place::Arena { offset, len } | Place::InPlaceOf { offset, len, .. } => (offset, len),
        };
        let arena = arena.ok_or_else(|| Error::Backend(format!("cpu: {id} is placed in a missing arena")))?;
        arena.check_range::<T>(offset, len)?;
        if len != shape.numel() {
            return Err(Error::Backend(format!("cpu: {id}: arena range of {len} elements for {shape}")));
        }
        // Bytes the arena last used for another dtype need not be valid
        // bools, so a bool range is cleared first, except when the step
        // computes in place: then the range holds the operand the kernel
        // is about to read, a bool of the same shape (a fused kernel runs
        // in place only at its output's dtype, `can_run_in_place`), whose
        // bytes are valid bools already. Clearing it made the kernel read
        // `false` for every operand element (found by the differential
        // test, tests/robust/differential/regress.rs).
        if T::DTYPE == DType::Bool && matches!(place, Place::Arena { .. }) {
            // SAFETY: as for `slice_mut` in `out` (the same range, before it).
            unsafe { arena.zero(offset, len) };
        }
        Ok(Dest { shape: shape.clone(), dtype: T::DTYPE, bytes: Bytes::Arena { arena, offset, len } })
    }

    /// The elements to write.
    pub(super) fn out(&mut self) -> Out<'_> {
        match &mut self.bytes {
            Bytes::Fresh(data) => host_out(data),
            Bytes::Arena { arena, offset, len } => {
                let (offset, len) = (*offset, *len);
                // SAFETY: the range is inside the arena and aligned for
                // the dtype (checked in `new`) and its bytes are valid
                // elements (any bit pattern of the numeric dtypes; bools
                // were just zeroed, or hold the in-place operand's bools).
                // No other slice of these bytes lives while the kernel
                // runs: the operands' ranges (through views) do not
                // overlap it, save an in-place operand that is never
                // viewed, which compile checked; other values sharing
                // bytes with it are not live now (with one stream they run
                // one at a time; across streams `ir::verify` and
                // `hazards.rs` checked the plan); no value escapes a run in
                // the arena (outputs are copied out) and a run holds its
                // arena alone (`Arc::get_mut` in `run`).
                dispatch!(self.dtype, T => Out::new(unsafe { arena.slice_mut::<T>(offset, len) }))
            }
        }
    }

    /// The written value.
    pub(super) fn finish(self, stats: &Arc<crate::backends::DeviceStats>) -> Result<CpuBuffer> {
        match self.bytes {
            Bytes::Fresh(data) => CpuBuffer::dense(data, self.shape, stats),
            Bytes::Arena { arena, offset, len } => Ok(CpuBuffer {
                storage: dispatch!(self.dtype, T => Storage::in_arena::<T>(arena, offset, len)?),
                layout: Layout::contiguous(self.shape),
                ready: None,
            }),
        }
    }
}

/// Fresh elements as a kernel's output.
pub(super) fn host_out(data: &mut HostData) -> Out<'_> {
    match data {
        HostData::F16(v) => Out::new(v.as_mut_slice()),
        HostData::BF16(v) => Out::new(v.as_mut_slice()),
        HostData::F32(v) => Out::new(v.as_mut_slice()),
        HostData::F64(v) => Out::new(v.as_mut_slice()),
        HostData::U8(v) => Out::new(v.as_mut_slice()),
        HostData::I32(v) => Out::new(v.as_mut_slice()),
        HostData::I64(v) => Out::new(v.as_mut_slice()),
        HostData::Bool(v) => Out::new(v.as_mut_slice()),
    }
}

/// The first `N` operands of a step, or an error naming `op`.
fn operands<'a, const N: usize>(args: &'a [CpuBuffer], op: &str) -> Result<[&'a CpuBuffer; N]> {
    let first: Vec<&CpuBuffer> = args.iter().take(N).collect();
    first.try_into().map_err(|_| Error::Backend(format!("cpu: {op} takes {N} operands, got {}", args.len())))
}
