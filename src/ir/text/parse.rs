//! Text → graph. Hand-written recursive descent over one line at a time;
//! every failure is an `Error::Parse` with the 1-based line.

use crate::ir::verify::{check_node, type_text};
use crate::ir::{
    BinaryOp, BufferId, CompareOp, DType, Distribution, FusedBody, Graph, Node, NodeId, Op, PoolKind,
    ReduceOp, Scalar, Shape, UnaryOp,
};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

mod cursor;
mod plan;
use cursor::Cursor;
use plan::{plan_header, PlanHeader};

/// A pass test file: a `test <pass-name> [settings]` header, the `;;`
/// comment lines right after it, and a graph. The pass-test harness reads
/// these so a test case is data, not Rust code.
#[derive(Clone, Debug)]
pub struct TestFile {
    /// The pass to run (the header's second word).
    pub pass: String,
    /// The header's remaining words, in order (pass-specific settings).
    pub settings: Vec<String>,
    /// The `;;` lines right after the header, without `;;` and one
    /// following space, joined with newlines (trailing blank ones dropped):
    /// what the case shows.
    pub comment: String,
    /// The graph under test.
    pub graph: Graph,
}

/// Parses a plain graph written in the text IR (see the module docs of
/// [`crate::ir::text`]). The returned graph passes `verify`; anything else
/// is an `Error::Parse` naming the line and saying what to change.
pub fn parse(src: &str) -> Result<Graph> {
    parse_graph(src.lines().enumerate().map(|(i, l)| (i + 1, l)), src.lines().count())
}

/// Parses a pass test file: a `test <pass-name> [settings]` header on the
/// first non-blank line, then `;;` comment lines, then a graph. Line
/// numbers in errors count from the top of the file.
pub fn parse_test_file(src: &str) -> Result<TestFile> {
    let mut lines = src.lines().enumerate().map(|(i, l)| (i + 1, l)).peekable();
    while lines.next_if(|(_, l)| l.trim().is_empty()).is_some() {}
    let (header_line, header) = match lines.next() {
        Some((n, l)) => (n, l.trim()),
        None => return Err(parse_err(1, "empty test file: expected a `test <pass-name> [settings]` header")),
    };
    let mut words = header.split_whitespace();
    if words.next() != Some("test") {
        return Err(parse_err(
            header_line,
            format!("expected a `test <pass-name> [settings]` header, found '{}'", clip(header)),
        ));
    }
    let pass = words.next().ok_or_else(|| {
        parse_err(header_line, "the test header needs a pass name: `test <pass-name> [settings]`")
    })?;
    let settings = words.map(str::to_string).collect();
    let mut comment = Vec::new();
    while let Some((_, l)) = lines.next_if(|(_, l)| l.trim_start().starts_with(";;")) {
        let text = &l.trim_start()[2..];
        comment.push(text.strip_prefix(' ').unwrap_or(text).trim_end().to_string());
    }
    let graph = parse_graph(lines, src.lines().count())?;
    Ok(TestFile {
        pass: pass.to_string(),
        settings,
        comment: comment.join("\n").trim_end().to_string(),
        graph,
    })
}

fn parse_err(line: usize, message: impl Into<String>) -> Error {
    Error::Parse { line, message: message.into() }
}

/// At most 24 characters of `s`, for quoting input in messages.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(24).collect();
    if s.chars().count() > 24 {
        out.push_str("...");
    }
    out
}

struct State {
    graph: Graph,
    /// Name → (node, line defined). Only looked up, never iterated.
    names: HashMap<String, (NodeId, usize)>,
    /// Input slot → (type, name, line) of its first definition.
    inputs: BTreeMap<u32, (DType, Shape, String, usize)>,
    /// Nodes in the order their lines define them (the schedule, when the
    /// `plan` line says there is one).
    order: Vec<NodeId>,
    /// The `plan` line, if any.
    plan: Option<PlanHeader>,
    /// Each node's `!key=value` annotations, with their line.
    annotations: Vec<(NodeId, usize, Annotations)>,
}

/// One line's `!key=value` annotations, in order (`value` empty for flags).
type Annotations = Vec<(String, String)>;

fn parse_graph<'a>(lines: impl Iterator<Item = (usize, &'a str)>, total: usize) -> Result<Graph> {
    let lines: Vec<(usize, &'a str)> = lines.collect();
    parse_lines(&lines, total, true)
}

/// [`parse`] without the whole-graph verification at the end: each line is
/// still checked, but plan tables that contradict the graph come through.
/// For tests of the checks that run after parsing (the backends refuse
/// such plans at compile too, as defence in depth).
#[cfg(test)]
pub(crate) fn parse_unverified(src: &str) -> Result<Graph> {
    let lines: Vec<(usize, &str)> = src.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
    parse_lines(&lines, src.lines().count(), false)
}

fn parse_lines(lines: &[(usize, &str)], total: usize, verify: bool) -> Result<Graph> {
    let mut st = State {
        graph: Graph::new(),
        names: HashMap::new(),
        inputs: BTreeMap::new(),
        order: Vec::new(),
        plan: None,
        annotations: Vec::new(),
    };
    let mut returned: Option<usize> = None;
    let mut i = 0;
    while i < lines.len() {
        let (n, raw) = lines[i];
        i += 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with(";;") {
            continue;
        }
        if let Some(r) = returned {
            return Err(parse_err(
                n,
                format!("unexpected text after the `return` on line {r}: the return line ends the graph"),
            ));
        }
        let mut cur = Cursor { s: line, pos: 0, line: n };
        if line.starts_with('%') {
            let body = match line.strip_suffix('{') {
                Some(head) => {
                    cur.s = head;
                    let start = i;
                    while i < lines.len() && lines[i].1.trim() != "}" {
                        if lines[i].1.trim_end().ends_with('{') {
                            return Err(parse_err(lines[i].0, "fused bodies do not nest"));
                        }
                        i += 1;
                    }
                    if i == lines.len() {
                        return Err(parse_err(n, "this fused body has no closing `}` line"));
                    }
                    i += 1;
                    let end_line = lines[i - 1].0;
                    Some(parse_lines(&lines[start..i - 1], end_line, false)?)
                }
                None => None,
            };
            st.definition(&mut cur, body)?;
        } else if line == "}" {
            return Err(parse_err(n, "a `}` without a fused node to close"));
        } else if line.split_whitespace().next() == Some("plan") {
            if st.plan.is_some() || !st.order.is_empty() {
                return Err(parse_err(n, "the `plan` line comes once, before the first definition"));
            }
            cur.word();
            st.plan = Some(plan_header(&mut cur)?);
        } else if cur.word() == Some("return") {
            let outputs = st.operand_list(&mut cur)?;
            if !cur.at_end() {
                return Err(
                    cur.err(format!("expected ',' or the end of the return line, found {}", cur.found()))
                );
            }
            st.graph.set_outputs(outputs);
            returned = Some(n);
        } else if line.starts_with("test ") || line == "test" {
            return Err(parse_err(
                n,
                "a `test <pass>` header belongs only on the first line of a pass test file \
                 (read those with parse_test_file)",
            ));
        } else {
            return Err(parse_err(
                n,
                format!(
                    "expected a definition like `%0: f32[2,3] = add %1, %2` or a `return` line, found '{}'",
                    clip(line)
                ),
            ));
        }
    }
    if returned.is_none() {
        return Err(parse_err(
            total.max(1),
            "missing `return` line at the end (e.g. `return %3`; `return` alone for no outputs)",
        ));
    }
    let plan_line = st.plan.as_ref().map(|p| p.line);
    st.attach_tables()?;
    if verify {
        // Line by line the parser checks each definition; what only the
        // whole graph shows (a schedule listing a dead node, events that
        // do not order the streams) is the verifier's, so a parsed graph
        // passes it.
        crate::ir::verify(&st.graph).map_err(|e| match e {
            Error::Verify(m) => {
                parse_err(plan_line.unwrap_or(total.max(1)), format!("the graph does not verify: {m}"))
            }
            other => other,
        })?;
    }
    Ok(st.graph)
}

impl State {
    fn lookup(&self, cur: &Cursor, name: &str) -> Result<NodeId> {
        match self.names.get(name) {
            Some(&(id, _)) => Ok(id),
            None => Err(cur.err(format!("undefined value %{name} (values must be defined before use)"))),
        }
    }

    /// `%a, %b, ...` (possibly empty when the next token is not a value).
    fn operand_list(&self, cur: &mut Cursor) -> Result<Vec<NodeId>> {
        let mut out = Vec::new();
        if cur.peek() != Some('%') {
            return Ok(out);
        }
        loop {
            let name = cur.value_name()?;
            out.push(self.lookup(cur, name)?);
            if !cur.eat(',') {
                return Ok(out);
            }
            if cur.peek() != Some('%') {
                return Err(cur.err(format!("expected a value after ',', found {}", cur.found())));
            }
        }
    }

    fn definition(&mut self, cur: &mut Cursor, body: Option<Graph>) -> Result<()> {
        let name = cur.value_name()?;
        if let Some(&(_, first)) = self.names.get(name) {
            return Err(cur.err(format!("value %{name} is defined twice (first on line {first})")));
        }
        cur.expect(':', "after the value name (e.g. `%0: f32[2,3] = ...`)")?;
        let dtype_word =
            cur.word().ok_or_else(|| cur.err(format!("expected a dtype, found {}", cur.found())))?;
        let dtype = DType::from_name(dtype_word).ok_or_else(|| {
            let valid: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
            cur.err(format!("unknown dtype '{}' (valid: {})", clip(dtype_word), valid.join(", ")))
        })?;
        cur.expect('[', "after the dtype (a shape like [2,3], or [] for a scalar)")?;
        let dims = cur.list("shape")?;
        let shape = Shape(dims.iter().map(|w| cur.number(w, "a dimension")).collect::<Result<_>>()?);
        cur.expect('=', "after the type")?;
        let mnemonic =
            cur.word().ok_or_else(|| cur.err(format!("expected an op name, found {}", cur.found())))?;
        let kind = kind_of(mnemonic).ok_or_else(|| {
            let mut msg = format!("unknown op '{}'", clip(mnemonic));
            if let Some(s) = suggest(mnemonic) {
                msg.push_str(&format!(" (did you mean '{s}'?)"));
            }
            cur.err(msg)
        })?;
        let operands = self.operand_list(cur)?;
        let mut attrs = cur.attrs(mnemonic)?;
        let annotations = cur.annotations()?;
        let region = if cur.eat('@') {
            let path = cur.rest().trim();
            if path.is_empty() {
                return Err(cur.err("expected a region path after '@' (e.g. `@encoder/layer1`)"));
            }
            Some(path)
        } else {
            None
        };
        if !cur.at_end() {
            return Err(cur.err(format!("unexpected {}", cur.found())));
        }
        let op = match (kind, body) {
            (Kind::Fused, Some(body)) => fused_op(body, &mut attrs).map_err(|m| cur.err(m))?,
            (Kind::Fused, None) => {
                return Err(cur.err("a fused node ends its line with `{`, then its body, then a `}` line"))
            }
            (_, Some(_)) => {
                return Err(cur.err(format!("{mnemonic} has no body; only fused lines end with `{{`")))
            }
            (kind, None) => build_op(kind, mnemonic, &mut attrs, &shape, dtype).map_err(|m| cur.err(m))?,
        };
        attrs.finish(mnemonic).map_err(|m| cur.err(m))?;
        let types: Vec<(&Shape, DType)> = operands
            .iter()
            .map(|&o| {
                let n = self.graph.node(o);
                (&n.shape, n.dtype)
            })
            .collect();
        check_node(&op, &types, &shape, dtype).map_err(|m| cur.err(format!("%{name} ({mnemonic}): {m}")))?;
        if let Op::Input(slot) = op {
            if let Some((d, s, first, line)) = self.inputs.get(&slot) {
                if *d != dtype || *s != shape {
                    return Err(cur.err(format!(
                        "%{name} (input): input slot {slot} is declared {} here but {} at %{first} on line {line}",
                        type_text(dtype, &shape),
                        type_text(*d, s)
                    )));
                }
            } else {
                self.inputs.insert(slot, (dtype, shape.clone(), name.to_string(), cur.line));
            }
        }
        let region = match region {
            Some(path) => self.graph.region_path(path),
            None => crate::ir::RegionId::ROOT,
        };
        let id = self.graph.add_unchecked(Node { op, shape, dtype, region }, &operands);
        self.names.insert(name.to_string(), (id, cur.line));
        self.order.push(id);
        if !annotations.is_empty() {
            self.annotations.push((id, cur.line, annotations));
        }
        Ok(())
    }
}

enum Attr<'a> {
    /// A bare word: a positional value (`input 0`) or a flag (`keepdim`).
    Bare,
    Word(&'a str),
    List(Vec<&'a str>),
}

/// The attributes of one line, consumed by the op builder; whatever is left
/// is an error.
struct Attrs<'a> {
    items: Vec<(&'a str, Attr<'a>)>,
}

impl<'a> Attrs<'a> {
    fn take(&mut self, key: &str, op: &str, example: &str) -> Result<Attr<'a>, String> {
        let i = self
            .items
            .iter()
            .position(|(k, v)| *k == key && !matches!(v, Attr::Bare))
            .ok_or_else(|| format!("{op} needs attribute {key}= (e.g. `{example}`)"))?;
        Ok(self.items.remove(i).1)
    }

    fn word(&mut self, key: &str, op: &str, example: &str) -> Result<&'a str, String> {
        match self.take(key, op, example)? {
            Attr::Word(w) => Ok(w),
            _ => Err(format!("attribute {key} of {op} takes one value, not a list (e.g. `{example}`)")),
        }
    }

    fn usize(&mut self, key: &str, op: &str, example: &str) -> Result<usize, String> {
        let w = self.word(key, op, example)?;
        w.parse().map_err(|_| format!("{key} must be a non-negative integer, found '{}'", clip(w)))
    }

    fn list(&mut self, key: &str, op: &str, example: &str) -> Result<Vec<usize>, String> {
        match self.take(key, op, example)? {
            Attr::List(ws) => ws
                .iter()
                .map(|w| {
                    w.parse()
                        .map_err(|_| format!("{key} must list non-negative integers, found '{}'", clip(w)))
                })
                .collect(),
            _ => Err(format!("attribute {key} of {op} takes a list (e.g. `{example}`)")),
        }
    }

    fn pair(&mut self, key: &str, op: &str, example: &str) -> Result<[usize; 2], String> {
        match self.list(key, op, example)?[..] {
            [a, b] => Ok([a, b]),
            _ => Err(format!("{key} of {op} takes two values (height, width), e.g. `{example}`")),
        }
    }

    fn flag(&mut self, key: &str) -> bool {
        match self.items.iter().position(|(k, v)| *k == key && matches!(v, Attr::Bare)) {
            Some(i) => {
                self.items.remove(i);
                true
            }
            None => false,
        }
    }

    /// The one positional word (`input 0`, `full 0.5`).
    fn positional(&mut self, op: &str, what: &str, example: &str) -> Result<&'a str, String> {
        let i = self
            .items
            .iter()
            .position(|(_, v)| matches!(v, Attr::Bare))
            .ok_or_else(|| format!("{op} needs {what} (e.g. `{example}`)"))?;
        Ok(self.items.remove(i).0)
    }

    fn finish(&self, op: &str) -> Result<(), String> {
        match self.items.first() {
            None => Ok(()),
            Some((k, Attr::Bare)) => Err(format!("unexpected '{}' after {op}", clip(k))),
            Some((k, _)) => Err(format!("{op} has no attribute '{}'", clip(k))),
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Input,
    Buffer,
    Full,
    Arange,
    Random(Distribution),
    Reshape,
    Permute,
    Expand,
    Slice,
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    Where,
    Cast,
    Reduce(ReduceOp),
    MatMul,
    Conv2d,
    Pool(PoolKind),
    Gather,
    IndexSelect,
    Cat,
    Fused,
}

const FIXED: &[(&str, Kind)] = &[
    ("input", Kind::Input),
    ("buffer", Kind::Buffer),
    ("full", Kind::Full),
    ("arange", Kind::Arange),
    ("rand", Kind::Random(Distribution::Uniform)),
    ("randn", Kind::Random(Distribution::Normal)),
    ("reshape", Kind::Reshape),
    ("permute", Kind::Permute),
    ("expand", Kind::Expand),
    ("slice", Kind::Slice),
    ("where", Kind::Where),
    ("cast", Kind::Cast),
    ("matmul", Kind::MatMul),
    ("conv2d", Kind::Conv2d),
    ("max_pool2d", Kind::Pool(PoolKind::Max)),
    ("avg_pool2d", Kind::Pool(PoolKind::Avg)),
    ("gather", Kind::Gather),
    ("index_select", Kind::IndexSelect),
    ("cat", Kind::Cat),
    ("fused", Kind::Fused),
];

/// Every mnemonic with its kind, in a fixed order.
fn all_kinds() -> impl Iterator<Item = (&'static str, Kind)> {
    FIXED
        .iter()
        .copied()
        .chain(UnaryOp::ALL.iter().map(|&u| (u.mnemonic(), Kind::Unary(u))))
        .chain(BinaryOp::ALL.iter().map(|&b| (b.mnemonic(), Kind::Binary(b))))
        .chain(CompareOp::ALL.iter().map(|&c| (c.mnemonic(), Kind::Compare(c))))
        .chain(ReduceOp::ALL.iter().map(|&r| (r.mnemonic(), Kind::Reduce(r))))
}

fn kind_of(mnemonic: &str) -> Option<Kind> {
    all_kinds().find(|(m, _)| *m == mnemonic).map(|(_, k)| k)
}

/// The known mnemonic closest to a misspelt one (edit distance <= 2).
fn suggest(word: &str) -> Option<&'static str> {
    if word.len() > 40 {
        return None;
    }
    // Ties go to a name with the same first letter (`mull` -> `mul`, not `full`).
    let first = word.chars().next();
    let (best, d, _) = all_kinds()
        .map(|(m, _)| (m, edit_distance(word, m), m.chars().next() != first))
        .min_by_key(|&(_, d, other_start)| (d, other_start))?;
    (d <= 2 && d < word.chars().count()).then_some(best)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn scalar(text: &str, dtype: DType, what: &str) -> Result<Scalar, String> {
    Scalar::parse(text, dtype).ok_or_else(|| {
        let hint = match dtype {
            DType::Bool => " (expected true or false)".to_string(),
            d if d.is_float() => " (expected a number, inf, -inf or nan)".to_string(),
            d => format!(" (expected an integer that fits {d})"),
        };
        format!("{what} '{}' is not a valid {dtype} value{hint}", clip(text))
    })
}

/// A fused op from its parsed body; `kind=` must name the body's kind.
fn fused_op(body: Graph, a: &mut Attrs) -> Result<Op, String> {
    let body = FusedBody::new(body).map_err(|m| format!("fused body: {m}"))?;
    let kind = a.word("kind", "fused", "fused %a, %b kind=elementwise {")?;
    if kind != body.kind().name() {
        return Err(format!(
            "the body is a {} kernel, but the line says kind={}",
            body.kind().name(),
            clip(kind)
        ));
    }
    Ok(Op::Fused(Arc::new(body)))
}

fn build_op(kind: Kind, m: &str, a: &mut Attrs, shape: &Shape, dtype: DType) -> Result<Op, String> {
    Ok(match kind {
        Kind::Input => {
            let w = a.positional(m, "a slot number", "input 0")?;
            Op::Input(w.parse().map_err(|_| {
                format!("input slot must be an integer from 0 to {}, found '{}'", u32::MAX, clip(w))
            })?)
        }
        Kind::Buffer => {
            let w = a.positional(m, "a buffer id", "buffer 3")?;
            Op::Buffer(BufferId(
                w.parse()
                    .map_err(|_| format!("buffer id must be a non-negative integer, found '{}'", clip(w)))?,
            ))
        }
        Kind::Full => Op::Full(scalar(a.positional(m, "a value", "full 0.5")?, dtype, "full value")?),
        Kind::Arange => {
            let start = scalar(a.word("start", m, "arange start=0 step=1")?, dtype, "arange start")?;
            let step = scalar(a.word("step", m, "arange start=0 step=1")?, dtype, "arange step")?;
            Op::Arange { start, step }
        }
        Kind::Random(dist) => {
            let w = a.word("stream", m, "randn stream=0")?;
            let stream = w
                .parse()
                .map_err(|_| format!("stream must be a non-negative integer, found '{}'", clip(w)))?;
            Op::Random { dist, stream }
        }
        Kind::Reshape => Op::Reshape(shape.clone()),
        Kind::Expand => Op::Expand(shape.clone()),
        Kind::Cast => Op::Cast(dtype),
        Kind::Permute => Op::Permute(a.list("perm", m, "permute %x perm=[1,0]")?),
        Kind::Slice => {
            let ex = "slice %x dim=0 start=0 step=1 len=2";
            Op::Slice {
                dim: a.usize("dim", m, ex)?,
                start: a.usize("start", m, ex)?,
                step: a.usize("step", m, ex)?,
                len: a.usize("len", m, ex)?,
            }
        }
        Kind::Unary(u) => Op::Unary(u),
        Kind::Binary(b) => Op::Binary(b),
        Kind::Compare(c) => Op::Compare(c),
        Kind::Where => Op::Where,
        Kind::MatMul => Op::MatMul,
        Kind::Reduce(op) => {
            let dims = a.list("dims", m, &format!("{m} %x dims=[1] keepdim"))?;
            Op::Reduce { op, dims, keepdim: a.flag("keepdim") }
        }
        Kind::Conv2d => {
            let ex = "conv2d %x, %w stride=[1,1] padding=[0,0] dilation=[1,1] groups=1";
            Op::Conv2d {
                stride: a.pair("stride", m, ex)?,
                padding: a.pair("padding", m, ex)?,
                dilation: a.pair("dilation", m, ex)?,
                groups: a.usize("groups", m, ex)?,
            }
        }
        Kind::Pool(kind) => {
            let ex = format!("{m} %x kernel=[2,2] stride=[2,2] padding=[0,0]");
            Op::Pool2d {
                kind,
                kernel: a.pair("kernel", m, &ex)?,
                stride: a.pair("stride", m, &ex)?,
                padding: a.pair("padding", m, &ex)?,
            }
        }
        Kind::Gather => Op::Gather { dim: a.usize("dim", m, "gather %x, %i dim=1")? },
        Kind::IndexSelect => Op::IndexSelect { dim: a.usize("dim", m, "index_select %x, %i dim=0")? },
        Kind::Cat => Op::Cat { dim: a.usize("dim", m, "cat %a, %b dim=0")? },
        Kind::Fused => {
            return Err("a fused node ends its line with `{`, then its body, then a `}` line".into())
        }
    })
}
