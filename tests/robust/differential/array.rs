//! The reference's own strided N-d array: a shape, strides and an offset
//! over shared elements, so views (permute, slice, expand) are re-indexing
//! without copies, as kiln's are, and a reshape copies only when the
//! layout is not row-major.

use std::rc::Rc;

/// A value as the reference knows it: `mid` is the exact (real-number)
/// result of the program on its inputs, computed in f64, and `rad` bounds
/// how far any correct implementation in the program's dtypes may land
/// from it. `rad = inf` means "unknown" (the element is not compared).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Iv {
    pub mid: f64,
    pub rad: f64,
}

impl Iv {
    pub const UNKNOWN: Iv = Iv { mid: f64::NAN, rad: f64::INFINITY };

    pub fn exact(v: f64) -> Iv {
        Iv { mid: v, rad: 0.0 }
    }

    /// The interval `[lo, hi]`, widened outward by the f64 rounding of its
    /// midpoint and radius.
    pub fn bounds(lo: f64, hi: f64) -> Iv {
        if !(lo.is_finite() && hi.is_finite()) || lo > hi {
            return Iv::UNKNOWN;
        }
        let mid = 0.5 * lo + 0.5 * hi;
        let rad = (hi - mid).max(mid - lo);
        Iv { mid, rad: rad + if rad > 0.0 { f64::EPSILON * mid.abs() } else { 0.0 } }
    }

    pub fn lo(self) -> f64 {
        self.mid - self.rad
    }

    pub fn hi(self) -> f64 {
        self.mid + self.rad
    }

    /// The largest magnitude in the interval.
    pub fn mag(self) -> f64 {
        self.mid.abs() + self.rad
    }

    pub fn known(self) -> bool {
        self.mid.is_finite() && self.rad.is_finite()
    }

    /// Both intervals (a value that is one or the other).
    pub fn hull(self, other: Iv) -> Iv {
        if !self.known() || !other.known() {
            return Iv::UNKNOWN;
        }
        Iv::bounds(self.lo().min(other.lo()), self.hi().max(other.hi()))
    }
}

#[derive(Clone, Debug)]
pub struct Arr {
    pub shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
    data: Rc<Vec<Iv>>,
}

/// The most elements [`Arr::build`] computes (16 MiB of intervals); the
/// generator's own limits are far below it.
pub const BUILD_LIMIT: usize = 1 << 20;

/// Whether an array of `shape` is past [`BUILD_LIMIT`] (or its count
/// overflows).
fn too_big(shape: &[usize]) -> bool {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > BUILD_LIMIT)
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc *= shape[d];
    }
    strides
}

/// Calls `f` with every multi-index of `shape`, row-major.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The numpy broadcast of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let x = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
        let y = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
        out[i] = match (x, y) {
            _ if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

impl Arr {
    pub fn new(shape: Vec<usize>, data: Vec<Iv>) -> Arr {
        assert_eq!(numel(&shape), data.len(), "reference: data does not fit {shape:?}");
        Arr { strides: row_major(&shape), shape, offset: 0, data: Rc::new(data) }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    pub fn at(&self, idx: &[usize]) -> Iv {
        let at: usize = idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>() + self.offset;
        self.data[at]
    }

    /// The elements in row-major order.
    pub fn values(&self) -> Vec<Iv> {
        let mut out = Vec::with_capacity(self.numel());
        for_each_index(&self.shape, |idx| out.push(self.at(idx)));
        out
    }

    /// A new array of `shape` whose element at `idx` is `f(idx)` (or
    /// [`Arr::unknown`] past [`BUILD_LIMIT`] elements).
    pub fn build(shape: &[usize], mut f: impl FnMut(&[usize]) -> Iv) -> Arr {
        if too_big(shape) {
            return Arr::unknown(shape);
        }
        let mut data = Vec::with_capacity(numel(shape));
        for_each_index(shape, |idx| data.push(f(idx)));
        Arr::new(shape.to_vec(), data)
    }

    /// Every element unknown, through zero strides: what an op past
    /// [`BUILD_LIMIT`] elements gives instead of computing (a generated op
    /// may ask for gigabytes, such as an outer product of two long
    /// vectors), so the generator rejects it without allocating it.
    pub fn unknown(shape: &[usize]) -> Arr {
        Arr {
            shape: shape.to_vec(),
            strides: vec![0; shape.len()],
            offset: 0,
            data: Rc::new(vec![Iv::UNKNOWN]),
        }
    }

    pub fn map(&self, f: impl Fn(Iv) -> Iv) -> Arr {
        if too_big(&self.shape) {
            return Arr::unknown(&self.shape);
        }
        Arr::new(self.shape.clone(), self.values().into_iter().map(f).collect())
    }

    pub fn permute(&self, perm: &[usize]) -> Arr {
        Arr {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            data: self.data.clone(),
        }
    }

    /// Elements `start, start + step, ...` (`len` of them) of `dim`.
    pub fn slice(&self, dim: usize, start: usize, step: usize, len: usize) -> Arr {
        let mut out = self.clone();
        out.offset += start * self.strides[dim];
        out.strides[dim] *= step;
        out.shape[dim] = len;
        out
    }

    /// Numpy broadcast to `shape` (stride 0 where a dim repeats).
    pub fn expand(&self, shape: &[usize]) -> Arr {
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for d in 0..self.rank() {
            assert!(
                self.shape[d] == shape[lead + d] || self.shape[d] == 1,
                "reference: cannot expand {:?} to {shape:?}",
                self.shape
            );
            strides[lead + d] = if self.shape[d] == shape[lead + d] { self.strides[d] } else { 0 };
        }
        Arr { shape: shape.to_vec(), strides, offset: self.offset, data: self.data.clone() }
    }

    /// The same elements, row-major, in `shape`.
    pub fn reshape(&self, shape: &[usize]) -> Arr {
        assert_eq!(numel(shape), self.numel(), "reference: reshape {:?} to {shape:?}", self.shape);
        if too_big(shape) {
            return Arr::unknown(shape);
        }
        Arr::new(shape.to_vec(), self.values())
    }
}
