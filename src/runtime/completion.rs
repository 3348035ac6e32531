//! [`Completion`]: the finish line of one piece of device work (a run, an
//! upload), with the error it found, and the errors of the work it read.
//!
//! A completion is *signalled* when the device has finished (a CUDA event
//! has fired) and *settled* once kiln has looked at what the work found
//! (a plan's index checks) and at the completions of the buffers it read:
//! a run that read the output of a failed run fails with that run's error,
//! so an error surfaces at the next host read of anything that depends on
//! it, however many runs later. Settling is idempotent and cached; once
//! settled a completion drops what it read (so chains of runs never grow
//! past the runs in flight, which the context bounds).
//!
//! # Who settles
//!
//! Any thread may wait on a completion (readers, the launch waiting at the
//! in-flight limit, `sync`, the context's drop), several at once. Each
//! waits for the signal on its own, without a lock; settling then runs
//! under the completion's `pending` lock, and the first thread to take it
//! consumes the check and the read list, stores the outcome, and every
//! other thread finds that outcome stored when it gets the lock. So every
//! waiter returns the same outcome (the error, if the check found one),
//! and so does every later completion that read this one.

use super::waiter::Runtime;
use crate::Result;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::Waker;

/// A device-side "done" flag (a CUDA event after the work).
pub(crate) trait Signal: Send + Sync {
    /// True once the work has finished; never blocks.
    fn query(&self) -> Result<bool>;
    /// Blocks the calling thread until the work has finished.
    fn wait(&self) -> Result<()>;
}

/// What a run must check once it has finished (its index checks' status
/// words, copied back to the host by the run itself).
pub(crate) type Check = Box<dyn FnOnce() -> Result<()> + Send>;

/// What settling consumes; locked for the whole of settling, so one
/// thread settles and every other finds the outcome (see the module docs).
struct Pending {
    check: Option<Check>,
    /// Unsettled completions of the buffers the work read.
    read: Vec<Completion>,
}

struct Inner {
    /// `None`: finished when made (work on the caller's thread).
    signal: Option<Box<dyn Signal>>,
    pending: Mutex<Pending>,
    /// Set once, under `pending`'s lock.
    outcome: OnceLock<Result<()>>,
    /// The thread that wakes futures waiting on `signal`.
    runtime: Option<Arc<Runtime>>,
}

/// The completion of device work; cheap to clone (shared). See the
/// module docs.
#[derive(Clone)]
pub struct Completion(Arc<Inner>);

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.outcome.get() {
            Some(Ok(())) => write!(f, "Completion(ok)"),
            Some(Err(e)) => write!(f, "Completion(failed: {e})"),
            None => write!(f, "Completion(in flight)"),
        }
    }
}

impl Completion {
    /// Work that finished before this call returned, without error.
    pub(crate) fn done() -> Completion {
        static DONE: OnceLock<Completion> = OnceLock::new();
        DONE.get_or_init(Completion::made_done).clone()
    }

    fn made_done() -> Completion {
        let inner = Inner {
            signal: None,
            pending: Mutex::new(Pending { check: None, read: Vec::new() }),
            outcome: OnceLock::from(Ok(())),
            runtime: None,
        };
        Completion(Arc::new(inner))
    }

    /// Work in flight: finished when `signal` fires, then `check`ed; it
    /// fails if any of `read` failed. Completions of `read` that have
    /// settled well are dropped here.
    // Only device backends (CUDA) launch work that outlives the call.
    #[cfg_attr(not(feature = "cuda-backend"), allow(dead_code))]
    pub(crate) fn in_flight(
        signal: Box<dyn Signal>,
        check: Option<Check>,
        read: impl IntoIterator<Item = Completion>,
        runtime: Arc<Runtime>,
    ) -> Completion {
        let mut kept: Vec<Completion> = Vec::new();
        for c in read {
            if !c.settled_ok() && !kept.iter().any(|k| k.same(&c)) {
                kept.push(c);
            }
        }
        Completion(Arc::new(Inner {
            signal: Some(signal),
            pending: Mutex::new(Pending { check, read: kept }),
            outcome: OnceLock::new(),
            runtime: Some(runtime),
        }))
    }

    /// True if both are the same completion (not merely equal outcomes).
    pub(crate) fn same(&self, other: &Completion) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    #[cfg_attr(not(feature = "cuda-backend"), allow(dead_code))]
    fn settled_ok(&self) -> bool {
        matches!(self.0.outcome.get(), Some(Ok(())))
    }

    /// True once the device has finished (or it never ran on one); never
    /// blocks, and does not settle.
    pub(crate) fn finished(&self) -> Result<bool> {
        if self.0.outcome.get().is_some() {
            return Ok(true);
        }
        match &self.0.signal {
            None => Ok(true),
            Some(s) => s.query(),
        }
    }

    /// Blocks until the work has finished and returns its outcome: its own
    /// error, or the first error of the work it read. Every caller, on
    /// any thread, gets the same outcome.
    pub(crate) fn wait(&self) -> Result<()> {
        if let Some(o) = self.0.outcome.get() {
            return o.clone();
        }
        // Waited for without the lock: other threads may wait on the
        // signal too, and may settle meanwhile.
        let own = match &self.0.signal {
            Some(s) => s.wait(),
            None => Ok(()),
        };
        let mut pending = self.0.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = self.0.outcome.get() {
            // Another thread settled it while this one waited.
            return o.clone();
        }
        let checked = own.and_then(|()| pending.check.take().map_or(Ok(()), |c| c()));
        // What it read finished before it (stream order): these waits do
        // not block, they only collect errors. Their locks are taken while
        // this one is held, always from later work to earlier, so never in
        // a cycle.
        let read = std::mem::take(&mut pending.read);
        let upstream = read.iter().map(Completion::wait).find(Result::is_err).unwrap_or(Ok(()));
        // The error of what it read comes first: it is the cause.
        let outcome = upstream.and(checked);
        self.0.outcome.get_or_init(|| outcome).clone()
    }

    /// Settles the completion if the device has finished; `Some(outcome)`
    /// then, `None` while the work runs. Never blocks on the device.
    pub(crate) fn try_settle(&self) -> Option<Result<()>> {
        match self.finished() {
            Ok(true) => Some(self.wait()),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// True when the runtime thread that would wake a waiting future
    /// could not be started.
    pub(crate) fn runtime_stopped(&self) -> bool {
        self.0.runtime.as_ref().is_some_and(|r| r.stopped())
    }

    /// Wakes `waker` once the device has finished (at once if it has).
    pub(crate) fn wake_when_finished(&self, waker: &Waker) {
        match (&self.0.runtime, self.finished()) {
            (Some(rt), Ok(false)) => rt.watch(self.clone(), waker.clone()),
            _ => waker.wake_by_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);
    impl Signal for Flag {
        fn query(&self) -> Result<bool> {
            Ok(self.0.load(Ordering::Acquire))
        }
        fn wait(&self) -> Result<()> {
            while !self.0.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            Ok(())
        }
    }

    fn flagged(read: Vec<Completion>, check: Option<Check>) -> (Completion, Arc<AtomicBool>) {
        let f = Arc::new(AtomicBool::new(false));
        (Completion::in_flight(Box::new(Flag(f.clone())), check, read, Runtime::shared()), f)
    }

    #[test]
    fn an_error_flows_to_every_completion_that_read_the_failed_work() {
        let (bad, fb) =
            flagged(vec![], Some(Box::new(|| Err(Error::Runtime("index 9 out of range".into())))));
        let (mid, fm) = flagged(vec![bad.clone()], None);
        let (last, fl) = flagged(vec![mid.clone(), Completion::done()], None);
        assert_eq!(last.try_settle().map(|r| r.is_ok()), None, "not finished yet");
        for f in [&fb, &fm, &fl] {
            f.store(true, Ordering::Release);
        }
        let e = last.wait().unwrap_err().to_string();
        assert!(e.contains("index 9 out of range"), "{e}");
        assert!(mid.wait().is_err() && bad.wait().is_err());
        // Settled: the check ran once, the outcome is cached.
        assert_eq!(last.wait().unwrap_err().to_string(), e);
    }

    #[test]
    fn settled_work_is_not_kept_by_later_work() {
        let (ok, f) = flagged(vec![], None);
        f.store(true, Ordering::Release);
        ok.wait().unwrap();
        let (next, _) = flagged(vec![ok.clone()], None);
        assert!(next.0.pending.lock().unwrap().read.is_empty());
        assert_eq!(Arc::strong_count(&ok.0), 1);
    }
}
