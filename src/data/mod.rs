//! Data utilities: a seeded generator, iterator adaptors that shuffle,
//! batch, collate and stack (they work on any iterator, not only on a
//! [`Dataset`]), a small in-memory [`Dataset`], and a CSV reader that
//! also reads gzip-compressed files.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln::data::{Dataset, IteratorExt, Rng};
//!
//! let ctx = Context::cpu();
//! let data = Dataset::new((0..20).map(|i| i as f32).collect(), &[2], (0..10).collect())?;
//! let mut rng = Rng::new(7);
//! let mut seen = 0;
//! for batch in data.iter().shuffled(&mut rng).batch(4).collate().stack(&ctx) {
//!     let (x, y) = batch?;                 // x: f32 [4, 2] (2 for the last), y: i64 [4]
//!     assert_eq!(x.shape()[1], 2);
//!     seen += y.shape()[0];
//! }
//! assert_eq!(seen, 10);
//! # Ok::<(), kiln::Error>(())
//! ```

mod csv;
mod dataset;
mod iter;
mod rng;

pub use csv::{read_csv, Csv};
pub use dataset::Dataset;
pub use iter::{stack, Batch, Collate, IteratorExt, StackIter, Stackable};
pub use rng::Rng;
