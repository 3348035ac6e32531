//! CPU backend (the cpu helper replaces this file).
use crate::ir::{DType, Shape};
/// A CPU buffer.
#[derive(Clone, Debug)]
pub struct CpuBuffer {
    shape: Shape,
    dtype: DType,
}
impl CpuBuffer {
    /// Shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// Dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}
