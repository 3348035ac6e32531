//! Running the pipeline: each pass under its span with its stats, the
//! collectives check and (in debug and test builds) verification; dumps
//! (`KILN_DUMP`), traced runs for reports, and one pass alone for the
//! snapshot tests. What the passes are and in which order is `mod.rs`.

use super::{effects, lookup, Pass, PassCtx, PassOptions, PassStats, PipelineConfig, Prologue, PIPELINE};
use crate::ir::{self, Graph, Phase};
use crate::{Error, Result};
use std::path::Path;

/// Whether to verify after every pass: debug and test builds.
fn verifying() -> bool {
    cfg!(debug_assertions) || cfg!(test)
}

/// Runs one pass with its span, stats, the collectives check against
/// `recorded` and (in debug builds) verification.
pub(super) fn run_pass(
    pass: &dyn Pass,
    graph: &mut Graph,
    cx: &mut PassCtx,
    verify: bool,
    recorded: &effects::Recorded,
) -> Result<PassStats> {
    let name = pass.name();
    let _span = tracing::debug_span!("pass", name).entered();
    cx.reset();
    cx.stats.nodes_in = graph.topo_order().len();
    cx.stats.held_in = graph.len();
    let changed = pass.run(graph, cx)?;
    cx.stats.nodes_out = graph.topo_order().len();
    cx.stats.held_out = graph.len();
    let stats = cx.stats;
    tracing::debug!(
        nodes_in = stats.nodes_in,
        nodes_out = stats.nodes_out,
        held_in = stats.held_in,
        held_out = stats.held_out,
        rewrites = stats.rewrites,
        notes = cx.notes.join("; "),
        changed = changed.is_changed(),
        "pass done"
    );
    if verify {
        ir::verify(graph).map_err(|e| Error::Verify(format!("after pass {name}: {}", verify_message(e))))?;
    }
    recorded.check(graph, name)?;
    Ok(stats)
}

/// Runs one pipeline step when `config` enables `pass` (or it is
/// required) and it applies: its stats, or `None` when it was skipped.
fn run_step(
    pass: &dyn Pass,
    graph: &mut Graph,
    cx: &mut PassCtx,
    config: &PipelineConfig,
    verify: bool,
    recorded: &effects::Recorded,
) -> Result<Option<PassStats>> {
    let on = config.is_enabled(pass.name());
    if (!on && !pass.required()) || !pass.applies_in(cx, graph) {
        return Ok(None);
    }
    cx.off = !on;
    let stats = run_pass(pass, graph, cx, verify, recorded)?;
    graph.advance_phase(pass.reaches());
    Ok(Some(stats))
}

/// The input is always verified, in release builds too: a graph is public
/// and mutable (`set_outputs`, `add_unchecked`), and passes may assume a
/// valid graph, so an invalid one must stop here as an error, never reach a
/// pass and panic. It is one linear walk.
fn check_input(graph: &Graph) -> Result<()> {
    ir::verify(graph).map_err(|e| Error::Verify(format!("pipeline input: {}", verify_message(e))))
}

fn verify_message(e: Error) -> String {
    match e {
        Error::Verify(m) => m,
        other => other.to_string(),
    }
}

/// Runs the [`PIPELINE`] (the passes `config` enables) and advances the
/// graph to at least [`Phase::Canonical`]. The input is verified first
/// in every build (an invalid graph is [`Error::Verify`], never a panic);
/// the graph after each pass is verified in debug and test builds. With a dump directory it
/// writes `<dir>/<hash>/00-input.kir` and `NN-<pass>.kir` after each step
/// that ran (`NN` is the step's place in the pipeline, so a file name always
/// means the same pass), where `<hash>` is 16 hex digits of the input text's
/// FNV-1a hash: the same graph always dumps to the same directory. A dump's
/// first line is `;; <pass>: <stats>`, then the pass's notes
/// ([`PassCtx::note`]), each after a `; `.
pub fn optimize(graph: Graph, config: &PipelineConfig) -> Result<Graph> {
    Ok(run_pipeline(graph, config, &[], None)?.graph)
}

/// What the pipeline made of a plan whose stable inputs were given
/// ([`optimize_plan`]): the plan's graph, and the prologue when
/// `weight-prologue` moved work out of it (then the graph reads the kept
/// values from input slots `prologue.kept_from..`).
#[derive(Clone, Debug)]
pub struct Optimized {
    /// The plan's graph.
    pub graph: Graph,
    /// The work on stable inputs alone, optimized by the same passes.
    pub prologue: Option<Prologue>,
}

/// [`optimize`] for a plan a context compiles: `stable` says, per input
/// slot, whether it holds a variable's current value that the run does not
/// assign (see `weight_prologue.rs`). With `traced`, also the graph after
/// every step that ran, as [`optimize_traced`] returns them (the plan's,
/// not the prologue's). The passes after `weight-prologue` run on both
/// graphs; dumps write the prologue's as `NN-<pass>.prologue.kir`.
pub fn optimize_plan(
    graph: Graph,
    config: &PipelineConfig,
    stable: &[bool],
    traced: bool,
) -> Result<(Optimized, Option<Vec<PassRecord>>)> {
    if traced {
        let mut records = Vec::new();
        let optimized = run_pipeline(graph, config, stable, Some(&mut records))?;
        Ok((optimized, Some(records)))
    } else {
        Ok((run_pipeline(graph, config, stable, None)?, None))
    }
}

/// One step of a traced pipeline run: what a dump file holds, as values
/// (the report draws them; see [`optimize_traced`]).
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// The step's place in the pipeline (`0` is the input), as in dump file names.
    pub step: usize,
    /// The pass's name (`input` for step 0).
    pub name: &'static str,
    /// The pass's stats (zero for the input).
    pub stats: PassStats,
    /// The pass's notes ([`PassCtx::note`]).
    pub notes: Vec<String>,
    /// The graph after the step.
    pub graph: Graph,
}

/// [`optimize`], also returning the graph after every step that ran (the
/// input first). Costs one graph copy per step, so only reports use it.
pub fn optimize_traced(graph: Graph, config: &PipelineConfig) -> Result<(Graph, Vec<PassRecord>)> {
    let mut records = Vec::new();
    let optimized = run_pipeline(graph, config, &[], Some(&mut records))?;
    Ok((optimized.graph, records))
}

fn run_pipeline(
    graph: Graph,
    config: &PipelineConfig,
    stable: &[bool],
    mut trace: Option<&mut Vec<PassRecord>>,
) -> Result<Optimized> {
    let mut graph = graph;
    check_input(&graph)?;
    let verify = verifying();
    if let Some(t) = trace.as_deref_mut() {
        t.push(PassRecord {
            step: 0,
            name: "input",
            stats: PassStats::default(),
            notes: Vec::new(),
            graph: graph.clone(),
        });
    }
    let dump_dir = match config.dump_dir() {
        Some(root) => {
            let text = ir::text::print(&graph);
            let dir = root.join(format!("{:016x}", fnv1a(text.as_bytes())));
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::Io(format!("cannot create dump directory {}: {e}", dir.display())))?;
            write_dump(&dir.join("00-input.kir"), ";; input", &text)?;
            Some(dir)
        }
        None => None,
    };
    let mut cx = PassCtx { options: config.options, stable_inputs: stable.to_vec(), ..PassCtx::default() };
    let recorded = effects::Recorded::of(&graph);
    let mut split: Option<(usize, Prologue)> = None;
    for (step, pass) in PIPELINE.iter().enumerate() {
        let Some(stats) = run_step(*pass, &mut graph, &mut cx, config, verify, &recorded)? else { continue };
        if let Some(prologue) = cx.prologue.take() {
            split = Some((step, prologue));
        }
        if let Some(dir) = &dump_dir {
            let file = dir.join(format!("{:02}-{}.kir", step + 1, pass.name()));
            let mut header = format!(";; {}: {stats}", pass.name());
            for note in &cx.notes {
                header.push_str("; ");
                header.push_str(note);
            }
            write_dump(&file, &header, &ir::text::print(&graph))?;
        }
        if let Some(t) = trace.as_deref_mut() {
            t.push(PassRecord {
                step: step + 1,
                name: pass.name(),
                stats,
                notes: cx.notes.clone(),
                graph: graph.clone(),
            });
        }
    }
    graph.advance_phase(Phase::Canonical);
    let prologue = match split {
        Some((step, mut prologue)) => {
            prologue.graph = finish_prologue(prologue.graph, config, step + 1, dump_dir.as_deref())?;
            Some(prologue)
        }
        None => None,
    };
    Ok(Optimized { graph, prologue })
}

/// Runs the pipeline's steps from `from` on a prologue that
/// `weight-prologue` split off at step `from - 1`.
fn finish_prologue(graph: Graph, config: &PipelineConfig, from: usize, dump: Option<&Path>) -> Result<Graph> {
    let mut graph = graph;
    let verify = verifying();
    let mut cx = PassCtx { options: config.options, ..PassCtx::default() };
    let recorded = effects::Recorded::of(&graph);
    for (step, pass) in PIPELINE.iter().enumerate().skip(from) {
        let Some(stats) = run_step(*pass, &mut graph, &mut cx, config, verify, &recorded)? else { continue };
        if let Some(dir) = dump {
            let file = dir.join(format!("{:02}-{}.prologue.kir", step + 1, pass.name()));
            write_dump(&file, &format!(";; {} (prologue): {stats}", pass.name()), &ir::text::print(&graph))?;
        }
    }
    graph.advance_phase(Phase::Canonical);
    Ok(graph)
}

/// Runs the one named pass with the given options, verifying its input and
/// result in every build: what the pass snapshot tests call. An unknown
/// name is [`Error::Config`].
pub fn run_single(name: &str, graph: Graph, options: PassOptions) -> Result<Graph> {
    let info = lookup(name)?;
    let mut graph = graph;
    check_input(&graph)?;
    let recorded = effects::Recorded::of(&graph);
    run_pass(info.pass, &mut graph, &mut PassCtx { options, ..PassCtx::default() }, true, &recorded)?;
    graph.advance_phase(info.pass.reaches());
    Ok(graph)
}

/// Runs `weight-prologue` alone with the given stable input slots,
/// verifying its input and both graphs it makes: what its snapshot tests
/// call (`run_single` gives a pass no stable inputs).
pub fn split_prologue(graph: Graph, stable: &[bool]) -> Result<Optimized> {
    let mut graph = graph;
    check_input(&graph)?;
    let recorded = effects::Recorded::of(&graph);
    let mut cx = PassCtx { stable_inputs: stable.to_vec(), ..PassCtx::default() };
    run_pass(&super::WeightPrologue, &mut graph, &mut cx, true, &recorded)?;
    let prologue = cx.prologue.take();
    if let Some(p) = &prologue {
        ir::verify(&p.graph).map_err(|e| Error::Verify(format!("the prologue: {}", verify_message(e))))?;
    }
    Ok(Optimized { graph, prologue })
}

fn write_dump(path: &Path, header: &str, text: &str) -> Result<()> {
    std::fs::write(path, format!("{header}\n{text}"))
        .map_err(|e| Error::Io(format!("cannot write {}: {e}", path.display())))
}

/// 64-bit FNV-1a: a hash that never changes between builds or platforms,
/// so dump directory names are stable.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}
