//! Planned graphs (memory and stream tables, written by hand in the text
//! IR) on the CPU: the same results as the graph without tables, one arena
//! reused across runs, outputs never in it, bad plans refused at compile,
//! streams run concurrently and stop on the first error.

use super::{host, vals};
use crate::backends::cpu::CpuBackend;
use crate::backends::{Backend, Buffer, Executable, RngArgs};
use crate::ir::*;
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Arena reuse (`%c` takes `%a`'s bytes while `%b` is live), a view of
/// an arena value, a reshape that cannot be a view (a copy, so a value of
/// its own), an output viewing another output.
const REUSE: &str = "
plan schedule arena=128 lower-bound=128 naive=192
%x: f32[4,4] = input 0 !input !live=0..2
%y: f32[4,4] = input 1 !input !live=1..3
%a: f32[4,4] = exp %x !arena=0+64 !live=2..3
%b: f32[4,4] = mul %a, %y !arena=64+64 !live=3..7
%c: f32[4,4] = tanh %b !arena=0+64 !live=4..7
%t: f32[4,4] = permute %c perm=[1,0] !alias=%c !live=5..7
%r: f32[16] = reshape %t !output !live=6..6
%d: f32[4,4] = add %t, %b !output !live=7..9
%o: f32[4,2] = slice %d dim=1 start=1 step=2 len=2 !alias=%d !live=8..8
%e: f32[4,4] = sigmoid %d !output !live=9..9
return %e, %r, %o
";

/// Unverified: several cases are plans the verifier would refuse, to show
/// that the backend refuses them too.
fn parse(src: &str) -> Graph {
    crate::ir::text::parse_unverified(src).unwrap()
}

fn unplanned(g: &Graph) -> Graph {
    let mut g = g.clone();
    *g.tables_mut() = PlanTables::default();
    g
}

fn compile(be: &CpuBackend, g: &Graph) -> Result<Arc<dyn Executable>> {
    be.compile(Arc::new(Plan::new(g.clone())))
}

/// One buffer per input slot of `g`, filled from `seed`.
fn bind(be: &CpuBackend, g: &Graph, seed: u64) -> Vec<Buffer> {
    let mut slots: Vec<(u32, Shape, DType)> = g
        .node_ids()
        .into_iter()
        .filter_map(|id| match g.node(id).op {
            Op::Input(k) => Some((k, g.node(id).shape.clone(), g.node(id).dtype)),
            _ => None,
        })
        .collect();
    slots.sort_by_key(|s| s.0);
    slots
        .iter()
        .map(|(k, s, d)| be.upload(host(&vals(s.numel(), seed + *k as u64, -2.0, 2.0), *d), s).unwrap())
        .collect()
}

fn run(be: &CpuBackend, exe: &dyn Executable, inputs: &[Buffer]) -> Result<Vec<HostData>> {
    exe.run(inputs, &RngArgs { seed: 1, streams: vec![3, 4] })?.iter().map(|b| be.download(b)).collect()
}

/// Runs `src` with and without its tables on the same inputs; the results
/// must be bit for bit the same.
fn same_as_unplanned(src: &str, seed: u64) -> Vec<HostData> {
    let be = CpuBackend::new();
    let g = parse(src);
    assert!(!g.tables().is_empty());
    let inputs = bind(&be, &g, seed);
    let planned = run(&be, &*compile(&be, &g).unwrap(), &inputs).unwrap();
    let plain = run(&be, &*compile(&be, &unplanned(&g)).unwrap(), &inputs).unwrap();
    assert_eq!(planned, plain);
    planned
}

fn arena_of(b: &Buffer) -> Option<(usize, usize)> {
    match b {
        Buffer::Cpu(c) => c.arena_range(),
        #[allow(unreachable_patterns)]
        _ => unreachable!("the CPU backend makes CPU buffers"),
    }
}

#[test]
fn planned_graph_with_reused_bytes_matches_the_unplanned_one() {
    let out = same_as_unplanned(REUSE, 7);
    // Spot-check one element against a reference computed here.
    let (x, y) = (vals(16, 7, -2.0, 2.0), vals(16, 8, -2.0, 2.0));
    let f = |i: usize| ((x[i] as f32).exp() * y[i] as f32).tanh();
    let b = |i: usize| (x[i] as f32).exp() * y[i] as f32;
    // e[0][1] = sigmoid(c[1][0] + b[0][1]); bytes of `a` were reused by `c`.
    let d01 = f(4) + b(1);
    let want = 1.0 / (1.0 + (-d01 as f64).exp());
    assert!((out[0].to_f64_vec()[1] - want).abs() < 1e-6);
}

#[test]
fn a_second_run_allocates_only_its_outputs_and_outputs_never_live_in_the_arena() {
    let be = CpuBackend::new();
    let g = parse(REUSE);
    let exe = compile(&be, &g).unwrap();
    let stats = be.stats();
    let inputs = bind(&be, &g, 1);
    let first = exe.run(&inputs, &RngArgs::default()).unwrap();
    let first_host: Vec<HostData> = first.iter().map(|b| be.download(b).unwrap()).collect();
    assert!(first.iter().all(|b| arena_of(b).is_none()), "an output points into the arena");
    let before = stats.bytes_allocated.load(Ordering::Relaxed);
    let copies = stats.view_copies.load(Ordering::Relaxed);
    let other = bind(&be, &g, 50);
    let after_inputs = stats.bytes_allocated.load(Ordering::Relaxed);
    let second = exe.run(&other, &RngArgs::default()).unwrap();
    let grown = stats.bytes_allocated.load(Ordering::Relaxed) - after_inputs;
    // e, r (the reshape of a transpose copies) and d (o views it): no arena.
    assert_eq!(grown, 64 + 64 + 64);
    assert_eq!(after_inputs - before, 2 * 64);
    assert_eq!(stats.view_copies.load(Ordering::Relaxed), copies + 1);
    // The second run reused the arena the first wrote; the first outputs
    // are untouched.
    let again: Vec<HostData> = first.iter().map(|b| be.download(b).unwrap()).collect();
    assert_eq!(again, first_host);
    let second_host: Vec<HostData> = second.iter().map(|b| be.download(b).unwrap()).collect();
    assert_ne!(second_host, first_host);
}

#[test]
fn runs_from_several_threads_each_get_an_arena() {
    let be = CpuBackend::new();
    let g = parse(REUSE);
    let exe = compile(&be, &g).unwrap();
    let inputs = bind(&be, &g, 3);
    let want = run(&be, &*exe, &inputs).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..25 {
                    assert_eq!(run(&be, &*exe, &inputs).unwrap(), want);
                }
            });
        }
    });
}

/// The error messages of compiling `src` on the CPU backend and of
/// lowering it for CUDA (no device needed): both backends refuse the same
/// bad plans, through the same check (`backends/check.rs`).
fn compile_error(src: &str) -> String {
    compile_error_of(Plan::new(parse(src)))
}

/// [`compile_error`] of a plan.
fn compile_error_of(plan: Plan) -> String {
    let be = CpuBackend::new();
    let src = crate::ir::text::print(&plan.graph);
    let cpu = match be.compile(Arc::new(plan.clone())) {
        Err(e @ Error::Backend(_)) => e.to_string(),
        Err(e) => panic!("not a backend error: {e}"),
        Ok(_) => panic!("a bad plan compiled:\n{src}"),
    };
    let cuda = match crate::backends::cuda::lower(&plan, false) {
        Err(e @ Error::Backend(_)) => e.to_string(),
        Err(e) => panic!("not a backend error: {e}"),
        Ok(_) => panic!("a bad plan lowered for CUDA:\n{src}"),
    };
    format!("{cpu}\n    cuda: {cuda}")
}

#[test]
fn bad_arena_plans_are_refused_at_compile() {
    let cases = [
        (
            "past the end",
            REUSE.replace("%b: f32[4,4] = mul %a, %y !arena=64+64", "%b: f32[4,4] = mul %a, %y !arena=96+64"),
        ),
        (
            "misaligned",
            REUSE.replace("%b: f32[4,4] = mul %a, %y !arena=64+64", "%b: f32[4,4] = mul %a, %y !arena=62+64"),
        ),
        (
            "short",
            REUSE.replace("%b: f32[4,4] = mul %a, %y !arena=64+64", "%b: f32[4,4] = mul %a, %y !arena=64+60"),
        ),
        // `%c` written over its own operand `%b`, not recorded as in place.
        (
            "overlaps its operand",
            REUSE.replace("%c: f32[4,4] = tanh %b !arena=0+64", "%c: f32[4,4] = tanh %b !arena=64+64"),
        ),
        // An output in the arena would be overwritten by the next run.
        (
            "output in the arena",
            REUSE.replace("%e: f32[4,4] = sigmoid %d !output", "%e: f32[4,4] = sigmoid %d !arena=0+64"),
        ),
        ("no placement", REUSE.replace(" !alias=%c !live=5..7", "")),
        (
            "not a view",
            REUSE.replace("%b: f32[4,4] = mul %a, %y !arena=64+64", "%b: f32[4,4] = mul %a, %y !alias=%a"),
        ),
    ];
    let mut messages = String::new();
    for (what, src) in &cases {
        messages.push_str(&format!("{what}: {}\n", compile_error(src)));
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("cpu-bad-arena-plans", messages));
}

#[test]
fn in_place_fused_nodes_run_in_the_bytes_of_their_operand() {
    let src = "
plan schedule arena=64 lower-bound=64 naive=128
%x: f32[4,4] = input 0 !input !live=0..3
%a: f32[4,4] = exp %x !arena=0+64 !live=1..2
%b: f32[4,4] = fused %a kind=elementwise !arena=0+64 !in-place=%a !live=2..3 {
    %0: f32[4,4] = input 0
    %1: f32[4,4] = neg %0
    %2: f32[4,4] = tanh %1
    return %2
}
%c: f32[4,4] = add %b, %x !output !live=3..3
return %c
";
    same_as_unplanned(src, 11);
    let wrong = src.replace("!arena=0+64 !in-place=%a", "!arena=0+64 !in-place=%x");
    assert!(compile_error(&wrong).contains("in place"), "{}", compile_error(&wrong));
}

/// A fused node whose operands or declared type contradict its body is
/// refused when the plan is compiled (`backends/check.rs`, through
/// `ir::infer`), by both backends with the same message: the CPU backend
/// makes code for a fused body only when a run first reaches it, so
/// nothing is generated for a plan refused here, and a kernel never
/// reads memory on the strength of a type its operands do not have.
#[test]
fn fused_nodes_that_contradict_their_body_are_refused_at_compile() {
    let src = "
%x: f32[4,4] = input 0
%y: f32[4,4] = input 1
%b: f32[4,4] = fused %x, %y kind=elementwise {
    %0: f32[4,4] = input 0
    %1: f32[4,4] = input 1
    %2: f32[4,4] = mul %0, %1
    %3: f32[4,4] = tanh %2
    return %3
}
return %b
";
    // The plan itself compiles and computes its body.
    let be = CpuBackend::new();
    let inline = "
%x: f32[4,4] = input 0
%y: f32[4,4] = input 1
%m: f32[4,4] = mul %x, %y
%t: f32[4,4] = tanh %m
return %t
";
    let (g, plain) = (parse(src), parse(inline));
    let inputs = bind(&be, &g, 5);
    let fused = run(&be, &*compile(&be, &g).unwrap(), &inputs).unwrap();
    assert_eq!(fused, run(&be, &*compile(&be, &plain).unwrap(), &inputs).unwrap());
    // The text parser refuses such a node already, so each case is built
    // node by node around the same body.
    let body = g.node_ids().into_iter().map(|id| g.node(id).op.clone()).find(|op| matches!(op, Op::Fused(_)));
    let body = body.expect("the plan has a fused node");
    let f32s = |dims: &[usize]| (Shape::new(dims.to_vec()), DType::F32);
    let case = |y: (Shape, DType), declared: (Shape, DType), operands: &[usize]| {
        let mut g = Graph::new();
        let x = g.add(Op::Input(0), &[], Some(f32s(&[4, 4])), RegionId::ROOT).unwrap();
        let y = g.add(Op::Input(1), &[], Some(y), RegionId::ROOT).unwrap();
        let operands: Vec<NodeId> = operands.iter().map(|&k| [x, y][k]).collect();
        let node = Node { op: body.clone(), shape: declared.0, dtype: declared.1, region: RegionId::ROOT };
        let b = g.add_unchecked(node, &operands);
        g.set_outputs(vec![b]);
        Plan::new(g)
    };
    let cases = [
        ("an operand of another shape", case(f32s(&[16]), f32s(&[4, 4]), &[0, 1])),
        ("an operand of another dtype", case((Shape::new([4, 4]), DType::F64), f32s(&[4, 4]), &[0, 1])),
        ("declared other than its body's output", case(f32s(&[4, 4]), f32s(&[16]), &[0, 1])),
        ("an operand short", case(f32s(&[4, 4]), f32s(&[4, 4]), &[0])),
        ("an operand over", case(f32s(&[4, 4]), f32s(&[4, 4]), &[0, 1, 0])),
    ];
    let mut messages = String::new();
    for (what, plan) in cases {
        messages.push_str(&format!("{what}: {}\n", compile_error_of(plan)));
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("cpu-bad-fused-plans", messages));
}

/// A diamond over two streams: `%a` on stream 0 and `%b -> %c` on stream
/// 1 run at once; `%d` joins them.
const DIAMOND: &str = "
plan schedule streams=2 arena=786432 lower-bound=786432 naive=786432
%x: f32[256,256] = input 0 !stream=0 !record=e0 !input !live=0..3
%a: f32[256,256] = matmul %x, %x !stream=0 !arena=0+262144 !live=1..4
%b: f32[256,256] = tanh %x !stream=1 !wait=e0 !arena=262144+262144 !live=2..3
%c: f32[256,256] = matmul %b, %x !stream=1 !record=e1 !arena=524288+262144 !live=3..4
%d: f32[256,256] = add %a, %c !stream=0 !wait=e1 !output !live=4..4
return %d
";

#[test]
fn two_streams_give_the_results_of_one() {
    for _ in 0..5 {
        same_as_unplanned(DIAMOND, 5);
    }
    // Streams without a memory table.
    let no_memory = "
plan schedule streams=2
%x: f32[64,64] = input 0 !stream=0 !record=e0
%y: f32[64,64] = input 1 !stream=1
%a: f32[64,64] = exp %x !stream=0
%b: f32[64,64] = matmul %y, %x !stream=1 !wait=e0
%c: f32[64,64] = tanh %b !stream=1 !record=e1
%d: f32[64,64] = sub %a, %x !stream=0 !record=e2
%e: f32[64,64] = add %d, %c !stream=0 !wait=e1
%f: f32[64,64] = mul %c, %d !stream=1 !wait=e2
return %e, %f
";
    for seed in 0..5 {
        same_as_unplanned(no_memory, seed);
    }
}

#[test]
fn an_error_on_one_stream_is_returned_without_hanging() {
    let src = "
plan schedule streams=2
%x: f32[4,4] = input 0 !stream=0
%i: i64[4,4] = input 1 !stream=0 !record=e0
%g: f32[4,4] = gather %x, %i dim=1 !stream=1 !wait=e0 !record=e1
%a: f32[4,4] = exp %x !stream=0
%c: f32[4,4] = add %a, %g !stream=0 !wait=e1
return %c
";
    let be = CpuBackend::new();
    let g = parse(src);
    let exe = compile(&be, &g).unwrap();
    let x = be.upload(HostData::F32(vec![1.0; 16]), &Shape::new([4, 4])).unwrap();
    let mut idx = vec![0i64; 16];
    idx[5] = 9;
    let i = be.upload(HostData::I64(idx), &Shape::new([4, 4])).unwrap();
    for _ in 0..10 {
        let e = exe.run(&[x.clone(), i.clone()], &RngArgs::default()).err().map(|e| e.to_string());
        let e = e.expect("an out-of-range index must be an error");
        assert!(e.contains("gather index 9 is out of range for dim 1 of size 4"), "{e}");
    }
    let ok = be.upload(HostData::I64(vec![3; 16]), &Shape::new([4, 4])).unwrap();
    let out = be.download(&exe.run(&[x, ok], &RngArgs::default()).unwrap()[0]).unwrap();
    // Within an ulp, not equal: under miri, `f32::exp` itself is perturbed
    // by a few ulps on purpose (miri's float non-determinism).
    let HostData::F32(out) = out else { panic!("f32 output, got {out:?}") };
    let want = 1f64.exp() + 1.0;
    assert!(out.iter().all(|&v| ((v as f64) - want).abs() <= 4.0 * f32::EPSILON as f64 * want), "{out:?}");
}

#[test]
fn stream_plans_that_could_deadlock_or_race_are_refused() {
    // `%b` reads `%a` of stream 0 with no event between them.
    let unordered = "
plan schedule streams=2
%x: f32[4] = input 0 !stream=0
%a: f32[4] = exp %x !stream=0
%b: f32[4] = neg %a !stream=1
%c: f32[4] = add %a, %b !stream=0
return %c
";
    let off_plan = unordered.replace("%b: f32[4] = neg %a !stream=1", "%b: f32[4] = neg %a !stream=3");
    let messages =
        format!("unordered: {}\noff the plan: {}\n", compile_error(unordered), compile_error(&off_plan));
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("cpu-bad-stream-plans", messages));
}

#[test]
fn plans_that_overwrite_bytes_still_to_be_read_are_refused() {
    // One stream: `%c` takes `%a`'s bytes, but `%d` reads `%a` after it.
    let war = "
plan schedule arena=128 lower-bound=128 naive=192
%x: f32[4] = input 0 !input !live=0..2
%a: f32[4] = exp %x !arena=0+16 !live=1..4
%b: f32[4] = neg %x !arena=64+16 !live=2..3
%c: f32[4] = tanh %b !arena=0+16 !live=3..4
%d: f32[4] = add %a, %c !output !live=4..4
return %d
";
    // Two streams: `%b` shares `%a`'s bytes while both may run at once.
    let race = DIAMOND.replace("!arena=262144+262144", "!arena=0+262144");
    let messages = format!("write after read: {}\nrace: {}\n", compile_error(war), compile_error(&race));
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("cpu-overlapping-plans", messages));
}
