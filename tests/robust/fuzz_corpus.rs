//! Replays the fuzz corpus (`fuzz/corpus/<target>/`, kept small with
//! `cargo fuzz cmin`) through the fuzz targets' own checks, on the stable
//! toolchain: a few seconds of what hours of fuzzing found interesting,
//! run by every `cargo test`.

use super::fuzz_checks;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

/// Every file of one target's corpus, sorted by name.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus directory entry").path())
        .collect();
    paths.sort();
    paths.into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("a corpus file"))).collect()
}

/// Runs `check` on every file, naming the file whose check panics.
fn replay(target: &str, min_files: usize, mut check: impl FnMut(&[u8])) -> usize {
    let files = corpus(target);
    assert!(
        files.len() >= min_files,
        "{target}: {} corpus files, expected at least {min_files}",
        files.len()
    );
    for (path, data) in &files {
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| check(data))) {
            panic!("{}: {}", path.display(), panic_text(payload.as_ref()));
        }
    }
    files.len()
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "(no message)".into(),
    }
}

#[test]
fn kir_roundtrip_corpus_replays() {
    let parsed = std::cell::Cell::new(0);
    let files = replay("kir_roundtrip", 50, |data| {
        fuzz_checks::kir_roundtrip(data);
        let text = std::str::from_utf8(data).unwrap_or("");
        parsed.set(parsed.get() + usize::from(kiln::ir::text::parse(text).is_ok()));
    });
    eprintln!("kir_roundtrip: {files} files, {} parsed as graphs", parsed.get());
    // The seeds are the repo's own graphs, and the fuzzer keeps inputs
    // that reach new code, most of them past the parser's first error (and
    // since `parse` verifies the whole graph, planned graphs whose tables
    // contradict them fail too).
    assert!(parsed.get() >= 10, "only {} of {files} corpus files parse", parsed.get());
}

#[test]
fn api_corpus_replays() {
    let (mut values, mut errors) = (0, 0);
    let files = replay("api", 50, |data| {
        let outcome = fuzz_checks::api(data);
        values += outcome.values;
        errors += outcome.errors;
    });
    eprintln!("api: {files} programs, {values} reads returned values, {errors} returned errors");
    assert!(values * 2 >= files, "{files} corpus programs read only {values} values");
    assert!(errors > 0, "no corpus program read an error");
}
