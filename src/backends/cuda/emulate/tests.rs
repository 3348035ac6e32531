//! The emulator's runtime (`kernels/emulate.h`) on hand-written kernels:
//! a block's fibers meet at `__syncthreads` and exchange through warp
//! shuffles as a GPU's threads do, over many blocks and block sizes, and
//! a barrier some thread skips fails the launch instead of hanging.

use super::{compile, source, LaunchFn, LAUNCH};
use std::ffi::c_void;

const BLOCK_SUM: &str = r#"
// Each block sums its slice of x: shuffles within each warp, then one
// thread adds the warps' partial sums from shared memory.
__global__ void block_sum(const float* x, float* out) {
  __shared__ float part[32];
  unsigned t = threadIdx.x;
  float v = x[blockIdx.x * blockDim.x + t];
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  if (t % 32 == 0) part[t / 32] = v;
  __syncthreads();
  if (t == 0) {
    float s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += part[w];
    out[blockIdx.x] = s;
  }
}
"#;

const REVERSE: &str = r#"
// Reverses each block's slice through shared memory: every thread reads
// another thread's write, so the barrier must hold all of them.
__global__ void reverse(const float* x, float* out) {
  __shared__ float tile[1024];
  unsigned t = threadIdx.x, n = blockDim.x;
  tile[t] = x[blockIdx.x * n + t];
  __syncthreads();
  out[blockIdx.x * n + t] = tile[n - 1 - t];
}
"#;

const SKIPS_BARRIER: &str = r#"
// Thread 3 returns before the barrier the others wait at: a GPU hangs.
__global__ void skips_barrier(float* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
"#;

fn library() -> libloading::Library {
    let kernels = [
        ("block_sum", BLOCK_SUM.to_string()),
        ("reverse", REVERSE.to_string()),
        ("skips_barrier", SKIPS_BARRIER.to_string()),
    ];
    compile(&source("", &kernels)).expect("the emulator's test kernels compile")
}

/// Launches kernel `k` of `lib` on `grid` blocks of `block` threads.
fn launch(lib: &libloading::Library, k: i32, grid: u32, block: u32, args: &[*mut c_void]) -> i32 {
    let mut args = args.to_vec();
    let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: `kiln_emu_launch` has this signature (written by `source`);
    // the callers size every buffer for the grid they launch.
    unsafe {
        let f: libloading::Symbol<LaunchFn> = lib.get(b"kiln_emu_launch").expect("the launcher symbol");
        f(k, grid, block, args.as_mut_ptr())
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32).map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect()
}

#[test]
fn barriers_and_shuffles_hold_every_thread_of_every_block() {
    let lib = library();
    for (grid, block) in [(1u32, 32u32), (7, 64), (33, 256), (3, 1024)] {
        let n = (grid * block) as usize;
        let x = values(n, grid * 31 + block);
        let mut sums = vec![f32::NAN; grid as usize];
        let rc = launch(&lib, 0, grid, block, &[x.as_ptr() as *mut c_void, sums.as_mut_ptr() as *mut c_void]);
        assert_eq!(rc, 0, "block_sum on {grid}x{block}");
        for (b, got) in sums.iter().enumerate() {
            let want: f64 = x[b * block as usize..(b + 1) * block as usize].iter().map(|&v| v as f64).sum();
            assert!(
                (*got as f64 - want).abs() <= 1e-4 * block as f64,
                "block {b} of {grid}x{block}: {got} vs {want}"
            );
        }
        let mut rev = vec![f32::NAN; n];
        let rc = launch(&lib, 1, grid, block, &[x.as_ptr() as *mut c_void, rev.as_mut_ptr() as *mut c_void]);
        assert_eq!(rc, 0, "reverse on {grid}x{block}");
        for b in 0..grid as usize {
            let s = b * block as usize;
            for t in 0..block as usize {
                assert_eq!(
                    rev[s + t],
                    x[s + block as usize - 1 - t],
                    "block {b} thread {t} of {grid}x{block}"
                );
            }
        }
    }
}

#[test]
fn a_barrier_a_thread_skips_fails_the_launch_and_the_next_one_runs() {
    let lib = library();
    let mut out = vec![0f32; 64];
    assert_eq!(
        launch(&lib, 2, 2, 64, &[out.as_mut_ptr() as *mut c_void]),
        4,
        "a deadlocked block is status 4"
    );
    // The abandoned fibers leave nothing behind: the next launch is whole.
    let x = values(128, 9);
    let mut sums = vec![f32::NAN; 2];
    assert_eq!(launch(&lib, 0, 2, 64, &[x.as_ptr() as *mut c_void, sums.as_mut_ptr() as *mut c_void]), 0);
    let want: f64 = x[..64].iter().map(|&v| v as f64).sum();
    assert!((sums[0] as f64 - want).abs() < 1e-3, "{} vs {want}", sums[0]);
    assert_eq!(launch(&lib, 0, 1, 0, &[x.as_ptr() as *mut c_void, sums.as_mut_ptr() as *mut c_void]), 1);
    assert_eq!(launch(&lib, 0, 1, 2048, &[x.as_ptr() as *mut c_void, sums.as_mut_ptr() as *mut c_void]), 1);
}
