//! The in-process transport: ranks that are contexts of one process (the
//! CPU backend, the CUDA emulator) meet at a [`Rendezvous`], hand it their
//! operand, and each takes back the combined result.
//!
//! Matching: every rank counts the collectives it has issued; the k-th of
//! one rank meets the k-th of every other (NCCL's rule too). A k-th
//! collective whose op, dtype or shape differs between ranks breaks the
//! group with an error naming both ranks, never a wrong sum.
//!
//! Waiting: a rank blocks (a `Condvar`, on the caller's own thread, never
//! a rayon worker: see `backends/cpu/run.rs`) until every rank has handed
//! in its operand, at most [`Rendezvous::timeout`]. A rank that times out
//! breaks the group: its sequence numbers no longer match the others', so
//! every later collective of every rank fails at once with the same
//! message instead of pairing the wrong rounds.
//!
//! Ownership: a rank's operand is copied into the round (host data it
//! owns), and the result is shared (`Arc`) by the ranks that take it; the
//! round is dropped once every rank has taken it. A rank that errors after
//! handing in its operand leaves nothing borrowed behind.
//!
//! Failing ranks: the rendezvous is also the group's health, for every
//! kind of rank. A rank whose run fails before it issued all of that
//! run's collectives (a bad index before an all-reduce on the CPU), or
//! any CUDA rank whose run with collectives fails (its contribution may
//! be garbage, or never come), breaks the group with a message naming it
//! ([`Rendezvous::rank_failed`], [`Rendezvous::break_group`]). Breaking
//! wakes every waiting rank (which then fails with that message) and runs
//! the abort hooks once: CUDA ranks register one that aborts their NCCL
//! communicator (`ncclCommAbort`), so a rank spinning in an NCCL kernel
//! for a partner that will never come gets an error instead.
//!
//! Across processes: a rank of a group of processes has a `Rendezvous` of
//! its own with a [`Link`] to the group's coordinator (`link.rs`), which
//! runs an in-process `Rendezvous` of all the ranks (`coordinator.rs`):
//! the matching, the combining (so the same bits as in one process), the
//! timeouts and the health are this file's, once, on rank 0. Here, such a
//! rank sends its operand and waits for the coordinator's result; a break
//! on either side reaches the other (a local one is sent, a remote one
//! runs the local abort hooks); a rank whose process leaves the group
//! ([`Rendezvous::leave`]) fails the collectives that still need it.

use super::combine::combine;
use super::link::Link;
use crate::ir::{Collective, DType, HostData, Shape};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What breaking the group runs, once (a CUDA rank's communicator abort).
pub(crate) type AbortHook = Box<dyn Fn() + Send + Sync>;

/// Where the ranks of one in-process group meet.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    size: usize,
    timeout: Duration,
    state: Mutex<Rounds>,
    arrived: Condvar,
    hooks: Hooks,
    /// This process's connection to its group's coordinator, for a rank
    /// of a group of processes (then `state` holds its rank's rounds only).
    link: Option<Link>,
}

/// The abort hooks; taken (so run once) when the group breaks.
#[derive(Default)]
struct Hooks(Mutex<Vec<AbortHook>>);

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hooks({})", self.0.lock().map_or(0, |h| h.len()))
    }
}

#[derive(Debug)]
struct Rounds {
    /// The next sequence number of each rank.
    next: Vec<u64>,
    open: HashMap<u64, Round>,
    /// Why the group can no longer run collectives.
    broken: Option<String>,
    /// For each rank that left the group: how many collectives it ran.
    left: Vec<Option<u64>>,
    /// Across processes: this rank's collectives sent to the coordinator,
    /// and their results once they came.
    sent: HashMap<u64, Option<Arc<HostData>>>,
}

#[derive(Debug)]
struct Round {
    what: Collective,
    dtype: DType,
    shape: Shape,
    /// The rank that opened the round (named when another disagrees).
    opener: usize,
    parts: Vec<Option<HostData>>,
    handed_in: usize,
    result: Option<Arc<HostData>>,
    /// Ranks yet to take the result.
    takers: usize,
}

/// Starts every abort hook at once, each on a thread of its own, and
/// returns without waiting for them.
///
/// - At once: NCCL's abort of one of a process's communicators may wait,
///   in its teardown, for the process's other communicators of the group
///   (NVIDIA/nccl issues 863 and 1013: "within a node, you need all ranks
///   to abort"), so one after another on one thread can hang.
/// - Not waited for: `ncclCommAbort` itself can hang in its teardown
///   (joining a proxy thread stuck in `poll`, NVIDIA/nccl issue 1777).
///   The ranks fail from the group's `broken` message, set before this
///   runs, and a rank waiting on a run gives up after `GRACE`; a hung
///   abort leaks its thread and communicator, never a rank.
///
/// Without a thread to be had, a hook runs here.
fn run_detached(hooks: Vec<AbortHook>) {
    for hook in hooks {
        let hook = Arc::new(hook);
        let spare = hook.clone();
        if std::thread::Builder::new().name("kiln-abort".into()).spawn(move || (hook.as_ref())()).is_err() {
            spare();
        }
    }
}

fn lock(m: &Mutex<Rounds>) -> MutexGuard<'_, Rounds> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Rendezvous {
    /// A meeting place for `size` ranks, each waiting at most `timeout`.
    pub(crate) fn new(size: usize, timeout: Duration) -> Rendezvous {
        Rendezvous::with_link(size, timeout, None)
    }

    /// A rank's meeting place in a group of processes: its collectives go
    /// through `link` (see the module docs). The link starts delivering
    /// once [`Link::start`] has the rendezvous.
    pub(crate) fn with_link(size: usize, timeout: Duration, link: Option<Link>) -> Rendezvous {
        let state = Rounds {
            next: vec![0; size],
            open: HashMap::new(),
            broken: None,
            left: vec![None; size],
            sent: HashMap::new(),
        };
        Rendezvous {
            size,
            timeout,
            state: Mutex::new(state),
            arrived: Condvar::new(),
            hooks: Hooks::default(),
            link,
        }
    }

    /// The link to the coordinator, for a rank of a group of processes.
    pub(crate) fn link(&self) -> Option<&Link> {
        self.link.as_ref()
    }

    /// How long a rank waits for the others (the CPU exchange, a CUDA
    /// rank's watchdog on a run with collectives).
    #[cfg_attr(not(feature = "cuda-backend"), allow(dead_code))]
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Why the group can no longer run collectives, if it can't.
    pub(crate) fn broken(&self) -> Option<String> {
        lock(&self.state).broken.clone()
    }

    /// Runs `hook` when the group breaks (at once if it is broken).
    #[cfg_attr(not(feature = "cuda-backend"), allow(dead_code))]
    pub(crate) fn on_break(&self, hook: AbortHook) {
        // Checked under the hooks' lock: a break either took the list
        // after this push (and runs the hook) or had set `broken` before.
        let mut hooks = self.hooks.0.lock().unwrap_or_else(|e| e.into_inner());
        if self.broken().is_some() {
            drop(hooks);
            hook();
            return;
        }
        hooks.push(hook);
    }

    /// Breaks the group: the first reason sticks, every waiting rank wakes
    /// and fails with it, and the abort hooks start (once, all at once, on
    /// threads of their own: [`run_detached`]).
    /// Across processes, a break that starts here is sent to the
    /// coordinator, which breaks every other rank.
    pub(crate) fn break_group(&self, why: String) {
        if self.break_here(why.clone()) {
            if let Some(link) = &self.link {
                link.send_break(&why);
            }
        }
    }

    /// Breaks this process's side of the group and returns whether this
    /// was the first break (what a break that came from the coordinator
    /// runs: it is not sent back).
    pub(crate) fn break_here(&self, why: String) -> bool {
        let first = {
            let mut s = lock(&self.state);
            let first = s.broken.is_none();
            if first {
                s.broken = Some(why);
            }
            self.arrived.notify_all();
            first
        };
        let hooks = std::mem::take(&mut *self.hooks.0.lock().unwrap_or_else(|e| e.into_inner()));
        run_detached(hooks);
        first
    }

    /// Rank `rank` left the group (its process said goodbye): collectives
    /// it did not run can never complete, so one that is open breaks the
    /// group now and a later one at once, naming it.
    pub(crate) fn leave(&self, rank: usize) {
        let mut s = lock(&self.state);
        let Some(&ran) = s.next.get(rank) else { return };
        s.left[rank] = Some(ran);
        if let Some(&seq) = s.open.keys().filter(|&&seq| seq >= ran).min() {
            drop(s);
            self.break_group(left_message(rank, ran, seq));
        }
    }

    /// Across processes: the coordinator's result of this rank's
    /// collective `seq`.
    pub(crate) fn deliver(&self, seq: u64, data: HostData) {
        let mut s = lock(&self.state);
        if let Some(slot) = s.sent.get_mut(&seq) {
            *slot = Some(Arc::new(data));
            self.arrived.notify_all();
        }
    }

    /// How many collectives `rank` has handed in so far.
    pub(crate) fn issued(&self, rank: usize) -> u64 {
        lock(&self.state).next.get(rank).copied().unwrap_or(0)
    }

    /// Rank `rank`'s run failed with `why`; it was to hand in collectives
    /// until number `until` (exclusive). If it handed in fewer, the other
    /// ranks would wait for rounds it never joins: the group breaks now,
    /// naming the rank and its error.
    pub(crate) fn rank_failed(&self, rank: usize, until: u64, why: &str) {
        let next = self.issued(rank);
        if next < until {
            self.break_group(format!("rank {rank} failed before its collective #{next}: {why}"));
        }
    }

    /// Rank `rank`'s part of its next collective: hands in `data` (dense,
    /// row-major, `shape`) and returns what every rank gets.
    pub(crate) fn exchange(
        &self,
        rank: usize,
        what: Collective,
        shape: &Shape,
        data: HostData,
    ) -> Result<Arc<HostData>> {
        if let Some(link) = &self.link {
            return self.exchange_remote(link, rank, what, shape, data);
        }
        let mut s = lock(&self.state);
        if let Some(why) = &s.broken {
            return Err(Error::Runtime(format!("{}: the process group is broken: {why}", what.mnemonic())));
        }
        let seq = s.next[rank];
        s.next[rank] += 1;
        let dtype = data.dtype();
        let size = self.size;
        let round = s.open.entry(seq).or_insert_with(|| Round {
            what,
            dtype,
            shape: shape.clone(),
            opener: rank,
            parts: (0..size).map(|_| None).collect(),
            handed_in: 0,
            result: None,
            takers: size,
        });
        if round.what != what || round.dtype != dtype || round.shape != *shape {
            let why = format!(
                "collective #{seq} is {} {}{} on rank {} but {} {dtype}{shape} on rank {rank}; every rank must run the same collectives in the same order",
                round.what.mnemonic(),
                round.dtype,
                round.shape,
                round.opener,
                what.mnemonic(),
            );
            drop(s);
            self.break_group(why.clone());
            return Err(Error::Runtime(why));
        }
        round.parts[rank] = Some(data);
        round.handed_in += 1;
        if let Some(gone) = s.left.iter().position(|l| l.is_some_and(|ran| ran <= seq)) {
            let why = left_message(gone, s.left[gone].unwrap_or(0), seq);
            drop(s);
            self.break_group(why.clone());
            return Err(Error::Runtime(why));
        }
        let Some(round) = s.open.get_mut(&seq) else {
            return Err(Error::Backend("dist: a round vanished".into()));
        };
        if round.handed_in == size {
            let parts: Vec<HostData> = round.parts.iter_mut().filter_map(Option::take).collect();
            round.result = Some(Arc::new(combine(what, parts)?));
            self.arrived.notify_all();
        }
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(why) = &s.broken {
                return Err(Error::Runtime(format!(
                    "{}: the process group is broken: {why}",
                    what.mnemonic()
                )));
            }
            let round =
                s.open.get_mut(&seq).ok_or_else(|| Error::Backend("dist: a round vanished".into()))?;
            if let Some(result) = round.result.clone() {
                round.takers -= 1;
                if round.takers == 0 {
                    s.open.remove(&seq);
                }
                return Ok(result);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..size).filter(|&r| round.parts[r].is_none()).collect();
                let why = format!(
                    "rank {rank} waited {:?} in collective #{seq} ({} {dtype}{shape}) for rank(s) {missing:?}, which never ran it (every rank must run it; ranks of one process must run their steps concurrently, one thread each)",
                    self.timeout,
                    what.mnemonic()
                );
                drop(s);
                self.break_group(why.clone());
                return Err(Error::Runtime(why));
            }
            s = self.arrived.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Rendezvous {
    /// [`Rendezvous::exchange`] for a rank of a group of processes: sends
    /// the operand to the coordinator and waits for its result, at most
    /// the group's timeout and a margin (the coordinator times the round
    /// out itself, naming the missing ranks; the margin is for a
    /// coordinator that went silent).
    fn exchange_remote(
        &self,
        link: &Link,
        rank: usize,
        what: Collective,
        shape: &Shape,
        data: HostData,
    ) -> Result<Arc<HostData>> {
        let broken =
            |why: &str| Error::Runtime(format!("{}: the process group is broken: {why}", what.mnemonic()));
        // Numbered and sent under the link's send lock, so the coordinator
        // sees this rank's collectives in its order.
        let seq = link.send_part(
            || {
                let mut s = lock(&self.state);
                if let Some(why) = &s.broken {
                    return Err(broken(why));
                }
                let seq = s.next[rank];
                s.next[rank] += 1;
                s.sent.insert(seq, None);
                Ok(seq)
            },
            what,
            shape,
            &data,
        );
        let seq = match seq {
            Ok(seq) => seq,
            Err(e) => {
                if let Some(why) = self.broken() {
                    return Err(broken(&why));
                }
                return Err(e);
            }
        };
        let margin = Duration::from_secs(10);
        let deadline = Instant::now() + self.timeout + margin;
        let mut s = lock(&self.state);
        loop {
            if let Some(why) = s.broken.clone() {
                s.sent.remove(&seq);
                return Err(broken(&why));
            }
            if let Some(Some(result)) = s.sent.get(&seq) {
                let result = result.clone();
                s.sent.remove(&seq);
                return Ok(result);
            }
            let now = Instant::now();
            if now >= deadline {
                drop(s);
                let why = format!(
                    "rank {rank} waited {:?} for the coordinator's result of collective #{seq} ({} {}{shape}) at {}, which never came",
                    self.timeout + margin,
                    what.mnemonic(),
                    data.dtype(),
                    link.addr()
                );
                self.break_group(why.clone());
                return Err(Error::Runtime(why));
            }
            s = self.arrived.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Why a collective fails when a rank that left the group never ran it.
fn left_message(rank: usize, ran: u64, seq: u64) -> String {
    format!(
        "rank {rank} left the group after its {ran} collective(s), but collective #{seq} needs it; every rank must run the same collectives"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ReduceOp;

    #[test]
    fn ranks_on_threads_get_the_rank_ordered_sum() {
        let rv = Arc::new(Rendezvous::new(3, Duration::from_secs(10)));
        let shape = Shape::new([2]);
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let (rv, shape) = (rv.clone(), shape.clone());
                    s.spawn(move || {
                        let data = HostData::F32(vec![r as f32 + 0.5, -(r as f32)]);
                        let out = rv.exchange(r, Collective::AllReduce(ReduceOp::Sum), &shape, data).unwrap();
                        match &*out {
                            HostData::F32(v) => v.clone(),
                            _ => unreachable!(),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            assert_eq!(r, vec![4.5, -3.0]);
        }
    }

    /// NCCL's aborts of one process's communicators may wait for each
    /// other, or hang (see [`run_detached`]): hooks that need each other
    /// must all run, and the break must return whatever they do. Run one
    /// after another on one thread, these two wait on their barrier
    /// forever; the third never returns.
    #[test]
    fn abort_hooks_that_wait_for_each_other_all_run() {
        let rv = Arc::new(Rendezvous::new(2, Duration::from_secs(10)));
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..2 {
            let (barrier, ran) = (barrier.clone(), ran.clone());
            rv.on_break(Box::new(move || {
                barrier.wait();
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }));
        }
        let (stuck_tx, stuck_rx) = std::sync::mpsc::channel::<()>();
        let stuck_rx = Mutex::new(stuck_rx);
        rv.on_break(Box::new(move || {
            let _ = stuck_rx.lock().map(|r| r.recv()); // until the test ends
        }));
        let (tx, rx) = std::sync::mpsc::channel();
        let breaker = rv.clone();
        std::thread::spawn(move || {
            breaker.break_group("rank 1 (cuda:1) failed".into());
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20)).expect("the break hung in its abort hooks");
        let t0 = Instant::now();
        while ran.load(std::sync::atomic::Ordering::SeqCst) < 2 && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            ran.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "hooks that wait for each other all ran"
        );
        // A hook registered after the break runs at once; a second break
        // runs nothing again.
        let late = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = late.clone();
        rv.on_break(Box::new(move || {
            l.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        rv.break_group("again".into());
        assert_eq!(late.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(rv.broken().as_deref(), Some("rank 1 (cuda:1) failed"));
        drop(stuck_tx);
    }

    #[test]
    fn a_rank_that_never_comes_breaks_the_group_with_a_timeout() {
        let rv = Rendezvous::new(2, Duration::from_millis(50));
        let err = rv
            .exchange(0, Collective::AllReduce(ReduceOp::Sum), &Shape::new([1]), HostData::F32(vec![1.0]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank 0 waited") && err.contains("rank(s) [1]"), "{err}");
        let again = rv
            .exchange(1, Collective::AllReduce(ReduceOp::Sum), &Shape::new([1]), HostData::F32(vec![1.0]))
            .unwrap_err()
            .to_string();
        assert!(again.contains("the process group is broken"), "{again}");
    }
}
