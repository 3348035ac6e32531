//! TMA tensor maps, encoded at launch.
//!
//! A kernel that loads its tiles with the Tensor Memory Accelerator
//! (`cp.async.bulk.tensor`, sm_90) takes a 128-byte *tensor map* per
//! operand by value (`const __grid_constant__`): the operand's address,
//! extents, row stride, box and swizzle, in an opaque format only the
//! driver writes (`cuTensorMapEncodeTiled`). The address is a launch's
//! binding, so lowering records what the map is ([`TensorMap`]) and the
//! launch encodes it from the bound pointer: a host call of about a
//! microsecond, made once per launch, and baked into a captured graph like
//! every other parameter.

use crate::backends::cuda::codegen::{Kernel, TensorMap};
use crate::ir::DType;
use cudarc::driver::sys;
use cudarc::driver::DeviceRepr;

/// An encoded map, as the kernel's parameter holds it (128 bytes, aligned
/// to 64 as the driver requires).
#[repr(transparent)]
pub(crate) struct Encoded(sys::CUtensorMap);

// SAFETY: a plain 128-byte value the kernel declares as its parameter
// (`KILN_TENSOR_MAP` in the generated source, the same size and alignment).
unsafe impl DeviceRepr for Encoded {}

/// `map` over the tensor at device address `at`.
pub(crate) fn encode(map: &TensorMap, at: u64) -> Result<Encoded, String> {
    let dtype = match map.dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        other => return Err(format!("no tensor map for {other} elements")),
    };
    let size = map.dtype.size() as u64;
    if at % 16 != 0 || (map.stride * size) % 16 != 0 || map.box_cols as u64 * size > 128 {
        return Err(format!(
            "{map} at {at:#x}: TMA needs 16-byte aligned rows and boxes of 128 bytes at most"
        ));
    }
    let dims = [map.cols, map.rows];
    let strides = [map.stride * size];
    let boxes = [map.box_cols, map.box_rows];
    let steps = [1u32, 1];
    let mut out = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer is to a live array of the rank's length (the
    // strides one shorter), and `out` is a writable map.
    let rc = unsafe {
        sys::cuTensorMapEncodeTiled(
            out.as_mut_ptr(),
            dtype,
            2,
            at as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("encoding {map} at {at:#x}: {rc:?}"));
    }
    // SAFETY: the driver wrote the whole map.
    Ok(Encoded(unsafe { out.assume_init() }))
}

/// Every map of kernel `k`, from its launch's pointer arguments `ptrs`.
pub(crate) fn encode_all(k: &Kernel, ptrs: &[u64]) -> Result<Vec<Encoded>, String> {
    k.maps
        .iter()
        .map(|m| {
            let at = ptrs.get(m.arg).ok_or_else(|| format!("{}: {m} names no argument", k.name))?;
            encode(m, *at)
        })
        .collect()
}
