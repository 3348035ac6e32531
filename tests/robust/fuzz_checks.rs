//! What the fuzz targets in `fuzz/` check, shared with the corpus replay
//! test (`fuzz_corpus.rs`): the targets include this file with `#[path]`,
//! so a corpus file means the same input, checked the same way, under
//! libFuzzer (nightly, sanitizers) and under `cargo test` (stable).
//!
//! - [`kir_roundtrip`]: bytes as `.kir` text. A graph `parse` accepts must
//!   pass `verify` (the parser's documented promise), and print → parse →
//!   print must give the same text.
//! - [`api`]: bytes decoded by `arbitrary` into a [`Program`] of public-API
//!   calls on `Context::cpu()`, then run. Any call may return an `Err` (or a
//!   failed tensor whose read does); none may panic or abort.
//!
//! Both return normally when the input is fine and panic (the fuzzer's
//! crash) when a promise is broken.

use arbitrary::{Arbitrary, Unstructured};
use kiln::ir::text::{parse, parse_test_file, print};
use kiln::ir::{verify, Graph};

#[macro_use]
#[path = "fuzz_checks/program.rs"]
mod program;
#[path = "fuzz_checks/run.rs"]
mod run;

pub use program::Program;

/// A tensor whose bytes exceed this is not read (it would be allocated):
/// the fuzzer runs under `-rss_limit_mb=4096` next to other builds, and
/// small tensors run thousands of programs a second.
const READ_LIMIT_BYTES: usize = 1 << 21;
/// Matrix products and convolutions above this many multiply-adds are not
/// run, for the same reason.
const WORK_LIMIT: usize = 1 << 24;
/// Longer programs are cut here (a program is recorded, not unrolled, so
/// depth is not what this fuzzer looks for; `tests/robust/deep.rs` is).
const MAX_STEPS: usize = 48;

// ---------------------------------------------------------------- .kir

/// Parses `data` as `.kir` text (and as a pass test file); a graph the
/// parser accepts must verify and print → parse → print identically.
pub fn kir_roundtrip(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(test) = parse_test_file(src) {
        check_graph(&test.graph, src);
    }
    if let Ok(graph) = parse(src) {
        check_graph(&graph, src);
    }
}

/// The round-trip contract for one graph that came from `src` (parsed, or
/// optimized from an api program).
pub fn check_graph(graph: &Graph, src: &str) {
    if let Err(e) = verify(graph) {
        panic!("verify rejects a graph that parse accepted: {e}\n--- input\n{src}");
    }
    let printed = print(graph);
    let again = match parse(&printed) {
        Ok(g) => g,
        Err(e) => panic!("the printed graph does not parse: {e}\n--- input\n{src}\n--- printed\n{printed}"),
    };
    if let Err(e) = verify(&again) {
        panic!("the reparsed graph does not verify: {e}\n--- printed\n{printed}");
    }
    let reprinted = print(&again);
    assert_eq!(printed, reprinted, "print → parse → print differs\n--- input\n{src}");
}

// ---------------------------------------------------------------- api

/// What running one program did: how many reads returned values and how
/// many returned errors (so the replay test can show it exercised kiln).
#[derive(Debug, Default)]
pub struct Outcome {
    /// Reads (and gradient reads) that returned values.
    pub values: usize,
    /// Reads that returned a `kiln::Error`.
    pub errors: usize,
}

/// Decodes `data` into a [`Program`] (as `fuzz_target!` would) and runs it.
pub fn api(data: &[u8]) -> Outcome {
    match Program::arbitrary_take_rest(Unstructured::new(data)) {
        Ok(program) => run_program(&program),
        Err(_) => Outcome::default(),
    }
}

/// Runs `program` on a fresh CPU context; any panic propagates (under
/// libFuzzer, the crash).
pub fn run_program(program: &Program) -> Outcome {
    run::run(program)
}
