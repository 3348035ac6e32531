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

fn fill_normal<T: Elem>(out: &mut [T], f: impl Fn(u64) -> T + Sync) {
    fill_chunks(out, |st, c| {
        for (j, o) in c.iter_mut().enumerate() {
            *o = f((st + j) as u64);
        }
    });
}

/// Elements per batch of [`philox_lanes`]: eight counters, one AVX2
/// register of each of the four words.
const LANES: usize = 8;

/// Philox4x32-10 ([`philox::philox4x32_10`], the definition) of the
/// counters `[i, i >> 32, stream, stream >> 32]` for `LANES` consecutive
/// indices `i0 ..`: the same arithmetic on arrays, which LLVM keeps in
/// vector registers (one call per element cost 10% of the digits MLP
/// step). The word arrays are returned as `[r0; LANES], .., [r3; LANES]`.
// Lane `j` of several arrays at once is the loop LLVM vectorizes.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn philox_lanes(seed: u64, stream: u64, i0: u64) -> [[u32; LANES]; 4] {
    let mut c = [[0u32; LANES]; 4];
    for j in 0..LANES {
        let i = i0.wrapping_add(j as u64);
        c[0][j] = i as u32;
        c[1][j] = (i >> 32) as u32;
        c[2][j] = stream as u32;
        c[3][j] = (stream >> 32) as u32;
    }
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    for round in 0..10 {
        if round > 0 {
            k0 = k0.wrapping_add(philox::W0);
            k1 = k1.wrapping_add(philox::W1);
        }
        let mut n = [[0u32; LANES]; 4];
        for j in 0..LANES {
            let p0 = (philox::M0 as u64) * (c[0][j] as u64);
            let p1 = (philox::M1 as u64) * (c[2][j] as u64);
            n[0][j] = ((p1 >> 32) as u32) ^ c[1][j] ^ k0;
            n[1][j] = p1 as u32;
            n[2][j] = ((p0 >> 32) as u32) ^ c[3][j] ^ k1;
            n[3][j] = p0 as u32;
        }
        c = n;
    }
    c
}

/// Uniform numbers for elements `st .. st + out.len()`, `LANES` at a
/// time: the bits of `below_one(philox::uniform(seed, stream, i))`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn uniform_lanes<T: Elem>(out: &mut [T], st: usize, seed: u64, stream: u64, below: T) {
    let mut chunks = out.chunks_exact_mut(LANES);
    let mut i = st as u64;
    for c in &mut chunks {
        let r = philox_lanes(seed, stream, i);
        let mut u = [0f64; LANES];
        for j in 0..LANES {
            u[j] = uniform_from_lanes(r[0][j], r[1][j]);
        }
        for j in 0..LANES {
            c[j] = below_one::<T>(u[j], below);
        }
        i += LANES as u64;
    }
    for (j, o) in chunks.into_remainder().iter_mut().enumerate() {
        *o = below_one::<T>(philox::uniform(seed, stream, i + j as u64), below);
    }
}

/// [`philox::uniform_from`], in operations AVX2 has for four lanes: the
/// 53-bit integer `x` is converted as two halves, each exact as the
/// mantissa of `2^52 + half` less `2^52`, then `hi * 2^32 + lo` (exact,
/// below `2^53`) is `x as f64` to the bit. (`u64 as f64` itself has no
/// vector instruction before AVX-512, so LLVM converted lane by lane.)
#[inline(always)]
fn uniform_from_lanes(a: u32, b: u32) -> f64 {
    const MAGIC: u64 = 0x4330_0000_0000_0000; // the bits of 2^52
    const TWO52: f64 = 4_503_599_627_370_496.0;
    let x = ((a as u64) << 21) ^ ((b as u64) >> 11);
    let hi = f64::from_bits(MAGIC | (x >> 32)) - TWO52;
    let lo = f64::from_bits(MAGIC | (x & 0xffff_ffff)) - TWO52;
    (hi * 4_294_967_296.0 + lo) * (1.0 / 9_007_199_254_740_992.0)
}

/// [`uniform_lanes`] compiled for AVX2 (where the 32x32->64 multiplies
/// of eight lanes are two instructions).
///
/// # Safety
/// The CPU must support `avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn uniform_lanes_avx2<T: Elem>(out: &mut [T], st: usize, seed: u64, stream: u64, below: T) {
    uniform_lanes(out, st, seed, stream, below)
}

fn fill_uniform<T: Elem>(out: &mut [T], seed: u64, stream: u64, below: T) {
    fill_chunks(out, |st, c| {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports avx2 (checked just above).
            unsafe { uniform_lanes_avx2(c, st, seed, stream, below) };
            return;
        }
        uniform_lanes(c, st, seed, stream, below)
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
                Distribution::Uniform => fill_uniform(o, seed, stream, below),
                Distribution::Normal => {
                    fill_normal(o, |i| <$t as Elem>::from_f64(philox::normal(seed, stream, i)))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane conversion is `uniform_from`, at the extremes of each half.
    #[test]
    fn uniform_from_lanes_is_uniform_from() {
        let words = [0u32, 1, 2047, 2048, 0x7fff_ffff, 0x8000_0000, 0xffff_f800, u32::MAX, 0x1234_5678];
        for &a in &words {
            for &b in &words {
                assert_eq!(
                    uniform_from_lanes(a, b).to_bits(),
                    philox::uniform_from(a, b).to_bits(),
                    "{a:#x} {b:#x}"
                );
            }
        }
    }

    /// The batched generator gives the bits of the one-element definition,
    /// across a carry into the counter's high word and for every tail length.
    #[test]
    fn uniform_lanes_match_the_definition() {
        let (seed, stream) = (0x0123_4567_89ab_cdef_u64, 0x1111_2222_3333_4444_u64);
        for st in [0usize, 5, (1usize << 32) - 11] {
            for len in [0, 1, 7, 8, 9, 23, 64] {
                let mut a = vec![0f32; len];
                fill_uniform(&mut a, seed, stream, 1.0 - f32::EPSILON / 2.0);
                let mut b = vec![0f32; len];
                uniform_lanes(&mut b, st, seed, stream, 1.0 - f32::EPSILON / 2.0);
                for (j, (&x, &y)) in a.iter().zip(&b).enumerate() {
                    let want =
                        below_one::<f32>(philox::uniform(seed, stream, j as u64), 1.0 - f32::EPSILON / 2.0);
                    assert_eq!(x.to_bits(), want.to_bits(), "fill_uniform at {j}");
                    let want = below_one::<f32>(
                        philox::uniform(seed, stream, (st + j) as u64),
                        1.0 - f32::EPSILON / 2.0,
                    );
                    assert_eq!(y.to_bits(), want.to_bits(), "uniform_lanes from {st} at {j}");
                }
            }
        }
    }
}
