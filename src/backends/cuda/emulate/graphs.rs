//! CUDA graph replay, emulated: the same decisions as `graph.rs` (made by
//! the shared bookkeeping in `replay.rs`) over CPU memory.
//!
//! - An *input slot* is a region that keeps its bytes across runs; a
//!   replay reads the slot, and copies the bound buffer into it only when
//!   the bookkeeping says the slot does not hold those bytes yet (keyed by
//!   the buffer's storage contents and layout).
//! - An *output set* is one storage per output slot, handed to the caller
//!   as the run's buffers. A replay reuses a set only when nobody holds
//!   any of its storages, and rewrites them in place with new contents,
//!   as a replayed graph rewrites its output allocations.
//!
//! Eager runs (the first, or every set held, or graphs off) read the
//! bound buffers directly and return fresh buffers.
//!
//! On the GPU a slot adopts the bound buffer's allocation when the graph
//! is captured (`slots.rs`). Here a new slot takes the bound bytes
//! without counting an input copy when the GPU would adopt them (an input
//! bound to the same storage on the run before; a donated one only when
//! the run holds it alone), so the
//! counters agree; a later call binding other bytes counts a copy, where
//! the GPU may instead let go of a slot someone holds and capture again.

use super::{from_bytes, host_bytes, Emulated, Region256};
use crate::backends::cpu::{CpuBuffer, Layout, Storage};
use crate::backends::cuda::program::Output;
use crate::backends::cuda::replay::{Next, Replays};
use crate::backends::{Backend, Buffer, Contents, DeviceStats, RngArgs};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The replay state of one emulated executable.
pub(super) struct Graphs {
    replays: Replays<(Contents, Layout)>,
    slots: Vec<Option<Region256>>,
    /// Per set, the storage of each output slot (`None` for a slot no
    /// output reads).
    sets: Vec<Vec<Option<Arc<Storage>>>>,
    /// The emulated device's counters (captures, replays, input copies).
    stats: Arc<DeviceStats>,
    /// Per input slot written over (`Program::donated`), the identity of
    /// the output the last replay handed out from it: the slot still
    /// holds those bytes, so binding that very buffer again copies
    /// nothing (the GPU's slot is that buffer's allocation).
    over: Vec<Option<(Contents, Layout)>>,
    /// The address of the storage each input was bound to on the run
    /// before: a capture adopts only an input bound to the same one twice
    /// running. An address, not a `Weak`: a weak reference would make the
    /// storage look shared to `Arc::get_mut` (an output set could not be
    /// rewritten). A freed storage's address reused is only a miscounted
    /// copy here: the slot takes the bound bytes either way.
    last: Vec<usize>,
}

fn bad(msg: String) -> Error {
    Error::Backend(format!("emulator: {msg}"))
}

impl Graphs {
    pub fn new(inputs: usize, enabled: bool, stats: Arc<DeviceStats>) -> Graphs {
        Graphs {
            replays: Replays::new(inputs, enabled),
            slots: (0..inputs).map(|_| None).collect(),
            sets: Vec::new(),
            stats,
            over: (0..inputs).map(|_| None).collect(),
            last: vec![0; inputs],
        }
    }

    /// One run of `exe`: eager, or a replay of a (maybe new) output set.
    pub fn run(
        &mut self,
        exe: &Emulated,
        inputs: &[Buffer],
        owned: bool,
        rng: &RngArgs,
    ) -> Result<Vec<Buffer>> {
        let free = self.sets.iter().map(|set| set.iter().flatten().all(|s| Arc::strong_count(s) == 1));
        let next = self.replays.next(free);
        let stable: Vec<bool> = inputs
            .iter()
            .zip(&mut self.last)
            .map(|(b, last)| match b {
                Buffer::Cpu(c) => {
                    let now = c.storage_address();
                    let same = *last == now;
                    *last = now;
                    same
                }
                _ => false,
            })
            .collect();
        let set = match next {
            Next::Eager => {
                let ins = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, b)| exe.input_region(k, b))
                    .collect::<Result<Vec<_>>>()?;
                let outs = exe.out_regions()?;
                let ins: Vec<&Region256> = ins.iter().collect();
                exe.execute(&ins, &outs, rng)?;
                self.replays.ran();
                return exe.fresh_outputs(inputs, &ins, &outs);
            }
            Next::Replay(k) => k,
            Next::Capture => {
                for k in self.capture(exe)? {
                    if stable[k] {
                        self.adopt(exe, k, &inputs[k], owned)?;
                    }
                }
                self.stats.graph_captures.fetch_add(1, Ordering::Relaxed);
                self.replays.captured()
            }
        };
        for (k, b) in inputs.iter().enumerate() {
            let Some(slot) = self.slots[k].as_ref() else { continue };
            let Buffer::Cpu(c) = b else { return Err(bad(format!("input {k} is not an emulator buffer"))) };
            let copy = if exe.program.donated.contains(&(k as u32)) {
                // Written over by every replay: it holds the bytes of the
                // output handed out last, and nothing else. As on the GPU
                // (where the slot is that output's allocation), binding it
                // again copies nothing only when the run holds the only
                // reference (the caller gave it up).
                let held = self.over[k].take();
                !(owned && c.is_unique() && held == Some(c.identity()))
            } else {
                self.replays.must_copy(k, c.identity())
            };
            if copy {
                let copied = exe.cpu_bytes(b).and_then(|bytes| slot.fill(&bytes));
                if let Err(e) = copied {
                    self.replays.forget(k);
                    return Err(e);
                }
                self.stats.graph_input_copies.fetch_add(1, Ordering::Relaxed);
            }
        }
        let placeholder = Region256::new(8)?;
        let ins: Vec<&Region256> = self.slots.iter().map(|s| s.as_ref().unwrap_or(&placeholder)).collect();
        let outs = exe.out_regions()?;
        exe.execute(&ins, &outs, rng)?;
        self.replays.ran();
        self.stats.graph_replays.fetch_add(1, Ordering::Relaxed);
        let set = &mut self.sets[set];
        for (slot, storage) in set.iter_mut().enumerate() {
            let Some(storage) = storage else { continue };
            let data = from_bytes(outs[slot].bytes(), storage_len(storage)?, storage.dtype());
            Storage::rewrite(storage, data)
                .map_err(|_| bad(format!("output slot {slot} of a free set is still held")))?;
        }
        exe.program
            .outputs
            .iter()
            .map(|o| match o {
                Output::Input { k, shape } => {
                    let data = exe.cpu.download(&inputs[*k as usize])?;
                    exe.cpu.upload(data, shape)
                }
                Output::OverInput { k, shape, dtype } => {
                    let data = from_bytes(ins[*k as usize].bytes(), shape.numel(), *dtype);
                    let out = exe.cpu.upload(data, shape)?;
                    if let Buffer::Cpu(c) = &out {
                        self.over[*k as usize] = Some(c.identity());
                    }
                    Ok(out)
                }
                Output::Slot { slot, shape, .. } => {
                    let storage = set[*slot as usize]
                        .clone()
                        .ok_or_else(|| bad(format!("output slot {slot} has no storage")))?;
                    Ok(Buffer::Cpu(CpuBuffer::over(storage, Layout::contiguous(shape.clone()))))
                }
            })
            .collect()
    }

    /// A new output set, and the input slots on the first capture (their
    /// numbers are returned).
    fn capture(&mut self, exe: &Emulated) -> Result<Vec<usize>> {
        let mut new = Vec::new();
        for (k, want) in exe.program.inputs.iter().enumerate() {
            let Some((shape, dtype)) = want else { continue };
            if self.slots[k].is_none() {
                self.slots[k] = Some(Region256::new(shape.numel() as u64 * dtype.size() as u64)?);
                new.push(k);
            }
        }
        let mut set: Vec<Option<Arc<Storage>>> = vec![None; exe.program.out_slots.len()];
        for o in &exe.program.outputs {
            if let Output::Slot { slot, shape, dtype } = o {
                let zeros = from_bytes(&vec![0; shape.numel() * dtype.size()], shape.numel(), *dtype);
                set[*slot as usize] = Some(Storage::new(zeros, &self.stats));
            }
        }
        self.sets.push(set);
        Ok(new)
    }

    /// A new slot `k` takes the bound bytes as the GPU's adopts the bound
    /// allocation: no input copy is counted, and binding the same buffer
    /// again copies nothing (see the module docs).
    fn adopt(&mut self, exe: &Emulated, k: usize, bound: &Buffer, owned: bool) -> Result<()> {
        let (Some(slot), Buffer::Cpu(c)) = (self.slots[k].as_ref(), bound) else { return Ok(()) };
        let donated = exe.program.donated.contains(&(k as u32));
        if donated && !(owned && c.is_unique()) {
            return Ok(());
        }
        slot.fill(&exe.cpu_bytes(bound)?)?;
        if donated {
            self.over[k] = Some(c.identity());
        } else {
            self.replays.must_copy(k, c.identity());
        }
        Ok(())
    }
}

/// Elements of an owned storage.
fn storage_len(s: &Storage) -> Result<usize> {
    Ok(s.host_slice()?.len())
}

impl Emulated {
    /// The dense bytes of a bound buffer.
    fn cpu_bytes(&self, b: &Buffer) -> Result<Vec<u8>> {
        Ok(host_bytes(&self.cpu.download(b)?))
    }
}
