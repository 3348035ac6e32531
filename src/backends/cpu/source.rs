//! Source ops: constants, ranges and counter-based random numbers, each
//! written into an output slice of the node's dtype.

use super::elementwise::fill_chunks;
use super::storage::{dispatch, from_scalar, Elem, Out};
use crate::backends::philox;
use crate::ir::{DType, Distribution, Scalar};
use crate::{Error, Result};
use half::{bf16, f16};

/// Every element of `out` set to `value` cast to `out`'s dtype (the
/// backend usually asks for one and broadcasts it).
pub(crate) fn full(value: Scalar, out: Out<'_>) {
    dispatch!(out.dtype(), T => {
        if let Ok(o) = out.get::<T>() {
            o.fill(from_scalar::<T>(value));
        }
    })
}

/// `start + i * step` for every `i` of `out`: computed in `f64` for float
/// dtypes and in wrapping `i64` for the others, then cast to `out`'s dtype.
pub(crate) fn arange(start: Scalar, step: Scalar, out: Out<'_>) {
    dispatch!(out.dtype(), T => {
        if let Ok(o) = out.get::<T>() {
            arange_into(start, step, o);
        }
    })
}

fn arange_into<O: Elem>(start: Scalar, step: Scalar, out: &mut [O]) {
    let dtype = O::DTYPE;
    fill_chunks(out, |st, c| {
        for (j, o) in c.iter_mut().enumerate() {
            let i = st + j;
            let v = if dtype.is_float() {
                Scalar::Float(start.as_f64() + i as f64 * step.as_f64())
            } else {
                Scalar::Int(start.as_i64().wrapping_add((i as i64).wrapping_mul(step.as_i64())))
            };
            *o = from_scalar::<O>(v);
        }
    });
}

/// Rounds `u` in `[0, 1)` to `T`, keeping it below 1 (a value that rounds
/// up to 1 becomes the largest `T` below 1).
fn below_one<T: Elem>(u: f64, largest_below_one: T) -> T {
    let r = T::from_f64(u);
    if r.to_f64() >= 1.0 {
        largest_below_one
    } else {
        r
    }
}

fn fill_random<T: Elem>(out: &mut [T], f: impl Fn(u64) -> T + Sync) {
    fill_chunks(out, |st, c| {
        for (j, o) in c.iter_mut().enumerate() {
            *o = f((st + j) as u64);
        }
    });
}

/// Random numbers for element `i` from Philox (`seed`, `stream`, `i`), so
/// values never depend on how the work is split (see [`philox`]).
pub(crate) fn random(dist: Distribution, seed: u64, stream: u64, out: Out<'_>) -> Result<()> {
    macro_rules! gen {
        ($t:ty, $below:expr) => {{
            let below: $t = $below;
            let o = out.get::<$t>()?;
            match dist {
                Distribution::Uniform => {
                    fill_random(o, |i| below_one::<$t>(philox::uniform(seed, stream, i), below))
                }
                Distribution::Normal => {
                    fill_random(o, |i| <$t as Elem>::from_f64(philox::normal(seed, stream, i)))
                }
            }
        }};
    }
    match out.dtype() {
        DType::F64 => gen!(f64, 1.0 - f64::EPSILON / 2.0),
        DType::F32 => gen!(f32, 1.0 - f32::EPSILON / 2.0),
        DType::F16 => gen!(f16, f16::from_bits(0x3bff)),
        DType::BF16 => gen!(bf16, bf16::from_bits(0x3f7f)),
        d => return Err(Error::Backend(format!("cpu: random numbers need a float dtype, got {d}"))),
    }
    Ok(())
}
