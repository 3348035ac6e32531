//! `kiln::typed`: typed ops against the untyped ones, typed modules
//! (building, training with the optimizers, accumulation, EMA,
//! checkpoints shared with untyped models), the zero-cost claim (a typed
//! model records the untyped model's graph, text for text), runtime-dim
//! errors as golden messages. The compile errors the types give are
//! `ui/`, which `tests/typed_ui.rs` runs. One binary, so CI links once.

mod digits;
mod errors;
mod modules;
mod ops;
mod zero_cost;

/// Insta settings that write into the repository's `snapshots/`.
pub fn snapshots() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}
