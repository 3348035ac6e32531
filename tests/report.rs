//! Reports, the profiler and recompile explanations: golden SVG/HTML of two
//! small graphs (same graph, same bytes), the layout on 2,000 nodes, the
//! page in headless Chromium (it renders without console errors and the
//! pass selector switches graphs), the profiler's node times against the
//! run's wall time, the Chrome trace, and golden recompile explanations
//! for a changed shape, a changed constant and a changed option.

use kiln::prelude::*;
use kiln::report::{KernelTarget, Report};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `f` with insta writing to the repo-root `snapshots/` directory.
fn snap(f: impl FnOnce()) {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("../snapshots");
    s.set_prepend_module_to_snapshot(false);
    s.bind(f);
}

/// `name` under cargo's temporary folder for this target when it exists
/// (where the binary was built), else under the system's (a machine the
/// binary was carried to).
fn out_dir(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let base = if built.is_dir() { built.to_path_buf() } else { std::env::temp_dir() };
    let dir = base.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small scoped MLP step: two regions, a fused matmul epilogue, a
/// softmax reduction, variables.
fn mlp(ctx: &Context) -> Tensor {
    let x = ctx.randn([8, 16]);
    let h = ctx
        .scope("layer1", |ctx| {
            let w = ctx.variable("w", ctx.randn([16, 32]) * 0.1)?;
            let b = ctx.variable("b", ctx.zeros([32]))?;
            Ok((x.matmul(&w) + &b).relu())
        })
        .unwrap();
    ctx.scope("head", |ctx| {
        let w = ctx.variable("w", ctx.randn([32, 4]) * 0.1)?;
        Ok(h.matmul(&w).softmax(1).sum(&[1], false))
    })
    .unwrap()
}

/// Two independent branches on two streams, joined.
fn branches(ctx: &Context) -> Tensor {
    let (a, b) = (ctx.randn([32, 32]), ctx.randn([32, 32]));
    let left = a.matmul(&a).exp();
    let right = b.matmul(&b).tanh();
    (left + right).mean(&[0, 1], false)
}

fn mlp_report() -> Report {
    let ctx = Context::cpu().with_seed(1);
    let y = mlp(&ctx);
    ctx.report(&[&y]).unwrap()
}

fn branches_report() -> Report {
    let ctx = Context::cpu().with_seed(1).with_streams(2);
    let y = branches(&ctx);
    ctx.report(&[&y]).unwrap()
}

#[test]
fn same_graph_same_bytes() {
    assert_eq!(mlp_report().html(), mlp_report().html());
    assert_eq!(branches_report().html(), branches_report().html());
}

#[test]
fn golden_svg_of_two_small_graphs() {
    snap(|| {
        insta::assert_snapshot!("report-mlp-final.svg", mlp_report().final_svg());
        insta::assert_snapshot!("report-branches-final.svg", branches_report().final_svg());
    });
}

#[test]
fn golden_html_of_a_small_graph() {
    let ctx = Context::cpu();
    let x = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let y = ctx.scope("s", |_| Ok((&x * 2.0).exp().sum(&[1], false))).unwrap();
    let html = ctx.report(&[&y]).unwrap().html();
    snap(|| insta::assert_snapshot!("report-small.html", html));
}

#[test]
fn report_has_every_pass_the_plan_and_kernels() {
    let r = mlp_report();
    let names: Vec<&str> = r.steps().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names[0], "input");
    assert!(names.contains(&"fusion") && names.contains(&"memory"), "{names:?}");
    assert!(!r.kernel_sources().is_empty(), "the fused nodes' bodies are the CPU's kernels");
    let html = r.html();
    for needle in
        ["<svg", "class=\"cluster\"", "layer1", "data-body=", "lower bound", "class=\"lanes\"", "Diff from"]
    {
        assert!(html.contains(needle), "report lacks {needle}");
    }
    assert!(
        !html.contains("http://") || !html.contains("<script src"),
        "the page must need nothing from outside"
    );
}

#[test]
fn cuda_kernels_are_the_generated_source() {
    let ctx = Context::cpu().with_seed(1);
    let y = mlp(&ctx);
    let graph = ctx.optimized_graph(&[&y]).unwrap();
    let plan = kiln::ir::Plan::new(graph);
    let ks = kiln::report::kernels(&plan, KernelTarget::Cuda { tf32: false, hopper: false, sms: 0 }).unwrap();
    assert!(ks.iter().any(|k| k.language == "cuda" && k.source.contains("__global__")), "{ks:#?}");
}

/// A context on the CUDA backend (here its CPU emulator) shows the CUDA C
/// its plan lowers to.
#[cfg(feature = "cuda-emulator")]
#[test]
fn report_on_cuda_shows_cuda_source() {
    let ctx = Context::cuda_emulated().with_seed(1);
    let y = mlp(&ctx);
    let r = ctx.report(&[&y]).unwrap();
    assert!(r.kernel_sources().iter().any(|k| k.language == "cuda" && k.source.contains("__global__")));
    assert!(r.html().contains("__global__"));
}

/// A graph of `n` nodes shaped like a tensor program: a chain of
/// elementwise ops with residual adds, in a few regions.
fn big_graph(n: usize) -> kiln::ir::Graph {
    let mut text = String::from("%0: f32[64,128] = input 0\n");
    for i in 1..n {
        let region = format!(" @block{}/layer{}", i / 400, (i / 50) % 8);
        if i % 7 == 0 && i > 10 {
            text.push_str(&format!("%{i}: f32[64,128] = add %{}, %{}{region}\n", i - 1, i - 1 - (i % 5) - 2));
        } else {
            let op = ["exp", "tanh", "relu", "neg"][i % 4];
            text.push_str(&format!("%{i}: f32[64,128] = {op} %{}{region}\n", i - 1));
        }
    }
    text.push_str(&format!("return %{}\n", n - 1));
    kiln::ir::text::parse(&text).unwrap()
}

/// A graph of 2,000 nodes (what `layout-rs` could not lay out) is drawn
/// whole: every node, every region (how long it takes is
/// `benches/report.rs`'s).
#[test]
fn a_graph_of_2000_nodes_is_drawn_whole() {
    let svg = kiln::report::graph_svg(&big_graph(2000));
    assert_eq!(svg.matches("<g class=\"node").count(), 2000);
    assert!(svg.contains("block4/layer7"), "the last region is missing");
}

#[test]
fn viewer_reads_a_dump_directory_and_a_kir_file() {
    let dir = out_dir("viewer-dump");
    let _ = std::fs::remove_dir_all(&dir);
    // A dump made by the pipeline itself.
    let recorded = {
        let cfg = kiln::passes::PipelineConfig::new(None, Some(dir.clone())).unwrap();
        let g = kiln::ir::text::parse(&kiln::ir::text::print(&big_graph(30))).unwrap();
        kiln::passes::optimize(g, &cfg).unwrap();
        std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path()
    };
    let r = Report::from_dump_dir(&recorded).unwrap();
    assert!(r.steps().len() >= 9, "{}", r.steps().len());
    // The binary: a dump folder, with the CUDA kernels of its plan. Cargo
    // builds it next to this test; a test binary copied elsewhere (the GPU
    // bundle) has no viewer beside it, and says so.
    let viewer = PathBuf::from(env!("CARGO_BIN_EXE_kiln-view"));
    assert!(viewer.exists(), "kiln-view is not at {}: run this test with cargo test", viewer.display());
    let page = dir.join("view.html");
    let out = Command::new(&viewer).arg(&recorded).arg("-o").arg(&page).arg("--cuda").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<svg") && html.contains("memory"), "kiln-view wrote no report");
    let out = Command::new(&viewer).arg(dir.join("nothing-here")).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("kiln-view:"));
    let kir = dir.join("g.kir");
    std::fs::write(&kir, kiln::ir::text::print(&big_graph(12))).unwrap();
    let r = Report::from_kir(&kir).unwrap();
    assert_eq!(r.steps()[0].name, "input");
    let err = Report::from_dump_dir(&dir.join("missing")).unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err}");
}

/// `KILN_REPORT` is read when a context is made, so it cannot be set for
/// one test of this process: the test runs itself again in a child process
/// (this binary, this test only) with the variable set, and there (where
/// `KILN_REPORT_CHILD` says so) runs a small model, then checks the page.
#[test]
fn kiln_report_writes_a_page_per_compile() {
    if std::env::var("KILN_REPORT_CHILD").is_ok() {
        let ctx = Context::cpu().with_seed(1);
        mlp(&ctx).to_vec::<f32>().unwrap();
        return;
    }
    let dir = out_dir("kiln-report-env");
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "kiln_report_writes_a_page_per_compile"])
        .env("KILN_REPORT", &dir)
        .env("KILN_REPORT_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("1 passed"), "the child run failed:\n{stdout}");
    let pages: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(pages.len(), 1, "{pages:?}");
    let html = std::fs::read_to_string(&pages[0]).unwrap();
    // Rewritten after the run with its times (KILN_REPORT profiles).
    assert!(html.contains("node times add up to") && html.contains("layer1"));
}

// ---- the page in a browser ----

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        let out = Command::new("which").arg(name).output().ok()?;
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
}

fn headless(browser: &Path, args: &[&str]) -> std::process::Output {
    let profile = out_dir("chromium-profile");
    Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--enable-logging=stderr", "--v=0"])
        .args(args)
        .output()
        .expect("chromium runs")
}

/// Opens a report in headless Chromium: the page's self test clicks every
/// pass of the selector (each must show its own graph) and opens a fused
/// body; no script error may happen; then a screenshot is saved
/// (`target/tmp/report-browser/report.png`). Skips when Chromium is
/// missing, unless `KILN_REQUIRE_CHROMIUM=1`.
#[test]
fn report_renders_in_headless_chromium() {
    let Some(browser) = chromium() else {
        if std::env::var("KILN_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("KILN_REQUIRE_CHROMIUM=1 but no chromium on the PATH (apt-get install chromium)");
        }
        eprintln!("skipping: no chromium on the PATH (apt-get install chromium to run this test)");
        return;
    };
    let dir = out_dir("report-browser");
    let page = dir.join("report.html");
    let ctx = Context::cpu().with_seed(1).with_profiling(true);
    let y = mlp(&ctx);
    y.to_vec::<f32>().unwrap();
    let y = mlp(&ctx);
    ctx.report(&[&y]).unwrap().write_html(&page).unwrap();
    let url = format!("file://{}", page.display());
    let out = headless(&browser, &["--dump-dom", &format!("{url}#selftest")]);
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    let line = dom.lines().find(|l| l.contains("selftest ")).unwrap_or("");
    assert!(line.contains("selftest ok"), "self test: {line}\nstderr: {log}");
    assert!(line.contains("body:open"), "no fused body opened: {line}");
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") && (l.contains("Uncaught") || l.contains("Error")))
        .collect();
    assert!(console_errors.is_empty(), "console errors: {console_errors:#?}");
    let shot = dir.join("report.png");
    let _ = std::fs::remove_file(&shot);
    let out = headless(
        &browser,
        &[&format!("--screenshot={}", shot.display()), "--window-size=1400,1000", &format!("{url}#pass=6")],
    );
    assert!(shot.exists(), "no screenshot: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("screenshot: {}", shot.display());
}

// ---- the profiler ----

#[test]
fn node_times_add_up_to_the_run() {
    let ctx = Context::cpu().with_seed(2).with_profiling(true);
    let x = ctx.randn([192, 192]);
    let mut y = x.clone();
    for _ in 0..6 {
        y = (y.matmul(&x) * 0.05).tanh();
    }
    let total = y.sum_all();
    // The first run compiles; profile the second, warm one.
    total.item::<f32>().unwrap();
    ctx.reset_profile();
    let mut y = x.clone();
    for _ in 0..6 {
        y = (y.matmul(&x) * 0.05).tanh();
    }
    y.sum_all().item::<f32>().unwrap();
    let p = ctx.profile();
    assert_eq!(p.runs.len(), 1);
    let (wall, nodes) = (p.wall_ms(), p.node_ms());
    eprintln!("{p}");
    eprintln!("wall {wall:.3} ms, node times {nodes:.3} ms ({:.1}%)", 100.0 * nodes / wall);
    assert!(p.runs[0].nodes.len() >= 6, "{:?}", p.runs[0].nodes);
    assert!((nodes - wall).abs() <= 0.10 * wall, "node times {nodes} ms vs wall {wall} ms");
    let by_op = p.by_op();
    assert!(by_op.iter().any(|r| r.key.contains("matmul")), "{by_op:?}");
    let text = p.to_string();
    assert!(text.contains("by") || text.contains("region"), "{text}");
}

#[test]
fn profile_by_region_and_chrome_trace() {
    let ctx = Context::cpu().with_seed(2).with_profiling(true).with_streams(2);
    let y = mlp(&ctx);
    y.to_vec::<f32>().unwrap();
    let p = ctx.profile();
    let regions: Vec<String> = p.by_region().into_iter().map(|r| r.key).collect();
    assert!(regions.iter().any(|r| r == "layer1") && regions.iter().any(|r| r == "head"), "{regions:?}");
    let trace = p.chrome_trace();
    assert!(trace.starts_with("{\"displayTimeUnit\""));
    assert!(trace.contains("\"thread_name\"") && trace.contains("\"ph\":\"X\""));
    // The report puts the times on the graph of the plan that ran.
    branches(&ctx).item::<f32>().unwrap();
    let html = ctx.report(&[&branches(&ctx)]).unwrap().html();
    assert!(html.contains("node times add up to"), "the report shows no profile");
}

#[test]
fn profiling_off_records_nothing() {
    let ctx = Context::cpu();
    let y = (ctx.randn([4, 4]) * 2.0).exp().sum_all();
    y.item::<f32>().unwrap();
    assert!(ctx.profile().runs.is_empty());
}

// ---- recompile explanations ----

fn explanations(f: impl Fn(&Context, usize)) -> Vec<String> {
    let ctx = Context::cpu();
    for i in 0..2 {
        f(&ctx, i);
    }
    ctx.stats().recompiles.iter().map(|r| r.message.clone()).collect()
}

#[test]
fn recompile_explanations() {
    let shape = explanations(|ctx, i| {
        // A data batch whose size changes.
        let x = ctx.tensor(&vec![0.5f32; 12 * (i + 1)], [4 * (i + 1), 3]);
        x.exp().sum_all().item::<f32>().unwrap();
    });
    let constant = explanations(|ctx, i| {
        let x = ctx.tensor(&[1.0f32, 2.0, 3.0], [3]);
        ctx.scope("step", |_| Ok((&x * (0.1 * (i + 1) as f64)).sum_all())).unwrap().item::<f32>().unwrap();
    });
    let option = {
        let ctx = Context::cpu();
        let x = ctx.tensor(&[1.0f32, 2.0, 3.0], [3]);
        x.exp().sum_all().item::<f32>().unwrap();
        let ctx2 = ctx.clone().with_fast_math(true);
        x.exp().sum_all().item::<f32>().unwrap();
        drop(ctx2);
        ctx.stats().recompiles.iter().map(|r| r.message.clone()).collect::<Vec<_>>()
    };
    let same = explanations(|ctx, _| {
        let x = ctx.tensor(&[1.0f32, 2.0, 3.0], [3]);
        (&x * 3.0).sum_all().item::<f32>().unwrap();
    });
    assert!(same.is_empty(), "a cache hit explains nothing: {same:?}");
    snap(|| {
        insta::assert_snapshot!("recompile-shape", shape.join("\n"));
        insta::assert_snapshot!("recompile-constant", constant.join("\n"));
        insta::assert_snapshot!("recompile-option", option.join("\n"));
    });
}

// ---- CUDA (skips without a GPU; KILN_REQUIRE_CUDA=1 makes that a failure) ----

/// On a GPU: a profiled plan times every step with CUDA events, is never
/// captured into a CUDA graph, says so, and its step times fit in the
/// run; the report shows the CUDA source and the times. The report is
/// written to `$KILN_REPORT_OUT` when that is set (to look at it).
#[test]
fn cuda_profile_times_every_launch() {
    let ctx = match Context::cuda(0) {
        Ok(ctx) => ctx.with_seed(3).with_profiling(true),
        Err(e) => {
            if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
            }
            eprintln!("skipped: no CUDA ({})", e.to_string().lines().next().unwrap_or_default());
            return;
        }
    };
    let step = |ctx: &Context| {
        let x = ctx.randn([512, 512]);
        let mut y = x.clone();
        for _ in 0..4 {
            y = (y.matmul(&x) * 0.04).tanh();
        }
        y.sum_all()
    };
    for _ in 0..3 {
        step(&ctx).item::<f32>().unwrap();
    }
    let s = ctx.stats();
    assert_eq!(s.graph_captures, 0, "a profiled plan must not be captured");
    let p = ctx.profile();
    eprintln!("{p}");
    assert_eq!(p.runs.len(), 3);
    let last = &p.runs[2];
    assert!(last.note.as_deref().is_some_and(|n| n.contains("not captured")), "{:?}", last.note);
    assert!(last.nodes.len() >= 5, "{:?}", last.nodes);
    let nodes: f64 = last.nodes.iter().map(|n| n.dur_us).sum();
    eprintln!("run wall {:.1} us, step events add up to {:.1} us", last.wall_us, nodes);
    assert!(nodes > 0.0 && nodes <= last.wall_us * 1.05, "{nodes} us of steps in a {} us run", last.wall_us);
    let r = ctx.report(&[&step(&ctx)]).unwrap();
    assert!(r.kernel_sources().iter().any(|k| k.language == "cuda"));
    let html = r.html();
    assert!(html.contains("__global__") && html.contains("node times add up to"));
    if let Ok(dir) = std::env::var("KILN_REPORT_OUT") {
        r.write_html(Path::new(&dir).join("cuda-report.html")).unwrap();
        p.write_chrome_trace(Path::new(&dir).join("cuda-trace.json")).unwrap();
    }
}
