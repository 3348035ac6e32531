//! Reductions (sum, mean, max, min, argmax) over any set of dimensions.
//!
//! The input layout is split into kept dimensions (one output element per
//! position) and reduced dimensions (one lane per output element); each
//! lane is walked through its strides, so no input is copied (lanes that
//! are dense rows are read as slices). Float sums accumulate in `f64` in
//! the order `lanes.rs` defines (shared with the fused row kernels);
//! integer sums wrap in the dtype; max/min/argmax let NaN win, as PyTorch
//! does.

use super::elementwise::{CHUNK, PAR_THRESHOLD};
use super::lanes::{self, extreme_iter as extreme};
use super::storage::{dispatch, Elem, Out, View};
use super::CpuBuffer;
use crate::backends::layout::Offsets;
use crate::ir::{Element, ReduceOp};
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

/// (kept sizes, kept strides, reduced sizes, reduced strides).
fn split_dims<T>(x: View<'_, T>, dims: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>) {
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
    (ks, kst, rs, rst)
}

/// True when there are too few lanes to share out but each is long: then
/// lanes are cut into fixed segments reduced in parallel ([`reduce_split`]).
fn use_split(n_out: usize, lane_len: usize) -> bool {
    n_out < 4 && lane_len >= 2 * CHUNK
}

/// Long-lane reduction: each lane is cut into segments of [`CHUNK`]
/// elements, `part(segment, first index)` runs on each in parallel, and
/// `combine` folds the partials in segment order. Segments are fixed, so
/// the result never depends on the number of threads.
fn reduce_split<T: Elem, P: Send, O: Elem>(
    x: View<'_, T>,
    dims: &[usize],
    part: impl Fn(Lane<'_, T>, usize) -> P + Sync,
    combine: impl Fn(Vec<P>) -> O,
    out: &mut [O],
) {
    let (ks, kst, rs, rst) = split_dims(x, dims);
    let n_out: usize = ks.iter().product();
    let lane_len: usize = rs.iter().product();
    let mut kept = Offsets::new(&ks, &kst, x.layout.offset, 0);
    for o in out.iter_mut().take(n_out) {
        *o = {
            let base = kept.next_offset();
            let parts: Vec<P> = (0..lane_len.div_ceil(CHUNK))
                .into_par_iter()
                .map(|s| {
                    let st = s * CHUNK;
                    let mut it = Offsets::new(&rs, &rst, base, st);
                    part(Lane { data: x.data, it: &mut it, left: CHUNK.min(lane_len - st) }, st)
                })
                .collect();
            combine(parts)
        };
    }
}

/// One output per lane: `f(lane)` for every position of the kept dims.
fn reduce_with<T: Elem, O: Elem>(
    x: View<'_, T>,
    dims: &[usize],
    f: impl Fn(Lane<'_, T>) -> O + Sync,
    out: &mut [O],
) {
    let l = x.layout;
    let (ks, kst, rs, rst) = split_dims(x, dims);
    let n_out: usize = ks.iter().product();
    let lane_len: usize = rs.iter().product();
    let n = n_out.min(out.len());
    let out = &mut out[..n];
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
        run(0, out);
    }
}

/// Float sums whose lanes are dense runs: the innermost reduced dims
/// have a run of at least [`lanes::LANES`] adjacent elements (a bias
/// gradient's `[n, c, h, w]` summed over `n, h, w` is `n` runs of
/// `h * w`). Each run is added to the lane's partials as a slice
/// ([`lanes::add_run`]), the same adds as the element-by-element walk,
/// so the same bits. `false` (nothing written) when the lanes are not so.
fn sum_runs<T: Elem>(x: View<'_, T>, dims: &[usize], f: impl Fn(f64) -> T + Sync, out: &mut [T]) -> bool {
    let l = x.layout;
    let (ks, kst, rs, rst) = split_dims(x, dims);
    // The run: the innermost reduced dims that are adjacent in storage.
    let (mut run, mut inner) = (1, rs.len());
    while inner > 0 && rst[inner - 1] == run {
        inner -= 1;
        run *= rs[inner];
    }
    let lane_len: usize = rs.iter().product();
    if lane_len == 0 || l.numel() == 0 || run < lanes::LANES || inner == rs.len() {
        return false;
    }
    let (outer, outer_st) = (&rs[..inner], &rst[..inner]);
    let runs = lane_len / run;
    let n_out: usize = ks.iter().product();
    let n = n_out.min(out.len());
    let out = &mut out[..n];
    // Every run must lie inside the storage (the walk would index each).
    let end = l.shape.0.iter().zip(&l.strides).try_fold(l.offset, |a, (&d, &st)| a.checked_add((d - 1) * st));
    if end.is_none_or(|e| e >= x.data.len()) {
        return false;
    }
    let go = |start: usize, chunk: &mut [T]| {
        let mut kept = Offsets::new(&ks, &kst, l.offset, start);
        let mut lane = Offsets::new(outer, outer_st, 0, 0);
        for o in chunk {
            lane.reset(kept.next_offset());
            let mut p = [0f64; lanes::LANES];
            for r in 0..runs {
                let at = lane.next_offset();
                lanes::add_run(&mut p, r * run, &x.data[at..at + run]);
            }
            *o = f(lanes::combine(p));
        }
    };
    if n_out > 1 && n_out.saturating_mul(lane_len) >= PAR_THRESHOLD {
        let per = (CHUNK / lane_len.max(1)).max(1);
        out.par_chunks_mut(per).enumerate().for_each(|(i, c)| go(i * per, c));
    } else {
        go(0, out);
    }
    true
}

/// Index of the first maximum (the first NaN if any) and its value.
fn is_nan<T: PartialEq>(v: T) -> bool {
    #[allow(clippy::eq_op)]
    let nan = v != v;
    nan
}

fn argmax<T: Elem>(mut lane: impl Iterator<Item = (i64, T)>) -> (i64, T) {
    let Some(mut best) = lane.next() else { return (0, T::default()) };
    if is_nan(best.1) {
        return best;
    }
    for (i, v) in lane {
        if is_nan(v) {
            return (i, v);
        }
        if v > best.1 {
            best = (i, v);
        }
    }
    best
}

fn indexed<T: Copy>(lane: Lane<'_, T>, first: usize) -> impl Iterator<Item = (i64, T)> + '_ {
    lane.enumerate().map(move |(i, v)| ((first + i) as i64, v))
}

/// The elements of `x` when it is dense and `dims` are its trailing dims:
/// then every lane is a row of the slice.
fn dense_rows<'a, T>(x: &View<'a, T>, dims: &[usize]) -> Option<&'a [T]> {
    let l = x.layout;
    let r = l.shape.rank();
    let trailing = dims.iter().enumerate().all(|(i, &d)| d == r - dims.len() + i);
    if !trailing || !l.is_contiguous() {
        return None;
    }
    x.data.get(l.offset..l.offset + l.numel())
}

/// The elements of `x` when it is dense and `dims` are its leading dims:
/// then the lanes are its columns (a sum over the batch).
fn dense_cols<'a, T>(x: &View<'a, T>, dims: &[usize]) -> Option<&'a [T]> {
    let l = x.layout;
    let leading = !dims.is_empty() && dims.iter().enumerate().all(|(i, &d)| d == i);
    if !leading || dims.len() == l.shape.rank() || !l.is_contiguous() {
        return None;
    }
    x.data.get(l.offset..l.offset + l.numel())
}

/// Columns of one task of a column sum: 256 columns' partials (32 KB of
/// `f64`) stay in L1 while the rows stream past.
const COLUMN_SPAN: usize = 256;

/// `out[j] = f(sum of column j)` of a dense block of `rows` rows of
/// `cols` columns, spans of columns in parallel when large.
fn columns_with<T: Elem>(x: &[T], rows: usize, cols: usize, f: impl Fn(f64) -> T + Sync, out: &mut [T]) {
    let n = cols.min(out.len());
    let out = &mut out[..n];
    let run = |j0: usize, chunk: &mut [T]| {
        let mut sums = vec![0f64; chunk.len()];
        lanes::sum_columns(x, cols, rows, j0, &mut sums);
        for (o, s) in chunk.iter_mut().zip(sums) {
            *o = f(s);
        }
    };
    if cols > COLUMN_SPAN && x.len() >= PAR_THRESHOLD {
        out.par_chunks_mut(COLUMN_SPAN).enumerate().for_each(|(i, c)| run(i * COLUMN_SPAN, c));
    } else {
        out.chunks_mut(COLUMN_SPAN).enumerate().for_each(|(i, c)| run(i * COLUMN_SPAN, c));
    }
}

/// `out[i] = f(row i)` for rows of `lane_len` elements, in parallel when large.
fn rows_with<T: Elem, O: Elem>(rows: &[T], lane_len: usize, f: impl Fn(&[T]) -> O + Sync, out: &mut [O]) {
    if lane_len == 0 {
        out.iter_mut().for_each(|o| *o = f(&[]));
        return;
    }
    let n = (rows.len() / lane_len).min(out.len());
    let out = &mut out[..n];
    let run = |start: usize, chunk: &mut [O]| {
        for (i, o) in chunk.iter_mut().enumerate() {
            let r = start + i;
            *o = f(&rows[r * lane_len..(r + 1) * lane_len]);
        }
    };
    if out.len() > 1 && rows.len() >= PAR_THRESHOLD {
        let per = (CHUNK / lane_len).max(1);
        out.par_chunks_mut(per).enumerate().for_each(|(i, c)| run(i * per, c));
    } else {
        run(0, out);
    }
}

/// Reduces `dims` of `x` with `op` into `out`, row-major over the kept
/// dims (so `keepdim` changes only the shape, which the node carries).
pub(crate) fn reduce(x: &CpuBuffer, op: ReduceOp, dims: &[usize], out: Out<'_>) -> Result<()> {
    let lane_len: usize = dims.iter().filter_map(|&d| x.shape().0.get(d)).product();
    let n_out = x.shape().numel() / lane_len.max(1);
    let split = use_split(n_out, lane_len);
    let f64_sum = |parts: Vec<f64>| parts.into_iter().sum::<f64>();
    let int_sum = |parts: Vec<i64>| parts.into_iter().fold(0i64, i64::wrapping_add);
    dispatch!(x.dtype(), T => {
        let v = x.view::<T>()?;
        let fsum = |l: Lane<'_, T>| lanes::sum_f64_iter(l.map(T::to_f64));
        let isum = |l: Lane<'_, T>| l.fold(0i64, |a, b| a.wrapping_add(b.to_i64()));
        let mean = |s: f64| T::from_f64(s / lane_len as f64);
        match op {
            ReduceOp::ArgMax => {
                let o = out.get::<i64>()?;
                if split {
                    reduce_split(v, dims, |l, st| argmax(indexed(l, st)), |p| argmax(p.into_iter()).0, o)
                } else {
                    reduce_with(v, dims, |l| argmax(indexed(l, 0)).0, o)
                }
            }
            _ => {
                let o = out.get::<T>()?;
                let float_sum = matches!(op, ReduceOp::Sum | ReduceOp::Mean) && T::DTYPE.is_float();
                if let Some(block) = dense_cols(&v, dims).filter(|_| float_sum && !split) {
                    let scale = if op == ReduceOp::Mean { lane_len as f64 } else { 1.0 };
                    columns_with(block, lane_len, n_out, |s| T::from_f64(s / scale), o);
                    return Ok(());
                }
                if let Some(rows) = dense_rows(&v, dims).filter(|_| !split) {
                    let done = match op {
                        ReduceOp::Sum | ReduceOp::Mean if T::DTYPE.is_float() => {
                            let scale = if op == ReduceOp::Mean { lane_len as f64 } else { 1.0 };
                            rows_with(rows, lane_len, |l| T::from_f64(lanes::sum_f64(l) / scale), o);
                            true
                        }
                        ReduceOp::Max | ReduceOp::Min => {
                            let want_max = op == ReduceOp::Max;
                            rows_with(rows, lane_len, |l| lanes::extreme(l, want_max), o);
                            true
                        }
                        _ => false,
                    };
                    if done {
                        return Ok(());
                    }
                }
                if float_sum && !split {
                    let mean = op == ReduceOp::Mean;
                    let f = |s: f64| T::from_f64(if mean { s / lane_len as f64 } else { s });
                    if sum_runs(v, dims, f, o) {
                        return Ok(());
                    }
                }
                match op {
                    ReduceOp::Sum if T::DTYPE.is_float() && split => {
                        reduce_split(v, dims, |l, _| fsum(l), |p| T::from_f64(f64_sum(p)), o)
                    }
                    ReduceOp::Sum if T::DTYPE.is_float() => reduce_with(v, dims, |l| T::from_f64(fsum(l)), o),
                    ReduceOp::Sum if T::DTYPE.is_int() && split => {
                        reduce_split(v, dims, |l, _| isum(l), |p| T::from_i64(int_sum(p)), o)
                    }
                    ReduceOp::Sum if T::DTYPE.is_int() => reduce_with(v, dims, |l| T::from_i64(isum(l)), o),
                    ReduceOp::Mean if T::DTYPE.is_float() && split => {
                        reduce_split(v, dims, |l, _| fsum(l), |p| mean(f64_sum(p)), o)
                    }
                    ReduceOp::Mean if T::DTYPE.is_float() => reduce_with(v, dims, |l| mean(fsum(l)), o),
                    ReduceOp::Max | ReduceOp::Min if split => {
                        let want_max = op == ReduceOp::Max;
                        reduce_split(v, dims, |l, _| extreme(l, want_max), |p| extreme(p.into_iter(), want_max), o)
                    }
                    ReduceOp::Max => reduce_with(v, dims, |l| extreme(l, true), o),
                    ReduceOp::Min => reduce_with(v, dims, |l| extreme(l, false), o),
                    _ => {
                        return Err(Error::Backend(format!(
                            "cpu: {} is not defined on {}",
                            op.mnemonic(),
                            T::DTYPE
                        )))
                    }
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::layout::Layout;
    use crate::ir::Shape;

    /// [`sum_runs`] against the element-by-element walk, bit for bit, over
    /// layouts whose lanes are runs (and some that are not, which it must
    /// refuse): dense, with an offset, permuted, a kept dim inside a run's
    /// dims, runs shorter than a round of the partials.
    #[test]
    fn sums_by_runs_are_the_walks_bits() {
        // Values in [1, 2) with every mantissa bit, one in seven near 2^40:
        // a partial holding one of those rounds away the others' low bits,
        // so an element added to another partial changes the sum's bits
        // (in f64 data and output: an f32 output's rounding would hide them).
        let data: Vec<f64> = (0..4000)
            .map(|i| {
                let m = 1.0 + ((i as u64 * 7_919_993_917) % (1u64 << 52)) as f64 / (1u64 << 52) as f64;
                if i % 7 == 3 {
                    m * (1u64 << 40) as f64
                } else {
                    m
                }
            })
            .collect();
        // (shape, strides, offset, reduced dims, whether runs apply)
        type Case<'a> = (&'a [usize], &'a [usize], usize, &'a [usize], bool);
        let cases: &[Case] = &[
            (&[4, 3, 5, 7], &[105, 35, 7, 1], 0, &[0, 2, 3], true),
            (&[32, 2, 4, 4], &[32, 16, 4, 1], 3, &[0, 2, 3], true),
            (&[5, 3, 17], &[51, 17, 1], 1, &[0, 2], true),
            (&[5, 3, 17], &[51, 17, 1], 0, &[1, 2], true),
            (&[3, 2, 40], &[80, 40, 1], 0, &[0, 1, 2], true),
            // [c, n, h, w] read from a dense [n, c, h, w]: runs of h * w.
            (&[3, 6, 4, 8], &[32, 96, 8, 1], 0, &[1, 2, 3], true),
            (&[3, 6, 4, 8], &[32, 96, 8, 1], 0, &[0, 1], false),
            // Runs of 8: under a round of the partials.
            (&[6, 5, 8], &[40, 8, 1], 0, &[0, 2], false),
            // The last dim transposed: no run.
            (&[20, 30], &[1, 20], 0, &[0, 1], false),
        ];
        for &(shape, strides, offset, dims, runs) in cases {
            let layout = Layout { shape: Shape(shape.to_vec()), strides: strides.to_vec(), offset };
            let lane_len: usize = dims.iter().map(|&d| shape[d]).product();
            let n_out = layout.numel() / lane_len;
            for mean in [false, true] {
                let f = |s: f64| if mean { s / lane_len as f64 } else { s };
                let mut want = vec![0f64; n_out];
                reduce_with(
                    View { data: &data, layout: &layout },
                    dims,
                    |l| f(lanes::sum_f64_iter(l)),
                    &mut want,
                );
                let mut got = vec![f64::NAN; n_out];
                assert_eq!(
                    sum_runs(View { data: &data, layout: &layout }, dims, f, &mut got),
                    runs,
                    "{shape:?} {strides:?} over {dims:?}"
                );
                if runs {
                    let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{shape:?} {strides:?} over {dims:?} (mean {mean}): {got:?} want {want:?}");
                }
            }
        }
    }
}
