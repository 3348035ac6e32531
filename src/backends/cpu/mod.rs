//! The CPU backend: strided buffers over shared typed storage, kernels
//! parallelized with rayon, matmul and conv through matrixmultiply on rayon row blocks.
//!
//! A [`CpuBuffer`] is an `Arc` of typed storage plus a [`Layout`] (shape,
//! strides, offset), so view ops (reshape where strides allow, permute,
//! expand, slice) cost no copy. Running a plan walks `plan.order` once;
//! each intermediate is dropped as soon as its last user has run, so peak
//! memory follows the live set, not the whole graph. Elementwise semantics
//! are those of [`crate::ir::eval`], shared with constant folding.

mod conv;
mod elementwise;
mod fused;
mod index;
mod layout;
mod matmul;
mod pool;
mod reduce;
mod source;
mod storage;
#[cfg(test)]
mod tests;

pub use layout::Layout;

use super::{Backend, Buffer, DeviceStats, Executable, RngArgs};
use crate::ir::{DType, HostData, NodeId, Op, Plan, Shape};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use storage::{typed, Elem, Storage, View};

/// A CPU tensor: shared typed storage viewed through a strided layout.
/// Cloning shares the storage; views made by the backend share it too.
#[derive(Clone, Debug)]
pub struct CpuBuffer {
    storage: Arc<Storage>,
    layout: Layout,
}

impl CpuBuffer {
    /// Wraps freshly computed row-major data of `shape`, crediting `stats`.
    fn dense(data: HostData, shape: Shape, stats: &Arc<DeviceStats>) -> Result<CpuBuffer> {
        if data.len() != shape.numel() {
            return Err(Error::Backend(format!(
                "cpu: {} elements do not fill shape {shape} ({} elements)",
                data.len(),
                shape.numel()
            )));
        }
        Ok(CpuBuffer { storage: Storage::new(data, stats), layout: Layout::contiguous(shape) })
    }

    /// The same storage under another layout (a zero-copy view).
    fn with_layout(&self, layout: Layout) -> CpuBuffer {
        CpuBuffer { storage: self.storage.clone(), layout }
    }

    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.layout.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.data().dtype()
    }

    /// How the logical elements map onto the storage; tests and future
    /// fused kernels use it to tell views from copies.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// True when `self` and `other` read the same allocation (one is a view
    /// of the other, or both of a third).
    pub fn shares_storage(&self, other: &CpuBuffer) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// The typed view kernels read.
    pub(crate) fn view<T: Elem>(&self) -> Result<View<'_, T>> {
        Ok(View { data: typed::<T>(self.storage.data())?, layout: &self.layout })
    }

    /// The elements, row-major and dense.
    fn to_host(&self) -> Result<HostData> {
        storage::dispatch!(self.dtype(), T => {
            let v = self.view::<T>()?;
            if v.layout.extent() > v.data.len() {
                return Err(Error::Backend("cpu: buffer layout exceeds its storage".into()));
            }
            Ok(<T as crate::ir::Element>::into_host(elementwise::contiguous(v)))
        })
    }
}

/// The CPU device: runs plans with rayon on the global thread pool and
/// keeps the allocation counters of every buffer it creates.
#[derive(Debug, Default)]
pub struct CpuBackend {
    stats: Arc<DeviceStats>,
}

impl CpuBackend {
    /// A CPU backend with fresh counters.
    pub fn new() -> CpuBackend {
        CpuBackend { stats: Arc::new(DeviceStats::default()) }
    }
}

fn cpu(b: &Buffer) -> &CpuBuffer {
    match b {
        Buffer::Cpu(c) => c,
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload(&self, data: HostData, shape: &Shape) -> Result<Buffer> {
        if data.len() != shape.numel() {
            return Err(Error::Backend(format!(
                "upload: {} {} elements do not match shape {shape} ({} elements)",
                data.len(),
                data.dtype(),
                shape.numel()
            )));
        }
        Ok(Buffer::Cpu(CpuBuffer::dense(data, shape.clone(), &self.stats)?))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        cpu(buffer).to_host()
    }

    fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>> {
        Ok(Arc::new(CpuExecutable::new(plan, self.stats.clone())?))
    }

    fn stats(&self) -> Arc<DeviceStats> {
        self.stats.clone()
    }
}

/// One step of a compiled plan.
struct Step {
    id: NodeId,
    /// Positions (in `order`) of the operands, in slot order.
    operands: Vec<usize>,
}

/// A plan prepared for repeated runs: operand positions and use counts are
/// computed once at compile time.
struct CpuExecutable {
    plan: Arc<Plan>,
    stats: Arc<DeviceStats>,
    steps: Vec<Step>,
    /// How many times each position is read (operand slots plus outputs).
    uses: Vec<usize>,
    /// Positions of the graph outputs.
    outputs: Vec<usize>,
    /// The compiled kernel of each fused step (by step index).
    fused: Vec<Option<fused::FusedKernel>>,
}

impl CpuExecutable {
    fn new(plan: Arc<Plan>, stats: Arc<DeviceStats>) -> Result<CpuExecutable> {
        let pos: HashMap<NodeId, usize> = plan.order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let find = |id: NodeId, what: &str| {
            pos.get(&id).copied().ok_or_else(|| {
                Error::Backend(format!("cpu: {what} {id} is not in the plan order before its use"))
            })
        };
        let mut steps = Vec::with_capacity(plan.order.len());
        let mut uses = vec![0usize; plan.order.len()];
        let mut fused = Vec::with_capacity(plan.order.len());
        for (i, &id) in plan.order.iter().enumerate() {
            if !plan.graph.contains(id) {
                return Err(Error::Backend(format!("cpu: plan orders {id}, which is not in its graph")));
            }
            let mut operands = Vec::new();
            for o in plan.graph.operands(id) {
                let p = find(o, "operand")?;
                if p >= i {
                    return Err(Error::Backend(format!("cpu: operand {o} of {id} runs after it")));
                }
                uses[p] += 1;
                operands.push(p);
            }
            if let Op::Buffer(b) = plan.graph.node(id).op {
                return Err(Error::Backend(format!(
                    "cpu: plan contains buffer node {id} (buffer {}); plans bind inputs instead",
                    b.0
                )));
            }
            // Kernels index storage on the strength of these types; a plan
            // built without checks must not be able to make them panic.
            let node = plan.graph.node(id);
            let types: Vec<(&Shape, DType)> = operands
                .iter()
                .map(|&p| plan.order[p])
                .map(|o| (&plan.graph.node(o).shape, plan.graph.node(o).dtype))
                .collect();
            match crate::ir::infer(&node.op, &types) {
                Ok(Some((s, d))) if s == node.shape && d == node.dtype => {}
                Ok(None) => {}
                Ok(Some((s, d))) => {
                    return Err(Error::Backend(format!(
                        "cpu: {id} ({}) is declared {}{} but its operands give {d}{s}",
                        node.op.mnemonic(),
                        node.dtype,
                        node.shape
                    )))
                }
                Err(e) => return Err(Error::Backend(format!("cpu: {id} ({}): {e}", node.op.mnemonic()))),
            }
            let kernel = match &node.op {
                Op::Fused(body) => Some(fused::FusedKernel::compile(body, id)?),
                _ => None,
            };
            fused.push(kernel);
            steps.push(Step { id, operands });
        }
        let mut outputs = Vec::new();
        for &o in plan.graph.outputs() {
            let p = find(o, "output")?;
            uses[p] += 1;
            outputs.push(p);
        }
        Ok(CpuExecutable { plan, stats, steps, uses, outputs, fused })
    }

    fn exec(
        &self,
        i: usize,
        step: &Step,
        args: &[&CpuBuffer],
        inputs: &[Buffer],
        rng: &RngArgs,
    ) -> Result<CpuBuffer> {
        let node = self.plan.graph.node(step.id);
        let shape = &node.shape;
        let dense = |data: HostData| CpuBuffer::dense(data, shape.clone(), &self.stats);
        let x = || {
            args.first().copied().ok_or_else(|| Error::Backend(format!("cpu: {} has no operand", step.id)))
        };
        let y = || {
            args.get(1).copied().ok_or_else(|| Error::Backend(format!("cpu: {} lacks operand 1", step.id)))
        };
        match &node.op {
            Op::Input(k) => {
                let b = inputs.get(*k as usize).map(cpu).ok_or_else(|| {
                    Error::Backend(format!("cpu: input {k} is not bound ({} given)", inputs.len()))
                })?;
                if b.shape() != shape || b.dtype() != node.dtype {
                    return Err(Error::Backend(format!(
                        "cpu: input {k} is {}{} but the plan expects {}{shape}",
                        b.dtype(),
                        b.shape(),
                        node.dtype
                    )));
                }
                Ok(b.clone())
            }
            Op::Buffer(_) => Err(Error::Backend(format!("cpu: buffer node {} in a plan", step.id))),
            // One element viewed with all strides 0: a constant costs one
            // element of memory whatever its shape, and kernels read it as
            // they read any broadcast.
            Op::Full(v) => {
                let one = CpuBuffer::dense(
                    source::full(*v, &Shape::scalar(), node.dtype),
                    Shape::scalar(),
                    &self.stats,
                )?;
                let layout = one.layout.expand(shape);
                Ok(one.with_layout(layout))
            }
            Op::Arange { start, step: inc } => dense(source::arange(*start, *inc, shape.numel(), node.dtype)),
            Op::Random { dist, stream } => {
                let s = rng.streams.get(*stream as usize).copied().ok_or_else(|| {
                    Error::Backend(format!(
                        "cpu: random stream {stream} is not bound ({} given)",
                        rng.streams.len()
                    ))
                })?;
                dense(source::random(*dist, rng.seed, s, shape.numel(), node.dtype)?)
            }
            Op::Reshape(target) => {
                let a = x()?;
                match a.layout.reshape(target) {
                    Some(l) => Ok(a.with_layout(l)),
                    None => dense(a.to_host()?),
                }
            }
            Op::Permute(perm) => Ok(x()?.with_layout(x()?.layout.permute(perm))),
            Op::Expand(target) => Ok(x()?.with_layout(x()?.layout.expand(target))),
            Op::Slice { dim, start, step: s, len } => {
                Ok(x()?.with_layout(x()?.layout.slice(*dim, *start, *s, *len)))
            }
            Op::Unary(u) => dense(elementwise::unary(x()?, *u)?),
            Op::Binary(b) => dense(elementwise::binary(x()?, y()?, *b)?),
            Op::Compare(c) => dense(elementwise::compare(x()?, y()?, *c)?),
            Op::Where => {
                let z = args
                    .get(2)
                    .copied()
                    .ok_or_else(|| Error::Backend("cpu: where lacks operand 2".into()))?;
                dense(elementwise::where_(x()?, y()?, z)?)
            }
            Op::Cast(to) => dense(elementwise::cast(x()?, *to)?),
            Op::Reduce { op, dims, .. } => dense(reduce::reduce(x()?, *op, dims)?),
            Op::MatMul => dense(matmul::matmul(x()?, y()?)?),
            Op::Conv2d { stride, padding, dilation, groups } => {
                let p = conv::ConvParams {
                    stride: *stride,
                    padding: *padding,
                    dilation: *dilation,
                    groups: *groups,
                };
                dense(conv::conv2d(x()?, y()?, p)?)
            }
            Op::Pool2d { kind, kernel, stride, padding } => {
                let p = conv::PoolParams { kind: *kind, kernel: *kernel, stride: *stride, padding: *padding };
                dense(conv::pool2d(x()?, p)?)
            }
            Op::Gather { dim } => dense(index::gather(x()?, y()?, *dim, step.id)?),
            Op::IndexSelect { dim } => dense(index::index_select(x()?, y()?, *dim, step.id)?),
            Op::Cat { dim } => dense(index::cat(args, *dim, shape)?),
            Op::Fused(_) => {
                let kernel = self.fused.get(i).and_then(Option::as_ref).ok_or_else(|| {
                    Error::Backend(format!("cpu: fused {} has no compiled kernel", step.id))
                })?;
                let operands: Vec<Option<&CpuBuffer>> = args.iter().map(|&a| Some(a)).collect();
                storage::dispatch!(node.dtype, T => {
                    let mut out = pool::vec_for_overwrite::<T>(shape.numel());
                    kernel.run(&operands, None, &mut out)?;
                    dense(<T as crate::ir::Element>::into_host(out))
                })
            }
        }
    }
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
        let _run = tracing::debug_span!("run", nodes = self.steps.len(), inputs = inputs.len()).entered();
        if inputs.len() != self.plan.inputs {
            return Err(Error::Backend(format!(
                "cpu: the plan binds {} input(s), {} given",
                self.plan.inputs,
                inputs.len()
            )));
        }
        if rng.streams.len() < self.plan.random_streams {
            return Err(Error::Backend(format!(
                "cpu: the plan reads {} random stream(s), {} given",
                self.plan.random_streams,
                rng.streams.len()
            )));
        }
        let mut values: Vec<Option<CpuBuffer>> = vec![None; self.steps.len()];
        let mut left = self.uses.clone();
        for (i, step) in self.steps.iter().enumerate() {
            let node = self.plan.graph.node(step.id);
            let _launch = tracing::trace_span!("launch", op = node.op.mnemonic()).entered();
            let out = {
                let mut args = Vec::with_capacity(step.operands.len());
                for &p in &step.operands {
                    args.push(values[p].as_ref().ok_or_else(|| {
                        Error::Backend(format!("cpu: operand of {} was freed before use", step.id))
                    })?);
                }
                self.exec(i, step, &args, inputs, rng)?
            };
            self.stats.nodes_executed.fetch_add(1, Ordering::Relaxed);
            values[i] = Some(out);
            for &p in &step.operands {
                left[p] -= 1;
                if left[p] == 0 {
                    values[p] = None;
                }
            }
            if left[i] == 0 {
                values[i] = None;
            }
        }
        self.outputs
            .iter()
            .map(|&p| {
                values[p]
                    .clone()
                    .map(Buffer::Cpu)
                    .ok_or_else(|| Error::Backend("cpu: an output was freed before the end".into()))
            })
            .collect()
    }
}
