//! Reports: what the compiler did to one graph, as one self-contained HTML
//! file.
//!
//! A [`Report`] holds the graph after every pipeline step (the input
//! first), the kernels of the plan, the persistent buffers of the context
//! and, when profiling was on, the time of every node. [`Report::html`]
//! renders it: the graph of each step drawn as SVG (laid out here, by
//! [`layout`], so nothing needs Graphviz or a network), a pass selector
//! with each step's stats, notes and text diff to the step before, the
//! plan (schedule, streams as swimlanes with their events), the memory
//! (the arena over the schedule, and persistent buffers by scope), the
//! kernels, and the profile.
//!
//! Where reports come from:
//! - `Context::report(&[&t])`: the graph a read of `t` would compile.
//! - `KILN_REPORT=<dir>`: one file per compile, `<dir>/<hash>.html`, with
//!   `<hash>` the same 16 hex digits as the `KILN_DUMP` directory of that
//!   graph; rewritten with the times after the plan's first profiled run.
//! - [`Report::from_dump_dir`] and [`Report::from_kir`] (the `kiln-view`
//!   binary): a `KILN_DUMP` directory or a `.kir` file, from any machine.
//!
//! Output is deterministic: the same graph gives the same bytes (the
//! golden tests in `tests/report.rs` hold two).
//!
//! Does not: run anything (a report of a graph compiles nothing for the
//! backend), or read the network.

mod html;
mod kernels;
pub(crate) mod layout;
mod plan;
mod svg;

pub use kernels::{kernels, KernelSource, KernelTarget};

use crate::ir::{self, Graph, Plan};
use crate::passes::PassRecord;
use crate::profile::Profile;
use crate::{Error, Result, VariableInfo};
use std::path::Path;

/// One step of the pipeline as the report shows it.
#[derive(Clone, Debug)]
pub struct ReportStep {
    /// The step's place in the pipeline (`0` is the input).
    pub step: usize,
    /// The pass's name (`input` for step 0).
    pub name: String,
    /// The pass's stats and notes (a dump's `;;` line).
    pub header: String,
    /// Nodes the outputs need after the step.
    pub nodes: usize,
    /// The graph after the step.
    pub graph: Graph,
    /// Its text IR.
    pub text: String,
}

/// The times a report puts on its final graph.
#[derive(Clone, Debug)]
pub(crate) struct ReportProfile {
    pub times: svg::NodeTimes,
    pub runs: usize,
    pub wall_ms: f64,
    pub node_ms: f64,
    pub table: String,
}

/// What the compiler did to one graph (see the module docs).
#[derive(Clone, Debug)]
pub struct Report {
    title: String,
    device: String,
    notes: Vec<String>,
    steps: Vec<ReportStep>,
    kernels: Vec<KernelSource>,
    persistent: Vec<VariableInfo>,
    profile: Option<ReportProfile>,
}

impl Report {
    /// A report of a traced pipeline run ([`crate::passes::optimize_traced`]).
    pub fn from_records(records: &[PassRecord]) -> Report {
        let steps = records
            .iter()
            .map(|r| {
                let mut header =
                    if r.step == 0 { "input".to_string() } else { format!("{}: {}", r.name, r.stats) };
                for n in &r.notes {
                    header.push_str("; ");
                    header.push_str(n);
                }
                step(r.step, r.name, header, r.graph.clone())
            })
            .collect();
        Report::new(steps)
    }

    fn new(steps: Vec<ReportStep>) -> Report {
        let hash = steps.first().map_or(0, |s| crate::passes::fnv1a(s.text.as_bytes()));
        Report {
            title: format!("kiln report {hash:016x}"),
            device: "not run".into(),
            notes: Vec::new(),
            steps,
            kernels: Vec::new(),
            persistent: Vec::new(),
            profile: None,
        }
    }

    /// A report of a `KILN_DUMP` directory of one graph (`00-input.kir`,
    /// `NN-<pass>.kir`): each file is one step, its `;;` line the header.
    /// A file that does not parse is [`Error::Parse`] naming it.
    pub fn from_dump_dir(dir: &Path) -> Result<Report> {
        let io = |e: std::io::Error| Error::Io(format!("cannot read {}: {e}", dir.display()));
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "kir"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::Io(format!(
                "{} holds no .kir file (a KILN_DUMP directory holds one per graph: <dump>/<hash>/NN-<pass>.kir)",
                dir.display()
            )));
        }
        let mut steps = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| Error::Io(format!("cannot read {}: {e}", f.display())))?;
            let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let (n, name) = stem.split_once('-').unwrap_or(("0", stem));
            let header = text.lines().next().filter(|l| l.starts_with(";;")).map_or("", |l| l[2..].trim());
            let graph = ir::text::parse(&text).map_err(|e| in_file(&f, e))?;
            steps.push(step(n.parse().unwrap_or(steps.len()), name, header.to_string(), graph));
        }
        let mut r = Report::new(steps);
        r.title = format!("kiln report of {}", dir.display());
        Ok(r)
    }

    /// A report of a `.kir` file: a recorded graph is run through the
    /// pipeline (every pass on), a planned one is shown as it is.
    pub fn from_kir(path: &Path) -> Result<Report> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
        let graph = match ir::text::parse(&text) {
            Ok(g) => g,
            Err(first) => {
                ir::text::parse_test_file(&text).map(|t| t.graph).map_err(|_| in_file(path, first))?
            }
        };
        let mut r = if graph.tables().is_empty() {
            let (_, records) =
                crate::passes::optimize_traced(graph, &crate::passes::PipelineConfig::default())?;
            Report::from_records(&records)
        } else {
            Report::new(vec![step(0, "input", "a planned graph, shown as it is".into(), graph)])
        };
        r.title = format!("kiln report of {}", path.display());
        Ok(r)
    }

    /// Adds the kernels of `plan` for `target` (the final step's graph
    /// should be the plan's).
    pub fn with_kernels(mut self, plan: &Plan, target: KernelTarget) -> Result<Report> {
        self.kernels = kernels(plan, target)?;
        Ok(self)
    }

    /// Names the device (`cpu`, `cuda:0 ...`) in the header.
    pub fn with_device(mut self, device: impl Into<String>) -> Report {
        self.device = device.into();
        self
    }

    /// Adds a line to the header (e.g. that profiled runs were not
    /// captured into CUDA graphs).
    pub fn with_note(mut self, note: impl Into<String>) -> Report {
        self.notes.push(note.into());
        self
    }

    /// Lists these persistent buffers (a context's variables) by scope.
    pub fn with_persistent(mut self, vars: Vec<VariableInfo>) -> Report {
        self.persistent = vars;
        self
    }

    /// Puts the times of `profile`'s runs of this report's final graph on
    /// it (runs of other plans are left out). No run of it: no change.
    pub fn with_profile(mut self, profile: &Profile) -> Report {
        let Some(last) = self.steps.last() else { return self };
        let mine = profile.of_plan(crate::profile::fingerprint(&last.graph));
        if mine.runs.is_empty() {
            return self;
        }
        let wall_ms = mine.wall_ms();
        let mut times = svg::NodeTimes::new();
        for run in &mine.runs {
            // A weight prologue's nodes are numbered in its own graph,
            // which this report does not draw: they stay in the table.
            for n in run.nodes.iter().filter(|n| !n.prologue) {
                times.entry(n.node).or_insert((0.0, 0.0)).0 += n.dur_us / 1000.0;
            }
        }
        for v in times.values_mut() {
            v.1 = if wall_ms > 0.0 { v.0 / wall_ms } else { 0.0 };
        }
        let mut notes: Vec<String> = mine.runs.iter().filter_map(|r| r.note.clone()).collect();
        notes.dedup();
        self.notes.extend(notes);
        self.profile = Some(ReportProfile {
            times,
            runs: mine.runs.len(),
            wall_ms,
            node_ms: mine.node_ms(),
            table: mine.to_string(),
        });
        self
    }

    /// The steps, input first.
    pub fn steps(&self) -> &[ReportStep] {
        &self.steps
    }

    /// The kernels.
    pub fn kernel_sources(&self) -> &[KernelSource] {
        &self.kernels
    }

    /// The page (see the module docs).
    pub fn html(&self) -> String {
        let _span = tracing::debug_span!("report", steps = self.steps.len()).entered();
        html::page(self)
    }

    /// The final graph as SVG alone (what the report draws for it).
    pub fn final_svg(&self) -> String {
        self.steps.last().map_or(String::new(), |s| svg::draw(&s.graph, "g", None).svg)
    }

    /// Writes [`Report::html`] to `path`.
    pub fn write_html(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.html())
            .map_err(|e| Error::Io(format!("cannot write {}: {e}", path.display())))
    }
}

fn step(step: usize, name: &str, header: String, graph: Graph) -> ReportStep {
    let text = ir::text::print(&graph);
    let nodes = ir::text::numbering(&graph).0.len();
    ReportStep { step, name: name.to_string(), header, nodes, graph, text }
}

fn in_file(path: &Path, e: Error) -> Error {
    match e {
        Error::Parse { line, message } => {
            Error::Parse { line, message: format!("{}: {message}", path.display()) }
        }
        other => other,
    }
}

/// `graph` drawn as an SVG document, as the report draws each pass (the
/// layered layout of `layout.rs`; fused bodies are not expanded).
pub fn graph_svg(graph: &Graph) -> String {
    svg::draw(graph, "g", None).svg
}
