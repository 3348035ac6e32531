//! Fused kernels against the same graph with its fused nodes inlined
//! (`ir::fused::inline_fused`), run by the unfused kernels: elementwise
//! bodies bit for bit, reductions and matmuls within the dtype's tolerance.

use super::{host, tol, vals};
use crate::backends::cpu::CpuBackend;
use crate::backends::{Backend, Buffer, RngArgs};
use crate::ir::fused::inline_fused;
use crate::ir::text::parse;
use crate::ir::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Seeded data for an input of `shape` and `dtype`.
fn data(shape: &Shape, dtype: DType, seed: u64) -> HostData {
    let n = shape.numel();
    match dtype {
        DType::U8 => host(&vals(n, seed, 0.0, 200.0), dtype),
        DType::Bool => host(&vals(n, seed, -1.0, 1.0), dtype),
        d if d.is_int() => host(&vals(n, seed, -50.0, 50.0), dtype),
        _ => host(&vals(n, seed, -2.0, 2.0), dtype),
    }
}

/// Runs `g` on the CPU backend with seeded inputs; also returns how many
/// nodes ran.
fn run(g: Graph, inputs: &[HostData]) -> (Vec<HostData>, u64) {
    let be = CpuBackend::new();
    let plan = Plan::new(g);
    let shapes: Vec<Shape> = {
        let mut s = vec![Shape::scalar(); plan.inputs];
        for &id in &plan.order {
            if let Op::Input(k) = plan.graph.node(id).op {
                s[k as usize] = plan.graph.node(id).shape.clone();
            }
        }
        s
    };
    let exe = be.compile(Arc::new(plan)).expect("compiles");
    let bufs: Vec<Buffer> =
        inputs.iter().zip(&shapes).map(|(d, s)| be.upload(d.clone(), s).expect("uploads")).collect();
    let out = exe.run(&bufs, &RngArgs::default()).expect("runs");
    let host = out.iter().map(|b| be.download(b).expect("downloads")).collect();
    (host, be.stats().nodes_executed.load(Ordering::Relaxed))
}

/// Seeded data for every input of `g`, in slot order.
pub(super) fn inputs_of(g: &Graph) -> Vec<HostData> {
    let mut ins: Vec<(u32, HostData)> = g
        .topo_order()
        .into_iter()
        .filter_map(|id| match g.node(id).op {
            Op::Input(k) => Some((k, data(&g.node(id).shape, g.node(id).dtype, 100 + k as u64))),
            _ => None,
        })
        .collect();
    ins.sort_by_key(|(k, _)| *k);
    ins.into_iter().map(|(_, d)| d).collect()
}

/// The body of a one-fused-node graph: its operands are inputs of the
/// body's input types, its output is the graph's.
fn wrap(body: &str) -> String {
    let b = FusedBody::new(parse(body).expect("body parses")).expect("body is legal");
    let g = b.graph();
    let ty = |id: NodeId| format!("{}{}", g.node(id).dtype, g.node(id).shape);
    let mut s = String::new();
    let mut names = Vec::new();
    for (k, &i) in b.input_nodes().iter().enumerate() {
        s += &format!("%i{k}: {} = input {k}\n", ty(i));
        names.push(format!("%i{k}"));
    }
    s += &format!("%y: {} = fused {} kind={} {{\n", ty(b.output()), names.join(", "), b.kind().name());
    for line in body.lines().filter(|l| !l.trim().is_empty()) {
        s += &format!("    {}\n", line.trim());
    }
    s += "}\nreturn %y\n";
    s
}

/// Runs `src` fused and inlined; `tol_scale` 0 demands identical bits.
fn check_graph(src: &str, tol_scale: f64, what: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("{what}: {e}\n{src}"));
    let fused_nodes = g.topo_order().iter().filter(|&&id| matches!(g.node(id).op, Op::Fused(_))).count();
    assert!(fused_nodes > 0, "{what}: the test graph has no fused node");
    let inputs = inputs_of(&g);
    let reference = inline_fused(&g);
    let (want, _) = run(reference, &inputs);
    let top = g.topo_order().len() as u64;
    let (got, ran) = run(g, &inputs);
    assert_eq!(ran, top, "{what}: the fused graph ran its fused node as one step");
    for (o, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.dtype(), b.dtype(), "{what}: output {o} dtype");
        let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
        assert_eq!(x.len(), y.len(), "{what}: output {o} length");
        let t = tol_scale * tol(a.dtype());
        for (i, (&p, &q)) in x.iter().zip(&y).enumerate() {
            let same = p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan());
            let close = tol_scale > 0.0 && (p - q).abs() <= t * (1.0 + q.abs());
            assert!(same || close, "{what}: output {o} element {i}: fused {p}, unfused {q}");
        }
    }
}

fn check(body: &str, tol_scale: f64, what: &str) {
    check_graph(&wrap(body), tol_scale, what);
}

pub(super) const FLOAT_BODY: &str = "
%x: D[R,C] = input 0
%b: D[C] = input 1
%bb: D[R,C] = expand %b
%k: D[R,C] = full 0.5
%m: D[R,C] = mul %x, %k
%a: D[R,C] = add %m, %bb
%t: D[R,C] = tanh %a
%e: D[R,C] = exp %t
%s: D[R,C] = sigmoid %e
%g: D[R,C] = gelu %s
%c: bool[R,C] = gt %x, %bb
%w: D[R,C] = where %c, %g, %x
%d: D[R,C] = div %w, %bb
%mx: D[R,C] = maximum %d, %k
%si: D[R,C] = silu %mx
return %si
";

pub(super) fn sized(body: &str, d: &str, r: usize, c: usize) -> String {
    body.replace("D[", &format!("{d}["))
        .replace("[R,C]", &format!("[{r},{c}]"))
        .replace("[C]", &format!("[{c}]"))
}

#[test]
fn elementwise_floats_are_bit_identical() {
    for d in ["f32", "f64", "f16", "bf16"] {
        // 4773 elements (one thread, a short last block) and 77100 (parallel).
        for (r, c) in [(37, 129), (300, 257), (1, 1)] {
            check(&sized(FLOAT_BODY, d, r, c), 0.0, &format!("float chain {d} [{r},{c}]"));
        }
    }
}

#[test]
fn elementwise_ints_bools_and_casts_are_bit_identical() {
    for d in ["i32", "i64", "u8"] {
        let body = "
            %x: D[R,C] = input 0
            %y: D[R,C] = input 1
            %n: D[R,C] = neg %x
            %a: D[R,C] = abs %n
            %m: D[R,C] = mul %a, %y
            %k: D[R,C] = full 3
            %q: D[R,C] = div %m, %k
            %r: D[R,C] = relu %q
            %c: bool[R,C] = le %r, %y
            %w: D[R,C] = where %c, %r, %y
            %f: f32[R,C] = cast %w
            %s: f32[R,C] = sqrt %f
            return %s
        ";
        check(&sized(body, d, 41, 1001), 0.0, &format!("int chain {d}"));
    }
    let bools = "
        %x: bool[R,C] = input 0
        %y: bool[R,C] = input 1
        %o: bool[R,C] = maximum %x, %y
        %a: bool[R,C] = minimum %o, %y
        %e: bool[R,C] = ne %a, %x
        %i: i32[R,C] = cast %e
        %f: f16[R,C] = cast %i
        %z: f16[R,C] = full 0.25
        %w: f16[R,C] = where %e, %f, %z
        return %w
    ";
    check(&sized(bools, "bool", 77, 513), 0.0, "bool chain");
}

#[test]
fn elementwise_views_of_leaves() {
    // A transposed input, a strided slice, an expanded column, a reshape
    // that is a view and one that must copy (a transpose flattened).
    let body = "
        %t: f32[129,37] = input 0
        %x: f32[37,129] = permute %t perm=[1,0]
        %w: f32[37,300] = input 1
        %s: f32[37,129] = slice %w dim=1 start=3 step=2 len=129
        %col: f32[37,1] = input 2
        %ce: f32[37,129] = expand %col
        %flat: f32[4773] = input 3
        %r: f32[37,129] = reshape %flat
        %u: f32[129,37] = input 4
        %up: f32[37,129] = permute %u perm=[1,0]
        %uf: f32[4773] = reshape %up
        %ur: f32[37,129] = reshape %uf
        %a: f32[37,129] = add %x, %s
        %b: f32[37,129] = mul %a, %ce
        %c: f32[37,129] = sub %b, %r
        %d: f32[37,129] = add %c, %ur
        return %d
    ";
    check(body, 0.0, "leaf views");
    // An operand that is itself a strided view outside the body.
    let outer = "
        %i: f32[300,301] = input 0
        %p: f32[301,300] = permute %i perm=[1,0]
        %y: f32[301,300] = fused %p kind=elementwise {
            %0: f32[301,300] = input 0
            %1: f32[301,300] = exp %0
            %2: f32[301,300] = neg %1
            return %2
        }
        return %y
    ";
    check_graph(outer, 0.0, "strided operand");
    // The output is a leaf view (a copy).
    check("%x: f32[5,3] = input 0\n%p: f32[3,5] = permute %x perm=[1,0]\nreturn %p\n", 0.0, "leaf output");
}

pub(super) const SOFTMAX: &str = "
%x: D[R,C] = input 0
%m: D[R,1] = max %x dims=[1] keepdim
%mb: D[R,C] = expand %m
%d: D[R,C] = sub %x, %mb
%e: D[R,C] = exp %d
%s: D[R,1] = sum %e dims=[1] keepdim
%sb: D[R,C] = expand %s
%y: D[R,C] = div %e, %sb
return %y
";

const LAYERNORM: &str = "
%x: D[R,C] = input 0
%g: D[C] = input 1
%b: D[C] = input 2
%mu: D[R,1] = mean %x dims=[1] keepdim
%mub: D[R,C] = expand %mu
%xc: D[R,C] = sub %x, %mub
%sq: D[R,C] = mul %xc, %xc
%var: D[R,1] = mean %sq dims=[1] keepdim
%eps: D[R,1] = full 0.00001
%ve: D[R,1] = add %var, %eps
%rs: D[R,1] = rsqrt %ve
%rsb: D[R,C] = expand %rs
%n: D[R,C] = mul %xc, %rsb
%gb: D[R,C] = expand %g
%bb: D[R,C] = expand %b
%sc: D[R,C] = mul %n, %gb
%y: D[R,C] = add %sc, %bb
return %y
";

/// Fused row kernels reduce each row in the order `lanes.rs` defines, as
/// the unfused kernel does, so they agree to the bit; only the unfused
/// kernel's parallel split of a few very long rows (here `[2, 40000]`)
/// may differ in the last bits.
#[test]
fn softmax_and_layernorm_match_unfused() {
    let sizes = [(37, 1000), (5, 7), (300, 1), (1, 2500), (1, 1), (129, 1030), (2, 40000)];
    for (r, c) in sizes {
        let split = r < 4 && c >= 32768;
        for d in ["f32", "f64", "f16"] {
            let what = format!("[{r},{c}] {d}");
            check(
                &sized(SOFTMAX, d, r, c).replace("[R,1]", &format!("[{r},1]")),
                if split { 4.0 } else { 0.0 },
                &format!("softmax {what}"),
            );
            check(
                &sized(LAYERNORM, d, r, c).replace("[R,1]", &format!("[{r},1]")),
                if split { 8.0 } else { 0.0 },
                &format!("layernorm {what}"),
            );
        }
    }
}

/// `where` with each operand a block, a constant, or (in a row body) a
/// value per row: every loop `ops::select` has, against the unfused
/// kernel, bit for bit. The condition is random, as a dropout mask is.
#[test]
fn where_of_every_operand_shape_is_bit_identical() {
    let elementwise = "
        %x: f32[R,C] = input 0
        %y: f32[R,C] = input 1
        %z: f32[R,C] = full 0
        %o: f32[R,C] = full 1.5
        %c: bool[R,C] = gt %x, %y
        %t: bool[R,C] = full true
        %a: f32[R,C] = where %c, %x, %y
        %b: f32[R,C] = where %c, %x, %z
        %d: f32[R,C] = where %c, %o, %y
        %e: f32[R,C] = where %c, %o, %z
        %f: f32[R,C] = where %t, %a, %b
        %g: f32[R,C] = add %d, %e
        %h: f32[R,C] = add %f, %g
        return %h
    ";
    let rows = "
        %x: f32[R,C] = input 0
        %m: f32[R,1] = max %x dims=[1] keepdim
        %mb: f32[R,C] = expand %m
        %n: f32[R,1] = min %x dims=[1] keepdim
        %nb: f32[R,C] = expand %n
        %z: f32[R,C] = full 0
        %c: bool[R,C] = gt %x, %z
        %a: f32[R,C] = where %c, %mb, %nb
        %b: f32[R,C] = where %c, %x, %mb
        %d: f32[R,C] = where %c, %nb, %z
        %e: f32[R,C] = add %a, %b
        %f: f32[R,C] = add %e, %d
        %s: f32[R,1] = sum %f dims=[1] keepdim
        return %s
    ";
    for (r, c) in [(37, 129), (300, 257), (1, 1)] {
        check(&sized(elementwise, "f32", r, c), 0.0, &format!("where shapes [{r},{c}]"));
        let body = sized(rows, "f32", r, c).replace("[R,1]", &format!("[{r},1]"));
        check(&body, 0.0, &format!("where per row [{r},{c}]"));
    }
}

/// An output of 32 MB or more is streamed out (non-temporal stores from
/// each block's scratch): the same bits as the unfused graph.
#[test]
fn a_streamed_output_matches_unfused() {
    let (r, c) = (2048, 4096);
    check(&sized(SOFTMAX, "f32", r, c).replace("[R,1]", &format!("[{r},1]")), 0.0, "streamed softmax");
}

#[test]
fn reductions_keepdim_false_two_trailing_dims_and_ints() {
    for op in ["sum", "mean", "max", "min"] {
        // keepdim=false output, two reduced dims, a prologue.
        let body = format!(
            "%x: f32[6,5,7] = input 0\n%e: f32[6,5,7] = exp %x\n\
             %r: f32[6] = {op} %e dims=[1,2]\nreturn %r\n"
        );
        check(&body, 4.0, &format!("{op} over [1,2]"));
        // One row: every dim reduced.
        let body = format!(
            "%x: f64[3,1111] = input 0\n%a: f64[3,1111] = abs %x\n\
             %r: f64[1,1] = {op} %a dims=[0,1] keepdim\n%l: f64[1,1] = log %r\nreturn %l\n"
        );
        check(&body, 4.0, &format!("{op} rows=1"));
    }
    let ints = "%x: i32[33,129] = input 0\n%y: i32[33,129] = mul %x, %x\n\
                %s: i32[33,1] = sum %y dims=[1] keepdim\n%m: i32[33,1] = max %x dims=[1] keepdim\n\
                %d: i32[33,1] = sub %s, %m\nreturn %d\n";
    check(ints, 0.0, "int sum and max");
    // NaN wins in max, as unfused.
    let nan = "%x: f32[40,9] = input 0\n%z: f32[40,9] = full 0\n%q: f32[40,9] = div %z, %x\n\
               %l: f32[40,9] = log %x\n%a: f32[40,9] = add %q, %l\n\
               %m: f32[40,1] = max %a dims=[1] keepdim\nreturn %m\n";
    check(nan, 0.0, "nan in max");
}

#[test]
fn matmul_epilogues_match_unfused() {
    for d in ["f32", "f64", "f16", "bf16", "i32"] {
        // x [300,64] x W^T with W [70,64]: 3 GEMM blocks (the last short).
        let act = if d == "i32" { "relu" } else { "gelu" };
        let body = format!(
            "%x: {d}[300,64] = input 0\n%w: {d}[70,64] = input 1\n%wt: {d}[64,70] = permute %w perm=[1,0]\n\
             %b: {d}[70] = input 2\n%m: {d}[300,70] = matmul %x, %wt\n%bb: {d}[300,70] = expand %b\n\
             %y: {d}[300,70] = add %m, %bb\n%r: {d}[300,70] = relu %y\n%res: {d}[300,70] = input 3\n\
             %z: {d}[300,70] = add %r, %res\n%g: {d}[300,70] = {act} %z\nreturn %g\n"
        );
        check(&body, 4.0, &format!("linear+relu+residual+{act} {d}"));
    }
    // Batched, an expanded (stride-0) operand, a dtype-changing epilogue.
    let body = "%a: f32[3,17,9] = input 0\n%b: f32[9,33] = input 1\n%be: f32[3,9,33] = expand %b\n\
                %m: f32[3,17,33] = matmul %a, %be\n%c: f16[3,17,33] = cast %m\n%t: f16[3,17,33] = tanh %c\n\
                return %t\n";
    check(body, 0.0, "batched matmul with a cast epilogue");
    // No epilogue at all, and k = 1.
    check(
        "%a: f32[5,1] = input 0\n%b: f32[1,4] = input 1\n%m: f32[5,4] = matmul %a, %b\nreturn %m\n",
        0.0,
        "bare",
    );
}
