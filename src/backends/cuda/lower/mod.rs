//! Lowering a [`Plan`] to a [`Program`]: where every value lives, and what
//! each step launches. Pure: no device, so every program is a snapshot.
//!
//! # Where values live
//!
//! Every buffer the CUDA backend hands out is dense, so a value's place is
//! a region offset and a strided layout over it, known when the plan is
//! compiled:
//!
//! - `input k`: input slot `k`, dense.
//! - `full`: a constant, no memory; kernels read it as a literal, and it
//!   is written out only where memory is needed (a library operand, an
//!   output).
//! - views: their operand's place under a new layout, no copy (a reshape
//!   that no strides express is a copy into its own bytes, exactly where
//!   the memory pass places such a reshape).
//! - everything else: the memory plan's arena offset (in place of an
//!   operand where it says so); a graph output's own slot; without a
//!   memory plan, scratch.
//!
//! A graph output that is an input is handed back as it is; one that is a
//! dense view of an output slot shares it; any other is copied into a slot
//! of its own right after its value is computed.

mod attention;
mod collective;
mod gemm_wgmma;
mod gemv;
mod group;
mod matmul;
mod ops;

use super::codegen::index::Access;
use super::codegen::Kernel;
use super::program::{IndexCheck, Launch, Loc, Output, Program, Region, Step};
use crate::backends::Layout;
use crate::ir::{DType, NodeId, Op, Placement, Plan, Scalar, Shape};
use crate::{Error, Result};
use std::collections::HashMap;

/// Alignment of scratch values and output slots (bytes).
const ALIGN: u64 = 256;

/// Where a value's elements are.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Storage {
    /// Memory at a location.
    Mem(Loc),
    /// A constant everywhere.
    Const(Scalar),
}

/// A value of the plan: its storage and the layout over it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Value {
    pub storage: Storage,
    pub layout: Layout,
    pub dtype: DType,
}

impl Value {
    fn dense(loc: Loc, shape: Shape, dtype: DType) -> Value {
        Value { storage: Storage::Mem(loc), layout: Layout::contiguous(shape), dtype }
    }

    /// True when the elements are row-major dense from the storage start.
    fn is_dense_at_start(&self) -> bool {
        self.layout.offset == 0 && self.layout.is_contiguous()
    }
}

/// The state of one lowering.
pub(crate) struct Lowering<'p> {
    pub plan: &'p Plan,
    pub values: HashMap<NodeId, Value>,
    pub kernels: Vec<Kernel>,
    pub scratch: u64,
    /// The stream of the step being lowered, and how many bytes of its
    /// [`Region::Transient`] the step has taken.
    stream: u32,
    cursor: u64,
    /// Each stream's [`Region::Transient`] bytes: its largest step's need.
    transient: Vec<u64>,
    /// Bytes of [`Region::Counters`] so far.
    pub counters: u64,
    pub out_slots: Vec<u64>,
    pub checks: Vec<IndexCheck>,
    /// Launches of the step being lowered.
    pub launches: Vec<Launch>,
    /// The step that computed each value's storage (for output copies).
    producer: HashMap<NodeId, usize>,
    /// Graph outputs that got a slot of their own when placed.
    slot_of: HashMap<NodeId, u32>,
    tf32: bool,
    hopper: bool,
    wgmma_gemm: bool,
    sms: usize,
}

/// What a lowering may assume of the device it lowers for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Target {
    /// Float32 GEMMs and convolutions may use TF32.
    pub tf32: bool,
    /// The device is an sm_90 part whose kernels are compiled for sm_90a
    /// (`nvrtc/mod.rs`): the `wgmma` kernels may be chosen
    /// (`codegen/attention_wgmma.rs`, `codegen/attention_grad_wgmma.rs`).
    /// Never in the emulator.
    pub hopper: bool,
    /// On a `hopper` target, matmul bodies whose epilogue cuBLASLt takes
    /// none of run on the Hopper GEMM with the epilogue inside it
    /// (`codegen/gemm_wgmma.rs`) instead of cuBLAS and an epilogue kernel.
    /// On unless `KILN_CUDA_WGMMA_GEMM=0` ([`Target::wgmma_gemm_wanted`]).
    pub wgmma_gemm: bool,
    /// The device's multiprocessors, 0 when unknown: the Hopper GEMM runs
    /// a persistent grid of this many blocks where it is known.
    pub sms: usize,
}

impl Target {
    /// Whether the Hopper GEMM may be chosen: unless
    /// `KILN_CUDA_WGMMA_GEMM=0` (cuBLAS and an epilogue kernel, for
    /// measuring one against the other).
    pub fn wgmma_gemm_wanted() -> bool {
        std::env::var("KILN_CUDA_WGMMA_GEMM").map_or(true, |v| v != "0")
    }
}

/// Lowers `plan`; `tf32` lets float32 GEMMs and convolutions use TF32.
///
/// The plan is checked first, as the CPU backend checks it
/// (`backends/check.rs`), and every location of the program is then
/// checked against its region ([`Program::check`]): a plan that would
/// make a kernel write outside its memory is an error here, never a
/// launch.
pub fn lower(plan: &Plan, tf32: bool) -> Result<Program> {
    lower_for(plan, Target { tf32, ..Target::default() })
}

/// [`lower`] for a device described by `target`.
pub fn lower_for(plan: &Plan, target: Target) -> Result<Program> {
    crate::backends::check::check_plan(plan).map_err(|e| Error::Backend(format!("cuda: {e}")))?;
    let program = lower_checked(plan, target)?;
    program.check().map_err(|e| Error::Backend(format!("cuda: the lowered program is inconsistent: {e}")))?;
    Ok(program)
}

fn lower_checked(plan: &Plan, Target { tf32, hopper, wgmma_gemm, sms }: Target) -> Result<Program> {
    let mut l = Lowering {
        plan,
        values: HashMap::new(),
        kernels: Vec::new(),
        scratch: 0,
        stream: 0,
        cursor: 0,
        transient: Vec::new(),
        counters: 0,
        out_slots: Vec::new(),
        checks: Vec::new(),
        launches: Vec::new(),
        producer: HashMap::new(),
        slot_of: HashMap::new(),
        tf32,
        hopper,
        wgmma_gemm,
        sms,
    };
    let graph = &plan.graph;
    let tables = graph.tables();
    // Launch group members, each with its group's last member.
    let last_member: HashMap<NodeId, NodeId> = tables
        .groups
        .iter()
        .flat_map(|g| g.members.iter().filter_map(move |&m| Some((m, *g.members.last()?))))
        .collect();
    let mut held = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    for &id in &plan.order {
        let node = graph.node(id);
        l.launches.clear();
        let stream = tables.streams.as_ref().and_then(|s| s.stream_of.get(&id)).map_or(0, |s| s.0);
        if held.is_empty() {
            // A new step (a launch group's members share the last one's).
            (l.stream, l.cursor) = (stream, 0);
        }
        let lowering =
            |e: String| Error::Backend(format!("cuda: lowering {id} ({}): {e}", node.op.mnemonic()));
        match last_member.get(&id) {
            Some(&last) => {
                held.extend(l.hold_member(id).map_err(lowering)?);
                if last == id {
                    l.launch_group(&held).map_err(lowering)?;
                    held.clear();
                }
            }
            None => l.lower_node(id).map_err(lowering)?,
        }
        steps.push(Step {
            node: id,
            op: node.op.mnemonic(),
            stream,
            waits: vec![],
            records: vec![],
            launches: std::mem::take(&mut l.launches),
        });
        if !steps.last().is_some_and(|s| s.launches.is_empty()) {
            l.producer.insert(id, steps.len() - 1);
            for e in l.extras_of(id).into_iter().flatten() {
                l.producer.insert(e, steps.len() - 1);
            }
            if last_member.get(&id) == Some(&id) {
                for g in tables.groups.iter().filter(|g| g.members.last() == Some(&id)) {
                    for &m in &g.members {
                        l.producer.insert(m, steps.len() - 1);
                        for e in l.extras_of(m).into_iter().flatten() {
                            l.producer.insert(e, steps.len() - 1);
                        }
                    }
                }
            }
        }
    }
    if !held.is_empty() {
        return Err(bad("a launch group's last member is not in the plan".into()));
    }
    let (streams, events) = match &tables.streams {
        Some(sp) => {
            let pos: HashMap<NodeId, usize> = plan.order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
            for (e, ev) in sp.events.iter().enumerate() {
                let at = *pos
                    .get(&ev.after)
                    .ok_or_else(|| bad(format!("event e{e} follows a node not in the plan")))?;
                steps[at].records.push(e as u32);
                for w in &ev.waiters {
                    let wp = *pos
                        .get(w)
                        .ok_or_else(|| bad(format!("event e{e} is awaited by {w}, not in the plan")))?;
                    if wp <= at {
                        return Err(bad(format!("{w} waits for event e{e}, recorded after {}", ev.after)));
                    }
                    steps[wp].waits.push(e as u32);
                }
            }
            // A group member's events follow the launch that computes it.
            for g in &tables.groups {
                let Some(last) = g.members.last().and_then(|m| pos.get(m)).copied() else { continue };
                for m in &g.members[..g.members.len() - 1] {
                    if let Some(&at) = pos.get(m) {
                        let moved = std::mem::take(&mut steps[at].records);
                        steps[last].records.extend(moved);
                    }
                }
            }
            (sp.count.max(1), sp.events.len() as u32)
        }
        None => (1, 0),
    };
    // Graph outputs: handed back, shared, or copied after their producer.
    let mut prelude = Vec::new();
    let mut outputs = Vec::new();
    for &o in graph.outputs() {
        let v = l.value(o).map_err(bad)?.clone();
        let node = graph.node(o);
        let over = l.written_over(o);
        let out = match &v.storage {
            Storage::Mem(Loc { region: Region::Input(k), offset: 0 }) if v.is_dense_at_start() && over => {
                Output::OverInput { k: *k, shape: node.shape.clone(), dtype: node.dtype }
            }
            Storage::Mem(Loc { region: Region::Input(k), offset: 0 }) if v.is_dense_at_start() => {
                Output::Input { k: *k, shape: node.shape.clone() }
            }
            Storage::Mem(Loc { region: Region::Out(s), offset: 0 })
                if v.is_dense_at_start() && l.out_slots[*s as usize] == bytes(&node.shape, node.dtype) =>
            {
                Output::Slot { slot: *s, shape: node.shape.clone(), dtype: node.dtype }
            }
            _ => {
                let slot = l.new_slot(&node.shape, node.dtype);
                let dst = Loc::new(Region::Out(slot), 0);
                l.launches.clear();
                l.copy_into(&v, &node.shape, dst).map_err(bad)?;
                let copy = std::mem::take(&mut l.launches);
                match l.root_producer(o) {
                    Some(step) => steps[step].launches.extend(copy),
                    None => prelude.extend(copy),
                }
                Output::Slot { slot, shape: node.shape.clone(), dtype: node.dtype }
            }
        };
        outputs.push(out);
    }
    steps.retain(|s| !s.launches.is_empty() || !s.waits.is_empty() || !s.records.is_empty());
    let random_streams = plan.random_streams;
    let params_bytes = 8 * (1 + random_streams as u64) + 16 * l.checks.len() as u64;
    let inputs = (0..plan.inputs)
        .map(|k| {
            plan.order
                .iter()
                .map(|&n| graph.node(n))
                .find(|n| n.op == Op::Input(k as u32))
                .map(|n| (n.shape.clone(), n.dtype))
        })
        .collect();
    Ok(Program {
        kernels: l.kernels,
        prelude,
        steps,
        arena_bytes: tables.memory.as_ref().map_or(0, |m| m.arena_bytes),
        scratch_bytes: l.scratch,
        transient_bytes: l.transient,
        counter_bytes: l.counters,
        params_bytes,
        inputs,
        out_slots: l.out_slots,
        outputs,
        streams,
        events,
        random_streams,
        checks: l.checks,
        donated: plan.donated.clone(),
        grouped: tables.groups.iter().map(|g| g.members.len() as u64).sum(),
    })
}

fn bad(msg: String) -> Error {
    Error::Backend(format!("cuda: {msg}"))
}

/// Bytes of a dense tensor.
pub(crate) fn bytes(shape: &Shape, dtype: DType) -> u64 {
    shape.numel() as u64 * dtype.size() as u64
}

impl Lowering<'_> {
    pub fn value(&self, id: NodeId) -> Result<&Value, String> {
        self.values.get(&id).ok_or_else(|| format!("{id} is used before it is computed"))
    }

    /// The operand values of `id`, in slot order.
    pub fn operands(&self, id: NodeId) -> Result<Vec<Value>, String> {
        self.plan.graph.operands(id).iter().map(|&o| self.value(o).cloned()).collect()
    }

    fn new_slot(&mut self, shape: &Shape, dtype: DType) -> u32 {
        self.out_slots.push(bytes(shape, dtype));
        (self.out_slots.len() - 1) as u32
    }

    /// Bytes of scratch for a value that outlives its step.
    pub fn new_scratch(&mut self, bytes: u64) -> Loc {
        let at = self.scratch.div_ceil(ALIGN) * ALIGN;
        self.scratch = at + bytes.max(1);
        Loc::new(Region::Scratch, at)
    }

    /// Bytes that only the step being lowered uses, while it runs: in its
    /// stream's [`Region::Transient`], which the next step of the stream
    /// takes again from offset 0.
    pub fn transient(&mut self, bytes: u64) -> Loc {
        let at = self.cursor.div_ceil(ALIGN) * ALIGN;
        self.cursor = at + bytes.max(1);
        let s = self.stream as usize;
        if self.transient.len() <= s {
            self.transient.resize(s + 1, 0);
        }
        self.transient[s] = self.transient[s].max(self.cursor);
        Loc::new(Region::Transient(self.stream), at)
    }

    /// `n` fresh arrival counters (u32, zero at every launch; see
    /// [`Region::Counters`]).
    pub fn new_counters(&mut self, n: usize) -> Loc {
        let at = self.counters;
        self.counters += 4 * n.max(1) as u64;
        Loc::new(Region::Counters, at)
    }

    /// A generated kernel's index in the program, reusing an identical one.
    pub fn kernel(&mut self, k: Kernel) -> usize {
        match self.kernels.iter().position(|x| x.source == k.source) {
            Some(i) => i,
            None => {
                self.kernels.push(k);
                self.kernels.len() - 1
            }
        }
    }

    /// Where computed node `id` writes its value (see the module docs).
    pub fn destination(&mut self, id: NodeId) -> Result<Loc, String> {
        let graph = &self.plan.graph;
        let node = graph.node(id);
        let is_output = graph.outputs().contains(&id);
        let placement = graph.tables().memory.as_ref().and_then(|m| m.values.get(&id)).map(|v| &v.placement);
        match placement {
            Some(Placement::Arena { offset, bytes: b, .. }) => {
                if *b != bytes(&node.shape, node.dtype) {
                    return Err(format!(
                        "its arena range has {b} bytes, not {}",
                        bytes(&node.shape, node.dtype)
                    ));
                }
                let arena = graph.tables().memory.as_ref().map_or(0, |m| m.arena_bytes);
                if offset.checked_add(*b).is_none_or(|end| end > arena) {
                    return Err(format!("its arena range {offset}+{b} ends past the {arena}-byte arena"));
                }
                Ok(Loc::new(Region::Arena, *offset))
            }
            Some(Placement::Output) | None if is_output => {
                let slot = self.new_slot(&node.shape, node.dtype);
                self.slot_of.insert(id, slot);
                Ok(Loc::new(Region::Out(slot), 0))
            }
            Some(Placement::Output) | None => Ok(self.new_scratch(bytes(&node.shape, node.dtype))),
            Some(Placement::OverInput(of)) => match graph.node(*of).op {
                Op::Input(k) => Ok(Loc::new(Region::Input(k), 0)),
                _ => Err(format!("it is placed over {of}, which is not an input")),
            },
            Some(p) => Err(format!("a computed value cannot be placed as {p:?}")),
        }
    }

    /// Whether the storage `id` reads (following views) is written over an
    /// input ([`Placement::OverInput`]).
    fn written_over(&self, id: NodeId) -> bool {
        let graph = &self.plan.graph;
        let Some(memory) = graph.tables().memory.as_ref() else { return false };
        let mut cur = id;
        loop {
            if let Some(v) = memory.values.get(&cur) {
                if matches!(v.placement, Placement::OverInput(_)) {
                    return true;
                }
            }
            if !graph.node(cur).op.is_view() {
                return false;
            }
            match graph.operands(cur).first() {
                Some(&o) => cur = o,
                None => return false,
            }
        }
    }

    /// The step whose launches computed the storage `id` reads (following views).
    fn root_producer(&self, id: NodeId) -> Option<usize> {
        let mut cur = id;
        loop {
            if let Some(&s) = self.producer.get(&cur) {
                return Some(s);
            }
            let node = self.plan.graph.node(cur);
            if !node.op.is_view() {
                return None;
            }
            cur = *self.plan.graph.operands(cur).first()?;
        }
    }

    /// The `extra` node of each extra output of node `id` (`[j - 1]` for
    /// output `j`, see [`crate::ir::extra_outputs`]); `None` where the
    /// plan has none.
    pub(super) fn extras_of(&self, id: NodeId) -> Vec<Option<NodeId>> {
        let graph = &self.plan.graph;
        let count = crate::ir::extra_outputs(&graph.node(id).op);
        let mut out = vec![None; count];
        for u in graph.users(id) {
            if let Op::Extra { output } = graph.node(u).op {
                if let Some(slot) = output.checked_sub(1).and_then(|j| out.get_mut(j)) {
                    *slot = Some(u);
                }
            }
        }
        out
    }

    /// Places the extra outputs of fused node `id` where the memory plan
    /// says (their values exist from its launch on) and returns their
    /// locations in output order; an output no node reads gets scratch.
    pub(super) fn place_extras(
        &mut self,
        id: NodeId,
        body: &crate::ir::FusedBody,
    ) -> Result<Vec<Loc>, String> {
        let mut locs = Vec::new();
        for (j, extra) in self.extras_of(id).into_iter().enumerate() {
            let out = body.graph().node(body.outputs()[j + 1]);
            let loc = match extra {
                Some(e) => {
                    let loc = self.destination(e)?;
                    self.values.insert(e, Value::dense(loc, out.shape.clone(), out.dtype));
                    loc
                }
                None => self.transient(bytes(&out.shape, out.dtype)),
            };
            locs.push(loc);
        }
        Ok(locs)
    }

    /// Places the extra outputs of non-fused node `id` (an attention's)
    /// if none has an element, so there is nothing to write; whether it
    /// did.
    pub(super) fn place_empty_extras(&mut self, id: NodeId) -> Result<bool, String> {
        let extras: Vec<NodeId> = self.extras_of(id).into_iter().flatten().collect();
        if extras.iter().any(|&e| self.plan.graph.node(e).shape.numel() > 0) {
            return Ok(false);
        }
        for e in extras {
            let node = self.plan.graph.node(e).clone();
            let loc = self.destination(e)?;
            self.values.insert(e, Value::dense(loc, node.shape, node.dtype));
        }
        Ok(true)
    }

    fn lower_node(&mut self, id: NodeId) -> Result<(), String> {
        let node = self.plan.graph.node(id).clone();
        let value = match &node.op {
            // Placed and written by its fused node (`place_extras`).
            Op::Extra { .. } => {
                self.value(id).map_err(|_| "its fused node did not write it".to_string())?;
                return Ok(());
            }
            Op::Input(k) => Value::dense(Loc::new(Region::Input(*k), 0), node.shape.clone(), node.dtype),
            Op::Buffer(b) => return Err(format!("buffer {} in a plan (plans bind inputs)", b.0)),
            Op::Full(v) => Value {
                storage: Storage::Const(*v),
                layout: Layout { shape: node.shape.clone(), strides: vec![0; node.shape.rank()], offset: 0 },
                dtype: node.dtype,
            },
            op if op.is_view() => self.lower_view(id, op)?,
            _ => {
                let dst = self.destination(id)?;
                self.lower_compute(id, dst)?;
                Value::dense(dst, node.shape.clone(), node.dtype)
            }
        };
        self.values.insert(id, value);
        Ok(())
    }

    /// A view: its operand's storage under a new layout, or a copy when
    /// no strides express it (or the memory plan gave it bytes of its own).
    fn lower_view(&mut self, id: NodeId, op: &Op) -> Result<Value, String> {
        let node = self.plan.graph.node(id);
        let from = self.operands(id)?.remove(0);
        let viewed = match op {
            Op::Reshape(t) => from.layout.reshape(t),
            Op::Permute(p) => Some(from.layout.permute(p)),
            Op::Expand(t) => Some(from.layout.expand(t)),
            Op::Slice { dim, start, step, len } => Some(from.layout.slice(*dim, *start, *step, *len)),
            _ => None,
        };
        let own_bytes = matches!(
            self.plan.graph.tables().memory.as_ref().and_then(|m| m.values.get(&id)).map(|v| &v.placement),
            Some(Placement::Arena { .. })
        );
        match (viewed, &from.storage) {
            (_, Storage::Const(c)) => Ok(Value {
                storage: Storage::Const(*c),
                layout: Layout { shape: node.shape.clone(), strides: vec![0; node.shape.rank()], offset: 0 },
                dtype: node.dtype,
            }),
            (Some(layout), _) if !own_bytes => Ok(Value { layout, ..from }),
            _ => {
                // A copy: read the operand through the view, write densely.
                let dst = self.destination(id)?;
                let src = Access::strided(from.layout.clone()).view(op);
                self.copy_access(&from, src, &node.shape, node.dtype, dst)?;
                Ok(Value::dense(dst, node.shape.clone(), node.dtype))
            }
        }
    }
}
