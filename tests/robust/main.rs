//! Robustness: deep graphs, checked shape arithmetic, fuzz corpus replay,
//! differential tests against an independent f64 evaluator, soak.

mod deep;
mod limits;
mod soak;
