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
//! a plain reduction body. `%v` is no other output.

use super::{FusedBody, FusedKind};
use crate::ir::{Graph, NodeId, Op, Scalar};

/// A padded output 0 (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Padded {
    /// The computed value: the first columns of each output row.
    pub value: NodeId,
    /// Columns of the value's rows (the domain's last dim).
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
    let node = graph.node(out);
    let rank = node.shape.rank();
    let bad = |why: &str| Err(format!("{out} (cat): a padded output {why}"));
    if rank == 0 || dim != rank - 1 {
        return bad("concatenates along the last dim");
    }
    let parts = graph.operands(out);
    let value = parts[0];
    if super::is_leaf_or_leaf_view(graph, value) {
        return bad("starts with a computed value, not a leaf");
    }
    let v = graph.node(value);
    let cols = v.shape.0[dim];
    let mut fills = Vec::new();
    let mut width = cols;
    for &f in &parts[1..] {
        let fill = graph.node(f);
        let Op::Full(c) = fill.op else { return bad("pads with `full` constants only") };
        if fill.dtype != v.dtype || fill.shape.0[..dim] != v.shape.0[..dim] {
            return bad("pads with constants of its value's dtype and rows");
        }
        fills.push((fill.shape.0[dim], c));
        width += fill.shape.0[dim];
    }
    if fills.is_empty() {
        return bad("has padding after its value");
    }
    if graph.outputs()[1..].contains(&value) {
        return bad("is its value's only output");
    }
    Ok(Some(Padded { value, cols, width, fills }))
}

/// Whether the body without its cat (of kind `kind`) may pad its rows:
/// a reduction over the last dim only, whose value has the domain's shape.
pub(super) fn check_kind(graph: &Graph, padded: &Padded, kind: &FusedKind) -> Result<(), String> {
    match kind {
        FusedKind::Reduction { domain, split }
            if *split + 1 == domain.rank() && graph.node(padded.value).shape == *domain =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{} (cat): only a row kernel over the last dim pads its output, at its domain's shape",
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
        let leading = "%x: f32[4,3] = input 0\n%s: f32[4,1] = sum %x dims=[1] keepdim\n\
            %sb: f32[4,3] = expand %s\n%y: f32[4,3] = div %x, %sb\n%z: f32[1,3] = full 0\n\
            %p: f32[5,3] = cat %y, %z dim=0\nreturn %p\n";
        assert!(body(leading).unwrap_err().contains("along the last dim"));
    }
}
