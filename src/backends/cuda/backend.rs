//! [`CudaBackend`] and [`CudaBuffer`]: the [`Backend`] the context talks
//! to, and the dense device tensors it hands out.

use super::device::Device;
use super::exec::CudaExecutable;
use super::memory::DeviceAlloc;
use crate::backends::{Backend, Buffer, CompileOptions, Contents, DeviceStats, Executable};
use crate::ir::{DType, HostData, Plan, Shape};
use crate::runtime::Completion;
use crate::{Error, Result};
use half::{bf16, f16};
use std::sync::Arc;

/// A tensor on a CUDA device: a dense, row-major allocation (every buffer
/// the backend hands out is dense, so compiled plans know their inputs'
/// layouts). Cloning shares the allocation. A buffer's bytes never change
/// while anyone holds it; the allocation may be rewritten once nobody does
/// (a replay reusing its output set), and its bytes then belong to a new
/// buffer with new [`Contents`].
#[derive(Clone, Debug)]
pub struct CudaBuffer {
    pub(super) alloc: Arc<DeviceAlloc>,
    /// Which bytes the allocation holds for this buffer (see [`Contents`]).
    pub(crate) contents: Contents,
    shape: Shape,
    dtype: DType,
    /// The completion of the work that wrote it (an upload or a run).
    pub(crate) ready: Completion,
}

impl CudaBuffer {
    pub(super) fn new(
        alloc: Arc<DeviceAlloc>,
        shape: Shape,
        dtype: DType,
        contents: Contents,
        ready: Completion,
    ) -> CudaBuffer {
        CudaBuffer { alloc, contents, shape, dtype, ready }
    }

    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device address of the first element.
    pub(super) fn ptr(&self) -> u64 {
        self.alloc.ptr()
    }

    /// Bytes of the elements.
    pub(super) fn bytes(&self) -> u64 {
        self.shape.numel() as u64 * self.dtype.size() as u64
    }
}

/// The CUDA buffer inside a [`Buffer`] that `dev` made: a CPU buffer, or
/// one of another CUDA backend (another device, or another context on the
/// same device, whose memory pool it would be returned to), is an error.
#[track_caller]
pub(crate) fn cuda_of<'b>(b: &'b Buffer, dev: &Device) -> Result<&'b CudaBuffer> {
    let refuse = |what: &str| Error::Device {
        message: format!("{what} was given to the CUDA backend of {} ({})", dev.name, dev.ordinal_name()),
        location: crate::Location::caller(),
    };
    match b {
        Buffer::Cuda(c) if c.alloc.belongs_to(&dev.pool) => Ok(c),
        Buffer::Cuda(_) => Err(refuse("a buffer of another CUDA backend (another device or context)")),
        Buffer::Cpu(_) => Err(refuse("a CPU buffer")),
    }
}

/// One CUDA device as a kiln backend.
pub struct CudaBackend {
    dev: Arc<Device>,
    stats: Arc<DeviceStats>,
    /// The process group this device is a rank of, and its NCCL
    /// communicator (`crate::dist`).
    group: std::sync::OnceLock<(crate::dist::Joining, Arc<super::nccl::Comm>)>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({} {})", self.dev.name, self.dev.arch)
    }
}

impl CudaBackend {
    /// Opens CUDA device `ordinal`. A missing driver, device or library is
    /// an error message naming what was looked for.
    pub fn new(ordinal: usize) -> std::result::Result<CudaBackend, String> {
        let stats = Arc::new(DeviceStats::default());
        // cudarc's loaders panic on a library they cannot find; the checks
        // in Device::open come first, and this catches what they miss.
        let opened = std::panic::catch_unwind(|| Device::open(ordinal, stats.clone()))
            .unwrap_or_else(|_| Err("the CUDA libraries could not be loaded".into()))?;
        Ok(CudaBackend { dev: Arc::new(opened), stats, group: Default::default() })
    }

    /// The device's name and architecture (`NVIDIA H100 80GB HBM3 (sm_90)`).
    pub fn device_name(&self) -> String {
        format!("{} ({})", self.dev.name, self.dev.arch)
    }

    /// The CUDA buffer inside `b`, if this backend made it.
    #[track_caller]
    fn own<'b>(&self, b: &'b Buffer) -> Result<&'b CudaBuffer> {
        cuda_of(b, &self.dev)
    }

    /// Bytes the caching allocator holds for reuse (not in use).
    pub fn cached_bytes(&self) -> u64 {
        self.dev.pool.cached_bytes()
    }
}

/// The bytes of host data, as a byte slice of its elements.
fn host_bytes(data: &HostData) -> &[u8] {
    fn bytes<T>(v: &[T]) -> &[u8] {
        // SAFETY: plain-old-data elements (numbers, half types, bools)
        // viewed as their bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
    }
    match data {
        HostData::F16(v) => bytes(v),
        HostData::BF16(v) => bytes(v),
        HostData::F32(v) => bytes(v),
        HostData::F64(v) => bytes(v),
        HostData::U8(v) => bytes(v),
        HostData::I32(v) => bytes(v),
        HostData::I64(v) => bytes(v),
        HostData::Bool(v) => bytes(v),
    }
}

/// Reads `n` elements of `dtype` at `ptr` into host data through the copy
/// stream (the work that wrote them has finished).
fn read_host(copier: &super::copy::Copier, ptr: u64, n: usize, dtype: DType) -> Result<HostData> {
    fn read<T: Copy + Default>(copier: &super::copy::Copier, ptr: u64, n: usize) -> Result<Vec<T>> {
        let mut v = vec![T::default(); n];
        // SAFETY: plain-old-data elements (numbers, half types' bits,
        // bytes): every byte pattern is a value.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(&v[..]))
        };
        if !bytes.is_empty() {
            copier.download(ptr, bytes)?;
        }
        Ok(v)
    }
    Ok(match dtype {
        DType::F16 => HostData::F16(read::<u16>(copier, ptr, n)?.into_iter().map(f16::from_bits).collect()),
        DType::BF16 => {
            HostData::BF16(read::<u16>(copier, ptr, n)?.into_iter().map(bf16::from_bits).collect())
        }
        DType::F32 => HostData::F32(read(copier, ptr, n)?),
        DType::F64 => HostData::F64(read(copier, ptr, n)?),
        DType::U8 => HostData::U8(read(copier, ptr, n)?),
        DType::I32 => HostData::I32(read(copier, ptr, n)?),
        DType::I64 => HostData::I64(read(copier, ptr, n)?),
        DType::Bool => HostData::Bool(read::<u8>(copier, ptr, n)?.into_iter().map(|b| b != 0).collect()),
    })
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn describe(&self) -> String {
        format!("cuda:{} {}", self.dev.ctx.ordinal(), self.device_name())
    }

    fn hopper(&self) -> bool {
        self.dev.hopper()
    }

    fn multiprocessors(&self) -> usize {
        self.dev.sms
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
        let dtype = data.dtype();
        let bytes = host_bytes(&data);
        // On the copy stream, through pinned chunks: never behind a
        // running plan (`copy.rs`).
        let (mut alloc, fence) = self.dev.copier.upload(&self.dev.pool, bytes)?;
        let ready = if bytes.is_empty() {
            Completion::done()
        } else {
            super::completion::of_upload(&self.dev, &fence)
        };
        alloc.written_by(fence);
        Ok(Buffer::Cuda(CudaBuffer::new(Arc::new(alloc), shape.clone(), dtype, Contents::fresh(), ready)))
    }

    /// Waits for the work that wrote the buffer (only that: runs launched
    /// after it go on) and copies it to the host. An error that work
    /// found, or work it read, is returned here.
    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        let b = self.own(buffer)?;
        b.ready.wait()?;
        read_host(&self.dev.copier, b.ptr(), b.shape.numel(), b.dtype)
    }

    fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>> {
        self.compile_with(plan, &CompileOptions::default())
    }

    fn compile_with(&self, plan: Arc<Plan>, options: &CompileOptions) -> Result<Arc<dyn Executable>> {
        let hopper = self.dev.hopper();
        let wgmma_gemm = hopper && super::Target::wgmma_gemm_wanted();
        let target = super::Target { tf32: options.tf32, hopper, wgmma_gemm, sms: self.dev.sms };
        let program = super::lower_for(&plan, target)?;
        // A profiled plan is never captured: a CUDA graph has no events
        // around its launches (see `profile.rs`).
        let graphs = options.cuda_graphs && !options.profile;
        let mut exe = CudaExecutable::new(self.dev.clone(), &plan, program, graphs, options.gemm_tuning)?;
        if plan.order.iter().any(|&id| plan.graph.node(id).op.is_collective()) {
            exe.comm = self.group.get().map(|(_, comm)| comm.clone());
        }
        if options.profile {
            exe.profile = Some(super::profile::StepTimes::new(&self.dev.ctx, &plan, &exe.program)?);
        }
        Ok(Arc::new(exe))
    }

    fn stats(&self) -> Arc<DeviceStats> {
        self.stats.clone()
    }

    fn timer(&self) -> Result<Option<Box<dyn crate::backends::DeviceTimer>>> {
        Ok(Some(Box::new(super::device::Timer::new(self.dev.clone())?)))
    }

    fn join_group(&self, joining: crate::dist::Joining) -> Result<()> {
        if self.group.get().is_some() {
            return Err(Error::Backend("cuda: this device is already a rank of a group".into()));
        }
        let id = joining.nccl_id.ok_or_else(|| Error::Backend("cuda: a group without an NCCL id".into()))?;
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|e| Error::Backend(format!("cuda: binding the context: {e:?}")))?;
        let comm = super::nccl::Comm::init(
            &id,
            joining.size,
            joining.rank,
            joining.host.clone(),
            self.dev.ctx.clone(),
        )
        .map_err(Error::Backend)?;
        tracing::info!(rank = joining.rank, size = joining.size, nccl = ?super::nccl::version(), "joined an NCCL group");
        self.group
            .set((joining, comm))
            .map_err(|_| Error::Backend("cuda: this device is already a rank of a group".into()))
    }

    fn member(&self) -> Option<crate::dist::Joining> {
        self.group.get().map(|(j, _)| j.clone())
    }
}
