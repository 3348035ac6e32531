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

mod bounds;
pub mod codegen;
#[cfg(feature = "cuda-emulator")]
pub mod emulate;
pub mod lower;
pub mod program;
#[cfg(any(feature = "cuda-backend", feature = "cuda-emulator"))]
mod replay;

pub use lower::{lower, lower_for, Target};

#[cfg(feature = "cuda-backend")]
mod blas;
#[cfg(feature = "cuda-backend")]
mod completion;
#[cfg(feature = "cuda-backend")]
mod copy;
#[cfg(feature = "cuda-backend")]
mod device;
#[cfg(feature = "cuda-backend")]
mod dnn;
#[cfg(feature = "cuda-backend")]
mod exec;
#[cfg(feature = "cuda-backend")]
mod gemm_tune;
#[cfg(feature = "cuda-backend")]
mod graph;
#[cfg(feature = "cuda-backend")]
mod group;
#[cfg(feature = "cuda-backend")]
mod lt;
#[cfg(feature = "cuda-backend")]
mod memory;
#[cfg(feature = "cuda-backend")]
pub(crate) mod nccl;
#[cfg(feature = "cuda-backend")]
mod nvrtc;
#[cfg(feature = "cuda-backend")]
mod outputs;
#[cfg(feature = "cuda-backend")]
mod profile;
#[cfg(feature = "cuda-backend")]
mod slots;
#[cfg(feature = "cuda-backend")]
mod tensor_map;

#[cfg(feature = "cuda-backend")]
mod backend;

#[cfg(feature = "cuda-backend")]
pub(crate) use backend::cuda_of;
#[cfg(feature = "cuda-backend")]
pub use backend::{CudaBackend, CudaBuffer};
#[cfg(feature = "cuda-backend")]
pub use nvrtc::cache_dir;

/// Every CUDA device the driver reports, in words (`cuda:0 NVIDIA H100
/// 80GB HBM3 (sm_90)`), without opening a context on any.
#[cfg(feature = "cuda-backend")]
pub(crate) fn device_names() -> std::result::Result<Vec<String>, String> {
    use cudarc::driver::{result, sys};
    device::check_libraries()?;
    std::panic::catch_unwind(|| -> std::result::Result<Vec<String>, String> {
        result::init().map_err(|e| format!("{e:?}"))?;
        let n = result::device::get_count().map_err(|e| format!("{e:?}"))?;
        (0..n)
            .map(|k| {
                let dev = result::device::get(k).map_err(|e| format!("{e:?}"))?;
                let name = result::device::get_name(dev).map_err(|e| format!("{e:?}"))?;
                let attr = |a| unsafe { result::device::get_attribute(dev, a) }.map_err(|e| format!("{e:?}"));
                let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
                let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
                Ok(format!("cuda:{k} {name} (sm_{major}{minor})"))
            })
            .collect()
    })
    .unwrap_or_else(|_| Err("the CUDA driver could not be loaded".into()))
}

/// Free and total bytes of CUDA device `ordinal` as the driver reports
/// them (tests compare them before a context is made and after it is
/// dropped).
#[cfg(feature = "cuda-backend")]
pub fn memory_info(ordinal: usize) -> crate::Result<(usize, usize)> {
    let err = |e: &dyn std::fmt::Debug| crate::Error::Backend(format!("cuda: {e:?}"));
    device::check_libraries().map_err(crate::Error::Backend)?;
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(|e| err(&e))?;
    ctx.bind_to_thread().map_err(|e| err(&e))?;
    cudarc::driver::result::mem_get_info().map_err(|e| err(&e))
}
