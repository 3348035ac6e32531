//! The device: the CUDA context (with cudarc's event tracking off: the plan
//! owns synchronization), its streams, the cuBLAS and cuDNN handles with a
//! workspace per stream, the memory pool and the kernel cache.
//!
//! Opening a device first checks that each library can be loaded, so a
//! machine without a driver, NVRTC, cuBLAS(Lt) or cuDNN gets an error that
//! names what was looked for instead of a panic inside a lazy loader.
//!
//! Everything that enqueues work takes [`Device::launch`], the *launch
//! lock*: one plan's whole launch (fork, steps, join) is enqueued before
//! another's, so a stream's cuBLAS and cuDNN workspaces are never used by
//! two plans at once. The lock covers enqueueing only; the device runs
//! while nobody holds it.

use super::memory::Pool;
use super::nvrtc::KernelCache;
use crate::backends::DeviceStats;
use crate::{Error, Result};
use cudarc::cublas::sys as blas_sys;
use cudarc::cudnn::sys as dnn_sys;
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Bytes of workspace a classic cuBLAS GEMM gets (NVIDIA's
/// recommendation for Hopper), and the most a cuBLASLt algorithm may ask
/// for. A stream's workspace grows to this only when one of its plans
/// calls classic cuBLAS, whose needs cannot be asked; cuBLASLt says what
/// its chosen algorithm takes (`lt.rs`).
pub(crate) const BLAS_WORKSPACE: u64 = 32 << 20;

/// One GPU, opened for kiln.
pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    /// `sm_90` on an H100.
    pub arch: String,
    /// The device's name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its multiprocessors (132 on an H100 SXM or H200, 114 on an H100
    /// PCIe): a persistent kernel's grid.
    pub sms: usize,
    pub pool: Arc<Pool>,
    pub kernels: KernelCache,
    pub stats: Arc<DeviceStats>,
    launch: Mutex<LaunchState>,
    /// The most bytes of cuDNN workspace a stream may grow to.
    pub dnn_workspace_limit: u64,
    /// cuDNN's algorithm choice per convolution shape.
    pub conv_algos: super::dnn::AlgoCache,
    /// The thread that wakes futures waiting for this device.
    pub runtime: Arc<crate::runtime::waiter::Runtime>,
    /// Uploads and downloads: the copy stream and its pinned chunks.
    pub copier: super::copy::Copier,
}

/// Stream captures in progress (shared) against the calls that
/// synchronize the whole primary context (exclusive): the pool's
/// `cuCtxSynchronize` before it frees cached blocks, and the library
/// handles' destruction (`cublasLtDestroy` synchronizes the context).
/// Every kiln context of a device shares its primary context, and
/// captures are thread-local, so the driver lets one thread synchronize
/// the context while another's stream is capturing. The op suite, whose
/// test threads capture plans and drop contexts side by side, died in 3
/// of 14 runs on an H200 (2026-12-01) inside `cuCtxSynchronize` under
/// `cublasLtDestroy` (`segfault at 298`, core dumps; benches/RESULTS.md,
/// the thirty-first measurement). Whether captures are what that
/// synchronize met is not proven; this keeps the two apart. Taken after
/// the launch lock, never before it.
static CAPTURES: RwLock<()> = RwLock::new(());

thread_local! {
    /// Whether this thread holds a capture (its own synchronizes skip the
    /// exclusive side, which would wait for itself).
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A capture in progress on this thread (see [`CAPTURES`]).
pub(crate) struct CaptureInProgress(#[allow(dead_code)] RwLockReadGuard<'static, ()>);

impl CaptureInProgress {
    pub fn begin() -> CaptureInProgress {
        let guard = CAPTURES.read().unwrap_or_else(|e| e.into_inner());
        CAPTURING.with(|c| c.set(true));
        CaptureInProgress(guard)
    }
}

impl Drop for CaptureInProgress {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(false));
    }
}

/// Waits until no other thread is capturing, and keeps captures from
/// starting, while the whole context is synchronized (see [`CAPTURES`]).
pub(crate) fn no_capture_in_progress() -> Option<RwLockWriteGuard<'static, ()>> {
    if CAPTURING.with(|c| c.get()) {
        return None;
    }
    Some(CAPTURES.write().unwrap_or_else(|e| e.into_inner()))
}

/// What the launch lock guards: streams and library handles.
pub(crate) struct LaunchState {
    /// Streams runs use; stream 0 orders everything between plans.
    pub streams: Vec<Arc<CudaStream>>,
    /// Streams captures use (never stream 0 itself, so another thread's
    /// uploads never land in a graph being captured).
    pub capture: Vec<Arc<CudaStream>>,
    /// One cuBLAS handle (and workspace) per stream index.
    pub blas: Vec<BlasHandle>,
    /// One cuDNN handle (and workspace) per stream index.
    pub dnn: Vec<DnnHandle>,
    pub ctx: Arc<CudaContext>,
    pub pool: Arc<Pool>,
}

/// A stream's cuBLAS and cuBLASLt handles and their one workspace: the
/// two libraries' calls on one stream run one after the other, so they
/// can share it (two workspaces held 32 MiB more a stream, a tenth of
/// GPT-2 small's bf16 weights). It grows as plans need: to what the
/// cuBLASLt algorithms chosen take, and to [`BLAS_WORKSPACE`] once a plan
/// calls classic cuBLAS. Holding 32 MiB from the stream's creation was
/// 13% of GPT-2 small's bf16 weights and cache, for a decode that calls
/// no classic GEMM.
pub(crate) struct BlasHandle {
    pub handle: blas_sys::cublasHandle_t,
    pub lt: cudarc::cublaslt::sys::cublasLtHandle_t,
    pub workspace: GrowingWorkspace,
}

/// A cuDNN handle with a workspace that grows as convolutions need.
pub(crate) struct DnnHandle {
    pub handle: dnn_sys::cudnnHandle_t,
    pub workspace: GrowingWorkspace,
}

/// A library workspace that only grows. A workspace it outgrew is kept:
/// CUDA graphs captured while it was current still name it.
#[derive(Default)]
pub(crate) struct GrowingWorkspace {
    current: Option<super::memory::DeviceAlloc>,
    retired: Vec<super::memory::DeviceAlloc>,
}

impl GrowingWorkspace {
    /// The current workspace's address (0 while there is none).
    pub fn ptr(&self) -> u64 {
        self.current.as_ref().map_or(0, super::memory::DeviceAlloc::ptr)
    }

    /// The current workspace's bytes.
    pub fn bytes(&self) -> u64 {
        self.current.as_ref().map_or(0, super::memory::DeviceAlloc::bytes)
    }

    /// Makes the workspace at least `bytes`; true when it moved.
    fn grow(&mut self, pool: &Arc<Pool>, bytes: u64) -> Result<bool> {
        if bytes <= self.bytes() {
            return Ok(false);
        }
        if let Some(old) = self.current.replace(pool.alloc(bytes)?) {
            self.retired.push(old);
        }
        Ok(true)
    }
}

// SAFETY: the raw handles are only used under the launch lock.
unsafe impl Send for LaunchState {}

/// The library names each loader looks for, for error messages.
fn candidates(lib: &str) -> String {
    cudarc::get_lib_name_candidates(lib).join(", ")
}

fn driver_err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("cuda: {what}: {e:?}"))
}

/// Checks that every library the backend loads is present, before any of
/// cudarc's lazy loaders (which panic) runs.
pub(crate) fn check_libraries() -> std::result::Result<(), String> {
    // SAFETY: these only try to dlopen the library names.
    let checks: [(&str, &str, bool); 5] = unsafe {
        [
            ("the CUDA driver", "cuda", sys::is_culib_present()),
            ("NVRTC", "nvrtc", cudarc::nvrtc::sys::is_culib_present()),
            ("cuBLAS", "cublas", blas_sys::is_culib_present()),
            ("cuBLASLt", "cublasLt", cudarc::cublaslt::sys::is_culib_present()),
            ("cuDNN", "cudnn", dnn_sys::is_culib_present()),
        ]
    };
    for (what, lib, present) in checks {
        if !present {
            return Err(format!(
                "{what} could not be loaded (looked for {}); install it or add its folder to LD_LIBRARY_PATH",
                candidates(lib)
            ));
        }
    }
    Ok(())
}

impl Device {
    /// Opens device `ordinal`. Every failure is a message, never a panic.
    pub fn open(ordinal: usize, stats: Arc<DeviceStats>) -> std::result::Result<Device, String> {
        check_libraries()?;
        let count = CudaContext::device_count()
            .map_err(|e| format!("the CUDA driver found no usable device ({e:?})"))?;
        if ordinal >= count.max(0) as usize {
            return Err(format!("there is no CUDA device {ordinal}: the driver reports {count} device(s)"));
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| format!("cannot open CUDA device {ordinal}: {e:?}"))?;
        // The executor records exactly the events the stream plan needs;
        // cudarc's per-buffer events would break graph capture
        // (CUDA_ERROR_STREAM_CAPTURE_ISOLATION).
        // SAFETY: called before any allocation or stream of this context.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
        let name = ctx.name().unwrap_or_else(|_| format!("CUDA device {ordinal}"));
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| format!("cannot read device {ordinal}'s multiprocessor count: {e:?}"))?;
        let pool = Pool::new(ctx.clone(), stats.clone());
        // sm_90 parts compile for sm_90a, whose `wgmma` the Hopper kernels
        // use (`codegen/attention_wgmma.rs`); such a CUBIN loads on
        // compute capability 9.0 only, which is this device.
        let feature = if (major, minor) == (9, 0) { "a" } else { "" };
        let kernels = KernelCache::new(format!("sm_{major}{minor}{feature}"), stats.clone())?;
        kernels.start_warm_up(&ctx);
        let mut state = LaunchState {
            streams: Vec::new(),
            capture: Vec::new(),
            blas: Vec::new(),
            dnn: Vec::new(),
            ctx: ctx.clone(),
            pool: pool.clone(),
        };
        state.ensure_streams(1).map_err(|e| e.to_string())?;
        let copier = super::copy::Copier::new(&ctx).map_err(|e| e.to_string())?;
        Ok(Device {
            ctx,
            arch: format!("sm_{major}{minor}"),
            name,
            sms: sms.max(0) as usize,
            pool,
            kernels,
            stats,
            launch: Mutex::new(state),
            dnn_workspace_limit: dnn_workspace_limit(),
            conv_algos: Default::default(),
            runtime: crate::runtime::waiter::Runtime::new(&format!("cuda{ordinal}")),
            copier,
        })
    }

    /// Takes the launch lock (see the module docs), with the context bound
    /// to this thread.
    pub fn launch(&self) -> Result<MutexGuard<'_, LaunchState>> {
        self.ctx.bind_to_thread().map_err(|e| driver_err("binding the context", e))?;
        Ok(self.launch.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `cuda:0`: the device as messages name it.
    pub fn ordinal_name(&self) -> String {
        format!("cuda:{}", self.ctx.ordinal())
    }

    /// Whether the device is an sm_90 part (H100, H200), whose kernels are
    /// compiled for sm_90a: the lowering may choose `wgmma` kernels.
    pub fn hopper(&self) -> bool {
        self.arch == "sm_90"
    }

    /// Binds the context to this thread (before raw driver calls).
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver_err("binding the context", e))
    }
}

/// `KILN_CUDNN_WORKSPACE_MB` (default 1024): the most workspace bytes a
/// convolution algorithm may use per stream.
fn dnn_workspace_limit() -> u64 {
    std::env::var("KILN_CUDNN_WORKSPACE_MB").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(1024) << 20
}

impl LaunchState {
    /// Makes sure `n` run streams and capture streams exist, each with its
    /// handles.
    pub fn ensure_streams(&mut self, n: usize) -> Result<()> {
        while self.streams.len() < n {
            let s = self.ctx.new_stream().map_err(|e| driver_err("creating a stream", e))?;
            let c = self.ctx.new_stream().map_err(|e| driver_err("creating a capture stream", e))?;
            let mut handle = std::ptr::null_mut();
            // SAFETY: plain handle creation; the handle is destroyed in Drop.
            let st = unsafe { blas_sys::cublasCreate_v2(&mut handle) };
            if st != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(Error::Backend(format!("cuda: cublasCreate failed: {st:?}")));
            }
            let mut lt = std::ptr::null_mut();
            // SAFETY: plain handle creation; destroyed in Drop.
            let st = unsafe { cudarc::cublaslt::sys::cublasLtCreate(&mut lt) };
            if st != cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(Error::Backend(format!("cuda: cublasLtCreate failed: {st:?}")));
            }
            self.blas.push(BlasHandle { handle, lt, workspace: GrowingWorkspace::default() });
            let mut dnn = std::ptr::null_mut();
            // SAFETY: plain handle creation; destroyed in Drop.
            let st = unsafe { dnn_sys::cudnnCreate(&mut dnn) };
            if st != dnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
                return Err(Error::Backend(format!("cuda: cudnnCreate failed: {st:?}")));
            }
            self.dnn.push(DnnHandle { handle: dnn, workspace: GrowingWorkspace::default() });
            self.streams.push(s);
            self.capture.push(c);
        }
        Ok(())
    }
}

impl LaunchState {
    /// Grows stream `stream`'s cuDNN workspace to at least `bytes`.
    pub fn grow_dnn_workspace(&mut self, stream: usize, bytes: u64) -> Result<()> {
        self.dnn[stream].workspace.grow(&self.pool, bytes).map(drop)
    }

    /// Grows stream `stream`'s cuBLAS/cuBLASLt workspace to at least
    /// `bytes`, and tells classic cuBLAS where it now is. Classic cuBLAS
    /// is only called by plans that grew it to [`BLAS_WORKSPACE`] first,
    /// so it never falls back to a workspace of its own.
    pub fn grow_blas_workspace(&mut self, stream: usize, bytes: u64) -> Result<()> {
        let h = &mut self.blas[stream];
        if !h.workspace.grow(&self.pool, bytes)? {
            return Ok(());
        }
        // SAFETY: the workspace lives as long as the handle (both in
        // BlasHandle; outgrown ones are retired, not freed).
        let st = unsafe {
            blas_sys::cublasSetWorkspace_v2(
                h.handle,
                h.workspace.ptr() as *mut _,
                h.workspace.bytes() as usize,
            )
        };
        if st != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(Error::Backend(format!("cuda: cublasSetWorkspace failed: {st:?}")));
        }
        Ok(())
    }
}

impl Drop for LaunchState {
    fn drop(&mut self) {
        let _no_capture = no_capture_in_progress();
        let _ = self.ctx.bind_to_thread();
        for s in &self.streams {
            let _ = s.synchronize();
        }
        for b in &self.blas {
            // SAFETY: created in ensure_streams, used only under the lock.
            unsafe {
                blas_sys::cublasDestroy_v2(b.handle);
                cudarc::cublaslt::sys::cublasLtDestroy(b.lt);
            }
        }
        for d in &self.dnn {
            // SAFETY: as above.
            unsafe { dnn_sys::cudnnDestroy(d.handle) };
        }
    }
}

/// The raw stream handle.
pub(crate) fn raw(s: &CudaStream) -> sys::CUstream {
    s.cu_stream()
}

/// A CUDA event without timing, destroyed when dropped.
///
/// Who calls what, and from where: a plan's own events (its stream
/// events, fork and joins) are recorded and waited on only while its run
/// is enqueued, under the launch lock. A run's completion event is
/// recorded once, under the lock, before it is handed out; after that it
/// is only synchronized on (by whoever waits for the run, without the
/// lock) and destroyed. So no event is ever recorded by two threads at
/// once, and no wait races a record of the same event.
///
/// An event holds its context: cudarc releases the device's primary
/// context when a `CudaContext` is dropped, and the driver resets it when
/// no retain is left, destroying its events and pinned memory. Structs
/// drop their fields in order, and events sat in fields after the last
/// context handle (a staging chunk's, a free block's stream-0 event), so
/// only the CUDA runtime's own retain (cuBLAS's handles initialize it, and
/// it keeps the primary context for the life of the process) kept them
/// from being destroyed after their context. Holding the context makes
/// that an invariant of the type rather than of who else retains it.
pub(crate) struct Event(sys::CUevent, #[allow(dead_code)] Arc<CudaContext>);

// SAFETY: a CUevent is a driver handle, not memory: the driver API is
// thread-safe, so record, wait, synchronize and destroy may be called
// from any thread (with the context bound, which `Device::launch` and
// `Device::bind` do). What needs ordering (no record racing a wait on the
// same event) is ordered as the type's docs say, not by `Send`/`Sync`.
// The launch lock is not what makes sharing sound: synchronize and drop
// run without it.
unsafe impl Send for Event {}
// SAFETY: as for `Send`; `&Event` only offers those thread-safe calls.
unsafe impl Sync for Event {}

impl Event {
    /// An event of `ctx`, which the calling thread has bound (every
    /// caller runs under the launch lock or in a plan's compile, both
    /// bound; an event is made per run, so no driver call is added here).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Event> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(|e| Event(e, ctx.clone()))
            .map_err(|e| driver_err("creating an event", e))
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: a live event and stream of the bound context.
        unsafe { result::event::record(self.0, stream) }.map_err(|e| driver_err("recording an event", e))
    }

    /// Makes `stream` wait for the event's last record.
    pub fn wait_on(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: as above.
        unsafe { result::stream::wait_event(stream, self.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT) }
            .map_err(|e| driver_err("waiting for an event", e))
    }

    /// Whether the event's last record has completed (`CUDA_ERROR_NOT_READY`
    /// while not); never blocks.
    pub fn query(&self) -> std::result::Result<(), result::DriverError> {
        // SAFETY: as above.
        unsafe { result::event::query(self.0) }
    }

    /// Blocks the host until the event's last record completed. Needs no
    /// lock: the event was recorded before it was shared (see the type).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: as above.
        unsafe { result::event::synchronize(self.0) }.map_err(|e| driver_err("waiting for the device", e))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is ours and nobody else holds it (drop has
        // `&mut self`); the driver defers the destruction until pending
        // work that records it completes, so a graph or stream still using
        // it is unaffected. Its context is alive: the event holds it.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// CUDA events around work on stream 0 (see [`crate::backends::DeviceTimer`]).
pub(crate) struct Timer {
    dev: Arc<Device>,
    start: sys::CUevent,
    end: sys::CUevent,
}

// SAFETY: plain event handles of the device's context.
unsafe impl Send for Timer {}

impl Timer {
    pub fn new(dev: Arc<Device>) -> Result<Timer> {
        dev.bind()?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = result::event::create(flags).map_err(|e| driver_err("creating an event", e))?;
        let end = result::event::create(flags).map_err(|e| driver_err("creating an event", e))?;
        Ok(Timer { dev, start, end })
    }
}

impl crate::backends::DeviceTimer for Timer {
    fn start(&mut self) -> Result<()> {
        let ls = self.dev.launch()?;
        // SAFETY: a live event and stream of the bound context.
        unsafe { result::event::record(self.start, raw(&ls.streams[0])) }
            .map_err(|e| driver_err("recording", e))
    }

    fn stop(&mut self) -> Result<f64> {
        {
            let ls = self.dev.launch()?;
            // SAFETY: as above.
            unsafe { result::event::record(self.end, raw(&ls.streams[0])) }
                .map_err(|e| driver_err("recording", e))?;
        }
        // SAFETY: both events were recorded.
        unsafe {
            result::event::synchronize(self.end).map_err(|e| driver_err("waiting", e))?;
            result::event::elapsed(self.start, self.end)
                .map(|ms| ms as f64)
                .map_err(|e| driver_err("timing", e))
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let _ = self.dev.bind();
        // SAFETY: created in `new`.
        unsafe {
            let _ = result::event::destroy(self.start);
            let _ = result::event::destroy(self.end);
        }
    }
}
