//! Reading values: walk the subgraph the reads need, find its plan in the
//! cache (or extract and compile it), run it, and turn the read nodes into
//! buffers.
//!
//! # The host path
//!
//! A cached read costs one walk over the nodes it needs (the walk also
//! writes the cache key, see [`super::key`]), one map lookup, binding the
//! input buffers, the run, and collecting dead nodes. Nothing is printed
//! and no graph is copied unless the plan must be compiled.
//!
//! # Locking
//!
//! The context's lock is held to walk, look up or compile, and bind; it is
//! released while the plan is launched and waited for (so neither the CPU's
//! work nor a device's holds it), then taken again to store the results.
//! So other threads record, read and run their own plans while one runs
//! (two reads of one context overlap; a test shows it). Read targets are
//! nodes of live tensors, which collection never removes; the pending
//! variable values and gradients a read also computes are pinned
//! (`State::in_flight`) until it stores them. If another thread realized a
//! target meanwhile, its buffer stays and ours is only returned.

use super::key::{extract_walked, KeyHash, PlanKey, Walker};
use super::observe::KernelWork;
use super::{Context, State};
use crate::backends::prologue::WithPrologue;
use crate::backends::{Buffer, Executable, Launched, RngArgs};
use crate::ir::{self, BufferId, Graph, NodeId, Op, Plan};
use crate::{passes, Location, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Compiled plans by the exact structure of the graph they were compiled
/// from and the pass settings ([`PlanKey`]): ops, shapes, dtypes,
/// constants and regions, but no buffer identities or random stream
/// numbers, so the same computation on new data hits.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: HashMap<PlanKey, Arc<dyn Executable>, KeyHash>,
    walker: Walker,
}

impl PlanCache {
    /// Plans held.
    pub(crate) fn len(&self) -> usize {
        self.plans.len()
    }
}

/// Copies what `targets` need out of the recording graph. The walk is the
/// graph's structural order, so a loop that records the same computation
/// each iteration extracts the same graph each time.
pub(crate) fn extract(graph: &Graph, targets: &[NodeId]) -> Graph {
    let w = Walker::default().walk(graph, targets);
    extract_walked(graph, targets, &w.order, &w.inputs, &w.streams)
}

/// Per input slot of a plan (its buffers, `inputs`), whether it holds a
/// variable's current value: what the `weight-prologue` pass may keep
/// work of. A variable with an assignment pending does not count (its
/// current value is the pending node, and the run it is read by makes its
/// new bytes), nor does any other buffer (a batch, a gradient). The plan
/// cache's key does not hold this: a plan compiled for one set of stable
/// slots and run with others stays correct, since its prologue runs
/// whenever the bytes it reads change (`backends/prologue.rs`).
fn stable_inputs(state: &State, inputs: &[BufferId]) -> Vec<bool> {
    let current: std::collections::HashSet<BufferId> = state
        .ws
        .vars
        .iter()
        .filter(|v| state.graph.contains(v.value))
        .filter_map(|v| match state.graph.node(v.value).op {
            Op::Buffer(b) => Some(b),
            _ => None,
        })
        .collect();
    inputs.iter().map(|b| current.contains(b)).collect()
}

/// A plan bound to its inputs, ready to run without the lock.
pub(crate) struct Job {
    pub(crate) executable: Arc<dyn Executable>,
    pub(crate) inputs: Vec<Buffer>,
    /// The context's buffer of each input slot.
    pub(crate) input_ids: Vec<BufferId>,
    pub(crate) rng: RngArgs,
    /// Compiled with profiling: collect its node times after the run.
    pub(crate) profiled: bool,
    /// The input slots given up for the run to write over (see
    /// `donate.rs`): once launched, the run holds `inputs` and the job
    /// only `kept`, the other slots' buffers.
    pub(crate) given: Vec<u32>,
    pub(crate) kept: Vec<Option<Buffer>>,
}

impl Job {
    /// The buffer bound to input slot `k`, unless it was given to the run.
    pub(crate) fn bound(&self, k: usize) -> Option<&Buffer> {
        if self.given.is_empty() {
            self.inputs.get(k)
        } else if self.given.contains(&(k as u32)) {
            None
        } else {
            self.inputs.get(k).or_else(|| self.kept.get(k).and_then(Option::as_ref))
        }
    }
}

/// What one realize ran, for a captured step to replay it: the bound
/// plan (`None` when every target was already a buffer), every target
/// (the reads, then the pending values), and all their buffers.
pub(crate) struct Traced {
    pub(crate) job: Option<Job>,
    pub(crate) targets: Vec<NodeId>,
    pub(crate) buffers: Vec<Buffer>,
}

/// What a read computes: the nodes read, then the pending variable values
/// and gradients (assignments recorded before a read run in its plan).
struct Targets {
    /// The reads first, in order.
    all: Vec<NodeId>,
}

/// `targets` and the pending variable values and gradients a read of them
/// also computes (what [`Context::report`] shows).
pub(crate) fn with_pending_targets(state: &State, targets: &[NodeId]) -> Vec<NodeId> {
    with_pending(state, targets).all
}

fn with_pending(state: &State, targets: &[NodeId]) -> Targets {
    let mut all = targets.to_vec();
    for id in state.ws.pending(&state.graph) {
        if !all.contains(&id) {
            all.push(id);
        }
    }
    Targets { all }
}

impl Context {
    /// Computes the given nodes, and every pending variable value and
    /// gradient in the same plan, and makes each a buffer node. Returns
    /// the targets' buffers, in order. The targets must be nodes of live
    /// tensors.
    #[track_caller]
    pub(crate) fn realize_nodes(&self, targets: &[NodeId]) -> Result<Vec<Buffer>> {
        let read = targets.len();
        let mut traced = self.realize_traced(targets, &|_| true)?;
        traced.buffers.truncate(read);
        Ok(traced.buffers)
    }

    /// [`Context::realize_nodes`], returning every target's buffer and the
    /// bound plan that ran.
    #[track_caller]
    /// `give` says which input buffers the run may be given to write over
    /// (see `donate.rs`): a captured step's recording gives only its
    /// variables, since any other buffer becomes a constant of the step
    /// that every replay must read unchanged.
    pub(crate) fn realize_traced(
        &self,
        targets: &[NodeId],
        give: &dyn Fn(BufferId) -> bool,
    ) -> Result<Traced> {
        let location = Location::caller();
        let (mut job, targets) = {
            let mut state = self.state();
            state.check_not_capturing(location)?;
            let targets = with_pending(&state, targets);
            match self.prepare(&mut state, &targets.all, give)? {
                Ok(job) => {
                    // Pinned until the results are stored: a pending node no
                    // tensor holds must not be collected (and its id reused)
                    // while the plan runs.
                    state.in_flight.extend_from_slice(&targets.all);
                    (job, targets)
                }
                Err(ready) => {
                    state.collect();
                    return Ok(Traced { job: None, targets: targets.all, buffers: ready });
                }
            }
        };
        // Launched without the lock: the inputs are bound buffers, and an
        // executable orders its own runs, so nothing here needs the
        // context (see the module docs). Not waited for: the outputs carry
        // the run's completion, and host reads wait for it.
        let launched = self.launch_job(&mut job);
        let outputs = launched.map(|l| l.outputs);
        let mut state = self.state();
        for id in &targets.all {
            if let Some(k) = state.in_flight.iter().position(|p| p == id) {
                state.in_flight.swap_remove(k);
            }
        }
        let outputs = match outputs {
            Ok(outputs) => outputs,
            Err(e) => {
                // The buffers given to the run went with it: a pending value
                // that reads one (an assignment, retried by the next read)
                // reports this error again, not a freed buffer.
                for &k in &job.given {
                    if let Some(&id) = job.input_ids.get(k as usize) {
                        state.lost.insert(id, e.clone());
                    }
                }
                state.collect();
                return Err(e);
            }
        };
        for (&target, buffer) in targets.all.iter().zip(&outputs) {
            if !state.graph.contains(target) || matches!(state.graph.node(target).op, Op::Buffer(_)) {
                continue;
            }
            let id = state.add_buffer(buffer.clone());
            state.graph.node_mut(target).op = Op::Buffer(id);
            state.graph.set_operands(target, &[]);
        }
        state.collect();
        Ok(Traced { job: Some(job), targets: targets.all, buffers: outputs })
    }

    /// Launches a bound plan once fewer than the context's limit of runs
    /// are in flight (waiting for the oldest otherwise), and keeps its
    /// completion among them. Call without the lock.
    ///
    /// The oldest run is taken out under the lock and waited for without
    /// it: other threads record, upload and launch meanwhile (a `while
    /// let` on `self.state()` would hold the guard through the loop body,
    /// so the wait held the lock, and noting an error deadlocked on it).
    /// With several threads launching at once each waits for one run, so
    /// the limit may be passed by a run per thread for a moment.
    pub(crate) fn launch_job(&self, job: &mut Job) -> Result<Launched> {
        loop {
            let oldest = self.state().runs.over_limit();
            let Some(oldest) = oldest else { break };
            // Its error stays with the buffers it wrote (reads report it)
            // and is kept for the next `sync`.
            if let Err(e) = oldest.wait() {
                self.state().runs.note(e);
            }
        }
        let _span = tracing::debug_span!("launch", backend = self.inner.backend.name()).entered();
        let started = job.profiled.then(std::time::Instant::now);
        // Inputs given up go to the run alone (see `donate.rs`); the job
        // keeps clones of the others.
        let inputs = if job.given.is_empty() {
            job.inputs.clone()
        } else {
            let run = std::mem::take(&mut job.inputs);
            job.kept = run
                .iter()
                .enumerate()
                .map(|(k, b)| (!job.given.contains(&(k as u32))).then(|| b.clone()))
                .collect();
            run
        };
        let launched = job.executable.launch_owned(inputs, &job.rng)?;
        self.state().runs.push(launched.done.clone());
        if let Some(start) = started {
            // A profiled run is waited for: its times are read once it has
            // finished. Its error, if any, stays with its buffers and the
            // next `sync`.
            let _ = launched.done.wait();
            let times = job.executable.take_profile(start);
            self.observe_run(&mut self.state(), times, start.elapsed());
        }
        Ok(launched)
    }

    /// Under the lock: the buffers of already realized targets
    /// (`Ok(Err(..))`), or the plan (from the cache or compiled now) bound
    /// to its inputs.
    /// Inputs `give` accepts and nothing else reads are given up to the run
    /// (moved out of the context, see `donate.rs`): pass `|_| false` when
    /// the job will not be launched.
    pub(super) fn prepare(
        &self,
        state: &mut State,
        targets: &[NodeId],
        give: &dyn Fn(BufferId) -> bool,
    ) -> Result<std::result::Result<Job, Vec<Buffer>>> {
        // Already realized targets need no plan.
        if let Some(ready) = targets
            .iter()
            .map(|&t| match state.graph.node(t).op {
                Op::Buffer(b) => state.buffers.get(&b).cloned(),
                _ => None,
            })
            .collect::<Option<Vec<Buffer>>>()
        {
            return Ok(Err(ready));
        }
        let walk = state.cache.walker.walk(&state.graph, targets);
        let passes = state.config.as_ref().map(|c| c.enabled_text()).unwrap_or_default();
        let key = PlanKey {
            passes,
            options: state.options,
            compile: state.compile,
            hash: walk.hash,
            words: walk.words,
        };
        let executable = match state.cache.plans.get(&key) {
            Some(exe) => {
                state.cache_hits += 1;
                exe.clone()
            }
            None => {
                let extracted =
                    extract_walked(&state.graph, targets, &walk.order, &walk.inputs, &walk.streams);
                let _span = tracing::debug_span!("compile", nodes = extracted.len()).entered();
                let mut config = state.config.clone()?;
                config.options = state.options;
                state.observe.on_miss(&key, &extracted);
                let started = std::time::Instant::now();
                let stable = stable_inputs(state, &walk.inputs);
                let (optimized, records) = state.observe.optimize(extracted, &config, &stable)?;
                let kept = optimized.prologue.as_ref().map_or(0, |p| p.graph.outputs().len());
                let plan = Arc::new(Plan::new(optimized.graph).binding(walk.inputs.len() + kept));
                let optimized_at = std::time::Instant::now();
                let kernels_before = KernelWork::now(&self.inner.backend.stats());
                let exe = self.inner.backend.compile_with(plan.clone(), &state.compile)?;
                let exe: Arc<dyn Executable> = match optimized.prologue {
                    Some(prologue) => {
                        let inputs = prologue.reads.len();
                        let first = Arc::new(Plan::new(prologue.graph).binding(inputs));
                        Arc::new(WithPrologue::new(
                            self.inner.backend.compile_with(first, &state.compile)?,
                            exe,
                            prologue.reads,
                            walk.inputs.len(),
                            self.inner.backend.stats(),
                        ))
                    }
                    None => exe,
                };
                let (optimize, backend) = (optimized_at - started, optimized_at.elapsed());
                state.compile_times.note(optimize, backend);
                let kernels = KernelWork::now(&self.inner.backend.stats()).since(kernels_before);
                state.observe.on_compiled(plan.graph.len(), optimize, backend, kernels);
                if let Some(records) = records {
                    self.report_compile(state, &records, &plan);
                }
                state.compiles += 1;
                state.cache.plans.insert(key.clone(), exe.clone());
                exe
            }
        };
        let input_ids = walk.inputs.clone();
        let mut inputs: Vec<Buffer> = walk
            .inputs
            .iter()
            .map(|b| {
                state.buffers.get(b).cloned().ok_or_else(|| match state.lost.get(b) {
                    Some(e) => e.clone(),
                    None => crate::Error::Backend(format!("buffer {} was freed while still read", b.0)),
                })
            })
            .collect::<Result<_>>()?;
        let mut given = state.givable(targets, &input_ids, executable.donated());
        given.retain(|&k| input_ids.get(k as usize).is_some_and(|&b| give(b)));
        state.give_up(&input_ids, &given, &mut inputs);
        state.cache.walker.recycle(walk.order, key.words);
        let rng = RngArgs { seed: state.seed, streams: walk.streams };
        let profiled = state.compile.profile;
        Ok(Ok(Job { executable, inputs, input_ids, rng, profiled, given, kept: Vec::new() }))
    }

    /// The optimized graph the given tensors would compile to (what
    /// [`Context::explain`] prints). Compiles nothing for the backend and
    /// leaves the cache alone. Where the `weight-prologue` pass moved work
    /// on variables alone out of the plan, the graph reads those kept
    /// values as inputs after the realized buffers' (`explain` prints the
    /// prologue too).
    #[track_caller]
    pub fn optimized_graph(&self, tensors: &[&crate::Tensor]) -> Result<Graph> {
        Ok(self.optimized_at(tensors, Location::caller())?.graph)
    }

    fn optimized_at(&self, tensors: &[&crate::Tensor], location: Location) -> Result<passes::Optimized> {
        let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
        let (extracted, config, stable) = {
            let state = self.state();
            let targets = with_pending(&state, &targets).all;
            let walk = Walker::default().walk(&state.graph, &targets);
            (
                extract_walked(&state.graph, &targets, &walk.order, &walk.inputs, &walk.streams),
                state.config.clone().map(|mut c| {
                    c.options = state.options;
                    c
                }),
                stable_inputs(&state, &walk.inputs),
            )
        };
        let config = config?;
        Ok(passes::optimize_plan(extracted, &config, &stable, false)?.0)
    }

    /// The optimized text IR of the graph that computes `tensors`: one line
    /// per node, `%id: dtype[shape] = op operands attributes @region`, then
    /// `return`. Realized values appear as `input k`. Pending assignments
    /// (and held gradients) are part of the graph a read would run, so
    /// they follow the tensors in the `return` line. Work on variables
    /// alone that the plan keeps between calls (`weight-prologue`) follows
    /// under a `;; prologue` line: its inputs are the plan's inputs it
    /// names, and its outputs the plan's inputs from the one it names on.
    #[track_caller]
    pub fn explain(&self, tensors: &[&crate::Tensor]) -> Result<String> {
        let optimized = self.optimized_at(tensors, Location::caller())?;
        let mut text = ir::text::print(&optimized.graph);
        if let Some(p) = &optimized.prologue {
            let reads: Vec<String> = p.reads.iter().map(|k| k.to_string()).collect();
            text.push_str(&format!(
                ";; prologue (run when a variable it reads changes): reads inputs {}; returns inputs {}..\n",
                reads.join(", "),
                p.kept_from
            ));
            text.push_str(&ir::text::print(&p.graph));
        }
        Ok(text)
    }

    /// Drops every compiled plan this context holds, and with them their
    /// arenas (the device memory of their intermediate values) and, on
    /// CUDA, their captured graphs: a one-off computation (a model's
    /// random initializer, a conversion of its weights) need not keep its
    /// memory for the rest of the process. Realized tensors, variables
    /// and captured steps ([`Context::capture`], which hold their own
    /// plans) are untouched; a later read of a dropped plan's graph
    /// compiles it again.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let w = ctx.variable("w", ctx.randn([256, 256]) * 0.02)?;
    /// ctx.sync()?; // the initializer's plan runs, and stays cached
    /// assert_eq!(ctx.stats().cached_plans, 1);
    /// ctx.clear_plans();
    /// assert_eq!(ctx.stats().cached_plans, 0);
    /// assert_eq!(w.shape(), &[256, 256]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn clear_plans(&self) {
        let _span = tracing::info_span!("Context::clear_plans").entered();
        self.state().cache.plans.clear();
    }

    /// Computes several tensors in one plan (sharing their common work) and
    /// keeps their values, so later reads and ops start from them.
    #[track_caller]
    pub fn realize(&self, tensors: &[&crate::Tensor]) -> Result<()> {
        let location = Location::caller();
        let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
        self.realize_nodes(&targets).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    /// The extracted graph of reading `t`, and the context streams it reads.
    fn extract_of(ctx: &Context, t: &crate::Tensor) -> (Graph, Vec<u64>) {
        let id = t.node_in(ctx, crate::Location::caller()).expect("live tensor");
        let graph = &ctx.state().graph;
        let w = Walker::default().walk(graph, &[id]);
        (extract(graph, &[id]), w.streams)
    }

    #[test]
    fn extraction_renumbers_random_streams_so_iterations_share_a_plan() {
        let ctx = Context::cpu();
        let first = ctx.randn([3]) + ctx.randn([3]);
        let second = ctx.randn([3]) + ctx.randn([3]);
        let (a, b) = (extract_of(&ctx, &first), extract_of(&ctx, &second));
        assert_eq!(ir::text::print(&a.0), ir::text::print(&b.0));
        assert_eq!((a.1, b.1), (vec![0, 1], vec![2, 3]));
    }

    #[test]
    fn extraction_keeps_different_constants_apart() {
        let ctx = Context::cpu();
        let x = ctx.randn([3]);
        let (a, b) = (extract_of(&ctx, &(&x * 2.0)), extract_of(&ctx, &(&x * 3.0)));
        assert_ne!(ir::text::print(&a.0), ir::text::print(&b.0));
    }

    #[test]
    fn context_and_tensor_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Context>();
        send_sync::<crate::Tensor>();
    }
}

/// A backend whose runs wait for each other: the test of the lock release.
#[cfg(test)]
mod overlap {
    use crate::backends::cpu::CpuBackend;
    use crate::backends::{Backend, Buffer, DeviceStats, Executable, RngArgs};
    use crate::ir::{HostData, Plan, Shape};
    use crate::{Context, Result};
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    /// Runs in progress now, and the most at once.
    #[derive(Default)]
    struct Meeting {
        state: Mutex<(usize, usize)>,
        cv: Condvar,
    }

    /// The CPU backend, but every run waits (up to 10 s) until another run
    /// is in progress too.
    struct Rendezvous {
        cpu: CpuBackend,
        meeting: Arc<Meeting>,
    }

    struct Gate {
        inner: Arc<dyn Executable>,
        meeting: Arc<Meeting>,
    }

    impl Backend for Rendezvous {
        fn name(&self) -> &'static str {
            "rendezvous"
        }
        fn reshape_epilogues(&self) -> bool {
            self.cpu.reshape_epilogues()
        }
        fn merge_matmuls(&self) -> bool {
            self.cpu.merge_matmuls()
        }
        fn upload(&self, data: HostData, shape: &Shape) -> Result<Buffer> {
            self.cpu.upload(data, shape)
        }
        fn download(&self, buffer: &Buffer) -> Result<HostData> {
            self.cpu.download(buffer)
        }
        fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>> {
            Ok(Arc::new(Gate { inner: self.cpu.compile(plan)?, meeting: self.meeting.clone() }))
        }
        fn stats(&self) -> Arc<DeviceStats> {
            self.cpu.stats()
        }
    }

    impl Executable for Gate {
        fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
            let m = &self.meeting;
            let mut s = m.state.lock().unwrap();
            s.0 += 1;
            s.1 = s.1.max(s.0);
            m.cv.notify_all();
            let (mut s, _) = m.cv.wait_timeout_while(s, Duration::from_secs(10), |s| s.1 < 2).unwrap();
            s.0 -= 1;
            drop(s);
            self.inner.run(inputs, rng)
        }
    }

    /// Two threads read two different results of one context: each run
    /// waits until the other has started, which it can only do if the
    /// first does not hold the context's lock while it runs.
    #[test]
    fn two_reads_of_one_context_run_their_plans_at_once() {
        let meeting = Arc::new(Meeting::default());
        let backend = Rendezvous { cpu: CpuBackend::new(), meeting: meeting.clone() };
        let ctx = Context::with_backend(Box::new(backend));
        let x = ctx.tensor(&[1.0f32, 2.0, 3.0], [3]);
        let (a, b) = (&x * 2.0, x.exp().sum_all());
        let (va, vb) = std::thread::scope(|s| {
            let ta = s.spawn(|| a.to_vec::<f32>());
            let tb = s.spawn(|| b.item::<f32>());
            (ta.join().unwrap(), tb.join().unwrap())
        });
        assert_eq!(va.unwrap(), vec![2.0, 4.0, 6.0]);
        let want = 1f32.exp() + 2f32.exp() + 3f32.exp();
        assert!((vb.unwrap() - want).abs() < 1e-5 * want);
        assert_eq!(meeting.state.lock().unwrap().1, 2, "the two plans never ran at the same time");
        assert_eq!(ctx.stats().compiles, 2);
    }
}
