//! `kiln::nn`, `kiln::optim` and `kiln::data`: every module, loss and
//! optimizer against f64 math written here (PyTorch's formulas), EMA,
//! gradient accumulation, checkpoints, the data adaptors, and every
//! misuse as a golden message. One binary, so CI links once.

#[cfg(feature = "tokenizers")]
mod bert;
mod checkpoint;
mod data;
mod errors;
mod generate;
mod gpt2;
mod gpt2_training;
mod gpt2_training_reference;
mod kv_cache;
mod losses;
mod modules;
mod multi_tensor;
mod optim;
#[path = "../support/splitmix.rs"]
mod splitmix;

use kiln::prelude::*;

/// A folder for the files tests write: cargo's temporary folder for this
/// target when it exists (where the binary was built), else the system's
/// (a machine the binary was carried to, such as the GPU machine).
pub fn scratch_dir() -> std::path::PathBuf {
    let built = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    if built.is_dir() {
        built.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Insta settings that write into the repository's `snapshots/`.
pub fn snapshots() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}

/// A tensor's values as f64 (f32 or f64 tensors).
pub fn host(t: &Tensor) -> Vec<f64> {
    match t.dtype() {
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F32 => t.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
        other => panic!("host() of {other}"),
    }
}

/// Asserts `got` is within `atol + rtol·|want|` of `want`, elementwise.
#[track_caller]
pub fn close(got: &[f64], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= atol + rtol * w.abs(),
            "element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// f32 tolerance for values computed through a few ops.
pub const F32_TOL: (f64, f64) = (1e-5, 1e-5);
