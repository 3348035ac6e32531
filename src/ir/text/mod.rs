//! The text IR (`.kir`): how graphs are printed, snapshotted, dumped
//! (`KILN_DUMP`) and written by hand in pass tests.
//!
//! One node per line, numbered densely in the order of
//! [`Graph::compacted`](super::Graph::compacted), then a `return` line:
//!
//! ```text
//! %0: f32[64,784] = input 0
//! %1: f32[784,128] = randn stream=1
//! %2: f32[64,128] = matmul %0, %1 @encoder/layer1
//! %3: f32[64,1] = sum %2 dims=[1] keepdim
//! return %3
//! ```
//!
//! A line is `%name: dtype[dims] = mnemonic operands attrs` and an optional
//! `@region/path` (omitted for the root region). Operands are separated by
//! commas, attributes (`key=value`, `key=[a,b]`, bare flags like `keepdim`,
//! positional values like `input 0` or `full 0.5`) by spaces. Before the
//! first definition, `region <path> autocast=bf16|f16|off` gives a region
//! its own autocast setting (`Context::scope_with_autocast`). A collective
//! carries its sequence number (`all_reduce_sum %x seq=0`, see
//! [`Op::Collective`](super::Op::Collective)); hand-written input may leave
//! it out, and collectives are then numbered in file order. `reshape`,
//! `expand` and `cast` take their target from the declared type. Lines
//! starting with `;;` and blank lines are comments.
//!
//! The printer always numbers `%0, %1, ...`; hand-written input may use any
//! `%[A-Za-z0-9_]+` name, defined once and before use. The parser checks
//! every line against [`infer`](super::infer) and the verifier's source-op
//! rules, so a graph it returns passes [`verify`](super::verify).
//! print → parse → print is byte-identical for every valid graph; nothing
//! printed depends on hash-map order.
//!
//! Limits: region names containing `/`, a line break, or leading/trailing
//! spaces do not survive a round trip (the path is split on `/` and
//! trimmed); regions with no node in the printed graph are not printed.

mod parse;
mod print;

#[cfg(test)]
pub(crate) use parse::parse_unverified;
pub use parse::{parse, parse_test_file, TestFile};
pub(crate) use print::numbering;
pub use print::print;
