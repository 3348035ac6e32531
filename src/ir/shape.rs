//! Static shapes and numpy broadcasting.

use std::fmt;

/// The dimensions of a tensor, outermost first. `[]` is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar). Saturates instead of
    /// overflowing, so an absurd shape reports a huge size rather than wrap.
    pub fn numel(&self) -> usize {
        self.0.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Checks that a tensor of this shape and `elem_size`-byte elements is
    /// addressable: its byte size, and the byte span of every suffix of its
    /// dimensions (what a contiguous stride is, even past a zero dimension),
    /// fit in `isize::MAX`, the most any allocation or pointer offset can
    /// be. Past this check, element counts, strides and byte offsets of the
    /// tensor and of its views cannot overflow. The message names the type
    /// as `type_name` spells it.
    pub fn check_addressable(&self, elem_size: usize, type_name: &str) -> Result<(), String> {
        let mut span = elem_size.max(1);
        for &d in self.0.iter().rev() {
            span = match span.checked_mul(d.max(1)) {
                Some(s) if s <= isize::MAX as usize => s,
                _ => {
                    return Err(format!(
                    "{type_name}{self} is too large to address: its size in bytes exceeds isize::MAX ({})",
                    isize::MAX
                ))
                }
            };
        }
        Ok(())
    }

    /// Row-major strides, in elements.
    pub fn contiguous_strides(&self) -> Vec<usize> {
        let mut strides = vec![0; self.rank()];
        let mut acc = 1usize;
        for (s, &d) in strides.iter_mut().zip(&self.0).rev() {
            *s = acc;
            acc = acc.saturating_mul(d);
        }
        strides
    }

    /// PyTorch's `view` rule: the strides of `target` over the same elements
    /// as this shape laid out with `strides`, if one strided layout has
    /// them (`None`: a reshape must copy). The memory plan's lifetimes and
    /// the backends' `Layout::reshape` both ask it.
    pub(crate) fn reshape_strides(&self, strides: &[usize], target: &Shape) -> Option<Vec<usize>> {
        let (old, new) = (&self.0[..], &target.0[..]);
        let numel: usize = old.iter().product();
        let contiguous = self.contiguous_strides();
        if numel == 0
            || old.iter().zip(strides.iter().zip(&contiguous)).all(|(&d, (&s, &c))| d == 1 || s == c)
        {
            return Some(target.contiguous_strides());
        }
        let mut out = vec![0usize; new.len()];
        let mut view_d = new.len() as isize - 1;
        let mut chunk_base = *strides.last()?;
        let mut tensor_numel = 1usize;
        let mut view_numel = 1usize;
        for td in (0..old.len()).rev() {
            tensor_numel *= old[td];
            if td == 0 || (old[td - 1] != 1 && strides[td - 1] != tensor_numel * chunk_base) {
                while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                    out[view_d as usize] = view_numel * chunk_base;
                    view_numel *= new[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if td > 0 {
                    chunk_base = strides[td - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == -1).then_some(out)
    }

    /// The numpy broadcast of two shapes: dimensions are aligned on the
    /// right and each pair must be equal or contain a 1. The error names the
    /// first dimension (counted in the result) that disagrees.
    pub fn broadcast(&self, other: &Shape) -> Result<Shape, String> {
        let rank = self.rank().max(other.rank());
        let mut out = vec![0; rank];
        for (i, o) in out.iter_mut().enumerate() {
            let a = dim_from_right(self, rank - 1 - i);
            let b = dim_from_right(other, rank - 1 - i);
            *o = match (a, b) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                (x, y) => {
                    return Err(format!(
                        "shapes {self} and {other} cannot be broadcast: dimension {i} of the result is {x} in one and {y} in the other"
                    ))
                }
            };
        }
        Ok(Shape(out))
    }

    /// True when `self` broadcasts to `target` (numpy rules, one way).
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        self.rank() <= target.rank()
            && self.0.iter().rev().zip(target.0.iter().rev()).all(|(&a, &b)| a == b || a == 1)
    }
}

fn dim_from_right(s: &Shape, from_right: usize) -> usize {
    if from_right < s.rank() {
        s.0[s.rank() - 1 - from_right]
    } else {
        1
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Shape {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Shape {
        Shape(v.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Shape {
        Shape(v.to_vec())
    }
}

impl From<&Shape> for Shape {
    fn from(v: &Shape) -> Shape {
        v.clone()
    }
}

impl From<()> for Shape {
    fn from(_: ()) -> Shape {
        Shape::scalar()
    }
}

impl From<usize> for Shape {
    fn from(d: usize) -> Shape {
        Shape(vec![d])
    }
}
