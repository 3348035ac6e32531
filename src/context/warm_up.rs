//! Cold start: compiling ahead of the first read, and saying how long
//! compiling took.
//!
//! A first read pays for the plan's compile: the passes, then on CUDA the
//! kernels (NVRTC, one program per plan, or the disk cache; see
//! `backends/cuda/nvrtc.rs`). A server or a training script can pay that
//! at start-up instead: [`Context::warm_up`] compiles what a read of the
//! given tensors would run, without running it, so the read that follows
//! finds the plan cached. It can run on another thread while the program
//! loads its data (a `Context` is `Send` and `Sync`):
//!
//! ```
//! # use kiln::prelude::*;
//! # fn main() -> Result<()> {
//! let ctx = Context::cpu();
//! let x = ctx.randn([64, 32]);
//! let y = (x.matmul(&x.transpose(0, 1)) * 0.5).tanh();
//! ctx.warm_up(&[&y])?; // compiles, runs nothing
//! let compiled = ctx.stats().compiles;
//! y.to_vec::<f32>()?; // the plan is cached: no compile here
//! assert_eq!(ctx.stats().compiles, compiled);
//! println!("the compile took {:?}", ctx.stats().last_compile);
//! # Ok(())
//! # }
//! ```
//!
//! [`Stats::last_compile`](super::Stats::last_compile) and
//! [`Stats::compile_time`](super::Stats::compile_time) say where a slow
//! first call went: the passes, or the backend (lowering and kernels).

use super::realize::with_pending_targets;
use super::Context;
use crate::{Location, Result, Tensor};
use std::time::Duration;

/// How long one compile took, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileTime {
    /// Extracting and optimizing the graph: the passes.
    pub optimize: Duration,
    /// The backend: lowering the plan, and on CUDA compiling (or loading
    /// from the disk cache) its kernels.
    pub backend: Duration,
}

impl CompileTime {
    /// Both phases together.
    pub fn total(&self) -> Duration {
        self.optimize + self.backend
    }
}

/// The compile times a context keeps.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CompileTimes {
    pub last: Option<CompileTime>,
    pub total: Duration,
}

impl CompileTimes {
    pub fn note(&mut self, optimize: Duration, backend: Duration) {
        let t = CompileTime { optimize, backend };
        self.total += t.total();
        self.last = Some(t);
    }
}

impl Context {
    /// Compiles the plan a read of `tensors` would run (with the pending
    /// assignments and gradients a read runs too), without running it: the
    /// next read of the same graph finds it cached. Already realized
    /// tensors need no plan. A failed tensor's error is returned.
    #[track_caller]
    pub fn warm_up(&self, tensors: &[&Tensor]) -> Result<()> {
        let location = Location::caller();
        let targets = tensors.iter().map(|t| t.node_in(self, location)).collect::<Result<Vec<_>>>()?;
        let _span = tracing::debug_span!("warm_up", tensors = tensors.len()).entered();
        let mut state = self.state();
        let targets = with_pending_targets(&state, &targets);
        self.prepare(&mut state, &targets, &|_| false).map(|_| ())
    }
}
