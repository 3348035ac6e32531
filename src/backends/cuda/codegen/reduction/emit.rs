//! Emitting a row kernel's passes: values in the row and column
//! contexts, one column pass (its columns paired where they round to a
//! 16-bit float), and a reduction's accumulate-and-combine.

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
    pub(super) loaded: Vec<NodeId>,
    /// Computed values kept in `k<id>[]` (see
    /// [`super::passes::kept_values`]), and the column pass being emitted.
    pub(super) kept: &'b [(NodeId, usize)],
    pub(super) pass: usize,
    /// Columns two adjacent at a time (`col`, `col1 = col + 1`), their
    /// roundings paired, in every column pass (see [`Gen::column_pass`]).
    pub(super) pairs: bool,
    /// Leaves the current paired pass read as one `kiln::vec2` (`w<id>`).
    pub(super) vectors: Vec<NodeId>,
    pub(super) unrolled: bool,
    pub(super) items: usize,
    pub(super) group: usize,
    pub(super) cols: usize,
}

pub(super) type ColValue<'x> = &'x dyn Fn(&Gen<'_, '_>, NodeId) -> String;

impl Gen<'_, '_> {
    /// A value in the row context (per-row values and leaves at column 0).
    pub(super) fn row_operand(&self, id: NodeId) -> String {
        match self.body.leaves.get(&id) {
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

    /// A value inside a column pass, at the pass's column `col`.
    pub(super) fn col_operand(&self, id: NodeId) -> String {
        self.col_operand_at(id, 0)
    }

    /// A value inside a column pass for element `k` of a pair (see
    /// [`Gen::column_pass`]): 0 at `col` (item `it`), 1 at `col1 = col + 1`
    /// (item `it + 1`).
    pub(super) fn col_operand_at(&self, id: NodeId, k: usize) -> String {
        let (col, item, suffix) = if k == 0 { ("col", "it", "") } else { ("col1", "it + 1", "_1") };
        match (self.class[&id], self.body.leaves.get(&id)) {
            (Class::Row, _) => format!("r{}", id.index()),
            _ if available(self.class, self.kept, self.pass, id) => format!("k{}[{item}]", id.index()),
            (_, Some(_)) if self.cached.contains(&id) && self.loaded.contains(&id) => {
                format!("c{}[{item}]", id.index())
            }
            (_, Some(l)) if self.vectors.contains(&id) => {
                types::load(l.dtype, &format!("w{}.v[{k}]", id.index()))
            }
            (_, Some(l)) => self.leaf_at(id, l, Some(col)),
            _ => format!("v{}{suffix}", id.index()),
        }
    }

    /// One pass over the row's columns computing `targets` per column, then
    /// `finish(their values, the column)` inside the loop. With
    /// [`Gen::pairs`] (every thread has an even number of whole columns,
    /// and the body rounds to a 16-bit float) a thread's columns go two
    /// adjacent at a time: items `it` and `it + 1` are columns `col = 2 *
    /// lane + it * group` and `col1 = col + 1`, an operand whose columns
    /// pair (`Access::column_pairs`) is read with one two-element load,
    /// their roundings are paired (`super::paired`), and `finish` runs for
    /// each. Every pass maps items to columns the same way, so values kept
    /// or cached by one pass are where the next expects them.
    pub(super) fn column_pass(
        &mut self,
        src: &mut String,
        targets: &[NodeId],
        finish: &dyn Fn(&Gen<'_, '_>, &mut String, ColValue<'_>, &str),
    ) -> Result<(), String> {
        let (items, group, pass) = (self.items, self.group, self.pass);
        let known = |n: NodeId| available(self.class, self.kept, pass, n);
        let cone = pass_cone(self.body, targets, &known);
        let pair = self.pairs;
        let reads = leaves_of(self.body, targets, &known);
        self.vectors.clear();
        if pair {
            let _ = writeln!(src, "#pragma unroll\n    for (int it = 0; it < {items}; it += 2) {{");
            let _ = writeln!(src, "      const I col = 2 * lane + it * {group}, col1 = col + 1;\n      {{");
            for &id in &reads {
                let l = &self.body.leaves[&id];
                let cached = self.cached.contains(&id) && self.loaded.contains(&id);
                if l.operand.is_none() || l.is_uniform() || cached || self.vectors.contains(&id) {
                    continue;
                }
                if !l.access.column_pairs(self.split) {
                    continue;
                }
                let Some((_, co)) = l.access.split_offsets(self.split, "row", "col") else { continue };
                let (ty, n, param) = (types::storage(l.dtype), id.index(), l.param());
                let _ = writeln!(
                    src,
                    "        const kiln::vec2<{ty}> w{n} = kiln::load2({param} + rb{n} + {co});"
                );
                self.vectors.push(id);
            }
        } else if self.unrolled {
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
        // Load the cached operands this pass is the first to read.
        for &id in self.cached {
            if reads.contains(&id) && !self.loaded.contains(&id) {
                let _ = writeln!(src, "        c{}[it] = {};", id.index(), self.col_operand_at(id, 0));
                if pair {
                    let _ =
                        writeln!(src, "        c{}[it + 1] = {};", id.index(), self.col_operand_at(id, 1));
                }
                self.loaded.push(id);
            }
        }
        for n in cone {
            let v = format!("v{}", n.index());
            if pair {
                let (first, second) = (|o| self.col_operand_at(o, 0), |o| self.col_operand_at(o, 1));
                for line in paired::statements(self.body, n, [&v, &format!("{v}_1")], [&first, &second])? {
                    let _ = writeln!(src, "        {line}");
                }
            } else {
                let s = self.body.statement(n, &v, &|o| self.col_operand(o))?;
                let _ = writeln!(src, "        {s}");
            }
        }
        // Keep what later passes read again.
        for &(id, _) in self.kept.iter().filter(|&&(_, p)| p == pass) {
            let _ = writeln!(src, "        k{0}[it] = v{0};", id.index());
            if pair {
                let _ = writeln!(src, "        k{0}[it + 1] = v{0}_1;", id.index());
            }
        }
        finish(self, src, &|gen, id| gen.col_operand_at(id, 0), "col");
        if pair {
            finish(self, src, &|gen, id| gen.col_operand_at(id, 1), "col1");
        }
        src.push_str("      }\n    }\n");
        self.pass += 1;
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
                format!("acc = kiln::ArgMax()(acc, kiln::Arg<{ct}>{{{{X}}, (kiln::i64)col}});"),
                "kiln::ArgMax()",
            ),
        };
        let acc = format!("a{}", id.index());
        let _ = writeln!(src, "    {acc_ty} {acc} = {init};");
        let combine = combine.replace("acc", &acc);
        self.column_pass(src, &[x], &|gen, src, value, _| {
            let _ = writeln!(src, "        {}", combine.replace("{X}", &value(gen, x)));
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
