//! Several devices (`kiln::dist`): collectives across the ranks of a
//! process group, data-parallel training, and device errors. The CPU
//! transport runs here in CI (ranks are CPU contexts on threads); the same
//! tests run on the CUDA emulator with `--features cuda-emulator`, and
//! `gpu.rs` runs NCCL on real devices (one GPU: a 1-rank group; two or
//! more: the real thing). `procs.rs` runs ranks as processes on
//! localhost (`gpu_procs.rs`: one per GPU, with `KILN_REQUIRE_GPUS=2`).
//! `scatter_gather.rs` and `zero.rs` cover reduce-scatter, all-gather and
//! ZeRO-1's sharded optimizer (`gpu_zero.rs` on two GPUs).

mod collectives;
mod data_parallel;
mod effects;
mod errors;
mod gpu;
mod gpu_procs;
mod gpu_zero;
mod joining;
pub mod procs;
mod scatter_gather;
#[path = "../support/splitmix.rs"]
mod splitmix;
mod zero;

use kiln::prelude::*;

pub use data_parallel::{build as data_parallel_build, loss as data_parallel_loss};

/// Runs `f(rank, ctx)` for every rank on a thread of its own and returns
/// the results in rank order (a rank's collective waits for the others).
pub fn on_ranks<T: Send>(ranks: &[Context], f: impl Fn(usize, &Context) -> T + Sync) -> Vec<T> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// Deterministic pseudo-random values in [-1, 1) (never all zeros).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
