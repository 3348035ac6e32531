//! Where an element lives: index arithmetic from a position in a kernel's
//! domain to a storage offset, generated as C expressions with the shapes
//! baked in.
//!
//! An [`Access`] is a chain of strided layouts. The first stage maps its
//! multi-index to a storage offset; each later stage maps its multi-index
//! to a row-major linear index into the previous stage's shape. Views
//! compose into the last stage (permute, expand and slice always do;
//! reshape does when the strides allow, PyTorch's view rule). A reshape
//! that no strides can express starts a new stage, so a kernel can read
//! any chain of views in place, with a few more divisions, and no view is
//! ever copied.
//!
//! Expressions are minimal for the common cases: adjacent dimensions that
//! are contiguous with each other merge, size-1 and stride-0 dimensions
//! vanish, so a dense operand is read at `base + i` and a broadcast row
//! vector at `i % n`.

use crate::backends::Layout;
use crate::ir::{Op, Shape};

/// How to find the element of a position in its storage (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    /// Outermost (storage) first; the last stage is indexed by the consumer.
    stages: Vec<Layout>,
}

impl Access {
    /// One strided layout over storage.
    pub fn strided(layout: Layout) -> Access {
        Access { stages: vec![layout] }
    }

    /// The shape a consumer indexes.
    pub fn shape(&self) -> &Shape {
        &self.last().shape
    }

    fn last(&self) -> &Layout {
        self.stages.last().expect("an access has at least one stage")
    }

    /// The single strided layout, when no reshape broke the chain.
    pub fn single(&self) -> Option<&Layout> {
        (self.stages.len() == 1).then(|| &self.stages[0])
    }

    /// This access seen through one more view op.
    pub fn view(&self, op: &Op) -> Access {
        let mut stages = self.stages.clone();
        let last = stages.pop().expect("an access has at least one stage");
        match op {
            Op::Reshape(target) => match last.reshape(target) {
                Some(l) => stages.push(l),
                None => {
                    stages.push(last);
                    stages.push(Layout::contiguous(target.clone()));
                }
            },
            Op::Permute(p) => stages.push(last.permute(p)),
            Op::Expand(t) => stages.push(last.expand(t)),
            Op::Slice { dim, start, step, len } => stages.push(last.slice(*dim, *start, *step, *len)),
            _ => stages.push(last),
        }
        Access { stages }
    }

    /// True when every position reads the same element.
    pub fn is_uniform(&self) -> bool {
        self.last().strides.iter().zip(&self.last().shape.0).all(|(&s, &d)| s == 0 || d == 1)
            || self.last().shape.numel() <= 1
    }

    /// The storage offset of the first element when positions map to
    /// consecutive elements (`base + i`), else `None`.
    pub fn dense_base(&self) -> Option<usize> {
        let l = self.single()?;
        l.is_contiguous().then_some(l.offset)
    }

    /// True when positions `i .. i + step`, for every `i` that is a
    /// multiple of `step`, read `step` consecutive storage elements that
    /// start at a multiple of `step`: the innermost dim is contiguous and
    /// a multiple of `step` long, and every other stride and the offset
    /// are multiples of `step`. A bias broadcast over rows is such an
    /// operand: an elementwise kernel then reads a thread's run of it with
    /// one vector load at [`Access::offset_of`] its first position.
    ///
    /// Later stages that are plain reshapes (dense, offset 0) keep runs:
    /// consecutive positions are consecutive row-major indices of the
    /// stage before (heads read as `[b, s, h, d]` and merged to `[b, s,
    /// h·d]`: a permute, then a reshape no strides express).
    pub fn runs_of(&self, step: usize) -> bool {
        let (l, later) = self.stages.split_first().expect("an access has at least one stage");
        if !later.iter().all(|r| r.is_contiguous() && r.offset == 0) {
            return false;
        }
        let (Some((&last, _)), Some((&inner, outer))) = (l.shape.0.split_last(), l.strides.split_last())
        else {
            return false;
        };
        step > 0
            && last % step == 0
            && inner == 1
            && l.offset % step == 0
            && outer.iter().all(|s| s % step == 0)
    }

    /// True when, split at `split` into rows and columns, each row's
    /// columns are consecutive in storage and every run of `step` columns
    /// `step j .. step j + step` starts at a multiple of `step` elements:
    /// the column dims are row-major and dense, and the row strides and the
    /// offset multiples of `step`. A row kernel then reads a thread's
    /// `step` adjacent columns with one load (a bias or layer norm weight
    /// broadcast over rows is such an operand: its row stride is 0). A
    /// row's last run may pass its end when the columns are not a multiple
    /// of `step` (a vocabulary of 50257 in rows padded to 50264): the
    /// caller reads only whole runs that way.
    pub fn column_runs(&self, split: usize, step: usize) -> bool {
        let Some(l) = self.single() else { return false };
        if split > l.shape.rank() || step == 0 {
            return false;
        }
        let mut expected = 1;
        for (&d, &s) in l.shape.0[split..].iter().zip(&l.strides[split..]).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        l.offset % step == 0 && l.strides[..split].iter().all(|s| s % step == 0)
    }

    /// One more than the largest value any index expression of this
    /// access takes (0 for an empty shape): decides whether 32-bit indices
    /// suffice. Every stage counts, not only the storage one: a later
    /// stage computes a row-major index into the shape before it, which
    /// can be far larger than the storage (an expand to a huge shape,
    /// reshaped, then sliced with a large step, reads a few elements of a
    /// tiny buffer through indices past 2^31).
    pub fn extent(&self) -> u128 {
        let mut most = 0u128;
        for stage in &self.stages {
            if stage.shape.numel() == 0 {
                return 0;
            }
            let reach = stage.offset as u128
                + stage
                    .shape
                    .0
                    .iter()
                    .zip(&stage.strides)
                    .map(|(&d, &s)| (d as u128 - 1) * s as u128)
                    .sum::<u128>()
                + 1;
            most = most.max(reach).max(stage.shape.numel() as u128);
        }
        most
    }

    /// The storage offset (a C expression) of row-major position `lin` of
    /// the last stage's shape.
    pub fn offset_of(&self, lin: &str) -> String {
        let mut expr = lin.to_string();
        for stage in self.stages.iter().rev() {
            expr = unravel_dot(&expr, &stage.shape.0, &stage.strides, stage.offset);
        }
        expr
    }

    /// For a single-stage access split at `split`: the offset contributed
    /// by the leading dims at row-major position `row` of `shape[..split]`
    /// (base offset included), and by the trailing dims at `col`.
    pub fn split_offsets(&self, split: usize, row: &str, col: &str) -> Option<(String, String)> {
        let l = self.single()?;
        if split > l.shape.rank() {
            return None;
        }
        let r = unravel_dot(row, &l.shape.0[..split], &l.strides[..split], l.offset);
        let c = unravel_dot(col, &l.shape.0[split..], &l.strides[split..], 0);
        Some((r, c))
    }
}

/// `offset + sum(((x / P_d) % D_d) * S_d)` over the merged dims.
fn unravel_dot(x: &str, shape: &[usize], strides: &[usize], offset: usize) -> String {
    // Drop size-1 dims, then merge neighbours that are contiguous with each
    // other (outer stride = inner stride * inner size; zero strides merge too).
    let mut dims: Vec<(usize, usize)> = Vec::new();
    for (&d, &s) in shape.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if d == 0 {
            return offset.to_string();
        }
        dims.push((d, s));
    }
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (d, s) in dims {
        match merged.last_mut() {
            Some((pd, ps)) if *ps == s * d => {
                *pd *= d;
                *ps = s;
            }
            _ => merged.push((d, s)),
        }
    }
    let mut terms: Vec<String> = Vec::new();
    let mut inner = 1usize;
    let n = merged.len();
    let mut after: Vec<usize> = vec![1; n];
    for i in (0..n).rev() {
        after[i] = inner;
        inner = inner.saturating_mul(merged[i].0);
    }
    for (i, &(d, s)) in merged.iter().enumerate() {
        if s == 0 {
            continue;
        }
        let mut t = x.to_string();
        if after[i] != 1 {
            t = format!("({t} / {})", after[i]);
        }
        if i != 0 {
            t = format!("({t} % {d})");
        }
        if s != 1 {
            t = format!("{t} * {s}");
        }
        terms.push(t);
    }
    if offset != 0 || terms.is_empty() {
        terms.insert(0, offset.to_string());
    }
    if terms.len() == 1 {
        terms.pop().unwrap_or_default()
    } else {
        format!("({})", terms.join(" + "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(s: &[usize]) -> Access {
        Access::strided(Layout::contiguous(Shape::new(s.to_vec())))
    }

    #[test]
    fn dense_is_the_index_itself() {
        assert_eq!(dense(&[4, 8]).offset_of("i"), "i");
        assert_eq!(dense(&[4, 8]).dense_base(), Some(0));
    }

    #[test]
    fn broadcast_row_and_column() {
        let row = dense(&[8]).view(&Op::Expand(Shape::new([4, 8])));
        assert_eq!(row.offset_of("i"), "(i % 8)");
        let col = dense(&[4, 1]).view(&Op::Expand(Shape::new([4, 8])));
        assert_eq!(col.offset_of("i"), "(i / 8)");
        assert!(dense(&[1]).view(&Op::Expand(Shape::new([4, 8]))).is_uniform());
    }

    #[test]
    fn runs_are_consecutive_aligned_pieces_of_the_innermost_dim() {
        let bias = dense(&[96]).view(&Op::Expand(Shape::new([32, 96])));
        assert!(bias.runs_of(8) && bias.runs_of(4));
        assert!(!dense(&[36]).view(&Op::Expand(Shape::new([2, 36]))).runs_of(8), "36 is no multiple of 8");
        // heads merged: [b, h, s, d] read as [b, s, h, d], d = 16 contiguous
        let heads = dense(&[2, 3, 4, 16]).view(&Op::Permute(vec![0, 2, 1, 3]));
        assert!(heads.runs_of(4) && heads.runs_of(8) && heads.runs_of(16) && !heads.runs_of(32));
        // a transpose's innermost dim is strided; a slice may start off a run
        assert!(!dense(&[8, 8]).view(&Op::Permute(vec![1, 0])).runs_of(4));
        assert!(!dense(&[4, 12]).view(&Op::Slice { dim: 1, start: 2, step: 1, len: 8 }).runs_of(4));
        assert!(dense(&[4, 12]).view(&Op::Slice { dim: 1, start: 4, step: 1, len: 8 }).runs_of(4));
        // ... and merged to [b, s, h·d]: a second stage, a plain reshape
        let merged = heads.view(&Op::Reshape(Shape::new([2, 4, 48])));
        assert!(merged.single().is_none() && merged.runs_of(16) && !merged.runs_of(32));
        let odd = dense(&[2, 3, 4, 6])
            .view(&Op::Permute(vec![0, 2, 1, 3]))
            .view(&Op::Reshape(Shape::new([2, 4, 18])));
        assert!(!odd.runs_of(4), "runs of 4 would cross heads of 6");
        // a column broadcast along the innermost dim is no run
        assert!(!dense(&[4, 1]).view(&Op::Expand(Shape::new([4, 8]))).runs_of(4));
    }

    #[test]
    fn column_runs_need_dense_rows_a_multiple_of_the_run() {
        assert!(dense(&[4, 6]).column_runs(1, 2));
        assert!(!dense(&[4, 5]).column_runs(1, 2), "odd rows put a pair across two rows");
        assert!(dense(&[4, 8]).column_runs(1, 8) && !dense(&[4, 12]).column_runs(1, 8));
        let gamma = dense(&[6]).view(&Op::Expand(Shape::new([4, 6])));
        assert!(
            gamma.column_runs(1, 2) && gamma.column_runs(1, 4),
            "row stride 0: the last run passes the end"
        );
        // rows padded to a multiple of the run: whole runs stay aligned
        let padded = dense(&[3, 16]).view(&Op::Slice { dim: 1, start: 0, step: 1, len: 13 });
        assert!(
            padded.column_runs(1, 8)
                && !padded.view(&Op::Slice { dim: 1, start: 1, step: 1, len: 12 }).column_runs(1, 8)
        );
        assert!(!dense(&[6, 4]).view(&Op::Permute(vec![1, 0])).column_runs(1, 2), "strided columns");
        assert!(!dense(&[4, 7]).view(&Op::Slice { dim: 1, start: 1, step: 1, len: 6 }).column_runs(1, 2));
        // a slice that starts on a run keeps runs, one that starts inside one does not
        assert!(dense(&[4, 12]).view(&Op::Slice { dim: 1, start: 4, step: 1, len: 8 }).column_runs(1, 4));
        assert!(!dense(&[4, 12]).view(&Op::Slice { dim: 1, start: 2, step: 1, len: 8 }).column_runs(1, 4));
        assert!(dense(&[2, 3, 4]).column_runs(1, 2) && dense(&[2, 3, 4]).column_runs(2, 4));
        assert!(!dense(&[3, 4]).column_runs(1, 0), "a run of nothing");
    }

    #[test]
    fn transpose_and_slice() {
        let t = dense(&[3, 5]).view(&Op::Permute(vec![1, 0]));
        assert_eq!(t.offset_of("i"), "((i / 3) + (i % 3) * 5)");
        let s = dense(&[9, 5]).view(&Op::Slice { dim: 0, start: 1, step: 2, len: 4 });
        assert_eq!(s.offset_of("i"), "(5 + (i / 5) * 10 + (i % 5))");
    }

    #[test]
    fn reshape_of_a_transpose_adds_a_stage() {
        let t = dense(&[2, 3]).view(&Op::Permute(vec![1, 0])).view(&Op::Reshape(Shape::new([6])));
        assert!(t.single().is_none());
        // position i of [6] is element (i / 2, i % 2) of the [3,2] transpose.
        assert_eq!(t.offset_of("i"), "((i / 2) + (i % 2) * 3)");
    }

    #[test]
    fn the_extent_bounds_every_stage_of_a_chain() {
        // [3,1] expanded to [3, 2^30] (strides [1, 0]), reshaped to
        // [3 * 2^30] (no strides express it: a second stage), sliced with
        // step 2^30: three elements of a three-element buffer, through a
        // stage index up to 2 * 2^30, past what `int` holds.
        let t = dense(&[3, 1])
            .view(&Op::Expand(Shape::new([3, 1 << 30])))
            .view(&Op::Reshape(Shape::new([3 << 30])))
            .view(&Op::Slice { dim: 0, start: 0, step: 1 << 30, len: 3 });
        assert!(t.single().is_none());
        assert_eq!(t.shape().numel(), 3);
        assert!(t.extent() > i32::MAX as u128, "{}", t.extent());
    }

    #[test]
    fn split_offsets_separate_rows_and_columns() {
        let a = dense(&[4, 3, 5]);
        assert_eq!(a.split_offsets(1, "r", "c"), Some(("r * 15".into(), "c".into())));
    }
}
