//! Indexing: gather, index_select and concatenation.
//!
//! Index tensors come from user data, so every index is checked before any
//! element is read; a bad one is an [`Error::Runtime`] naming the index,
//! the dimension, its size and the node, never a panic.

use super::elementwise::{contiguous, fill_chunks};
use super::storage::{dispatch, Elem, Out};
use super::CpuBuffer;
use crate::backends::layout::Layout;
use crate::ir::Element;
use crate::ir::{DType, NodeId, Shape};
use crate::{Error, Result};

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
pub(crate) fn cat(parts: &[&CpuBuffer], dim: usize, out_shape: &Shape, out: Out<'_>) -> Result<()> {
    if parts.is_empty() {
        return Err(Error::Backend("cpu: cat of nothing".into()));
    }
    if dim >= out_shape.rank() {
        return Err(Error::Backend("cpu: cat dim out of range".into()));
    }
    let outer: usize = out_shape.0[..dim].iter().product();
    let inner: usize = out_shape.0[dim + 1..].iter().product();
    let total = out_shape.0[dim];
    fits(out.len(), out_shape.numel(), "cat")?;
    let dtype = out.dtype();
    dispatch!(dtype, T => {
        let out = out.get::<T>()?;
        let mut at = 0;
        for p in parts {
            let d = p.shape().0.get(dim).copied().unwrap_or(0);
            let block = d * inner;
            let src = contiguous(p.view::<T>()?)?;
            if src.len() != outer * block || at + d > total {
                return Err(Error::Backend(format!("cpu: cat operand {} does not fit {out_shape}", p.shape())));
            }
            if block > 0 {
                for (o, chunk) in src.chunks(block).enumerate() {
                    out[(o * total + at) * inner..][..block].copy_from_slice(chunk);
                }
            }
            at += d;
        }
        if at != total {
            return Err(Error::Backend(format!("cpu: cat operands do not fill {out_shape}")));
        }
        Ok(())
    })
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
