//! Every fusion pass case (`tests/passes/fusion/*.kir`) lowered to
//! Cranelift IR by the CPU backend's code generation, as
//! `tests/cuda_codegen.rs` lowers them to CUDA: one snapshot a case, and
//! each generated kernel run against the interpreter, bit for bit.

use super::codegen::{inputs, run, same_bits};
use crate::backends::cpu::codegen::{self, Codegen};
use crate::backends::cpu::fused::FusedKernel;
use crate::ir::text::parse_test_file;
use crate::ir::*;
use crate::passes::{run_single, PassOptions};
use std::path::Path;

/// What codegen makes of one fusion pass case: the case planned as the
/// pipeline's last passes plan it (as `tests/cuda_codegen.rs` lowers the
/// same cases to CUDA), then for each fused node its kind, the path its
/// kernel takes with every body generated that can be (`Codegen::All`;
/// a plan's default leaves bodies with `exp` interpreted) and the
/// Cranelift IR made for its first run on dense random inputs. Each node
/// also runs interpreted on the same inputs, and the two agree bit for
/// bit (any NaN matching any NaN, as `codegen.rs`'s `agree_as` asks).
fn cranelift_text(path: &Path) -> String {
    let what = path.display();
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{what}: {e}"));
    let case = parse_test_file(&src).unwrap_or_else(|e| panic!("{what}: {e}"));
    let options = PassOptions::from_settings(&case.settings).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut g = case.graph;
    for pass in ["fusion", "assign", "multi-output", "schedule", "horizontal", "streams", "memory"] {
        g = run_single(pass, g, options).unwrap_or_else(|e| panic!("{what}: {pass}: {e}"));
    }
    let mut out = String::new();
    for line in case.comment.lines() {
        out.push_str(&format!(";; {line}\n").replace(";; \n", ";;\n"));
    }
    for id in g.topo_order() {
        let n = g.node(id);
        let Op::Fused(body) = &n.op else { continue };
        let generated =
            FusedKernel::compile(body, id, Codegen::All).unwrap_or_else(|e| panic!("{what}: {e}"));
        let interpreted =
            FusedKernel::compile(body, id, Codegen::Off).unwrap_or_else(|e| panic!("{what}: {e}"));
        let bufs = inputs(body, 11);
        let got = run(&generated, body.graph(), body, &bufs);
        let want = run(&interpreted, body.graph(), body, &bufs);
        same_bits(&got, &want, &format!("{what}: {id}"));
        let kind = match body.kind() {
            FusedKind::Elementwise => "elementwise",
            FusedKind::Reduction { .. } => "reduction",
            FusedKind::MatMul { .. } => "matmul",
        };
        let segments = generated.segment_irs();
        let path = if generated.is_generated() {
            "generated whole".to_string()
        } else if !segments.is_empty() {
            format!("{} generated segment(s) between interpreted steps", segments.len())
        } else if let Some(row) = generated.row_kernel_name() {
            format!("row kernel `{row}`")
        } else {
            "interpreted".to_string()
        };
        out.push_str(&format!("\n{id}: fused {kind} -> {}{}: {path}\n", n.dtype, n.shape));
        let irs = generated.generated_ir().into_iter().chain(segments.into_iter().flatten());
        for ir in irs {
            out.push_str(&ir.unwrap_or_else(|e| panic!("{what}: {id}: {e}")).to_string());
        }
    }
    out
}

/// Every fusion pass case's generated code (see [`cranelift_text`]): a
/// change that claims no codegen change shows an empty diff here.
#[test]
fn fusion_cases_lower_to_cranelift() {
    if !codegen::available() {
        return;
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        insta::glob!("../../../../tests/passes/fusion", "*.kir", |path| {
            insta::assert_snapshot!(cranelift_text(path));
        });
    });
}
