//! Running a compiled plan: the values of one run, the arena it takes,
//! and the threads that run streams concurrently.
//!
//! With one stream (or none) the steps run in order on the caller's
//! thread. With several, each stream's steps run in order on a thread of
//! their own (`std::thread::scope`; the caller's thread runs stream 0).
//! A step first waits for its events (a `Mutex` + `Condvar`), runs, then
//! signals the events recorded after it. Kernels still parallelize on
//! rayon's pool; the stream threads are not rayon workers, so blocking on
//! an event never stalls rayon. When the caller itself is a rayon worker,
//! all streams run in schedule order on it instead (every event is
//! recorded before its waiters in that order), so it never blocks.
//!
//! The first error stops every stream: waiters wake up and bail out, each
//! stream checks before every step, and the first error is returned. A
//! panic in a kernel is caught and treated as an error, so no thread is
//! left waiting for an event that will never come.

use super::arena::Arena;
use super::exec::CpuExecutable;
use super::exec::Place;
use super::CpuBuffer;
use crate::backends::{Buffer, Executable, Launched, RngArgs};
use crate::{Error, Result};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Elements a launch group's members write, together, below which they
/// run one after another on the calling thread (the fused kernels' own
/// threshold for one kernel: [`super::elementwise::PAR_THRESHOLD`]).
const GROUP_PAR_WORK: usize = super::elementwise::PAR_THRESHOLD;

/// The values of one run and how many reads each has left.
struct Values {
    values: Vec<Option<CpuBuffer>>,
    left: Vec<usize>,
}

/// Cross-stream state: which events have been signalled, and the first
/// error.
struct Sync {
    done: Vec<bool>,
    error: Option<Error>,
}

/// The buffers bound to a run's input slots. The run owns them, so that
/// the one a plan writes over (`Plan::donated`) can be moved, not cloned,
/// into the run's values: if the caller gave it up, the run then holds the
/// only reference to its storage and may write it in place.
pub(super) struct Inputs(Mutex<Vec<Option<Buffer>>>);

impl Inputs {
    /// Input `k` as its `input` step binds it: moved out when the plan
    /// writes over it (`moved`), cloned otherwise.
    pub(super) fn bind(&self, k: usize, moved: bool) -> Result<CpuBuffer> {
        let mut slots = lock(&self.0);
        let given = slots.len();
        let slot = slots
            .get_mut(k)
            .ok_or_else(|| Error::Backend(format!("cpu: input {k} is not bound ({given} given)")))?;
        let buffer = if moved { slot.take() } else { slot.clone() }
            .ok_or_else(|| Error::Backend(format!("cpu: input {k} was bound twice")))?;
        match buffer {
            Buffer::Cpu(b) => Ok(b),
            #[cfg(feature = "cuda-backend")]
            other => super::cpu(&other).cloned(),
        }
    }
}

/// The state of one run, shared by its stream threads.
struct RunState<'a> {
    values: Mutex<Values>,
    sync: Mutex<Sync>,
    cv: Condvar,
    inputs: Inputs,
    rng: &'a RngArgs,
    arena: Option<&'a Arc<Arena>>,
    /// Values of `extra` steps, written by their fused node's step and
    /// taken by theirs.
    extras: Mutex<HashMap<usize, CpuBuffer>>,
}

/// Locks `m`; a poisoned lock (a panic while holding it, which the code
/// under these locks never does) is taken as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stands in for an error another stream already recorded.
fn stopped() -> Error {
    Error::Backend("cpu: stopped by an error on another stream".into())
}

impl RunState<'_> {
    /// Records `e` unless an error came first, and wakes every waiter.
    fn fail(&self, e: Error) {
        let mut s = lock(&self.sync);
        if s.error.is_none() {
            s.error = Some(e);
        }
        self.cv.notify_all();
    }

    fn failed(&self) -> bool {
        lock(&self.sync).error.is_some()
    }

    /// Blocks until event `e` is signalled; an error if the run failed.
    fn wait(&self, e: usize) -> Result<()> {
        let mut s = lock(&self.sync);
        loop {
            if s.error.is_some() {
                return Err(stopped());
            }
            if s.done.get(e).copied().unwrap_or(true) {
                return Ok(());
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn signal(&self, e: usize) {
        let mut s = lock(&self.sync);
        if let Some(d) = s.done.get_mut(e) {
            *d = true;
        }
        self.cv.notify_all();
    }
}

impl CpuExecutable {
    /// Runs step `i`: takes its operands, launches its kernel, stores its
    /// value and drops every value read for the last time.
    fn run_step(&self, i: usize, st: &RunState<'_>) -> Result<()> {
        let args = self.take_operands(i, st)?;
        let started = self.profile.as_ref().map(|_| std::time::Instant::now());
        let out = self.compute(i, args, st)?;
        self.store(i, out, st, started);
        Ok(())
    }

    /// Runs the steps of a launch group at once (rayon tasks): they are
    /// independent, and the memory plan kept their bytes apart as if they
    /// all ran at the same time (see [`crate::ir::LaunchGroup`]).
    fn run_group(&self, members: &[usize], st: &RunState<'_>) -> Result<()> {
        use rayon::prelude::*;
        let _span = tracing::trace_span!("group", members = members.len()).entered();
        self.stats.grouped_nodes.fetch_add(members.len() as u64, Ordering::Relaxed);
        let args = members.iter().map(|&i| self.take_operands(i, st)).collect::<Result<Vec<_>>>()?;
        let started = self.profile.as_ref().map(|_| std::time::Instant::now());
        // A group whose members together write fewer elements than one
        // kernel would split runs on this thread, member after member: a
        // small model's optimizer update (the digits MLP's and CNN's,
        // 17-19K parameters) cost more in rayon's wake-ups and joins than
        // in arithmetic (issue 38). Each member computes the same values
        // either way.
        let work: usize = members.iter().map(|&i| self.plan.graph.node(self.steps[i].id).shape.numel()).sum();
        let outs: Vec<Result<CpuBuffer>> = if work < GROUP_PAR_WORK {
            members.iter().zip(args).map(|(&i, args)| self.compute(i, args, st)).collect()
        } else {
            members.par_iter().zip(args).map(|(&i, args)| self.compute(i, args, st)).collect()
        };
        for (&i, out) in members.iter().zip(outs) {
            self.store(i, out?, st, started);
        }
        Ok(())
    }

    /// The operand values of step `i`. A write over a donated input
    /// ([`super::exec::Step::over`]) takes the input's value out of the run
    /// when it is its last reader, so that the run may hold the only
    /// reference to its storage; every other operand is cloned.
    fn take_operands(&self, i: usize, st: &RunState<'_>) -> Result<Vec<CpuBuffer>> {
        let step = &self.steps[i];
        let mut v = lock(&st.values);
        let mut args = Vec::with_capacity(step.operands.len());
        for (slot, &p) in step.operands.iter().enumerate() {
            let over = step.over.iter().any(|&(s, _)| s == slot);
            let value = if over && v.left[p] == 1 { v.values[p].take() } else { v.values[p].clone() };
            args.push(value.ok_or_else(|| {
                Error::Backend(format!("cpu: operand of {} was freed before use", step.id))
            })?);
        }
        Ok(args)
    }

    /// Launches step `i`'s kernel on its operands.
    fn compute(&self, i: usize, mut args: Vec<CpuBuffer>, st: &RunState<'_>) -> Result<CpuBuffer> {
        let step = &self.steps[i];
        let node = self.plan.graph.node(step.id);
        let _launch = tracing::trace_span!("launch", op = node.op.mnemonic(), node = %step.id).entered();
        let written = match &node.op {
            crate::ir::Op::Fused(_) if !step.over.is_empty() => {
                let mut extras = Vec::new();
                let out = self.fused_over(step, std::mem::take(&mut args), st.arena, &mut extras)?;
                if !extras.is_empty() {
                    lock(&st.extras).extend(extras);
                }
                Some(out)
            }
            crate::ir::Op::WriteAt { .. } if step.place == Place::OverInput && !args.is_empty() => {
                let target = args.remove(0);
                match self.write_over(step, target, &args)? {
                    Ok(written) => Some(written),
                    Err(target) => {
                        args.insert(0, target);
                        None
                    }
                }
            }
            _ => None,
        };
        let mut out = match written {
            Some(out) => out,
            None if matches!(node.op, crate::ir::Op::Extra { .. }) => {
                lock(&st.extras).remove(&i).ok_or_else(|| {
                    Error::Backend(format!("cpu: extra {} runs before its fused node wrote it", step.id))
                })?
            }
            None => {
                let mut extras = Vec::new();
                let out = self.launch(step, &args, &st.inputs, st.rng, st.arena, &mut extras)?;
                if !extras.is_empty() {
                    lock(&st.extras).extend(extras);
                }
                out
            }
        };
        drop(args);
        if step.output && out.storage.is_arena() {
            // An output viewing arena bytes: the next run overwrites them.
            out = out.owned_copy(&self.stats)?;
        }
        Ok(out)
    }

    /// Stores step `i`'s value and drops every value read for the last time.
    fn store(&self, i: usize, out: CpuBuffer, st: &RunState<'_>, started: Option<std::time::Instant>) {
        let step = &self.steps[i];
        self.stats.nodes_executed.fetch_add(1, Ordering::Relaxed);
        let mut v = lock(&st.values);
        v.values[i] = Some(out);
        for &p in &step.operands {
            v.left[p] -= 1;
            if v.left[p] == 0 {
                v.values[p] = None;
            }
        }
        if v.left[i] == 0 {
            v.values[i] = None;
        }
        drop(v);
        if let (Some(p), Some(started)) = (&self.profile, started) {
            p.record(step.id, started, std::time::Instant::now());
        }
    }

    /// Runs the steps at positions `list` in order, honouring events.
    /// A launch group runs at once when the list reaches its first step
    /// (its steps follow each other in the list: one stream, consecutive),
    /// after the waits of all its steps.
    fn run_list(&self, list: &[usize], st: &RunState<'_>) -> Result<()> {
        let mut at = 0;
        while at < list.len() {
            if st.failed() {
                return Err(stopped());
            }
            let run: &[usize] = match self.groups.of[list[at]].map(|g| &self.groups.steps[g]) {
                Some(g) if list[at..].starts_with(g) => g,
                _ => &list[at..=at],
            };
            for &i in run {
                for &e in &self.steps[i].waits {
                    st.wait(e)?;
                }
            }
            match run {
                [i] => self.run_step(*i, st)?,
                _ => self.run_group(run, st)?,
            }
            for &i in run {
                for &e in &self.steps[i].records {
                    st.signal(e);
                }
            }
            at += run.len();
        }
        Ok(())
    }

    /// [`Self::run_list`] with errors and panics recorded in `st`.
    fn run_stream(&self, list: &[usize], st: &RunState<'_>) {
        match catch_unwind(AssertUnwindSafe(|| self.run_list(list, st))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => st.fail(e),
            Err(_) => st.fail(Error::Backend("cpu: a kernel panicked".into())),
        }
    }

    /// Runs every step, on one thread or one per stream.
    fn execute(&self, st: &RunState<'_>) -> Result<()> {
        match &self.streams {
            Some(streams) if rayon::current_thread_index().is_none() => {
                let _span = tracing::debug_span!("streams", count = streams.lists.len()).entered();
                self.run_list(&streams.prelude, st)?;
                std::thread::scope(|scope| {
                    for list in &streams.lists[1..] {
                        scope.spawn(move || self.run_stream(list, st));
                    }
                    self.run_stream(&streams.lists[0], st);
                });
                match lock(&st.sync).error.take() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
            _ => {
                let all: Vec<usize> = (0..self.steps.len()).collect();
                self.run_list(&all, st)
            }
        }
    }

    /// The arena for one run: the cached one if nobody else holds it, else
    /// a fresh one (another thread is running this executable right now).
    fn take_arena(&self) -> Result<Option<Arc<Arena>>> {
        let Some(bytes) = self.arena_bytes else { return Ok(None) };
        let cached = lock(&self.arena).take();
        if let Some(mut a) = cached {
            if Arc::get_mut(&mut a).is_some() {
                return Ok(Some(a));
            }
        }
        Ok(Some(Arena::new(bytes, &self.stats)?))
    }

    /// Keeps `arena` for the next run if no buffer still refers to it.
    fn give_back_arena(&self, mut arena: Arc<Arena>) {
        if Arc::get_mut(&mut arena).is_some() {
            let mut slot = lock(&self.arena);
            if slot.is_none() {
                *slot = Some(arena);
            }
        }
    }
}

impl Executable for CpuExecutable {
    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
        self.run_owned(inputs.to_vec(), rng)
    }

    fn donated(&self) -> &[u32] {
        &self.plan.donated
    }

    fn launch_owned(&self, inputs: Vec<Buffer>, rng: &RngArgs) -> Result<Launched> {
        Ok(Launched { outputs: self.run_owned(inputs, rng)?, done: crate::runtime::Completion::done() })
    }

    fn take_profile(&self, run_start: std::time::Instant) -> Option<crate::profile::RunTimes> {
        let p = self.profile.as_ref()?;
        Some(crate::profile::RunTimes { plan: p.plan, nodes: p.take(run_start), note: None })
    }
}

impl CpuExecutable {
    /// Runs the plan on inputs it owns (see [`Inputs`]): a `write_at`
    /// over a donated input writes in place when nobody else holds it.
    fn run_owned(&self, inputs: Vec<Buffer>, rng: &RngArgs) -> Result<Vec<Buffer>> {
        let _run = tracing::debug_span!("run", nodes = self.steps.len(), inputs = inputs.len()).entered();
        if inputs.len() != self.plan.inputs {
            return Err(Error::Backend(format!(
                "cpu: the plan binds {} input(s), {} given",
                self.plan.inputs,
                inputs.len()
            )));
        }
        if rng.streams.len() < self.plan.random_streams {
            return Err(Error::Backend(format!(
                "cpu: the plan reads {} random stream(s), {} given",
                self.plan.random_streams,
                rng.streams.len()
            )));
        }
        // Where this rank's collectives stand, to break the group if the
        // run fails before handing in all of its (`dist/host.rs`).
        let issued = self.member.as_ref().map(|m| m.host.issued(m.rank));
        let arena = self.take_arena()?;
        let events = self.streams.as_ref().map_or(0, |s| s.events);
        let st = RunState {
            values: Mutex::new(Values { values: vec![None; self.steps.len()], left: self.uses.clone() }),
            sync: Mutex::new(Sync { done: vec![false; events], error: None }),
            cv: Condvar::new(),
            inputs: Inputs(Mutex::new(inputs.into_iter().map(Some).collect())),
            rng,
            arena: arena.as_ref(),
            extras: Mutex::new(HashMap::new()),
        };
        let result = self.execute(&st).and_then(|()| {
            let v = lock(&st.values);
            self.outputs
                .iter()
                .map(|&p| match &v.values[p] {
                    Some(b) if b.storage.is_arena() => {
                        Err(Error::Backend("cpu: an output was left in the arena".into()))
                    }
                    Some(b) => Ok(Buffer::Cpu(b.clone())),
                    None => Err(Error::Backend("cpu: an output was freed before the end".into())),
                })
                .collect()
        });
        drop(st);
        if let Some(a) = arena {
            self.give_back_arena(a);
        }
        if let (Err(e), Some(m), Some(start)) = (&result, &self.member, issued) {
            let graph = &self.plan.graph;
            let collectives = self.plan.order.iter().filter(|&&id| graph.node(id).op.is_collective()).count();
            if collectives > 0 {
                m.host.rank_failed(m.rank, start + collectives as u64, &e.to_string());
            }
        }
        result
    }
}
