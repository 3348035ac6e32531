//! The CUDA backend: every plan runs on an NVIDIA GPU as generated kernels
//! (NVRTC), cuBLAS GEMMs and cuDNN convolutions and poolings, on the
//! plan's streams and events, in one arena per plan, captured once into a
//! CUDA graph and replayed.
//!
//! The backend is two halves:
//!
//! - **Pure** ([`codegen`], [`program`], [`lower`]): a [`crate::ir::Plan`]
//!   lowers to a [`program::Program`] — the CUDA C of every kernel and the
//!   launches of every step, with symbolic locations. No device is needed,
//!   so this half always compiles and its output is snapshot-tested in CI.
//! - **Device** (feature `cuda`): binds programs to memory and streams and
//!   runs them (`device.rs`, `memory.rs`, `nvrtc.rs`, `blas.rs`, `dnn.rs`,
//!   `exec.rs`, `graph.rs`).

pub mod codegen;
pub mod lower;
pub mod program;

pub use lower::lower;

#[cfg(feature = "cuda-backend")]
mod blas;
#[cfg(feature = "cuda-backend")]
mod device;
#[cfg(feature = "cuda-backend")]
mod dnn;
#[cfg(feature = "cuda-backend")]
mod exec;
#[cfg(feature = "cuda-backend")]
mod graph;
#[cfg(feature = "cuda-backend")]
mod memory;
#[cfg(feature = "cuda-backend")]
mod nvrtc;

#[cfg(feature = "cuda-backend")]
mod backend;

#[cfg(feature = "cuda-backend")]
pub(crate) use backend::cuda;
#[cfg(feature = "cuda-backend")]
pub use backend::{CudaBackend, CudaBuffer};
#[cfg(feature = "cuda-backend")]
pub use nvrtc::cache_dir;
