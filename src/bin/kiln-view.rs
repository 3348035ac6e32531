//! `kiln-view`: turns a `.kir` file or a `KILN_DUMP` directory into the
//! same HTML report a context writes (`KILN_REPORT`), so a dump from
//! another machine can be looked at in a browser.
//!
//! ```text
//! kiln-view <file.kir | dump dir> [-o out.html] [--cuda]
//! ```
//!
//! A dump directory of one graph (`<dump>/<hash>/NN-<pass>.kir`) gives one
//! page; the dump root (`<dump>`, one folder per graph) gives one page per
//! graph, `<hash>.html` beside the folders. `--cuda` shows the CUDA source
//! of the final plan's kernels (lowering needs no GPU); the default shows
//! the CPU's fused bodies.

use kiln::ir::Plan;
use kiln::report::{KernelTarget, Report};
use std::path::{Path, PathBuf};

const USAGE: &str = "usage: kiln-view <file.kir | dump dir> [-o out.html] [--cuda]";

fn main() {
    if let Err(e) = run() {
        eprintln!("kiln-view: {e}");
        std::process::exit(1);
    }
}

fn run() -> kiln::Result<()> {
    let mut input = None;
    let mut out = None;
    let mut target = KernelTarget::Cpu;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" | "--out" => out = args.next().map(PathBuf::from),
            "--cuda" => target = KernelTarget::Cuda { tf32: false, hopper: false, sms: 0 },
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ if input.is_none() => input = Some(PathBuf::from(a)),
            _ => return Err(kiln::Error::Config(format!("unexpected argument `{a}`\n{USAGE}"))),
        }
    }
    let input = input.ok_or_else(|| kiln::Error::Config(USAGE.into()))?;
    if input.is_file() {
        let page = out.unwrap_or_else(|| input.with_extension("html"));
        return write(Report::from_kir(&input)?, target, &page);
    }
    let has_kir = |d: &Path| {
        std::fs::read_dir(d)
            .map(|rd| rd.flatten().any(|e| e.path().extension().is_some_and(|x| x == "kir")))
            .unwrap_or(false)
    };
    if has_kir(&input) {
        let page = out.unwrap_or_else(|| input.join("report.html"));
        return write(Report::from_dump_dir(&input)?, target, &page);
    }
    let mut graphs: Vec<PathBuf> = std::fs::read_dir(&input)
        .map_err(|e| kiln::Error::Io(format!("cannot read {}: {e}", input.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && has_kir(p))
        .collect();
    graphs.sort();
    if graphs.is_empty() {
        return Err(kiln::Error::Io(format!("{} holds no .kir file and no dump folder", input.display())));
    }
    let dir = out.unwrap_or_else(|| input.clone());
    std::fs::create_dir_all(&dir)
        .map_err(|e| kiln::Error::Io(format!("cannot create {}: {e}", dir.display())))?;
    for g in graphs {
        let name = g.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        write(Report::from_dump_dir(&g)?, target, &dir.join(format!("{name}.html")))?;
    }
    Ok(())
}

fn write(report: Report, target: KernelTarget, page: &Path) -> kiln::Result<()> {
    let last = report.steps().last().map(|s| s.graph.clone());
    let report = match last {
        Some(g) if !g.tables().is_empty() => report.with_kernels(&Plan::new(g), target)?,
        _ => report,
    };
    report.write_html(page)?;
    println!("{}", page.display());
    Ok(())
}
