//! The reference's element semantics: what each elementwise op, compare
//! and cast gives on one element's interval, and the rounding each may
//! add (the bound is explained in [`super::eval`]'s header).
use super::array::Iv;
use super::program::{Bin, Cmp, Dt, Un};

/// What the implementation under test may do beyond exact rounding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub fast_math: bool,
}

pub const U64: f64 = 1.0 / 9_007_199_254_740_992.0;

impl Model {
    /// The rounding error of an op of `dt` whose result is at most `mag`
    /// in magnitude and which may lose `k` ulps of the working type.
    pub fn rounding(self, dt: Dt, k: f64, mag: f64) -> f64 {
        if !dt.is_float() {
            return 0.0;
        }
        // Fast math may fold constants first (`x / c -> x * (1/c)`, 1/c
        // rounded to the dtype; `(x * c1) * c2 -> x * (c1 * c2)`): an op
        // then rounds twice in its dtype.
        let f = if self.fast_math { 2.0 } else { 1.0 };
        (f * dt.unit() + f * k * dt.work_unit() + 4.0 * U64) * mag + dt.tiny()
    }

    /// A float result: `mid` with propagated radius `rad`, plus the
    /// rounding of an op losing `k` ulps on a result of magnitude up to
    /// `mag` (at least `|mid| + rad`).
    pub fn float(self, dt: Dt, mid: f64, rad: f64, k: f64, mag: f64) -> Iv {
        if !(mid.is_finite() && rad.is_finite()) || mid.abs() + rad > dt.max_finite() {
            return Iv::UNKNOWN;
        }
        Iv { mid, rad: rad + self.rounding(dt, k, mag.max(mid.abs() + rad)) }
    }
}

/// An integer (or bool) result known to lie in `[lo, hi]`: exact values
/// wrap into the dtype; an uncertain range must fit it.
pub fn int(dt: Dt, lo: f64, hi: f64) -> Iv {
    let (lo, hi) = ((lo - 1e-9).ceil(), (hi + 1e-9).floor());
    if !(lo.is_finite() && hi.is_finite()) || lo > hi || lo.abs().max(hi.abs()) > 2f64.powi(53) {
        return Iv::UNKNOWN;
    }
    if lo == hi {
        Iv::exact(dt.wrap(lo))
    } else if lo >= dt.min_value() && hi <= dt.max_finite() {
        Iv::bounds(lo, hi)
    } else {
        Iv::UNKNOWN
    }
}

/// A bool that is true, false, or either.
fn boolean(certain: Option<bool>) -> Iv {
    match certain {
        Some(b) => Iv::exact(b as u8 as f64),
        None => Iv::bounds(0.0, 1.0),
    }
}

/// `dt`'s result of an op whose exact image of the inputs is `[lo, hi]`
/// around `mid` (for exact dtypes `mid` is ignored).
fn finish(m: Model, dt: Dt, mid: f64, lo: f64, hi: f64, k: f64) -> Iv {
    if dt.is_float() {
        let rad = (hi - mid).max(mid - lo).max(0.0);
        m.float(dt, mid, rad, k, 0.0)
    } else {
        int(dt, lo, hi)
    }
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

pub fn unary(m: Model, op: Un, dt: Dt, x: Iv) -> Iv {
    if !x.known() {
        return Iv::UNKNOWN;
    }
    let (lo, hi) = (x.lo(), x.hi());
    if !dt.is_float() {
        return match op {
            Un::Neg => int(dt, -hi, -lo),
            Un::Abs if lo >= 0.0 => int(dt, lo, hi),
            Un::Abs if hi <= 0.0 => int(dt, -hi, -lo),
            Un::Abs => int(dt, 0.0, hi.max(-lo)),
            Un::Relu => int(dt, lo.max(0.0), hi.max(0.0)),
            _ => panic!("reference: {} on {}", op.name(), dt.name()),
        };
    }
    // A monotone function: the image of [lo, hi] is between f(lo), f(hi).
    let monotone = |f: fn(f64) -> f64, k: f64| {
        let (a, b, y) = (f(lo), f(hi), f(x.mid));
        m.float(dt, y, (a - y).abs().max((b - y).abs()), k, 0.0)
    };
    match op {
        Un::Neg => Iv { mid: -x.mid, rad: x.rad },
        Un::Abs if lo >= 0.0 => x,
        Un::Abs if hi <= 0.0 => Iv { mid: -x.mid, rad: x.rad },
        Un::Abs => Iv::bounds(0.0, hi.max(-lo)),
        Un::Relu => Iv::bounds(lo.max(0.0), hi.max(0.0)),
        Un::Exp => monotone(f64::exp, 4.0),
        Un::Log if lo > 0.0 => monotone(f64::ln, 4.0),
        Un::Sqrt if lo >= 0.0 => monotone(f64::sqrt, 1.0),
        Un::Rsqrt if lo > 0.0 => monotone(|v| 1.0 / v.sqrt(), 2.0),
        Un::Recip if lo > 0.0 || hi < 0.0 => monotone(|v| 1.0 / v, 1.0),
        Un::Log | Un::Sqrt | Un::Rsqrt | Un::Recip => Iv::UNKNOWN,
        Un::Tanh => monotone(f64::tanh, 4.0),
        Un::Sigmoid => monotone(|v| 1.0 / (1.0 + (-v).exp()), 4.0),
        // Lipschitz: |sin'|, |cos'| <= 1; |gelu'| <= 1.129; |silu'| <= 1.0999.
        Un::Sin => m.float(dt, x.mid.sin(), x.rad.min(2.0), 4.0, 0.0),
        Un::Cos => m.float(dt, x.mid.cos(), x.rad.min(2.0), 4.0, 0.0),
        Un::Gelu => m.float(dt, gelu(x.mid), 1.13 * x.rad, 4.0, x.mag() + gelu(x.mid).abs()),
        Un::Silu => m.float(dt, silu(x.mid), 1.1 * x.rad, 4.0, 0.0),
    }
}

/// The extremes of `f` over the corners of `a x b` (for functions monotone
/// in each argument), around `f(a.mid, b.mid)`.
fn corners(a: Iv, b: Iv, f: impl Fn(f64, f64) -> f64) -> (f64, f64, f64) {
    let mid = f(a.mid, b.mid);
    let (mut lo, mut hi) = (mid, mid);
    for x in [a.lo(), a.hi()] {
        for y in [b.lo(), b.hi()] {
            let v = f(x, y);
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    (mid, lo, hi)
}

pub fn binary(m: Model, op: Bin, dt: Dt, a: Iv, b: Iv) -> Iv {
    if !a.known() || !b.known() {
        return Iv::UNKNOWN;
    }
    if op == Bin::Maximum || op == Bin::Minimum {
        let f = if op == Bin::Maximum { f64::max } else { f64::min };
        let (lo, hi) = (f(a.lo(), b.lo()), f(a.hi(), b.hi()));
        return if dt.is_float() { Iv::bounds(lo, hi) } else { int(dt, lo, hi) };
    }
    if !dt.is_float() {
        return match op {
            Bin::Add => int(dt, a.lo() + b.lo(), a.hi() + b.hi()),
            Bin::Sub => int(dt, a.lo() - b.hi(), a.hi() - b.lo()),
            Bin::Mul => {
                let (_, lo, hi) = corners(a, b, |x, y| x * y);
                int(dt, lo, hi)
            }
            // Truncating; x / 0 is 0. Monotone in each argument away from 0.
            Bin::Div if b.rad == 0.0 && b.mid == 0.0 => int(dt, 0.0, 0.0),
            Bin::Div if b.lo() > 0.0 || b.hi() < 0.0 => {
                let (_, lo, hi) = corners(a, b, |x, y| (x / y).trunc());
                int(dt, lo, hi)
            }
            _ => Iv::UNKNOWN,
        };
    }
    let (x, y) = (a.mid, b.mid);
    match op {
        Bin::Add | Bin::Sub => {
            let mid = if op == Bin::Add { x + y } else { x - y };
            let rad = a.rad + b.rad;
            // Fast math may reassociate sums: round relative to the terms.
            let mag = if m.fast_math { a.mag() + b.mag() } else { 0.0 };
            m.float(dt, mid, rad, 1.0, mag)
        }
        Bin::Mul => m.float(dt, x * y, x.abs() * b.rad + y.abs() * a.rad + a.rad * b.rad, 1.0, 0.0),
        Bin::Div if b.lo() > 0.0 || b.hi() < 0.0 => {
            let (mid, lo, hi) = corners(a, b, |p, q| p / q);
            finish(m, dt, mid, lo, hi, 1.0)
        }
        Bin::Pow if a.lo() > 0.0 => {
            let (mid, lo, hi) = corners(a, b, f64::powf);
            finish(m, dt, mid, lo, hi, 4.0)
        }
        _ => Iv::UNKNOWN,
    }
}

pub fn compare(op: Cmp, a: Iv, b: Iv) -> Iv {
    if !a.known() || !b.known() {
        return Iv::UNKNOWN;
    }
    let lt = |a: Iv, b: Iv| {
        if a.hi() < b.lo() {
            Some(true)
        } else if a.lo() >= b.hi() {
            Some(false)
        } else {
            None
        }
    };
    let eq = if a.rad == 0.0 && b.rad == 0.0 {
        Some(a.mid == b.mid)
    } else if a.hi() < b.lo() || b.hi() < a.lo() {
        Some(false)
    } else {
        None
    };
    boolean(match op {
        Cmp::Lt => lt(a, b),
        Cmp::Ge => lt(a, b).map(|t| !t),
        Cmp::Gt => lt(b, a),
        Cmp::Le => lt(b, a).map(|t| !t),
        Cmp::Eq => eq,
        Cmp::Ne => eq.map(|t| !t),
    })
}

pub fn cast(m: Model, from: Dt, to: Dt, x: Iv) -> Iv {
    if !x.known() {
        return Iv::UNKNOWN;
    }
    let (lo, hi) = (x.lo(), x.hi());
    match to {
        Dt::Bool if lo > 0.0 || hi < 0.0 => Iv::exact(1.0),
        Dt::Bool if x.rad == 0.0 && x.mid == 0.0 => Iv::exact(0.0),
        Dt::Bool => boolean(None),
        // Floats truncate toward zero and saturate; integers wrap.
        _ if to.is_int() && from.is_float() => {
            let sat = |v: f64| v.trunc().clamp(to.min_value(), to.max_finite());
            int(to, sat(lo), sat(hi))
        }
        _ if to.is_int() => int(to, lo, hi),
        _ => {
            if x.mag() > to.max_finite() {
                return Iv::UNKNOWN;
            }
            let exact = x.rad == 0.0 && to.round(x.mid) == x.mid;
            let widening = matches!(
                (from, to),
                (Dt::F16 | Dt::Bf16, Dt::F32 | Dt::F64) | (Dt::F32, Dt::F64) | (Dt::Bool, _)
            );
            if exact || widening {
                x
            } else {
                // k = 1: a narrowing may round twice (f64 -> f32 -> f16).
                m.float(to, x.mid, x.rad, 1.0, 0.0)
            }
        }
    }
}
