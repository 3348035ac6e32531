//! Persistent rank threads: one thread per rank of this process, each
//! owning its rank's state (a [`DataParallel`](super::DataParallel)
//! replica) for the owner's whole life, running the jobs it is sent.
//!
//! Why threads at all: a rank blocks in its collectives until every rank
//! reached them, so ranks of one process must record, launch and wait
//! concurrently. Why persistent: a step used to spawn a thread per rank,
//! which costs every step a thread's start and end and a cold stack and
//! caches; now a step is a message per rank and a reply.
//!
//! Ownership: a rank's state lives on its thread and is only touched
//! there; a job is an owned closure (`'static`: it holds clones of what
//! it needs, e.g. a shard's tensor handles) that gets `&mut` the state.
//! [`RankThreads::run`] sends one job to every rank and waits for every
//! reply before it returns (even after a failure, so no job outlives the
//! call). A job that panics is that rank's error (`catch_unwind`), and
//! the thread lives on for the next job. Dropping the `RankThreads` closes
//! every job queue and joins the threads, which drop their states there;
//! a job still blocked in a collective finishes (or fails at the group's
//! timeout) first. Forgetting it (`mem::forget`) leaks the threads and
//! their states, nothing else.

use crate::{Error, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread::JoinHandle;

type Job<R> = Box<dyn FnOnce(&mut R) + Send>;

/// What [`RankThreads::run`] sends one rank: a closure of its state.
pub(crate) type Task<R, T> = Box<dyn FnOnce(&mut R) -> Result<T> + Send>;

/// See the module docs.
pub(crate) struct RankThreads<R> {
    /// Rank of the first thread (this process's first rank).
    first: usize,
    threads: Vec<RankThread<R>>,
}

/// A rank's job queue (taken to close it) and thread (taken to join it).
type RankThread<R> = (Option<mpsc::Sender<Job<R>>>, Option<JoinHandle<()>>);

impl<R: Send + 'static> RankThreads<R> {
    /// A thread per state, the `k`-th being rank `first + k`.
    pub(crate) fn start(states: Vec<R>, first: usize) -> Result<RankThreads<R>> {
        let mut threads = Vec::new();
        for (k, mut state) in states.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Job<R>>();
            let handle = std::thread::Builder::new()
                .name(format!("kiln-rank-{}", first + k))
                .spawn(move || {
                    for job in rx {
                        job(&mut state);
                    }
                })
                .map_err(|e| Error::Runtime(format!("dist: starting rank {}'s thread: {e}", first + k)))?;
            threads.push((Some(tx), Some(handle)));
        }
        Ok(RankThreads { first, threads })
    }

    /// Runs `task(k)` on the `k`-th rank's thread, every rank at once, and
    /// returns their results in rank order (the first error, if any, once
    /// every rank replied).
    pub(crate) fn run<T: Send + 'static>(&self, mut task: impl FnMut(usize) -> Task<R, T>) -> Result<Vec<T>> {
        let mut replies = Vec::new();
        for (k, (jobs, _)) in self.threads.iter().enumerate() {
            let rank = self.first + k;
            let (tx, rx) = mpsc::sync_channel::<Result<T>>(1);
            let f = task(k);
            let job: Job<R> = Box::new(move |state: &mut R| {
                let out = catch_unwind(AssertUnwindSafe(|| f(state))).unwrap_or_else(|p| {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    Err(Error::Runtime(format!("dist: rank {rank}'s job panicked: {what}")))
                });
                let _ = tx.send(out);
            });
            let sent = jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
            replies.push((rank, sent.then_some(rx)));
        }
        let mut out = Vec::new();
        let mut first_error = None;
        for (rank, rx) in replies {
            let r = rx.ok_or_else(|| Error::Runtime(format!("dist: rank {rank}'s thread is gone"))).and_then(
                |rx| {
                    rx.recv()
                        .unwrap_or_else(|_| Err(Error::Runtime(format!("dist: rank {rank}'s thread ended"))))
                },
            );
            match r {
                Ok(v) => out.push(v),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

impl<R> Drop for RankThreads<R> {
    fn drop(&mut self) {
        for (jobs, _) in &mut self.threads {
            jobs.take();
        }
        for (_, handle) in &mut self.threads {
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn every_job_of_a_rank_runs_on_its_one_thread() {
        let rt = RankThreads::start(vec![Vec::new(), Vec::new()], 3).unwrap();
        for _ in 0..5 {
            let names = rt
                .run(|k| {
                    Box::new(move |seen: &mut Vec<std::thread::ThreadId>| {
                        seen.push(std::thread::current().id());
                        Ok((k, std::thread::current().name().map(String::from)))
                    })
                })
                .unwrap();
            assert_eq!(names, vec![(0, Some("kiln-rank-3".into())), (1, Some("kiln-rank-4".into()))]);
        }
        let seen = rt.run(|_| Box::new(|seen: &mut Vec<std::thread::ThreadId>| Ok(seen.clone()))).unwrap();
        for s in &seen {
            assert_eq!(s.len(), 5);
            assert!(s.iter().all(|t| *t == s[0]), "one thread per rank across jobs");
        }
        assert_ne!(seen[0][0], seen[1][0], "a thread per rank");
    }

    #[test]
    fn a_panicking_job_is_its_ranks_error_and_the_thread_lives_on() {
        let rt = RankThreads::start(vec![0u32, 0u32], 0).unwrap();
        let err = rt
            .run(|k| {
                Box::new(move |n: &mut u32| {
                    *n += 1;
                    if k == 1 {
                        panic!("bad shard");
                    }
                    Ok(*n)
                })
            })
            .unwrap_err()
            .to_string();
        assert_eq!(err, "runtime error: dist: rank 1's job panicked: bad shard");
        // Both ranks ran the job and run the next one.
        assert_eq!(rt.run(|_| Box::new(|n: &mut u32| Ok(*n))).unwrap(), vec![1, 1]);
    }

    #[test]
    fn dropping_joins_the_threads_which_drop_their_states() {
        let token = Arc::new(());
        let rt = RankThreads::start(vec![token.clone(), token.clone()], 0).unwrap();
        rt.run(|_| Box::new(|_: &mut Arc<()>| Ok(()))).unwrap();
        assert_eq!(Arc::strong_count(&token), 3);
        drop(rt);
        assert_eq!(Arc::strong_count(&token), 1, "the states were dropped before drop returned");
    }
}
