//! One recorded signature of a captured step: the plan that ran, where
//! each of its inputs comes from at a call and where each output goes.

use super::{HostScalar, Signature, StepFn};
use crate::backends::{Buffer, Executable, RngArgs};
use crate::context::VarId;
use crate::ir::{BufferId, DType, NodeId, Op};
use crate::{Context, Error, Location, Result, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a plan input comes from at a call.
enum Source {
    /// The call's argument `k`.
    Arg(usize),
    /// The variable's value at the call.
    Var(VarId),
    /// A tensor from outside the step, realized when it was recorded.
    Const(Buffer),
    /// A read of a host scalar recorded by the step: its value at the call,
    /// uploaded when it changed (the last upload is kept with the value it
    /// holds: an unchanged learning rate binds the same buffer every call,
    /// so a CUDA graph's slot reads it where it lies, no copy).
    Host(HostScalar, DType, Mutex<Option<(u64, Buffer)>>),
}

/// Where a plan output goes after a call.
enum Sink {
    /// The step's result `k`.
    Out(usize),
    /// The variable's new value.
    Var(VarId),
}

/// The random stream a plan stream draws from at a call.
enum Stream {
    /// A tensor recorded outside the step: the same numbers every call.
    Fixed(u64),
    /// A random op of the step: a fresh context stream, this far past the
    /// first one the call takes.
    Fresh(u64),
}

/// What a call launches: the plan and its bindings.
struct Bound {
    executable: Arc<dyn Executable>,
    /// Compiled with profiling: each replay's times are collected too.
    profiled: bool,
    sources: Vec<Source>,
    streams: Vec<Stream>,
}

/// One recorded signature.
pub(crate) struct StepPlan {
    pub(super) signature: Signature,
    /// `None` when the step computes nothing (returns its inputs).
    bound: Option<Bound>,
    /// Per plan output (or per result when nothing runs), where it goes.
    sinks: Vec<(usize, Sink)>,
    /// Results that are inputs unchanged, when nothing runs.
    passthrough: Vec<Source>,
    results: usize,
    /// Context streams one call takes.
    stream_span: u64,
}

fn misuse(message: String, location: Location) -> Error {
    Error::Workspace { op: "captured step", message, location }
}

/// Runs pending assignments recorded outside the step, refuses held
/// gradients, and returns the arguments' buffers (realizing them).
fn prepare(ctx: &Context, args: &[&Tensor], location: Location) -> Result<Vec<Buffer>> {
    {
        let state = ctx.state();
        if !state.ws.grads.is_empty() {
            let held: Vec<String> = state.ws.grads.iter().map(|w| state.ws.grad_name(w.scope)).collect();
            return Err(misuse(
                format!(
                    "gradients are held ({}) when a captured step is called; release them (zero_grad) first",
                    held.join(", ")
                ),
                location,
            ));
        }
    }
    let pending = {
        let state = ctx.state();
        !state.ws.pending(&state.graph).is_empty()
    };
    if pending {
        ctx.realize_nodes(&[])?;
    }
    let nodes = args.iter().map(|a| a.node_in(ctx, location)).collect::<Result<Vec<_>>>()?;
    ctx.realize_nodes(&nodes)
}

impl StepPlan {
    /// Runs `f` on the arguments, realizes what it returns with what it
    /// assigned, and keeps the plan that ran.
    pub(crate) fn record(
        ctx: &Context,
        signature: Signature,
        args: &[&Tensor],
        f: &mut dyn StepFn,
        location: Location,
    ) -> Result<(StepPlan, Vec<Tensor>)> {
        let arg_buffers = prepare(ctx, args, location)?;
        // Fresh buffer nodes: every argument its own input slot, even one
        // passed twice.
        let arg_tensors: Vec<Tensor> = arg_buffers.iter().map(|b| ctx.record_buffer(b.clone())).collect();
        let (vars_before, var_of_buffer, stream_base, host_before) = {
            let mut state = ctx.state();
            // Each variable's value becomes a buffer node of its own, with
            // a buffer id of its own: the step's reads of the variable read
            // it, while a tensor from outside that read the same value (a
            // snapshot, `w.detach()`, or `&*w * 2.0` not yet computed)
            // keeps the old id, so it binds the value of the recording
            // call, not the variable's value at each call.
            let mut by_buffer = HashMap::new();
            for i in 0..state.ws.vars.len() {
                let v = VarId(i as u32);
                let buffer = state.var_buffer(v)?;
                state.set_var_buffer(v, buffer)?;
                if let Op::Buffer(b) = state.graph.node(state.ws.vars[i].value).op {
                    by_buffer.insert(b, v);
                }
            }
            // The old ids that nothing reads go now: each would hold the
            // bytes a second time, and the recording run would write over
            // a copy of every variable it updates in place (`donate.rs`).
            state.collect();
            let host_before: Vec<BufferId> = state.host_scalars.keys().copied().collect();
            (state.ws.vars.len(), by_buffer, state.next_stream, host_before)
        };
        let mut arg_of_buffer: HashMap<BufferId, usize> = HashMap::new();
        for (k, t) in arg_tensors.iter().enumerate() {
            let node = t.node_in(ctx, location)?;
            if let Op::Buffer(b) = ctx.state().graph.node(node).op {
                arg_of_buffer.insert(b, k);
            }
        }
        let results = {
            let _recording = Recording::start(ctx);
            f(&arg_tensors)?
        };
        let (pending_vars, stream_end, host_reads) = {
            let state = ctx.state();
            if state.ws.vars.len() != vars_before {
                let made: Vec<&str> = state.ws.vars[vars_before..].iter().map(|v| v.name.as_str()).collect();
                return Err(misuse(
                    format!(
                        "the step created variable(s) {}; create modules and optimizers before capturing",
                        made.join(", ")
                    ),
                    location,
                ));
            }
            if !state.ws.grads.is_empty() {
                return Err(misuse(
                    "the step returned with gradients held; release them inside it (zero_grad after the optimizer's step)".into(),
                    location,
                ));
            }
            let mut pending: HashMap<NodeId, Vec<VarId>> = HashMap::new();
            for (i, v) in state.ws.vars.iter().enumerate() {
                if !matches!(state.graph.node(v.value).op, Op::Buffer(_)) {
                    pending.entry(v.value).or_default().push(VarId(i as u32));
                }
            }
            // The host scalars the step read (not those read outside it,
            // which are values of their recording, as any outside tensor).
            let host_reads: HashMap<BufferId, (HostScalar, DType)> = state
                .host_scalars
                .iter()
                .filter(|(id, _)| !host_before.contains(id))
                .map(|(id, read)| (*id, read.clone()))
                .collect();
            (pending, state.next_stream, host_reads)
        };
        let targets = results.iter().map(|t| t.node_in(ctx, location)).collect::<Result<Vec<_>>>()?;
        // Only variables may be written over: any other buffer the plan
        // reads becomes a constant of the step (`Source::Const`).
        let traced = ctx.realize_traced(&targets, &|b| var_of_buffer.contains_key(&b))?;
        let classify = |id: BufferId, buffers: &dyn Fn(BufferId) -> Option<Buffer>| -> Result<Source> {
            if let Some(&k) = arg_of_buffer.get(&id) {
                Ok(Source::Arg(k))
            } else if let Some((cell, dtype)) = host_reads.get(&id) {
                Ok(Source::Host(cell.clone(), *dtype, Mutex::new(None)))
            } else if let Some(&v) = var_of_buffer.get(&id) {
                Ok(Source::Var(v))
            } else {
                buffers(id)
                    .map(Source::Const)
                    .ok_or_else(|| Error::Backend(format!("captured step: buffer {} vanished", id.0)))
            }
        };
        let mut sinks = Vec::new();
        for (k, node) in traced.targets.iter().enumerate() {
            if k < results.len() {
                sinks.push((k, Sink::Out(k)));
            }
            for &v in pending_vars.get(node).into_iter().flatten() {
                sinks.push((k, Sink::Var(v)));
            }
        }
        let (bound, passthrough) = match &traced.job {
            Some(job) => {
                let state = ctx.state();
                let lookup = |id: BufferId| state.buffers.get(&id).cloned();
                let mut sources = Vec::with_capacity(job.input_ids.len());
                // A slot given up to the run has no buffer here: it is a
                // variable (the only kind the recording gives), a `Var` source.
                for (k, &id) in job.input_ids.iter().enumerate() {
                    let own = job.bound(k);
                    sources.push(classify(id, &|b| {
                        if b == id {
                            own.cloned().or_else(|| lookup(b))
                        } else {
                            lookup(b)
                        }
                    })?);
                }
                let streams = job
                    .rng
                    .streams
                    .iter()
                    .map(
                        |&s| if s >= stream_base { Stream::Fresh(s - stream_base) } else { Stream::Fixed(s) },
                    )
                    .collect();
                (
                    Some(Bound {
                        executable: job.executable.clone(),
                        profiled: job.profiled,
                        sources,
                        streams,
                    }),
                    Vec::new(),
                )
            }
            None => {
                // Every result was a buffer already: they are passed through.
                let state = ctx.state();
                let mut passthrough = Vec::new();
                for node in &traced.targets[..results.len()] {
                    let Op::Buffer(id) = state.graph.node(*node).op else {
                        return Err(Error::Backend("captured step: a result was not realized".into()));
                    };
                    passthrough.push(classify(id, &|b| state.buffers.get(&b).cloned())?);
                }
                (None, passthrough)
            }
        };
        let plan = StepPlan {
            signature,
            bound,
            sinks,
            passthrough,
            results: results.len(),
            stream_span: stream_end - stream_base,
        };
        Ok((plan, results))
    }

    /// Binds the arguments and the variables' values, launches the plan,
    /// and stores its outputs.
    pub(crate) fn replay(&self, ctx: &Context, args: &[&Tensor], location: Location) -> Result<Vec<Tensor>> {
        let arg_buffers = prepare(ctx, args, location)?;
        let Some(bound) = &self.bound else {
            let state = ctx.state();
            let buffers = self
                .passthrough
                .iter()
                .map(|s| source_buffer(ctx, &state, s, &arg_buffers))
                .collect::<Result<Vec<_>>>()?;
            drop(state);
            return Ok(buffers.into_iter().map(|b| ctx.record_buffer(b)).collect());
        };
        let job = {
            let mut state = ctx.state();
            // A variable the plan writes over is given up to the run when
            // nothing else reads its value (see `context/donate.rs`).
            let donated = bound.executable.donated();
            let mut given = Vec::new();
            let mut inputs = Vec::with_capacity(bound.sources.len());
            for (k, s) in bound.sources.iter().enumerate() {
                let gives_up = match s {
                    Source::Var(v) if donated.contains(&(k as u32)) => state.give_up_var(*v),
                    _ => None,
                };
                if gives_up.is_some() {
                    given.push(k as u32);
                }
                inputs.push(match gives_up {
                    Some(b) => b,
                    None => source_buffer(ctx, &state, s, &arg_buffers)?,
                });
            }
            let base = state.next_stream;
            state.next_stream += self.stream_span;
            let streams = bound
                .streams
                .iter()
                .map(|s| match *s {
                    Stream::Fixed(n) => n,
                    Stream::Fresh(offset) => base + offset,
                })
                .collect();
            crate::context::Job {
                executable: bound.executable.clone(),
                inputs,
                input_ids: Vec::new(),
                rng: RngArgs { seed: state.seed, streams },
                profiled: bound.profiled,
                given,
                kept: Vec::new(),
            }
        };
        let mut job = job;
        let outputs = ctx.launch_job(&mut job)?.outputs;
        let mut results: Vec<Option<Buffer>> = vec![None; self.results];
        {
            let mut state = ctx.state();
            for (k, sink) in &self.sinks {
                let buffer = outputs.get(*k).ok_or_else(|| {
                    Error::Backend("captured step: the plan returned too few outputs".into())
                })?;
                match sink {
                    Sink::Out(r) => results[*r] = Some(buffer.clone()),
                    Sink::Var(v) => state.set_var_buffer(*v, buffer.clone())?,
                }
            }
            state.collect();
        }
        results
            .into_iter()
            .map(|b| {
                b.map(|b| ctx.record_buffer(b))
                    .ok_or_else(|| Error::Backend("captured step: a result has no output".into()))
            })
            .collect()
    }
}

/// The buffer a source binds now.
fn source_buffer(
    ctx: &Context,
    state: &crate::context::State,
    s: &Source,
    args: &[Buffer],
) -> Result<Buffer> {
    match s {
        Source::Host(cell, dtype, last) => {
            let bits = cell.get().to_bits();
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            match &*last {
                Some((held, buffer)) if *held == bits => Ok(buffer.clone()),
                _ => {
                    let buffer = cell.upload(ctx, *dtype)?;
                    *last = Some((bits, buffer.clone()));
                    Ok(buffer)
                }
            }
        }
        Source::Arg(k) => {
            args.get(*k).cloned().ok_or_else(|| Error::Backend("captured step: argument missing".into()))
        }
        Source::Const(b) => Ok(b.clone()),
        Source::Var(v) => state.var_buffer(*v),
    }
}

/// Marks the calling thread as recording a captured step for as long as
/// it lives (its host reads are errors: see `State::check_not_capturing`),
/// also when the closure fails or panics.
struct Recording<'a>(&'a Context);

impl<'a> Recording<'a> {
    fn start(ctx: &'a Context) -> Recording<'a> {
        ctx.state().capturing = Some(std::thread::current().id());
        Recording(ctx)
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        self.0.state().capturing = None;
    }
}
