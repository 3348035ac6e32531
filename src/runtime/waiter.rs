//! The runtime thread: the one thread per device that waits for device
//! work on behalf of futures (async-cuda's design: the GPU as an I/O
//! device, one thread owns the waiting, tasks never block).
//!
//! A future whose work is still running hands its [`Completion`] and its
//! waker to [`Runtime::watch`]. The thread queries the watched completions
//! (a CUDA event query: a few hundred nanoseconds, never blocking) and
//! wakes each waker whose work finished. While anything is watched it
//! polls, yielding the core between rounds at first and then sleeping up
//! to 200 µs; with nothing watched it sleeps on a condition variable. It
//! is started by the first `watch`, so a program that never awaits never
//! has it. It holds completions (reference counted), never memory a
//! future borrowed: a future dropped or forgotten while watched leaves a
//! stale entry that is dropped, and its waker woken harmlessly, when the
//! work finishes.

use super::Completion;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Default)]
struct Watched {
    list: Vec<(Completion, Waker)>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    watched: Mutex<Watched>,
    more: Condvar,
}

/// One device's runtime thread (see the module docs).
pub(crate) struct Runtime {
    name: String,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Runtime {
    /// A runtime for the device called `name` (the thread's name); its
    /// thread starts when something is first watched.
    #[cfg_attr(not(feature = "cuda-backend"), allow(dead_code))]
    pub(crate) fn new(name: &str) -> Arc<Runtime> {
        Arc::new(Runtime { name: name.to_string(), shared: Arc::default(), thread: Mutex::new(None) })
    }

    /// A process-wide runtime, for work with no device of its own.
    #[cfg(test)]
    pub(crate) fn shared() -> Arc<Runtime> {
        static SHARED: std::sync::OnceLock<Arc<Runtime>> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| Runtime::new("shared")).clone()
    }

    /// Wakes `waker` once `completion`'s work has finished.
    pub(crate) fn watch(&self, completion: Completion, waker: Waker) {
        {
            let mut w = self.shared.watched.lock().unwrap_or_else(|e| e.into_inner());
            if w.stop {
                drop(w);
                waker.wake();
                return;
            }
            // A task polled again with the same waker is watched once.
            let already = w.list.iter().any(|(c, k)| c.same(&completion) && k.will_wake(&waker));
            if !already {
                w.list.push((completion, waker));
            }
        }
        self.shared.more.notify_one();
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if thread.is_none() {
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-runtime-{}", self.name))
                .spawn(move || run(&shared));
            match spawned {
                Ok(handle) => *thread = Some(handle),
                Err(e) => {
                    // No thread: wake everything now and let futures fall
                    // back to blocking waits (see `future.rs`); never hang.
                    tracing::warn!(error = %e, "cannot start the runtime thread; futures will block");
                    let mut w = self.shared.watched.lock().unwrap_or_else(|e| e.into_inner());
                    w.stop = true;
                    for (_, k) in w.list.drain(..) {
                        k.wake();
                    }
                }
            }
        }
    }

    /// True when no thread can wake futures (it could not be started).
    pub(crate) fn stopped(&self) -> bool {
        self.shared.watched.lock().unwrap_or_else(|e| e.into_inner()).stop
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shared.watched.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.more.notify_all();
        if let Some(t) = self.thread.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            // The last reference may be a completion the thread itself
            // just dropped: it then exits on its own (never join oneself).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The thread's loop.
///
/// Each round queries a snapshot of the watched list without the lock
/// (clones: a reference count each), then takes out only what finished.
/// The list itself keeps every entry while it is queried, so a task that
/// polls again meanwhile finds its entry and is not watched (and woken)
/// twice; between the snapshot and the removal the list only grows at its
/// end, so the first `n` entries are the snapshot's.
fn run(shared: &Shared) {
    let mut idle_rounds = 0u32;
    loop {
        let snapshot: Vec<Completion> = {
            let mut w = shared.watched.lock().unwrap_or_else(|e| e.into_inner());
            while w.list.is_empty() && !w.stop {
                w = shared.more.wait(w).unwrap_or_else(|e| e.into_inner());
                idle_rounds = 0;
            }
            if w.stop {
                for (_, k) in w.list.drain(..) {
                    k.wake();
                }
                return;
            }
            w.list.iter().map(|(c, _)| c.clone()).collect()
        };
        // An error querying counts as finished: the future's poll settles
        // the completion and returns the error.
        let done: Vec<bool> = snapshot.iter().map(|c| !matches!(c.finished(), Ok(false))).collect();
        drop(snapshot);
        let woke = done.iter().any(|&d| d);
        if woke {
            // Completions leave with their wakers and drop outside the
            // lock: the last one may hold the last reference to this
            // runtime, whose drop takes the lock.
            let finished: Vec<(Completion, Waker)> = {
                let mut w = shared.watched.lock().unwrap_or_else(|e| e.into_inner());
                let mut finished = Vec::new();
                let mut kept = Vec::with_capacity(w.list.len());
                for (i, (c, k)) in w.list.drain(..).enumerate() {
                    if done.get(i).copied().unwrap_or(false) {
                        finished.push((c, k));
                    } else {
                        kept.push((c, k));
                    }
                }
                w.list = kept;
                finished
            };
            // Woken outside the lock: a waker may run code that watches.
            for (c, k) in finished {
                k.wake();
                drop(c);
            }
        }
        idle_rounds = if woke { 0 } else { idle_rounds.saturating_add(1) };
        if idle_rounds < 64 {
            std::thread::yield_now();
        } else {
            let us = (idle_rounds as u64 - 63).min(20) * 10;
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::completion::Signal;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::Wake;

    /// A flag whose query takes a while, as a device query under load
    /// does: it widens the window in which the thread is querying.
    struct SlowFlag(Arc<AtomicBool>);
    impl Signal for SlowFlag {
        fn query(&self) -> crate::Result<bool> {
            std::thread::sleep(Duration::from_micros(20));
            Ok(self.0.load(Ordering::Acquire))
        }
        fn wait(&self) -> crate::Result<()> {
            while !self.0.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            Ok(())
        }
    }

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_thread_wakes_each_task_once_its_work_finished() {
        let rt = Runtime::new("test");
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        // Many rounds: a task polling again races with the thread's query
        // of the earlier ones (which once took them off the list and let
        // the second poll watch, and wake, a task twice).
        for round in 1..=10 {
            let flags: Vec<Arc<AtomicBool>> = (0..100).map(|_| Arc::new(AtomicBool::new(false))).collect();
            for f in &flags {
                let c = Completion::in_flight(Box::new(SlowFlag(f.clone())), None, [], rt.clone());
                c.wake_when_finished(&waker);
                std::thread::sleep(Duration::from_micros(50));
                c.wake_when_finished(&waker); // polled twice: watched once
            }
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(count.0.load(Ordering::SeqCst), 100 * (round - 1), "nothing new has finished");
            for f in &flags {
                f.store(true, Ordering::Release);
            }
            let t0 = std::time::Instant::now();
            while count.0.load(Ordering::SeqCst) < 100 * round && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(10)); // a second wake would land by now
            assert_eq!(count.0.load(Ordering::SeqCst), 100 * round, "round {round}: one wake per task");
        }
        drop(rt); // joins the thread
    }
}
