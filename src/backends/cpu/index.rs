//! Indexing: gather, index_select and concatenation.
//!
//! Index tensors come from user data, so every index is checked before any
//! element is read; a bad one is an [`Error::Runtime`] naming the index,
//! the dimension, its size and the node, never a panic.

use super::elementwise::{contiguous, copy_short, dense, fill_chunks, splat, CHUNK};
use super::storage::View;
use super::storage::{dispatch, Elem, Out};
use super::CpuBuffer;
use crate::backends::layout::{Layout, Offsets};
use crate::ir::Element;
use crate::ir::{DType, NodeId, Shape};
use crate::{Error, Result};
use rayon::prelude::*;

/// The index operand as row-major `i64`s.
fn indices(idx: &CpuBuffer) -> Result<Vec<i64>> {
    match idx.dtype() {
        DType::I64 => contiguous(idx.view::<i64>()?),
        DType::I32 => Ok(contiguous(idx.view::<i32>()?)?.into_iter().map(i64::from).collect()),
        d => Err(Error::Backend(format!("cpu: index dtype must be i64 or i32, got {d}"))),
    }
}

fn check(op: &str, idx: &[i64], dim: usize, size: usize, node: NodeId) -> Result<()> {
    match idx.iter().find(|&&v| v < 0 || v as u64 >= size as u64) {
        Some(bad) => Err(Error::Runtime(format!(
            "{op} index {bad} is out of range for dim {dim} of size {size} (node {node})"
        ))),
        None => Ok(()),
    }
}

/// `x` addressed with `dim`'s stride set to 0, over `shape`: the storage
/// offset of every output position with the indexed coordinate at 0.
fn base_layout(x: &Layout, shape: &Shape, dim: usize) -> Layout {
    let mut strides = x.strides.clone();
    strides[dim] = 0;
    Layout { shape: shape.clone(), strides, offset: x.offset }
}

/// `out[i][j][k] = x[i][idx[i][j][k]][k]` for `dim = 1` (torch.gather).
pub(crate) fn gather(x: &CpuBuffer, idx: &CpuBuffer, dim: usize, node: NodeId, out: Out<'_>) -> Result<()> {
    let ix = indices(idx)?;
    let size = *x.shape().0.get(dim).ok_or_else(|| Error::Backend("cpu: gather dim out of range".into()))?;
    check("gather", &ix, dim, size, node)?;
    if idx.shape().rank() != x.shape().rank() {
        return Err(Error::Backend("cpu: gather ranks differ".into()));
    }
    let base = base_layout(x.layout(), idx.shape(), dim);
    let sd = x.layout().strides[dim];
    fits(out.len(), ix.len(), "gather")?;
    dispatch!(x.dtype(), T => {
        let v = x.view::<T>()?;
        fill_chunks(out.get::<T>()?, |st, c| {
            let mut it = base.offsets(st);
            for (o, &i) in c.iter_mut().zip(&ix[st..]) {
                *o = v.data[it.next_offset() + i as usize * sd];
            }
        });
        Ok(())
    })
}

/// The slices of `x` along `dim` named by a 1-D index (torch.index_select).
pub(crate) fn index_select(
    x: &CpuBuffer,
    idx: &CpuBuffer,
    dim: usize,
    node: NodeId,
    out: Out<'_>,
) -> Result<()> {
    let ix = indices(idx)?;
    let size =
        *x.shape().0.get(dim).ok_or_else(|| Error::Backend("cpu: index_select dim out of range".into()))?;
    check("index_select", &ix, dim, size, node)?;
    let mut shape = x.shape().clone();
    shape.0[dim] = ix.len();
    let base = base_layout(x.layout(), &shape, dim);
    let mut coord_strides = vec![0; shape.rank()];
    coord_strides[dim] = 1;
    let coord = Layout { shape: shape.clone(), strides: coord_strides, offset: 0 };
    let sd = x.layout().strides[dim];
    fits(out.len(), shape.numel(), "index_select")?;
    dispatch!(x.dtype(), T => {
        let v = x.view::<T>()?;
        fill_chunks(out.get::<T>()?, |st, c| {
            let (mut it, mut co) = (base.offsets(st), coord.offsets(st));
            for o in c {
                let b = it.next_offset();
                *o = v.data[b + ix[co.next_offset()] as usize * sd];
            }
        });
        Ok(())
    })
}

/// The output has exactly the elements the kernel writes.
fn fits(have: usize, want: usize, op: &str) -> Result<()> {
    if have != want {
        return Err(Error::Backend(format!("cpu: {op} output of {have} elements, {want} expected")));
    }
    Ok(())
}

/// The operands joined along `dim`, into `out`.
///
/// Each operand is written straight from its own layout into its blocks
/// of the output (one block of `size(dim) * inner` elements per outer
/// index): a broadcast value (a constant, all strides 0) as a fill, a
/// dense operand block by block, any other view in runs of its trailing
/// contiguous dimensions. The operands used to be copied dense into
/// scratch first (a constant's zeros element by element through the
/// odometer), and that copy and the scratch were a third of the digits
/// CNN's step, whose max-pool backward joins small blocks of zeros
/// (issue 38). A copy either way: the same elements land in the same
/// places. Outputs of [`COPY_PAR_THRESHOLD`] elements and more split their
/// outer blocks across threads.
pub(crate) fn cat(parts: &[&CpuBuffer], dim: usize, out_shape: &Shape, out: Out<'_>) -> Result<()> {
    if parts.is_empty() {
        return Err(Error::Backend("cpu: cat of nothing".into()));
    }
    let rank = out_shape.rank();
    if dim >= rank {
        return Err(Error::Backend("cpu: cat dim out of range".into()));
    }
    let outer: usize = out_shape.0[..dim].iter().product();
    let inner: usize = out_shape.0[dim + 1..].iter().product();
    let total = out_shape.0[dim];
    fits(out.len(), out_shape.numel(), "cat")?;
    // Where each operand's blocks start in an outer row of the output.
    let mut starts = Vec::with_capacity(parts.len());
    let mut at = 0;
    for p in parts {
        let d = p.shape().0.get(dim).copied().unwrap_or(0);
        if p.shape().rank() != rank || p.shape().numel() != outer * d * inner || at + d > total {
            return Err(Error::Backend(format!("cpu: cat operand {} does not fit {out_shape}", p.shape())));
        }
        starts.push((at * inner, d * inner));
        at += d;
    }
    if at != total {
        return Err(Error::Backend(format!("cpu: cat operands do not fill {out_shape}")));
    }
    let row = total * inner;
    if outer == 0 || row == 0 {
        return Ok(());
    }
    dispatch!(out.dtype(), T => {
        let out = out.get::<T>()?;
        let views = parts.iter().map(|p| p.view::<T>()).collect::<Result<Vec<_>>>()?;
        let sources: Vec<Source<'_, T>> = views.iter().zip(&starts).map(|(v, &(_, block))| Source::of(v, dim, block)).collect();
        // Outer rows `o0..` into `dst` (whole rows of the output).
        let rows = |o0: usize, dst: &mut [T]| {
            for (src, &(start, block)) in sources.iter().zip(&starts) {
                if block > 0 {
                    src.write(o0, dst.chunks_mut(row).map(|r| &mut r[start..start + block]));
                }
            }
        };
        if out.len() >= COPY_PAR_THRESHOLD && outer > 1 {
            let per_task = CHUNK.div_ceil(row).max(1);
            out.par_chunks_mut(per_task * row).enumerate().for_each(|(t, dst)| rows(t * per_task, dst));
        } else {
            rows(0, out);
        }
        Ok(())
    })
}

/// Elements of a copy (a join, an im2col) below which it runs on the
/// calling thread. A copy moves each element once, so a rayon split pays
/// for itself later than an arithmetic kernel's
/// ([`super::elementwise::PAR_THRESHOLD`]): the digits CNN's joins of 16-64K elements spent
/// more in wake-ups than in copying when split (issue 38).
pub(crate) const COPY_PAR_THRESHOLD: usize = 1 << 18;

/// How [`cat`] reads one operand.
enum Source<'a, T> {
    /// Every element is this one value.
    Splat(T),
    /// Row-major and dense.
    Dense(&'a [T]),
    /// Runs of `run` contiguous elements whose starts an odometer over
    /// the leading dimensions gives (`run` divides a block).
    Runs { view: &'a View<'a, T>, lead: usize, run: usize },
}

impl<'a, T: Elem> Source<'a, T> {
    fn of(v: &'a View<'a, T>, dim: usize, block: usize) -> Source<'a, T> {
        if let Some(x) = splat(v) {
            return Source::Splat(x);
        }
        if let Some(s) = dense(v) {
            return Source::Dense(s);
        }
        // Trailing dimensions (from `dim` on, so a run stays inside a
        // block) that are contiguous in storage make one run.
        let (shape, strides) = (&v.layout.shape.0, &v.layout.strides);
        let (mut lead, mut run) = (shape.len(), 1);
        while lead > dim && (strides[lead - 1] == run || shape[lead - 1] == 1) {
            run *= shape[lead - 1];
            lead -= 1;
        }
        debug_assert!(block % run == 0);
        Source::Runs { view: v, lead, run }
    }

    /// Writes the blocks of outer rows `o0..` into `blocks`, in order.
    fn write<'o>(&self, o0: usize, blocks: impl Iterator<Item = &'o mut [T]>)
    where
        T: 'o,
    {
        match self {
            Source::Splat(x) => blocks.for_each(|b| b.fill(*x)),
            Source::Dense(s) => {
                for (i, b) in blocks.enumerate() {
                    let n = b.len();
                    let src = &s[(o0 + i) * n..][..n];
                    if n < 32 {
                        copy_short(b, src);
                    } else {
                        b.copy_from_slice(src);
                    }
                }
            }
            Source::Runs { view, lead, run } => {
                let l = view.layout;
                let mut blocks = blocks.peekable();
                let Some(first) = blocks.peek() else { return };
                let start = o0 * first.len() / run;
                let mut starts = Offsets::new(&l.shape.0[..*lead], &l.strides[..*lead], l.offset, start);
                for b in blocks {
                    if *run == 1 {
                        for x in b.iter_mut() {
                            *x = view.data[starts.next_offset()];
                        }
                    } else {
                        for r in b.chunks_mut(*run) {
                            let at = starts.next_offset();
                            if *run < 32 {
                                copy_short(r, &view.data[at..at + run]);
                            } else {
                                r.copy_from_slice(&view.data[at..at + run]);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `x` with `src[.., i, ..]` added at `index[i]` along `dim`, in index
/// order (torch.index_add), into `out`. Sequential in the index, so a
/// repeated index sums in a fixed order and every run gives the same bits.
/// Floats add in f64 and round once, which for f32, f16 and bf16 is the
/// correctly rounded sum (the CUDA kernel's float add rounds the same).
pub(crate) fn index_add(
    x: &CpuBuffer,
    idx: &CpuBuffer,
    src: &CpuBuffer,
    dim: usize,
    node: NodeId,
    out: Out<'_>,
) -> Result<()> {
    let ix = indices(idx)?;
    let shape = x.shape().clone();
    let size = *shape.0.get(dim).ok_or_else(|| Error::Backend("cpu: index_add dim out of range".into()))?;
    check("index_add", &ix, dim, size, node)?;
    let outer: usize = shape.0[..dim].iter().product();
    let inner: usize = shape.0[dim + 1..].iter().product();
    fits(out.len(), shape.numel(), "index_add")?;
    dispatch!(x.dtype(), T => {
        let out = out.get::<T>()?;
        super::elementwise::copy_into(x.view::<T>()?, out);
        let s = contiguous(src.view::<T>()?)?;
        if s.len() != outer * ix.len() * inner {
            return Err(Error::Backend(format!("cpu: index_add source {} does not fit", src.shape())));
        }
        let add = |a: T, b: T| -> T {
            if T::DTYPE.is_float() {
                T::from_f64(a.to_f64() + b.to_f64())
            } else {
                T::from_i64(a.to_i64().wrapping_add(b.to_i64()))
            }
        };
        if inner > 0 {
            for o in 0..outer {
                for (j, &i) in ix.iter().enumerate() {
                    let dst = &mut out[(o * size + i as usize) * inner..][..inner];
                    for (d, &v) in dst.iter_mut().zip(&s[(o * ix.len() + j) * inner..][..inner]) {
                        *d = add(*d, v);
                    }
                }
            }
        }
        Ok(())
    })
}

/// The start of a `write_at` window: the offset operand clamped to
/// `0..=size - len`, the op's definition (XLA's `dynamic_update_slice`).
pub(crate) fn window_start(offset: &CpuBuffer, size: usize, len: usize) -> Result<usize> {
    let at = *indices(offset)?
        .first()
        .ok_or_else(|| Error::Backend("cpu: write_at offset has no element".into()))?;
    Ok(at.clamp(0, (size - len) as i64) as usize)
}

/// `x` with `value` written over the window at `offset` along `dim` (see
/// `Op::WriteAt`). `copy_target` is false when `out` already holds `x`
/// (the write runs in place of a donated input): only the window is
/// written, whatever the target's size.
pub(crate) fn write_at(
    x: Option<&CpuBuffer>,
    value: &CpuBuffer,
    offset: &CpuBuffer,
    dim: usize,
    shape: &Shape,
    out: Out<'_>,
) -> Result<()> {
    let size = *shape.0.get(dim).ok_or_else(|| Error::Backend("cpu: write_at dim out of range".into()))?;
    let len = value.shape().0[dim];
    let start = window_start(offset, size, len)?;
    let outer: usize = shape.0[..dim].iter().product();
    let inner: usize = shape.0[dim + 1..].iter().product();
    fits(out.len(), shape.numel(), "write_at")?;
    dispatch!(value.dtype(), T => {
        let out = out.get::<T>()?;
        if let Some(x) = x {
            super::elementwise::copy_into(x.view::<T>()?, out);
        }
        let v = contiguous(value.view::<T>()?)?;
        let rows = len * inner;
        if rows > 0 {
            for (o, src) in v.chunks_exact(rows).enumerate().take(outer) {
                out[(o * size + start) * inner..][..rows].copy_from_slice(src);
            }
        }
        Ok(())
    })
}
