//! Mixed precision (`kiln::autocast`): the autocast pass against the same
//! step written with explicit casts, gradients under autocast against f64
//! finite differences, the f16 loss scaler (skipping a step on an inf,
//! growing after good steps, inside a captured step), the API's errors
//! as golden messages, the same steps on the CPU, the CUDA emulator and a
//! GPU, and digits' MLP and CNN trained in bf16 against f32.
//! One binary, so CI links once.

mod api;
mod devices;
mod digits;
mod explicit;
mod gradcheck;
mod scaler;
#[path = "../support/splitmix.rs"]
mod splitmix;

/// Insta settings that write into the repository's `snapshots/`.
pub fn snapshots() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}
