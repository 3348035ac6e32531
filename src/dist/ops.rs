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
