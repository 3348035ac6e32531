//! A CUDA rank's part in its group's health (`dist/host.rs`): runs with
//! collectives that fail break the group, waits on them have a watchdog,
//! and a broken group is an error at every later run and wait.
//!
//! NCCL has no timeout: a rank whose partner never issues the matching
//! call waits in its kernel, or on a first call in the host's connection
//! set-up, forever. For a plan with collectives, this rank
//! - refuses to launch once the group is broken (an aborted communicator
//!   is never called again, and a captured graph holding its kernels is
//!   never replayed);
//! - breaks the group when its launch fails (the others would wait for
//!   collectives it never issued) or when the run's checks fail (its part
//!   of every collective of the run may be garbage, e.g. computed from a
//!   bad gather index): the message names the rank and its error;
//! - watches the enqueueing of an eagerly run plan (NCCL connects to the
//!   other ranks in the first call, on the host) and waits on the run
//!   ([`Watched`]) for at most the group's timeout, then breaks the
//!   group itself, naming the wait.
//!
//! Breaking runs the group's abort hooks: every rank's communicator is
//! aborted (`ncclCommAbort`), which ends the kernels and host waits stuck
//! in it, and every rank's pending and later runs with collectives fail
//! with the group's message. A run whose outcome settles after the group
//! broke fails too, even if it finished first: kiln cannot tell which of
//! the ranks' rounds paired with the failed one.

use super::nccl::Comm;
use crate::runtime::completion::{Check, Signal};
use crate::{Error, Result};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a wait keeps polling after the group broke for the aborted
/// kernels to end, before giving up on the run.
const GRACE: Duration = Duration::from_secs(10);

/// The group's error, if it broke.
pub(crate) fn refuse_if_broken(comm: &Comm) -> Result<()> {
    comm.health().map_err(Error::Runtime)
}

/// This rank failed a run with collectives: the group breaks, naming it.
pub(crate) fn rank_failed(comm: &Comm, label: &str, what: &str, e: &Error) {
    comm.group.break_group(format!("rank {} ({label}) failed {what}: {e}", comm.rank));
}

/// The run's own check (its index checks), then the group's health.
pub(crate) fn check(inner: Option<Check>, comm: Arc<Comm>, label: String) -> Check {
    Box::new(move || {
        if let Some(own) = inner {
            if let Err(e) = own() {
                rank_failed(&comm, &label, "a run with collectives", &e);
                return Err(e);
            }
        }
        refuse_if_broken(&comm)
    })
}

/// Breaks the group unless dropped within the group's timeout: what
/// guards the enqueueing of an eager run (see the module docs).
pub(crate) struct EnqueueWatch {
    done: Option<mpsc::Sender<()>>,
}

impl EnqueueWatch {
    /// Starts the watch on a thread of its own.
    pub(crate) fn start(comm: &Arc<Comm>, label: &str) -> EnqueueWatch {
        let (done, finished) = mpsc::channel::<()>();
        let (comm, label) = (comm.clone(), label.to_string());
        let timeout = comm.group.timeout();
        let watch = std::thread::Builder::new().name("kiln-nccl-watch".into()).spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(timeout) {
                comm.group.break_group(format!(
                    "rank {} ({label}) waited {timeout:?} to issue its collectives (NCCL connecting to the other ranks); some rank never issued them",
                    comm.rank
                ));
            }
        });
        // Without a thread there is no watch; the run goes on unwatched.
        EnqueueWatch { done: watch.ok().map(|_| done) }
    }
}

impl Drop for EnqueueWatch {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }
}

/// A run's completion signal with the group's watchdog (see the module
/// docs): ready when the run is; an error once the group broke and the
/// run did not end within [`GRACE`]; breaks the group itself when the run
/// takes longer than the group's timeout.
pub(crate) struct Watched {
    inner: Box<dyn Signal>,
    comm: Arc<Comm>,
    label: String,
    deadline: Instant,
    /// When this wait first saw the group broken.
    broken_seen: Mutex<Option<Instant>>,
}

impl Watched {
    /// Watches `inner`, a run launched now by `comm`'s rank.
    pub(crate) fn new(inner: Box<dyn Signal>, comm: Arc<Comm>, label: String) -> Watched {
        let deadline = Instant::now() + comm.group.timeout();
        Watched { inner, comm, label, deadline, broken_seen: Mutex::new(None) }
    }
}

impl Signal for Watched {
    fn query(&self) -> Result<bool> {
        if self.inner.query()? {
            return Ok(true);
        }
        let now = Instant::now();
        if let Some(why) = self.comm.group.broken() {
            let mut seen = self.broken_seen.lock().unwrap_or_else(|e| e.into_inner());
            let first = *seen.get_or_insert(now);
            if now.duration_since(first) >= GRACE {
                return Err(Error::Runtime(format!(
                    "the process group is broken: {why}; this rank's run with collectives did not end within {GRACE:?} of the abort"
                )));
            }
        } else if now >= self.deadline {
            self.comm.group.break_group(format!(
                "rank {} ({}) waited {:?} for a run with collectives; some rank never issued its part",
                self.comm.rank,
                self.label,
                self.comm.group.timeout()
            ));
        }
        Ok(false)
    }

    fn wait(&self) -> Result<()> {
        let mut pause = Duration::from_micros(20);
        while !self.query()? {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }
}
