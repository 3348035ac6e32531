//! The runtime: non-blocking runs, futures, and captured steps, on the CPU,
//! the CUDA emulator (feature `cuda-emulator`) and a GPU when there is one
//! (`KILN_REQUIRE_CUDA=1`: a missing GPU fails).

mod capture;
mod capture_fixes;
mod capture_props;
mod copies;
mod failures;
mod futures;
mod in_place_steps;
mod nonblocking;
mod warm_up;

use kiln::prelude::*;
#[path = "../support/splitmix.rs"]
mod splitmix;

/// A device to test: its name and how to make a fresh context on it.
pub type Device = (&'static str, fn() -> Context);

/// The contexts to test.
pub fn devices() -> Vec<Device> {
    let mut out: Vec<Device> = vec![("cpu", Context::cpu)];
    #[cfg(feature = "cuda-emulator")]
    out.push(("cuda-emulated", Context::cuda_emulated));
    match Context::cuda(0) {
        Ok(_) => out.push(("cuda", || Context::cuda(0).unwrap_or_else(|e| panic!("CUDA went away: {e}")))),
        Err(e) => {
            if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
            }
        }
    }
    out
}

/// Values of `n` elements from a small hash of `seed`, in [-1, 1), never
/// all zero.
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut h =
                (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
            h ^= h >> 29;
            h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h ^= h >> 32;
            (h % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Asserts `got` is within `tol` of `want` (relative to max(|want|, 1)).
pub fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((*g as f64 - w).abs() <= tol * w.abs().max(1.0), "{what}[{i}]: {g} vs {w}");
    }
}

/// The f32 tolerance of a device: bitwise on the CPU, a few ulps of
/// reassociated sums on CUDA.
pub fn tol(device: &str) -> f64 {
    if device == "cpu" {
        0.0
    } else {
        1e-5
    }
}
