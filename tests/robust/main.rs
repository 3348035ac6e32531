//! Robustness: nothing a user does panics, aborts or leaks (issue 11).

mod fuzz_checks;
mod fuzz_corpus;
mod fuzz_regressions;
