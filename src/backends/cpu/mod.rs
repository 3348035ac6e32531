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
/// tmp
pub struct CpuBackend;
impl CpuBackend {
    /// tmp
    pub fn new() -> Self {
        CpuBackend
    }
}
impl super::Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn upload(&self, _d: crate::ir::HostData, _s: &Shape) -> crate::Result<super::Buffer> {
        todo!()
    }
    fn download(&self, _b: &super::Buffer) -> crate::Result<crate::ir::HostData> {
        todo!()
    }
    fn compile(
        &self,
        _p: std::sync::Arc<crate::ir::Plan>,
    ) -> crate::Result<std::sync::Arc<dyn super::Executable>> {
        todo!()
    }
    fn stats(&self) -> std::sync::Arc<super::DeviceStats> {
        todo!()
    }
}
