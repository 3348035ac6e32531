//! The futures: [`Read`] (a value copied to the host once its run is
//! done) and [`Done`] (device work finished). Both are `Send`, `Unpin` and
//! `'static`, so any executor can spawn or await them.

use super::Completion;
use crate::backends::Buffer;
use crate::ir::HostData;
use crate::{Context, Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

/// Turns the host copy into what the future resolves to.
type Convert<T> = Box<dyn FnOnce(HostData) -> Result<T> + Send>;

enum ReadState<T> {
    /// The launch failed: the error, handed out by the first poll.
    Failed(Error),
    Waiting {
        ctx: Context,
        buffer: Buffer,
        completion: Completion,
        convert: Convert<T>,
    },
    Taken,
}

/// A value read from the device once the work that computes it has
/// finished: what [`crate::Tensor::to_vec_async`] and
/// [`crate::Tensor::item_async`] return. The work was launched when the
/// future was made, so futures made one after another run their work
/// back to back, and dropping one never cancels its work.
#[must_use = "a future does nothing unless awaited (its work runs anyway)"]
pub struct Read<T> {
    state: ReadState<T>,
}

impl<T> Read<T> {
    pub(crate) fn failed(e: Error) -> Read<T> {
        Read { state: ReadState::Failed(e) }
    }

    pub(crate) fn new(
        ctx: Context,
        buffer: Buffer,
        convert: impl FnOnce(HostData) -> Result<T> + Send + 'static,
    ) -> Read<T> {
        let completion = buffer.completion();
        Read { state: ReadState::Waiting { ctx, buffer, completion, convert: Box::new(convert) } }
    }

    /// A future of `f` applied to this one's value.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> Result<U> + Send + 'static) -> Read<U>
    where
        T: 'static,
    {
        let state = match self.state {
            ReadState::Failed(e) => ReadState::Failed(e),
            ReadState::Waiting { ctx, buffer, completion, convert } => ReadState::Waiting {
                ctx,
                buffer,
                completion,
                convert: Box::new(move |host| convert(host).and_then(f)),
            },
            ReadState::Taken => ReadState::Taken,
        };
        Read { state }
    }
}

impl<T> Future for Read<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<T>> {
        let this = self.get_mut();
        if let ReadState::Waiting { completion, .. } = &this.state {
            if !completion.ready_or_watch(cx) {
                return Poll::Pending;
            }
        }
        match std::mem::replace(&mut this.state, ReadState::Taken) {
            ReadState::Failed(e) => Poll::Ready(Err(e)),
            ReadState::Waiting { ctx, buffer, completion, convert } => {
                let _span = tracing::debug_span!("read", backend = ctx.device()).entered();
                let host = completion.wait().and_then(|()| ctx.inner.backend.download(&buffer));
                Poll::Ready(host.and_then(convert))
            }
            ReadState::Taken => Poll::Ready(Err(Error::Backend(
                "a kiln future was polled after it returned its value".into(),
            ))),
        }
    }
}

/// Device work finished: what [`Context::realize_async`] and
/// [`Context::sync_async`] return. `realize_async`'s resolves to the first
/// error the work (or work it read) found; `sync_async`'s, as `sync`
/// returns, to the first error any run found since the last sync (each
/// error is returned by one sync, blocking or not).
#[must_use = "a future does nothing unless awaited (its work runs anyway)"]
pub struct Done {
    waiting: Vec<Completion>,
    failed: Option<Error>,
    /// For a sync: takes the context's first unreported run error, once
    /// every run waited for has finished.
    settle: Option<Settle>,
}

/// Takes a context's first unreported run error.
pub(crate) type Settle = Box<dyn FnOnce() -> Option<Error> + Send>;

impl Done {
    pub(crate) fn new(waiting: Vec<Completion>) -> Done {
        Done { waiting, failed: None, settle: None }
    }

    /// Waits for every completion, then returns what `settle` takes.
    pub(crate) fn settling(waiting: Vec<Completion>, settle: Settle) -> Done {
        Done { waiting, failed: None, settle: Some(settle) }
    }

    pub(crate) fn failed(e: Error) -> Done {
        Done { waiting: Vec::new(), failed: Some(e), settle: None }
    }
}

impl Future for Done {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Err(e));
        }
        while let Some(c) = this.waiting.last() {
            if !c.ready_or_watch(cx) {
                return Poll::Pending;
            }
            let outcome = c.wait();
            this.waiting.pop();
            if let (Err(e), None) = (outcome, &this.settle) {
                this.waiting.clear();
                return Poll::Ready(Err(e));
            }
        }
        match this.settle.take().and_then(|settle| settle()) {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl Completion {
    /// True if the work has finished; otherwise asks the runtime thread to
    /// wake the task when it has. Where no runtime thread can run (it
    /// could not be started), waits here instead: slower, never a hang.
    fn ready_or_watch(&self, cx: &mut TaskContext<'_>) -> bool {
        match self.finished() {
            Ok(false) if self.runtime_stopped() => {
                let _ = self.wait();
                true
            }
            Ok(false) => {
                self.wake_when_finished(cx.waker());
                // It may have finished between the query and the watch;
                // the runtime thread wakes the task then, so Pending is
                // still right.
                false
            }
            _ => true,
        }
    }
}
