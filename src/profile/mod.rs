//! The profiler: the time of every node of every run, by node, op kind and
//! region (scope), and a Chrome trace of the runs.
//!
//! `Context::with_profiling(true)` (or `KILN_TRACE=<file>`) compiles plans
//! with a [`Recorder`]: the CPU backend reads the clock around every step
//! (wall time, on the stream's thread); the CUDA backend records events
//! around every step's launches and runs profiled plans eagerly, never
//! captured into a CUDA graph (a captured graph has no per-launch events),
//! and each run says so in its note. The context then collects each run's
//! node times with its wall time ([`RunProfile`]); `Context::profile`
//! returns them as a [`Profile`], whose `Display` is the table.
//!
//! Profiling is part of a plan's compile options, so a plan compiled
//! without it has no recorder at all: the only cost left on its path is
//! one `Option` test per step (`benches/profile.rs` measures it).
//!
//! On CUDA a step's time is the time between the events around its
//! launches, as the device sees them: where the host is slower than the
//! kernels (a launch-bound plan) that includes waiting for the next launch,
//! so the times say where a run's wall time goes, not what each kernel
//! costs alone (ncu does; `benches/gpu_launch.rs --ncu`).
//!
//! Times are microseconds from the start of the run (the context reads
//! the clock just before it launches the plan); a node's time on the CPU
//! includes taking its operands and storing its value.

mod recorder;
mod trace;

pub(crate) use recorder::Recorder;

use crate::ir::Graph;
use std::collections::BTreeMap;
use std::fmt;

/// The time of one node in one run.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTime {
    /// The node's number in the plan's text IR (`%n`).
    pub node: usize,
    /// Its op (`matmul`, `fused elementwise`).
    pub op: String,
    /// Its region path (empty for the root).
    pub region: String,
    /// The stream it ran on.
    pub stream: u32,
    /// When it started, in microseconds from the start of the run.
    pub start_us: f64,
    /// How long it took, in microseconds.
    pub dur_us: f64,
    /// Whether the node is in the plan's weight prologue (the
    /// `weight-prologue` pass): its number is the prologue's (`ctx.explain`
    /// prints that IR after its `;; prologue` line), and it runs only on
    /// calls where a variable it reads changed, before the plan.
    pub prologue: bool,
}

/// One profiled run of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct RunProfile {
    /// Identifies the plan: the FNV-1a hash of its text IR ([`fingerprint`]).
    pub plan: u64,
    /// The backend's name.
    pub device: String,
    /// The run's wall time (launch to results), in microseconds.
    pub wall_us: f64,
    /// Every node that did work, in the order they finished.
    pub nodes: Vec<NodeTime>,
    /// What the reader should know about these times (on CUDA: that the
    /// run was not captured into a CUDA graph).
    pub note: Option<String>,
}

/// Profiled runs (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// The runs, oldest first.
    pub runs: Vec<RunProfile>,
}

/// One row of a profile table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// What the row adds up: `%3 matmul @encoder` (by node), `matmul` (by
    /// op), `encoder` (by region; `(root)` for the root).
    pub key: String,
    /// How many node runs it adds up.
    pub calls: u64,
    /// Their total time, in milliseconds.
    pub total_ms: f64,
    /// That time's share of all runs' wall time.
    pub share: f64,
}

/// The identity of a plan for profiles and reports: the FNV-1a hash of
/// its graph's text IR.
pub fn fingerprint(graph: &Graph) -> u64 {
    crate::passes::fnv1a(crate::ir::text::print(graph).as_bytes())
}

impl Profile {
    /// All runs' wall time together, in milliseconds.
    pub fn wall_ms(&self) -> f64 {
        self.runs.iter().map(|r| r.wall_us).sum::<f64>() / 1000.0
    }

    /// All node times together, in milliseconds.
    pub fn node_ms(&self) -> f64 {
        self.runs.iter().flat_map(|r| &r.nodes).map(|n| n.dur_us).sum::<f64>() / 1000.0
    }

    /// The runs of one plan ([`fingerprint`]).
    pub fn of_plan(&self, plan: u64) -> Profile {
        Profile { runs: self.runs.iter().filter(|r| r.plan == plan).cloned().collect() }
    }

    fn rows(&self, key: impl Fn(&RunProfile, &NodeTime) -> String) -> Vec<Row> {
        let mut acc: BTreeMap<String, (u64, f64)> = BTreeMap::new();
        for r in &self.runs {
            for n in &r.nodes {
                let e = acc.entry(key(r, n)).or_default();
                e.0 += 1;
                e.1 += n.dur_us;
            }
        }
        let wall = self.wall_ms();
        let mut rows: Vec<Row> = acc
            .into_iter()
            .map(|(key, (calls, us))| Row {
                key,
                calls,
                total_ms: us / 1000.0,
                share: if wall > 0.0 { us / 1000.0 / wall } else { 0.0 },
            })
            .collect();
        rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.key.cmp(&b.key)));
        rows
    }

    /// Time by node (of each plan), slowest first.
    pub fn by_node(&self) -> Vec<Row> {
        let plans = self.plan_numbers();
        self.rows(|r, n| {
            let plan = if plans.len() > 1 { format!("plan {} ", plans[&r.plan]) } else { String::new() };
            let region = if n.region.is_empty() { String::new() } else { format!(" @{}", n.region) };
            let prologue = if n.prologue { "prologue " } else { "" };
            format!("{plan}{prologue}%{} {}{region}", n.node, n.op)
        })
    }

    /// Time by op kind, slowest first; a weight prologue's ops are rows of
    /// their own (`fused elementwise (prologue)`), since they run on the
    /// calls where weights changed, not on every call.
    pub fn by_op(&self) -> Vec<Row> {
        self.rows(|_, n| if n.prologue { format!("{} (prologue)", n.op) } else { n.op.clone() })
    }

    /// Time by region (scope), slowest first; a node counts in its own
    /// region only.
    pub fn by_region(&self) -> Vec<Row> {
        self.rows(|_, n| if n.region.is_empty() { "(root)".into() } else { n.region.clone() })
    }

    /// Plans by first appearance, numbered from 0.
    fn plan_numbers(&self) -> BTreeMap<u64, usize> {
        let mut out = BTreeMap::new();
        for r in &self.runs {
            let k = out.len();
            out.entry(r.plan).or_insert(k);
        }
        out
    }

    /// The runs as a Chrome trace (JSON; opens in Perfetto or
    /// `chrome://tracing`): one process per plan, one track per stream.
    pub fn chrome_trace(&self) -> String {
        trace::chrome_trace(self)
    }

    /// Writes [`Profile::chrome_trace`] to `path`.
    pub fn write_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> crate::Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.chrome_trace())
            .map_err(|e| crate::Error::Io(format!("cannot write {}: {e}", path.display())))
    }
}

fn table(f: &mut fmt::Formatter<'_>, title: &str, rows: &[Row], limit: usize) -> fmt::Result {
    let width = rows.iter().take(limit).map(|r| r.key.chars().count()).max().unwrap_or(0).max(title.len());
    writeln!(f, "{title:width$}  {:>7}  {:>11}  {:>6}", "calls", "total ms", "share")?;
    for r in rows.iter().take(limit) {
        writeln!(f, "{:width$}  {:>7}  {:>11.3}  {:>5.1}%", r.key, r.calls, r.total_ms, r.share * 100.0)?;
    }
    if rows.len() > limit {
        writeln!(f, "... {} more", rows.len() - limit)?;
    }
    Ok(())
}

impl fmt::Display for Profile {
    /// The run count and totals, then the tables by region, by op and by
    /// node (the 25 slowest).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "profile: {} run(s), wall {:.3} ms, node times {:.3} ms",
            self.runs.len(),
            self.wall_ms(),
            self.node_ms()
        )?;
        let mut notes: Vec<&str> = self.runs.iter().filter_map(|r| r.note.as_deref()).collect();
        notes.sort_unstable();
        notes.dedup();
        for n in notes {
            writeln!(f, "note: {n}")?;
        }
        writeln!(f)?;
        table(f, "region", &self.by_region(), usize::MAX)?;
        writeln!(f)?;
        table(f, "op", &self.by_op(), usize::MAX)?;
        writeln!(f)?;
        table(f, "node", &self.by_node(), 25)
    }
}

/// What an executable hands the context after a profiled run.
#[derive(Clone, Debug)]
pub struct RunTimes {
    /// The plan's [`fingerprint`].
    pub plan: u64,
    /// The node times.
    pub nodes: Vec<NodeTime>,
    /// What to know about them (see [`RunProfile::note`]).
    pub note: Option<String>,
}
