//! Emitting a row kernel's passes: values in the row and column
//! contexts, one column pass (a thread's columns in runs read and written
//! as vectors, their roundings paired where they round to a 16-bit
//! float), and a reduction's accumulate-and-combine.

use super::passes::{available, leaves_of, partial_in_float, pass_cone};
use super::Class;
use crate::backends::cuda::codegen::body::{Body, Leaf};
use crate::backends::cuda::codegen::{paired, types};
use crate::ir::{DType, NodeId, ReduceOp};
use std::collections::HashMap;
use std::fmt::Write;

/// Emission state of one row kernel: its row's shape, what stays in
/// registers (cached operands, kept values), and what the passes so far
/// have loaded.
pub(super) struct Gen<'b, 'a> {
    pub(super) body: &'b Body<'a>,
    pub(super) class: &'b HashMap<NodeId, Class>,
    pub(super) split: usize,
    pub(super) cached: &'b [NodeId],
    /// Leaves that vary by row only, read once a row into `h<id>`.
    pub(super) per_row: &'b [NodeId],
    pub(super) loaded: Vec<NodeId>,
    /// Computed values kept in `k<id>[]` (see
    /// [`super::passes::kept_values`]), and the column pass being emitted.
    pub(super) kept: &'b [(NodeId, usize)],
    pub(super) pass: usize,
    /// Columns a thread takes at once, adjacent (1: one at a time, `col
    /// = lane + it * group`): every column pass reads and writes them as
    /// vectors of this many elements where their layout allows (see
    /// [`Gen::column_pass`]).
    pub(super) width: usize,
    /// Elements of a run computed two at a time, their roundings to a
    /// 16-bit float paired (`super::paired`); only with `width >= 2`.
    pub(super) pairs: bool,
    /// Leaves the current vector pass read as one `kiln::vec<width>`
    /// (`w<id>`).
    pub(super) vectors: Vec<NodeId>,
    pub(super) unrolled: bool,
    pub(super) items: usize,
    pub(super) group: usize,
    pub(super) cols: usize,
}

pub(super) type ColValue<'x> = &'x dyn Fn(&Gen<'_, '_>, NodeId) -> String;

/// One element of a column pass: its column, its item (the index into
/// kept and cached arrays), its slot in the run's vectors, and the suffix
/// of its values' names (`v5`, `v5_1`).
pub(super) struct Element {
    pub(super) col: &'static str,
    item: &'static str,
    pub(super) slot: &'static str,
    suffix: &'static str,
}

/// The element of a pass one column at a time.
pub(super) const SCALAR: Element = Element { col: "col", item: "it", slot: "", suffix: "" };
/// The element of a long row's last columns, past its whole runs (no
/// vectors, nothing kept: long rows keep nothing in registers).
const TAIL: Element = Element { col: "at", item: "", slot: "", suffix: "" };
/// The elements of a run's step: `at`, and `at1` when roundings pair.
const RUN: [Element; 2] = [
    Element { col: "at", item: "it + j", slot: "j", suffix: "" },
    Element { col: "at1", item: "it + j + 1", slot: "j + 1", suffix: "_1" },
];

/// A per-element output a vector pass collects in `o<j>` and stores once
/// a run, at `at` (its pointer at the run's first column).
pub(super) struct VectorOut {
    pub(super) name: String,
    pub(super) storage: &'static str,
    pub(super) at: String,
}

impl Gen<'_, '_> {
    /// A value in the row context (per-row values and leaves at column 0).
    pub(super) fn row_operand(&self, id: NodeId) -> String {
        match self.body.leaves.get(&id) {
            Some(_) if self.per_row.contains(&id) => format!("h{}", id.index()),
            Some(l) => self.leaf_at(id, l, None),
            None => format!("r{}", id.index()),
        }
    }

    /// A leaf's value at the current row and `col` (None: column 0).
    pub(super) fn leaf_at(&self, id: NodeId, l: &Leaf, col: Option<&str>) -> String {
        if l.constant.is_some() {
            return l.read_at("0");
        }
        if l.arange.is_some() {
            // Computed at its offset: no pointer, no row base.
            let c = col.unwrap_or("0");
            let at = match l.access.split_offsets(self.split, "row", c) {
                Some((r, c)) => format!("{r} + {c}"),
                None => l.access.offset_of(&format!("(row * C + {c})")),
            };
            return l.read_at(&at);
        }
        if l.is_uniform() {
            return format!("u{}", id.index());
        }
        match (l.access.single(), col) {
            (Some(_), None) => l.read_at(&format!("rb{}", id.index())),
            (Some(_), Some(c)) => {
                let (_, co) = l.access.split_offsets(self.split, "row", c).unwrap_or_default();
                l.read_at(&format!("rb{} + {co}", id.index()))
            }
            (None, c) => l.read_at(&l.access.offset_of(&format!("(row * C + {})", c.unwrap_or("0")))),
        }
    }

    /// A value inside a column pass, for element `e`.
    pub(super) fn col_operand(&self, id: NodeId, e: &Element) -> String {
        match (self.class[&id], self.body.leaves.get(&id)) {
            (Class::Row, _) => format!("r{}", id.index()),
            _ if available(self.class, self.kept, self.pass, id) => format!("k{}[{}]", id.index(), e.item),
            (_, Some(_)) if self.per_row.contains(&id) => format!("h{}", id.index()),
            (_, Some(_)) if self.cached.contains(&id) && self.loaded.contains(&id) => {
                format!("c{}[{}]", id.index(), e.item)
            }
            (_, Some(l)) if self.vectors.contains(&id) => {
                types::load(l.dtype, &format!("w{}.v[{}]", id.index(), e.slot))
            }
            (_, Some(l)) => self.leaf_at(id, l, Some(e.col)),
            _ => format!("v{}{}", id.index(), e.suffix),
        }
    }

    /// One pass over the row's columns computing `targets` per column, then
    /// `finish(their values, the element)` inside the loop.
    ///
    /// With [`Gen::width`] `w > 1` (every thread has whole runs of `w`
    /// columns) a thread's items `it .. it + w` are the adjacent columns
    /// `col = w * lane + it * group` onwards: an operand whose runs allow
    /// it (`Access::column_runs`) is read with one `w`-element load, the
    /// run's elements are computed in a loop over `j` (two at a time, `at`
    /// and `at1`, with their roundings paired, when [`Gen::pairs`]), and
    /// `stores` (the per-element outputs) are collected in vectors written
    /// once a run. Every pass maps items to columns the same way, so values
    /// kept or cached by one pass are where the next expects them.
    pub(super) fn column_pass(
        &mut self,
        src: &mut String,
        targets: &[NodeId],
        stores: &[VectorOut],
        finish: &dyn Fn(&Gen<'_, '_>, &mut String, ColValue<'_>, &Element),
    ) -> Result<(), String> {
        let (items, group, pass, width) = (self.items, self.group, self.pass, self.width);
        let known = |n: NodeId| available(self.class, self.kept, pass, n);
        let cone = pass_cone(self.body, targets, &known);
        let reads = leaves_of(self.body, targets, &known);
        self.vectors.clear();
        let run = width > 1;
        let elements: &[Element] = match (run, self.pairs) {
            (false, _) => std::slice::from_ref(&SCALAR),
            (true, false) => &RUN[..1],
            (true, true) => &RUN,
        };
        if run && self.unrolled {
            let _ = writeln!(src, "#pragma unroll\n    for (int it = 0; it < {items}; it += {width}) {{");
            let _ = writeln!(src, "      const I col = {width} * lane + it * {group};\n      {{");
            self.run(src, &cone, &reads, elements, stores, finish)?;
        } else if run {
            // A long row: whole runs, then the last columns one at a time.
            let _ = writeln!(src, "    for (I col = {width} * lane; col < C; col += {width} * {group}) {{");
            let _ = writeln!(src, "      if (col + {width} <= C) {{");
            self.run(src, &cone, &reads, elements, stores, finish)?;
            src.push_str("      } else {\n        for (I at = col; at < C; ++at) {\n");
            self.vectors.clear();
            self.elements(src, &cone, &reads, std::slice::from_ref(&TAIL), finish, true)?;
            src.push_str("        }\n");
        } else {
            if self.unrolled {
                let _ = writeln!(src, "#pragma unroll\n    for (int it = 0; it < {items}; ++it) {{");
                let _ = writeln!(src, "      const I col = lane + it * {group};");
                if !self.cols_exact() {
                    let _ = writeln!(src, "      if (col < C) {{");
                } else {
                    let _ = writeln!(src, "      {{");
                }
            } else {
                let _ = writeln!(src, "    for (I col = lane; col < C; col += {group}) {{\n      {{");
            }
            self.elements(src, &cone, &reads, elements, finish, false)?;
        }
        src.push_str("      }\n    }\n");
        // Later passes (and the online pass) read no vector of this one.
        self.vectors.clear();
        self.pass += 1;
        Ok(())
    }

    /// One run at `col`: a vector load of each leaf `reads` whose runs are
    /// aligned, the vectors collecting `stores`, the run's elements in a
    /// `j` loop, then one store of each vector.
    fn run(
        &mut self,
        src: &mut String,
        cone: &[NodeId],
        reads: &[NodeId],
        elements: &[Element],
        stores: &[VectorOut],
        finish: &dyn Fn(&Gen<'_, '_>, &mut String, ColValue<'_>, &Element),
    ) -> Result<(), String> {
        let width = self.width;
        for &id in reads {
            let l = &self.body.leaves[&id];
            let cached = self.cached.contains(&id) && self.loaded.contains(&id);
            if l.operand.is_none() || l.is_uniform() || cached || self.vectors.contains(&id) {
                continue;
            }
            if !l.access.column_runs(self.split, width) || l.dtype.size() * width > 16 {
                continue;
            }
            let Some((_, co)) = l.access.split_offsets(self.split, "row", "col") else { continue };
            let (ty, n, param) = (types::storage(l.dtype), id.index(), l.param());
            let _ = writeln!(
                src,
                "        const kiln::vec{width}<{ty}> w{n} = kiln::load{width}({param} + rb{n} + {co});"
            );
            self.vectors.push(id);
        }
        for out in stores {
            let _ = writeln!(src, "        kiln::vec{width}<{}> {};", out.storage, out.name);
        }
        let (step, at) = match self.pairs {
            true => ("j += 2", "at = col + j, at1 = at + 1"),
            false => ("++j", "at = col + j"),
        };
        let _ = writeln!(src, "#pragma unroll\n        for (int j = 0; j < {width}; {step}) {{");
        let _ = writeln!(src, "          const I {at};");
        self.elements(src, cone, reads, elements, finish, true)?;
        src.push_str("        }\n");
        for out in stores {
            let _ = writeln!(src, "        kiln::store{width}({}, {});", out.at, out.name);
        }
        Ok(())
    }

    /// The statements of one step of a pass over `elements`: cached loads,
    /// the cone, kept values, then `finish` for each element (one level
    /// deeper when `nested`: inside a run's `j` loop or a row's tail).
    fn elements(
        &mut self,
        src: &mut String,
        cone: &[NodeId],
        reads: &[NodeId],
        elements: &[Element],
        finish: &dyn Fn(&Gen<'_, '_>, &mut String, ColValue<'_>, &Element),
        nested: bool,
    ) -> Result<(), String> {
        let indent = if nested { "          " } else { "        " };
        // Load the cached operands this pass is the first to read.
        for &id in self.cached {
            if reads.contains(&id) && !self.loaded.contains(&id) {
                for e in elements {
                    let _ =
                        writeln!(src, "{indent}c{}[{}] = {};", id.index(), e.item, self.col_operand(id, e));
                }
                self.loaded.push(id);
            }
        }
        for &n in cone {
            let v = format!("v{}", n.index());
            if let [first, second] = elements {
                let (a, b) = (|o| self.col_operand(o, first), |o| self.col_operand(o, second));
                for line in paired::statements(self.body, n, [&v, &format!("{v}_1")], [&a, &b])? {
                    let _ = writeln!(src, "{indent}{line}");
                }
            } else {
                let s = self.body.statement(n, &v, &|o| self.col_operand(o, &elements[0]))?;
                let _ = writeln!(src, "{indent}{s}");
            }
        }
        // Keep what later passes read again.
        for &(id, _) in self.kept.iter().filter(|&&(_, p)| p == self.pass) {
            for e in elements {
                let _ = writeln!(src, "{indent}k{0}[{1}] = v{0}{2};", id.index(), e.item, e.suffix);
            }
        }
        let mut body = String::new();
        for e in elements {
            finish(self, &mut body, &|gen, id| gen.col_operand(id, e), e);
        }
        // `finish` writes at 8 spaces, as in a plain pass.
        for line in body.lines() {
            let _ = writeln!(src, "{}{line}", if nested { "  " } else { "" });
        }
        Ok(())
    }

    pub(super) fn cols_exact(&self) -> bool {
        self.items * self.group == self.cols
    }

    /// A reduction node: accumulate over the columns, combine across the
    /// group, settle to the node's dtype as `r<id>`.
    pub(super) fn reduction(&mut self, src: &mut String, id: NodeId, op: ReduceOp) -> Result<(), String> {
        let g = self.body.g;
        let x = g.operands(id)[0];
        let xd = g.node(x).dtype;
        let d = g.node(id).dtype;
        let ct = types::compute(xd);
        let float = xd.is_float();
        let partial = self.unrolled && partial_in_float(op, xd);
        let (acc_ty, init, combine, functor) = match op {
            // A thread's own columns (at most `MAX_ITEMS`) add in float,
            // then the threads' sums in double: one conversion a thread,
            // not one a column (see [`partial_in_float`]).
            ReduceOp::Sum | ReduceOp::Mean if partial => {
                ("float".to_string(), "-0.0f".to_string(), "acc += {X};".to_string(), "kiln::Sum()")
            }
            ReduceOp::Sum | ReduceOp::Mean if float => {
                ("double".to_string(), "-0.0".to_string(), "acc += (double)({X});".to_string(), "kiln::Sum()")
            }
            ReduceOp::Sum | ReduceOp::Mean => (
                "kiln::i64".into(),
                "0".into(),
                "acc = kiln::iadd(acc, (kiln::i64)({X}));".into(),
                "kiln::ISum()",
            ),
            ReduceOp::Max => (
                ct.to_string(),
                types::lowest(xd, true),
                "acc = kiln::Max()(acc, {X});".into(),
                "kiln::Max()",
            ),
            ReduceOp::Min => (
                ct.to_string(),
                types::lowest(xd, false),
                "acc = kiln::Min()(acc, {X});".into(),
                "kiln::Min()",
            ),
            ReduceOp::ArgMax => (
                format!("kiln::Arg<{ct}>"),
                format!("{{{}, (kiln::i64)9223372036854775807LL}}", types::lowest(xd, true)),
                format!("acc = kiln::ArgMax()(acc, kiln::Arg<{ct}>{{{{X}}, (kiln::i64){{COL}}}});"),
                "kiln::ArgMax()",
            ),
        };
        let acc = format!("a{}", id.index());
        let _ = writeln!(src, "    {acc_ty} {acc} = {init};");
        let combine = combine.replace("acc", &acc);
        self.column_pass(src, &[x], &[], &|gen, src, value, e| {
            let _ =
                writeln!(src, "        {}", combine.replace("{X}", &value(gen, x)).replace("{COL}", e.col));
        })?;
        // Float partials combine in double, into a new `a<id>d`.
        let group = self.group;
        let (into, from, acc) = match partial {
            true => (format!("const double {acc}d"), format!("(double){acc}"), format!("{acc}d")),
            false => (acc.clone(), acc.clone(), acc),
        };
        let _ = writeln!(src, "    {into} = kiln::group_reduce<{group}>({from}, {functor});");
        let value = match op {
            ReduceOp::Sum if float => types::cast(DType::F64, d, &acc),
            ReduceOp::Mean => types::cast(DType::F64, d, &format!("({acc} / (double)C)")),
            ReduceOp::Sum => types::settle(d, &acc),
            ReduceOp::Max | ReduceOp::Min => acc.clone(),
            ReduceOp::ArgMax => format!("{acc}.i"),
        };
        let _ = writeln!(src, "    const {} r{} = {value};", types::compute(d), id.index());
        Ok(())
    }
}
