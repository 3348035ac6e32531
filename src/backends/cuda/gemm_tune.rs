//! Choosing a cuBLASLt algorithm by timing it, per GEMM shape (opt-in:
//! `Context::with_gemm_tuning`, or `KILN_GEMM_TUNE=1` for every context).
//!
//! cuBLASLt's heuristic ranks the algorithms it could run, and its first
//! is a guess from a model of the chip. With tuning on, a plan's compile
//! asks for up to [`CANDIDATES`] algorithms for each cuBLASLt GEMM whose
//! shape this process has not timed, times each on scratch matrices of
//! the plan's shape and layout, and keeps the fastest (XLA's GEMM
//! autotuner does the same; PyTorch leaves it to TunableOp, off by
//! default).
//!
//! **Why it is off by default.** On an H200 (benches/RESULTS.md, thirtieth
//! measurement) it replaced the guess on 2-4 of BERT-base's and MiniLM's
//! bf16 shapes and none of MiniLM's f32 ones, and changed the encoders'
//! times by 0-2% and GPT-2 small's f32 training step by 1%, while a
//! first call took 30-600 ms longer and a process's choices (so its
//! results' last bits) may differ from another's wherever two candidates
//! time within noise of each other. The guess is deterministic.
//!
//! - **Once per shape per process.** Choices live in a process-wide map
//!   keyed by the device and everything the heuristic is told (types,
//!   transposes, sizes, leading dimensions, alignments, epilogue), so
//!   every tuning context, plan and capture in a process runs the same
//!   algorithm for a shape, and results within a process are
//!   reproducible.
//! - **The guess keeps its place unless beaten clearly**: a candidate
//!   replaces it only when it is [`MARGIN`] faster.
//! - **Where the timing runs**: on a stream of its own, on scratch
//!   matrices from the driver's stream-ordered allocator on that stream
//!   (outside kiln's caching allocator, so a plan's memory counters do not
//!   see them, and without `cuMemFree`'s device-wide synchronization),
//!   freed before the plan compile returns. A GEMM whose scratch would
//!   pass [`SCRATCH_LIMIT`], or whose scratch cannot be allocated, keeps
//!   the guess.
//! - **For tests**, `KILN_GEMM_TUNE=last` makes every plan run the
//!   heuristic's *last* candidate, untimed, so that the op suite checks
//!   algorithms other than the guess (their workspaces, their splits of
//!   k, the alignments kiln declares): what another GPU or cuBLAS version
//!   may choose for the same shape.

use super::lt::LtPlan;
use super::program::{Epilogue, Gemm};
use crate::backends::DeviceStats;
use crate::{Error, Result};
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

/// How many algorithms the heuristic is asked for when tuning.
pub(crate) const CANDIDATES: usize = 8;

/// How much faster (as a fraction of its time) a candidate must be to
/// replace the heuristic's first choice.
const MARGIN: f32 = 0.03;

/// The most bytes of scratch matrices one GEMM is tuned on.
const SCRATCH_LIMIT: u64 = 1 << 30;

/// Timed rounds per candidate; each candidate's time is its fastest round.
const ROUNDS: usize = 3;

/// What one timed round lasts at least (microseconds), to be well above
/// the events' resolution (0.5 us).
const ROUND_US: f32 = 40.0;

/// Whether every plan takes the heuristic's last candidate
/// (`KILN_GEMM_TUNE=last`, read once; see the module docs).
fn last_forced() -> bool {
    static LAST: OnceLock<bool> = OnceLock::new();
    *LAST.get_or_init(|| std::env::var("KILN_GEMM_TUNE").is_ok_and(|v| v == "last"))
}

/// How many candidates [`LtPlan::new`] should keep for [`choose`].
pub(crate) fn wanted(timed: bool) -> usize {
    if timed || last_forced() {
        CANDIDATES
    } else {
        1
    }
}

/// The chosen candidate (an index into the heuristic's ranking) per key.
fn chosen() -> &'static Mutex<HashMap<String, usize>> {
    static CHOSEN: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    CHOSEN.get_or_init(Default::default)
}

/// The cache key of `g` on device `device`: everything cuBLASLt's
/// heuristic is told, so one key always meets the same ranking.
fn key(device: &str, g: &Gemm) -> String {
    let epilogue = match g.epilogue {
        Epilogue::None => "none",
        Epilogue::Relu => "relu",
        Epilogue::Bias(_) => "bias",
        Epilogue::BiasRelu(_) => "bias-relu",
        Epilogue::Gelu => "gelu",
        Epilogue::BiasGelu(_) => "bias-gelu",
    };
    let offsets = [Some(g.a.0), Some(g.b.0), Some(g.c.0), g.residual].map(|l| l.map(|l| l.offset % 256));
    format!(
        "{device} {}->{} t{}{} m{} n{} k{} ld{},{},{} {epilogue} residual={} tf32={} offsets{offsets:?}",
        g.dtype,
        g.out_dtype,
        g.transa as u8,
        g.transb as u8,
        g.m,
        g.n,
        g.k,
        g.a.1,
        g.b.1,
        g.c.1,
        g.residual.is_some(),
        g.tf32
    )
}

/// The candidate to keep, given each one's time (`None`: it failed to
/// run): the fastest, unless it is within [`MARGIN`] of the first (the
/// heuristic's guess) or the first failed and nothing ran.
pub(crate) fn fastest(times: &[Option<f32>]) -> usize {
    let best =
        times.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t))).min_by(|a, b| a.1.total_cmp(&b.1));
    match (times.first().copied().flatten(), best) {
        (Some(first), Some((i, t))) if t < first * (1.0 - MARGIN) => i,
        (None, Some((i, _))) => i,
        _ => 0,
    }
}

/// Where and for whom [`choose`] times: the plan's cuBLASLt handle, the
/// device's context, its name (part of the cache key) and its counters.
pub(crate) struct Tuner<'a> {
    pub handle: lt::cublasLtHandle_t,
    pub ctx: &'a std::sync::Arc<cudarc::driver::CudaContext>,
    pub device: &'a str,
    pub stats: &'a DeviceStats,
}

/// Chooses `plan`'s algorithm for `g`: the heuristic's guess when not
/// `timed`; else from the cache, or by timing its candidates (see the
/// module docs; `KILN_GEMM_TUNE=last` takes the last, untimed). Called
/// under the launch lock, so no other thread enqueues work while it times.
pub(crate) fn choose(plan: &mut LtPlan, g: &Gemm, timed: bool, t: &Tuner) -> Result<()> {
    if last_forced() {
        plan.choose(plan.candidates() - 1);
        return Ok(());
    }
    if !timed || plan.candidates() < 2 {
        return Ok(());
    }
    let Tuner { handle, ctx, device, stats } = *t;
    let key = key(device, g);
    if let Some(&i) = chosen().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        plan.choose(i.min(plan.candidates() - 1));
        return Ok(());
    }
    let _span = tracing::debug_span!("gemm_tune", m = g.m, n = g.n, k = g.k, dtype = %g.dtype).entered();
    let stream =
        ctx.new_stream().map_err(|e| Error::Backend(format!("cuda: a stream to tune GEMMs on: {e:?}")))?;
    let stream = super::device::raw(&stream);
    let Some(scratch) = Scratch::new(g, plan.max_workspace(), stream)? else {
        return Ok(());
    };
    let times = time_candidates(plan, handle, stream, &scratch)?;
    drop(scratch);
    let pick = fastest(&times);
    tracing::debug!(?times, pick, "timed cuBLASLt candidates");
    plan.choose(pick);
    stats.gemm_shapes_timed.fetch_add(1, Ordering::Relaxed);
    if pick != 0 {
        stats.gemm_guesses_replaced.fetch_add(1, Ordering::Relaxed);
    }
    chosen().lock().unwrap_or_else(|e| e.into_inner()).insert(key, pick);
    Ok(())
}

/// Each candidate's fastest round (ms per GEMM), `None` where it failed.
fn time_candidates(
    plan: &mut LtPlan,
    handle: lt::cublasLtHandle_t,
    stream: sys::CUstream,
    s: &Scratch,
) -> Result<Vec<Option<f32>>> {
    let (start, end) = (TimingEvent::new()?, TimingEvent::new()?);
    let run = |plan: &mut LtPlan, i: usize, reps: usize| -> Option<f32> {
        plan.choose(i);
        start.record(stream).ok()?;
        for _ in 0..reps {
            plan.run(handle, stream, s.a, s.b, s.c, s.bias, s.c, s.workspace).ok()?;
        }
        end.record(stream).ok()?;
        end.elapsed_since(&start).ok().map(|ms| ms / reps as f32)
    };
    let n = plan.candidates();
    // A warm-up run each (the first launch of a kernel loads its module)
    // sizes the rounds.
    let mut reps = vec![0usize; n];
    for (i, r) in reps.iter_mut().enumerate() {
        if let Some(ms) = run(plan, i, 1) {
            *r = ((ROUND_US / 1000.0 / ms.max(1e-4)).ceil() as usize).clamp(1, 50);
        }
    }
    let mut times: Vec<Option<f32>> = vec![None; n];
    for _ in 0..ROUNDS {
        for i in 0..n {
            if reps[i] == 0 {
                continue;
            }
            let t = run(plan, i, reps[i]);
            times[i] = match (times[i], t) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (_, t) => t,
            };
            if t.is_none() {
                reps[i] = 0;
            }
        }
    }
    // A failed launch leaves the stream usable, but a failed kernel may
    // not: make sure it ends clean before the plan goes on.
    // SAFETY: a live stream of the bound context.
    unsafe { result::stream::synchronize(stream) }
        .map_err(|e| Error::Backend(format!("cuda: timing cuBLASLt's algorithms: {e:?}")))?;
    Ok(times)
}

/// Scratch matrices of a GEMM's shape, outside the caching allocator.
struct Scratch {
    a: u64,
    b: u64,
    c: u64,
    bias: u64,
    workspace: u64,
    blocks: Vec<sys::CUdeviceptr>,
    stream: sys::CUstream,
}

impl Scratch {
    /// A, B, C (also the residual), a bias and `workspace` bytes, filled
    /// with small finite numbers of every type; `None` past
    /// [`SCRATCH_LIMIT`] or when the device has no room. Allocated,
    /// filled and freed in `stream`'s order.
    fn new(g: &Gemm, workspace: u64, stream: sys::CUstream) -> Result<Option<Scratch>> {
        let elem = g.dtype.size() as u64;
        let (a_cols, b_cols) = (if g.transa { g.m } else { g.k }, if g.transb { g.k } else { g.n });
        let sizes = [
            g.a.1 as u64 * a_cols as u64 * elem,
            g.b.1 as u64 * b_cols as u64 * elem,
            g.c.1 as u64 * g.n as u64 * elem,
            g.m.max(g.n) as u64 * elem,
            workspace,
        ];
        if sizes.iter().sum::<u64>() > SCRATCH_LIMIT {
            return Ok(None);
        }
        let mut s = Scratch { a: 0, b: 0, c: 0, bias: 0, workspace: 0, blocks: Vec::new(), stream };
        for bytes in sizes {
            let bytes = bytes.max(256) as usize;
            // SAFETY: a stream-ordered allocation on a live stream, freed
            // in Drop on the same stream.
            let Ok(p) = (unsafe { result::malloc_async(stream, bytes) }) else {
                return Ok(None);
            };
            s.blocks.push(p);
            // 0x3c in every byte: 1.06 in f16, 0.0115 in bf16 and f32.
            // SAFETY: `bytes` bytes at `p`, allocated in this stream's order.
            unsafe { result::memset_d8_async(p, 0x3c, bytes, stream) }
                .map_err(|e| Error::Backend(format!("cuda: filling GEMM tuning scratch: {e:?}")))?;
        }
        (s.a, s.b, s.c, s.bias, s.workspace) =
            (s.blocks[0], s.blocks[1], s.blocks[2], s.blocks[3], s.blocks[4]);
        Ok(Some(s))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for &p in &self.blocks {
            // SAFETY: allocated in `new` on this stream, whose later work
            // (the timing) the free is ordered after.
            let _ = unsafe { result::free_async(p, self.stream) };
        }
        // SAFETY: a live stream; the compile returns with it drained.
        let _ = unsafe { result::stream::synchronize(self.stream) };
    }
}

/// A CUDA event that records time (the device's other events do not).
struct TimingEvent(sys::CUevent);

impl TimingEvent {
    fn new() -> Result<TimingEvent> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(TimingEvent)
            .map_err(|e| Error::Backend(format!("cuda: creating a timing event: {e:?}")))
    }

    fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: a live event and stream of the bound context.
        unsafe { result::event::record(self.0, stream) }
            .map_err(|e| Error::Backend(format!("cuda: recording a timing event: {e:?}")))
    }

    /// Milliseconds from `start` to this event, once this one completed.
    fn elapsed_since(&self, start: &TimingEvent) -> Result<f32> {
        // SAFETY: both events were recorded on the same stream.
        unsafe {
            result::event::synchronize(self.0)
                .and_then(|_| result::event::elapsed(start.0, self.0))
                .map_err(|e| Error::Backend(format!("cuda: timing: {e:?}")))
        }
    }
}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        // SAFETY: created in `new`; the driver defers destruction past
        // pending records.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::fastest;

    #[test]
    fn the_guess_stays_unless_clearly_beaten() {
        assert_eq!(fastest(&[Some(1.0), Some(0.98), Some(0.99)]), 0);
        assert_eq!(fastest(&[Some(1.0), Some(0.96), Some(0.90)]), 2);
        assert_eq!(fastest(&[Some(1.0)]), 0);
    }

    #[test]
    fn failed_candidates_are_never_chosen() {
        assert_eq!(fastest(&[Some(1.0), None, Some(0.5)]), 2);
        assert_eq!(fastest(&[None, Some(2.0), Some(1.5)]), 2);
        assert_eq!(fastest(&[None, None]), 0);
        assert_eq!(fastest(&[]), 0);
    }
}
