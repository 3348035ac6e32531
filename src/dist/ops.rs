//! The user's side of collectives and of moving a tensor between
//! devices: methods on [`Tensor`], and the label a context is named by in
//! device errors.

use crate::ir::{Collective, Op, ReduceOp};
use crate::{Context, Error, Location, Tensor};

impl Tensor {
    /// The elementwise sum over every rank of the context's process group
    /// ([`crate::dist::Group`]); every rank gets the same bits. Recorded
    /// like any op; it runs when a read needs it, and every rank must run
    /// the same collectives in the same order. Differentiable: the
    /// gradient is the all-reduce sum of the ranks' gradients.
    #[track_caller]
    pub fn all_reduce_sum(&self) -> Tensor {
        self.collective(Collective::AllReduce(ReduceOp::Sum), Location::caller())
    }

    /// The elementwise mean over every rank (float dtypes), as
    /// [`Tensor::all_reduce_sum`] divided by the group's size: what data
    /// parallelism averages gradients with.
    #[track_caller]
    pub fn all_reduce_mean(&self) -> Tensor {
        self.collective(Collective::AllReduce(ReduceOp::Mean), Location::caller())
    }

    /// The sum over every rank, split along dim 0 into one equal chunk
    /// per rank: rank `r` gets rows `r·d/n .. (r+1)·d/n` of the all-reduce
    /// sum, for dim 0 of size `d` in a group of `n` (NCCL's
    /// `ncclReduceScatter`, `torch.distributed.reduce_scatter_tensor`). A
    /// dim 0 that `n` does not divide (or a scalar) is an error naming the
    /// sizes: pad first. Differentiable: the gradient is the all-gather of
    /// the ranks' gradients. Half of an all-reduce's traffic, which is why
    /// a sharded optimizer ([`crate::dist::ShardedOptimizer`]) uses it.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::dist::Group;
    ///
    /// let group = Group::new(&[Context::cpu(), Context::cpu()])?;
    /// let chunks: Vec<Vec<f32>> = std::thread::scope(|s| {
    ///     let handles: Vec<_> = group.contexts().iter().enumerate().map(|(r, ctx)| {
    ///         // rank 0 holds [0, 1, 2, 3], rank 1 [10, 11, 12, 13]
    ///         let x = ctx.arange(0.0f32, 4.0, 1.0) + 10.0 * r as f32;
    ///         s.spawn(move || x.reduce_scatter_sum().to_vec::<f32>())
    ///     }).collect();
    ///     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_>>()
    /// })?;
    /// assert_eq!(chunks, vec![vec![10.0, 12.0], vec![14.0, 16.0]]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn reduce_scatter_sum(&self) -> Tensor {
        self.scatter(ReduceOp::Sum, Location::caller())
    }

    /// [`Tensor::reduce_scatter_sum`] divided by the group's size (float
    /// dtypes): each rank's chunk of the average.
    #[track_caller]
    pub fn reduce_scatter_mean(&self) -> Tensor {
        self.scatter(ReduceOp::Mean, Location::caller())
    }

    /// Every rank's tensor, concatenated along dim 0 in rank order, on
    /// every rank (each rank passes the same shape;
    /// `torch.distributed.all_gather_into_tensor`). A scalar is an error:
    /// reshape it to `[1]`. Differentiable: the gradient is the
    /// reduce-scatter sum of the ranks' gradients.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::dist::Group;
    ///
    /// let group = Group::new(&[Context::cpu(), Context::cpu()])?;
    /// let all: Vec<Vec<f32>> = std::thread::scope(|s| {
    ///     let handles: Vec<_> = group.contexts().iter().enumerate().map(|(r, ctx)| {
    ///         s.spawn(move || ctx.full([2], r as f32).all_gather().to_vec::<f32>())
    ///     }).collect();
    ///     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_>>()
    /// })?;
    /// assert_eq!(all, vec![vec![0.0, 0.0, 1.0, 1.0]; 2]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn all_gather(&self) -> Tensor {
        let location = Location::caller();
        let Ok((ctx, _)) = self.live() else { return self.clone() };
        let ranks = ctx.world_size().unwrap_or(1) as u32;
        self.collective(Collective::AllGather { ranks }, location)
    }

    fn scatter(&self, op: ReduceOp, location: Location) -> Tensor {
        let Ok((ctx, _)) = self.live() else { return self.clone() };
        let ranks = ctx.world_size().unwrap_or(1) as u32;
        self.collective(Collective::ReduceScatter { op, ranks }, location)
    }

    /// Rank `root`'s value of this tensor, on every rank (each rank passes
    /// a tensor of the same shape and dtype; only the root's is read).
    #[track_caller]
    pub fn broadcast_from(&self, root: usize) -> Tensor {
        let location = Location::caller();
        let Ok((ctx, _)) = self.live() else { return self.clone() };
        match ctx.world_size() {
            Some(n) if root >= n => Tensor::failed(Error::Device {
                message: format!("broadcast_from rank {root}, but the group has {n} rank(s)"),
                location,
            }),
            _ => self.collective(Collective::Broadcast(root as u32), location),
        }
    }

    fn collective(&self, what: Collective, location: Location) -> Tensor {
        let Ok((ctx, _)) = self.live() else { return self.clone() };
        if ctx.member().is_none() {
            return Tensor::failed(Error::Device {
                message: format!(
                    "{} on a context that is in no process group ({}); make the ranks' contexts a group with kiln::dist::Group::new",
                    what.mnemonic(),
                    ctx.label()
                ),
                location,
            });
        }
        // The context numbers it (`Context::record`): recording order is
        // the order every rank runs its collectives in.
        Tensor::record(&[self], Op::Collective { what, seq: 0 }, None, location)
    }

    /// A copy of this tensor on `ctx` (another device, or another context
    /// of the same one): computes the tensor, downloads it and uploads it
    /// there. Ops never copy between contexts silently; this is the
    /// explicit copy, and its errors (the tensor's own, a failed upload)
    /// are the returned tensor's.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let (a, b) = (Context::cpu(), Context::cpu());
    /// let x = a.arange(0.0f32, 3.0, 1.0);
    /// let y = x.to(&b) * 2.0;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 2.0, 4.0]);
    /// assert!((&x + &y).to_vec::<f32>().is_err()); // two contexts: an error
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn to(&self, ctx: &Context) -> Tensor {
        let (own, _) = match self.live() {
            Ok(l) => l,
            Err(_) => return self.clone(),
        };
        if own.same(ctx) {
            return self.clone();
        }
        let node = match self.current_node() {
            Ok(n) => n,
            Err(e) => return Tensor::failed(e),
        };
        let copied = own.realize_nodes(&[node]).and_then(|mut b| {
            let host = own.inner.backend.download(&b.remove(0))?;
            ctx.inner.backend.upload(host, &self.shape_ir())
        });
        match copied {
            Ok(buffer) => ctx.record_buffer(buffer),
            Err(e) => Tensor::failed(e),
        }
    }
}

impl Context {
    /// How device errors name this context: its device, and a number that
    /// tells two contexts of one device apart (`cuda:1 (context 4)`).
    pub(crate) fn label(&self) -> String {
        let description = self.inner.backend.describe();
        let device = description.split(' ').next().unwrap_or("?").to_string();
        format!("{device} (context {})", self.inner.serial)
    }
}
