//! Lowering of the ops that write into a copy of an operand, `index_add`
//! (a copy of the base, then the scatter kernel) and `write_at` (a copy of
//! the target, then the window kernel), and of `attention` (one generated
//! kernel over strided operands, see `codegen/attention.rs`; for a few
//! query rows, the split-key kernels of `codegen/attention_decode.rs`,
//! unless `KILN_CUDA_DECODE_ATTENTION=0`; on an sm_90 device, where it is
//! chosen, the `wgmma` kernel of `codegen/attention_wgmma.rs`), and of its
//! backward (`codegen/attention_grad.rs`; on an sm_90 device the `dk, dv`
//! and stored-`dSᵀ` `dq` kernels of `codegen/attention_grad_wgmma.rs`).

use super::ops::{buffer_locs, operand};
use super::{Lowering, Storage, Value};
use crate::backends::cuda::codegen::attention::{flash, flash_with_lse, Spec, Strided};
use crate::backends::cuda::codegen::attention_grad::{self, GradSpec};
use crate::backends::cuda::codegen::attention_grad_ds::{self, DsLayout};
use crate::backends::cuda::codegen::ops;
use crate::backends::cuda::codegen::{
    attention_decode, attention_grad_wgmma, attention_simt, attention_wgmma, index_add,
};
use crate::backends::cuda::program::{IndexCheck, Launch, Loc, Region};
use crate::ir::{AttnLayout, AttnMask, AttnWrt, DType, NodeId, Shape};

impl Lowering<'_> {
    /// `out = x`, then `out[.., index[j], ..] += src[.., j, ..]` in index order.
    pub(super) fn index_add(
        &mut self,
        id: NodeId,
        dim: usize,
        ops: &[Value],
        shape: &Shape,
        dst: Loc,
    ) -> Result<(), String> {
        self.copy_into(&ops[0], shape, dst)?;
        let (idx, src) = (operand(&ops[1]), operand(&ops[2]));
        if idx.access.shape().numel() == 0 {
            return Ok(());
        }
        let status_at = 8 * (1 + self.plan.random_streams as u64) + 16 * self.checks.len() as u64;
        let status = Loc::new(Region::Params, status_at);
        let k = self.add_kernel("index_add", |n| Ok(index_add::generate(n, &idx, &src, dim, shape)))?;
        let mut args = vec![dst];
        args.extend(buffer_locs(&ops[1..]));
        args.push(status);
        self.launches.push(Launch::Kernel { kernel: k, args });
        let report = self.add_kernel("index_report", |n| Ok(ops::index_report(n, &idx, &idx.access)))?;
        let mut args = vec![status];
        if let Storage::Mem(l) = ops[1].storage {
            args.push(l);
        }
        self.launches.push(Launch::Kernel { kernel: report, args });
        self.checks.push(IndexCheck {
            node: id,
            op: "index_add",
            dim,
            size: shape.0[dim],
            status: status_at,
        });
        Ok(())
    }

    /// `out = x`, then `value` over the window at the clamped offset. The
    /// copy is skipped when `dst` is `x`'s own memory (an in-place write:
    /// the executable binds a donated input there).
    pub(super) fn write_at(
        &mut self,
        dim: usize,
        ops: &[Value],
        shape: &Shape,
        dst: Loc,
    ) -> Result<(), String> {
        let in_place = matches!(ops[0].storage, Storage::Mem(l) if l == dst)
            && ops[0].layout.is_contiguous()
            && ops[0].layout.offset == 0;
        if !in_place {
            self.copy_into(&ops[0], shape, dst)?;
        }
        let (value, offset) = (operand(&ops[1]), operand(&ops[2]));
        if value.access.shape().numel() == 0 {
            return Ok(());
        }
        let k = self.add_kernel("write_at", |n| Ok(ops::write_at(n, &value, &offset, dim, shape)))?;
        let mut args = vec![dst];
        args.extend(buffer_locs(&ops[1..]));
        self.launches.push(Launch::Kernel { kernel: k, args });
        Ok(())
    }

    /// One launch of the flash kernel for this shape; the tensor-core one,
    /// also writing the rows' log-sum-exp, where an `extra` reads it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &mut self,
        id: NodeId,
        ops: &[Value],
        scale: f64,
        causal: bool,
        mask: AttnMask,
        layout: AttnLayout,
        shape: &Shape,
        dst: Loc,
    ) -> Result<(), String> {
        let vals = self.in_memory(ops)?;
        let spec = Spec { layout, ..spec_of(&vals, 3, (scale, causal, mask)) };
        debug_assert_eq!(spec.dv, shape.0[3]);
        if let Some(extra) = self.extras_of(id).first().copied().flatten() {
            let (lse_shape, lse_dtype) = crate::ir::extra_type(&self.plan.graph, id, 1)?;
            let lse = self.destination(extra)?;
            self.values.insert(extra, Value::dense(lse, lse_shape, lse_dtype));
            let kernel = if self.wgmma(&spec) {
                self.add_kernel("attention", |n| Ok(attention_wgmma::flash_wgmma(n, &spec, true)))?
            } else {
                self.add_kernel("attention", |n| flash_with_lse(n, &spec))?
            };
            let mut args = vec![dst, lse];
            args.extend(buffer_locs(&vals));
            self.launches.push(Launch::Kernel { kernel, args });
            return Ok(());
        }
        if attention_decode::applies(&spec) && !super::gemv::off("KILN_CUDA_DECODE_ATTENTION") {
            // A few query rows: keys split over blocks (`attention_decode.rs`).
            let kernel = self.add_kernel("attention_decode", |n| Ok(attention_decode::partial(n, &spec)))?;
            let mut args = vec![dst];
            if attention_decode::chunks(&spec) > 1 {
                args.push(self.transient(attention_decode::workspace_bytes(&spec)));
                args.push(self.new_counters(attention_decode::rows(&spec)));
            }
            args.extend(buffer_locs(&vals));
            self.launches.push(Launch::Kernel { kernel, args });
            return Ok(());
        }
        if self.wgmma(&spec) {
            let kernel =
                self.add_kernel("attention", |n| Ok(attention_wgmma::flash_wgmma(n, &spec, false)))?;
            let mut args = vec![dst];
            args.extend(buffer_locs(&vals));
            self.launches.push(Launch::Kernel { kernel, args });
            return Ok(());
        }
        let kernel = self.add_kernel("attention", |n| flash(n, &spec))?;
        let mut args = vec![dst];
        if attention_simt::uses(&spec) && attention_simt::splits(&spec) > 1 {
            // The register-tiled f32 kernel with its keys split over blocks.
            args.push(self.transient(attention_simt::workspace_bytes(&spec)));
            args.push(self.new_counters(attention_simt::counters(&spec)));
        }
        args.extend(buffer_locs(&vals));
        self.launches.push(Launch::Kernel { kernel, args });
        Ok(())
    }

    /// Whether the forward of `spec` runs on the Hopper `wgmma` kernel: on
    /// an sm_90 device, where `attention_wgmma::chosen` says so.
    fn wgmma(&self, spec: &Spec) -> bool {
        self.hopper && attention_wgmma::chosen(spec)
    }

    /// `attention_stats` (`wrt` `None`) or `attention_grad`: one launch of
    /// the tensor-core backward kernel for this shape
    /// (`codegen/attention_grad.rs`); two for `wrt=qkv` and `wrt=kv+q`
    /// (whose `dq` is node `id`'s `extra output=1`), `dk, dv` then `dq`.
    /// Those share a transient `dSᵀ` scratch where it fits
    /// (`codegen/attention_grad_ds.rs`), the pair launched once per group
    /// of batches the scratch holds.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_backward(
        &mut self,
        id: NodeId,
        ops: &[Value],
        scale: f64,
        causal: bool,
        mask: AttnMask,
        wrt: Option<AttnWrt>,
        dst: Loc,
    ) -> Result<(), String> {
        let vals = self.in_memory(ops)?;
        // Operands: q, k, v (o for the stats), g, [stats], [mask].
        let mask_at = if wrt.is_some() { 5 } else { 4 };
        let attn = spec_of(&vals, mask_at, (scale, causal, mask));
        let packed = wrt == Some(AttnWrt::QueryKeyValue);
        let spec = GradSpec { attn, g: strided(&vals[3]), packed };
        if !attention_grad::applies(&spec) {
            return Err(format!(
                "the CUDA attention backward runs f16 and bf16 heads of 16 to {} (multiples of 16), got {} heads of {} and {}",
                crate::attention::MAX_FUSED_GRAD_HEAD_DIM,
                spec.attn.dtype,
                spec.attn.d,
                spec.attn.dv
            ) + "; the attention-grad pass expands the others");
        }
        if wrt.is_some() && !(vals[4].layout.is_contiguous() && vals[4].layout.offset == 0) {
            return Err("attention_grad reads its stats contiguous".into());
        }
        // Where each gradient goes: `(kv, q)`.
        let outs = match wrt {
            None => {
                let kernel = self.add_kernel("attention_stats", |n| Ok(attention_grad::stats(n, &spec)))?;
                return self.backward_launch(&vals, dst, kernel);
            }
            Some(AttnWrt::QueryKeyValue) => (dst, Some(dst)),
            Some(AttnWrt::KeyValueAndQuery) => match self.extras_of(id).first().copied().flatten() {
                Some(extra) => {
                    let (shape, dtype) = crate::ir::extra_type(&self.plan.graph, id, 1)?;
                    let dq = self.destination(extra)?;
                    self.values.insert(extra, Value::dense(dq, shape, dtype));
                    (dst, Some(dq))
                }
                None => (dst, None),
            },
            Some(wrt) => {
                let kernel = self.grad_kernel(&spec, wrt)?;
                return self.backward_launch(&vals, dst, kernel);
            }
        };
        let (kv_out, q_out) = match outs {
            (kv, Some(q)) => (kv, q),
            (kv, None) => {
                let kernel = self.grad_kernel(&spec, AttnWrt::KeyValue)?;
                return self.backward_launch(&vals, kv, kernel);
            }
        };
        let Some(ds) = DsLayout::for_spec(&spec) else {
            // Both kernels, `dq` recomputing the scores.
            let (kv, q) =
                (self.grad_kernel(&spec, AttnWrt::KeyValue)?, self.grad_kernel(&spec, AttnWrt::Query)?);
            self.backward_launch(&vals, kv_out, kv)?;
            return self.backward_launch(&vals, q_out, q);
        };
        // `dk, dv` first, storing `dSᵀ`; then `dq` from it, per group of
        // `ds.batches` batches: the same two kernels each time, every
        // operand and output moved on by the group's first batch (each is
        // batch-major; a broadcast mask's batch stride is 0).
        let group = GradSpec { attn: Spec { batch: ds.batches, ..spec.attn.clone() }, ..spec.clone() };
        let scratch = self.transient(ds.bytes());
        let kv = self.kv_kernel(&group, Some(&ds))?;
        let q = if self.hopper && attention_grad_wgmma::chosen(&group) {
            self.add_kernel("attention_grad", |n| Ok(attention_grad_wgmma::grad_q(n, &group, &ds)))?
        } else {
            self.add_kernel("attention_grad", |n| Ok(attention_grad_ds::grad_q(n, &group, &ds)))?
        };
        let (batch, esize) = (spec.attn.batch.max(1), spec.attn.dtype.size() as u64);
        let (kv_batch, q_batch) = if packed {
            let per_batch = 3 * spec.attn.sq * spec.attn.heads * spec.attn.d;
            (per_batch, per_batch)
        } else {
            let Spec { heads, sq, sk, d, dv, .. } = spec.attn;
            (heads * sk * (d + dv), heads * sq * d)
        };
        for b0 in (0..batch).step_by(ds.batches) {
            let ins: Vec<Loc> = vals
                .iter()
                .filter_map(|v| match v.storage {
                    Storage::Mem(l) => {
                        Some(l.plus((b0 * v.layout.strides[0]) as u64 * v.dtype.size() as u64))
                    }
                    Storage::Const(_) => None,
                })
                .collect();
            for (kernel, out) in [
                (kv, kv_out.plus((b0 * kv_batch) as u64 * esize)),
                (q, q_out.plus((b0 * q_batch) as u64 * esize)),
            ] {
                let mut args = vec![out];
                args.extend(&ins);
                args.push(scratch);
                self.launches.push(Launch::Kernel { kernel, args });
            }
        }
        Ok(())
    }

    /// The `wrt=q` or `wrt=kv` kernel for `spec`.
    fn grad_kernel(&mut self, spec: &GradSpec, wrt: AttnWrt) -> Result<usize, String> {
        if wrt == AttnWrt::KeyValue {
            return self.kv_kernel(spec, None);
        }
        self.add_kernel("attention_grad", |n| attention_grad::grad(n, spec, wrt))
    }

    /// The `dk, dv` kernel for `spec` (storing `dSᵀ` in `ds`'s layout, with
    /// one): on an sm_90 device the `wgmma` kernel where
    /// `attention_grad_wgmma::chosen` says so, else the `mma.sync` one.
    fn kv_kernel(&mut self, spec: &GradSpec, ds: Option<&DsLayout>) -> Result<usize, String> {
        if self.hopper && attention_grad_wgmma::chosen(spec) {
            return self.add_kernel("attention_grad", |n| Ok(attention_grad_wgmma::grad_kv(n, spec, ds)));
        }
        self.add_kernel("attention_grad", |n| Ok(attention_grad::grad_kv(n, spec, ds)))
    }

    /// One launch of `kernel`, writing `out` and reading `vals`.
    fn backward_launch(&mut self, vals: &[Value], out: Loc, kernel: usize) -> Result<(), String> {
        let mut args = vec![out];
        args.extend(buffer_locs(vals));
        self.launches.push(Launch::Kernel { kernel, args });
        Ok(())
    }

    /// `attention_delta o, g, lse`: one row kernel
    /// (`attention_grad::delta`).
    pub(super) fn attention_delta(&mut self, ops: &[Value], dtype: DType, dst: Loc) -> Result<(), String> {
        let vals = self.in_memory(ops)?;
        let (o, g, lse) = (&vals[0], &vals[1], &vals[2]);
        if !(lse.layout.is_contiguous() && lse.layout.offset == 0) {
            return Err("attention_delta reads its log-sum-exp contiguous".into());
        }
        let dims: [usize; 4] = o.layout.shape.0[..]
            .try_into()
            .map_err(|_| format!("attention_delta of a rank-{} output", o.layout.shape.rank()))?;
        let (os, gs) = (strided(o), strided(g));
        let kernel =
            self.add_kernel("attention_delta", |n| Ok(attention_grad::delta(n, o.dtype, dims, &os, &gs)))?;
        debug_assert_eq!(dtype, lse.dtype);
        let mut args = vec![dst];
        args.extend(buffer_locs(&vals));
        self.launches.push(Launch::Kernel { kernel, args });
        Ok(())
    }

    /// `ops` with every constant operand (a `full`, which has no memory)
    /// written out: the attention kernels read memory through strides.
    fn in_memory(&mut self, ops: &[Value]) -> Result<Vec<Value>, String> {
        let mut vals = Vec::with_capacity(ops.len());
        for v in ops {
            vals.push(match v.storage {
                Storage::Mem(_) => v.clone(),
                Storage::Const(_) => self.materialize(v)?,
            });
        }
        Ok(vals)
    }
}

/// The [`Spec`] of an attention over `vals` (q, k, then the values or the
/// forward's output, whose last dim is `dv`), with its mask operand at
/// `mask_at` if there is one.
fn spec_of(vals: &[Value], mask_at: usize, (scale, causal, mask): (f64, bool, AttnMask)) -> Spec {
    let (q, k, v) = (&vals[0].layout.shape.0, &vals[1].layout.shape.0, &vals[2].layout.shape.0);
    Spec {
        dtype: vals[0].dtype,
        batch: q[0],
        heads: q[1],
        sq: q[2],
        sk: k[2],
        d: q[3],
        dv: v[3],
        scale,
        causal,
        mask,
        mask_dtype: vals.get(mask_at).map_or(DType::Bool, |m| m.dtype),
        q: strided(&vals[0]),
        k: strided(&vals[1]),
        v: strided(&vals[2]),
        m: vals.get(mask_at).map(strided),
        layout: AttnLayout::Bhsd,
    }
}

/// A rank-4 operand's offset and strides, as the attention kernels index it.
fn strided(v: &Value) -> Strided {
    let s = &v.layout.strides;
    Strided { offset: v.layout.offset, strides: [s[0], s[1], s[2], s[3]] }
}
