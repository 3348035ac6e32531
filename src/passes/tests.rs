//! The registry and the pipeline's own contracts (each pass's behaviour
//! is in its `.kir` cases and snapshots).

use super::run::run_pass;
use super::*;
use crate::ir;

#[test]
fn registry_names_are_unique_kebab_case() {
    let names = pass_names();
    for (i, n) in names.iter().enumerate() {
        assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '-'), "{n}");
        assert!(!names[..i].contains(n), "{n} twice");
    }
    for step in PIPELINE {
        assert!(names.contains(&step.name()), "{} is not registered", step.name());
    }
    // Autodiff is registered (for its `.kir` cases) but runs on request.
    assert!(!PIPELINE.iter().any(|p| p.name() == "autodiff"));
    assert_eq!(
        names,
        [
            "autocast",
            "attention-grad",
            "view-fold",
            "constant-fold",
            "cse",
            "simplify",
            "narrow",
            "attention-layout",
            "merge-matmuls",
            "dce",
            "weight-prologue",
            "remat",
            "fusion",
            "assign",
            "multi-output",
            "schedule",
            "horizontal",
            "streams",
            "memory",
            "autodiff"
        ]
    );
}

#[test]
fn toggles() {
    let c = PipelineConfig::new(Some(" -cse, -dce ,+dce"), None).unwrap();
    assert!(!c.is_enabled("cse"));
    assert!(c.is_enabled("dce"));
    assert!(c.is_enabled("view-fold"));
    assert_eq!(PipelineConfig::new(Some(""), None).unwrap(), PipelineConfig::default());
    assert!(matches!(PipelineConfig::new(Some("cse"), None), Err(Error::Config(_))));
}

#[test]
fn fnv_is_stable() {
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
}

/// A pass that breaks the graph: the driver must name it.
struct Breaker;
impl Pass for Breaker {
    fn name(&self) -> &'static str {
        "breaker"
    }
    fn run(&self, graph: &mut Graph, _cx: &mut PassCtx) -> Result<Changed> {
        // Point the output at a node that is then removed.
        let out = graph.outputs()[0];
        graph.remove(out);
        graph.set_outputs(vec![out]);
        Ok(Changed::Yes)
    }
}

#[test]
fn verification_failure_names_the_pass() {
    let mut g = ir::text::parse("%x: f32[2] = input 0\n%y: f32[2] = exp %x\nreturn %y\n").unwrap();
    let err =
        run_pass(&Breaker, &mut g, &mut PassCtx::default(), true, &effects::Recorded::default()).unwrap_err();
    assert!(matches!(err, Error::Verify(_)));
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("verify-after-broken-pass", err.to_string()));
}

#[test]
fn invalid_input_is_an_error_not_a_panic() {
    let mut g = Graph::new();
    let x = g
        .add(ir::Op::Input(0), &[], Some((ir::Shape::new([2]), ir::DType::F32)), ir::RegionId::ROOT)
        .unwrap();
    g.remove(x);
    g.set_outputs(vec![x]);
    let err = optimize(g.clone(), &PipelineConfig::default()).unwrap_err();
    assert_eq!(err, Error::Verify("pipeline input: output 0 is %0, which is not a node of the graph".into()));
    assert!(matches!(run_single("dce", g, PassOptions::default()), Err(Error::Verify(_))));
}

#[test]
fn from_env_reads_kiln_passes_and_kiln_dump() {
    // The only test that touches these variables.
    std::env::set_var("KILN_PASSES", "-bogus");
    let err = PipelineConfig::from_env().unwrap_err();
    std::env::set_var("KILN_PASSES", "-dce");
    std::env::set_var("KILN_DUMP", "/tmp/kiln-dumps");
    let config = PipelineConfig::from_env();
    std::env::remove_var("KILN_PASSES");
    std::env::remove_var("KILN_DUMP");
    assert_eq!(err, unknown("bogus"));
    let config = config.unwrap();
    assert!(!config.is_enabled("dce") && config.is_enabled("cse"));
    assert_eq!(config.dump_dir(), Some(Path::new("/tmp/kiln-dumps")));
}

#[test]
fn changed_combines() {
    assert_eq!(Changed::No | Changed::Yes, Changed::Yes);
    assert_eq!(Changed::from(false), Changed::No);
}
