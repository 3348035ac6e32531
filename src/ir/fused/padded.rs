//! Padded rows: a row kernel that writes its rows into a wider buffer,
//! constant columns after each.
//!
//! *Why.* The gradient of a slice along the last dim is the gradient
//! followed by zero columns (`cat %g, %zeros`). GPT-2's LM head
//! multiplies by the embedding padded to a multiple of 8 rows (aligned
//! rows for cuBLAS's tensor-core GEMMs, `Gpt2::lm_head`), and its logits
//! are the first 50257 of 50264 columns; so the loss's row kernel wrote
//! its gradient `[4096, 50257]`, and a `cat` kernel copied it into
//! `[4096, 50264]` next to 7 zero columns: 412 MB read and 412 MB written
//! in bf16, about 0.22 ms of a 11.7 ms training step on an H200. The row
//! kernel can write each row where the cat would have put it, and the
//! zeros after it: the `multi-output` pass makes the cat the body's
//! output 0 (`passes/multi_output/pad.rs`).
//!
//! *The form.* Output 0 of a reduction body that reduces its last dim
//! only (`split = rank - 1`) may be `cat %v, %f1, .. dim=rank-1`, where
//! `%v` is a computed value of the domain's shape and each `%fi` is a
//! `full` of `%v`'s dtype with the domain's shape but for its last dim.
//! The fused node's value is the cat's, `[.., C + P]`; the domain stays
//! `[.., C]`, and the body without the cat ([`FusedBody::unpadded`]) is
//! a plain reduction body. `%v` is no other output. An elementwise body
//! may be padded along dim 0 the same way: its value, then the fills,
//! one after the other in memory (the bf16 copy of GPT-2's embedding,
//! padded with zero rows for the LM head's product).

use super::{FusedBody, FusedKind};
use crate::ir::{Graph, NodeId, Op, Scalar};

/// A padded output 0 (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Padded {
    /// The computed value: the first columns of each output row.
    pub value: NodeId,
    /// The dim the cat joins along: a *row* is an index of the dims
    /// before it, its *columns* the elements from it on (a row kernel's
    /// rows; one row for dim 0).
    pub dim: usize,
    /// Columns of the value's rows.
    pub cols: usize,
    /// Columns of the output's rows: `cols` plus every fill's.
    pub width: usize,
    /// The constant columns after the value, in order: how many, and
    /// their value.
    pub fills: Vec<(usize, Scalar)>,
}

impl Padded {
    /// The fill at output column `col` (`cols <= col < width`).
    pub fn fill_at(&self, col: usize) -> Option<Scalar> {
        let mut end = self.cols;
        for &(n, v) in &self.fills {
            end += n;
            if col < end {
                return Some(v);
            }
        }
        None
    }
}

/// The padded output 0 of `graph` if its output 0 is a `cat` (an error
/// when the cat is not of the padded form); `None` otherwise. Checks the
/// cat alone; [`check_kind`] checks it against the body's kind.
pub(super) fn form(graph: &Graph) -> Result<Option<Padded>, String> {
    let Some(&out) = graph.outputs().first() else { return Ok(None) };
    let Op::Cat { dim } = graph.node(out).op else { return Ok(None) };
    let bad = |why: &str| Err(format!("{out} (cat): a padded output {why}"));
    let parts = graph.operands(out);
    let value = parts[0];
    if super::is_leaf_or_leaf_view(graph, value) {
        return bad("starts with a computed value, not a leaf");
    }
    let v = graph.node(value);
    // Elements of one row from `dim` on: a row is everything before it.
    let per_row = |s: &crate::ir::Shape| s.0[dim..].iter().product::<usize>();
    let cols = per_row(&v.shape);
    let mut fills = Vec::new();
    let mut width = cols;
    for &f in &parts[1..] {
        let fill = graph.node(f);
        let Op::Full(c) = fill.op else { return bad("pads with `full` constants only") };
        if fill.dtype != v.dtype {
            return bad("pads with constants of its value's dtype");
        }
        fills.push((per_row(&fill.shape), c));
        width += per_row(&fill.shape);
    }
    if fills.is_empty() {
        return bad("has padding after its value");
    }
    if graph.outputs()[1..].contains(&value) {
        return bad("is its value's only output");
    }
    Ok(Some(Padded { value, dim, cols, width, fills }))
}

/// Whether the body without its cat (of kind `kind`) may pad so: a
/// reduction over the last dim only, padded along it, or an elementwise
/// body padded along dim 0 (one row: the value, then the fills); the
/// value has the domain's shape.
pub(super) fn check_kind(graph: &Graph, padded: &Padded, kind: &FusedKind) -> Result<(), String> {
    let shape = &graph.node(padded.value).shape;
    match kind {
        FusedKind::Reduction { domain, split }
            if *split + 1 == domain.rank() && padded.dim == *split && shape == domain =>
        {
            Ok(())
        }
        FusedKind::Elementwise if padded.dim == 0 => Ok(()),
        _ => Err(format!(
            "{} (cat): only a row kernel over the last dim pads along it, and an elementwise body along dim 0",
            graph.outputs()[0]
        )),
    }
}

/// The padded output 0 of body graph `graph`, if it has one (a body
/// [`FusedBody::new`] accepted): for backends that generate code from the
/// body's graph.
pub fn padded_output(graph: &Graph) -> Option<Padded> {
    form(graph).ok().flatten()
}

/// `graph` with output 0 replaced by `value`: the body without its cat.
pub fn without_cat(graph: &Graph, value: NodeId) -> Graph {
    let mut inner = graph.clone();
    let mut outputs = graph.outputs().to_vec();
    outputs[0] = value;
    inner.set_outputs(outputs);
    inner
}

impl FusedBody {
    /// Output 0's padding, if it is a padded output (module docs).
    pub fn padded(&self) -> Option<Padded> {
        padded_output(&self.graph)
    }

    /// This body without its padding (output 0 is the padded output's
    /// value), or the body itself: what a backend that pads separately
    /// computes first.
    pub fn unpadded(&self) -> FusedBody {
        match self.padded() {
            Some(p) => FusedBody {
                graph: without_cat(&self.graph, p.value),
                kind: self.kind.clone(),
                inputs: self.inputs,
                over: self.over.clone(),
            },
            None => self.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::text::parse;

    fn body(src: &str) -> Result<FusedBody, String> {
        FusedBody::new(parse(src).expect("parses"))
    }

    /// A softmax whose rows are padded with two zero columns and one of 1.
    const SOFTMAX: &str = "%x: f32[4,3] = input 0\n%m: f32[4,1] = max %x dims=[1] keepdim\n\
        %mb: f32[4,3] = expand %m\n%d: f32[4,3] = sub %x, %mb\n%e: f32[4,3] = exp %d\n\
        %s: f32[4,1] = sum %e dims=[1] keepdim\n%sb: f32[4,3] = expand %s\n\
        %y: f32[4,3] = div %e, %sb\n%z: f32[4,2] = full 0\n%o: f32[4,1] = full 1\n\
        %p: f32[4,6] = cat %y, %z, %o dim=1\nreturn %p, %s\n";

    #[test]
    fn a_padded_row_kernel_is_a_reduction_over_its_domain() {
        let b = body(SOFTMAX).expect("a padded softmax is legal");
        assert_eq!(*b.kind(), FusedKind::Reduction { domain: crate::ir::Shape::new([4, 3]), split: 1 });
        let p = b.padded().expect("padded");
        assert_eq!((p.cols, p.width), (3, 6));
        assert_eq!(p.fills, vec![(2, Scalar::Float(0.0)), (1, Scalar::Float(1.0))]);
        assert_eq!(
            (p.fill_at(3), p.fill_at(4), p.fill_at(5), p.fill_at(6)),
            (Some(Scalar::Float(0.0)), Some(Scalar::Float(0.0)), Some(Scalar::Float(1.0)), None)
        );
        let inner = b.unpadded();
        assert_eq!(inner.padded(), None);
        assert_eq!(inner.graph().node(inner.output()).shape, crate::ir::Shape::new([4, 3]));
        assert_eq!(inner.outputs().len(), 2, "the extra outputs stay");
    }

    #[test]
    fn other_cats_say_why_they_are_not_padded_outputs() {
        let leaf_first = SOFTMAX.replace("cat %y, %z, %o", "cat %x, %z, %o");
        assert!(body(&leaf_first).unwrap_err().contains("starts with a computed value"));
        let computed_pad = SOFTMAX.replace("%o: f32[4,1] = full 1", "%o: f32[4,1] = exp %m");
        assert!(body(&computed_pad).unwrap_err().contains("`full` constants only"));
        let twice = SOFTMAX.replace("return %p, %s", "return %p, %y");
        assert!(body(&twice).unwrap_err().contains("its value's only output"));
        let elementwise = "%x: f32[4,3] = input 0\n%e: f32[4,3] = exp %x\n%z: f32[4,1] = full 0\n\
            %p: f32[4,4] = cat %e, %z dim=1\nreturn %p\n";
        assert!(body(elementwise).unwrap_err().contains("only a row kernel over the last dim"));
        let rows_of_elementwise = "%x: f32[4,3] = input 0\n%e: f32[4,3] = exp %x\n%z: f32[2,3] = full 0\n\
            %p: f32[6,3] = cat %e, %z dim=0\nreturn %p\n";
        let b = body(rows_of_elementwise).expect("an elementwise body pads along dim 0");
        let p = b.padded().expect("padded");
        assert_eq!((p.dim, p.cols, p.width, p.fills.clone()), (0, 12, 18, vec![(6, Scalar::Float(0.0))]));
        let leading = "%x: f32[4,3] = input 0\n%s: f32[4,1] = sum %x dims=[1] keepdim\n\
            %sb: f32[4,3] = expand %s\n%y: f32[4,3] = div %x, %sb\n%z: f32[1,3] = full 0\n\
            %p: f32[5,3] = cat %y, %z dim=0\nreturn %p\n";
        assert!(body(leading).unwrap_err().contains("only a row kernel over the last dim pads along it"));
    }
}
