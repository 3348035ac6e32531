//! The user's side of the runtime: async reads, waiting for everything
//! launched, and the limit of runs in flight.

use super::{Done, Read};
use crate::ir::Element;
use crate::{Context, Error, Location, Result, Tensor};

impl Tensor {
    /// Launches the work that computes the tensor and returns a future of
    /// its values on the host: [`Tensor::to_vec`] without blocking the
    /// thread. The work starts now, not at the first poll; the future is
    /// `Send + 'static` and runs under any executor (tokio, a plain
    /// `block_on`). Dropping it never cancels or corrupts anything: the
    /// work finishes and its memory is released then.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct W(std::thread::Thread);
    /// #     impl std::task::Wake for W { fn wake(self: std::sync::Arc<Self>) { self.0.unpark() } }
    /// #     let waker = std::task::Waker::from(std::sync::Arc::new(W(std::thread::current())));
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut std::task::Context::from_waker(&waker)) { return v; }
    /// #         std::thread::park();
    /// #     }
    /// # }
    /// let ctx = Context::best();
    /// let x = ctx.arange(0.0f32, 4.0, 1.0);
    /// let (a, b) = ((&x * 2.0).to_vec_async::<f32>(), x.sum_all().item_async::<f32>());
    /// // both are launched; await them in any order
    /// assert_eq!(block_on(b)?, 6.0);
    /// assert_eq!(block_on(a)?, vec![0.0, 2.0, 4.0, 6.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn to_vec_async<T: Element + Send + 'static>(&self) -> Read<Vec<T>> {
        self.read_async("to_vec_async", Location::caller())
    }

    /// The value of a one-element tensor, as a future (see
    /// [`Tensor::to_vec_async`]).
    #[track_caller]
    pub fn item_async<T: Element + Send + 'static>(&self) -> Read<T> {
        let location = Location::caller();
        if self.error().is_none() && self.numel() != 1 {
            return Read::failed(Error::Shape {
                op: "item_async",
                message: format!("item needs a tensor with one element, got shape {}", self.shape_ir()),
                location,
            });
        }
        let read = self.read_async::<T>("item_async", location);
        read.map(|v: Vec<T>| {
            v.into_iter().next().ok_or_else(|| Error::Backend("no element came back".into()))
        })
    }

    fn read_async<T: Element + Send + 'static>(&self, op: &'static str, location: Location) -> Read<Vec<T>> {
        let launched = (|| {
            let (ctx, _) = self.live()?;
            self.check_read_dtype::<T>(op, location)?;
            ctx.state().check_not_capturing(location)?;
            let buffer = ctx.realize_nodes(&[self.current_node()?])?.remove(0);
            Ok((ctx.clone(), buffer))
        })();
        match launched {
            Ok((ctx, buffer)) => Read::new(ctx, buffer, |host| {
                T::from_host(host).ok_or_else(|| Error::Backend("the backend returned another dtype".into()))
            }),
            Err(e) => Read::failed(e),
        }
    }
}

impl Context {
    /// [`Context::realize`] as a future: launches the plan now and
    /// resolves once the device has computed every tensor (with the first
    /// error that work found). The values stay on the device.
    #[track_caller]
    pub fn realize_async(&self, tensors: &[&Tensor]) -> Done {
        let location = Location::caller();
        let launched = (|| {
            let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
            self.state().check_not_capturing(location)?;
            self.realize_nodes(&targets)
        })();
        match launched {
            Ok(buffers) => Done::new(buffers.iter().map(|b| b.completion()).collect()),
            Err(e) => Done::failed(e),
        }
    }

    /// Launches every pending assignment (as [`Context::sync`]) and
    /// resolves once every run this context launched has finished, with
    /// the first error a run found since the last sync (each error is
    /// reported by one sync, blocking or not).
    #[track_caller]
    pub fn sync_async(&self) -> Done {
        match self.realize_nodes(&[]) {
            Ok(_) => {
                let ctx = self.clone();
                Done::settling(self.state().runs.all(), Box::new(move || ctx.state().runs.settle()))
            }
            Err(e) => Done::failed(e),
        }
    }

    /// Runs every pending assignment (and pending gradient) now, in one
    /// plan, without reading anything, and waits until every run this
    /// context launched has finished; returns the first error a run found
    /// (a bad index found on the device) since the last `sync`.
    #[track_caller]
    pub fn sync(&self) -> Result<()> {
        self.realize_nodes(&[])?;
        let runs = self.state().runs.all();
        for c in &runs {
            // Settles it; its error is collected below, once.
            let _ = c.wait();
        }
        match self.state().runs.settle() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// How many runs may be in flight at once (default 2, at least 1):
    /// launching one more first waits for the oldest. More lets the host
    /// run further ahead of the device, at the cost of the memory the
    /// extra runs' outputs hold.
    pub fn with_max_in_flight(self, runs: usize) -> Context {
        self.state().runs.limit = runs.max(1);
        self
    }
}
