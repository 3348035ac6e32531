//! Backends: compile a [`Plan`] and run it on buffers.
//!
//! A backend never plans and never changes a graph; it is handed an
//! optimized [`Plan`] and input buffers and returns output buffers.

mod check;
pub mod cpu;
pub mod cuda;
pub(crate) mod layout;
pub mod philox;
pub(crate) mod prologue;

pub use layout::Layout;

use crate::ir::{DType, HostData, Plan, Shape};
use crate::runtime::Completion;
use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The identity of the bytes a buffer holds: a number handed out afresh
/// every time bytes are written into an allocation (an upload, each run's
/// outputs, each replay of a reused output set), never reused in a
/// process. Caches that skip a copy when "the same data" is bound again
/// (CUDA graph input slots) key on it, never on an allocation: an
/// allocation's bytes change when a replay reuses it, its `Contents` then
/// changes with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Contents(u64);

impl Contents {
    /// A number no earlier call returned.
    pub(crate) fn fresh() -> Contents {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Contents(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A realized tensor on some device.
#[derive(Clone, Debug)]
pub enum Buffer {
    /// A CPU tensor (possibly a strided view of shared storage).
    Cpu(cpu::CpuBuffer),
    /// A dense tensor on a CUDA device.
    #[cfg(feature = "cuda-backend")]
    Cuda(cuda::CudaBuffer),
}

impl Buffer {
    /// The logical shape.
    pub fn shape(&self) -> &Shape {
        match self {
            Buffer::Cpu(b) => b.shape(),
            #[cfg(feature = "cuda-backend")]
            Buffer::Cuda(b) => b.shape(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Buffer::Cpu(b) => b.dtype(),
            #[cfg(feature = "cuda-backend")]
            Buffer::Cuda(b) => b.dtype(),
        }
    }

    /// What identifies the elements it holds: the [`Contents`] of its
    /// bytes and its layout over them. Two buffers with equal identities
    /// hold equal elements (a weight prologue keys its kept values on it).
    pub(crate) fn identity(&self) -> (Contents, Layout) {
        match self {
            Buffer::Cpu(b) => b.identity(),
            #[cfg(feature = "cuda-backend")]
            Buffer::Cuda(b) => (b.contents, Layout::contiguous(b.shape().clone())),
        }
    }

    /// The completion of the work that wrote it (CPU buffers are written
    /// before anyone sees them, unless a test backend says otherwise).
    pub fn completion(&self) -> Completion {
        match self {
            Buffer::Cpu(b) => b.ready().cloned().unwrap_or_else(Completion::done),
            #[cfg(feature = "cuda-backend")]
            Buffer::Cuda(b) => b.ready.clone(),
        }
    }
}

/// Settings that change how a backend compiles a plan (part of a plan's
/// identity: a context keys its plan cache on them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Let float32 matrix products and convolutions use TF32 tensor cores
    /// (10-bit mantissa inputs, float32 accumulation). Off by default:
    /// float32 means float32 arithmetic. The CPU backend ignores it.
    pub tf32: bool,
    /// Capture a plan into a CUDA graph and replay it (the default, unless
    /// `KILN_CUDA_GRAPHS=0`); off, every run launches its kernels one by
    /// one. The CPU backend ignores it.
    pub cuda_graphs: bool,
    /// Time every node of every run (`Context::with_profiling`): the
    /// executable gets a recorder (see [`crate::profile`]). On CUDA a
    /// profiled plan is never captured into a CUDA graph.
    pub profile: bool,
    /// Choose each cuBLASLt GEMM's algorithm by timing the heuristic's
    /// candidates, once per shape in a process (`Context::with_gemm_tuning`;
    /// off unless `KILN_GEMM_TUNE=1`). The CPU backend ignores it.
    pub gemm_tuning: bool,
}

impl Default for CompileOptions {
    /// No TF32; CUDA graphs unless `KILN_CUDA_GRAPHS` is `0`, `off` or
    /// `false`; GEMM tuning if `KILN_GEMM_TUNE` is `1`, `on` or `true`.
    fn default() -> CompileOptions {
        let graphs =
            !matches!(std::env::var("KILN_CUDA_GRAPHS").as_deref(), Ok("0") | Ok("off") | Ok("false"));
        let gemm_tuning =
            matches!(std::env::var("KILN_GEMM_TUNE").as_deref(), Ok("1") | Ok("on") | Ok("true"));
        CompileOptions { tf32: false, cuda_graphs: graphs, profile: false, gemm_tuning }
    }
}

/// The per-run values of a plan's random streams: stream `k` of the plan
/// draws from counter-based generator (`seed`, `streams[k]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RngArgs {
    /// The context seed (the Philox key).
    pub seed: u64,
    /// The stream number of each plan stream (the high counter words).
    pub streams: Vec<u64>,
}

/// Device counters, updated by the backend as it allocates and runs.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Nodes executed, all runs together.
    pub nodes_executed: AtomicU64,
    /// Bytes allocated, all allocations together.
    pub bytes_allocated: AtomicU64,
    /// Bytes allocated and not yet freed.
    pub live_bytes: AtomicU64,
    /// The most bytes live at once.
    pub peak_bytes: AtomicU64,
    /// Views that could not be views of their operand's layout (a reshape
    /// of a transpose) and were copied into an allocation of their own.
    pub view_copies: AtomicU64,
    /// Kernels compiled at run time (NVRTC on CUDA).
    pub kernel_compiles: AtomicU64,
    /// Nanoseconds waited on NVRTC, all kernels together (wall time: a
    /// plan's kernels compile on several threads, and that counts once).
    pub kernel_compile_nanos: AtomicU64,
    /// Kernels loaded from the on-disk kernel cache instead of compiled.
    pub kernel_disk_hits: AtomicU64,
    /// Kernels found already loaded in this process.
    pub kernel_memory_hits: AtomicU64,
    /// CUDA graphs captured (one per output set of a plan).
    pub graph_captures: AtomicU64,
    /// Runs that replayed a captured graph.
    pub graph_replays: AtomicU64,
    /// Inputs copied into a graph's static input slot before a replay
    /// (the others were already there, see `backends/cuda/replay.rs`).
    pub graph_input_copies: AtomicU64,
    /// Kernels and library calls launched (CUDA; a replayed graph counts
    /// the launches it holds).
    pub launches: AtomicU64,
    /// Nodes run inside launch groups (a multi-tensor kernel on CUDA, one
    /// parallel loop on the CPU; see [`crate::ir::LaunchGroup`]).
    pub grouped_nodes: AtomicU64,
    /// Weight prologues run: calls whose kept values were made again
    /// because a variable they read changed (or on a plan's first call;
    /// see `prologue.rs`).
    pub prologue_runs: AtomicU64,
    /// GEMM shapes whose cuBLASLt algorithm was chosen by timing the
    /// candidates (CUDA, `backends/cuda/gemm_tune.rs`).
    pub gemm_shapes_timed: AtomicU64,
    /// Of those, the shapes where a candidate beat the heuristic's guess.
    pub gemm_guesses_replaced: AtomicU64,
}

impl DeviceStats {
    /// Records an allocation of `bytes`.
    pub fn allocated(&self, bytes: u64) {
        self.bytes_allocated.fetch_add(bytes, Ordering::Relaxed);
        let live = self.live_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(live, Ordering::Relaxed);
    }

    /// Records that `bytes` were freed.
    pub fn freed(&self, bytes: u64) {
        self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// A device that can hold buffers and run plans.
pub trait Backend: Send + Sync {
    /// A short name (`cpu`).
    fn name(&self) -> &'static str;
    /// The device in words, for people (`cuda:0 NVIDIA H100 (sm_90)`).
    fn describe(&self) -> String {
        self.name().to_string()
    }
    /// Whether this is a CUDA device of compute capability 9.0, whose
    /// plans take the sm_90a (`wgmma`) kernels; a report shows those.
    fn hopper(&self) -> bool {
        false
    }
    /// The device's multiprocessors, 0 where that means nothing (the
    /// CPU): a report lowers persistent kernels for this many.
    fn multiprocessors(&self) -> usize {
        0
    }
    /// Whether plans for this backend should move a matmul product's
    /// reshape below its bias so the bias joins the GEMM
    /// (`PassOptions::reshape_epilogues`, the default for a new context).
    fn reshape_epilogues(&self) -> bool {
        true
    }
    /// Whether plans for this backend should merge products that read the
    /// same left operand into one GEMM (`PassOptions::merge_matmuls`).
    fn merge_matmuls(&self) -> bool {
        true
    }
    /// Copies host data (row-major, `shape.numel()` elements) to the device.
    fn upload(&self, data: HostData, shape: &Shape) -> Result<Buffer>;
    /// Copies a buffer to the host, row-major.
    fn download(&self, buffer: &Buffer) -> Result<HostData>;
    /// Compiles a plan into something that can run many times.
    fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>>;
    /// [`Backend::compile`] with settings; backends without any ignore them.
    fn compile_with(&self, plan: Arc<Plan>, options: &CompileOptions) -> Result<Arc<dyn Executable>> {
        let _ = options;
        self.compile(plan)
    }
    /// The device counters.
    fn stats(&self) -> Arc<DeviceStats>;
    /// A timer of device work (CUDA events on the stream that orders every
    /// run), or `None` where work runs on the caller's thread (the CPU).
    fn timer(&self) -> Result<Option<Box<dyn DeviceTimer>>> {
        Ok(None)
    }
    /// Becomes a rank of a process group (see [`crate::dist`]): plans
    /// compiled from then on run their collectives in it. Once per
    /// backend; may block until every rank joins (NCCL).
    fn join_group(&self, joining: crate::dist::Joining) -> Result<()> {
        let _ = joining;
        Err(Error::Device {
            message: format!("the {} backend runs no collectives", self.name()),
            location: crate::Location::caller(),
        })
    }
    /// The group this device is a rank of, if any.
    fn member(&self) -> Option<crate::dist::Joining> {
        None
    }
}

/// Times the device work enqueued between [`DeviceTimer::start`] and
/// [`DeviceTimer::stop`] (for benchmarks: `Context::device_timer`).
pub trait DeviceTimer: Send {
    /// Marks the start (records an event on the device's ordering stream).
    fn start(&mut self) -> Result<()>;
    /// Marks the end, waits for it, and returns the milliseconds between.
    fn stop(&mut self) -> Result<f64>;
}

/// A compiled plan.
pub trait Executable: Send + Sync {
    /// Runs the plan and waits for it: `inputs[k]` binds `Op::Input(k)`;
    /// returns one buffer per graph output, in order. Bad data found while
    /// running (an out-of-range gather index) is an error, never a panic.
    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>>;

    /// Starts a run and returns without waiting for the device: the
    /// outputs can be read by later plans at once (the device orders them)
    /// and by the host once [`Launched::done`] has finished, which is also
    /// where errors found while running are reported (see
    /// [`crate::runtime`]). Backends that compute on the caller's thread
    /// (the CPU) finish here.
    fn launch(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Launched> {
        Ok(Launched { outputs: self.run(inputs, rng)?, done: Completion::done() })
    }

    /// The input slots the plan writes an output over ([`Plan::donated`]):
    /// the ones worth giving up to [`Executable::launch_owned`].
    fn donated(&self) -> &[u32] {
        &[]
    }

    /// [`Executable::launch`] on inputs the caller gives up. For each input
    /// slot the plan writes an output over ([`Plan::donated`]), a backend
    /// writes in that input's own bytes when the run then holds the only
    /// reference to them (the caller kept no clone, and nobody else holds
    /// one), and over a copy otherwise: a value someone can still read is
    /// never changed. The other inputs are only read, as by `launch`.
    /// Backends that never write in place launch as `launch` does.
    fn launch_owned(&self, inputs: Vec<Buffer>, rng: &RngArgs) -> Result<Launched> {
        self.launch(&inputs, rng)
    }

    /// The node times of the runs since the last call, as times from
    /// `run_start`, when the plan was compiled with profiling
    /// ([`CompileOptions::profile`]); `None` otherwise. Called after a run
    /// has finished.
    fn take_profile(&self, run_start: std::time::Instant) -> Option<crate::profile::RunTimes> {
        let _ = run_start;
        None
    }
}

/// A launched run: its outputs and its completion.
pub struct Launched {
    /// One buffer per graph output (each carries `done` too).
    pub outputs: Vec<Buffer>,
    /// The run's completion.
    pub done: Completion,
}
