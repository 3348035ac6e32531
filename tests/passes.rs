//! Pass snapshot tests: every `tests/passes/<pass>/*.kir` case is run
//! through its pass; the snapshot in `snapshots/` holds the graph before,
//! after and the unified diff (what a reviewer reads). Each case also runs
//! before and after on the CPU backend with seeded pseudo-random inputs and
//! the outputs must agree within the dtype's tolerance (exactly for
//! integers and bools). Re-bless with `cargo insta review`.

use kiln::backends::cpu::CpuBackend;
use kiln::backends::{Backend, Buffer, RngArgs};
use kiln::ir::text::{parse_test_file, print};
use kiln::ir::{verify, DType, Graph, HostData, Op, Plan, RegionAutocast, Shape};
use kiln::passes::{
    optimize, optimize_plan, pass_names, run_single, split_prologue, Optimized, PassOptions, PipelineConfig,
};
use splitmix::Rng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
#[path = "support/splitmix.rs"]
mod splitmix;

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
pass_test!(simplify, "simplify");
pass_test!(narrow, "narrow");
pass_test!(attention_layout, "attention-layout");
pass_test!(merge_matmuls, "merge-matmuls");
pass_test!(dce, "dce");
pass_test!(remat, "remat");
pass_test!(fusion, "fusion");
pass_test!(assign, "assign");
pass_test!(multi_output, "multi-output");
pass_test!(schedule, "schedule");
pass_test!(horizontal, "horizontal");
pass_test!(streams, "streams");
pass_test!(memory, "memory");
pass_test!(autodiff, "autodiff");
pass_test!(autocast, "autocast");
pass_test!(attention_grad, "attention-grad");

/// `weight-prologue` acts only on the stable input slots a context gives
/// it, so its cases name them (`test weight-prologue stable=1,2`) and
/// their snapshots hold the prologue too. Each case also runs on the CPU:
/// the plan fed the prologue's outputs computes what the input did.
#[test]
fn weight_prologue() {
    settings().bind(|| {
        insta::glob!("passes/weight-prologue", "*.kir", |path| {
            insta::assert_snapshot!(check_prologue_case(path));
        });
    });
}

/// The stable slots a case's `stable=` setting names, as a mask over
/// every input slot of its graph; the other settings.
fn stable_setting(graph: &Graph, settings: &[String]) -> (Vec<bool>, Vec<String>) {
    let count = graph
        .node_ids()
        .iter()
        .filter_map(|&id| match graph.node(id).op {
            Op::Input(k) => Some(k as usize + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let mut stable = vec![false; count];
    let mut rest = Vec::new();
    for s in settings {
        match s.strip_prefix("stable=") {
            Some(list) => {
                for k in list.split(',') {
                    let k: usize = k.parse().unwrap_or_else(|_| panic!("stable slot `{k}`"));
                    stable[k] = true;
                }
            }
            None => rest.push(s.clone()),
        }
    }
    (stable, rest)
}

fn check_prologue_case(path: &Path) -> String {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let case = parse_test_file(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(case.pass, "weight-prologue", "{}: the header names another pass", path.display());
    let (stable, _) = stable_setting(&case.graph, &case.settings);
    let split =
        split_prologue(case.graph.clone(), &stable).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    check_split_values(path, &case.graph, &split, true);
    let (before, after) = (print(&case.graph), print(&split.graph));
    let prologue = match &split.prologue {
        Some(p) => format!(
            ";; prologue: reads inputs {:?}, returns inputs {}..\n{}",
            p.reads,
            p.kept_from,
            print(&p.graph)
        ),
        None => "(no prologue)\n".to_string(),
    };
    snapshot_text(&case.comment, "", &before, &after, &prologue)
}

/// Runs `split` (the prologue, then the plan on the inputs and the
/// prologue's outputs) and the unsplit graph on the CPU from the same
/// seeded inputs: the outputs must be equal, bit for bit when `exact` (the
/// pass alone: the same nodes compute the same values), else within the
/// dtype's tolerance (the whole pipeline fuses them).
fn check_split_values(path: &Path, before: &Graph, split: &Optimized, exact: bool) {
    let backend = solo_backend();
    let mut rng = Rng(seed_of(path));
    let mut slots: BTreeMap<u32, (Shape, DType)> = BTreeMap::new();
    for id in before.node_ids() {
        if let Op::Input(k) = before.node(id).op {
            slots.insert(k, (before.node(id).shape.clone(), before.node(id).dtype));
        }
    }
    let count = slots.keys().next_back().map_or(0, |&k| k as usize + 1);
    let mut inputs: Vec<Buffer> = (0..count as u32)
        .map(|k| {
            let (shape, dtype) = slots.get(&k).cloned().unwrap_or((Shape::new([1]), DType::F32));
            backend.upload(random_data(&mut rng, &shape, dtype), &shape).expect("upload")
        })
        .collect();
    let want = run_on_cpu(&backend, before, &inputs).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if let Some(p) = &split.prologue {
        assert_eq!(p.kept_from as usize, count, "{}: kept values follow every slot", path.display());
        let read: Vec<Buffer> = p.reads.iter().map(|&k| inputs[k as usize].clone()).collect();
        let exe =
            backend.compile(Arc::new(Plan::new(p.graph.clone()).binding(read.len()))).expect("prologue");
        inputs.extend(
            exe.run(&read, &RngArgs::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        );
    }
    let got =
        run_on_cpu(&backend, &split.graph, &inputs).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(want.len(), got.len(), "{}: output count", path.display());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.dtype(), g.dtype(), "{}: output {i} dtype", path.display());
        let (w, g) = (w.to_f64_vec(), g.to_f64_vec());
        let tol = if exact { 0.0 } else { 1e-5 };
        let same = w.iter().zip(&g).all(|(a, b)| {
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * (1.0 + b.abs())
        });
        assert!(same && w.len() == g.len(), "{}: output {i}: {w:?} against {g:?}", path.display());
    }
}

/// Runs one case: parse, run the pass, compare on the CPU, and return the
/// snapshot text.
fn check_case(pass: &str, path: &Path) -> String {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let case = parse_test_file(&src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(case.pass, pass, "{}: the header names another pass than its directory", path.display());
    verify(&case.graph).unwrap_or_else(|e| panic!("{}: input does not verify: {e}", path.display()));
    let before = print(&case.graph);
    let options =
        PassOptions::from_settings(&case.settings).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after_graph =
        run_single(pass, case.graph.clone(), options).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = print(&after_graph);
    if pass == "autodiff" {
        check_gradients(path, &case.graph, &after_graph);
    } else if let Some(low) = options.autocast.or_else(|| region_low(&case.graph)) {
        check_close_in(path, &case.graph, &after_graph, low);
    } else {
        check_same_values(path, &case.graph, &after_graph);
    }

    let counts = format!(";; nodes (dead included): {} -> {}\n", case.graph.len(), after_graph.len());
    snapshot_text(&case.comment, &counts, &before, &after, "")
}

/// A case's snapshot: its comment, `head`, the graph before and after,
/// `extra` (what else the pass made), and the unified diff.
fn snapshot_text(comment: &str, head: &str, before: &str, after: &str, extra: &str) -> String {
    let diff = if before == after {
        "(no change)\n".to_string()
    } else {
        let diff = similar::TextDiff::from_lines(before, after);
        diff.unified_diff().context_radius(3).header("before", "after").to_string()
    };
    let mut out = String::new();
    for line in comment.lines() {
        out.push_str(&format!(";; {line}\n").replace(";; \n", ";;\n"));
    }
    out.push_str(&format!("{head};; before\n{before};; after\n{after}{extra};; diff\n{diff}"));
    out
}

/// The low type a region of the graph sets for itself, if any (a case
/// whose autocast is per region).
fn region_low(graph: &Graph) -> Option<DType> {
    graph.regions().iter().find_map(|r| match r.autocast {
        RegionAutocast::Low(d) => Some(d),
        _ => None,
    })
}

/// The draws only this file needs.
impl Rng {
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
}

/// Seeded data for one input: floats normal, integers in a small range,
/// bools random; never all zeros.
fn random_data(rng: &mut Rng, shape: &Shape, dtype: DType) -> HostData {
    let n = shape.numel();
    let mut floats: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
    let mut ints: Vec<i64> = match dtype {
        DType::U8 => (0..n).map(|_| rng.int(0, 7)).collect(),
        DType::Bool => (0..n).map(|_| rng.int(0, 1)).collect(),
        _ => (0..n).map(|_| rng.int(-4, 4)).collect(),
    };
    if let Some(first) = ints.first_mut() {
        if *first == 0 {
            *first = 1;
        }
    }
    if let Some(first) = floats.first_mut() {
        if *first == 0.0 {
            *first = 0.5;
        }
    }
    match dtype {
        DType::F16 => HostData::F16(floats.iter().map(|&v| half::f16::from_f64(v)).collect()),
        DType::BF16 => HostData::BF16(floats.iter().map(|&v| half::bf16::from_f64(v)).collect()),
        DType::F32 => HostData::F32(floats.iter().map(|&v| v as f32).collect()),
        DType::F64 => HostData::F64(floats),
        DType::U8 => HostData::U8(ints.iter().map(|&v| v as u8).collect()),
        DType::I32 => HostData::I32(ints.iter().map(|&v| v as i32).collect()),
        DType::I64 => HostData::I64(ints),
        DType::Bool => HostData::Bool(ints.iter().map(|&v| v != 0).collect()),
    }
}

fn seed_of(path: &Path) -> u64 {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn run_on_cpu(backend: &CpuBackend, graph: &Graph, inputs: &[Buffer]) -> kiln::Result<Vec<HostData>> {
    let plan = Plan::new(graph.clone());
    let (n_inputs, n_streams) = (plan.inputs, plan.random_streams);
    let exe = backend.compile(Arc::new(plan))?;
    let rng = RngArgs { seed: 0x5eed, streams: (0..n_streams as u64).map(|k| 1000 + k).collect() };
    let outs = exe.run(&inputs[..n_inputs.min(inputs.len())], &rng)?;
    outs.iter().map(|b| backend.download(b)).collect()
}

/// Runs both graphs on the CPU with the same inputs and random streams and
/// asserts equal outputs within the dtype's tolerance.
fn check_same_values(path: &Path, before: &Graph, after: &Graph) {
    let (want, got) = run_both(path, before, after);
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let (atol, rtol) = match w.dtype() {
            DType::F16 => (1e-3, 1e-2),
            DType::BF16 => (1e-2, 2e-2),
            DType::F32 => (1e-6, 1e-5),
            DType::F64 => (1e-12, 1e-10),
            _ => (0.0, 0.0),
        };
        for (j, (a, b)) in w.to_f64_vec().into_iter().zip(g.to_f64_vec()).enumerate() {
            let same = a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= atol + rtol * b.abs();
            assert!(same, "{}: output {i} element {j}: before {a}, after {b}", path.display());
        }
    }
}

/// As [`check_same_values`] for a rewrite into the low type `low`: every
/// output keeps its dtype, and each element is within a few roundings of
/// `low` of the f32 result, measured against the output's largest
/// magnitude (a product's error scales with its operands, not with the
/// one element).
fn check_close_in(path: &Path, before: &Graph, after: &Graph, low: DType) {
    let (want, got) = run_both(path, before, after);
    let tol = if low == DType::BF16 { 1.0 / 32.0 } else { 1.0 / 256.0 };
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let w = w.to_f64_vec();
        let scale = 1.0 + w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (j, (a, b)) in w.iter().zip(g.to_f64_vec()).enumerate() {
            assert!(
                (a - b).abs() <= tol * scale,
                "{}: output {i} element {j}: f32 {a}, under autocast {low} {b} (tolerance {})",
                path.display(),
                tol * scale
            );
        }
    }
}

/// A CPU backend that is rank 0 of a group of one, so that cases with
/// collectives run (each is the identity there).
fn solo_backend() -> CpuBackend {
    let backend = CpuBackend::new();
    backend.join_group(kiln::dist::Joining::solo()).expect("a fresh backend joins");
    backend
}

/// Both graphs' outputs on the CPU, from the same seeded inputs, after
/// checking they agree in number, dtype and length.
fn run_both(path: &Path, before: &Graph, after: &Graph) -> (Vec<HostData>, Vec<HostData>) {
    let backend = solo_backend();
    let mut rng = Rng(seed_of(path));
    // Every input slot of the original graph, dead ones included.
    let mut slots: BTreeMap<u32, (Shape, DType)> = BTreeMap::new();
    for id in before.node_ids() {
        let node = before.node(id);
        if let Op::Input(k) = node.op {
            slots.insert(k, (node.shape.clone(), node.dtype));
        }
    }
    let count = slots.keys().next_back().map_or(0, |&k| k as usize + 1);
    let inputs: Vec<Buffer> = (0..count as u32)
        .map(|k| {
            let (shape, dtype) = slots.get(&k).cloned().unwrap_or((Shape::new([1]), DType::F32));
            let data = random_data(&mut rng, &shape, dtype);
            backend.upload(data, &shape).unwrap_or_else(|e| panic!("{}: upload: {e}", path.display()))
        })
        .collect();
    let want = run_on_cpu(&backend, before, &inputs)
        .unwrap_or_else(|e| panic!("{}: running the input graph: {e}", path.display()));
    let got = run_on_cpu(&backend, after, &inputs)
        .unwrap_or_else(|e| panic!("{}: running the transformed graph: {e}", path.display()));
    assert_eq!(want.len(), got.len(), "{}: output count", path.display());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.dtype(), g.dtype(), "{}: output {i} dtype", path.display());
        assert_eq!(w.len(), g.len(), "{}: output {i} length", path.display());
    }
    (want, got)
}

/// Autodiff appends one gradient per float input slot to the outputs:
/// the first output (the loss) must be unchanged, and each gradient must
/// match central finite differences of the input graph's loss (f64 cases,
/// PyTorch's gradcheck tolerances).
fn check_gradients(path: &Path, before: &Graph, after: &Graph) {
    let backend = solo_backend();
    let mut rng = Rng(seed_of(path));
    let mut slots: BTreeMap<u32, (Shape, DType)> = BTreeMap::new();
    for id in before.node_ids() {
        let node = before.node(id);
        if let Op::Input(k) = node.op {
            slots.insert(k, (node.shape.clone(), node.dtype));
        }
    }
    let mut data: Vec<HostData> = slots.values().map(|(s, d)| random_data(&mut rng, s, *d)).collect();
    let upload = |data: &[HostData]| -> Vec<Buffer> {
        data.iter().zip(slots.values()).map(|(d, (s, _))| backend.upload(d.clone(), s).unwrap()).collect()
    };
    let loss = |data: &[HostData]| -> f64 {
        run_on_cpu(&backend, before, &upload(data)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))[0]
            .to_f64_vec()[0]
    };
    let outs =
        run_on_cpu(&backend, after, &upload(&data)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(outs[0].to_f64_vec()[0], loss(&data), "{}: the loss changed", path.display());
    let floats: Vec<usize> =
        slots.values().enumerate().filter(|(_, (_, d))| d.is_float()).map(|(i, _)| i).collect();
    assert_eq!(outs.len(), 1 + floats.len(), "{}: one gradient per float input", path.display());
    let h = 1e-6;
    for (&slot, grad) in floats.iter().zip(&outs[1..]) {
        let HostData::F64(values) = data[slot].clone() else {
            panic!("{}: autodiff cases use f64 inputs, so gradients can be checked", path.display())
        };
        for (j, &got) in grad.to_f64_vec().iter().enumerate() {
            let mut probe = values.clone();
            probe[j] = values[j] + h;
            data[slot] = HostData::F64(probe.clone());
            let up = loss(&data);
            probe[j] = values[j] - h;
            data[slot] = HostData::F64(probe);
            let down = loss(&data);
            data[slot] = HostData::F64(values.clone());
            let numeric = (up - down) / (2.0 * h);
            assert!(
                (got - numeric).abs() <= 1e-5 + 1e-3 * numeric.abs(),
                "{}: input {slot} element {j}: autodiff {got}, finite differences {numeric}",
                path.display()
            );
        }
    }
}

#[test]
fn unknown_pass_in_config_lists_the_valid_names() {
    let err = PipelineConfig::new(Some("-cse,-bogus"), None).unwrap_err();
    settings().bind(|| insta::assert_snapshot!("config-unknown-pass", err.to_string()));
    let err = PipelineConfig::new(Some("cse"), None).unwrap_err();
    settings().bind(|| insta::assert_snapshot!("config-unsigned-toggle", err.to_string()));
    let err = kiln::passes::run_single("bogus", Graph::new(), PassOptions::default()).unwrap_err();
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
    assert_eq!(out.phase(), kiln::ir::Phase::Planned);
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
        [
            "00-input.kir",
            "03-view-fold.kir",
            "04-constant-fold.kir",
            "05-cse.kir",
            "06-simplify.kir",
            // 01 is `autocast` and 02 `attention-grad`, which apply only to
            // graphs with autocast and attention gradients; 07 is `narrow`,
            // which applies only to graphs with slices, 08
            // `attention-layout`, only to attentions whose heads are merged,
            // and 09 `merge-matmuls`, only to f16 and bf16 products.
            "10-dce.kir",
            // 11 is `weight-prologue`, which applies only to a context's
            // plans that read variables.
            "12-remat.kir",
            "13-fusion.kir",
            // 14 is `assign`, which applies only to graphs with assignments,
            // and 15 `multi-output`, only to fused elementwise nodes that
            // read another of their shape.
            "16-schedule.kir",
            "17-horizontal.kir",
            "18-streams.kir",
            "19-memory.kir"
        ]
    );
    let mut dumps = String::new();
    for f in &files {
        dumps.push_str(&format!("== {f}\n{}", std::fs::read_to_string(hash_dir.join(f)).unwrap()));
    }
    let _ = std::fs::remove_dir_all(&dir);
    settings().bind(|| insta::assert_snapshot!("pipeline-dumps", dumps));

    // A pass switched off writes no dump and does not run. (Simplify is
    // off too: its e-graph merges equal nodes as CSE does.)
    let config = PipelineConfig::new(Some("-cse,-simplify"), None).unwrap();
    let out = optimize(kiln::ir::text::parse(src).unwrap(), &config).unwrap();
    assert_eq!(print(&out).matches("= mul").count(), 2, "cse ran although switched off");
}

/// Under autocast the pipeline runs the autocast pass first, and its dump
/// opens with the policy it applied (one line, from the policy table)
/// and what it changed.
#[test]
fn autocast_dump_prints_the_policy() {
    let src = "%x: f32[4,3] = input 0\n\
               %w: f32[3,2] = input 1\n\
               %y: f32[4,2] = matmul %x, %w\n\
               %s: f32[] = sum %y dims=[0,1]\n\
               return %s\n";
    let dir = std::env::temp_dir().join(format!("kiln-autocast-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = PipelineConfig::new(None, Some(dir.clone())).unwrap();
    config.options.autocast = Some(DType::BF16);
    optimize(kiln::ir::text::parse(src).unwrap(), &config).unwrap();
    let hash_dir = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
    let dump = std::fs::read_to_string(hash_dir.join("01-autocast.kir")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    settings().bind(|| insta::assert_snapshot!("autocast-dump", dump));
}

/// Every case through the whole pipeline: the result verifies, is
/// fused, and computes what the input did (an autocast case: within its
/// low type's rounding).
#[test]
fn whole_pipeline_keeps_every_case_meaning() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/passes");
    let mut files: Vec<PathBuf> = Vec::new();
    for pass in pass_names() {
        let Ok(entries) = std::fs::read_dir(root.join(pass)) else { continue };
        files
            .extend(entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "kir")));
    }
    files.sort();
    assert!(files.len() >= 12, "found only {files:?}");
    for path in &files {
        let case = parse_test_file(&std::fs::read_to_string(path).unwrap()).unwrap();
        // An autocast case runs with its low type, so fusion and planning
        // see the casts it adds (other settings are the pass's own).
        let low = PassOptions::from_settings(&case.settings).ok().and_then(|o| o.autocast);
        // A region's own setting runs whatever the options say.
        let compare_low = low.or_else(|| region_low(&case.graph));
        let mut config = PipelineConfig::default();
        config.options.autocast = low;
        if case.pass == "weight-prologue" {
            // Split as a context's plan would be, then fused and planned.
            let (stable, _) = stable_setting(&case.graph, &case.settings);
            let (split, _) = optimize_plan(case.graph.clone(), &config, &stable, false)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for g in std::iter::once(&split.graph).chain(split.prologue.as_ref().map(|p| &p.graph)) {
                verify(g).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert_eq!(g.phase(), kiln::ir::Phase::Planned);
            }
            check_split_values(path, &case.graph, &split, false);
            continue;
        }
        let out = optimize(case.graph.clone(), &config).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        verify(&out).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(out.phase(), kiln::ir::Phase::Planned);
        match compare_low {
            Some(low) => check_close_in(path, &case.graph, &out, low),
            None => check_same_values(path, &case.graph, &out),
        }
    }
}
