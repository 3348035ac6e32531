//! The mistakes `kiln::typed` turns into compile errors: each
//! `tests/typed/ui/fail_*.rs` must fail to build with the message in its
//! `.stderr` next to it (what a user would see, snapshotted), and
//! `tests/typed/ui/pass.rs` must build and run. `TRYBUILD=overwrite cargo
//! test --test typed_ui` re-blesses the messages.
//!
//! The pass case makes trybuild run `cargo build` rather than `cargo
//! check`: a reshape between shapes of different element counts and a
//! `Flatten<N>` of the wrong width are const assertions, which only code
//! generation evaluates. trybuild builds kiln and its dependencies once
//! in `target/tests/trybuild` (with its own dev profile, not this
//! crate's), so the first run pays for that build and later runs take
//! seconds; this binary has one test so it can set the child cargo's
//! environment safely (no other thread reads it).

#[test]
fn shape_mistakes_do_not_compile() {
    // No debug info in trybuild's builds: a third of the cold build time
    // and of its 3 GB on disk, and the messages do not need it.
    std::env::set_var("CARGO_PROFILE_DEV_DEBUG", "false");
    let t = trybuild::TestCases::new();
    t.pass("tests/typed/ui/pass.rs");
    t.compile_fail("tests/typed/ui/fail_*.rs");
}
