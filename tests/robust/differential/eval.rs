//! The reference: evaluates a [`Program`] in f64 with a rigorous bound on
//! every element, written for this test from the ops' documented meaning
//! (PyTorch's), without calling kiln.
//!
//! # The bound
//!
//! Each element is an [`Iv`]: `mid` is the exact result of the program on
//! its inputs (in f64: real arithmetic up to f64 rounding), and `rad`
//! bounds how far a correct implementation in the program's dtypes can be
//! from it. `rad` is carried by midpoint-radius interval arithmetic: an op
//! maps the input intervals to an interval that holds every value it can
//! take on them (monotone functions at the ends, products and quotients at
//! the corners, Lipschitz bounds for sin, cos, gelu and silu), then adds
//! the op's own rounding in its dtype:
//!
//! - `(u + k * w + 4 * 2^-53) * |result| + tiny`, where `u` is the
//!   dtype's unit roundoff (2^-11 f16, 2^-8 bf16, 2^-24 f32, 2^-53 f64),
//!   `w` that of the type kernels compute in (f32 for halves), `k` the
//!   ulps the op may lose there (1 for `+ - * /` and sqrt, 2 for rsqrt, 4
//!   for exp, log, tanh, sigmoid, silu, gelu, sin, cos, pow: CUDA's
//!   documented maxima are 1-2 ulp, kiln's CPU kernels measure under
//!   1.3), `4 * 2^-53` the reference's own f64 rounding, and `tiny` the
//!   subnormal spacing (a result that underflows);
//! - a sum of `n` terms may lose `n * 2^-53 * sum |x_i|` to accumulation
//!   in any order (the classical bound), then rounds once: `Tensor::sum`
//!   documents that float sums accumulate in f64 (the CPU and CUDA
//!   kernels do); the dot products of matmul and conv2d, and the window
//!   sums of avg_pool2d, may accumulate in the working type,
//!   `k * w * sum |a_i b_i|` (im2col + GEMM, cuBLAS, cuDNN);
//! - gelu's rounding is relative to `|x|`, not `|gelu(x)|`: its
//!   `1 + erf(x / sqrt 2)` cancels for negative `x`;
//! - with fast math, every op may round twice (`u` and `k` double) and
//!   the rounding of `+`/`-` is relative to `|a| + |b|` instead of
//!   `|a + b|`: that covers the rewrites fast math allows, which fold
//!   constants rounded to the dtype (`x / c -> x * (1/c)`,
//!   `(x * c1) * c2 -> x * (c1 * c2)`) and reassociate
//!   (`(x + c1) + c2 -> x + (c1 + c2)`).
//!
//! Views, `neg`, `abs`, `relu`, `maximum`, `minimum`, `max`/`min`
//! reductions and widening casts add nothing. Discontinuous ops see the
//! interval: a comparison whose operands' intervals overlap is an
//! uncertain bool (`[0, 1]`), `where` on one takes both branches, a cast
//! to an integer truncates both ends, `argmax` is the range of the lanes
//! that can be the maximum. Integers are exact; they wrap in their dtype
//! when exact and become unknown when an uncertain range would wrap.
//! Nothing is known (`rad = inf`) where the reference itself overflows or
//! an interval meets a singularity (log, sqrt or rsqrt of a range reaching
//! 0, a quotient by a range holding 0); the generator avoids those, so
//! nearly every element is compared.

use super::array::{broadcast, for_each_index, Arr, Iv};
use super::program::{Bin, Dt, Instr, Program, Red, Rhs, Source, Un};
pub use super::scalar::Model;
use super::scalar::{binary, cast, compare, int, unary, U64};

/// A reference value: its dtype and elements.
#[derive(Clone, Debug)]
pub struct Val {
    pub dt: Dt,
    pub arr: Arr,
}

/// The lanes of `a` along `dims`, for each output index (row-major over
/// the kept dims), and the output shape.
fn lanes(a: &Arr, dims: &[usize], keepdim: bool) -> (Vec<usize>, Vec<Vec<Iv>>) {
    let kept: Vec<usize> = (0..a.rank()).filter(|d| !dims.contains(d)).collect();
    let red_shape: Vec<usize> = dims.iter().map(|&d| a.shape[d]).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| a.shape[d]).collect();
    let mut out = Vec::new();
    let mut full = vec![0; a.rank()];
    for_each_index(&kept_shape, |k| {
        for (i, &d) in kept.iter().enumerate() {
            full[d] = k[i];
        }
        let mut lane = Vec::new();
        for_each_index(&red_shape, |r| {
            for (i, &d) in dims.iter().enumerate() {
                full[d] = r[i];
            }
            lane.push(a.at(&full));
        });
        out.push(lane);
    });
    let shape = (0..a.rank())
        .filter_map(|d| match (dims.contains(&d), keepdim) {
            (false, _) => Some(a.shape[d]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    (shape, out)
}

pub fn reduce(m: Model, op: Red, v: &Val, dims: &[usize], keepdim: bool) -> Val {
    let dt = v.dt;
    let (shape, lanes) = lanes(&v.arr, dims, keepdim);
    let data = lanes
        .into_iter()
        .map(|lane| {
            if lane.iter().any(|x| !x.known()) {
                return Iv::UNKNOWN;
            }
            let n = lane.len() as f64;
            match op {
                Red::Sum | Red::Mean => {
                    let mid: f64 = lane.iter().map(|x| x.mid).sum();
                    let rad: f64 = lane.iter().map(|x| x.rad).sum();
                    if !dt.is_float() {
                        return int(dt, mid - rad, mid + rad);
                    }
                    let terms: f64 = lane.iter().map(|x| x.mag()).sum();
                    let acc = (n + 4.0) * U64 * terms;
                    let sum = m.float(dt, mid, rad + acc, 0.0, 0.0);
                    if op == Red::Sum {
                        sum
                    } else {
                        m.float(dt, sum.mid / n, sum.rad / n, 1.0, 0.0)
                    }
                }
                Red::Max | Red::Min => {
                    let f = if op == Red::Max { f64::max } else { f64::min };
                    let lo = lane.iter().map(|x| x.lo()).reduce(f).unwrap_or(f64::NAN);
                    let hi = lane.iter().map(|x| x.hi()).reduce(f).unwrap_or(f64::NAN);
                    if dt.is_float() {
                        Iv::bounds(lo, hi)
                    } else {
                        int(dt, lo, hi)
                    }
                }
            }
        })
        .collect();
    Val { dt, arr: Arr::new(shape, data) }
}

/// The index of the first maximum: the range of lanes that can be the
/// maximum, exact when that is one lane or exact ties.
pub fn argmax(v: &Val, dim: usize, keepdim: bool) -> Val {
    let (shape, lanes) = lanes(&v.arr, &[dim], keepdim);
    let data = lanes
        .into_iter()
        .map(|lane| {
            if lane.iter().any(|x| !x.known()) {
                return Iv::UNKNOWN;
            }
            let best_lo = lane.iter().map(|x| x.lo()).fold(f64::NEG_INFINITY, f64::max);
            let cands: Vec<usize> = (0..lane.len()).filter(|&i| lane[i].hi() >= best_lo).collect();
            let first = cands[0];
            let ties = cands.iter().all(|&i| lane[i].rad == 0.0 && lane[i].mid == lane[first].mid);
            if ties {
                Iv::exact(first as f64)
            } else {
                Iv::bounds(first as f64, cands[cands.len() - 1] as f64)
            }
        })
        .collect();
    Val { dt: Dt::I64, arr: Arr::new(shape, data) }
}

fn zip_map(a: &Val, b: &Val, dt: Dt, f: impl Fn(Iv, Iv) -> Iv) -> Val {
    let shape = broadcast(&a.arr.shape, &b.arr.shape).expect("reference: operands do not broadcast");
    let (x, y) = (a.arr.expand(&shape), b.arr.expand(&shape));
    Val { dt, arr: Arr::build(&shape, |i| f(x.at(i), y.at(i))) }
}

/// A scalar or value operand as a value of `dt` (a scalar is exact: the
/// generator only uses scalars every dtype holds exactly).
fn operand(vals: &[Val], r: Rhs, dt: Dt) -> Val {
    match r {
        Rhs::Val(v) => vals[v].clone(),
        Rhs::Scalar(s) => Val { dt, arr: Arr::new(vec![], vec![Iv::exact(s)]) },
    }
}

fn bin_vals(m: Model, op: Bin, a: &Val, b: &Val) -> Val {
    let dt = a.dt;
    zip_map(a, b, dt, |x, y| binary(m, op, dt, x, y))
}

fn un_val(m: Model, op: Un, a: &Val) -> Val {
    Val { dt: a.dt, arr: a.arr.map(|x| unary(m, op, a.dt, x)) }
}

fn matmul(m: Model, a: &Val, b: &Val) -> Val {
    let dt = a.dt;
    let (ra, rb) = (a.arr.rank(), b.arr.rank());
    let a2 = if ra == 1 { a.arr.reshape(&[1, a.arr.shape[0]]) } else { a.arr.clone() };
    let b2 = if rb == 1 { b.arr.reshape(&[b.arr.shape[0], 1]) } else { b.arr.clone() };
    let (sa, sb) = (&a2.shape, &b2.shape);
    let (mm, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let batch = broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2]).expect("reference: batch dims");
    let full = |x: usize, y: usize| batch.iter().copied().chain([x, y]).collect::<Vec<_>>();
    let (ea, eb) = (a2.expand(&full(mm, k)), b2.expand(&full(k, n)));
    let out_shape = full(mm, n);
    let r = out_shape.len();
    let arr = Arr::build(&out_shape, |idx| {
        let (mut ia, mut ib) = (idx.to_vec(), idx.to_vec());
        dot(
            m,
            dt,
            (0..k).map(|kk| {
                ia[r - 1] = kk;
                ib[r - 2] = kk;
                (ea.at(&ia), eb.at(&ib))
            }),
        )
    });
    let mut dims = out_shape.clone();
    if rb == 1 {
        dims.pop();
    }
    if ra == 1 {
        let at = dims.len() - if rb == 1 { 1 } else { 2 };
        dims.remove(at);
    }
    Val { dt, arr: arr.reshape(&dims) }
}

/// The output size of a window sliding over `size` (the generator keeps
/// it at least 1).
pub fn window_out(size: usize, kernel: usize, stride: usize, padding: usize, dilation: usize) -> usize {
    (size + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1
}

/// A dot product's value and bound: `terms` pairs of elements, which may
/// accumulate in the working type (`k * w * sum |a_i b_i|`).
fn dot(m: Model, dt: Dt, terms: impl Iterator<Item = (Iv, Iv)>) -> Iv {
    let (mut mid, mut rad, mut mags, mut k) = (0.0, 0.0, 0.0, 0.0);
    for (x, y) in terms {
        if !x.known() || !y.known() {
            return Iv::UNKNOWN;
        }
        mid += x.mid * y.mid;
        rad += x.mid.abs() * y.rad + y.mid.abs() * x.rad + x.rad * y.rad;
        mags += x.mag() * y.mag();
        k += 1.0;
    }
    if dt.is_float() {
        m.float(dt, mid, rad + (k * dt.work_unit() + 4.0 * U64) * mags, 0.0, 0.0)
    } else {
        int(dt, mid - rad, mid + rad)
    }
}

/// PyTorch's `conv2d` (cross-correlation, zero padding, groups).
fn conv2d(m: Model, x: &Val, w: &Val, stride: usize, padding: usize, dilation: usize, groups: usize) -> Val {
    let (xs, ws) = (&x.arr.shape, &w.arr.shape);
    let (cg, kh, kw) = (ws[1], ws[2], ws[3]);
    let og = ws[0] / groups;
    let oh = window_out(xs[2], kh, stride, padding, dilation);
    let ow = window_out(xs[3], kw, stride, padding, dilation);
    let shape = [xs[0], ws[0], oh, ow];
    let arr = Arr::build(&shape, |i| {
        let (n, o, oy, ox) = (i[0], i[1], i[2], i[3]);
        let g = o / og;
        let mut terms = Vec::new();
        for c in 0..cg {
            for ky in 0..kh {
                for kx in 0..kw {
                    let iy = (oy * stride + ky * dilation) as isize - padding as isize;
                    let ix = (ox * stride + kx * dilation) as isize - padding as isize;
                    if iy < 0 || ix < 0 || iy as usize >= xs[2] || ix as usize >= xs[3] {
                        continue; // zero padding adds nothing
                    }
                    let a = x.arr.at(&[n, g * cg + c, iy as usize, ix as usize]);
                    terms.push((a, w.arr.at(&[o, c, ky, kx])));
                }
            }
        }
        dot(m, x.dt, terms.into_iter())
    });
    Val { dt: x.dt, arr }
}

/// PyTorch's `max_pool2d` (padding never wins) and `avg_pool2d`
/// (`count_include_pad=True`: the padding counts as zeros).
fn pool2d(m: Model, x: &Val, max: bool, kernel: usize, stride: usize, padding: usize) -> Val {
    let xs = &x.arr.shape;
    let (oh, ow) =
        (window_out(xs[2], kernel, stride, padding, 1), window_out(xs[3], kernel, stride, padding, 1));
    let dt = x.dt;
    let arr = Arr::build(&[xs[0], xs[1], oh, ow], |i| {
        let mut window = Vec::new();
        for ky in 0..kernel {
            for kx in 0..kernel {
                let iy = (i[2] * stride + ky) as isize - padding as isize;
                let ix = (i[3] * stride + kx) as isize - padding as isize;
                if iy >= 0 && ix >= 0 && (iy as usize) < xs[2] && (ix as usize) < xs[3] {
                    window.push(x.arr.at(&[i[0], i[1], iy as usize, ix as usize]));
                }
            }
        }
        if window.iter().any(|v| !v.known()) {
            return Iv::UNKNOWN;
        }
        if max {
            let lo = window.iter().map(|v| v.lo()).fold(f64::NEG_INFINITY, f64::max);
            let hi = window.iter().map(|v| v.hi()).fold(f64::NEG_INFINITY, f64::max);
            return Iv::bounds(lo, hi);
        }
        let n = (kernel * kernel) as f64;
        let one = Iv::exact(1.0);
        let sum = dot(m, dt, window.into_iter().map(|v| (v, one)));
        m.float(dt, sum.mid / n, sum.rad / n, 1.0, 0.0)
    });
    Val { dt, arr }
}

fn cat(vals: &[&Val], dim: usize) -> Val {
    let dt = vals[0].dt;
    let mut shape = vals[0].arr.shape.clone();
    shape[dim] = vals.iter().map(|v| v.arr.shape[dim]).sum();
    let arr = Arr::build(&shape, |idx| {
        let mut i = idx.to_vec();
        for v in vals {
            if i[dim] < v.arr.shape[dim] {
                return v.arr.at(&i);
            }
            i[dim] -= v.arr.shape[dim];
        }
        unreachable!("reference: cat index past the end")
    });
    Val { dt, arr }
}

fn view(v: &Val, arr: Arr) -> Val {
    Val { dt: v.dt, arr }
}

/// The value instruction `instr` makes, given the values before it.
pub fn step(m: Model, vals: &[Val], instr: &Instr) -> Val {
    match instr {
        Instr::Source { shape, dt, src } => {
            let n: usize = shape.iter().product();
            let data: Vec<Iv> = match src {
                Source::Data(d) => d.iter().map(|&x| Iv::exact(x)).collect(),
                Source::Full(x) | Source::Scalar(x) => vec![Iv::exact(*x); n],
                Source::Arange { start, step } => {
                    (0..n).map(|i| Iv::exact(start + i as f64 * step)).collect()
                }
            };
            Val { dt: *dt, arr: Arr::new(shape.clone(), data) }
        }
        Instr::Unary(op, a) => un_val(m, *op, &vals[*a]),
        Instr::Binary { op, a, rhs, reversed } => {
            let a = &vals[*a];
            let b = operand(vals, *rhs, a.dt);
            if *reversed {
                bin_vals(m, *op, &b, a)
            } else {
                bin_vals(m, *op, a, &b)
            }
        }
        Instr::Compare(op, a, rhs) => {
            let a = &vals[*a];
            zip_map(a, &operand(vals, *rhs, a.dt), Dt::Bool, |x, y| compare(*op, x, y))
        }
        Instr::Where(c, t, f) => {
            let dt = match (t, f) {
                (Rhs::Val(v), _) | (_, Rhs::Val(v)) => vals[*v].dt,
                _ => panic!("reference: where with two scalars"),
            };
            let (c, t, f) = (&vals[*c], operand(vals, *t, dt), operand(vals, *f, dt));
            let tf = broadcast(&t.arr.shape, &f.arr.shape).expect("reference: where branches");
            let shape = broadcast(&c.arr.shape, &tf).expect("reference: where condition");
            let (c, t, f) = (c.arr.expand(&shape), t.arr.expand(&shape), f.arr.expand(&shape));
            let arr = Arr::build(&shape, |i| {
                let cond = c.at(i);
                if cond == Iv::exact(1.0) {
                    t.at(i)
                } else if cond == Iv::exact(0.0) {
                    f.at(i)
                } else if cond.known() {
                    t.at(i).hull(f.at(i))
                } else {
                    Iv::UNKNOWN
                }
            });
            Val { dt, arr }
        }
        Instr::Cast(a, to) => {
            let a = &vals[*a];
            Val { dt: *to, arr: a.arr.map(|x| cast(m, a.dt, *to, x)) }
        }
        Instr::Reduce { op, a, dims, keepdim } => reduce(m, *op, &vals[*a], dims, *keepdim),
        Instr::SumAll(a) => {
            let dims: Vec<usize> = (0..vals[*a].arr.rank()).collect();
            reduce(m, Red::Sum, &vals[*a], &dims, false)
        }
        Instr::ArgMax { a, dim, keepdim } => argmax(&vals[*a], *dim, *keepdim),
        Instr::Softmax(a, dim) | Instr::LogSoftmax(a, dim) => {
            let x = &vals[*a];
            let max = reduce(m, Red::Max, x, &[*dim], true);
            let shifted = bin_vals(m, Bin::Sub, x, &max);
            let e = un_val(m, Un::Exp, &shifted);
            let sum = reduce(m, Red::Sum, &e, &[*dim], true);
            if matches!(instr, Instr::Softmax(..)) {
                bin_vals(m, Bin::Div, &e, &sum)
            } else {
                bin_vals(m, Bin::Sub, &shifted, &un_val(m, Un::Log, &sum))
            }
        }
        Instr::LayerNorm { a, weight, bias, eps } => {
            // PyTorch's F.layer_norm over the last dim, biased variance.
            let x = &vals[*a];
            let last = x.arr.rank() - 1;
            let mean = reduce(m, Red::Mean, x, &[last], true);
            let centered = bin_vals(m, Bin::Sub, x, &mean);
            let var = reduce(m, Red::Mean, &bin_vals(m, Bin::Mul, &centered, &centered), &[last], true);
            let eps = operand(vals, Rhs::Scalar(*eps), x.dt);
            let inv = un_val(m, Un::Rsqrt, &bin_vals(m, Bin::Add, &var, &eps));
            let y = bin_vals(m, Bin::Mul, &bin_vals(m, Bin::Mul, &centered, &inv), &vals[*weight]);
            bin_vals(m, Bin::Add, &y, &vals[*bias])
        }
        Instr::MatMul(a, b) => matmul(m, &vals[*a], &vals[*b]),
        Instr::Reshape(a, shape) => view(&vals[*a], vals[*a].arr.reshape(shape)),
        Instr::Flatten(a) => view(&vals[*a], vals[*a].arr.reshape(&[vals[*a].arr.numel()])),
        Instr::Permute(a, perm) => view(&vals[*a], vals[*a].arr.permute(perm)),
        Instr::Transpose(a, x, y) => {
            let mut perm: Vec<usize> = (0..vals[*a].arr.rank()).collect();
            perm.swap(*x, *y);
            view(&vals[*a], vals[*a].arr.permute(&perm))
        }
        Instr::T(a) => {
            let r = vals[*a].arr.rank();
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(r - 2, r - 1);
            view(&vals[*a], vals[*a].arr.permute(&perm))
        }
        Instr::Narrow { a, dim, start, len } => view(&vals[*a], vals[*a].arr.slice(*dim, *start, 1, *len)),
        Instr::Slice { a, dim, start, end, step } => {
            let len = (end - start).div_ceil(*step);
            view(&vals[*a], vals[*a].arr.slice(*dim, *start, *step, len))
        }
        Instr::BroadcastTo(a, shape) => view(&vals[*a], vals[*a].arr.expand(shape)),
        Instr::Squeeze(a, dim) => {
            let mut shape = vals[*a].arr.shape.clone();
            shape.remove(*dim);
            view(&vals[*a], vals[*a].arr.reshape(&shape))
        }
        Instr::Unsqueeze(a, dim) => {
            let mut shape = vals[*a].arr.shape.clone();
            shape.insert(*dim, 1);
            view(&vals[*a], vals[*a].arr.reshape(&shape))
        }
        Instr::Cat(vs, dim) => cat(&vs.iter().map(|&v| &vals[v]).collect::<Vec<_>>(), *dim),
        Instr::Stack(vs, dim) => {
            let expanded: Vec<Val> = vs
                .iter()
                .map(|&v| {
                    let mut shape = vals[v].arr.shape.clone();
                    shape.insert(*dim, 1);
                    view(&vals[v], vals[v].arr.reshape(&shape))
                })
                .collect();
            cat(&expanded.iter().collect::<Vec<_>>(), *dim)
        }
        Instr::Conv2d { x, w, stride, padding, dilation, groups } => {
            conv2d(m, &vals[*x], &vals[*w], *stride, *padding, *dilation, *groups)
        }
        Instr::Pool2d { x, max, kernel, stride, padding } => {
            pool2d(m, &vals[*x], *max, *kernel, *stride, *padding)
        }
        Instr::Gather { a, dim, index } => {
            let (x, idx) = (&vals[*a], &vals[*index].arr);
            let arr = Arr::build(&idx.shape.clone(), |i| {
                let at = idx.at(i);
                let mut j = i.to_vec();
                pick(&x.arr, &mut j, *dim, at)
            });
            view(x, arr)
        }
        Instr::IndexSelect { a, dim, index } => {
            let (x, idx) = (&vals[*a], &vals[*index].arr);
            let mut shape = x.arr.shape.clone();
            shape[*dim] = idx.shape[0];
            let arr = Arr::build(&shape, |i| {
                let at = idx.at(&[i[*dim]]);
                let mut j = i.to_vec();
                pick(&x.arr, &mut j, *dim, at)
            });
            view(x, arr)
        }
        Instr::Realize(a) => vals[*a].clone(),
    }
}

/// `x` at `idx` with `idx[dim]` replaced by the index `at`: every element
/// the index's range can reach.
fn pick(x: &Arr, idx: &mut [usize], dim: usize, at: Iv) -> Iv {
    if !at.known() || at.lo() < 0.0 || at.hi() >= x.shape[dim] as f64 {
        return Iv::UNKNOWN;
    }
    let (lo, hi) = (at.lo().round() as usize, at.hi().round() as usize);
    let mut out: Option<Iv> = None;
    for k in lo..=hi {
        idx[dim] = k;
        let v = x.at(idx);
        out = Some(match out {
            None => v,
            Some(o) => o.hull(v),
        });
    }
    out.unwrap_or(Iv::UNKNOWN)
}

/// Every value of the program, in order.
pub fn eval(m: Model, p: &Program) -> Vec<Val> {
    let mut vals = Vec::with_capacity(p.instrs.len());
    for instr in &p.instrs {
        let v = step(m, &vals, instr);
        vals.push(v);
    }
    vals
}
