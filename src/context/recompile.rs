//! Recompile explanations: when a read misses the plan cache but its graph
//! has the structure of one compiled before (the same ops wired the same
//! way), say what differs — the first node whose shape, dtype, constant,
//! attribute or region changed, or a compile option — so a loop that
//! recompiles every iteration learns why, and what to do instead.
//!
//! Each compile keeps a signature: the text IR lines of the graph it was
//! compiled from (extraction numbers nodes in walk order, so the same
//! program prints the same lines) and its options. Only misses pay for
//! it: the text is printed when the graph is compiled anyway. The last
//! [`KEEP`] signatures are kept, and the last [`KEEP`] explanations
//! (`Stats::recompiles`).

use super::key::PlanKey;
use crate::ir::Graph;
use std::fmt;

/// How many signatures and explanations a context keeps.
pub(crate) const KEEP: usize = 32;

/// What changed between a compile and an earlier one of the same structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecompileCause {
    /// A node's shape (usually an input's: a new batch size).
    Shape,
    /// A node's dtype.
    DType,
    /// The value of a constant baked into the graph.
    Constant,
    /// Another attribute of a node (dims, a slice, a random stream).
    Attribute,
    /// The region (scope) a node was recorded in.
    Region,
    /// A context option (passes, fast math, streams, TF32, CUDA graphs, profiling).
    Option,
}

/// Why a read compiled again (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recompile {
    /// What kind of change.
    pub cause: RecompileCause,
    /// The node that changed, as numbered in the extracted graph's text
    /// IR (`None` for an option).
    pub node: Option<usize>,
    /// One line: what changed, from what to what, and what to do.
    pub message: String,
}

impl fmt::Display for Recompile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A compiled graph as later misses compare it.
#[derive(Clone, Debug)]
pub(crate) struct Signature {
    options: Vec<(&'static str, String)>,
    lines: Vec<String>,
}

fn options_of(key: &PlanKey) -> Vec<(&'static str, String)> {
    vec![
        ("passes", if key.passes.is_empty() { "all".into() } else { key.passes.clone() }),
        ("fast_math", key.options.fast_math.to_string()),
        ("streams", key.options.streams.to_string()),
        ("tf32", key.compile.tf32.to_string()),
        ("cuda_graphs", key.compile.cuda_graphs.to_string()),
        ("gemm_tuning", key.compile.gemm_tuning.to_string()),
        ("profiling", key.compile.profile.to_string()),
    ]
}

impl Signature {
    pub(crate) fn new(key: &PlanKey, graph: &Graph) -> Signature {
        let lines = crate::ir::text::print(graph).lines().map(str::to_string).collect();
        Signature { options: options_of(key), lines }
    }
}

/// One node line split up: `%3: f32[4,8] = mul %1, %2 @enc`.
struct Line<'a> {
    ty: &'a str,
    op: &'a str,
    operands: Vec<&'a str>,
    attrs: Vec<&'a str>,
    region: &'a str,
}

fn split(line: &str) -> Option<Line<'_>> {
    let (lhs, rhs) = line.split_once(" = ")?;
    let ty = lhs.split_once(": ")?.1;
    let (rhs, region) = match rhs.rfind(" @") {
        Some(k) => (&rhs[..k], &rhs[k + 2..]),
        None => (rhs, ""),
    };
    let mut words = rhs.split(' ');
    let op = words.next()?;
    let (mut operands, mut attrs) = (Vec::new(), Vec::new());
    for w in words {
        if w.starts_with('%') && attrs.is_empty() {
            operands.push(w.trim_end_matches(','));
        } else {
            attrs.push(w);
        }
    }
    Some(Line { ty, op, operands, attrs, region })
}

/// The `(dtype, shape)` of a type like `f32[4,8]`.
fn type_parts(ty: &str) -> (&str, &str) {
    match ty.find('[') {
        Some(k) => (&ty[..k], &ty[k..]),
        None => (ty, ""),
    }
}

/// The explanation of compiling `now` when `before` was compiled, if
/// they have the same structure (the same line count, ops and operands);
/// `None` when they do not.
pub(crate) fn explain(before: &Signature, now: &Signature) -> Option<Recompile> {
    if before.lines.len() != now.lines.len() {
        return None;
    }
    let pairs: Vec<(Line, Line)> = before
        .lines
        .iter()
        .zip(&now.lines)
        .filter(|(a, _)| a.starts_with('%'))
        .map(|(a, b)| Some((split(a)?, split(b)?)))
        .collect::<Option<_>>()?;
    if pairs.iter().any(|(a, b)| a.op != b.op || a.operands != b.operands) {
        return None;
    }
    for (i, (a, b)) in pairs.iter().enumerate() {
        let at = |l: &Line| if l.region.is_empty() { String::new() } else { format!(" @{}", l.region) };
        let what = format!("%{i} ({}{})", b.op, at(b));
        if a.ty != b.ty {
            let cause = if type_parts(a.ty).0 != type_parts(b.ty).0 {
                RecompileCause::DType
            } else {
                RecompileCause::Shape
            };
            let change = match cause {
                RecompileCause::DType => format!("dtype changed {} -> {}", a.ty, b.ty),
                _ => format!("shape changed {} -> {}", a.ty, b.ty),
            };
            let advice = if b.op == "input" {
                "each new shape compiles once and is cached; if shapes vary every step, pad or bucket them to a few sizes"
            } else {
                "each new shape compiles once and is cached"
            };
            return Some(Recompile {
                cause,
                node: Some(i),
                message: format!("recompiling: {what}: {change}; {advice}"),
            });
        }
        if a.attrs != b.attrs {
            let (old, new) = (a.attrs.join(" "), b.attrs.join(" "));
            let (cause, message) = if b.op == "full" {
                (
                    RecompileCause::Constant,
                    format!(
                        "recompiling: {what}: constant changed {old} -> {new}; a value that changes between runs is baked into the plan as a constant, so every new value compiles again: make it a runtime scalar (`ctx.scalar(v)`) or a variable instead"
                    ),
                )
            } else {
                (
                    RecompileCause::Attribute,
                    format!("recompiling: {what}: attribute changed `{old}` -> `{new}`"),
                )
            };
            return Some(Recompile { cause, node: Some(i), message });
        }
        if a.region != b.region {
            return Some(Recompile {
                cause: RecompileCause::Region,
                node: Some(i),
                message: format!(
                    "recompiling: {what}: region changed @{} -> @{}; regions are part of the plan's key",
                    a.region, b.region
                ),
            });
        }
    }
    let changed: Vec<String> = before
        .options
        .iter()
        .zip(&now.options)
        .filter(|(a, b)| a.1 != b.1)
        .map(|(a, b)| format!("{} {} -> {}", a.0, a.1, b.1))
        .collect();
    if changed.is_empty() {
        return None;
    }
    Some(Recompile {
        cause: RecompileCause::Option,
        node: None,
        message: format!(
            "recompiling: same graph, option changed: {}; plans are cached per option set, so this compiles once per setting",
            changed.join(", ")
        ),
    })
}
