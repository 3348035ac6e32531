//! Pass snapshot tests: every `tests/passes/<pass>/*.kir` case is run
//! through its pass; the snapshot in `snapshots/` holds the graph before,
//! after and the unified diff (what a reviewer reads). Re-bless with
//! `cargo insta review`. (The CPU value check of before against after comes
//! with the `cpu` branch.)

use kiln::ir::text::{parse_test_file, print};
use kiln::ir::{verify, Graph};
use kiln::passes::{optimize, pass_names, run_single, PipelineConfig};
use std::path::Path;

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s
}

/// One test per pass; the function name is the snapshot name prefix.
macro_rules! pass_test {
    ($fn_name:ident, $pass:literal) => {
        #[test]
        fn $fn_name() {
            assert!(pass_names().contains(&$pass), "{} is not a registered pass", $pass);
            settings().bind(|| {
                insta::glob!(concat!("passes/", $pass), "*.kir", |path| {
                    insta::assert_snapshot!(check_case($pass, path));
                });
            });
        }
    };
}

pass_test!(view_fold, "view-fold");
pass_test!(constant_fold, "constant-fold");
pass_test!(cse, "cse");
pass_test!(dce, "dce");

/// Runs one case: parse, run the pass, compare on the CPU, and return the
/// snapshot text.
fn check_case(pass: &str, path: &Path) -> String {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let case = parse_test_file(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(case.pass, pass, "{}: the header names another pass than its directory", path.display());
    verify(&case.graph).unwrap_or_else(|e| panic!("{}: input does not verify: {e}", path.display()));
    let before = print(&case.graph);
    let after_graph =
        run_single(pass, case.graph.clone()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = print(&after_graph);

    let diff = similar::TextDiff::from_lines(&before, &after);
    let diff = if before == after {
        "(no change)\n".to_string()
    } else {
        diff.unified_diff().context_radius(3).header("before", "after").to_string()
    };
    let mut out = String::new();
    for line in case.comment.lines() {
        out.push_str(&format!(";; {line}\n").replace(";; \n", ";;\n"));
    }
    out.push_str(&format!(
        ";; nodes (dead included): {} -> {}\n;; before\n{before};; after\n{after};; diff\n{diff}",
        case.graph.len(),
        after_graph.len()
    ));
    out
}

#[test]
fn unknown_pass_in_config_lists_the_valid_names() {
    let err = PipelineConfig::new(Some("-cse,-bogus"), None).unwrap_err();
    settings().bind(|| insta::assert_snapshot!("config-unknown-pass", err.to_string()));
    let err = PipelineConfig::new(Some("cse"), None).unwrap_err();
    settings().bind(|| insta::assert_snapshot!("config-unsigned-toggle", err.to_string()));
    let err = kiln::passes::run_single("bogus", Graph::new()).unwrap_err();
    settings().bind(|| insta::assert_snapshot!("run-single-unknown-pass", err.to_string()));
}

/// The whole pipeline on one graph: it canonicalizes, advances the phase,
/// and writes one dump per step under the input's hash.
#[test]
fn pipeline_dumps_every_step() {
    let src = "%x: f32[2,3] = input 0\n\
               %a: f32[6] = reshape %x\n\
               %b: f32[3,2] = reshape %a\n\
               %k: f32[3,2] = full 2.0\n\
               %one: f32[3,2] = full 1.0\n\
               %k2: f32[3,2] = add %one, %one\n\
               %m1: f32[3,2] = mul %b, %k\n\
               %m2: f32[3,2] = mul %b, %k2\n\
               %dead: f32[3,2] = exp %m1\n\
               %s: f32[3,2] = sub %m1, %m2\n\
               return %s\n";
    let graph = kiln::ir::text::parse(src).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-pass-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = PipelineConfig::new(None, Some(dir.clone())).unwrap();
    let out = optimize(graph, &config).unwrap();
    assert_eq!(out.phase(), kiln::ir::Phase::Canonical);
    let hashes: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(hashes.len(), 1);
    let hash_dir = &hashes[0];
    let name = hash_dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.len() == 16 && name.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    let mut files: Vec<String> = std::fs::read_dir(hash_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["00-input.kir", "01-view-fold.kir", "02-constant-fold.kir", "03-cse.kir", "04-dce.kir"]
    );
    let mut dumps = String::new();
    for f in &files {
        dumps.push_str(&format!("== {f}\n{}", std::fs::read_to_string(hash_dir.join(f)).unwrap()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    settings().bind(|| insta::assert_snapshot!("pipeline-dumps", dumps));

    // A pass switched off writes no dump and does not run.
    let config = PipelineConfig::new(Some("-cse"), None).unwrap();
    let out = optimize(kiln::ir::text::parse(src).unwrap(), &config).unwrap();
    assert_eq!(print(&out).matches("= mul").count(), 2, "cse ran although switched off");
}
