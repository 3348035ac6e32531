//! Differential testing: random programs recorded through kiln's public
//! API, compared with an independent f64 reference that bounds every
//! element.
//!
//! - [`gen`] makes a program from one `u64` seed: 5 to 30 ops over a few
//!   fresh random inputs (elementwise with broadcasting and scalars on
//!   either side, comparisons and `where`, casts, reductions over random
//!   dims, argmax, softmax, log_softmax, layer norm, matmul with batch
//!   broadcasting, every view, cat, stack, gather, index_select, conv2d,
//!   pooling, constants, mid-program `realize`), mostly small tensors,
//!   some large enough for the CPU backend's blocked, parallel and tiled
//!   paths.
//! - [`eval`] evaluates it in f64 on its own strided arrays ([`array`])
//!   and carries a rigorous error bound per element (its header says how);
//!   it calls no kiln code.
//! - [`run`] records it on a context and reads the outputs.
//!
//! Each configuration is a test: `default`, `streams2`
//! (`with_streams(2)`), `no_fusion` (`with_passes("-fusion")`),
//! `fast_math` (`with_fast_math(true)`, bounds for the rewrites it
//! allows) and `f64` (programs whose base dtype is f64). The first four
//! run the same programs (f32 mostly, some f16 and bf16) for a seed.
//! Programs share a context in groups of [`PROGRAMS_PER_CONTEXT`], and
//! every fourth runs again on shuffled inputs from the plan cache.
//!
//! The long run: `KILN_DIFF_PROGRAMS=10000 cargo test --release --test
//! robust differential -- --nocapture` (each test prints its counts: runs,
//! mismatches, elements compared, and per float dtype the median bound
//! and the worst error as a fraction of its bound).
//!
//! Environment:
//! - `KILN_DIFF_PROGRAMS=n`: programs per configuration (default 200);
//!   `KILN_DIFF_FIRST=s`: the first seed (default 0).
//! - `KILN_DIFF_SEED=s`: only seed `s`, with its program printed; with
//!   `KILN_DIFF_SHRINK=1` a failure is also shrunk to a small program that
//!   fails the same way ([`shrink`]), on a fresh context.
//! - `KILN_DIFF_DEVICE=cpu|cuda|emulated`: one backend only. By default
//!   the tests run on the CPU and, when `Context::cuda(0)` works, on CUDA
//!   too (as `tests/ops` does); `KILN_REQUIRE_CUDA=1` makes a missing GPU
//!   a failure; `KILN_TEST_EMULATE=1` (or `emulated`) with `--features
//!   cuda-emulator` adds the CUDA backend's programs run on the CPU.
//!
//! A mismatch (an element outside its bound, a wrong shape or dtype, an
//! error or a panic from kiln) prints the seed, the configuration, the
//! program with every value's type, the elements that differ and the
//! slice of the program that computes them; the test fails at the end,
//! with the count.

mod array;
mod dt;
mod eval;
mod gen;
mod program;
mod regress;
mod run;
mod scalar;
mod shrink;

use array::Iv;
use eval::{eval, Model, Val};
use kiln::prelude::*;
use program::{Dt, Program};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::Instant;

/// A configuration: how the context is made and what programs it runs.
struct Config {
    name: &'static str,
    f64_base: bool,
    fast_math: bool,
    setup: fn(Context) -> Context,
}

const DEFAULT: Config = Config { name: "default", f64_base: false, fast_math: false, setup: |c| c };
const STREAMS2: Config =
    Config { name: "streams2", f64_base: false, fast_math: false, setup: |c| c.with_streams(2) };
const NO_FUSION: Config =
    Config { name: "no_fusion", f64_base: false, fast_math: false, setup: |c| c.with_passes("-fusion") };
const FAST_MATH: Config =
    Config { name: "fast_math", f64_base: false, fast_math: true, setup: |c| c.with_fast_math(true) };
const F64: Config = Config { name: "f64", f64_base: true, fast_math: false, setup: |c| c };

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Device {
    Cpu,
    Cuda,
    #[allow(dead_code)]
    Emulated,
}

impl Device {
    fn context(self) -> Context {
        match self {
            Device::Cpu => Context::cpu(),
            Device::Cuda => Context::cuda(0).unwrap_or_else(|e| panic!("CUDA went away: {e}")),
            #[cfg(feature = "cuda-emulator")]
            Device::Emulated => Context::cuda_emulated(),
            #[cfg(not(feature = "cuda-emulator"))]
            Device::Emulated => unreachable!("only with the cuda-emulator feature"),
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.trim().parse().unwrap_or_else(|_| panic!("{name}={v} is not a whole number")))
}

/// The backends to test (see the module doc).
fn devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let only = std::env::var("KILN_DIFF_DEVICE").ok();
        let mut out = Vec::new();
        if only.as_deref().is_none_or(|d| d == "cpu") {
            out.push(Device::Cpu);
        }
        if only.as_deref().is_none_or(|d| d == "cuda") {
            match Context::cuda(0) {
                Ok(_) => out.push(Device::Cuda),
                Err(e) => {
                    if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") {
                        panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}");
                    }
                    let why = e.to_string().lines().next().unwrap_or_default().to_string();
                    eprintln!("tests/robust/differential: CUDA skipped ({why})");
                }
            }
        }
        if std::env::var("KILN_TEST_EMULATE").is_ok_and(|v| v == "1") || only.as_deref() == Some("emulated") {
            #[cfg(feature = "cuda-emulator")]
            out.push(Device::Emulated);
            #[cfg(not(feature = "cuda-emulator"))]
            panic!("KILN_TEST_EMULATE=1 needs --features cuda-emulator");
        }
        out
    })
}

/// How one element compares with its bound.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Unknown,
    Within,
    Outside,
}

fn check(dt: Dt, r: Iv, got: f64) -> Check {
    if !r.known() {
        return Check::Unknown;
    }
    let ok = if dt.is_float() {
        // The subtraction itself rounds in f64.
        (got - r.mid).abs() <= r.rad + 2.0 * f64::EPSILON * r.mid.abs()
    } else {
        got >= r.lo() - 1e-9 && got <= r.hi() + 1e-9
    };
    if ok {
        Check::Within
    } else {
        Check::Outside
    }
}

/// Counts over a run of many programs.
#[derive(Default)]
struct Tally {
    programs: u64,
    /// Elements compared, and elements whose bound was unknown.
    checked: u64,
    unknown: u64,
    /// Per float dtype (f16, bf16, f32, f64), over the elements compared
    /// whose bound is not 0 (those that are exact must match exactly):
    /// [`Bounds`].
    floats: [Bounds; 4],
    /// Instructions generated, and those the outputs need.
    instrs: u64,
    live: u64,
    mismatches: Vec<String>,
}

/// How tight the bounds of one dtype were.
struct Bounds {
    /// Elements with a non-zero bound.
    count: u64,
    /// How many of them (of those with `|expected| >= 1e-6`) had a
    /// relative bound `rad / |expected|` in `[2^-k-1, 2^-k)`, for the
    /// median (k from 0 to 63; smaller bounds count in the last).
    log2_hist: [u64; 64],
    /// The largest observed error as a fraction of its bound, and its seed.
    worst: f64,
    worst_seed: u64,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds { count: 0, log2_hist: [0; 64], worst: 0.0, worst_seed: 0 }
    }
}

impl Bounds {
    fn add(&mut self, r: Iv, got: f64, seed: u64) {
        self.count += 1;
        if r.mid.abs() >= 1e-6 {
            let k = (-(r.rad / r.mid.abs()).log2()).floor().clamp(0.0, 63.0) as usize;
            self.log2_hist[k] += 1;
        }
        let ratio = (got - r.mid).abs() / r.rad;
        if ratio > self.worst {
            (self.worst, self.worst_seed) = (ratio, seed);
        }
    }

    /// The median relative bound, as a power of two.
    fn median(&self) -> f64 {
        let total: u64 = self.log2_hist.iter().sum();
        let mut seen = 0;
        for (k, &n) in self.log2_hist.iter().enumerate() {
            seen += n;
            if 2 * seen >= total {
                return 2f64.powi(-(k as i32));
            }
        }
        0.0
    }
}

fn float_slot(dt: Dt) -> Option<usize> {
    [Dt::F16, Dt::Bf16, Dt::F32, Dt::F64].iter().position(|&d| d == dt)
}

/// The program with every value's dtype and shape.
fn listing(p: &Program, vals: &[Val]) -> String {
    let mut s = String::new();
    for (i, instr) in p.instrs.iter().enumerate() {
        let v = &vals[i];
        let _ = writeln!(s, "    %{i} = {instr};   // {}{:?}", v.dt.name(), v.arr.shape);
    }
    let outs: Vec<String> = p.outputs.iter().map(|o| format!("%{o}")).collect();
    let _ = write!(s, "    read {} ({:?})", outs.join(", "), p.read);
    s
}

/// How a program fails on a fresh context, if it does: `error: ...` (the
/// message up to its first digit, so a smaller program with other counts
/// fails the same way), `panic`, or `mismatch` (an output of the wrong
/// type or an element outside its bound).
fn verdict(cfg: &Config, device: Device, p: &Program) -> Option<String> {
    let vals = eval(Model { fast_math: cfg.fast_math }, p);
    let ctx = (cfg.setup)(device.context());
    let got = match catch_unwind(AssertUnwindSafe(|| run::run(&ctx, p))) {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => {
            return Some(format!(
                "error: {}",
                e.to_string().split(|c: char| c.is_ascii_digit()).next().unwrap_or("")
            ))
        }
        Err(_) => return Some("panic".into()),
    };
    let bad = p.outputs.iter().zip(&got).any(|(&o, got)| {
        let want = &vals[o];
        got.shape != want.arr.shape
            || got.dtype != run::dtype(want.dt)
            || want
                .arr
                .values()
                .into_iter()
                .zip(&got.values)
                .any(|(r, &g)| check(want.dt, r, g) == Check::Outside)
    });
    bad.then(|| "mismatch".into())
}

/// Runs program `p` on `ctx` and compares it with the reference under
/// `model`, adding to `tally`; `what` says which run it was (for a report).
fn compare(ctx: &Context, p: &Program, model: Model, what: &str, tally: &mut Tally, verbose: bool) {
    let seed = p.seed;
    let vals = eval(model, p);
    tally.programs += 1;
    tally.instrs += p.instrs.len() as u64;
    tally.live += p.sliced(&p.outputs).instrs.len() as u64;
    if verbose {
        eprintln!("{what}:\n{}", listing(p, &vals));
    }
    let header = format!("differential mismatch: {what}");
    let got = match catch_unwind(AssertUnwindSafe(|| run::run(ctx, p))) {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => {
            tally.mismatches.push(format!("{header}\nkiln returned an error: {e}\n{}", listing(p, &vals)));
            return;
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            tally.mismatches.push(format!("{header}\nkiln panicked: {msg}\n{}", listing(p, &vals)));
            return;
        }
    };
    let mut report = String::new();
    let mut bad_outputs = Vec::new();
    for (&o, got) in p.outputs.iter().zip(&got) {
        let want = &vals[o];
        if got.shape != want.arr.shape || got.dtype != run::dtype(want.dt) {
            let _ = writeln!(
                report,
                "output %{o}: kiln made {}{:?}, the reference {}{:?}",
                got.dtype,
                got.shape,
                want.dt.name(),
                want.arr.shape
            );
            bad_outputs.push(o);
            continue;
        }
        let mut outside = Vec::new();
        for (i, (r, &g)) in want.arr.values().into_iter().zip(&got.values).enumerate() {
            match check(want.dt, r, g) {
                Check::Unknown => tally.unknown += 1,
                Check::Within => {
                    tally.checked += 1;
                    match float_slot(want.dt) {
                        Some(k) if r.rad > 0.0 => tally.floats[k].add(r, g, seed),
                        _ => {}
                    }
                }
                Check::Outside => {
                    tally.checked += 1;
                    outside.push((i, r, g));
                }
            }
        }
        if verbose {
            let worst = want.arr.values().into_iter().zip(&got.values).enumerate().fold(
                (0.0, 0, Iv::exact(0.0), 0.0),
                |w, (i, (r, &g))| {
                    let ratio = if r.rad > 0.0 { (g - r.mid).abs() / r.rad } else { 0.0 };
                    if ratio > w.0 {
                        (ratio, i, r, g)
                    } else {
                        w
                    }
                },
            );
            eprintln!(
                "output %{o}: worst element {} at {:.2} of its bound: expected {} ± {:.3e}, got {}",
                worst.1, worst.0, worst.2.mid, worst.2.rad, worst.3
            );
        }
        if !outside.is_empty() {
            let _ = writeln!(
                report,
                "output %{o} ({}{:?}): {} of {} element(s) outside the bound",
                want.dt.name(),
                want.arr.shape,
                outside.len(),
                got.values.len()
            );
            for (i, r, g) in outside.iter().take(8) {
                let _ = writeln!(report, "    element {i}: expected {} ± {:.3e}, got {g}", r.mid, r.rad);
            }
            bad_outputs.push(o);
        }
    }
    if !bad_outputs.is_empty() {
        let slice = p.sliced(&bad_outputs[..1]);
        let slice_vals = eval(model, &slice);
        tally.mismatches.push(format!(
            "{header}\n{report}program:\n{}\nthe slice that computes %{}:\n{}",
            listing(p, &vals),
            bad_outputs[0],
            listing(&slice, &slice_vals)
        ));
    }
}

/// Programs one context runs before a fresh one is made: a context is
/// shared so that programs meet each other's cached plans and collected
/// graphs, as a long-running user program's would.
const PROGRAMS_PER_CONTEXT: u64 = 50;

/// Runs a configuration over the seeds the environment asks for, on every
/// device, and fails with every mismatch. Every fourth program runs a
/// second time on the same context with its inputs shuffled: the same
/// structure, so it runs from the plan cache, on new data.
fn run_config(cfg: &Config) {
    let single = env_u64("KILN_DIFF_SEED");
    let first = env_u64("KILN_DIFF_FIRST").unwrap_or(0);
    let count = env_u64("KILN_DIFF_PROGRAMS").unwrap_or(200);
    let seeds: Vec<u64> = match single {
        Some(s) => vec![s],
        None => (first..first + count).collect(),
    };
    let model = Model { fast_math: cfg.fast_math };
    let mut failures = Vec::new();
    for &device in devices() {
        let start = Instant::now();
        let mut tally = Tally::default();
        let mut ctx: Option<(Context, u64)> = None;
        for &seed in &seeds {
            let since = match &ctx {
                Some((_, since)) if seed - since < PROGRAMS_PER_CONTEXT => *since,
                _ => {
                    ctx = Some(((cfg.setup)(device.context()), seed));
                    seed
                }
            };
            let Some((c, _)) = &ctx else { unreachable!("made just above") };
            let name = cfg.name;
            let replay = if since == seed {
                format!("KILN_DIFF_SEED={seed}")
            } else {
                format!("KILN_DIFF_FIRST={since} KILN_DIFF_PROGRAMS={}", seed - since + 1)
            };
            let what = format!(
                "config {name}, device {device:?}, seed {seed}, on a context that ran seeds {since}..{seed} before \
                 (replay: {replay} cargo test --test robust differential::{name})"
            );
            let p = gen::generate(seed, cfg.f64_base);
            let before = tally.mismatches.len();
            compare(c, &p, model, &what, &mut tally, single.is_some());
            if single.is_some()
                && tally.mismatches.len() > before
                && std::env::var("KILN_DIFF_SHRINK").is_ok_and(|v| v == "1")
            {
                match verdict(cfg, device, &p) {
                    Some(kind) => {
                        let small =
                            shrink::shrink(&p, model, |q| verdict(cfg, device, q).as_ref() == Some(&kind));
                        let vals = eval(model, &small);
                        eprintln!("shrunk ({kind}) to:\n{}", listing(&small, &vals));
                        match run::explain(&(cfg.setup)(device.context()), &small) {
                            Ok(plan) => eprintln!("its optimized graph:\n{plan}"),
                            Err(e) => eprintln!("its optimized graph: {e}"),
                        }
                    }
                    None => eprintln!("the failure does not happen on a fresh context: not shrunk"),
                }
            }
            if seed % 4 == 0 {
                let again = gen::shuffled(&p);
                let what = format!("{what}; its second run, on shuffled inputs, from the plan cache");
                compare(c, &again, model, &what, &mut tally, single.is_some());
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let mut line = format!(
            "differential {} on {device:?}: {} runs of {} programs ({:.1} instructions each, {:.1} of them read), \
             {} mismatch(es), {} elements compared, {} unknown, {secs:.1} s",
            cfg.name,
            tally.programs,
            seeds.len(),
            tally.instrs as f64 / tally.programs as f64,
            tally.live as f64 / tally.programs as f64,
            tally.mismatches.len(),
            tally.checked,
            tally.unknown
        );
        for (dt, b) in [Dt::F16, Dt::Bf16, Dt::F32, Dt::F64].iter().zip(&tally.floats) {
            if b.count > 0 {
                let _ = write!(
                    line,
                    "; {}: {} inexact elements, median bound {:.0e} relative, worst error {:.2} of its bound (seed {})",
                    dt.name(),
                    b.count,
                    b.median(),
                    b.worst,
                    b.worst_seed
                );
            }
        }
        eprintln!("{line}");
        for m in &tally.mismatches {
            eprintln!("\n{m}\n");
        }
        failures.extend(tally.mismatches);
    }
    assert!(
        failures.is_empty(),
        "{} differential mismatch(es) in config {} (printed above)",
        failures.len(),
        cfg.name
    );
}

#[test]
fn default() {
    run_config(&DEFAULT);
}

#[test]
fn streams2() {
    run_config(&STREAMS2);
}

#[test]
fn no_fusion() {
    run_config(&NO_FUSION);
}

#[test]
fn fast_math() {
    run_config(&FAST_MATH);
}

#[test]
fn f64() {
    run_config(&F64);
}

/// The CPU backend's generated code against its interpreter, bit for bit
/// (any NaN matching any NaN), on the default configuration's programs:
/// `Context::cpu_codegen(true)` (every body that qualifies generated,
/// whole or in segments) and `cpu_codegen(false)`. `KILN_DIFF_PROGRAMS`
/// and `KILN_DIFF_FIRST` apply; half as many programs by default (each
/// runs twice).
#[test]
fn generated_matches_interpreted() {
    let first = env_u64("KILN_DIFF_FIRST").unwrap_or(0);
    let count = env_u64("KILN_DIFF_PROGRAMS").unwrap_or(200) / 2;
    let mut bad = Vec::new();
    let (mut compared, mut elements) = (0, 0);
    let (mut generated, mut interpreted) = (Context::cpu_codegen(true), Context::cpu_codegen(false));
    for seed in first..first + count {
        if (seed - first) % PROGRAMS_PER_CONTEXT == 0 {
            (generated, interpreted) = (Context::cpu_codegen(true), Context::cpu_codegen(false));
        }
        let p = gen::generate(seed, false);
        let got = catch_unwind(AssertUnwindSafe(|| run::run(&generated, &p)));
        let want = catch_unwind(AssertUnwindSafe(|| run::run(&interpreted, &p)));
        let (Ok(got), Ok(want)) = (got, want) else {
            bad.push(format!("seed {seed}: a run panicked"));
            continue;
        };
        match (got, want) {
            (Ok(got), Ok(want)) => {
                compared += 1;
                for (o, (a, b)) in got.iter().zip(&want).enumerate() {
                    if (&a.shape, a.dtype) != (&b.shape, b.dtype) {
                        bad.push(format!(
                            "seed {seed} output {o}: {:?} {:?} against {:?} {:?}",
                            a.dtype, a.shape, b.dtype, b.shape
                        ));
                        continue;
                    }
                    elements += a.values.len();
                    let diff = a
                        .values
                        .iter()
                        .zip(&b.values)
                        .position(|(x, y)| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()));
                    if let Some(i) = diff {
                        bad.push(format!(
                            "seed {seed} output {o} element {i}: generated {:e}, interpreted {:e} (replay: KILN_DIFF_FIRST={seed} KILN_DIFF_PROGRAMS=2)",
                            a.values[i], b.values[i]
                        ));
                    }
                }
            }
            (Err(a), Err(b)) if a.to_string() == b.to_string() => {}
            (a, b) => bad.push(format!("seed {seed}: generated {:?}, interpreted {:?}", a.err(), b.err())),
        }
    }
    eprintln!("generated vs interpreted: {compared} of {count} programs ran, {elements} elements compared");
    assert!(bad.is_empty(), "generated and interpreted differ:\n{}", bad.join("\n"));
}
