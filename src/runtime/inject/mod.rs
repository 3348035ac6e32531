//! Failure injection in the runtime, on the CPU: a backend whose runs stay
//! in flight after `launch` returns and fail while in flight, as a GPU's
//! do, so the paths that only a device reaches (waiting at the in-flight
//! limit, several threads settling one run, futures waiting on the runtime
//! thread) run in CPU CI. The tests are in `tests.rs`; the same scenarios
//! on real devices (and under compute-sanitizer) are in
//! `tests/runtime/failures.rs`.
//!
//! # The fake device
//!
//! [`Delayed`] computes each plan with the CPU backend inside `launch`,
//! then hands back outputs that carry an in-flight [`Completion`], as the
//! CUDA backend's do (`backends/cuda/completion.rs`): its signal fires a
//! fixed delay after the previous run's (one stream: runs finish in launch
//! order, so what a run read has finished before it), and a run that
//! failed on the CPU (a bad gather index) returns zero-filled outputs, as
//! a GPU run that read out of range returns garbage, and a check that
//! fails with the CPU's error once the signal has fired, as the CUDA
//! index-check status does (it takes a millisecond, so threads settling
//! at once overlap). A knob pauses the device, so a test keeps runs
//! in flight as long as it needs.
//!
//! Ownership is the CUDA backend's: outputs and completions are reference
//! counted; nothing here borrows memory of a caller.

mod tests;

use super::completion::{Check, Signal};
use super::waiter::Runtime;
use super::Completion;
use crate::backends::cpu::CpuBackend;
use crate::backends::{Backend, Buffer, DeviceStats, Executable, Launched, RngArgs};
use crate::ir::{DType, HostData, Plan, Shape};
use crate::{Context, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a failed run's check takes (see `launch`).
const CHECK_TIME: Duration = Duration::from_millis(1);

/// The fake device's one stream: when its last run finishes, and whether
/// it is paused.
struct Clock {
    last: Instant,
    paused: bool,
}

/// What a test controls and observes of the fake device.
pub(crate) struct Knobs {
    clock: Mutex<Clock>,
    resumed: Condvar,
    /// How long each run takes after the previous one.
    delay: Duration,
    /// Threads blocked in a signal's `wait` now.
    pub(crate) waiting: AtomicUsize,
}

impl Knobs {
    /// Holds every run in flight until [`Knobs::resume`].
    pub(crate) fn pause(&self) {
        self.clock.lock().unwrap_or_else(|e| e.into_inner()).paused = true;
    }

    /// Lets runs finish again (those past their time finish at once).
    pub(crate) fn resume(&self) {
        self.clock.lock().unwrap_or_else(|e| e.into_inner()).paused = false;
        self.resumed.notify_all();
    }

    /// Blocks until some thread waits on a run of this device (for at
    /// most 10 s).
    pub(crate) fn until_someone_waits(&self) {
        let t0 = Instant::now();
        while self.waiting.load(Ordering::SeqCst) == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The signal of a run launched now.
    fn next(self: &Arc<Self>) -> Fire {
        let mut c = self.clock.lock().unwrap_or_else(|e| e.into_inner());
        c.last = c.last.max(Instant::now()) + self.delay;
        Fire { at: c.last, knobs: self.clone() }
    }
}

/// A run's "done" flag: set at `at`, unless the device is paused.
struct Fire {
    at: Instant,
    knobs: Arc<Knobs>,
}

impl Signal for Fire {
    fn query(&self) -> Result<bool> {
        let c = self.knobs.clock.lock().unwrap_or_else(|e| e.into_inner());
        Ok(!c.paused && Instant::now() >= self.at)
    }

    fn wait(&self) -> Result<()> {
        self.knobs.waiting.fetch_add(1, Ordering::SeqCst);
        let mut c = self.knobs.clock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            if !c.paused && now >= self.at {
                break;
            }
            let left = if c.paused { Duration::from_millis(50) } else { self.at - now };
            c = self.knobs.resumed.wait_timeout(c, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(c);
        self.knobs.waiting.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The CPU backend with runs that stay in flight (see the module docs).
pub(crate) struct Delayed {
    cpu: CpuBackend,
    knobs: Arc<Knobs>,
    runtime: Arc<Runtime>,
}

impl Delayed {
    /// A context on a fake device whose runs take `delay` each, and its
    /// knobs.
    pub(crate) fn context(delay: Duration) -> (Context, Arc<Knobs>) {
        let knobs = Arc::new(Knobs {
            clock: Mutex::new(Clock { last: Instant::now(), paused: false }),
            resumed: Condvar::new(),
            delay,
            waiting: AtomicUsize::new(0),
        });
        let backend =
            Delayed { cpu: CpuBackend::new(), knobs: knobs.clone(), runtime: Runtime::new("inject") };
        (Context::with_backend(Box::new(backend)), knobs)
    }
}

impl Backend for Delayed {
    fn name(&self) -> &'static str {
        "delayed"
    }
    fn reshape_epilogues(&self) -> bool {
        self.cpu.reshape_epilogues()
    }
    fn merge_matmuls(&self) -> bool {
        self.cpu.merge_matmuls()
    }
    fn upload(&self, data: HostData, shape: &Shape) -> Result<Buffer> {
        self.cpu.upload(data, shape)
    }
    fn download(&self, buffer: &Buffer) -> Result<HostData> {
        // The CPU backend waits for the buffer's completion first.
        self.cpu.download(buffer)
    }
    fn compile(&self, plan: Arc<Plan>) -> Result<Arc<dyn Executable>> {
        Ok(Arc::new(DelayedRun {
            inner: self.cpu.compile(plan.clone())?,
            plan,
            cpu: CpuBackend::new(),
            knobs: self.knobs.clone(),
            runtime: self.runtime.clone(),
        }))
    }
    fn stats(&self) -> Arc<DeviceStats> {
        self.cpu.stats()
    }
}

/// A plan on the fake device.
struct DelayedRun {
    inner: Arc<dyn Executable>,
    plan: Arc<Plan>,
    /// Makes the garbage outputs of a failed run.
    cpu: CpuBackend,
    knobs: Arc<Knobs>,
    runtime: Arc<Runtime>,
}

impl DelayedRun {
    /// Zero-filled outputs of the plan's shapes: what a failed run leaves.
    fn garbage(&self) -> Result<Vec<Buffer>> {
        let graph = &self.plan.graph;
        graph
            .outputs()
            .iter()
            .map(|&id| {
                let node = graph.node(id);
                self.cpu.upload(zeros(node.dtype, node.shape.numel()), &node.shape)
            })
            .collect()
    }
}

fn zeros(dtype: DType, n: usize) -> HostData {
    match dtype {
        DType::F16 => HostData::F16(vec![half::f16::ZERO; n]),
        DType::BF16 => HostData::BF16(vec![half::bf16::ZERO; n]),
        DType::F32 => HostData::F32(vec![0.0; n]),
        DType::F64 => HostData::F64(vec![0.0; n]),
        DType::U8 => HostData::U8(vec![0; n]),
        DType::I32 => HostData::I32(vec![0; n]),
        DType::I64 => HostData::I64(vec![0; n]),
        DType::Bool => HostData::Bool(vec![false; n]),
    }
}

impl Executable for DelayedRun {
    fn run(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Vec<Buffer>> {
        let launched = self.launch(inputs, rng)?;
        launched.done.wait()?;
        Ok(launched.outputs)
    }

    fn launch(&self, inputs: &[Buffer], rng: &RngArgs) -> Result<Launched> {
        let read: Vec<Completion> = inputs.iter().map(Buffer::completion).collect();
        let (outputs, check) = match self.inner.run(inputs, rng) {
            Ok(outputs) => (outputs, None),
            Err(e) => {
                let check = move || {
                    // Reading and decoding a status block takes a moment:
                    // threads that settle at once overlap here.
                    std::thread::sleep(CHECK_TIME);
                    Err(e)
                };
                (self.garbage()?, Some(Box::new(check) as Check))
            }
        };
        let done = Completion::in_flight(Box::new(self.knobs.next()), check, read, self.runtime.clone());
        let outputs = outputs
            .into_iter()
            .map(|b| match b {
                Buffer::Cpu(c) => Buffer::Cpu(c.written_by(done.clone())),
                #[allow(unreachable_patterns)]
                other => other,
            })
            .collect();
        Ok(Launched { outputs, done })
    }
}

/// Runs `body` on a thread of its own and fails if it has not finished
/// within `secs` seconds: a hang fails the test instead of CI. (The stuck
/// thread is left behind; the test process goes on.)
pub(crate) fn watchdog<T: Send + 'static>(
    secs: u64,
    what: &str,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let out = body();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        // Finished (or panicked: the channel closed).
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(out) => out,
            Err(panic) => std::panic::resume_unwind(panic),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: still running after {secs} s (a hang)")
        }
    }
}
