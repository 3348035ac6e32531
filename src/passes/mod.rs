//! TEMPORARY (untracked) stand-in until the passes branch merges.
use crate::ir::Graph;
use crate::Result;
/// tmp
#[derive(Clone, Debug)]
pub struct PipelineConfig;
impl PipelineConfig {
    /// tmp
    pub fn from_env() -> Result<PipelineConfig> {
        Ok(PipelineConfig)
    }
}
/// tmp
pub fn optimize(graph: Graph, _c: &PipelineConfig) -> Result<Graph> {
    Ok(graph)
}
