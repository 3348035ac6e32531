//! Leaves of a fused body: where their elements come from and the view
//! chain that shapes them, composed at run time into one strided layout
//! over the operand's actual buffer.

use super::super::storage::{dispatch, from_scalar, HostSlice};
use super::super::CpuBuffer;
use super::ops;
use crate::backends::layout::Layout;
use crate::ir::{DType, Element, Graph, HostData, NodeId, Op, Scalar, Shape};
use crate::{Error, Result};

/// Where a leaf's elements come from, before its views.
#[derive(Clone, Debug)]
pub(super) enum Source {
    Input(usize),
    Full(Scalar),
}

/// A leaf and the views (in order, leaf first) that shape it.
#[derive(Clone, Debug)]
pub(super) struct Leaf {
    pub source: Source,
    /// The shape of the `input` / `full` node itself.
    pub shape: Shape,
    pub views: Vec<Op>,
}

/// The chain of views from a leaf up to `id`.
pub(super) fn leaf(g: &Graph, id: NodeId) -> std::result::Result<Leaf, String> {
    let mut views = Vec::new();
    let mut cur = id;
    loop {
        let n = g.node(cur);
        let source = match &n.op {
            Op::Input(k) => Source::Input(*k as usize),
            Op::Full(v) => Source::Full(*v),
            op if op.is_view() => {
                views.push(op.clone());
                cur = *g.operands(cur).first().ok_or_else(|| format!("{cur} has no operand"))?;
                continue;
            }
            op => return Err(format!("{id} views {cur} ({}), which is not a leaf", op.mnemonic())),
        };
        views.reverse();
        return Ok(Leaf { source, shape: n.shape.clone(), views });
    }
}

/// A leaf's storage and its layout over the leaf's shape, for this run.
pub(super) fn resolve<'a>(
    l: &Leaf,
    dtype: DType,
    args: &[Option<&'a CpuBuffer>],
) -> Result<(Data<'a>, Layout)> {
    let (mut data, mut layout) = match l.source {
        Source::Input(k) => {
            let b = args
                .get(k)
                .copied()
                .flatten()
                .ok_or_else(|| Error::Backend(format!("cpu: fused operand {k} is missing")))?;
            (Data::Arg(b, b.storage.host_slice()?), b.layout.clone())
        }
        Source::Full(v) => {
            let one = dispatch!(dtype, E => E::into_host(vec![from_scalar::<E>(v)]));
            let layout = Layout { shape: l.shape.clone(), strides: vec![0; l.shape.rank()], offset: 0 };
            (Data::Owned(one), layout)
        }
    };
    if layout.extent() > data.get().len() || layout.shape != l.shape {
        return Err(Error::Backend("cpu: fused operand layout does not fit its storage".into()));
    }
    for v in &l.views {
        layout = match v {
            Op::Reshape(target) => match layout.reshape(target) {
                Some(r) => r,
                None => {
                    let dense = dispatch!(dtype, E => {
                        let from = data.get().typed::<E>()?;
                        let mut o = vec![E::default(); layout.numel()];
                        ops::gather(from, &layout, 0, &mut o);
                        E::into_host(o)
                    });
                    data = Data::Owned(dense);
                    Layout::contiguous(target.clone())
                }
            },
            Op::Permute(p) => layout.permute(p),
            Op::Expand(t) => layout.expand(t),
            Op::Slice { dim, start, step, len } => layout.slice(*dim, *start, *step, *len),
            op => return Err(Error::Backend(format!("cpu: fused leaf view {}", op.mnemonic()))),
        };
    }
    if layout.extent() > data.get().len() {
        return Err(Error::Backend("cpu: fused leaf view does not fit its storage".into()));
    }
    Ok((data, layout))
}

/// Storage a leaf reads: an operand's, or one made for this run.
pub(super) enum Data<'a> {
    Arg(&'a CpuBuffer, HostSlice<'a>),
    Owned(HostData),
}

impl Data<'_> {
    pub fn get(&self) -> HostSlice<'_> {
        match self {
            Data::Arg(_, h) => *h,
            Data::Owned(h) => HostSlice::from(h),
        }
    }
}

/// How a step's leaf is read during a run.
pub(super) enum Src<'a> {
    /// Not a leaf.
    None,
    /// Row-major dense from the offset: read in place.
    Dense(Data<'a>, usize),
    /// One value everywhere (its one element).
    Splat(HostData),
    /// A row of `cols` elements from the offset, the same for every row
    /// (a bias expanded over rows): read in place.
    Cols(Data<'a>, usize),
    /// One value per row from the offset, broadcast along the row: read
    /// in place.
    PerRow(Data<'a>, usize),
    /// Gathered per block.
    Strided(Data<'a>, Layout),
    /// The in-place operand: read from the output block.
    InPlace,
    /// An operand that the kernel's extra output `e` (body output `e +
    /// 1`) is written over: read from that output's block.
    InPlaceExtra(usize),
}
