//! The user's device handle: a backend, the recording graph, the random
//! seed, realized buffers and the cache of compiled plans.

pub(crate) mod checkpoint;
mod donate;
mod grad;
mod key;
mod observe;
mod realize;
mod recompile;
mod scope;
mod stats;
mod variable;
mod warm_up;
mod workspace;

use crate::backends::cpu::CpuBackend;
use crate::backends::{Backend, Buffer, CompileOptions};
use crate::ir::{BufferId, DType, Graph, NodeId, Op, RegionId, Shape};
use crate::passes::PipelineConfig;
use crate::tensor::{NodeRef, Tensor, TensorNode};
use crate::{Error, Location, Result};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use grad::Gradients;
pub(crate) use realize::{Job, PlanCache};
pub use recompile::{Recompile, RecompileCause};
pub use stats::Stats;
pub use variable::Variable;
pub use warm_up::CompileTime;
pub(crate) use workspace::VarId;
use workspace::Workspaces;
pub use workspace::{RegionStats, VariableInfo, Workspace};

/// A device and everything recorded on it. Cheap to clone (a shared
/// handle); every [`Tensor`] keeps its context alive.
///
/// ```
/// use kiln::prelude::*;
/// let ctx = Context::cpu().with_seed(1);
/// let x = ctx.arange(0.0f32, 4.0, 1.0);
/// assert_eq!((x * 2.0).to_vec::<f32>()?, vec![0.0, 2.0, 4.0, 6.0]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) state: Mutex<State>,
    /// A number no other context of the process has (device errors name
    /// contexts by it).
    pub(crate) serial: u64,
}

/// Everything that changes as the user records and reads.
pub(crate) struct State {
    /// The recording graph: recorded ops, and `Buffer` nodes for realized values.
    pub(crate) graph: Graph,
    /// Every tensor handle given out; dead ones are pruned by `collect`.
    pub(crate) live: Vec<Weak<TensorNode>>,
    /// Realized values, by the id their `Buffer` nodes carry.
    pub(crate) buffers: HashMap<BufferId, Buffer>,
    /// Buffers given to a run to write over (`donate.rs`) whose launch
    /// failed: a read of one reports that run's error, not a freed buffer.
    pub(crate) lost: HashMap<BufferId, crate::Error>,
    next_buffer: u64,
    /// The next random stream; one per random node, so every random node
    /// draws different numbers and a rerun of a program draws the same ones.
    pub(crate) next_stream: u64,
    pub(crate) seed: u64,
    /// Which passes run and where dumps go: from the environment when the
    /// context was made, or [`Context::with_passes`]; a bad toggle is
    /// reported by the first compile. Part of the cache key.
    pub(crate) config: Result<PipelineConfig>,
    /// What the passes may do (fast math, streams); part of the cache key.
    pub(crate) options: crate::passes::PassOptions,
    /// How the backend compiles (TF32); part of the cache key.
    pub(crate) compile: CompileOptions,
    /// The region new nodes go into.
    pub(crate) region: RegionId,
    pub(crate) cache: PlanCache,
    pub(crate) compiles: u64,
    /// How long compiles took (`warm_up.rs`).
    pub(crate) compile_times: warm_up::CompileTimes,
    pub(crate) cache_hits: u64,
    /// Scopes, variables, gradient workspaces, and which nodes are
    /// variable values (autodiff leaves) or detached.
    pub(crate) ws: Workspaces,
    /// Nodes a read is computing without the lock (see `realize.rs`):
    /// roots of collection until the read stores them.
    pub(crate) in_flight: Vec<NodeId>,
    /// Runs launched and not known to have finished (see [`crate::runtime`]).
    pub(crate) runs: crate::runtime::InFlight,
    /// Reports, the profiler and recompile explanations (`observe.rs`).
    pub(crate) observe: observe::Observe,
    /// Reads of host scalars, by the buffer each uploaded: a captured step
    /// binds such an input to the cell's value at each call.
    pub(crate) host_scalars: crate::capture::HostScalarReads,
    /// The thread recording a captured step, if one is: its host reads
    /// are errors (the replay would not run them).
    pub(crate) capturing: Option<std::thread::ThreadId>,
}

impl Context {
    /// A context on the CPU backend (rayon-parallel), with seed 0.
    /// `KILN_PASSES` and `KILN_DUMP` are read here.
    pub fn cpu() -> Context {
        Context::with_backend(Box::new(CpuBackend::new()))
    }

    /// A context on the CPU backend whose fused kernels all run in the
    /// interpreter (`generated: false`: the reference path) or as
    /// generated machine code wherever a body qualifies (`true`, `exp`
    /// bodies included, which [`Context::cpu`] leaves to the interpreter
    /// as measured faster there), whatever `KILN_CPU_CODEGEN` says. For
    /// comparing the two paths.
    pub fn cpu_codegen(generated: bool) -> Context {
        Context::with_backend(Box::new(CpuBackend::with_codegen_all(generated)))
    }

    /// A context on CUDA device `ordinal` (feature `cuda`). A missing
    /// driver, device or library (NVRTC, cuBLAS, cuBLASLt, cuDNN) is an
    /// [`Error::Device`] that names what was looked for; so is a build
    /// without the `cuda` feature.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// match Context::cuda(0) {
    ///     Ok(ctx) => assert_eq!(ctx.device(), "cuda"),
    ///     Err(e) => assert!(matches!(e, Error::Device { .. })),
    /// }
    /// ```
    #[track_caller]
    pub fn cuda(ordinal: usize) -> Result<Context> {
        let location = Location::caller();
        #[cfg(feature = "cuda-backend")]
        {
            match crate::backends::cuda::CudaBackend::new(ordinal) {
                Ok(backend) => Ok(Context::with_backend(Box::new(backend))),
                Err(message) => Err(Error::Device {
                    message: format!("cannot use CUDA device {ordinal}: {message}"),
                    location,
                }),
            }
        }
        #[cfg(not(feature = "cuda-backend"))]
        {
            Err(Error::Device {
                message: format!(
                    "cannot use CUDA device {ordinal}: this build of kiln has no CUDA backend (build it with `--features cuda`)"
                ),
                location,
            })
        }
    }

    /// The best device here: CUDA device 0 when there is one (and the
    /// build has the `cuda` feature), else the CPU. Why CUDA was not
    /// chosen is logged (`tracing`, info level).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::best();
    /// let x = ctx.arange(0.0f32, 4.0, 1.0);
    /// assert_eq!((x * 2.0).to_vec::<f32>()?, vec![0.0, 2.0, 4.0, 6.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn best() -> Context {
        match Context::cuda(0) {
            Ok(ctx) => ctx,
            Err(e) => {
                tracing::info!(reason = %e, "no CUDA device; using the CPU");
                Context::cpu()
            }
        }
    }

    /// A context whose plans run as the CUDA backend would run them, on
    /// the CPU: the same lowering and generated kernels (compiled with
    /// g++), library calls as reference loops. For developing the CUDA
    /// backend without a GPU (feature `cuda-emulator`); slow.
    #[cfg(feature = "cuda-emulator")]
    pub fn cuda_emulated() -> Context {
        Context::with_backend(Box::new(crate::backends::cuda::emulate::EmulatedCuda::new()))
    }

    pub(crate) fn with_backend(backend: Box<dyn Backend>) -> Context {
        let observe = observe::Observe::from_env();
        let compile = CompileOptions { profile: observe.wants_profiling(), ..CompileOptions::default() };
        let state = State {
            graph: Graph::new(),
            live: Vec::new(),
            buffers: HashMap::new(),
            lost: HashMap::new(),
            next_buffer: 0,
            next_stream: 0,
            seed: 0,
            config: PipelineConfig::from_env(),
            options: crate::passes::PassOptions {
                reshape_epilogues: backend.reshape_epilogues(),
                merge_matmuls: backend.merge_matmuls(),
                ..crate::passes::PassOptions::default()
            },
            compile,
            region: RegionId::ROOT,
            cache: PlanCache::default(),
            compiles: 0,
            compile_times: Default::default(),
            cache_hits: 0,
            ws: Workspaces::default(),
            in_flight: Vec::new(),
            runs: Default::default(),
            host_scalars: Default::default(),
            capturing: None,
            observe,
        };
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Context { inner: Arc::new(Inner { backend, state: Mutex::new(state), serial }) }
    }

    /// Sets the random seed. Random numbers are counter-based (Philox
    /// 4x32-10 keyed by the seed and a per-node stream), so a program run
    /// twice with one seed draws the same numbers, on every backend.
    pub fn with_seed(self, seed: u64) -> Context {
        self.state().seed = seed;
        self
    }

    /// Allows float rewrites that are exact only in real arithmetic
    /// (reassociation, multiplying by the reciprocal of any constant). Off
    /// by default: without it the optimizer only makes rewrites that give
    /// bit-identical results (NaN, infinities and -0.0 included).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu().with_fast_math(true);
    /// let x = ctx.arange(0.0f32, 4.0, 1.0);
    /// assert_eq!((x / 4.0).to_vec::<f32>()?, vec![0.0, 0.25, 0.5, 0.75]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn with_fast_math(self, on: bool) -> Context {
        self.state().options.fast_math = on;
        self
    }

    /// Turns passes on or off, as `KILN_PASSES` does (`"-fusion"`,
    /// `"-simplify,-memory"`; later toggles win, and they apply on top of
    /// `KILN_PASSES`). An unknown pass name is reported by the next read,
    /// with the list of valid names. Plans compiled before stay cached
    /// under their own configuration.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu().with_passes("-cse");
    /// let x = ctx.arange(0.0f32, 3.0, 1.0);
    /// assert_eq!((x.exp() + x.exp()).to_vec::<f32>()?.len(), 3);
    /// let bad = Context::cpu().with_passes("-no-such-pass");
    /// assert!(bad.arange(0.0f32, 3.0, 1.0).to_vec::<f32>().is_err());
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn with_passes(self, toggles: &str) -> Context {
        {
            let mut state = self.state();
            state.config = match &state.config {
                Ok(config) => config.clone().toggled(toggles),
                Err(e) => Err(e.clone()),
            };
        }
        self
    }

    /// How many streams the planner may spread independent work over
    /// (values below 1 mean 1). The CPU backend runs streams as concurrent
    /// threads; one stream, the default, suits most CPU-sized graphs.
    pub fn with_streams(self, streams: u32) -> Context {
        self.state().options.streams = streams.max(1);
        self
    }

    /// Lets float32 matrix products and convolutions use TF32 tensor cores
    /// on CUDA (inputs rounded to a 10-bit mantissa, float32 accumulation:
    /// faster, about 1e-3 relative error). Off by default; the CPU ignores
    /// it. Plans compiled before stay cached under their own setting.
    pub fn with_tf32(self, on: bool) -> Context {
        self.state().compile.tf32 = on;
        self
    }

    /// Whether plans on CUDA choose each cuBLASLt GEMM's algorithm by
    /// timing the candidates cuBLASLt's heuristic offers, once per shape
    /// in a process, instead of taking its first (off by default, unless
    /// `KILN_GEMM_TUNE=1`; the CPU ignores it). It costs the first compile
    /// of each shape a few to a few hundred milliseconds, measured 0-2%
    /// faster on transformer shapes, and another process may choose
    /// another algorithm where two time alike, changing results in their
    /// last bits. [`crate::Stats::gemm_shapes_timed`] counts what it timed.
    ///
    /// ```no_run
    /// # fn main() -> kiln::Result<()> {
    /// let ctx = kiln::Context::cuda(0)?.with_gemm_tuning(true);
    /// let (a, b) = (ctx.rand([4096, 768]), ctx.rand([768, 3072]));
    /// a.matmul(&b).realize()?; // times the candidates for this shape
    /// println!("{} shape(s) timed", ctx.stats().gemm_shapes_timed);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_gemm_tuning(self, on: bool) -> Context {
        self.state().compile.gemm_tuning = on;
        self
    }

    /// Whether plans on CUDA are captured into CUDA graphs and replayed
    /// (the default, unless `KILN_CUDA_GRAPHS=0`), or launched kernel by
    /// kernel every run. Results are the same either way.
    pub fn with_cuda_graphs(self, on: bool) -> Context {
        self.state().compile.cuda_graphs = on;
        self
    }

    /// The backend's name (`cpu` or `cuda`).
    pub fn device(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// A timer of device work (CUDA events), for benchmarks; `None` on the
    /// CPU, where a read's wall-clock time is its work.
    pub fn device_timer(&self) -> Result<Option<Box<dyn crate::backends::DeviceTimer>>> {
        self.inner.backend.timer()
    }

    /// The device in words (`cpu`, `cuda:0 NVIDIA H100 80GB HBM3 (sm_90)`).
    pub fn device_description(&self) -> String {
        self.inner.backend.describe()
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the graph half
        // edited in a way later reads would trust more than a fresh
        // verify; recover the guard rather than propagate the poison.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Records a node and returns its tensor, or a failed tensor carrying
    /// the inference error at `location`.
    pub(crate) fn record(
        &self,
        op: Op,
        operands: &[NodeRef],
        declared: Option<(Shape, DType)>,
        location: Location,
    ) -> Tensor {
        let mut state = self.state();
        let operands: Vec<NodeId> = operands.iter().map(|&r| state.resolve(r)).collect();
        let operands = &operands[..];
        let region = state.region;
        let mnemonic = op.mnemonic();
        let op = match op {
            Op::Random { dist, .. } => {
                let stream = state.next_stream;
                state.next_stream += 1;
                Op::Random { dist, stream }
            }
            Op::Collective { what, .. } => Op::Collective { what, seq: state.graph.next_effect_seq() },
            other => other,
        };
        match state.graph.add(op, operands, declared, region) {
            Ok(id) => {
                let node = state.graph.node(id);
                let (shape, dtype) = (node.shape.clone(), node.dtype);
                self.handle(&mut state, id, shape, dtype)
            }
            Err(message) => Tensor::failed(classify(mnemonic, message, location)),
        }
    }

    /// Stores a realized buffer and returns a tensor reading it.
    pub(crate) fn record_buffer(&self, buffer: Buffer) -> Tensor {
        let mut state = self.state();
        let (shape, dtype) = (buffer.shape().clone(), buffer.dtype());
        let id = state.add_buffer(buffer);
        let region = state.region;
        let node = state.graph.add(Op::Buffer(id), &[], Some((shape.clone(), dtype)), region);
        match node {
            Ok(node) => self.handle(&mut state, node, shape, dtype),
            Err(message) => Tensor::failed(Error::Backend(message)),
        }
    }

    pub(crate) fn handle(&self, state: &mut State, id: NodeId, shape: Shape, dtype: DType) -> Tensor {
        let node = Arc::new(TensorNode { ctx: self.clone(), id, shape, dtype });
        state.live.push(Arc::downgrade(&node));
        Tensor::from_node(node)
    }
}

impl State {
    /// The node an operand reads now: itself, or a variable's current value.
    pub(crate) fn resolve(&self, r: NodeRef) -> NodeId {
        match r {
            NodeRef::Node(id) => id,
            NodeRef::Var(v) => self.ws.value(v),
        }
    }

    /// The buffer holding a variable's value (it must be realized).
    pub(crate) fn var_buffer(&self, v: VarId) -> Result<Buffer> {
        let var = self.ws.var(v);
        match self.graph.node(var.value).op {
            Op::Buffer(b) => self.buffers.get(&b).cloned(),
            _ => None,
        }
        .ok_or_else(|| Error::Backend(format!("variable \"{}\" has no realized value", var.name)))
    }

    /// Makes `buffer` the value of variable `v` (a new buffer node in the
    /// variable's region, as a realized assignment would leave it).
    pub(crate) fn set_var_buffer(&mut self, v: VarId, buffer: Buffer) -> Result<()> {
        let (shape, dtype, region) = {
            let var = self.ws.var(v);
            (var.shape.clone(), var.dtype, var.region)
        };
        let id = self.add_buffer(buffer);
        let node =
            self.graph.add(Op::Buffer(id), &[], Some((shape, dtype)), region).map_err(Error::Backend)?;
        self.ws.set_value(v, node);
        Ok(())
    }

    /// An error when the calling thread is recording a captured step: a
    /// read then would run a plan of its own, which the replayed step
    /// would not run (and the assignments recorded before the read would
    /// run only at the recording call).
    pub(crate) fn check_not_capturing(&self, location: Location) -> Result<()> {
        if self.capturing == Some(std::thread::current().id()) {
            return Err(Error::Workspace {
                op: "captured step",
                message: "a value was read while the step records (to_vec, item, realize, sync or a future \
                          inside the step's closure); a replayed call runs one plan and no host code, so the \
                          read would not happen again and the assignments before it would be lost. Return the \
                          value from the step and read it after the call"
                    .into(),
                location,
            });
        }
        Ok(())
    }

    pub(crate) fn add_buffer(&mut self, buffer: Buffer) -> BufferId {
        let id = BufferId(self.next_buffer);
        self.next_buffer += 1;
        self.buffers.insert(id, buffer);
        id
    }

    /// Drops every node no live tensor, variable or gradient workspace
    /// needs, and every buffer no node reads. Realized nodes have no
    /// operands, so a loop that reads a value each iteration keeps the
    /// graph at a constant size.
    pub(crate) fn collect(&mut self) {
        self.live.retain(|w| w.strong_count() > 0);
        let mut roots: Vec<NodeId> = self.live.iter().filter_map(|w| w.upgrade()).map(|n| n.id).collect();
        roots.extend(self.ws.roots());
        roots.extend_from_slice(&self.in_flight);
        let keep = self.graph.reachable_from(&roots);
        let dead: Vec<NodeId> = self.graph.node_ids().into_iter().filter(|&id| !keep.contains(&id)).collect();
        self.graph.remove_many(&dead);
        // Removed ids may be reused by later nodes: forget them.
        self.ws.retain_nodes(|id| keep.contains(&id));
        let used: HashSet<BufferId> = self
            .graph
            .node_ids()
            .into_iter()
            .filter_map(|id| match self.graph.node(id).op {
                Op::Buffer(b) => Some(b),
                _ => None,
            })
            .collect();
        self.buffers.retain(|id, _| used.contains(id));
        self.host_scalars.retain(|id, _| used.contains(id));
    }
}

/// Turns an inference message into a dtype or shape error. Inference
/// messages about element types always mention `dtype`, `cast` or `bool`.
fn classify(op: &'static str, message: String, location: Location) -> Error {
    // Whole words: "broadcast" contains "cast" but is a shape matter.
    let word = |w: &str| message.split(|c: char| !c.is_alphanumeric() && c != '_').any(|x| x == w);
    if word("dtype") || word("cast") || message.contains("on bool") {
        Error::DType { op, message, location }
    } else {
        Error::Shape { op, message, location }
    }
}
