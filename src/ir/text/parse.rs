//! Text → graph. Hand-written recursive descent over one line at a time;
//! every failure is an `Error::Parse` with the 1-based line.

use crate::ir::verify::{check_node, type_text};
use crate::ir::{DType, Graph, Node, NodeId, Op, RegionAutocast, RegionId, Shape};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};

mod cursor;
mod ops;
mod plan;
use cursor::Cursor;
use ops::{build_op, fused_op, kind_of, suggest, Attr, Attrs, Kind};
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
        } else if line.split_whitespace().next() == Some("region") {
            if !st.order.is_empty() {
                return Err(parse_err(n, "`region` lines come before the first definition"));
            }
            region_line(&mut st.graph, line, n)?;
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
            (kind, None) => build_op(kind, mnemonic, &mut attrs, &shape, dtype, self.graph.next_effect_seq())
                .map_err(|m| cur.err(m))?,
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
        if let Some(seq) = op.effect_seq() {
            if let Some(&other) =
                self.order.iter().find(|&&o| self.graph.node(o).op.effect_seq() == Some(seq))
            {
                let (first, line) = self
                    .names
                    .iter()
                    .find(|(_, v)| v.0 == other)
                    .map(|(n, v)| (n.as_str(), v.1))
                    .unwrap_or(("?", 0));
                return Err(cur.err(format!(
                    "%{name} ({mnemonic}): seq={seq} is taken by %{first} on line {line}; every collective has a sequence number of its own"
                )));
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

/// `region encoder/layer1 autocast=bf16` (or `f16`, `off`): a region's own
/// autocast setting.
fn region_line(graph: &mut Graph, line: &str, n: usize) -> Result<()> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let usage = "expected `region <path> autocast=bf16|f16|off`";
    let (path, setting) = match words.as_slice() {
        ["region", path, setting] => (*path, *setting),
        _ => return Err(parse_err(n, format!("{usage}, found '{}'", clip(line)))),
    };
    let autocast = match setting.strip_prefix("autocast=") {
        Some("off") => RegionAutocast::Off,
        Some(name) => match DType::from_name(name) {
            Some(d @ (DType::BF16 | DType::F16)) => RegionAutocast::Low(d),
            _ => return Err(parse_err(n, format!("autocast runs in bf16 or f16 (or is off), not `{name}`"))),
        },
        None => return Err(parse_err(n, format!("{usage}, found '{}'", clip(line)))),
    };
    let id = graph.region_path(path);
    if id == RegionId::ROOT {
        return Err(parse_err(
            n,
            "the root region takes the context's autocast (a test header's `autocast=`), not a `region` line",
        ));
    }
    graph.set_region_autocast(id, autocast);
    Ok(())
}
