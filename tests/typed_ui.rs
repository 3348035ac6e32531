//! The mistakes `kiln::typed` turns into compile errors: each
//! `tests/typed/ui/fail_*.rs` must fail to build with the message in its
//! `.stderr` next to it (what a user would see, snapshotted), and
//! `tests/typed/ui/pass.rs` must build and run. `KILN_BLESS=1 cargo test
//! --test typed_ui` re-blesses the messages (read every diff).
//!
//! Each case is compiled by rustc itself against the kiln library this
//! test binary was linked with (`target/<profile>/deps`). trybuild did
//! this job before, but it builds kiln and every dev-dependency again in a
//! target directory of its own: 181 of CI's 900 seconds, cold, for 17
//! files. Here a case costs its own type check and code generation
//! (code generation because a reshape between shapes of different element
//! counts and a `Flatten<N>` of the wrong width are const assertions, which
//! only monomorphization evaluates).
//!
//! The messages are normalized as trybuild normalized them, so a change of
//! kiln's line numbers is not a change of the message: paths are relative
//! to the crate, the standard library's are `$RUST/...`, and a snippet
//! from any file but the case's own loses its line numbers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn shape_mistakes_do_not_compile() {
    let build = Build::find();
    let dir = Path::new(ROOT).join("tests/typed/ui");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    cases.sort();
    assert!(cases.iter().any(|p| p.ends_with("pass.rs")), "no pass.rs in {}", dir.display());
    assert!(cases.len() > 10, "only {} cases in {}", cases.len(), dir.display());
    let out = tempdir();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut failed = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(case) = cases.get(i) else { break };
                        if let Err(e) = check(&build, case, &out) {
                            failed.push(e);
                        }
                    }
                    failed
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a case thread panicked")).collect()
    });
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// Where the compiled kiln and its dependencies are.
struct Build {
    deps: PathBuf,
    kiln: PathBuf,
}

impl Build {
    /// This binary lives in `target/<profile>/deps`, next to the kiln rlib
    /// it was linked with: the newest `libkiln-*.rlib` not newer than this
    /// binary (another feature set's build may sit beside it; the typed
    /// layer is the same in all of them).
    fn find() -> Build {
        let exe = std::env::current_exe().expect("the test binary's path");
        let deps = exe.parent().expect("the test binary's folder").to_path_buf();
        let built = modified(&exe);
        let mut rlibs: Vec<(SystemTime, PathBuf)> = std::fs::read_dir(&deps)
            .unwrap_or_else(|e| panic!("reading {}: {e}", deps.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with("libkiln-") && name.ends_with(".rlib")
            })
            .map(|p| (modified(&p), p))
            .filter(|(t, _)| *t <= built)
            .collect();
        rlibs.sort();
        let kiln =
            rlibs.pop().map(|(_, p)| p).unwrap_or_else(|| panic!("no libkiln-*.rlib in {}", deps.display()));
        Build { deps, kiln }
    }

    /// rustc with kiln and its dependencies in reach, messages as a user
    /// sees them (no colour), paths relative to the crate.
    fn rustc(&self, case: &Path, out: &Path) -> Command {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let mut c = Command::new(rustc);
        c.current_dir(ROOT)
            // A wide terminal's messages: full type names, not ones cut
            // to fit 140 columns with the rest written to a temporary file.
            .args(["--edition", "2021", "--crate-type", "bin", "--color", "never", "--diagnostic-width=1000"])
            .arg("--crate-name")
            .arg(stem(case))
            .arg(format!("--remap-path-prefix={ROOT}/="))
            .arg("--extern")
            .arg(format!("kiln={}", self.kiln.display()))
            .arg("-L")
            .arg(format!("dependency={}", self.deps.display()))
            .args(["-C", "debuginfo=0", "-C", "opt-level=0", "-o"])
            .arg(out)
            .arg(case.strip_prefix(ROOT).unwrap_or(case));
        c
    }
}

/// Compiles one case: `pass*.rs` must build and run; any other must fail
/// with its `.stderr`.
fn check(build: &Build, case: &Path, out: &Path) -> Result<(), String> {
    let name = stem(case);
    let exe = out.join(&name);
    let mut rustc = build.rustc(case, &exe);
    let run = rustc.output().map_err(|e| format!("{name}: cannot run rustc: {e}"))?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    if name.starts_with("pass") {
        if !run.status.success() {
            return Err(format!("{name}: must compile, but rustc said:\n{stderr}"));
        }
        let ran = Command::new(&exe).output().map_err(|e| format!("{name}: cannot run it: {e}"))?;
        if !ran.status.success() {
            return Err(format!(
                "{name}: compiled, but running it failed:\n{}",
                String::from_utf8_lossy(&ran.stderr)
            ));
        }
        return Ok(());
    }
    if run.status.success() {
        return Err(format!("{name}: must not compile, but it did"));
    }
    let rel = case.strip_prefix(ROOT).unwrap_or(case).to_string_lossy().into_owned();
    let got = normalize(&stderr, &rel);
    let snapshot = case.with_extension("stderr");
    let want = std::fs::read_to_string(&snapshot).unwrap_or_default();
    if got == want {
        return Ok(());
    }
    if std::env::var("KILN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&snapshot, &got)
            .map_err(|e| format!("{name}: writing {}: {e}", snapshot.display()))?;
        return Ok(());
    }
    Err(format!(
        "{name}: rustc's message differs from {} (KILN_BLESS=1 rewrites it)\n--- want\n{want}\n--- got\n{got}",
        snapshot.display()
    ))
}

/// rustc's message as the snapshot keeps it: without the summary lines,
/// the standard library as `$RUST/`, line numbers only for `case`, and
/// each diagnostic's gutter as wide as `case`'s line numbers (rustc sizes
/// it by the largest line number it quotes, kiln's included).
fn normalize(stderr: &str, case: &str) -> String {
    let mut out = String::new();
    let mut block: Vec<&str> = Vec::new();
    for line in stderr.lines() {
        if line.starts_with("error: aborting due to")
            || line.starts_with("For more information about")
            || line.starts_with("Some errors have detailed explanations")
            // Where rustc wrote a long type's full name: a temporary file.
            || line.contains("the full name for the type has been written to")
            || line.contains("consider using `--verbose` to print the full type name")
        {
            continue;
        }
        // A diagnostic starts at a headline (`error[..]:`, `note:`, ...);
        // a quoted line's number can start a line too.
        if line.starts_with(|c: char| c.is_ascii_alphabetic()) && !block.is_empty() {
            normalize_block(&block, case, &mut out);
            block.clear();
        }
        block.push(line);
    }
    normalize_block(&block, case, &mut out);
    // A blank line between two errors stays; the one after the last goes.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// One diagnostic (a headline and its snippets); see `normalize`.
fn normalize_block(block: &[&str], case: &str, out: &mut String) {
    // rustc's gutter width: the indent of the block's first `-->` or `:::`.
    let width = block
        .iter()
        .find_map(|l| {
            let t = l.trim_start();
            (t.starts_with("--> ") || t.starts_with("::: ")).then(|| l.len() - t.len())
        })
        .unwrap_or(1);
    // The width the snapshot uses: the case's own largest line number.
    let mut in_case = true;
    let mut want = 1;
    for l in block {
        let t = l.trim_start();
        if t.starts_with("--> ") || t.starts_with("::: ") {
            in_case = t[4..].starts_with(case);
        } else if in_case {
            let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 && t[digits..].starts_with(" |") {
                want = want.max(digits);
            }
        }
    }
    let pad = |n: usize| " ".repeat(n);
    in_case = true;
    for line in block {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        if t.starts_with("--> ") || t.starts_with("::: ") {
            let (head, path) = t.split_at(4);
            let path = rust_path(path);
            in_case = path.starts_with(case);
            let path = if in_case { path } else { path.split(':').next().unwrap_or(&path).to_string() };
            out.push_str(&format!("{}{head}{path}\n", pad(want)));
            continue;
        }
        let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && t[digits..].starts_with(" |") {
            // A quoted line: its number, right-aligned, only for the case.
            let number = if in_case { &t[..digits] } else { "" };
            out.push_str(&format!("{number:>want$}{}\n", &t[digits..]));
            continue;
        }
        if indent == width + 1 && (t.starts_with('|') || t.starts_with('=')) {
            out.push_str(&format!("{}{t}\n", pad(want + 1)));
            continue;
        }
        if let Some(rest) = line.strip_prefix("...") {
            let r = rest.trim_start();
            if r.starts_with('|') && rest.len() - r.len() == width {
                out.push_str(&format!("...{}{r}\n", pad(want)));
                continue;
            }
        }
        // Any other indented line under the gutter (a note's second line,
        // a list of impls) moves with it.
        let line = if indent > width && width > want { &line[width - want..] } else { line };
        let t = line.trim_start();
        // How many more impls rustc found changes as kiln grows.
        if let Some(at) = line.find("and ").filter(|_| t.starts_with("and ") && t.ends_with(" others")) {
            out.push_str(&format!("{}and $N others\n", &line[..at]));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
}

/// `/rustc/<hash>/library/core/...` or a rustup toolchain's
/// `.../lib/rustlib/src/rust/library/core/...` as `$RUST/core/...`.
fn rust_path(path: &str) -> String {
    match path.find("/library/") {
        Some(i) if path.starts_with("/rustc/") || path.contains("/rustlib/") => {
            format!("$RUST/{}", &path[i + "/library/".len()..])
        }
        _ => path.to_string(),
    }
}

fn stem(case: &Path) -> String {
    case.file_stem().and_then(|s| s.to_str()).unwrap_or("case").replace('-', "_")
}

fn modified(p: &Path) -> SystemTime {
    std::fs::metadata(p).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH)
}

fn tempdir() -> PathBuf {
    let base = option_env!("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("typed-ui-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}
