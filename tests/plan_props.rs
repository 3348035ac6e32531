//! Planning post-conditions on random graphs, and golden messages of the
//! plan checker.
//!
//! `plans_hold_on_random_dags` builds 1,000 random DAGs (elementwise unary
//! and binary ops with broadcasts, views, reductions, matmul, hand-built
//! fused elementwise nodes, several outputs, f32 with some f64), runs the
//! whole pipeline on 1, 2 and 3 streams, and checks: `ir::verify` (which
//! runs the plan checks); on its own, pair by pair, that no two arena
//! values share a byte unless every reader of the first happens before the
//! second is written (or the second is computed in place of the first);
//! and that the planned graph computes what the input did on the CPU.
//! The first 100 graphs also run, planned, on the CUDA backend when a GPU
//! is there (and on the CUDA emulator with `KILN_TEST_EMULATE=1`), against
//! the CPU's values.

use kiln::backends::cpu::CpuBackend;
use kiln::backends::{Backend, RngArgs};
use kiln::ir::text::parse;
use kiln::ir::{
    verify, BinaryOp, DType, FusedBody, Graph, HostData, NodeId, Op, Placement, Plan, ReduceOp, RegionId,
    Shape, UnaryOp,
};
use kiln::passes::{optimize, PipelineConfig};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// One step of a random graph: an op kind and two picks (of operands and
/// variants), interpreted against the nodes built so far.
type Step = (u8, u16, u16);

const UNARY: [UnaryOp; 6] =
    [UnaryOp::Tanh, UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Sigmoid, UnaryOp::Sin];
const BINARY: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub, BinaryOp::Maximum];

fn add(g: &mut Graph, op: Op, operands: &[NodeId]) -> Option<NodeId> {
    g.add(op, operands, None, RegionId::ROOT).ok()
}

/// A fused elementwise node: `f(input 0 [, input 1])` in a small body.
fn fused(g: &mut Graph, a: NodeId, b: Option<NodeId>, pick: u16) -> Option<NodeId> {
    let (shape, dtype) = (g.node(a).shape.clone(), g.node(a).dtype);
    let mut body = Graph::new();
    let i0 = body.add(Op::Input(0), &[], Some((shape.clone(), dtype)), RegionId::ROOT).ok()?;
    let mut cur =
        body.add(Op::Unary(UNARY[pick as usize % UNARY.len()]), &[i0], None, RegionId::ROOT).ok()?;
    if b.is_some() {
        let i1 = body.add(Op::Input(1), &[], Some((shape, dtype)), RegionId::ROOT).ok()?;
        cur = body
            .add(Op::Binary(BINARY[pick as usize % BINARY.len()]), &[cur, i1], None, RegionId::ROOT)
            .ok()?;
    }
    body.set_outputs(vec![cur]);
    let body = FusedBody::new(body).ok()?;
    let operands: Vec<NodeId> = std::iter::once(a).chain(b).collect();
    add(g, Op::Fused(Arc::new(body)), &operands)
}

/// Builds a graph from the steps; steps that do not fit are skipped.
fn build(inputs: &[u8], steps: &[Step], outputs: &[u16]) -> Graph {
    let shapes = [vec![4, 3], vec![3], vec![4, 1], vec![2, 4, 3], vec![3, 4]];
    let mut g = Graph::new();
    let mut pool: Vec<NodeId> = Vec::new();
    for (k, &s) in inputs.iter().enumerate() {
        let shape = Shape::new(shapes[s as usize % shapes.len()].clone());
        let dtype = if s % 7 == 6 { DType::F64 } else { DType::F32 };
        pool.push(g.add(Op::Input(k as u32), &[], Some((shape, dtype)), RegionId::ROOT).unwrap());
    }
    for &(kind, p, q) in steps {
        let a = pool[p as usize % pool.len()];
        let b = pool[q as usize % pool.len()];
        let (sa, sb) = (g.node(a).shape.clone(), g.node(b).shape.clone());
        let rank = sa.rank();
        let made = match kind % 9 {
            0 => add(&mut g, Op::Unary(UNARY[q as usize % UNARY.len()]), &[a]),
            1 | 2 => {
                // Broadcast b to a (or a to b) when one fits the other.
                let (x, y) = if sb.broadcasts_to(&sa) { (a, b) } else { (b, a) };
                let target = g.node(x).shape.clone();
                let y = if g.node(y).shape == target {
                    Some(y)
                } else if g.node(y).shape.broadcasts_to(&target) {
                    add(&mut g, Op::Expand(target), &[y])
                } else {
                    None
                };
                y.and_then(|y| add(&mut g, Op::Binary(BINARY[p as usize % BINARY.len()]), &[x, y]))
            }
            3 => match q % 3 {
                0 if rank >= 2 => add(&mut g, Op::Permute((0..rank).rev().collect()), &[a]),
                1 => add(&mut g, Op::Reshape(Shape::new([sa.numel()])), &[a]),
                _ if rank >= 1 && sa.0[0] >= 2 => {
                    let len = sa.0[0] / 2;
                    add(&mut g, Op::Slice { dim: 0, start: (q as usize) % 2, step: 1, len }, &[a])
                }
                _ => None,
            },
            4 if rank >= 1 => {
                let op = if q % 2 == 0 { ReduceOp::Sum } else { ReduceOp::Max };
                add(&mut g, Op::Reduce { op, dims: vec![rank - 1], keepdim: q % 3 != 0, into: None }, &[a])
            }
            5 if rank == 2 => {
                let t = add(&mut g, Op::Permute(vec![1, 0]), &[a]);
                t.and_then(|t| add(&mut g, Op::MatMul, &[a, t]))
            }
            6 | 7 => {
                let same = sb == sa && g.node(a).dtype == g.node(b).dtype && kind % 9 == 7;
                fused(&mut g, a, same.then_some(b), q)
            }
            8 if g.node(a).dtype == DType::F32 => add(&mut g, Op::Cast(DType::F64), &[a]),
            _ => None,
        };
        if let Some(id) = made {
            pool.push(id);
        }
    }
    let mut outs: Vec<NodeId> = vec![*pool.last().unwrap()];
    for &o in outputs {
        let id = pool[o as usize % pool.len()];
        if !outs.contains(&id) {
            outs.push(id);
        }
    }
    g.set_outputs(outs);
    g
}

/// Happens-before from the stream plan alone: stream order and events,
/// closed transitively (fine for the few dozen nodes here).
fn happens_before(g: &Graph) -> (HashMap<NodeId, usize>, Vec<Vec<bool>>) {
    let schedule = g.tables().schedule.clone().unwrap();
    let step: HashMap<NodeId, usize> = schedule.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let n = schedule.len();
    let streams = g.tables().streams.as_ref().unwrap();
    let mut hb = vec![vec![false; n]; n];
    let mut last: BTreeMap<u32, usize> = BTreeMap::new();
    for (t, id) in schedule.iter().enumerate() {
        let s = streams.stream_of[id].0;
        if let Some(&p) = last.get(&s) {
            hb[p][t] = true;
        }
        last.insert(s, t);
    }
    for e in &streams.events {
        for w in &e.waiters {
            hb[step[&e.after]][step[w]] = true;
        }
    }
    // Edges go forward in the schedule: one pass in reverse closes them.
    for a in (0..n).rev() {
        for b in a + 1..n {
            if hb[a][b] {
                let row = hb[b].clone();
                for (c, &r) in row.iter().enumerate() {
                    hb[a][c] |= r;
                }
            }
        }
    }
    (step, hb)
}

/// No two arena values share a byte unless all readers of the earlier one
/// (readers of its aliases included) happen before the later one, or the
/// later one is computed in place of the earlier one. A launch group's
/// members may run at once, after every member's waits (both backends
/// launch a group after the waits of all its members): before a member
/// means before the group's last member, and another member never is.
fn check_no_overlap(g: &Graph) -> Result<(), String> {
    let memory = g.tables().memory.as_ref().ok_or("no memory plan")?;
    let (step, hb) = happens_before(g);
    let mut span: HashMap<usize, (usize, usize)> = HashMap::new();
    for group in &g.tables().groups {
        let first = group.members.iter().map(|m| step[m]).min().ok_or("an empty launch group")?;
        let last = group.members.iter().map(|m| step[m]).max().ok_or("an empty launch group")?;
        for m in &group.members {
            span.insert(step[m], (first, last));
        }
    }
    let span = |t: usize| span.get(&t).copied().unwrap_or((t, t));
    let root = |id: NodeId| match memory.values[&id].placement {
        Placement::Alias(r) => r,
        _ => id,
    };
    let mut readers: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for (&id, &t) in &step {
        for o in g.operands(id) {
            readers.entry(root(o)).or_default().push(t);
        }
    }
    let arena: Vec<(NodeId, u64, u64, Option<NodeId>)> = memory
        .values
        .iter()
        .filter_map(|(&id, v)| match v.placement {
            Placement::Arena { offset, bytes, in_place_of } if bytes > 0 => {
                Some((id, offset, bytes, in_place_of))
            }
            _ => None,
        })
        .collect();
    for &(a, ao, ab, _) in &arena {
        for &(b, bo, bb, b_in_place) in &arena {
            let (ta, tb) = (step[&a], step[&b]);
            if ta >= tb || ao + ab <= bo || bo + bb <= ao {
                continue;
            }
            let a_readers = readers.get(&a).cloned().unwrap_or_default();
            let in_place = b_in_place == Some(a);
            let unordered = |r: usize| {
                if r == tb {
                    return !in_place;
                }
                span(r) == span(tb) || !hb[r][span(tb).1]
            };
            if let Some(&r) = a_readers.iter().chain([ta].iter()).find(|&&r| unordered(r)) {
                return Err(format!(
                    "{a} and {b} share bytes, but step {r} (a reader of {a}) is not ordered before {b}"
                ));
            }
        }
    }
    if memory.lower_bound > memory.arena_bytes {
        return Err(format!("lower bound {} above the arena {}", memory.lower_bound, memory.arena_bytes));
    }
    Ok(())
}

fn data(shape: &Shape, dtype: DType, seed: u64) -> HostData {
    let v: Vec<f64> =
        (0..shape.numel()).map(|i| ((i as u64 * 7 + seed * 13) % 17) as f64 / 8.0 - 1.0).collect();
    match dtype {
        DType::F64 => HostData::F64(v),
        _ => HostData::F32(v.iter().map(|&x| x as f32).collect()),
    }
}

fn run(backend: &dyn Backend, g: &Graph) -> Vec<Vec<f64>> {
    let mut slots: BTreeMap<u32, (Shape, DType)> = BTreeMap::new();
    // The live inputs: a dead `input k` may have another shape.
    for id in g.topo_order() {
        if let Op::Input(k) = g.node(id).op {
            slots.insert(k, (g.node(id).shape.clone(), g.node(id).dtype));
        }
    }
    let plan = Plan::new(g.clone());
    let inputs: Vec<_> = (0..plan.inputs as u32)
        .map(|k| {
            let (shape, dtype) = slots.get(&k).cloned().unwrap_or((Shape::new([1]), DType::F32));
            backend.upload(data(&shape, dtype, k as u64), &shape).unwrap()
        })
        .collect();
    let exe = backend.compile(Arc::new(plan)).unwrap();
    let outs = exe.run(&inputs, &RngArgs { seed: 1, streams: vec![] }).unwrap();
    outs.iter().map(|b| backend.download(b).unwrap().to_f64_vec()).collect()
}

/// Totals over the one-stream cases, printed every 500 cases: the numbers
/// the memory pass's header quotes. Cases, arena, lower bound, naive, then
/// from the dump note: greedy-by-size total, first-fit total, cases where
/// first fit was strictly smaller.
static TOTALS: Mutex<[u64; 7]> = Mutex::new([0; 7]);

/// The two layout sizes from the memory pass's note in a dump directory.
fn layout_sizes(dump: &std::path::Path) -> (u64, u64) {
    let Some(dir) = std::fs::read_dir(dump).ok().and_then(|mut d| d.next()).and_then(|e| e.ok()) else {
        return (0, 0);
    };
    let memory = std::fs::read_dir(dir.path())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with("-memory.kir"));
    let text = memory.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
    let head = text.lines().next().unwrap_or("");
    let number_after = |key: &str| -> u64 {
        head.split(key)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (number_after("greedy by size "), number_after("first fit in schedule order "))
}

/// Backends besides the CPU that random graphs also run on.
fn other_backends() -> &'static [Box<dyn Backend>] {
    static OTHERS: std::sync::OnceLock<Vec<Box<dyn Backend>>> = std::sync::OnceLock::new();
    OTHERS.get_or_init(|| {
        #[allow(unused_mut)]
        let mut others: Vec<Box<dyn Backend>> = Vec::new();
        #[cfg(feature = "cuda-backend")]
        match kiln::backends::cuda::CudaBackend::new(0) {
            Ok(b) => others.push(Box::new(b)),
            Err(e) if std::env::var("KILN_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
                panic!("KILN_REQUIRE_CUDA=1 but CUDA is not usable: {e}")
            }
            Err(e) => eprintln!("plan_props: CUDA skipped ({e})"),
        }
        #[cfg(feature = "cuda-emulator")]
        if std::env::var("KILN_TEST_EMULATE").is_ok_and(|v| v == "1") {
            others.push(Box::new(kiln::backends::cuda::emulate::EmulatedCuda::new()));
        }
        others
    })
}

/// Random graphs run so far on the other backends (the first 100 do).
static OTHER_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn check_graph(graph: &Graph) -> Result<(), TestCaseError> {
    let backend = CpuBackend::new();
    let want = run(&backend, graph);
    let others = other_backends();
    let on_others = !others.is_empty() && OTHER_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 100;
    for streams in 1..=3u32 {
        // One-stream runs dump, to read the memory pass's note on layouts.
        let dump = std::env::temp_dir().join(format!(
            "kiln-plan-props-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut config = PipelineConfig::new(None, (streams == 1).then(|| dump.clone())).unwrap();
        config.options.streams = streams;
        let out = optimize(graph.clone(), &config).map_err(|e| TestCaseError::fail(e.to_string()))?;
        verify(&out).map_err(|e| TestCaseError::fail(format!("streams={streams}: {e}")))?;
        check_no_overlap(&out).map_err(|e| {
            TestCaseError::fail(format!("streams={streams}: {e}\n{}", kiln::ir::text::print(&out)))
        })?;
        let got = run(&backend, &out);
        prop_assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            for (a, b) in w.iter().zip(g) {
                prop_assert!(a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-6 + 1e-5 * b.abs());
            }
        }
        for other in others.iter().filter(|_| on_others) {
            let got = run(other.as_ref(), &out);
            prop_assert_eq!(want.len(), got.len());
            for (w, g) in want.iter().zip(&got) {
                for (a, b) in w.iter().zip(g) {
                    prop_assert!(
                        a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 + 1e-4 * b.abs(),
                        "{} streams={streams}: {a} vs the CPU's {b}",
                        other.name()
                    );
                }
            }
        }
        if streams == 1 {
            let layouts = layout_sizes(&dump);
            let _ = std::fs::remove_dir_all(&dump);
            let m = out.tables().memory.as_ref().unwrap();
            let mut t = TOTALS.lock().unwrap();
            t[4] += layouts.0;
            t[5] += layouts.1;
            t[6] += (layouts.1 < layouts.0) as u64;
            t[0] += 1;
            t[1] += m.arena_bytes;
            t[2] += m.lower_bound;
            t[3] += m.naive_bytes;
            if t[0] % 500 == 0 {
                eprintln!(
                    "one-stream cases {}: arena {} B, lower bound {} B, naive {} B; greedy by size {} B, first fit {} B, first fit smaller in {} case(s)",
                    t[0], t[1], t[2], t[3], t[4], t[5], t[6]
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        max_shrink_iters: 200,
        // A fixed seed: the same 1,000 graphs every run, so the totals the
        // memory pass quotes can be reproduced.
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x6b696c6e),
        ..ProptestConfig::default()
    })]

    #[test]
    fn plans_hold_on_random_dags(
        inputs in prop::collection::vec(0u8..14, 1..4),
        steps in prop::collection::vec((0u8..9, any::<u16>(), any::<u16>()), 1..24),
        outputs in prop::collection::vec(any::<u16>(), 0..3),
    ) {
        check_graph(&build(&inputs, &steps, &outputs))?;
    }
}

/// A 10,000-node graph (chains that fork and join, views, reductions)
/// plans and verifies on 1 and 3 streams: a planning step that is
/// quadratic would make this test crawl.
#[test]
fn ten_thousand_nodes_plan() {
    let mut g = Graph::new();
    let x = g.add(Op::Input(0), &[], Some((Shape::new([8, 4]), DType::F32)), RegionId::ROOT).unwrap();
    let mut cur = x;
    let mut side = x;
    let mut i = 0u32;
    while g.len() < 10_000 {
        i += 1;
        cur = match i % 5 {
            0 => add(&mut g, Op::Binary(BinaryOp::Add), &[cur, side]).unwrap(),
            1 => {
                side = add(&mut g, Op::Unary(UnaryOp::Tanh), &[cur]).unwrap();
                add(&mut g, Op::Unary(UnaryOp::Neg), &[cur]).unwrap()
            }
            2 => {
                let r = add(
                    &mut g,
                    Op::Reduce { op: ReduceOp::Sum, dims: vec![1], keepdim: true, into: None },
                    &[cur],
                )
                .unwrap();
                let e = add(&mut g, Op::Expand(Shape::new([8, 4])), &[r]).unwrap();
                add(&mut g, Op::Binary(BinaryOp::Sub), &[cur, e]).unwrap()
            }
            3 => fused(&mut g, cur, None, i as u16).unwrap(),
            _ => add(&mut g, Op::Unary(UnaryOp::Sigmoid), &[cur]).unwrap(),
        };
    }
    g.set_outputs(vec![cur]);
    // With `multi-output` the chain's values become few kernels' extra
    // outputs (none of naive bytes left to reuse); without it, every
    // reduction's row and every group's result is a value to place.
    for passes in [None, Some("-multi-output")] {
        for streams in [1, 3] {
            let mut config = PipelineConfig::new(passes, None).unwrap();
            config.options.streams = streams;
            let out = optimize(g.clone(), &config).unwrap();
            verify(&out).unwrap();
            let m = out.tables().memory.as_ref().unwrap();
            let reuse = if passes.is_some() { 100 } else { 10 };
            assert!(
                m.arena_bytes < m.naive_bytes / reuse,
                "{passes:?}: {} of {}",
                m.arena_bytes,
                m.naive_bytes
            );
        }
    }
}

/// Every rule of the plan checker, broken once by a hand-written plan: the
/// messages are golden.
#[test]
fn plan_check_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "schedule lists a node the outputs do not need",
            "plan schedule\n%x: f32[4] = input 0\n%dead: f32[4] = exp %x\n%y: f32[4] = neg %x\nreturn %y\n",
        ),
        (
            "cross-stream edge without an event",
            "plan schedule streams=2\n%x: f32[4] = input 0 !stream=0\n%a: f32[4] = exp %x !stream=0\n\
             %b: f32[4] = log %x !stream=1\n%c: f32[4] = add %a, %b !stream=0\nreturn %c\n",
        ),
        (
            "event awaited on its own stream",
            "plan schedule streams=2\n%x: f32[4] = input 0 !stream=0\n%a: f32[4] = exp %x !stream=0 !record=e0\n\
             %b: f32[4] = log %a !stream=0 !wait=e0\nreturn %b\n",
        ),
        (
            "node on a stream past the count",
            "plan schedule streams=2\n%x: f32[4] = input 0 !stream=0\n%a: f32[4] = exp %x !stream=2\nreturn %a\n",
        ),
        (
            "overlapping live values",
            "plan schedule arena=64 lower-bound=32 naive=32\n%x: f32[4] = input 0 !input !live=0..2\n\
             %a: f32[4] = exp %x !arena=0+16 !live=1..3\n%b: f32[4] = log %x !arena=0+16 !live=2..3\n\
             %c: f32[4] = add %a, %b !output !live=3..3\nreturn %c\n",
        ),
        (
            "wrong lifetime",
            "plan schedule arena=64 lower-bound=16 naive=16\n%x: f32[4] = input 0 !input !live=0..1\n\
             %a: f32[4] = exp %x !arena=0+16 !live=1..1\n%b: f32[4] = neg %a !output !live=2..2\nreturn %b\n",
        ),
        (
            "output in the arena",
            "plan schedule arena=64 lower-bound=16 naive=16\n%x: f32[4] = input 0 !input !live=0..1\n\
             %a: f32[4] = exp %x !arena=0+16 !live=1..1\nreturn %a\n",
        ),
        (
            "in place on an unfused op",
            "plan schedule arena=64 lower-bound=16 naive=32\n%x: f32[4] = input 0 !input !live=0..1\n\
             %a: f32[4] = exp %x !arena=0+16 !live=1..2\n%b: f32[4] = neg %a !arena=0+16 !in-place=%a !live=2..3\n\
             %c: f32[4] = neg %b !output !live=3..3\nreturn %c\n",
        ),
        (
            "unaligned offset",
            "plan schedule arena=64 lower-bound=16 naive=16\n%x: f32[4] = input 0 !input !live=0..1\n\
             %a: f32[4] = exp %x !arena=8+16 !live=1..2\n%b: f32[4] = neg %a !output !live=2..2\nreturn %b\n",
        ),
        (
            "totals that the values do not give",
            "plan schedule arena=64 lower-bound=64 naive=16\n%x: f32[4] = input 0 !input !live=0..1\n\
             %a: f32[4] = exp %x !arena=0+16 !live=1..2\n%b: f32[4] = neg %a !output !live=2..2\nreturn %b\n",
        ),
    ];
    let mut out = String::new();
    for (what, src) in cases {
        let message = match parse(src) {
            Err(e) => format!("parse: {e}"),
            Ok(g) => match verify(&g) {
                Err(e) => e.to_string(),
                Ok(()) => "(accepted)".to_string(),
            },
        };
        out.push_str(&format!("{what}:\n  {message}\n"));
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!("plan-check-messages", out));
}
