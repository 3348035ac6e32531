//! Source ops: constants, ranges and counter-based random numbers.

use super::elementwise::fill_chunks;
use super::storage::{dispatch, from_scalar, Elem};
use crate::backends::philox;
use crate::ir::{DType, Distribution, Element, HostData, Scalar, Shape};
use crate::{Error, Result};
use half::{bf16, f16};

/// `shape.numel()` copies of `value` cast to `dtype` (the backend asks for
/// one and broadcasts it).
pub(crate) fn full(value: Scalar, shape: &Shape, dtype: DType) -> HostData {
    dispatch!(dtype, T => T::into_host(vec![from_scalar::<T>(value); shape.numel()]))
}

/// `start + i * step` for `i < n`: computed in `f64` for float dtypes and in
/// wrapping `i64` for the others, then cast to `dtype`.
pub(crate) fn arange(start: Scalar, step: Scalar, n: usize, dtype: DType) -> HostData {
    dispatch!(dtype, T => {
        let mut out = super::pool::vec_for_overwrite::<T>(n);
        fill_chunks(&mut out, |st, c| {
            for (j, o) in c.iter_mut().enumerate() {
                let i = st + j;
                let v = if dtype.is_float() {
                    Scalar::Float(start.as_f64() + i as f64 * step.as_f64())
                } else {
                    Scalar::Int(start.as_i64().wrapping_add((i as i64).wrapping_mul(step.as_i64())))
                };
                *o = from_scalar::<T>(v);
            }
        });
        T::into_host(out)
    })
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

fn fill_random<T: Elem>(n: usize, f: impl Fn(u64) -> T + Sync) -> Vec<T> {
    let mut out = super::pool::vec_for_overwrite::<T>(n);
    fill_chunks(&mut out, |st, c| {
        for (j, o) in c.iter_mut().enumerate() {
            *o = f((st + j) as u64);
        }
    });
    out
}

/// Random numbers for element `i` from Philox (`seed`, `stream`, `i`), so
/// values never depend on how the work is split (see [`philox`]).
pub(crate) fn random(dist: Distribution, seed: u64, stream: u64, n: usize, dtype: DType) -> Result<HostData> {
    macro_rules! gen {
        ($t:ty, $below:expr) => {{
            let below: $t = $below;
            <$t>::into_host(match dist {
                Distribution::Uniform => {
                    fill_random(n, |i| below_one::<$t>(philox::uniform(seed, stream, i), below))
                }
                Distribution::Normal => {
                    fill_random(n, |i| <$t as Elem>::from_f64(philox::normal(seed, stream, i)))
                }
            })
        }};
    }
    Ok(match dtype {
        DType::F64 => gen!(f64, 1.0 - f64::EPSILON / 2.0),
        DType::F32 => gen!(f32, 1.0 - f32::EPSILON / 2.0),
        DType::F16 => gen!(f16, f16::from_bits(0x3bff)),
        DType::BF16 => gen!(bf16, bf16::from_bits(0x3f7f)),
        d => return Err(Error::Backend(format!("cpu: random numbers need a float dtype, got {d}"))),
    })
}
