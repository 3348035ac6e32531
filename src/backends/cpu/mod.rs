//! The CPU backend: strided buffers over shared typed storage, kernels
//! parallelized with rayon, matmul and conv through a packed AVX2 `f32`
//! GEMM (`sgemm.rs`) or matrixmultiply on rayon row blocks (`f64`, other CPUs).
//!
//! A [`CpuBuffer`] is an `Arc` of typed storage plus a [`Layout`] (shape,
//! strides, offset), so view ops (reshape where strides allow, permute,
//! expand, slice) cost no copy. Storage is an allocation of its own or a
//! range of a plan's arena. Kernels write into an output slice the
//! executor hands them, so a planned graph (one with a memory table) runs
//! in one arena per compiled plan, reused by every run, and a graph with a
//! stream table runs its streams on concurrent threads (`exec.rs` says
//! what is checked at compile, `run.rs` how runs go). Without tables,
//! running a plan walks `plan.order` once and each intermediate is dropped
//! as soon as its last user has run, so peak memory follows the live set.
//! Elementwise semantics are those of [`crate::ir::eval`], shared with
//! constant folding.

mod arena;
mod attention;
mod attention_grad;
mod codegen;
mod conv;
mod elementwise;
mod exec;
mod fused;
mod hazards;
mod im2col;
mod index;
mod lanes;
mod launch;
mod matmul;
mod over;
mod place;
mod pool;
mod pool_grad;
mod reduce;
mod run;
mod sgemm;
mod source;
mod storage;
#[cfg(test)]
mod tests;

// Where CpuBuffer::layout has always named it; the layout itself is
// shared with the CUDA lowering (`backends::layout`).
pub use crate::backends::layout::Layout;
pub(crate) use storage::Storage;

use super::{Backend, Buffer, DeviceStats, Executable};
use crate::ir::{DType, HostData, Plan, Shape};
use crate::runtime::Completion;
use crate::{Error, Result};
use exec::CpuExecutable;
use std::sync::Arc;
use storage::{Elem, View};

/// A CPU tensor: shared typed storage viewed through a strided layout.
/// Cloning shares the storage; views made by the backend share it too.
#[derive(Clone, Debug)]
pub struct CpuBuffer {
    storage: Arc<Storage>,
    layout: Layout,
    /// The completion of the work writing it: `None` for everything this
    /// backend makes (it computes before returning); set by test backends
    /// that model device work still in flight (`runtime/inject.rs`).
    ready: Option<Completion>,
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
        Ok(CpuBuffer { storage: Storage::new(data, stats), layout: Layout::contiguous(shape), ready: None })
    }

    /// A buffer over shared `storage` (the CUDA emulator's output sets).
    #[cfg_attr(not(feature = "cuda-emulator"), allow(dead_code))]
    pub(crate) fn over(storage: Arc<Storage>, layout: Layout) -> CpuBuffer {
        CpuBuffer { storage, layout, ready: None }
    }

    /// What identifies the elements this buffer reads: its storage's
    /// contents and its layout over them.
    pub(crate) fn identity(&self) -> (crate::backends::Contents, Layout) {
        (self.storage.contents(), self.layout.clone())
    }

    /// The storage's address: the same while the storage lives, whatever
    /// was written into it (the emulator's stand-in for a device
    /// allocation's identity; an address may be reused once it is freed).
    #[cfg_attr(not(feature = "cuda-emulator"), allow(dead_code))]
    pub(crate) fn storage_address(&self) -> usize {
        Arc::as_ptr(&self.storage) as usize
    }

    /// Whether nobody else holds this buffer's storage (the emulator's
    /// model of a GPU allocation held by one run alone).
    #[cfg_attr(not(feature = "cuda-emulator"), allow(dead_code))]
    pub(crate) fn is_unique(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
    }

    /// The same storage under another layout (a zero-copy view).
    fn with_layout(&self, layout: Layout) -> CpuBuffer {
        CpuBuffer { storage: self.storage.clone(), layout, ready: self.ready.clone() }
    }

    /// The completion of the work writing it, if that work may still be
    /// running (see the field).
    pub(crate) fn ready(&self) -> Option<&Completion> {
        self.ready.as_ref()
    }

    /// The same buffer, written by work that finishes with `ready`.
    #[cfg(test)]
    pub(crate) fn written_by(mut self, ready: Completion) -> CpuBuffer {
        self.ready = Some(ready);
        self
    }

    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.layout.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
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
        Ok(View { data: self.storage.slice::<T>()?, layout: &self.layout })
    }

    /// The byte range of a plan's arena this buffer's storage is, if it is
    /// one (tests check that outputs never are).
    #[cfg(test)]
    pub(crate) fn arena_range(&self) -> Option<(usize, usize)> {
        self.storage.arena_range().map(|(_, offset, bytes)| (offset, bytes))
    }

    /// A dense copy in an allocation of its own.
    fn owned_copy(&self, stats: &Arc<DeviceStats>) -> Result<CpuBuffer> {
        CpuBuffer::dense(self.to_host()?, self.shape().clone(), stats)
    }

    /// The elements, row-major and dense.
    fn to_host(&self) -> Result<HostData> {
        storage::dispatch!(self.dtype(), T => {
            let v = self.view::<T>()?;
            if v.layout.extent() > v.data.len() {
                return Err(Error::Backend("cpu: buffer layout exceeds its storage".into()));
            }
            Ok(<T as crate::ir::Element>::into_host(elementwise::contiguous(v)?))
        })
    }
}

/// The CPU device: runs plans with rayon on the global thread pool and
/// keeps the allocation counters of every buffer it creates.
#[derive(Clone, Debug, Default)]
pub struct CpuBackend {
    stats: Arc<DeviceStats>,
    /// Whether fused bodies that qualify run as generated code
    /// (`codegen/`); off, every fused node is interpreted. The
    /// interpreter is the reference the generated code is tested against.
    codegen: codegen::Codegen,
    /// The process group this backend is a rank of (`crate::dist`).
    member: std::sync::OnceLock<crate::dist::Joining>,
}

impl CpuBackend {
    /// A CPU backend with fresh counters. Fused bodies run as generated
    /// code where that measured faster, unless `KILN_CPU_CODEGEN=0` (the
    /// interpreter alone: the reference path, and a way to rule code
    /// generation out) or `all` (every body that qualifies).
    pub fn new() -> CpuBackend {
        CpuBackend {
            stats: Arc::new(DeviceStats::default()),
            codegen: codegen::Codegen::from_env(),
            member: Default::default(),
        }
    }

    /// A CPU backend that generates code for the fused bodies measured
    /// faster that way (`true`) or interprets every one (`false`),
    /// whatever the environment says.
    pub fn with_codegen(codegen: bool) -> CpuBackend {
        CpuBackend::with(if codegen { codegen::Codegen::Measured } else { codegen::Codegen::Off })
    }

    /// A CPU backend that generates code for every fused body that
    /// qualifies (`true`, `exp` bodies too) or for none.
    pub fn with_codegen_all(codegen: bool) -> CpuBackend {
        CpuBackend::with(if codegen { codegen::Codegen::All } else { codegen::Codegen::Off })
    }

    fn with(codegen: codegen::Codegen) -> CpuBackend {
        CpuBackend { stats: Arc::new(DeviceStats::default()), codegen, member: Default::default() }
    }
}

/// The CPU buffer inside a [`Buffer`]; a buffer of another device is an error.
fn cpu(b: &Buffer) -> Result<&CpuBuffer> {
    match b {
        Buffer::Cpu(c) => Ok(c),
        #[allow(unreachable_patterns)]
        _ => Err(Error::Backend("cpu: a buffer of another device was given to the CPU backend".into())),
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    /// Off: the CPU's fused product measured slower than the plain GEMM
    /// and a bias group (see `PassOptions::reshape_epilogues`).
    fn reshape_epilogues(&self) -> bool {
        false
    }
    /// Off: the merged product's bias would be a fused epilogue (see
    /// `PassOptions::merge_matmuls`); not measured on a CPU.
    fn merge_matmuls(&self) -> bool {
        false
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
        let b = cpu(buffer)?;
        if let Some(ready) = b.ready() {
            ready.wait()?;
        }
        b.to_host()
    }

    fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>> {
        self.compile_with(plan, &Default::default())
    }

    fn compile_with(
        &self,
        plan: Arc<Plan>,
        options: &crate::backends::CompileOptions,
    ) -> Result<Arc<dyn Executable>> {
        let mut exe = CpuExecutable::new(plan, self.stats.clone(), self.codegen)?;
        exe.member = self.member.get().cloned();
        if options.profile {
            exe.profile = Some(crate::profile::Recorder::new(&exe.plan));
        }
        Ok(Arc::new(exe))
    }

    fn stats(&self) -> Arc<DeviceStats> {
        self.stats.clone()
    }

    fn join_group(&self, joining: crate::dist::Joining) -> Result<()> {
        self.member
            .set(joining)
            .map_err(|_| Error::Backend("cpu: this backend is already a rank of a group".into()))
    }

    fn member(&self) -> Option<crate::dist::Joining> {
        self.member.get().cloned()
    }
}
