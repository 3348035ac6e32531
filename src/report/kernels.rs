//! What each step of a plan runs, for the report's kernel section: the
//! generated CUDA C of every kernel when the plan is lowered for CUDA
//! (lowering is pure, so this needs no GPU), or on the CPU the fused body
//! that the backend runs as one blocked loop (the CPU generates no
//! source).

use crate::ir::text::numbering;
use crate::ir::{Op, Plan};
use crate::Result;

/// Which backend's kernels to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelTarget {
    /// The CPU backend: fused bodies, as text IR.
    Cpu,
    /// The CUDA backend: the generated source, lowered with or without TF32.
    Cuda {
        /// Whether matmuls may use TF32 (changes library calls, not kernels).
        tf32: bool,
        /// Whether the device is an sm_90 part, whose plans take the
        /// `wgmma` kernels (see `backends::cuda::Target`).
        hopper: bool,
        /// The device's multiprocessors (0: unknown), which size the
        /// persistent kernels' grids.
        sms: usize,
    },
}

/// One kernel of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// The printed numbers of the nodes that launch it (a kernel two nodes
    /// share is listed once).
    pub nodes: Vec<usize>,
    /// Its name (the CUDA entry point, or `fused_<n>` on the CPU).
    pub name: String,
    /// `cuda`, `library` (cuBLAS/cuDNN calls) or `kir` (a CPU fused body).
    pub language: &'static str,
    /// The source text.
    pub source: String,
}

/// The kernels of `plan` for `target`.
pub fn kernels(plan: &Plan, target: KernelTarget) -> Result<Vec<KernelSource>> {
    let (_, number) = numbering(&plan.graph);
    let num = |id| number.get(&id).copied().unwrap_or(usize::MAX);
    match target {
        KernelTarget::Cpu => Ok(plan
            .order
            .iter()
            .filter_map(|&id| match &plan.graph.node(id).op {
                Op::Fused(body) => Some(KernelSource {
                    nodes: vec![num(id)],
                    name: format!("fused_{} ({})", num(id), body.kind().name()),
                    language: "kir",
                    source: crate::ir::text::print(body.graph()),
                }),
                _ => None,
            })
            .collect()),
        KernelTarget::Cuda { tf32, hopper, sms } => {
            let program = {
                use crate::backends::cuda::Target;
                let wgmma_gemm = hopper && Target::wgmma_gemm_wanted();
                crate::backends::cuda::lower_for(plan, Target { tf32, hopper, wgmma_gemm, sms })?
            };
            let mut out: Vec<KernelSource> = program
                .kernels
                .iter()
                .map(|k| KernelSource {
                    nodes: Vec::new(),
                    name: k.name.clone(),
                    language: "cuda",
                    source: k.source.clone(),
                })
                .collect();
            let mut library = Vec::new();
            for step in &program.steps {
                for l in &step.launches {
                    use crate::backends::cuda::program::Launch;
                    match l {
                        Launch::Kernel { kernel, .. } => {
                            if let Some(k) = out.get_mut(*kernel) {
                                if !k.nodes.contains(&num(step.node)) {
                                    k.nodes.push(num(step.node));
                                }
                            }
                        }
                        other => library.push(KernelSource {
                            nodes: vec![num(step.node)],
                            name: format!("{} (library)", step.op),
                            language: "library",
                            source: format!("{other:#?}"),
                        }),
                    }
                }
            }
            out.extend(library);
            Ok(out)
        }
    }
}
