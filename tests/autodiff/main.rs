//! Variables, workspaces and scopes, and reverse-mode autodiff: every
//! gradient rule against finite differences in f64 (one table), every
//! scope and workspace behaviour, every misuse as a golden message,
//! checkpoints, and a 1,000-step training loop. One binary, so CI links
//! once.

mod checkpoint;
mod errors;
mod gradcheck;
mod scopes;
#[path = "../support/splitmix.rs"]
mod splitmix;
mod train;
mod variables;

/// Insta settings that write into the repository's `snapshots/`.
pub fn snapshots() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}
