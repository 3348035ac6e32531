//! Passes: graph in, graph out, and the pipeline that orders them.
//!
//! A pass is one type implementing [`Pass`] in one file, opening with a
//! header that says what it does, does not do, preserves, invalidates and
//! assumes. [`REGISTRY`] lists every pass once; span names, `KILN_DUMP` file
//! names and `KILN_PASSES` toggles all come from it. [`PIPELINE`] is the
//! straight list of steps [`optimize`] runs.
//!
//! Passes never touch a device and never see a user handle. The pipeline's
//! input is always verified; in debug and test builds [`crate::ir::verify`]
//! also runs after every pass, and a failure names the pass that broke the
//! graph. In every build, after every pass, the graph must still run the
//! collectives the input recorded, each once, in recorded order
//! (`effects.rs`): a pass that merged, dropped or reordered one on some
//! ranks only would pair different rounds across ranks.

mod assign;
mod attention_grad;
mod attention_layout;
mod autocast;
mod autodiff;
mod constant_fold;
mod cse;
mod dce;
mod effects;
mod fusion;
mod horizontal;
mod memory;
mod merge_matmuls;
mod multi_output;
mod narrow;
mod remat;
mod run;
mod schedule;
mod simplify;
mod streams;
mod view_fold;
mod weight_prologue;

pub use assign::Assign;
pub use attention_grad::AttentionGrad;
pub use attention_layout::AttentionLayout;
pub use autocast::{policy_text, Autocast, OpKey, PolicyEntry, Precision, POLICY};
pub use autodiff::{grad_region, gradients, Autodiff, GradRequest};
pub use constant_fold::ConstantFold;
pub use cse::Cse;
pub use dce::Dce;
pub use fusion::Fusion;
pub use horizontal::{Horizontal, SMALL as HORIZONTAL_SMALL};
pub use memory::Memory;
pub use merge_matmuls::MergeMatmuls;
pub use multi_output::MultiOutput;
pub use narrow::Narrow;
pub use remat::Remat;
pub(crate) use run::fnv1a;
pub use run::{optimize, optimize_plan, optimize_traced, run_single, split_prologue, Optimized, PassRecord};
pub use schedule::Schedule;
pub use simplify::Simplify;
pub use streams::Streams;
pub use view_fold::ViewFold;
pub use weight_prologue::{Prologue, WeightPrologue};

use crate::ir::{DType, Graph, Phase};
use crate::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// One graph transformation. Passes are stateless values (scratch lives in
/// the [`PassCtx`]), so one instance serves every graph and thread.
pub trait Pass: Send + Sync {
    /// The kebab-case name: the span name, the dump file suffix and the
    /// `KILN_PASSES` toggle.
    fn name(&self) -> &'static str;
    /// Transforms the graph in place and says whether anything changed.
    fn run(&self, graph: &mut Graph, cx: &mut PassCtx) -> Result<Changed>;
    /// The phase a graph has reached once this pass ran (phases only move
    /// forward, so a pass turned off never moves a graph back).
    fn reaches(&self) -> Phase {
        Phase::Canonical
    }
    /// Whether the pass has anything to do on `graph` under these options.
    /// A pass that does not apply is skipped like one turned off (no span,
    /// no dump): autocast applies only when [`PassOptions::autocast`] is
    /// set or a region of the graph has an autocast setting.
    fn applies(&self, _options: &PassOptions, _graph: &Graph) -> bool {
        true
    }
    /// [`Pass::applies`] where the driver has the whole [`PassCtx`]: for a
    /// pass that depends on more than the options (`weight-prologue`
    /// applies only to a context's plans, which name their stable inputs).
    fn applies_in(&self, cx: &PassCtx, graph: &Graph) -> bool {
        self.applies(&cx.options, graph)
    }
    /// Whether the pass runs even when turned off (then with
    /// [`PassCtx::off`] set, doing only what backends need: `assign`).
    fn required(&self) -> bool {
        false
    }
}

/// Whether a pass changed the graph; a driver can skip re-verification or
/// iterate to a fixed point on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    /// The graph is as it was.
    No,
    /// Something was rewritten.
    Yes,
}

impl Changed {
    /// True for [`Changed::Yes`].
    pub fn is_changed(self) -> bool {
        self == Changed::Yes
    }
}

impl From<bool> for Changed {
    fn from(b: bool) -> Changed {
        if b {
            Changed::Yes
        } else {
            Changed::No
        }
    }
}

impl std::ops::BitOr for Changed {
    type Output = Changed;
    fn bitor(self, other: Changed) -> Changed {
        Changed::from(self.is_changed() || other.is_changed())
    }
}

/// Small numbers each pass run reports: what the `;;` line of a dump and
/// the tracing event after each pass show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Nodes the outputs needed before the pass.
    pub nodes_in: usize,
    /// Nodes the outputs need after the pass.
    pub nodes_out: usize,
    /// Nodes the graph held before the pass, dead ones included.
    pub held_in: usize,
    /// Nodes the graph holds after the pass, dead ones included.
    pub held_out: usize,
    /// Rewrites the pass made (folds, merges, removals).
    pub rewrites: usize,
}

impl fmt::Display for PassStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "needed nodes {} -> {}, held {} -> {}, {} rewrite(s)",
            self.nodes_in, self.nodes_out, self.held_in, self.held_out, self.rewrites
        )
    }
}

/// Settings that change what passes may do. They are part of a compiled
/// plan's identity: a context keys its plan cache on them too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PassOptions {
    /// Allow rewrites that are exact in real arithmetic but not in floating
    /// point (reassociation, `x * (1/c)` for any `c`). Off by default, as in
    /// every compiler worth trusting; `Context::with_fast_math` turns it on.
    pub fast_math: bool,
    /// How many streams the streams pass may spread independent work over
    /// (at least 1). With 1 there are no events.
    pub streams: u32,
    /// Mixed precision: the low float type (`bf16` or `f16`) the autocast
    /// pass runs products in, or `None` (the default) for none.
    /// `Context::with_autocast` sets it; any other dtype is refused by the
    /// pass with [`Error::Config`].
    pub autocast: Option<DType>,
    /// Fusion moves a matmul product's reshape below its bias so that the
    /// bias joins the GEMM (`fusion/sink.rs`, cuBLASLt's bias epilogue on
    /// CUDA). On by default; a CPU context turns it off: there the fused
    /// product measured slower than the plain GEMM and a bias kernel
    /// (MiniLM-L6 8x128 f32 on 2 cores, three rounds alternating: medians
    /// 132.8-134.8 ms off against 140.1-145.9 on, first calls 173-207
    /// against 226-273; benches/RESULTS.md, "Eighteenth measurement").
    pub reshape_epilogues: bool,
    /// Products that read the same left operand (an encoder's q, k and v
    /// projections) run as one GEMM over their weights side by side
    /// (`merge_matmuls.rs`). On by default; a CPU context turns it off:
    /// the merged product's bias is a fused epilogue there, which measured
    /// slower than the plain GEMM (see `reshape_epilogues`), and the
    /// weights' copy is not free on a CPU's bandwidth.
    pub merge_matmuls: bool,
}

impl Default for PassOptions {
    /// Exact math, one stream, no autocast, reshape epilogues, merged
    /// products.
    fn default() -> PassOptions {
        PassOptions {
            fast_math: false,
            streams: 1,
            autocast: None,
            reshape_epilogues: true,
            merge_matmuls: true,
        }
    }
}

impl fmt::Display for PassOptions {
    /// The text a test header or a cache key uses: `fast-math streams=2`,
    /// `streams=1 autocast=bf16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.fast_math {
            write!(f, "fast-math ")?;
        }
        write!(f, "streams={}", self.streams)?;
        if let Some(low) = self.autocast {
            write!(f, " autocast={low}")?;
        }
        if !self.reshape_epilogues {
            write!(f, " no-reshape-epilogues")?;
        }
        if !self.merge_matmuls {
            write!(f, " no-merge-matmuls")?;
        }
        Ok(())
    }
}

impl PassOptions {
    /// Options from a pass test header's settings (`fast-math`,
    /// `streams=N`, `autocast=bf16|f16`, `no-reshape-epilogues`,
    /// `no-merge-matmuls`); anything
    /// else is [`Error::Config`].
    pub fn from_settings<S: AsRef<str>>(settings: &[S]) -> Result<PassOptions> {
        let mut options = PassOptions::default();
        for setting in settings {
            let setting = setting.as_ref();
            if setting == "fast-math" {
                options.fast_math = true;
            } else if setting == "no-reshape-epilogues" {
                options.reshape_epilogues = false;
            } else if setting == "no-merge-matmuls" {
                options.merge_matmuls = false;
            } else if let Some(n) = setting.strip_prefix("streams=") {
                options.streams = n.parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                    Error::Config(format!("`{setting}`: streams must be a whole number of at least 1"))
                })?;
            } else if let Some(name) = setting.strip_prefix("autocast=") {
                options.autocast = match DType::from_name(name) {
                    Some(low @ (DType::BF16 | DType::F16)) => Some(low),
                    _ => {
                        return Err(Error::Config(format!(
                            "`{setting}`: autocast runs in bf16 or f16, not `{name}`"
                        )))
                    }
                };
            } else {
                return Err(Error::Config(format!(
                    "unknown pass setting `{setting}`; settings are `fast-math`, `streams=N`, `autocast=bf16|f16`, `no-reshape-epilogues` and `no-merge-matmuls`"
                )));
            }
        }
        Ok(options)
    }
}

/// What a pass may use besides the graph: the options, its stats and
/// scratch space that the driver reuses between passes.
#[derive(Clone, Debug, Default)]
pub struct PassCtx {
    /// What the passes may do (fast math, stream count).
    pub options: PassOptions,
    /// This run's stats; the driver fills the node counts, the pass counts
    /// its rewrites with [`PassCtx::rewrite`].
    pub stats: PassStats,
    /// Scratch a pass may use for work lists; cleared before each pass.
    pub scratch: Vec<crate::ir::NodeId>,
    /// Short remarks for the dump header (e.g. why a search stopped);
    /// cleared before each pass.
    pub notes: Vec<String>,
    /// The pass is turned off but [`Pass::required`]: it does only what
    /// backends need.
    pub off: bool,
    /// Per input slot, whether it holds a variable's current value that
    /// the run does not assign (the context's plans only; empty
    /// elsewhere): what `weight-prologue` may keep work of.
    pub stable_inputs: Vec<bool>,
    /// What `weight-prologue` moved out of the graph, for the driver to
    /// take (`run.rs`).
    pub prologue: Option<Prologue>,
}

impl PassCtx {
    /// Counts one rewrite.
    pub fn rewrite(&mut self) {
        self.stats.rewrites += 1;
    }

    /// Adds a remark to this pass's dump header and tracing event.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    fn reset(&mut self) {
        self.stats = PassStats::default();
        self.scratch.clear();
        self.notes.clear();
    }
}

/// One registry entry: the pass and what it does, in one line.
pub struct PassInfo {
    /// The pass (its [`Pass::name`] is the entry's name).
    pub pass: &'static dyn Pass,
    /// One line for `--help`-style listings and docs.
    pub description: &'static str,
}

impl PassInfo {
    /// The pass's kebab-case name.
    pub fn name(&self) -> &'static str {
        self.pass.name()
    }
}

impl fmt::Debug for PassInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassInfo")
            .field("name", &self.name())
            .field("description", &self.description)
            .finish()
    }
}

/// Every pass, once. Names, spans, dump files and toggles come from here.
/// Every entry but `autodiff` is a [`PIPELINE`] step; autodiff is run by
/// `Tensor::backward` (and by its `.kir` cases), so toggling it changes
/// nothing.
pub static REGISTRY: &[PassInfo] = &[
    PassInfo {
        pass: &Autocast,
        description:
            "run products in bf16/f16 and keep accumulations in f32, by a policy table (with_autocast)",
    },
    PassInfo {
        pass: &AttentionGrad,
        description: "keep attention gradients fused where a kernel takes them (f16/bf16), else expand them",
    },
    PassInfo { pass: &ViewFold, description: "compose chains of views and drop identity views" },
    PassInfo { pass: &ConstantFold, description: "turn nodes of one known value into full constants" },
    PassInfo { pass: &Cse, description: "merge nodes that compute the same value" },
    PassInfo { pass: &Simplify, description: "rewrite by equality saturation and keep the cheapest form" },
    PassInfo { pass: &Narrow, description: "compute only the rows that slices keep" },
    PassInfo {
        pass: &AttentionLayout,
        description: "an attention whose heads are merged next writes them merged (no copy for the merge)",
    },
    PassInfo {
        pass: &MergeMatmuls,
        description: "products that read the same left operand (q, k, v projections) become one GEMM",
    },
    PassInfo { pass: &Dce, description: "remove nodes the outputs do not need" },
    PassInfo {
        pass: &WeightPrologue,
        description: "run work on the variables alone in a prologue plan, kept until one of them changes",
    },
    PassInfo {
        pass: &Remat,
        description: "recompute cheap forward values in the backward pass instead of keeping them",
    },
    PassInfo {
        pass: &Fusion,
        description: "group elementwise work, row reductions and matmul epilogues into fused nodes",
    },
    PassInfo {
        pass: &Assign,
        description: "turn assignments into their values; mark fused updates to write over the variable",
    },
    PassInfo {
        pass: &MultiOutput,
        description:
            "compute an elementwise value in the elementwise kernel that reads it, as an extra output; attention writes its log-sum-exp for the backward",
    },
    PassInfo { pass: &Schedule, description: "order the nodes to keep the peak of live bytes low" },
    PassInfo {
        pass: &Horizontal,
        description: "run small independent elementwise nodes as one launch (multi-tensor optimizer updates)",
    },
    PassInfo { pass: &Streams, description: "spread independent chains over streams with the fewest events" },
    PassInfo { pass: &Memory, description: "place values in one arena by liveness, in place where safe" },
    PassInfo {
        pass: &Autodiff,
        description: "add reverse-mode gradient nodes (run by Tensor::backward, not by the pipeline)",
    },
];

/// The pipeline, in order: canonicalizing passes, then planning ones.
/// After it the graph is in [`Phase::Planned`]. One sweep, no fixed point: work one pass exposes
/// for an earlier one (a `where` that constant folding forwards, joining
/// two views) is left as it is.
pub static PIPELINE: &[&dyn Pass] = &[
    // Mixed precision first (only under `with_autocast`): the casts it adds
    // are then folded, merged and fused like any other node.
    &Autocast,
    // Attention gradients fused or expanded, once autocast fixed their
    // type; expanded ones are then folded, merged and fused like the rest.
    &AttentionGrad,
    // Views first, so folding and CSE see one view per chain.
    &ViewFold,
    // Fold constants (views of a Full included) before comparing nodes.
    &ConstantFold,
    // Merge duplicates, folded constants included.
    &Cse,
    // Algebra on the deduplicated graph: rules to saturation, cheapest form.
    &Simplify,
    // Nodes read only in a window (a slice of step 1) computed on that
    // window: GPT-2's prefill runs its last layer on the last row.
    &Narrow,
    // Attention that writes its heads merged, where a permute merges them
    // next: the reshape after it is then free instead of a copy.
    &AttentionLayout,
    // Products of one left operand (an encoder's q, k, v) as one GEMM over
    // their weights side by side; before fusion, which makes the merged
    // bias its epilogue.
    &MergeMatmuls,
    // Drop what folding, bypassed views, merges and narrowing left unused.
    &Dce,
    // Work on the weights alone (the merged weights' copy, autocast's
    // casts) to a prologue plan, kept until a weight changes; before
    // fusion, so both plans are fused and planned as any other.
    &WeightPrologue,
    // The backward pass recomputes cheap forward values it reads, so that
    // fusion can finish each forward chain in one kernel.
    &Remat,
    // One kernel per group of elementwise ops, row reductions, matmul epilogues.
    &Fusion,
    // Assignments become their values (required: no backend runs one); a
    // fused update may then be written over its variable's input.
    &Assign,
    // An elementwise value read by another elementwise kernel of its shape
    // becomes that kernel's extra output (AdamW's moments and update: one
    // kernel). After assign, so the `over` marks follow the outputs.
    &MultiOutput,
    // An order with a low peak of live bytes.
    &Schedule,
    // Small independent elementwise nodes deferred into launch groups
    // (the optimizer's multi-tensor updates).
    &Horizontal,
    // Streams and events over that order.
    &Streams,
    // Arena offsets over the order's lifetimes (aware of streams).
    &Memory,
];

/// The names of every registered pass, in registry order.
pub fn pass_names() -> Vec<&'static str> {
    REGISTRY.iter().map(PassInfo::name).collect()
}

fn lookup(name: &str) -> Result<&'static PassInfo> {
    REGISTRY.iter().find(|p| p.name() == name).ok_or_else(|| unknown(name))
}

fn unknown(name: &str) -> Error {
    Error::Config(format!("unknown pass `{name}`; valid passes are: {}", pass_names().join(", ")))
}

/// Which passes run and where dumps go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Per registry entry (same order), whether the pass runs.
    enabled: Vec<bool>,
    /// Where to write the IR after each pass, if anywhere.
    dump: Option<PathBuf>,
    /// What the passes may do.
    pub options: PassOptions,
}

impl Default for PipelineConfig {
    /// Every pass on, no dumps.
    fn default() -> PipelineConfig {
        PipelineConfig { enabled: vec![true; REGISTRY.len()], dump: None, options: PassOptions::default() }
    }
}

impl PipelineConfig {
    /// The configuration the environment asks for: `KILN_PASSES`
    /// (`-name` turns a pass off, `+name` on, comma-separated, later wins;
    /// everything is on by default) and `KILN_DUMP` (a directory; empty or
    /// unset means no dumps). Bad values are [`Error::Config`].
    pub fn from_env() -> Result<PipelineConfig> {
        let var = |name: &str| match std::env::var(name) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::Config(format!("{name} is not valid unicode")))
            }
        };
        let passes = var("KILN_PASSES")?;
        let dump = var("KILN_DUMP")?.filter(|d| !d.is_empty()).map(PathBuf::from);
        PipelineConfig::new(passes.as_deref(), dump)
    }

    /// A configuration from a `KILN_PASSES`-style toggle list and an
    /// optional dump directory. An unknown name or a toggle without `+`/`-`
    /// is [`Error::Config`] listing the valid names.
    pub fn new(passes: Option<&str>, dump: Option<PathBuf>) -> Result<PipelineConfig> {
        let mut config = PipelineConfig { dump, ..PipelineConfig::default() };
        for token in passes.unwrap_or("").split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (on, name) = if let Some(name) = token.strip_prefix('+') {
                (true, name)
            } else if let Some(name) = token.strip_prefix('-') {
                (false, name)
            } else {
                return Err(Error::Config(format!(
                    "KILN_PASSES entry `{token}` needs a sign: `-{token}` turns the pass off, `+{token}` on; valid passes are: {}",
                    pass_names().join(", ")
                )));
            };
            let index = REGISTRY.iter().position(|p| p.name() == name.trim()).ok_or_else(|| unknown(name))?;
            config.enabled[index] = on;
        }
        Ok(config)
    }

    /// This configuration with more `KILN_PASSES`-style toggles applied on
    /// top (later toggles win).
    pub fn toggled(mut self, toggles: &str) -> Result<PipelineConfig> {
        let extra = PipelineConfig::new(Some(toggles), None)?;
        for token in toggles.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let name = &token[1..];
            if let Some(i) = REGISTRY.iter().position(|p| p.name() == name.trim()) {
                self.enabled[i] = extra.enabled[i];
            }
        }
        Ok(self)
    }

    /// The passes that are off, as `-a,-b` (empty when all run): the
    /// configuration's part of a plan cache key.
    pub fn enabled_text(&self) -> String {
        let off: Vec<String> = REGISTRY
            .iter()
            .zip(&self.enabled)
            .filter(|(_, on)| !**on)
            .map(|(p, _)| format!("-{}", p.name()))
            .collect();
        off.join(",")
    }

    /// Whether the named pass runs (false for names not registered).
    pub fn is_enabled(&self, name: &str) -> bool {
        REGISTRY.iter().position(|p| p.name() == name).is_some_and(|i| self.enabled[i])
    }

    /// The dump directory, if dumps are on.
    pub fn dump_dir(&self) -> Option<&Path> {
        self.dump.as_deref()
    }
}

#[cfg(test)]
mod tests;
