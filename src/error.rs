//! The one error type users see.

use std::fmt;
use std::panic::Location as StdLocation;

/// Where in the user's program an op was recorded (from `#[track_caller]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Source file.
    pub file: &'static str,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1.
    pub column: u32,
}

impl Location {
    /// The location of the caller of the `#[track_caller]` function that
    /// calls this.
    #[track_caller]
    pub fn caller() -> Location {
        let l = StdLocation::caller();
        Location { file: l.file(), line: l.line(), column: l.column() }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Everything that can go wrong in kiln. Messages say what was wrong and
/// where; variants let callers match on the kind.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the op (also bad dims, permutations, slices).
    #[error("shape error in {op}: {message}\n  at {location}")]
    Shape {
        /// The op that was recorded.
        op: &'static str,
        /// What was wrong.
        message: String,
        /// Where the op was recorded.
        location: Location,
    },
    /// Dtypes that do not fit the op or each other.
    #[error("dtype error in {op}: {message}\n  at {location}")]
    DType {
        /// The op that was recorded.
        op: &'static str,
        /// What was wrong, with the cast that fixes it.
        message: String,
        /// Where the op was recorded.
        location: Location,
    },
    /// Tensors from different contexts, or a device that cannot be used.
    #[error("device error: {message}\n  at {location}")]
    Device {
        /// What was wrong.
        message: String,
        /// Where it happened.
        location: Location,
    },
    /// Misuse of workspaces, scopes, variables or gradients: leaving a
    /// scope that is not open, bindings that do not match, a variable
    /// re-created with another type, a name used twice, a checkpoint that
    /// does not fit.
    #[error("workspace error in {op}: {message}\n  at {location}")]
    Workspace {
        /// The call that failed (`scope`, `variable`, `load`, ...).
        op: &'static str,
        /// What was wrong.
        message: String,
        /// Where it was called.
        location: Location,
    },
    /// An argument a module, loss, optimizer or data utility cannot take
    /// (a dropout probability of 1.5, a batch size of 0, a negative
    /// learning rate, an optimizer given no parameters).
    #[error("invalid argument to {op}: {message}\n  at {location}")]
    Argument {
        /// The call that was given it (`Dropout::new`, `AdamW::new`, ...).
        op: &'static str,
        /// What was wrong, and the range that is accepted.
        message: String,
        /// Where it was called.
        location: Location,
    },
    /// A value found while running (an index out of range).
    #[error("runtime error: {0}")]
    Runtime(String),
    /// The device could not allocate.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A backend failure.
    #[error("backend error: {0}")]
    Backend(String),
    /// Text IR that does not parse.
    #[error("parse error at line {line}: {message}")]
    Parse {
        /// 1-based line.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// A graph that breaks an IR invariant (a kiln bug if a pass made it).
    #[error("invalid graph: {0}")]
    Verify(String),
    /// Bad configuration (`KILN_PASSES`, `KILN_DUMP`).
    #[error("configuration error: {0}")]
    Config(String),
    /// A file could not be read or written.
    #[error("io error: {0}")]
    Io(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e.to_string())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
