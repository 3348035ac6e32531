//! Strided layouts: how a logical shape maps onto storage elements, the
//! zero-copy view transforms, and iteration over strided offsets. Both
//! backends use them: the CPU's buffers carry one, and the CUDA lowering
//! describes the views its kernels read with the same type.
//!
//! Element `(i0, .., in)` of a layout lives at storage index
//! `offset + sum(ik * strides[k])`. Strides are in elements and never
//! negative; a stride of 0 repeats an element (expand).

use crate::ir::Shape;

/// Shape, strides (elements) and offset of a view into storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Logical shape.
    pub shape: Shape,
    /// Step in storage per step along each dimension.
    pub strides: Vec<usize>,
    /// Storage index of the first element.
    pub offset: usize,
}

impl Layout {
    /// Row-major dense layout at offset 0.
    pub fn contiguous(shape: Shape) -> Layout {
        let strides = shape.contiguous_strides();
        Layout { shape, strides, offset: 0 }
    }

    /// Number of logical elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// True when the elements are row-major dense from `offset` (strides of
    /// size-1 dimensions do not matter), so kernels may read a plain slice.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.0.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// Output dim `i` is input dim `perm[i]` (perm already validated).
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: Shape(perm.iter().map(|&p| self.shape.0[p]).collect()),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Numpy broadcast to `target`: new leading dims and expanded size-1
    /// dims get stride 0.
    pub fn expand(&self, target: &Shape) -> Layout {
        let lead = target.rank() - self.shape.rank();
        let strides = (0..target.rank())
            .map(|i| {
                if i < lead || (self.shape.0[i - lead] == 1 && target.0[i] != 1) {
                    0
                } else {
                    self.strides[i - lead]
                }
            })
            .collect();
        Layout { shape: target.clone(), strides, offset: self.offset }
    }

    /// `len` elements of `dim` from `start`, every `step`-th. With one
    /// element or none the stride along `dim` is never stepped, so it stays
    /// as it was: a step past the end (`usize::MAX` is valid) would make
    /// it overflow, and walking the view adds it once past the last element.
    pub fn slice(&self, dim: usize, start: usize, step: usize, len: usize) -> Layout {
        let mut out = self.clone();
        if len > 0 {
            out.offset += start * self.strides[dim];
        }
        if len > 1 {
            out.strides[dim] *= step;
        }
        out.shape.0[dim] = len;
        out
    }

    /// The same elements in row-major order under a new shape, as a view
    /// if the strides allow it (PyTorch's `view` rule); `None` means the
    /// caller must copy.
    pub fn reshape(&self, target: &Shape) -> Option<Layout> {
        let strides = self.shape.reshape_strides(&self.strides, target)?;
        Some(Layout { shape: target.clone(), strides, offset: self.offset })
    }

    /// Storage offsets of the elements in row-major order, starting at
    /// logical index `start`.
    pub fn offsets(&self, start: usize) -> Offsets {
        Offsets::new(&self.shape.0, &self.strides, self.offset, start)
    }

    /// One past the largest storage index the layout touches (0 if empty);
    /// used to check a layout fits its storage before unchecked use.
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset + self.shape.0.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }
}

/// An odometer over a strided layout: yields one storage offset per call
/// to [`Offsets::next_offset`], in row-major logical order.
pub struct Offsets {
    shape: Vec<usize>,
    strides: Vec<usize>,
    index: Vec<usize>,
    offset: usize,
}

impl Offsets {
    /// Positions the odometer at logical element `start`.
    pub fn new(shape: &[usize], strides: &[usize], base: usize, start: usize) -> Offsets {
        let mut index = vec![0; shape.len()];
        let mut offset = base;
        if !shape.contains(&0) {
            let mut rem = start;
            for d in (0..shape.len()).rev() {
                index[d] = rem % shape[d];
                rem /= shape[d];
                offset += index[d] * strides[d];
            }
        }
        Offsets { shape: shape.to_vec(), strides: strides.to_vec(), index, offset }
    }

    /// Restarts at logical element 0 of a layout whose first element is
    /// at `base` (reuses the buffers: reductions call this per output).
    #[inline]
    pub fn reset(&mut self, base: usize) {
        self.index.iter_mut().for_each(|i| *i = 0);
        self.offset = base;
    }

    /// The current offset; then advances by one element.
    #[inline(always)]
    pub fn next_offset(&mut self) -> usize {
        let cur = self.offset;
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.offset += self.strides[d];
            if self.index[d] < self.shape[d] {
                return cur;
            }
            self.offset -= self.strides[d] * self.shape[d];
            self.index[d] = 0;
        }
        cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(l: &Layout) -> Vec<usize> {
        let mut it = l.offsets(0);
        (0..l.numel()).map(|_| it.next_offset()).collect()
    }

    #[test]
    fn views_and_offsets() {
        let l = Layout::contiguous(Shape::new([2, 3]));
        assert!(l.is_contiguous());
        let t = l.permute(&[1, 0]);
        assert_eq!(all(&t), vec![0, 3, 1, 4, 2, 5]);
        assert!(!t.is_contiguous());
        let mut it = t.offsets(3);
        assert_eq!(it.next_offset(), 4);
        let e = Layout::contiguous(Shape::new([3, 1])).expand(&Shape::new([2, 3, 2]));
        assert_eq!(all(&e), vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
        let s = l.slice(1, 1, 2, 1);
        assert_eq!(all(&s), vec![1, 4]);
        assert_eq!(s.extent(), 5);
    }

    #[test]
    fn reshape_views_where_possible() {
        let l = Layout::contiguous(Shape::new([4, 6]));
        // A column slice keeps rows separable: [4,3] -> [2,2,3] is a view.
        let s = l.slice(1, 0, 1, 3);
        let r = s.reshape(&Shape::new([2, 2, 3])).unwrap();
        assert_eq!(all(&r), all(&s));
        // A transpose cannot be flattened without a copy.
        assert!(l.permute(&[1, 0]).reshape(&Shape::new([24])).is_none());
        // Splitting a transposed dim is a view.
        let t = l.permute(&[1, 0]);
        let r = t.reshape(&Shape::new([2, 3, 4])).unwrap();
        assert_eq!(all(&r), all(&t));
    }
}
