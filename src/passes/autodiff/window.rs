//! Rules for the sliding-window ops: `conv2d` (both operands) and the two
//! poolings, written with `conv2d`, views and `cat` so that no transposed
//! convolution or scatter op is needed.
//!
//! With `xp` the zero-padded input, `y[n,o,r,c] = Σ xp[n, ci, r s + i d, c s + j d] w[o, ci', i, j]`
//! (stride `s`, dilation `d`, `ci` in `o`'s group):
//! - the input gradient is the gradient `g` spread out by the stride (zeros
//!   between), correlated with the kernel flipped in both spatial dims and
//!   with its channel dims swapped per group, padded so that its first row
//!   is the input's first (the padding's rows are not computed), then
//!   cropped to the input (rows no window reached are zeros);
//! - the weight gradient is a correlation of the input with `g` in which
//!   the batch plays the channel: input channels become the batch, `g`'s
//!   channels the output channels, the forward stride becomes the
//!   dilation and the forward dilation the stride; its window is at least
//!   the kernel, cropped to it.
//!
//! Average pooling is a depthwise convolution with a constant kernel, so
//! its rule is the convolution's input gradient. Max pooling's is its own
//! op, `max_pool2d_grad` (one pass over the gradient; see
//! [`Op::MaxPool2dGrad`] for where each window's gradient goes). Written
//! with views it took, per kernel offset, a compare, a select and a
//! padded placement joined with `cat`: the digits CNN's 2x2 pooling
//! recorded 32 joins a step, the largest cost of its CPU epoch.
//!
//! The second derivative (a gradient penalty through a CNN) goes through
//! `max_pool2d_grad`'s own rule: linear in `g`, so the gradient of `g` is
//! the incoming gradient read back at each window's maximum, one kernel
//! offset at a time (the strided slice of the padded input at that offset
//! compared with the pooled value, the first hit of a window taken). A
//! window whose maximum is NaN gets 0 there (no element equals NaN),
//! where PyTorch would read its last NaN.

use super::build::{Builder, Built};
use crate::ir::{BinaryOp, CompareOp, NodeId, Op, PoolKind, Shape};

/// A convolution's attributes.
pub(super) struct Conv {
    pub(super) stride: [usize; 2],
    pub(super) padding: [usize; 2],
    pub(super) dilation: [usize; 2],
    pub(super) groups: usize,
}

impl Conv {
    /// The gradient with respect to the input (of shape `xshape`).
    pub(super) fn input_grad(&self, b: &mut Builder, g: NodeId, w: NodeId, xshape: &Shape) -> Built {
        let ws = b.shape(w);
        let gs = b.shape(g);
        let (o, cg, kh, kw) = (ws.0[0], ws.0[1], ws.0[2], ws.0[3]);
        let groups = self.groups;
        // Spread g by the stride: [N, O, (Ho-1) s + 1, (Wo-1) s + 1].
        let mut spread = g;
        for (axis, &s) in [2usize, 3].iter().zip(&self.stride) {
            let len = gs.0[*axis];
            spread = b.place(spread, *axis, 0, s, (len - 1) * s + 1, 0.0)?;
        }
        // Kernel per group with in/out swapped, flipped: [C, O/groups, kh, kw].
        let og = o / groups;
        let w5 = b.reshape(w, &Shape::new([groups, og, cg, kh, kw]))?;
        let w5 = b.permute(w5, &[0, 2, 1, 3, 4])?;
        let wt = b.reshape(w5, &Shape::new([groups * cg, og, kh, kw]))?;
        let wt = b.flip(wt, 2)?;
        let wt = b.flip(wt, 3)?;
        // With padding d (k - 1) the correlation is the gradient of the
        // padded input from its first row; the real input's rows start at
        // the forward's padding p. Up to p of the padding's rows at each
        // end are not computed (padding d (k - 1) - cut), then a crop
        // from what is left.
        // A 3x3 convolution with padding 1 on 4x4 images had its gradient
        // computed on 6x6 and cropped, 2.25x the work.
        let full = [self.dilation[0] * (kh - 1), self.dilation[1] * (kw - 1)];
        // Padding is symmetric, so as many rows go from the end: at most
        // the rows past the input there, and never the last row.
        let cut = |a: usize| {
            let len = gs.0[a + 2].saturating_sub(1) * self.stride[a] + 1 + full[a];
            let past = len.saturating_sub(self.padding[a] + xshape.0[a + 2]);
            self.padding[a].min(full[a]).min(past).min((len - 1) / 2)
        };
        let cut = [cut(0), cut(1)];
        let pad = [full[0] - cut[0], full[1] - cut[1]];
        let op = Op::Conv2d { stride: [1, 1], padding: pad, dilation: self.dilation, groups };
        let part = b.op(op, &[spread, wt])?;
        let rows = b.crop(part, 2, self.padding[0] - cut[0], xshape.0[2])?;
        b.crop(rows, 3, self.padding[1] - cut[1], xshape.0[3])
    }

    /// The gradient with respect to the weight (of shape `wshape`).
    pub(super) fn weight_grad(&self, b: &mut Builder, g: NodeId, x: NodeId, wshape: &Shape) -> Built {
        let xs = b.shape(x);
        let (n, c, h, wd) = (xs.0[0], xs.0[1], xs.0[2], xs.0[3]);
        let groups = self.groups;
        let cg = c / groups;
        // Input channels as the batch, the batch as channels (grouped):
        // [Cg, groups * N, H, W], channel k * N + n holding x[n, k Cg + ci].
        let x5 = b.reshape(x, &Shape::new([n, groups, cg, h, wd]))?;
        let x5 = b.permute(x5, &[2, 1, 0, 3, 4])?;
        let xt = b.reshape(x5, &Shape::new([cg, groups * n, h, wd]))?;
        // g's channels as the output channels, its batch as their inputs: [O, N, Ho, Wo].
        let gt = b.permute(g, &[1, 0, 2, 3])?;
        let op = Op::Conv2d { stride: self.dilation, padding: self.padding, dilation: self.stride, groups };
        let corr = b.op(op, &[xt, gt])?; // [Cg, O, >= kh, >= kw]
        let corr = b.slice(corr, 2, 0, 1, wshape.0[2])?;
        let corr = b.slice(corr, 3, 0, 1, wshape.0[3])?;
        b.permute(corr, &[1, 0, 2, 3])
    }
}

/// A pooling's attributes.
#[derive(Clone, Copy)]
pub(super) struct Pool {
    pub(super) kind: PoolKind,
    pub(super) kernel: [usize; 2],
    pub(super) stride: [usize; 2],
    pub(super) padding: [usize; 2],
}

impl Pool {
    /// The gradient with respect to the input `x`.
    pub(super) fn input_grad(&self, b: &mut Builder, x: NodeId, g: NodeId) -> Built {
        let xs = b.shape(x);
        let Pool { kind, kernel, stride, padding } = *self;
        match kind {
            PoolKind::Avg => {
                // A depthwise convolution with 1 / (kh kw) everywhere.
                let (n, c, h, w) = (xs.0[0], xs.0[1], xs.0[2], xs.0[3]);
                let gs = b.shape(g);
                let g1 = b.reshape(g, &Shape::new([n * c, 1, gs.0[2], gs.0[3]]))?;
                let dtype = b.dtype(x);
                let value = 1.0 / (kernel[0] * kernel[1]) as f64;
                let k = b.full(value, &Shape::new([1, 1, kernel[0], kernel[1]]), dtype)?;
                let conv = Conv { stride, padding, dilation: [1, 1], groups: 1 };
                let dx = conv.input_grad(b, g1, k, &Shape::new([n * c, 1, h, w]))?;
                b.reshape(dx, &xs)
            }
            PoolKind::Max => b.op(Op::MaxPool2dGrad { kernel, stride, padding }, &[x, g]),
        }
    }

    /// The gradient with respect to `g` of `max_pool2d_grad(x, g)`, given
    /// `h`, the gradient of its result (x's shape): `h` read at each
    /// window's first maximum.
    pub(super) fn max_grad_grad(&self, b: &mut Builder, x: NodeId, h: NodeId) -> Built {
        let Pool { kernel, stride, padding, .. } = *self;
        let xs = b.shape(x);
        let y = b.op(Op::Pool2d { kind: PoolKind::Max, kernel, stride, padding }, &[x])?;
        let ys = b.shape(y);
        let (hp, wp) = (xs.0[2] + 2 * padding[0], xs.0[3] + 2 * padding[1]);
        // Padding never wins: pad x with -inf (and h with zeros).
        let xp = b.place(x, 2, padding[0], 1, hp, f64::NEG_INFINITY)?;
        let xp = b.place(xp, 3, padding[1], 1, wp, f64::NEG_INFINITY)?;
        let hpad = b.place(h, 2, padding[0], 1, hp, 0.0)?;
        let hpad = b.place(hpad, 3, padding[1], 1, wp, 0.0)?;
        let mut free = b.full(1.0, &ys, crate::ir::DType::Bool)?; // windows not claimed yet
        let mut total: Option<NodeId> = None;
        for i in 0..kernel[0] {
            for j in 0..kernel[1] {
                let at = b.slice(xp, 2, i, stride[0], ys.0[2])?;
                let at = b.slice(at, 3, j, stride[1], ys.0[3])?;
                let is_max = b.compare(CompareOp::Eq, at, y)?;
                let hit = b.and(is_max, free)?;
                let other = b.compare(CompareOp::Ne, at, y)?;
                free = b.and(free, other)?;
                let hs = b.slice(hpad, 2, i, stride[0], ys.0[2])?;
                let hs = b.slice(hs, 3, j, stride[1], ys.0[3])?;
                let part = b.keep_where(hit, hs)?;
                total = Some(match total {
                    Some(t) => b.binary(BinaryOp::Add, t, part)?,
                    None => part,
                });
            }
        }
        Ok(total.ok_or("max_pool2d with an empty kernel")?)
    }
}
