//! The counters a context keeps ([`Stats`]): compiles and cache hits,
//! memory, kernels, CUDA graph replays, launches, weight prologues, and
//! what each region of the recording graph holds.

use super::{CompileTime, Context, Recompile, RegionStats};

/// Counters a context keeps; see [`Context::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Plans compiled (cache misses).
    pub compiles: u64,
    /// How long the latest compile took, by phase (`None` before the
    /// first): where a slow first call went.
    pub last_compile: Option<CompileTime>,
    /// All compiles' time together.
    pub compile_time: std::time::Duration,
    /// Reads answered by an already compiled plan.
    pub cache_hits: u64,
    /// Graph nodes run by the backend, all runs together.
    pub nodes_executed: u64,
    /// Bytes the backend allocated, all allocations together.
    pub bytes_allocated: u64,
    /// The most bytes the backend held at once.
    pub peak_bytes: u64,
    /// Nodes in the recording graph now (recorded, not yet realized or dropped).
    pub graph_nodes: usize,
    /// Realized buffers the context holds now.
    pub buffers: usize,
    /// Compiled plans the context's cache holds now.
    pub cached_plans: usize,
    /// Device bytes kiln holds now (buffers, arenas, scratch); on CUDA the
    /// caching allocator's free blocks are not counted.
    pub live_bytes: u64,
    /// Kernels compiled at run time (NVRTC on CUDA; 0 on the CPU).
    pub kernel_compiles: u64,
    /// Wall time spent waiting on NVRTC for those kernels: a plan's
    /// kernels compile as a few programs on threads at once, and that
    /// counts once. Part of [`Stats::compile_time`] when the compile
    /// happened on a plan's first run.
    pub kernel_compile_time: std::time::Duration,
    /// Kernels loaded from the on-disk kernel cache instead of compiled.
    pub kernel_disk_hits: u64,
    /// Kernels found already loaded in this process.
    pub kernel_memory_hits: u64,
    /// CUDA graphs captured (one per output set of a plan; 0 on the CPU).
    pub graph_captures: u64,
    /// Runs that replayed a captured CUDA graph.
    pub graph_replays: u64,
    /// Inputs copied into a CUDA graph's static input slots before a
    /// replay; an input whose bytes the slot already holds is not copied.
    pub graph_input_copies: u64,
    /// Kernels and library calls (cuBLAS, cuDNN, NCCL) launched on a CUDA
    /// device, all runs together; a replayed CUDA graph counts every
    /// launch it holds, as `torch.profiler` counts a step's kernels. 0 on
    /// the CPU, whose steps [`Stats::nodes_executed`] counts. Per training
    /// step, it says how much a step launches (issue 35's kernel counts).
    pub launches: u64,
    /// Nodes that ran inside launch groups, all runs together: the
    /// optimizer updates, loss scaler checks and other small elementwise
    /// work the `horizontal` pass batched into one multi-tensor launch
    /// (CUDA) or one parallel loop (CPU).
    pub grouped_nodes: u64,
    /// Weight prologues run: calls that made a plan's kept values again
    /// (its first call, or a variable they are made from changed), where
    /// the `weight-prologue` pass moved work on variables alone (the
    /// merged projections' weight copy, autocast's weight casts) out of
    /// the plan. An inference loop runs it once.
    pub prologue_runs: u64,
    /// GEMM shapes whose cuBLASLt algorithm this device chose by timing
    /// the candidates cuBLASLt's heuristic offered, when a plan was
    /// compiled with [`crate::Context::with_gemm_tuning`] on (CUDA; once
    /// per shape in a process). A second plan with the same shapes adds
    /// nothing.
    pub gemm_shapes_timed: u64,
    /// Of [`Stats::gemm_shapes_timed`], the shapes where another candidate
    /// beat the heuristic's first choice by more than the noise margin
    /// (3%) and replaced it.
    pub gemm_guesses_replaced: u64,
    /// Per region of the recording graph (scopes, their `grad/` regions):
    /// nodes recorded there now, and the variables the region's workspace
    /// holds. Sorted by path; the root region's path is empty.
    pub regions: Vec<RegionStats>,
    /// Why the latest compiles (up to 32) happened, for each that has
    /// the structure of an earlier one: the first node whose shape,
    /// dtype, constant or attribute changed, or the option that did.
    pub recompiles: Vec<Recompile>,
}

impl Context {
    /// Compile, cache and memory counters.
    pub fn stats(&self) -> Stats {
        use std::sync::atomic::Ordering::Relaxed;
        let device = self.inner.backend.stats();
        let state = self.state();
        Stats {
            compiles: state.compiles,
            last_compile: state.compile_times.last,
            compile_time: state.compile_times.total,
            cache_hits: state.cache_hits,
            nodes_executed: device.nodes_executed.load(Relaxed),
            bytes_allocated: device.bytes_allocated.load(Relaxed),
            peak_bytes: device.peak_bytes.load(Relaxed),
            graph_nodes: state.graph.len(),
            buffers: state.buffers.len(),
            cached_plans: state.cache.len(),
            live_bytes: device.live_bytes.load(Relaxed),
            kernel_compiles: device.kernel_compiles.load(Relaxed),
            kernel_compile_time: std::time::Duration::from_nanos(device.kernel_compile_nanos.load(Relaxed)),
            kernel_disk_hits: device.kernel_disk_hits.load(Relaxed),
            kernel_memory_hits: device.kernel_memory_hits.load(Relaxed),
            graph_captures: device.graph_captures.load(Relaxed),
            graph_replays: device.graph_replays.load(Relaxed),
            graph_input_copies: device.graph_input_copies.load(Relaxed),
            launches: device.launches.load(Relaxed),
            grouped_nodes: device.grouped_nodes.load(Relaxed),
            prologue_runs: device.prologue_runs.load(Relaxed),
            gemm_shapes_timed: device.gemm_shapes_timed.load(Relaxed),
            gemm_guesses_replaced: device.gemm_guesses_replaced.load(Relaxed),
            regions: state.region_stats(),
            recompiles: state.observe.recompiles.clone(),
        }
    }

    /// Starts [`Stats::peak_bytes`] over from the bytes held now (as
    /// PyTorch's `torch.cuda.reset_peak_memory_stats`), so that a peak
    /// measures one phase: decoding after the weights are loaded, one
    /// step after the warm-up.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let big = ctx.randn([1 << 16]);
    /// ctx.realize(&[&big])?;
    /// drop(big);
    /// ctx.reset_peak_bytes();
    /// assert_eq!(ctx.stats().peak_bytes, ctx.stats().live_bytes);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn reset_peak_bytes(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let device = self.inner.backend.stats();
        device.peak_bytes.store(device.live_bytes.load(Relaxed), Relaxed);
    }
}
