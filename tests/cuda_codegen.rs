//! The CUDA backend's generated code, without a GPU: every fusion pass
//! case, every case in `tests/cuda/` (and, fused, `tests/cuda/fused/`), and the quickstart graph are planned
//! (fusion, assign, multi-output, schedule, horizontal, streams, memory) and lowered to a CUDA program whose
//! text (launches, then each kernel's source) is an insta snapshot in
//! `snapshots/`. A change that claims no codegen change shows an empty diff.

use kiln::backends::cuda::{lower, lower_for, Target};
use kiln::ir::text::parse_test_file;
use kiln::ir::{verify, Graph, Plan};
use kiln::passes::{run_single, PassOptions};
use kiln::prelude::*;
use std::path::Path;

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}

/// Plans a case graph as the pipeline's last passes would.
fn plan(graph: Graph, options: PassOptions, fuse: bool) -> Graph {
    let mut g = graph;
    let passes: &[&str] = if fuse {
        &["fusion", "assign", "multi-output", "schedule", "horizontal", "streams", "memory"]
    } else {
        &["assign", "multi-output", "schedule", "horizontal", "streams", "memory"]
    };
    for pass in passes {
        g = run_single(pass, g, options).unwrap_or_else(|e| panic!("{pass}: {e}"));
    }
    g
}

fn program_text(path: &Path, fuse: bool) -> String {
    program_text_for(path, fuse, Target::default())
}

fn program_text_for(path: &Path, fuse: bool, target: Target) -> String {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let case = parse_test_file(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    verify(&case.graph).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let options = PassOptions::from_settings(&case.settings).unwrap_or_else(|e| panic!("{e}"));
    let planned = plan(case.graph, options, fuse);
    let program =
        lower_for(&Plan::new(planned.clone()), target).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = String::new();
    for line in case.comment.lines() {
        out.push_str(&format!(";; {line}\n").replace(";; \n", ";;\n"));
    }
    out.push_str(&kiln::ir::text::print(&planned));
    out.push_str(&program.to_string());
    out
}

#[test]
fn fusion_cases_lower_to_cuda() {
    settings().bind(|| {
        insta::glob!("passes/fusion", "*.kir", |path| {
            insta::assert_snapshot!(program_text(path, true));
        });
    });
}

#[test]
fn op_cases_lower_to_cuda() {
    settings().bind(|| {
        insta::glob!("cuda", "*.kir", |path| {
            insta::assert_snapshot!(program_text(path, false));
        });
    });
}

/// Cases that need fusion but must not run on the CPU (the pass tests
/// compare every case's unfused graph there): `tests/cuda/fused/`.
#[test]
fn fused_op_cases_lower_to_cuda() {
    settings().bind(|| {
        insta::glob!("cuda/fused", "*.kir", |path| {
            insta::assert_snapshot!(program_text(path, true));
        });
    });
}

/// Cases lowered for an sm_90 device (`Target::hopper`): the `wgmma`
/// kernels, which the emulator cannot run (the GPU tests check them).
#[test]
fn hopper_cases_lower_to_cuda() {
    settings().bind(|| {
        insta::glob!("cuda/hopper", "*.kir", |path| {
            insta::assert_snapshot!(program_text_for(
                path,
                false,
                Target { tf32: false, hopper: true, wgmma_gemm: false, sms: 132 }
            ));
        });
    });
}

/// Fused cases lowered for an sm_90 device: matmul bodies whose epilogue
/// cuBLASLt takes none of run on the Hopper GEMM (`codegen/gemm_wgmma.rs`).
#[test]
fn hopper_fused_cases_lower_to_cuda() {
    settings().bind(|| {
        insta::glob!("cuda/hopper/fused", "*.kir", |path| {
            insta::assert_snapshot!(program_text_for(
                path,
                true,
                Target { tf32: false, hopper: true, wgmma_gemm: true, sms: 132 }
            ));
        });
    });
}

#[test]
fn quickstart_lowers_to_cuda() -> kiln::Result<()> {
    let ctx = Context::cpu().with_seed(7);
    let x = ctx.randn([64, 784]);
    let w = ctx.randn([784, 128]) * 0.05;
    let b = ctx.zeros([128]);
    let p = (x.matmul(&w) + &b).relu().softmax(1);
    let graph = ctx.optimized_graph(&[&p])?;
    let program = lower(&Plan::new(graph.clone()), false)?;
    settings().bind(|| {
        insta::assert_snapshot!("cuda-quickstart", format!("{}{program}", kiln::ir::text::print(&graph)));
    });
    Ok(())
}
