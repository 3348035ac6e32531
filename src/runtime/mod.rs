//! The runtime: runs in flight, what waits for them, and futures.
//!
//! # Non-blocking runs
//!
//! A read that needs no host data (`realize`, a training step's plan, a
//! captured step's call) launches its plan and returns. Every buffer a
//! run makes carries the run's [`Completion`]; a later plan that reads the
//! buffer is ordered after the run on the device (on CUDA every plan
//! forks from and joins into one stream, so stream order is the order of
//! launches), never by the host. Only host reads (`to_vec`, `item`,
//! `save`) wait, and only for the completion of what they read. Variable
//! assignments keep program order because their values are buffers of
//! runs launched in program order.
//!
//! A run's error (a bad gather index, found on the device) cannot be
//! returned by the call that launched it. It is kept in the completion and
//! flows to every run that read its outputs ([`completion`]), so the next
//! host read of anything that depends on it returns it. On the CPU runs
//! finish before the launching call returns, so their errors come at once.
//!
//! A context keeps at most [`InFlight::limit`] runs in flight (default 2,
//! `Context::with_max_in_flight`): launching one more first waits for the
//! oldest, so a loop that never reads cannot queue unbounded device work
//! and memory. That wait holds no lock: other threads record, upload,
//! read and launch meanwhile (each launching thread waits for a run of
//! its own, so with several the limit can be passed by one run per
//! thread for a moment).
//!
//! # Who waits for what
//!
//! Any thread may wait on any completion, several at once: host reads of
//! its buffers, a launch at the limit, `sync`, a context's drop, and the
//! runtime thread (which only queries). The first to settle a completion
//! stores the outcome, and every other waiter, and every run that read
//! it, gets that same outcome ([`completion`]), so an error reaches every
//! reader. A run's buffers are owned by the tensors (and futures) that
//! hold them and by the runs that read them; the device writes them only
//! before the run's completion fires, and nothing is freed before that
//! (a context dropped with runs in flight waits for them).
//!
//! The failure paths only a device reaches (a run failing while in
//! flight, at the limit, with threads reading at once, with futures
//! dropped midway) are tested on the CPU through a backend whose runs stay
//! in flight (`runtime/inject`), and on a GPU in `tests/runtime`.
//!
//! # Futures
//!
//! [`Read`] and [`Done`] are plain `std` futures, for any executor; the
//! library depends on none. A future that finds its work still running
//! hands its completion and waker to the device's runtime thread
//! ([`waiter`]) and returns `Pending`. Futures own reference-counted
//! buffers, never borrowed memory, so no drop or forget can free memory
//! the device still writes. Dropping one, before or after its first poll,
//! only means its work completes unobserved: what it held is released
//! then (the runtime thread drops a watched one's entry when the work
//! finishes).
//!
//! A future holds its context, as a tensor does, so it can be awaited
//! after every other handle is gone. Forgetting one (`mem::forget`)
//! therefore leaks that context, as forgetting a tensor would: its graph,
//! buffers and device, and on a GPU its runtime thread, stay until the
//! process exits. That is a leak, never a hazard: the work completes, and
//! the context stays usable by whatever still holds it (a test shows
//! both).

mod api;
pub(crate) mod completion;
mod future;
#[cfg(test)]
mod inject;
pub(crate) mod waiter;

pub use completion::Completion;
pub use future::{Done, Read};

use std::collections::VecDeque;

/// The runs a context has in flight, oldest first (see the module docs).
pub(crate) struct InFlight {
    runs: VecDeque<Completion>,
    /// The most runs in flight at once (at least 1).
    pub(crate) limit: usize,
    /// The first error of a run that finished since the last
    /// [`InFlight::settle`] (what `sync` reports).
    failure: Option<crate::Error>,
}

impl Default for InFlight {
    fn default() -> InFlight {
        InFlight { runs: VecDeque::new(), limit: 2, failure: None }
    }
}

impl InFlight {
    /// Forgets the oldest runs while they have finished (settling them, so
    /// their errors are kept by the buffers that carry them).
    fn prune(&mut self) {
        while let Some(outcome) = self.runs.front().and_then(Completion::try_settle) {
            self.runs.pop_front();
            if let Err(e) = outcome {
                self.note(e);
            }
        }
    }

    /// Keeps a run's error for the next `sync` (the first one wins).
    pub(crate) fn note(&mut self, e: crate::Error) {
        self.failure.get_or_insert(e);
    }

    /// Forgets every finished run and returns the first error of a run
    /// that finished since the last call (each error is returned once).
    pub(crate) fn settle(&mut self) -> Option<crate::Error> {
        self.prune();
        self.failure.take()
    }

    /// The run to wait for before another may launch: the oldest, when
    /// `limit` runs are in flight.
    pub(crate) fn over_limit(&mut self) -> Option<Completion> {
        self.prune();
        if self.runs.len() >= self.limit.max(1) {
            self.runs.pop_front()
        } else {
            None
        }
    }

    /// Adds a launched run.
    pub(crate) fn push(&mut self, run: Completion) {
        match run.try_settle() {
            None => self.runs.push_back(run),
            Some(Err(e)) => self.note(e),
            Some(Ok(())) => {}
        }
    }

    /// Every run still in flight.
    pub(crate) fn all(&mut self) -> Vec<Completion> {
        self.prune();
        self.runs.iter().cloned().collect()
    }
}

impl Drop for InFlight {
    /// A context dropped with runs in flight waits for them: a run may
    /// still be copying its status into host memory its completion owns.
    fn drop(&mut self) {
        for c in self.runs.drain(..) {
            let _ = c.wait();
        }
    }
}
