//! What a context lets people see of its compiles and runs: reports
//! (`KILN_REPORT`, [`Context::report`]), the profiler
//! ([`Context::with_profiling`], [`Context::profile`], `KILN_TRACE`) and
//! recompile explanations (`Stats::recompiles`, `KILN_LOG=recompiles`)
//! and where each compile's time went (`KILN_LOG=compiles`).
//!
//! All of it lives in one [`Observe`] in the context's state, filled from
//! the environment when the context is made. A read that hits the cache
//! touches none of it unless profiling is on; a miss prints the extracted
//! graph once (the recompile signature) and, with `KILN_REPORT`, traces
//! the pipeline.

use super::key::PlanKey;
use super::recompile::{self, Recompile, Signature};
use super::{Context, State};
use crate::ir::{Graph, Plan};
use crate::passes::{self, PassRecord, PipelineConfig};
use crate::profile::{Profile, RunProfile, RunTimes};
use crate::report::{KernelTarget, Report};
use crate::{Location, Result};
use std::path::PathBuf;
use std::time::Duration;

/// What a compile did with kernels (growth of the device's counters).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KernelWork {
    pub compiled: u64,
    pub compile_time: Duration,
    pub from_disk: u64,
    pub in_memory: u64,
}

impl KernelWork {
    /// The device's counters now.
    pub(crate) fn now(stats: &crate::backends::DeviceStats) -> KernelWork {
        use std::sync::atomic::Ordering::Relaxed;
        KernelWork {
            compiled: stats.kernel_compiles.load(Relaxed),
            compile_time: Duration::from_nanos(stats.kernel_compile_nanos.load(Relaxed)),
            from_disk: stats.kernel_disk_hits.load(Relaxed),
            in_memory: stats.kernel_memory_hits.load(Relaxed),
        }
    }

    /// What happened between `before` and `self`.
    pub(crate) fn since(self, before: KernelWork) -> KernelWork {
        KernelWork {
            compiled: self.compiled.saturating_sub(before.compiled),
            compile_time: self.compile_time.saturating_sub(before.compile_time),
            from_disk: self.from_disk.saturating_sub(before.from_disk),
            in_memory: self.in_memory.saturating_sub(before.in_memory),
        }
    }
}

/// Profiled runs a context keeps (older ones are dropped, so a long
/// profiled loop does not grow without bound).
const KEEP_RUNS: usize = 10_000;

/// See the module docs.
#[derive(Default)]
pub(crate) struct Observe {
    /// `KILN_REPORT`: write a report per compile here.
    report_dir: Option<PathBuf>,
    /// `KILN_TRACE`: write the Chrome trace here when the context goes.
    trace: Option<PathBuf>,
    /// `KILN_LOG=recompiles`: print each explanation to stderr.
    log_recompiles: bool,
    /// `KILN_LOG=compiles`: print each compile's phases to stderr.
    log_compiles: bool,
    profile: Profile,
    signatures: Vec<Signature>,
    pub(crate) recompiles: Vec<Recompile>,
    /// Reports written before their plan's first profiled run, by plan
    /// fingerprint: rewritten with the times after it.
    pending: Vec<(u64, PathBuf, Report)>,
}

impl Observe {
    /// From `KILN_REPORT`, `KILN_TRACE` and `KILN_LOG` (a comma-separated
    /// list of topics: `recompiles`, `compiles`).
    pub(crate) fn from_env() -> Observe {
        let path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let log = std::env::var("KILN_LOG").unwrap_or_default();
        Observe {
            report_dir: path("KILN_REPORT"),
            trace: path("KILN_TRACE"),
            log_recompiles: log.split(',').any(|t| t.trim() == "recompiles"),
            log_compiles: log.split(',').any(|t| t.trim() == "compiles"),
            profile: Profile::default(),
            signatures: Vec::new(),
            recompiles: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Whether runs should be profiled from the start: `KILN_TRACE`, and
    /// `KILN_REPORT` (so its pages carry the times; a diagnostic run, and
    /// `with_profiling(false)` turns it off).
    pub(crate) fn wants_profiling(&self) -> bool {
        self.trace.is_some() || self.report_dir.is_some()
    }

    /// On a cache miss: explains it against an earlier compile of the same
    /// structure, if any, and keeps this compile's signature.
    pub(crate) fn on_miss(&mut self, key: &PlanKey, graph: &Graph) {
        let now = Signature::new(key, graph);
        if let Some(why) = self.signatures.iter().rev().find_map(|before| recompile::explain(before, &now)) {
            tracing::info!(target: "kiln::recompile", cause = ?why.cause, node = ?why.node, "{}", why.message);
            if self.log_recompiles {
                // The user asked for these lines on stderr (KILN_LOG=recompiles).
                eprintln!("kiln: {}", why.message);
            }
            if self.recompiles.len() == recompile::KEEP {
                self.recompiles.remove(0);
            }
            self.recompiles.push(why);
        }
        if self.signatures.len() == recompile::KEEP {
            self.signatures.remove(0);
        }
        self.signatures.push(now);
    }

    /// After a compile: where its time went, as a `tracing` event and,
    /// with `KILN_LOG=compiles`, a line on stderr. `kernels` is the
    /// device's kernel counters' growth over the compile.
    pub(crate) fn on_compiled(
        &self,
        nodes: usize,
        optimize: Duration,
        backend: Duration,
        kernels: KernelWork,
    ) {
        let mut line = format!(
            "compiled a plan of {nodes} nodes in {:.1} ms: passes {:.1} ms, backend {:.1} ms",
            (optimize + backend).as_secs_f64() * 1e3,
            optimize.as_secs_f64() * 1e3,
            backend.as_secs_f64() * 1e3,
        );
        if kernels.compiled + kernels.from_disk + kernels.in_memory > 0 {
            line += &format!(
                " ({} kernels compiled in {:.1} ms, {} from the disk cache, {} already loaded)",
                kernels.compiled,
                kernels.compile_time.as_secs_f64() * 1e3,
                kernels.from_disk,
                kernels.in_memory
            );
        }
        tracing::debug!(target: "kiln::compile", "{line}");
        if self.log_compiles {
            // The user asked for these lines on stderr (KILN_LOG=compiles).
            eprintln!("kiln: {line}");
        }
    }

    /// Runs the pipeline, traced when a report will be written.
    pub(crate) fn optimize(
        &self,
        graph: Graph,
        config: &PipelineConfig,
        stable: &[bool],
    ) -> Result<(passes::Optimized, Option<Vec<PassRecord>>)> {
        passes::optimize_plan(graph, config, stable, self.report_dir.is_some())
    }

    /// Keeps a profiled run; rewrites a report waiting for its times.
    fn add_run(&mut self, times: RunTimes, wall: Duration, device: &str) {
        if self.profile.runs.len() == KEEP_RUNS {
            self.profile.runs.remove(0);
        }
        let plan = times.plan;
        self.profile.runs.push(RunProfile {
            plan,
            device: device.to_string(),
            wall_us: wall.as_secs_f64() * 1e6,
            nodes: times.nodes,
            note: times.note,
        });
        if let Some(k) = self.pending.iter().position(|p| p.0 == plan) {
            let (_, path, report) = self.pending.swap_remove(k);
            if let Err(e) = report.with_profile(&self.profile).write_html(&path) {
                tracing::warn!(error = %e, "KILN_REPORT: could not rewrite the report with its times");
            }
        }
    }
}

impl Drop for Observe {
    /// Writes the `KILN_TRACE` file, if one was asked for and anything ran.
    fn drop(&mut self) {
        if let Some(path) = &self.trace {
            if !self.profile.runs.is_empty() {
                if let Err(e) = self.profile.write_chrome_trace(path) {
                    tracing::warn!(error = %e, "KILN_TRACE: could not write the trace");
                }
            }
        }
    }
}

impl Context {
    /// Times every node of every run from now on (plans are compiled
    /// again with a recorder; see [`crate::profile`]); [`Context::profile`]
    /// returns the times. On CUDA, profiled runs are launched eagerly,
    /// never captured into CUDA graphs. `KILN_TRACE=<file>` turns it on
    /// and writes a Chrome trace when the context is dropped.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu().with_profiling(true);
    /// let x = ctx.randn([64, 64]);
    /// x.matmul(&x).relu().sum_all().item::<f32>()?;
    /// let p = ctx.profile();
    /// assert_eq!(p.runs.len(), 1);
    /// println!("{p}"); // by region, by op, by node, with the run's total
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn with_profiling(self, on: bool) -> Context {
        self.state().compile.profile = on;
        self
    }

    /// The profiled runs so far (empty unless profiling is on).
    pub fn profile(&self) -> Profile {
        self.state().observe.profile.clone()
    }

    /// Forgets the profiled runs so far.
    pub fn reset_profile(&self) {
        self.state().observe.profile.runs.clear();
    }

    /// The report of the graph that computes `tensors` (what a read of them
    /// would compile): every pass, the plan, the kernels of this context's
    /// backend, its variables, and the times of earlier profiled runs of
    /// that plan. Compiles nothing for the backend.
    ///
    /// ```no_run
    /// use kiln::prelude::*;
    /// let ctx = Context::cpu();
    /// let y = (ctx.randn([8, 8]) * 2.0).exp().sum_all();
    /// ctx.report(&[&y])?.write_html("report.html")?;
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn report(&self, tensors: &[&crate::Tensor]) -> Result<Report> {
        let location = Location::caller();
        let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
        let (extracted, config) = {
            let state = self.state();
            let targets = super::realize::with_pending_targets(&state, &targets);
            let mut config = state.config.clone()?;
            config.options = state.options;
            (super::realize::extract(&state.graph, &targets), config)
        };
        let (graph, records) = passes::optimize_traced(extracted, &config)?;
        let plan = Plan::new(graph);
        let state = self.state();
        self.describe_report(&state, Report::from_records(&records), &plan)
    }

    /// Device, kernels, variables and times for a report of `plan`.
    fn describe_report(&self, state: &State, report: Report, plan: &Plan) -> Result<Report> {
        let backend = self.inner.backend.name();
        let target = if backend.starts_with("cuda") {
            KernelTarget::Cuda {
                tf32: state.compile.tf32,
                hopper: self.inner.backend.hopper(),
                sms: self.inner.backend.multiprocessors(),
            }
        } else {
            KernelTarget::Cpu
        };
        let mut report = report
            .with_device(self.inner.backend.describe())
            .with_kernels(plan, target)?
            .with_persistent(state.workspace_info().variables)
            .with_profile(&state.observe.profile);
        if backend.starts_with("cuda") && state.compile.profile {
            report = report.with_note("profiled runs are launched eagerly, not captured into CUDA graphs");
        }
        Ok(report)
    }

    /// After a compile with `KILN_REPORT`: writes `<dir>/<hash>.html` (and
    /// keeps it to rewrite with times when profiling is on). A report that
    /// cannot be written is a warning, never a failed read.
    pub(crate) fn report_compile(&self, state: &mut State, records: &[PassRecord], plan: &Plan) {
        let Some(dir) = state.observe.report_dir.clone() else { return };
        let hash = records.first().map_or(0, |r| passes::fnv1a(crate::ir::text::print(&r.graph).as_bytes()));
        let path = dir.join(format!("{hash:016x}.html"));
        let written = std::fs::create_dir_all(&dir)
            .map_err(|e| crate::Error::Io(format!("cannot create {}: {e}", dir.display())))
            .and_then(|()| self.describe_report(state, Report::from_records(records), plan))
            .and_then(|report| {
                report.write_html(&path)?;
                Ok(report)
            });
        match written {
            Ok(report) => {
                tracing::info!(path = %path.display(), "KILN_REPORT: wrote a report");
                if state.compile.profile {
                    state.observe.pending.push((crate::profile::fingerprint(&plan.graph), path, report));
                }
            }
            Err(e) => tracing::warn!(error = %e, "KILN_REPORT: could not write a report"),
        }
    }

    /// After a profiled run: collects its node times.
    pub(crate) fn observe_run(&self, state: &mut State, times: Option<RunTimes>, wall: Duration) {
        if let Some(times) = times {
            state.observe.add_run(times, wall, self.inner.backend.name());
        }
    }
}
