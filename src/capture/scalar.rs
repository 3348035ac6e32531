//! [`HostScalar`]: a number the host changes between calls of a captured
//! step (a learning rate, an EMA decay), read by the step at every call.
//!
//! A captured step never runs its closure again, so a Rust number the
//! closure turns into a tensor (`ctx.scalar(lr)`) is a constant of the
//! step: the value of the recording call, replayed forever. That is right
//! for a number that never changes and silently wrong for a schedule. A
//! `HostScalar` is a shared cell: [`HostScalar::tensor`] records a read of
//! it (a 0-d runtime value, uploaded now), and a captured step whose plan
//! reads that value uploads the cell's value again at every call. Outside
//! captured steps it is a runtime scalar like [`Context::scalar`]: a new
//! value compiles nothing new.
//!
//! The optimizers keep their learning rates in one (`set_lr` sets it), and
//! [`crate::nn::Ema::update_from`] reads its decay from one.

use crate::backends::Buffer;
use crate::ir::{BufferId, DType, HostData, Shape};
use crate::{Context, Result, Tensor};
use half::{bf16, f16};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A number shared between the host and the steps that read it (see the
/// module docs). Cheap to clone: clones share the value.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::capture::HostScalar;
/// let ctx = Context::cpu();
/// let w = ctx.variable("w", ctx.zeros([2]))?;
/// let rate = HostScalar::new(1.0);
/// let (c, r, v) = (ctx.clone(), rate.clone(), w.clone());
/// let mut step = ctx.capture(move |_: &[Tensor]| {
///     v.assign(&*v + &r.tensor(&c, DType::F32))?;
///     Ok(vec![v.tensor()])
/// });
/// step.call(&[])?; // records: w = 1
/// rate.set(0.5);
/// step.call(&[])?; // replays with the new value: w = 1.5
/// assert_eq!(w.to_vec::<f32>()?, vec![1.5, 1.5]);
/// assert_eq!(step.replays(), 1);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct HostScalar(Arc<AtomicU64>);

impl HostScalar {
    /// A cell holding `value`.
    pub fn new(value: f64) -> HostScalar {
        HostScalar(Arc::new(AtomicU64::new(value.to_bits())))
    }

    /// The value now.
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Acquire))
    }

    /// Sets the value that reads recorded from now on take, and that every
    /// later call of a captured step reading this cell uploads.
    pub fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Release)
    }

    /// True if both handles share one cell.
    pub fn same(&self, other: &HostScalar) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Records a read of the value now, as a 0-d tensor of `dtype` on
    /// `ctx`. Record it inside the step that uses it: a captured step
    /// binds the cell's value at each call to every read it recorded.
    #[track_caller]
    pub fn tensor(&self, ctx: &Context, dtype: DType) -> Tensor {
        let data = match host_data(self.get(), dtype) {
            Some(data) => data,
            // Integer and bool reads: an f32 read, cast (the cast is part
            // of the plan, the upload is what a call binds).
            None => return self.tensor(ctx, DType::F32).cast(dtype),
        };
        let buffer = match ctx.inner.backend.upload(data, &Shape::scalar()) {
            Ok(buffer) => buffer,
            Err(e) => return Tensor::failed(e),
        };
        let t = ctx.record_buffer(buffer);
        if let Ok((_, crate::tensor::NodeRef::Node(node))) = t.live() {
            let mut state = ctx.state();
            if let crate::ir::Op::Buffer(id) = state.graph.node(node).op {
                state.host_scalars.insert(id, (self.clone(), dtype));
            }
        }
        t
    }

    /// Uploads the value now as a 0-d buffer of `dtype` (a captured step's
    /// binding of a read recorded by [`HostScalar::tensor`]).
    pub(crate) fn upload(&self, ctx: &Context, dtype: DType) -> Result<Buffer> {
        let data = host_data(self.get(), dtype)
            .ok_or_else(|| crate::Error::Backend(format!("a host scalar read as {dtype}")))?;
        ctx.inner.backend.upload(data, &Shape::scalar())
    }
}

/// The reads of host scalars a context holds, by the buffer each read
/// uploaded (forgotten when the buffer is collected).
pub(crate) type HostScalarReads = HashMap<BufferId, (HostScalar, DType)>;

/// `value` as one element of a floating-point `dtype`; `None` for others.
fn host_data(value: f64, dtype: DType) -> Option<HostData> {
    Some(match dtype {
        DType::F64 => HostData::F64(vec![value]),
        DType::F32 => HostData::F32(vec![value as f32]),
        DType::F16 => HostData::F16(vec![f16::from_f64(value)]),
        DType::BF16 => HostData::BF16(vec![bf16::from_f64(value)]),
        _ => return None,
    })
}
