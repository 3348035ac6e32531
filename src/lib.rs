//! kiln: eager-looking tensor code that runs as a compiled graph.
#![warn(missing_docs)]

pub mod backends;
mod error;
pub mod ir;
pub mod passes;

pub use error::{Error, Location, Result};
