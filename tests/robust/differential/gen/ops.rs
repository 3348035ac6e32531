//! One builder per kind of op: each picks or makes its operands (new
//! sources where it needs them), draws its parameters, and pushes the op;
//! `None` means "this draw did not work", and the caller rolls it back.

use super::super::array::{broadcast, numel};
use super::super::eval::Val;
use super::super::program::{Bin, Cmp, Dt, Instr, Red, Rhs, Source, Un};
use super::{Dist, Gen, MAX_SOURCES};

impl Gen {
    pub(super) fn unary(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.dt != Dt::Bool)?;
        if !self.dt(a).is_float() {
            let ops: Vec<Un> = Un::ALL.into_iter().filter(|u| u.allows_int()).collect();
            let op = self.rng.pick(&ops);
            return self.push(Instr::Unary(op, a));
        }
        let op = self.rng.pick(&Un::ALL);
        let a = match op {
            Un::Log | Un::Sqrt | Un::Rsqrt | Un::Recip => self.positive(a, 0.1)?,
            // kiln computes both as `.. / (1 + exp(-x))`, PyTorch's formula:
            // below x = -88.7 exp(-x) overflows and the result is 0 (or
            // -0), though sigmoid's is a subnormal down to -103 and silu's
            // a normal number (x e^x, -7e-38 at -90). Not compared there.
            Un::Sigmoid | Un::Silu if self.vals[a].arr.values().iter().any(|x| x.mag() > 80.0) => {
                return None
            }
            _ => a,
        };
        self.push(Instr::Unary(op, a))
    }

    fn float_op(&mut self) -> Bin {
        [
            Bin::Add,
            Bin::Add,
            Bin::Sub,
            Bin::Sub,
            Bin::Mul,
            Bin::Mul,
            Bin::Mul,
            Bin::Div,
            Bin::Div,
            Bin::Pow,
            Bin::Maximum,
            Bin::Minimum,
        ][self.rng.range(0, 12)]
    }

    fn int_op(&mut self) -> Bin {
        [Bin::Add, Bin::Sub, Bin::Mul, Bin::Maximum, Bin::Minimum, Bin::Div][self.rng.range(0, 6)]
    }

    pub(super) fn binary(&mut self) -> Option<usize> {
        let a = self.pick(|_| true)?;
        let dt = self.dt(a);
        let op = match dt {
            Dt::Bool => self.rng.pick(&[Bin::Maximum, Bin::Minimum]),
            d if d.is_int() => self.int_op(),
            _ => self.float_op(),
        };
        let shape = self.shape_of(a);
        let max = self.size.max_numel();
        let a = if op == Bin::Pow { self.positive(a, 0.1)? } else { a };
        let dist = match op {
            Bin::Div => Dist::Positive,
            Bin::Pow => Dist::Uniform,
            _ => self.dist(),
        };
        let b = if self.rng.chance(0.4) && op != Bin::Div && op != Bin::Pow {
            self.pick(|v| v.dt == dt && broadcast(&v.arr.shape, &shape).is_some_and(|s| numel(&s) <= max))?
        } else {
            self.partner(dt, &shape, dist)?
        };
        let (a, b) = if self.rng.chance(0.3) && op != Bin::Div && op != Bin::Pow { (b, a) } else { (a, b) };
        self.push(Instr::Binary { op, a, rhs: Rhs::Val(b), reversed: false })
    }

    pub(super) fn scalar_binary(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.dt != Dt::Bool)?;
        let dt = self.dt(a);
        let op = if dt.is_float() { self.float_op() } else { self.int_op() };
        let reversed = op.operator().is_some() && self.rng.chance(0.3);
        let mut c = self.scalar(dt);
        let a = match op {
            Bin::Pow => {
                c = self.rng.pick(&[0.5, 2.0, 3.0, -1.0, 1.5, -0.5]);
                self.positive(a, 0.1)?
            }
            Bin::Div if reversed && dt.is_float() => self.positive(a, 0.1)?,
            // Integer division by an integer tensor near 0 is a different
            // function on each side of it: only exact operands.
            Bin::Div if reversed => a,
            Bin::Div if dt.is_float() && c.abs() < 0.2 => return None,
            _ => a,
        };
        self.push(Instr::Binary { op, a, rhs: Rhs::Scalar(c), reversed })
    }

    fn compare(&mut self) -> Option<usize> {
        let a = self.pick(|_| true)?;
        let dt = self.dt(a);
        let op = self.rng.pick(&Cmp::ALL);
        let shape = self.shape_of(a);
        let max = self.size.max_numel();
        let rhs =
            match self.rng.range(0, 3) {
                0 => Rhs::Scalar(if dt.is_float() {
                    self.rng.pick(&[0.0, 0.5, -0.5, 1.0])
                } else {
                    self.scalar(dt)
                }),
                1 => Rhs::Val(self.pick(|v| {
                    v.dt == dt && broadcast(&v.arr.shape, &shape).is_some_and(|s| numel(&s) <= max)
                })?),
                _ => {
                    let dist = self.dist();
                    Rhs::Val(self.partner(dt, &shape, dist)?)
                }
            };
        self.push(Instr::Compare(op, a, rhs))
    }

    pub(super) fn compare_where(&mut self) -> Option<usize> {
        let c = match self.pick(|v| v.dt == Dt::Bool) {
            Some(c) if self.rng.chance(0.5) => c,
            _ => self.compare()?,
        };
        if self.rng.chance(0.2) {
            return Some(c);
        }
        let cs = self.shape_of(c);
        let max = self.size.max_numel();
        let fits = |v: &Val, with: &[usize]| broadcast(&v.arr.shape, with).is_some_and(|s| numel(&s) <= max);
        let t = match self.pick(|v| v.dt != Dt::Bool && fits(v, &cs)) {
            Some(t) if self.rng.chance(0.7) => t,
            _ => {
                let dist = self.dist();
                self.partner(self.base, &cs, dist)?
            }
        };
        let dt = self.dt(t);
        let ts = broadcast(&cs, &self.shape_of(t))?;
        let f = match self.rng.range(0, 3) {
            0 => Rhs::Scalar(self.scalar(dt)),
            1 => Rhs::Val(self.pick(|v| v.dt == dt && fits(v, &ts))?),
            _ => {
                let dist = self.dist();
                Rhs::Val(self.partner(dt, &ts, dist)?)
            }
        };
        let (t, f) = if self.rng.chance(0.3) { (f, Rhs::Val(t)) } else { (Rhs::Val(t), f) };
        self.push(Instr::Where(c, t, f))
    }

    pub(super) fn cast(&mut self) -> Option<usize> {
        let a = self.pick(|_| true)?;
        let from = self.dt(a);
        let to = self.rng.pick(&Dt::ALL);
        if to == from {
            return None;
        }
        let a = if from.is_float() && to.is_int() && self.rng.chance(0.6) {
            self.push(Instr::Binary { op: Bin::Mul, a, rhs: Rhs::Scalar(4.0), reversed: false })?
        } else {
            a
        };
        self.push(Instr::Cast(a, to))
    }

    /// A random non-empty set of distinct dims of rank `r`, in random order.
    fn dims(&mut self, r: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..r).collect();
        for i in (1..r).rev() {
            all.swap(i, self.rng.range(0, i + 1));
        }
        let n = self.rng.range(1, r + 1);
        all.truncate(n);
        all
    }

    pub(super) fn reduce(&mut self) -> Option<usize> {
        if self.rng.chance(0.1) {
            let a = self.pick(|v| v.dt != Dt::Bool)?;
            return self.push(Instr::SumAll(a));
        }
        let op = self.rng.pick(&[Red::Sum, Red::Sum, Red::Mean, Red::Max, Red::Min]);
        let a = self.pick(|v| {
            v.arr.rank() >= 1
                && match op {
                    Red::Mean => v.dt.is_float(),
                    Red::Sum => v.dt != Dt::Bool,
                    _ => true,
                }
        })?;
        let dims = self.dims(self.vals[a].arr.rank());
        let keepdim = self.rng.chance(0.4);
        self.push(Instr::Reduce { op, a, dims, keepdim })
    }

    pub(super) fn argmax(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.arr.rank() >= 1 && v.dt != Dt::Bool)?;
        let dim = self.rng.range(0, self.vals[a].arr.rank());
        if self.rng.chance(0.5) {
            // x.gather(d, x.argmax(d, true)): the maxima, through an index.
            let index = self.push(Instr::ArgMax { a, dim, keepdim: true })?;
            return self.push(Instr::Gather { a, dim, index });
        }
        let keepdim = self.rng.chance(0.5);
        self.push(Instr::ArgMax { a, dim, keepdim })
    }

    pub(super) fn softmax(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.arr.rank() >= 1 && v.dt.is_float())?;
        let dim = self.rng.range(0, self.vals[a].arr.rank());
        if self.rng.chance(0.5) {
            self.push(Instr::Softmax(a, dim))
        } else {
            self.push(Instr::LogSoftmax(a, dim))
        }
    }

    pub(super) fn layer_norm(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.dt.is_float() && v.arr.shape.last().is_some_and(|&n| n >= 2))?;
        let (dt, n) = (self.dt(a), *self.vals[a].arr.shape.last()?);
        let weight = self.data_source(dt, vec![n], Dist::Positive)?;
        let dist = self.dist();
        let bias = self.data_source(dt, vec![n], dist)?;
        let eps = self.rng.pick(&[1.0 / 1024.0, 1.0 / 64.0, 0.125]);
        self.push(Instr::LayerNorm { a, weight, bias, eps })
    }

    pub(super) fn matmul(&mut self) -> Option<usize> {
        let a =
            self.pick(|v| v.arr.rank() >= 1 && v.dt != Dt::Bool && (v.dt.is_float() || v.arr.numel() <= 24))?;
        let (dt, sa) = (self.dt(a), self.shape_of(a));
        let k = *sa.last()?;
        if sa.len() >= 2 && self.rng.chance(0.2) {
            // a @ a^T (or a^T @ a): one operand read through a transposed view.
            let t = self.push(Instr::T(a))?;
            let (x, y) = if self.rng.chance(0.5) { (a, t) } else { (t, a) };
            return self.push(Instr::MatMul(x, y));
        }
        let n = self.rng.range(1, [6, 20, 70][self.size as usize]);
        let batch_a = if sa.len() > 2 { &sa[..sa.len() - 2] } else { &[][..] };
        let sb: Vec<usize> = match self.rng.range(0, 4) {
            0 => vec![k],
            1 => vec![k, n],
            _ => {
                let mut b: Vec<usize> =
                    batch_a.iter().map(|&d| if self.rng.chance(0.3) { 1 } else { d }).collect();
                if b.is_empty() || self.rng.chance(0.3) {
                    b.insert(0, self.rng.range(1, 4));
                }
                b.extend([k, n]);
                b
            }
        };
        let existing = self.pick(|v| v.dt == dt && v.arr.shape == sb);
        let b = match existing {
            Some(b) if self.rng.chance(0.5) => b,
            _ => {
                let dist = self.dist();
                if numel(&sb) > self.size.max_source() {
                    return None;
                }
                self.data_source(dt, sb, dist)?
            }
        };
        self.push(Instr::MatMul(a, b))
    }

    pub(super) fn view(&mut self) -> Option<usize> {
        let a = self.pick(|_| true)?;
        let s = self.shape_of(a);
        let r = s.len();
        let instr = match self.rng.range(0, 10) {
            0 => {
                // A random factorization of the element count.
                let mut left = numel(&s);
                let mut dims = Vec::new();
                while left > 1 && dims.len() < 3 {
                    let divs: Vec<usize> = (2..=left).filter(|d| left % d == 0).collect();
                    let d = self.rng.pick(&divs);
                    dims.push(d);
                    left /= d;
                    if self.rng.chance(0.2) {
                        dims.push(1);
                    }
                }
                if left > 1 {
                    dims.push(left);
                }
                for i in (1..dims.len()).rev() {
                    dims.swap(i, self.rng.range(0, i + 1));
                }
                Instr::Reshape(a, dims)
            }
            1 => Instr::Flatten(a),
            2 if r >= 2 => {
                let mut p: Vec<usize> = (0..r).collect();
                for i in (1..r).rev() {
                    p.swap(i, self.rng.range(0, i + 1));
                }
                Instr::Permute(a, p)
            }
            3 if r >= 1 => Instr::Transpose(a, self.rng.range(0, r), self.rng.range(0, r)),
            4 if r >= 2 => Instr::T(a),
            5 if r >= 1 => {
                let dim = self.rng.range(0, r);
                let start = self.rng.range(0, s[dim]);
                let len = self.rng.range(1, s[dim] - start + 1);
                Instr::Narrow { a, dim, start, len }
            }
            6 if r >= 1 => {
                let dim = self.rng.range(0, r);
                let start = self.rng.range(0, s[dim]);
                let end = self.rng.range(start + 1, s[dim] + 1);
                Instr::Slice { a, dim, start, end, step: self.rng.range(1, 4) }
            }
            7 => {
                let mut t: Vec<usize> = s
                    .iter()
                    .map(|&d| if d == 1 && self.rng.chance(0.6) { self.rng.range(2, 5) } else { d })
                    .collect();
                if t == s || self.rng.chance(0.4) {
                    t.insert(0, self.rng.range(2, 4));
                }
                Instr::BroadcastTo(a, t)
            }
            8 => match s.iter().position(|&d| d == 1) {
                Some(d) => Instr::Squeeze(a, d),
                None => Instr::Unsqueeze(a, self.rng.range(0, r + 1)),
            },
            _ => Instr::Unsqueeze(a, self.rng.range(0, r + 1)),
        };
        self.push(instr)
    }

    pub(super) fn cat(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.arr.rank() >= 1)?;
        let (dt, s) = (self.dt(a), self.shape_of(a));
        let stack = self.rng.chance(0.3);
        let dim = self.rng.range(0, s.len() + stack as usize);
        let mut parts = vec![a];
        for _ in 0..self.rng.range(1, 3) {
            let like = |v: &Val| {
                v.dt == dt
                    && v.arr.rank() == s.len()
                    && v.arr
                        .shape
                        .iter()
                        .zip(&s)
                        .enumerate()
                        .all(|(i, (x, y))| x == y || (!stack && i == dim))
            };
            let part = match self.rng.range(0, 3) {
                0 => self.pick(like)?,
                1 => a,
                _ => {
                    let mut ps = s.clone();
                    if !stack {
                        ps[dim] = self.rng.range(1, 4);
                    }
                    let dist = self.dist();
                    if numel(&ps) > self.size.max_source() {
                        return None;
                    }
                    self.data_source(dt, ps, dist)?
                }
            };
            parts.push(part);
        }
        for i in (1..parts.len()).rev() {
            parts.swap(i, self.rng.range(0, i + 1));
        }
        self.push(if stack { Instr::Stack(parts, dim) } else { Instr::Cat(parts, dim) })
    }

    pub(super) fn gather(&mut self) -> Option<usize> {
        let a = self.pick(|v| v.arr.rank() >= 1)?;
        let s = self.shape_of(a);
        let dim = self.rng.range(0, s.len());
        if self.rng.chance(0.5) {
            let shape: Vec<usize> = (0..s.len())
                .map(|d| if d == dim { self.rng.range(1, 5) } else { self.rng.range(1, s[d] + 1) })
                .collect();
            let index = self.index_source(shape, s[dim])?;
            self.push(Instr::Gather { a, dim, index })
        } else {
            let len = self.rng.range(1, 6);
            let index = self.index_source(vec![len], s[dim])?;
            self.push(Instr::IndexSelect { a, dim, index })
        }
    }

    /// A 4-d (NCHW) float operand: an existing one, or a new input.
    fn nchw(&mut self) -> Option<usize> {
        match self.pick(|v| v.dt.is_float() && v.arr.rank() == 4) {
            Some(x) if self.rng.chance(0.6) => Some(x),
            _ => {
                let top = [6, 12, 40][self.size as usize];
                let s = vec![
                    self.rng.range(1, 3),
                    self.rng.range(1, 5),
                    self.rng.range(1, top),
                    self.rng.range(1, top),
                ];
                if numel(&s) > self.size.max_source() {
                    return None;
                }
                let dist = self.dist();
                self.data_source(self.base, s, dist)
            }
        }
    }

    pub(super) fn conv_pool(&mut self) -> Option<usize> {
        let x = self.nchw()?;
        let (dt, s) = (self.dt(x), self.shape_of(x));
        let stride = self.rng.range(1, 3);
        if self.rng.chance(0.4) {
            let kernel = self.rng.range(1, 4);
            let padding = self.rng.range(0, kernel / 2 + 1);
            if s[2] + 2 * padding < kernel || s[3] + 2 * padding < kernel {
                return None;
            }
            let max = self.rng.chance(0.5);
            return self.push(Instr::Pool2d { x, max, kernel, stride, padding });
        }
        let c = s[1];
        let divisors: Vec<usize> = (1..=c).filter(|g| c % g == 0).collect();
        let groups = self.rng.pick(&divisors);
        let out = groups * self.rng.range(1, 4);
        let (kh, kw) = (self.rng.range(1, 4), self.rng.range(1, 4));
        let (padding, dilation) = (self.rng.range(0, 2), self.rng.range(1, 3));
        if s[2] + 2 * padding < dilation * (kh - 1) + 1 || s[3] + 2 * padding < dilation * (kw - 1) + 1 {
            return None;
        }
        let dist = self.dist();
        let w = self.data_source(dt, vec![out, c / groups, kh, kw], dist)?;
        self.push(Instr::Conv2d { x, w, stride, padding, dilation, groups })
    }

    pub(super) fn constant(&mut self) -> Option<usize> {
        if self.sources() >= MAX_SOURCES {
            return None;
        }
        let dt = if self.rng.chance(0.8) {
            self.base
        } else {
            self.rng.pick(&[Dt::I32, Dt::I64, Dt::U8, Dt::Bool])
        };
        let (shape, src) = match self.rng.range(0, 5) {
            0 | 1 => (self.shape(self.size.max_source()), Source::Full(self.scalar(dt))),
            2 if dt != Dt::Bool => {
                let n = self.rng.range(1, 9);
                let (start, step) = if dt.is_float() {
                    (self.rng.pick(&[-1.5, -1.0, 0.0, 0.5]), self.rng.pick(&[0.25, 0.5, -0.25, 1.0]))
                } else if dt == Dt::U8 {
                    (self.rng.range(0, 3) as f64, self.rng.range(1, 3) as f64)
                } else {
                    (self.rng.range(0, 7) as f64 - 3.0, self.rng.pick(&[1.0, 2.0, -1.0]))
                };
                (vec![n], Source::Arange { start, step })
            }
            3 => (vec![], Source::Scalar(self.scalar(dt))),
            _ => {
                let shape = self.shape(self.size.max_source());
                let dist = self.dist();
                return self.data_source(dt, shape, dist);
            }
        };
        self.push(Instr::Source { shape, dt, src })
    }
}
