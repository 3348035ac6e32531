//! Robustness: nothing a user does panics, aborts or leaks (issue 11):
//! deep graphs, checked sizes and allocation failures, fuzz checks and
//! corpus replay with the fuzzers' regressions, soak and concurrency, and
//! random programs against an independent f64 reference, and many plans
//! interleaved on one context (issue 17).

mod deep;
mod differential;
mod fuzz_checks;
mod fuzz_corpus;
mod fuzz_regressions;
mod interleave;
mod limits;
mod soak;
