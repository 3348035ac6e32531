//! Reductions (sum, mean, max, min, argmax) over any set of dimensions.
//!
//! The input layout is split into kept dimensions (one output element per
//! position) and reduced dimensions (one lane per output element); each
//! lane is walked through its strides, so no input is copied. Float sums
//! accumulate in `f64`; integer sums wrap in the dtype; max/min/argmax let
//! NaN win, as PyTorch does.

use super::elementwise::{CHUNK, PAR_THRESHOLD};
use super::layout::Offsets;
use super::storage::{dispatch, Elem, View};
use super::CpuBuffer;
use crate::ir::{Element, HostData, ReduceOp};
use crate::{Error, Result};
use rayon::prelude::*;

/// The elements of one reduction lane, in row-major order of the reduced dims.
pub(crate) struct Lane<'a, T> {
    data: &'a [T],
    it: &'a mut Offsets,
    left: usize,
}

impl<T: Copy> Iterator for Lane<'_, T> {
    type Item = T;
    #[inline(always)]
    fn next(&mut self) -> Option<T> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(self.data[self.it.next_offset()])
    }
}

/// One output per lane: `f(lane)` for every position of the kept dims.
fn reduce_with<T: Elem, O: Elem>(
    x: View<'_, T>,
    dims: &[usize],
    f: impl Fn(Lane<'_, T>) -> O + Sync,
) -> Vec<O> {
    let l = x.layout;
    let (mut ks, mut kst, mut rs, mut rst) = (vec![], vec![], vec![], vec![]);
    for (d, (&n, &s)) in l.shape.0.iter().zip(&l.strides).enumerate() {
        if dims.contains(&d) {
            rs.push(n);
            rst.push(s);
        } else {
            ks.push(n);
            kst.push(s);
        }
    }
    let n_out: usize = ks.iter().product();
    let lane_len: usize = rs.iter().product();
    let mut out = vec![O::default(); n_out];
    let run = |start: usize, chunk: &mut [O]| {
        let mut kept = Offsets::new(&ks, &kst, l.offset, start);
        let mut lane = Offsets::new(&rs, &rst, 0, 0);
        for o in chunk {
            lane.reset(kept.next_offset());
            *o = f(Lane { data: x.data, it: &mut lane, left: lane_len });
        }
    };
    if n_out > 1 && n_out.saturating_mul(lane_len) >= PAR_THRESHOLD {
        let per = (CHUNK / lane_len.max(1)).max(1);
        out.par_chunks_mut(per).enumerate().for_each(|(i, c)| run(i * per, c));
    } else {
        run(0, &mut out);
    }
    out
}

#[inline(always)]
fn is_nan<T: PartialEq>(v: T) -> bool {
    #[allow(clippy::eq_op)]
    let nan = v != v;
    nan
}

fn extreme<T: Elem>(mut lane: Lane<'_, T>, want_max: bool) -> T {
    let Some(mut acc) = lane.next() else { return T::default() };
    if is_nan(acc) {
        return acc;
    }
    for v in lane {
        if is_nan(v) {
            return v;
        }
        if (want_max && v > acc) || (!want_max && v < acc) {
            acc = v;
        }
    }
    acc
}

fn argmax<T: Elem>(mut lane: Lane<'_, T>) -> i64 {
    let Some(mut best) = lane.next() else { return 0 };
    if is_nan(best) {
        return 0;
    }
    let mut at = 0;
    for (i, v) in lane.enumerate() {
        if is_nan(v) {
            return i as i64 + 1;
        }
        if v > best {
            best = v;
            at = i as i64 + 1;
        }
    }
    at
}

/// Reduces `dims` of `x` with `op`; the output is row-major over the kept
/// dims (so `keepdim` changes only the shape, which the node carries).
pub(crate) fn reduce(x: &CpuBuffer, op: ReduceOp, dims: &[usize]) -> Result<HostData> {
    let lane_len: usize = dims.iter().filter_map(|&d| x.shape().0.get(d)).product();
    dispatch!(x.dtype(), T => {
        let v = x.view::<T>()?;
        Ok(match op {
            ReduceOp::Sum if T::DTYPE.is_float() => {
                T::into_host(reduce_with(v, dims, |l| T::from_f64(l.map(T::to_f64).sum::<f64>())))
            }
            ReduceOp::Sum if T::DTYPE.is_int() => T::into_host(reduce_with(v, dims, |l| {
                T::from_i64(l.fold(0i64, |a, b| a.wrapping_add(b.to_i64())))
            })),
            ReduceOp::Mean if T::DTYPE.is_float() => T::into_host(reduce_with(v, dims, |l| {
                T::from_f64(l.map(T::to_f64).sum::<f64>() / lane_len as f64)
            })),
            ReduceOp::Max => T::into_host(reduce_with(v, dims, |l| extreme(l, true))),
            ReduceOp::Min => T::into_host(reduce_with(v, dims, |l| extreme(l, false))),
            ReduceOp::ArgMax => HostData::I64(reduce_with(v, dims, argmax)),
            _ => {
                return Err(Error::Backend(format!(
                    "cpu: {} is not defined on {}",
                    op.mnemonic(),
                    T::DTYPE
                )))
            }
        })
    })
}
