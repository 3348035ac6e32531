//! Adding gradient nodes: a thin layer over [`Graph::add`] that puts every
//! node in one region and spells out the view arithmetic the rules share
//! (summing a broadcast back, padding a slice back, cropping).
//!
//! Every node goes through `Graph::add`, so [`crate::ir::infer`] checks it:
//! a rule that builds an ill-typed node is an error naming the op, never a
//! wrong graph.

use crate::ir::{BinaryOp, CompareOp, DType, Graph, NodeId, Op, ReduceOp, RegionId, Scalar, Shape, UnaryOp};

/// What rules return: a node, or the message of a node `infer` refused.
pub(super) type Built<T = NodeId> = Result<T, String>;

/// Builds nodes into one region of a graph.
pub(super) struct Builder<'g> {
    pub(super) g: &'g mut Graph,
    pub(super) region: RegionId,
}

impl Builder<'_> {
    pub(super) fn shape(&self, x: NodeId) -> Shape {
        self.g.node(x).shape.clone()
    }

    pub(super) fn dtype(&self, x: NodeId) -> DType {
        self.g.node(x).dtype
    }

    fn add(&mut self, op: Op, operands: &[NodeId]) -> Built {
        let name = op.mnemonic();
        self.g.add(op, operands, None, self.region).map_err(|m| format!("{name}: {m}"))
    }

    /// Every element `value` (rounded to `dtype` as a cast would).
    pub(super) fn full(&mut self, value: f64, shape: &Shape, dtype: DType) -> Built {
        let v =
            if dtype == DType::Bool { Scalar::Bool(value != 0.0) } else { Scalar::Float(value).cast(dtype) };
        self.g
            .add(Op::Full(v), &[], Some((shape.clone(), dtype)), self.region)
            .map_err(|m| format!("full: {m}"))
    }

    /// Zeros of `x`'s shape and dtype.
    pub(super) fn zeros_like(&mut self, x: NodeId) -> Built {
        let (shape, dtype) = (self.shape(x), self.dtype(x));
        self.full(0.0, &shape, dtype)
    }

    /// `value` of `x`'s shape and dtype.
    pub(super) fn full_like(&mut self, x: NodeId, value: f64) -> Built {
        let (shape, dtype) = (self.shape(x), self.dtype(x));
        self.full(value, &shape, dtype)
    }

    /// `start, start + step, ...` (`len` values) of an integer dtype.
    pub(super) fn arange(&mut self, start: i64, step: i64, len: usize, dtype: DType) -> Built {
        let op = Op::Arange { start: Scalar::Int(start), step: Scalar::Int(step) };
        self.g.add(op, &[], Some((Shape::new([len]), dtype)), self.region).map_err(|m| format!("arange: {m}"))
    }

    pub(super) fn unary(&mut self, op: UnaryOp, x: NodeId) -> Built {
        self.add(Op::Unary(op), &[x])
    }

    pub(super) fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Built {
        self.add(Op::Binary(op), &[a, b])
    }

    pub(super) fn add_(&mut self, a: NodeId, b: NodeId) -> Built {
        self.binary(BinaryOp::Add, a, b)
    }

    pub(super) fn sub(&mut self, a: NodeId, b: NodeId) -> Built {
        self.binary(BinaryOp::Sub, a, b)
    }

    pub(super) fn mul(&mut self, a: NodeId, b: NodeId) -> Built {
        self.binary(BinaryOp::Mul, a, b)
    }

    pub(super) fn div(&mut self, a: NodeId, b: NodeId) -> Built {
        self.binary(BinaryOp::Div, a, b)
    }

    pub(super) fn neg(&mut self, x: NodeId) -> Built {
        self.unary(UnaryOp::Neg, x)
    }

    /// `x * value`, the constant in `x`'s dtype.
    pub(super) fn scale(&mut self, x: NodeId, value: f64) -> Built {
        let c = self.full_like(x, value)?;
        self.mul(x, c)
    }

    pub(super) fn compare(&mut self, op: CompareOp, a: NodeId, b: NodeId) -> Built {
        self.add(Op::Compare(op), &[a, b])
    }

    /// Logical and of two bool tensors (`minimum` on bool).
    pub(super) fn and(&mut self, a: NodeId, b: NodeId) -> Built {
        self.binary(BinaryOp::Minimum, a, b)
    }

    pub(super) fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Built {
        self.add(Op::Where, &[cond, a, b])
    }

    /// `cond ? x : 0`.
    pub(super) fn keep_where(&mut self, cond: NodeId, x: NodeId) -> Built {
        let zero = self.zeros_like(x)?;
        self.select(cond, x, zero)
    }

    pub(super) fn cast(&mut self, x: NodeId, dtype: DType) -> Built {
        if self.dtype(x) == dtype {
            return Ok(x);
        }
        self.add(Op::Cast(dtype), &[x])
    }

    pub(super) fn reshape(&mut self, x: NodeId, shape: &Shape) -> Built {
        if self.shape(x) == *shape {
            return Ok(x);
        }
        self.add(Op::Reshape(shape.clone()), &[x])
    }

    pub(super) fn expand(&mut self, x: NodeId, shape: &Shape) -> Built {
        if self.shape(x) == *shape {
            return Ok(x);
        }
        self.add(Op::Expand(shape.clone()), &[x])
    }

    pub(super) fn permute(&mut self, x: NodeId, perm: &[usize]) -> Built {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        self.add(Op::Permute(perm.to_vec()), &[x])
    }

    /// Whether `x` is a `permute` that swaps the last two dims (a Linear's
    /// `w.t()`).
    ///
    /// *Why the matmul rule asks.* The gradient of a
    /// transposed operand `wᵀ` is computed as the transpose of the product
    /// taken the other way round, `aᵀ g = (gᵀ a)ᵀ` (each element the same
    /// dot product), so that the gradient of `w` itself, `permute` of
    /// that, folds to a product written in `w`'s own layout. Otherwise a
    /// Linear's weight gradient is a transposed view of an `[in, out]`
    /// product: an optimizer then reads it with strides, and a data-parallel
    /// bucket's `flatten` copies it (48 copies, 0.8 ms of GPT-2 small's
    /// bf16 step on two GPUs).
    pub(super) fn is_transpose(&self, x: NodeId) -> bool {
        let rank = self.shape(x).rank();
        match &self.g.node(x).op {
            Op::Permute(p) if rank >= 2 => p.iter().enumerate().all(|(i, &d)| match i {
                _ if i == rank - 2 => d == rank - 1,
                _ if i == rank - 1 => d == rank - 2,
                _ => d == i,
            }),
            _ => false,
        }
    }

    /// Swaps the last two dims.
    pub(super) fn transpose_last(&mut self, x: NodeId) -> Built {
        let rank = self.shape(x).rank();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        self.permute(x, &perm)
    }

    pub(super) fn slice(&mut self, x: NodeId, dim: usize, start: usize, step: usize, len: usize) -> Built {
        if start == 0 && step == 1 && self.shape(x).0[dim] == len {
            return Ok(x);
        }
        self.add(Op::Slice { dim, start, step, len }, &[x])
    }

    pub(super) fn reduce(&mut self, op: ReduceOp, x: NodeId, dims: &[usize], keepdim: bool) -> Built {
        self.add(Op::Reduce { op, dims: dims.to_vec(), keepdim, into: None }, &[x])
    }

    pub(super) fn matmul(&mut self, a: NodeId, b: NodeId) -> Built {
        self.add(Op::MatMul, &[a, b])
    }

    /// Joins along `dim`, leaving out empty pieces (one piece is itself).
    pub(super) fn cat(&mut self, pieces: &[NodeId], dim: usize) -> Built {
        let kept: Vec<NodeId> = pieces.iter().copied().filter(|&p| self.shape(p).0[dim] > 0).collect();
        match kept[..] {
            [] => Ok(pieces[0]),
            [one] => Ok(one),
            _ => self.add(Op::Cat { dim }, &kept),
        }
    }

    pub(super) fn op(&mut self, op: Op, operands: &[NodeId]) -> Built {
        self.add(op, operands)
    }

    /// The shape of `x` with `dim` resized to `n`.
    fn resized(&self, x: NodeId, dim: usize, n: usize) -> Shape {
        let mut s = self.shape(x);
        s.0[dim] = n;
        s
    }

    /// Sums a value of `expand`'s output shape back to the operand shape
    /// `to`: over the leading dims `expand` added and over the dims where
    /// it repeated a size-1 dim. The vector-Jacobian product of `expand`.
    ///
    /// The sum keeps its dims, so that a row value's gradient (a layer
    /// norm's mean or deviation, `[rows, 1]`) is the reduction itself,
    /// which a fused row kernel may compute and read on (fused bodies
    /// drop reduced dims only at their output); the reshape to `to` is
    /// then the identity, or drops leading 1s as a view.
    pub(super) fn sum_to(&mut self, x: NodeId, to: &Shape) -> Built {
        let from = self.shape(x);
        let lead = from.rank() - to.rank();
        let dims: Vec<usize> =
            (0..from.rank()).filter(|&d| d < lead || (to.0[d - lead] == 1 && from.0[d] != 1)).collect();
        let summed = if dims.is_empty() { x } else { self.reduce(ReduceOp::Sum, x, &dims, true)? };
        self.reshape(summed, to)
    }

    /// `x` (reduced over `dims`, kept or not) brought back to `shape` by
    /// reshaping to the kept form and expanding.
    pub(super) fn unreduce(&mut self, x: NodeId, dims: &[usize], shape: &Shape) -> Built {
        let mut kept = shape.clone();
        for &d in dims {
            kept.0[d] = 1;
        }
        let r = self.reshape(x, &kept)?;
        self.expand(r, shape)
    }

    /// A tensor of `x`'s shape except `n` along `dim`, holding `x[i]` at
    /// `start + i * step` and `fill` everywhere else: the vector-Jacobian
    /// product of `slice` (with `fill` 0), and the zero-insertion that
    /// dilates a strided convolution's gradient. Built from `cat` (with
    /// zeros), `reshape` and `slice`, so it needs no scatter op.
    pub(super) fn place(
        &mut self,
        x: NodeId,
        dim: usize,
        start: usize,
        step: usize,
        n: usize,
        fill: f64,
    ) -> Built {
        let len = self.shape(x).0[dim];
        let dtype = self.dtype(x);
        // One element needs no spreading, whatever the step (which may be
        // past the end, up to usize::MAX: `len * step` would overflow).
        let step = if len == 1 { 1 } else { step };
        if len == 0 {
            let shape = self.resized(x, dim, n);
            return self.full(fill, &shape, dtype);
        }
        // Spread: x[i] at i * step, filled between; `len * step` long.
        let spread = if step == 1 {
            x
        } else {
            let mut column = self.shape(x);
            column.0.insert(dim + 1, 1);
            let col = self.reshape(x, &column)?;
            let mut gap = column.clone();
            gap.0[dim + 1] = step - 1;
            let gap = self.full(fill, &gap, dtype)?;
            let both = self.cat(&[col, gap], dim + 1)?;
            let flat = self.resized(x, dim, len * step);
            self.reshape(both, &flat)?
        };
        // Only the first (len - 1) * step + 1 matter; the rest may run past n.
        let used = ((len - 1) * step + 1).min(n - start);
        let used_part = self.slice(spread, dim, 0, 1, used)?;
        let before = self.resized(x, dim, start);
        let before = self.full(fill, &before, dtype)?;
        let after = self.resized(x, dim, n - start - used);
        let after = self.full(fill, &after, dtype)?;
        self.cat(&[before, used_part, after], dim)
    }

    /// `len` entries of `x` along `dim` from `start`; positions past the
    /// end of `x` are zeros.
    pub(super) fn crop(&mut self, x: NodeId, dim: usize, start: usize, len: usize) -> Built {
        let size = self.shape(x).0[dim];
        let valid = len.min(size.saturating_sub(start));
        let dtype = self.dtype(x);
        let part = if valid == 0 {
            let shape = self.resized(x, dim, 0);
            self.full(0.0, &shape, dtype)?
        } else {
            self.slice(x, dim, start, 1, valid)?
        };
        let rest = self.resized(x, dim, len - valid);
        let rest = self.full(0.0, &rest, dtype)?;
        self.cat(&[part, rest], dim)
    }

    /// Reverses `x` along `dim` (`index_select` with a descending range).
    pub(super) fn flip(&mut self, x: NodeId, dim: usize) -> Built {
        let n = self.shape(x).0[dim];
        if n <= 1 {
            return Ok(x);
        }
        let index = self.arange(n as i64 - 1, -1, n, DType::I64)?;
        self.add(Op::IndexSelect { dim }, &[x, index])
    }
}

/// A `cat` as its pieces along its dim: (length, `None` for a `+0` fill
/// or `Some` value), empty pieces left out.
type Pieces = Vec<(usize, Option<NodeId>)>;

impl Builder<'_> {
    /// The pieces of `x` if it is a `cat`, with its dim.
    fn pieces(&self, x: NodeId) -> Option<(usize, Pieces)> {
        let Op::Cat { dim } = self.g.node(x).op else { return None };
        let pieces = self
            .g
            .operands(x)
            .into_iter()
            .map(|p| {
                let n = self.g.node(p);
                let zero = matches!(n.op, Op::Full(Scalar::Float(v)) if v == 0.0 && v.is_sign_positive());
                (n.shape.0[dim], if zero { None } else { Some(p) })
            })
            .filter(|(len, _)| *len > 0)
            .collect();
        Some((dim, pieces))
    }

    /// The pieces of `a + b` when both are zero-padded `cat`s along one
    /// dim whose values never overlap (each value whole, the other side
    /// zero across it); `None` otherwise. The gradients of slices that
    /// tile a tensor (GPT's q, k and v cut from one projection) sum to one
    /// `cat` of their windows this way ([`Builder::cat_pieces`]): no
    /// padded copies and no add.
    pub(super) fn join_pads(&self, a: NodeId, b: NodeId) -> Option<(usize, Pieces)> {
        let ((da, pa), (db, pb)) = (self.pieces(a)?, self.pieces(b)?);
        if da != db || self.shape(a) != self.shape(b) || self.dtype(a) != self.dtype(b) {
            return None;
        }
        // Each side as a run of (start, len, value) over the dim.
        let runs = |p: &Pieces| {
            let mut at = 0;
            p.iter()
                .map(|&(len, v)| {
                    at += len;
                    (at - len, len, v)
                })
                .collect::<Vec<_>>()
        };
        let (ra, rb) = (runs(&pa), runs(&pb));
        let zero_over = |r: &[(usize, usize, Option<NodeId>)], s: usize, e: usize| {
            r.iter().filter(|(rs, rl, _)| *rs < e && rs + rl > s).all(|(_, _, v)| v.is_none())
        };
        let mut values: Vec<(usize, usize, NodeId)> = Vec::new();
        for (mine, other) in [(&ra, &rb), (&rb, &ra)] {
            for &(s, len, v) in mine {
                if let Some(v) = v {
                    if !zero_over(other, s, s + len) {
                        return None;
                    }
                    values.push((s, len, v));
                }
            }
        }
        values.sort_unstable_by_key(|&(s, _, _)| s);
        let total = self.shape(a).0[da];
        let mut out = Pieces::new();
        let mut at = 0;
        for (s, len, v) in values {
            if s > at {
                out.push((s - at, None));
            }
            out.push((len, Some(v)));
            at = s + len;
        }
        if total > at {
            out.push((total - at, None));
        }
        Some((da, out))
    }

    /// A `cat` along `dim` of `pieces` (zeros built at their lengths), of
    /// `like`'s shape and dtype; a single value is itself.
    pub(super) fn cat_pieces(&mut self, like: NodeId, (dim, pieces): (usize, Pieces)) -> Built {
        if let [(_, Some(v))] = pieces[..] {
            return Ok(v);
        }
        let dtype = self.dtype(like);
        let mut nodes = Vec::with_capacity(pieces.len());
        for (len, v) in pieces {
            nodes.push(match v {
                Some(v) => v,
                None => {
                    let shape = self.resized(like, dim, len);
                    self.full(0.0, &shape, dtype)?
                }
            });
        }
        if nodes.len() == 1 {
            return Ok(nodes[0]);
        }
        self.cat(&nodes, dim)
    }
}
