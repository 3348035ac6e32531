//! A compiled plan on the device: its program's kernels loaded, its
//! arena, scratch and parameter block allocated, its cuDNN descriptors
//! made, and the enqueueing of its steps on the planned streams.
//!
//! # A run
//!
//! Under the device's launch lock: the parameter block (seed, random
//! stream numbers, index-check status) is copied in on stream 0; streams
//! `1..n` wait for stream 0 (the *fork*); every step waits for its events,
//! enqueues its launches on its stream and records its events; streams
//! `1..n` are joined back into stream 0; a completion event is recorded.
//! The first run of a plan runs eagerly; later runs replay a CUDA graph
//! captured from exactly this enqueueing (`graph.rs`). A plan with index
//! checks has the run itself copy their status into pinned host memory
//! after its last step, before the completion event; the host reads it
//! only when someone waits on the run's completion (`completion.rs`), so
//! `launch` never waits for the device, and the host waits only when the
//! caller asks for results (a host read, `sync`, the in-flight limit).
//!
//! A plan with collectives also takes part in its group's health
//! (`group.rs`): no run on a broken group, a failed run breaks it, and
//! its waits have the group's watchdog.

use super::codegen::Kernel;
use super::device::{raw, Device, Event, LaunchState, BLAS_WORKSPACE};
use super::dnn::{self, ConvPlan, PoolPlan};
use super::gemm_tune;
use super::graph::Graphs;
use super::lt::LtPlan;
use super::memory::DeviceAlloc;
use super::program::{Launch, Loc, Program, Region};
use super::{blas, tensor_map, CudaBuffer};
use crate::backends::{Buffer, Executable, Launched, RngArgs};
use crate::ir::Plan;
use crate::{Error, Result};
use cudarc::driver::{result, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A plan compiled for one device.
pub(crate) struct CudaExecutable {
    pub dev: Arc<Device>,
    pub program: Program,
    functions: Vec<CudaFunction>,
    convs: HashMap<(usize, usize), ConvPlan>,
    pools: HashMap<(usize, usize), PoolPlan>,
    /// GEMMs cuBLASLt runs; where it applies the epilogue
    /// ([`LtPlan::fused`]) the next launch is skipped.
    lts: HashMap<(usize, usize), LtPlan>,
    /// Kernels and library calls a run launches ([`Stats::launches`]).
    ///
    /// [`Stats::launches`]: crate::Stats::launches
    launches: u64,
    arena: Option<DeviceAlloc>,
    scratch: Option<DeviceAlloc>,
    /// Every stream's [`Region::Transient`], one after another.
    transient: Option<DeviceAlloc>,
    /// [`Region::Counters`], zeroed when made.
    counters: Option<DeviceAlloc>,
    params: DeviceAlloc,
    events: Vec<Event>,
    fork: Event,
    joins: Vec<Event>,
    pub state: Mutex<Graphs>,
    /// Where runs copy their index-check status back to.
    status: super::completion::StatusCopies,
    /// Step events of a profiled plan (`profile.rs`).
    pub profile: Option<super::profile::StepTimes>,
    /// The device's NCCL communicator, for plans with collectives (and
    /// only those: its presence makes a run one with collectives).
    pub comm: Option<Arc<super::nccl::Comm>>,
}

/// Where each region is for one run (or one captured graph).
pub(crate) struct Bindings {
    pub arena: u64,
    pub scratch: u64,
    /// Where each stream's [`Region::Transient`] starts.
    pub transient: Vec<u64>,
    pub counters: u64,
    pub params: u64,
    pub inputs: Vec<u64>,
    pub outs: Vec<u64>,
}

impl Bindings {
    fn ptr(&self, l: Loc) -> u64 {
        let base = match l.region {
            Region::Arena => self.arena,
            Region::Scratch => self.scratch,
            Region::Transient(s) => self.transient.get(s as usize).copied().unwrap_or(0),
            Region::Params => self.params,
            Region::Counters => self.counters,
            Region::Input(k) => self.inputs.get(k as usize).copied().unwrap_or(0),
            Region::Out(k) => self.outs.get(k as usize).copied().unwrap_or(0),
        };
        base + l.offset
    }
}

/// The prelude's launches are keyed under this step index.
const PRELUDE: usize = usize::MAX;

fn bad(msg: impl std::fmt::Display) -> Error {
    Error::Backend(format!("cuda: {msg}"))
}

/// Lets each kernel that sizes more than [`Kernel::STATIC_SHARED`] bytes of
/// shared memory at launch have them (the function attribute; without it
/// the launch fails).
fn allow_shared(kernels: &[Kernel], functions: &[CudaFunction]) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX;
    for (k, f) in kernels.iter().zip(functions) {
        if k.shared > Kernel::STATIC_SHARED {
            f.set_attribute(MAX, k.shared as i32).map_err(|e| {
                bad(format!("kernel {} asks for {} bytes of shared memory: {e:?}", k.name, k.shared))
            })?;
        }
    }
    Ok(())
}

/// The plans of a program's library calls (cuDNN convolutions and
/// pooling, cuBLASLt epilogues), by (step, launch).
#[derive(Default)]
struct LibraryPlans {
    convs: HashMap<(usize, usize), ConvPlan>,
    pools: HashMap<(usize, usize), PoolPlan>,
    lts: HashMap<(usize, usize), LtPlan>,
}

impl LibraryPlans {
    /// Whether `program` calls a library that needs a plan (in its
    /// prelude or its steps, as [`LibraryPlans::new`] walks them).
    fn needed(program: &Program) -> bool {
        program
            .prelude
            .iter()
            .chain(program.steps.iter().flat_map(|s| &s.launches))
            .any(|l| matches!(l, Launch::Conv(_) | Launch::Pool(_) | Launch::Gemm(_)))
    }

    /// Chooses every library call's algorithm, under the launch lock
    /// (cuBLASLt's by timing where `gemm_tuning`, see `gemm_tune.rs`).
    fn new(dev: &Device, program: &Program, gemm_tuning: bool) -> Result<LibraryPlans> {
        let mut plans = LibraryPlans::default();
        let device = format!("{} {}", dev.ordinal_name(), dev.name);
        let mut ls = dev.launch()?;
        let launches = program.prelude.iter().enumerate().map(|(j, l)| (PRELUDE, j, 0usize, l)).chain(
            program.steps.iter().enumerate().flat_map(|(i, s)| {
                s.launches.iter().enumerate().map(move |(j, l)| (i, j, s.stream as usize, l))
            }),
        );
        for (i, j, stream, l) in launches {
            match l {
                Launch::Conv(c) => {
                    let plan =
                        ConvPlan::new(ls.dnn[stream].handle, c, dev.dnn_workspace_limit, &dev.conv_algos)?;
                    ls.grow_dnn_workspace(stream, plan.workspace)?;
                    plans.convs.insert((i, j), plan);
                }
                Launch::Pool(p) => {
                    plans.pools.insert((i, j), PoolPlan::new(p)?);
                }
                Launch::Gemm(g) => {
                    let mut lt = LtPlan::new(ls.blas[stream].lt, g, gemm_tune::wanted(gemm_tuning))?;
                    if let Some(plan) = lt.as_mut() {
                        let tuner = gemm_tune::Tuner {
                            handle: ls.blas[stream].lt,
                            ctx: &ls.ctx,
                            device: &device,
                            stats: &dev.stats,
                        };
                        gemm_tune::choose(plan, g, gemm_tuning, &tuner)?;
                    }
                    // A GEMM cuBLASLt cannot take runs on classic cuBLAS.
                    ls.grow_blas_workspace(stream, lt.as_ref().map_or(BLAS_WORKSPACE, LtPlan::workspace))?;
                    if let Some(plan) = lt {
                        plans.lts.insert((i, j), plan);
                    }
                }
                _ => {}
            }
        }
        Ok(plans)
    }
}

impl CudaExecutable {
    /// The executable of `program`: captured into CUDA graphs where
    /// `graphs`, its cuBLASLt algorithms timed where `gemm_tuning`.
    pub fn new(
        dev: Arc<Device>,
        plan: &Plan,
        program: Program,
        graphs: bool,
        gemm_tuning: bool,
    ) -> Result<CudaExecutable> {
        let _span = tracing::debug_span!("compile", backend = "cuda", steps = program.steps.len()).entered();
        dev.bind()?;
        let alloc = |bytes: u64| -> Result<Option<DeviceAlloc>> {
            if bytes == 0 {
                Ok(None)
            } else {
                dev.pool.alloc(bytes).map(Some)
            }
        };
        let arena = alloc(program.arena_bytes)?;
        let scratch = alloc(program.scratch_bytes)?;
        let transient = alloc(program.transient_total())?;
        let params = dev.pool.alloc(program.params_bytes.max(8))?;
        let counters = alloc(program.counter_bytes)?;
        let mut ls = dev.launch()?;
        ls.ensure_streams(program.streams as usize)?;
        if let Some(c) = &counters {
            // SAFETY: `c` is a live allocation of at least counter_bytes;
            // stream 0 is the stream that uses it first (`Pool::alloc`).
            unsafe {
                result::memset_d8_async(c.ptr(), 0, program.counter_bytes as usize, raw(&ls.streams[0]))
            }
            .map_err(|e| bad(format!("zeroing the plan's counters: {e:?}")))?;
        }
        drop(ls);
        // The kernels compile while cuDNN and cuBLASLt choose their
        // algorithms: both take a plan's first compile tens to hundreds of
        // milliseconds, on different resources (the host's cores; the GPU).
        let compile = || -> Result<Vec<CudaFunction>> {
            dev.bind()?;
            let functions = dev.kernels.get_all(&dev.ctx, &program.kernels)?;
            allow_shared(&program.kernels, &functions)?;
            Ok(functions)
        };
        let (functions, libraries) = if LibraryPlans::needed(&program) {
            std::thread::scope(|s| {
                let compiling =
                    std::thread::Builder::new().name("kiln-kernels".into()).spawn_scoped(s, compile);
                let libraries = LibraryPlans::new(&dev, &program, gemm_tuning);
                let functions = match compiling {
                    Ok(h) => h.join().unwrap_or_else(|_| Err(bad("the kernel compile thread panicked"))),
                    // A thread that cannot start compiles on this one.
                    Err(_) => compile(),
                };
                (functions, libraries)
            })
        } else {
            (compile(), Ok(LibraryPlans::default()))
        };
        let (functions, LibraryPlans { convs, pools, lts }) = (functions?, libraries?);
        let events = (0..program.events).map(|_| Event::new(&dev.ctx)).collect::<Result<Vec<_>>>()?;
        let joins = (1..program.streams).map(|_| Event::new(&dev.ctx)).collect::<Result<Vec<_>>>()?;
        let _ = plan;
        Ok(CudaExecutable {
            functions,
            convs,
            pools,
            launches: program.launch_count() - lts.values().filter(|p| p.fused()).count() as u64,
            lts,
            arena,
            scratch,
            transient,
            counters,
            params,
            events,
            fork: Event::new(&dev.ctx)?,
            joins,
            state: Mutex::new(Graphs::new(program.inputs.len(), graphs)),
            status: Default::default(),
            program,
            dev,
            profile: None,
            comm: None,
        })
    }

    /// Bindings with the executable's own regions and the given inputs and outputs.
    pub fn bindings(&self, inputs: Vec<u64>, outs: Vec<u64>) -> Bindings {
        Bindings {
            arena: self.arena.as_ref().map_or(0, DeviceAlloc::ptr),
            scratch: self.scratch.as_ref().map_or(0, DeviceAlloc::ptr),
            transient: {
                let base = self.transient.as_ref().map_or(0, DeviceAlloc::ptr);
                let streams = self.program.transient_bytes.len() as u32;
                (0..streams).map(|s| base + self.program.transient_base(s)).collect()
            },
            counters: self.counters.as_ref().map_or(0, DeviceAlloc::ptr),
            params: self.params.ptr(),
            inputs,
            outs,
        }
    }

    /// The run's parameter block: seed, stream numbers, reset statuses.
    fn params_block(&self, rng: &RngArgs) -> Vec<u64> {
        let mut p = Vec::with_capacity((self.program.params_bytes / 8) as usize);
        p.push(rng.seed);
        p.extend(rng.streams.iter().take(self.program.random_streams));
        p.resize(1 + self.program.random_streams, 0);
        for _ in &self.program.checks {
            p.push(u64::MAX);
            p.push(0);
        }
        p
    }

    /// Copies the parameter block in on stream 0.
    pub fn write_params(&self, ls: &LaunchState, rng: &RngArgs) -> Result<()> {
        let block = self.params_block(rng);
        // SAFETY: the block fits the allocation (sized by the program);
        // pageable memory is staged before the call returns.
        unsafe { result::memcpy_htod_async(self.params.ptr(), &block, raw(&ls.streams[0])) }
            .map_err(|e| bad(format!("copying the run's parameters: {e:?}")))
    }

    /// Enqueues the whole program on `streams` (run or capture streams).
    pub fn enqueue(&self, ls: &LaunchState, streams: &[Arc<CudaStream>], b: &Bindings) -> Result<()> {
        let n = self.program.streams as usize;
        let s0 = raw(&streams[0]);
        if let Some(p) = &self.profile {
            p.begin(&streams[0])?;
        }
        for (j, l) in self.program.prelude.iter().enumerate() {
            self.launch_one(ls, streams, 0, l, b, (PRELUDE, j))
                .map_err(|e| bad(format!("an output fill: {e}")))?;
        }
        if n > 1 {
            self.fork.record(s0)?;
            for s in &streams[1..n] {
                self.fork.wait_on(raw(s))?;
            }
        }
        for (i, step) in self.program.steps.iter().enumerate() {
            let idx = step.stream as usize;
            let s = raw(&streams[idx]);
            let _span = tracing::trace_span!("launch", op = step.op, node = %step.node).entered();
            for &w in &step.waits {
                self.events[w as usize].wait_on(s)?;
            }
            if let Some(p) = &self.profile {
                p.mark(i, &streams[idx], false)?;
            }
            let mut skip = false;
            for (j, l) in step.launches.iter().enumerate() {
                if std::mem::take(&mut skip) {
                    continue;
                }
                skip = matches!(l, Launch::Gemm(_)) && self.lts.get(&(i, j)).is_some_and(LtPlan::fused);
                self.launch_one(ls, streams, idx, l, b, (i, j))
                    .map_err(|e| Error::Backend(format!("cuda: {} ({}): {e}", step.node, step.op)))?;
            }
            if let Some(p) = &self.profile {
                p.mark(i, &streams[idx], true)?;
            }
            for &r in &step.records {
                self.events[r as usize].record(s)?;
            }
        }
        for (k, s) in streams[1..n].iter().enumerate() {
            self.joins[k].record(raw(s))?;
            self.joins[k].wait_on(s0)?;
        }
        Ok(())
    }

    fn launch_one(
        &self,
        ls: &LaunchState,
        streams: &[Arc<CudaStream>],
        idx: usize,
        l: &Launch,
        b: &Bindings,
        key: (usize, usize),
    ) -> std::result::Result<(), String> {
        let stream = &streams[idx];
        match l {
            Launch::Kernel { kernel, args } => {
                let k = &self.program.kernels[*kernel];
                let ptrs: Vec<u64> = args.iter().map(|&a| b.ptr(a)).collect();
                let maps = tensor_map::encode_all(k, &ptrs)?;
                let mut builder = stream.launch_builder(&self.functions[*kernel]);
                for p in &ptrs {
                    builder.arg(p);
                }
                for m in &maps {
                    builder.arg(m);
                }
                let cfg = LaunchConfig {
                    grid_dim: (k.grid, 1, 1),
                    block_dim: (k.block, 1, 1),
                    shared_mem_bytes: k.shared,
                };
                // SAFETY: the kernel's parameters are pointers in this order,
                // then its tensor maps (lowering wrote both), each into a
                // region sized for what the kernel indexes.
                unsafe { builder.launch(cfg) }.map_err(|e| format!("launching {}: {e:?}", k.name))?;
            }
            Launch::Gemm(g) if self.lts.contains_key(&key) => {
                let plan = &self.lts[&key];
                let h = &ls.blas[idx];
                let bias = g.epilogue.bias().map_or(0, |l| b.ptr(l));
                plan.run(
                    h.lt,
                    raw(stream),
                    b.ptr(g.a.0),
                    b.ptr(g.b.0),
                    b.ptr(g.c.0),
                    bias,
                    g.residual.map_or(0, |r| b.ptr(r)),
                    h.workspace.ptr(),
                )
                .map_err(|e| e.to_string())?;
            }
            Launch::Gemm(g) => {
                blas::gemm(ls.blas[idx].handle, raw(stream), g, b.ptr(g.a.0), b.ptr(g.b.0), b.ptr(g.c.0))
                    .map_err(|e| e.to_string())?;
            }
            Launch::Conv(c) => {
                let plan = self.convs.get(&key).ok_or("a convolution without its plan")?;
                let h = &ls.dnn[idx];
                dnn::set_stream(h.handle, raw(stream)).map_err(|e| e.to_string())?;
                plan.run(h.handle, b.ptr(c.x.at), b.ptr(c.w.at), b.ptr(c.y.at), h.workspace.ptr())
                    .map_err(|e| e.to_string())?;
            }
            Launch::Pool(p) => {
                let plan = self.pools.get(&key).ok_or("a pooling without its plan")?;
                let h = &ls.dnn[idx];
                dnn::set_stream(h.handle, raw(stream)).map_err(|e| e.to_string())?;
                plan.run(h.handle, b.ptr(p.x.at), b.ptr(p.y.at)).map_err(|e| e.to_string())?;
            }
            Launch::Collective(c) => {
                let comm =
                    self.comm.as_ref().ok_or("a collective in a plan of a device in no process group")?;
                // SAFETY: lowering sized the operand for `count` elements
                // and the result for `what.result_count(count)` (checked by
                // `bounds.rs`), in this run's memory; a collective's result
                // never shares its operand's bytes (only fused elementwise
                // nodes compute in place).
                unsafe { comm.enqueue(c, b.ptr(c.src), b.ptr(c.dst), raw(stream) as *mut _) }?;
            }
        }
        Ok(())
    }

    /// Checks the inputs against the plan: count, shapes and dtypes.
    fn check_inputs<'b>(&self, inputs: &'b [Buffer]) -> Result<Vec<&'b CudaBuffer>> {
        if inputs.len() != self.program.inputs.len() {
            return Err(bad(format!(
                "the plan binds {} input(s), {} given",
                self.program.inputs.len(),
                inputs.len()
            )));
        }
        inputs
            .iter()
            .zip(&self.program.inputs)
            .enumerate()
            .map(|(k, (b, want))| {
                let c = super::cuda_of(b, &self.dev)?;
                let Some((shape, dtype)) = want else { return Ok(c) };
                if c.shape() != shape || c.dtype() != *dtype {
                    return Err(bad(format!(
                        "input {k} is {}{} but the plan expects {dtype}{shape}",
                        c.dtype(),
                        c.shape()
                    )));
                }
                Ok(c)
            })
            .collect()
    }

    /// The check of a run's index-check status: the run copies the
    /// status words back to pinned memory (enqueued here, after the run),
    /// and the check turns a bad index into the error the CPU backend
    /// gives once the run's completion has fired. `None` for a plan
    /// without checks.
    fn status_check(&self, stream: &CudaStream) -> Result<Option<crate::runtime::completion::Check>> {
        if self.program.checks.is_empty() {
            return Ok(None);
        }
        let checks = self.program.checks.clone();
        let words = (self.program.params_bytes / 8) as usize;
        let check = self.status.copy_back(&self.dev, stream, self.params.ptr(), words, move |block| {
            for c in &checks {
                let at = (c.status / 8) as usize;
                if block.get(at).is_some_and(|&p| p != u64::MAX) {
                    let value = block.get(at + 1).copied().unwrap_or(0) as i64;
                    return Err(Error::Runtime(format!(
                        "{} index {value} is out of range for dim {} of size {} (node {})",
                        c.op, c.dim, c.size, c.node
                    )));
                }
            }
            Ok(())
        })?;
        Ok(Some(check))
    }
}

impl Executable for CudaExecutable {
    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
        let launched = self.launch(inputs, rng)?;
        launched.done.wait()?;
        Ok(launched.outputs)
    }

    fn launch(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Launched> {
        // The caller keeps its references: an input written over is copied.
        self.launch_owned(inputs.to_vec(), rng)
    }

    fn donated(&self) -> &[u32] {
        &self.program.donated
    }

    fn launch_owned(&self, inputs: Vec<Buffer>, rng: &RngArgs) -> Result<Launched> {
        let inputs = &inputs[..];
        let Some(comm) = &self.comm else { return self.launch_plain(inputs, rng) };
        // A run with collectives: never on a broken group, and a failure
        // to launch breaks it (`group.rs`).
        super::group::refuse_if_broken(comm)?;
        self.launch_plain(inputs, rng).inspect_err(|e| {
            super::group::rank_failed(comm, &self.label(), "to launch a run with collectives", e)
        })
    }

    fn take_profile(&self, _run_start: std::time::Instant) -> Option<crate::profile::RunTimes> {
        self.profile.as_ref()?.take()
    }
}

impl CudaExecutable {
    /// How group errors name this rank's device.
    fn label(&self) -> String {
        format!("cuda:{}", self.dev.ctx.ordinal())
    }

    fn launch_plain(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Launched> {
        let _run = tracing::debug_span!("run", backend = "cuda", steps = self.program.steps.len()).entered();
        if rng.streams.len() < self.program.random_streams {
            return Err(bad(format!(
                "the plan reads {} random stream(s), {} given",
                self.program.random_streams,
                rng.streams.len()
            )));
        }
        let ins = self.check_inputs(inputs)?;
        // One run of this plan at a time: its arena, scratch and parameter
        // block are shared by its runs (runs of other plans go on). Runs
        // of one plan are ordered on stream 0, so the next run's parameter
        // copy lands after this run has read them, and after this run's
        // status was copied back.
        let mut graphs = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let ls = self.dev.launch()?;
        // Inputs uploaded on the copy stream: stream 0 waits on the device
        // for copies still running (`copy.rs`); the host never does.
        for b in &ins {
            b.alloc.order_after_upload(&ls.streams[0])?;
        }
        self.write_params(&ls, rng)?;
        let (outs, over) = match graphs.replay(self, &ls, &ins)? {
            Some(replayed) => (replayed.outs, replayed.over),
            None => {
                let outs = self.fresh_outs()?;
                let over = self.eager_over(&ls, &ins)?;
                let inputs = ins
                    .iter()
                    .zip(&over)
                    .map(|(b, o)| o.as_ref().map_or_else(|| b.ptr(), |a| a.ptr()))
                    .collect();
                let b = self.bindings(inputs, outs.iter().map(|a| a.ptr()).collect());
                // NCCL's first calls connect to the other ranks on this
                // thread: a rank that never comes must not hang it.
                let _watch = self.comm.as_ref().map(|c| super::group::EnqueueWatch::start(c, &self.label()));
                self.enqueue(&ls, &ls.streams, &b)?;
                graphs.ran_eagerly();
                (outs, over)
            }
        };
        let check = self.status_check(&ls.streams[0])?;
        let read = ins.iter().map(|b| b.ready.clone());
        let done = match &self.comm {
            Some(comm) => {
                let label = self.label();
                super::completion::record_watched(&self.dev, &ls.streams[0], check, read, comm, label)?
            }
            None => super::completion::record(&self.dev, &ls.streams[0], check, read)?,
        };
        drop(ls);
        drop(graphs);
        self.dev.stats.nodes_executed.fetch_add(self.program.steps.len() as u64, Ordering::Relaxed);
        self.dev.stats.launches.fetch_add(self.launches, Ordering::Relaxed);
        self.dev.stats.grouped_nodes.fetch_add(self.program.grouped, Ordering::Relaxed);
        let outputs = self.outputs(&ins, &outs, &over, &done)?;
        Ok(Launched { outputs, done })
    }
}
