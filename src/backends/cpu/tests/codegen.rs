//! Generated code for fused bodies (`codegen/`, `fused/jit.rs`) against
//! the interpreter, bit for bit, on fresh random inputs sprinkled with
//! NaN, infinities, signed zeros, subnormals and `exp`'s edges; sizes that
//! are not multiples of the vector width; splat, broadcast, strided and
//! per-row leaves; several outputs. Plus the Cranelift IR itself, as
//! snapshots, and the bodies that are refused before code is made.

use super::philox;
use crate::backends::cpu::codegen::{self, Body, Codegen, Mode, Node, Ty};
use crate::backends::cpu::fused::FusedKernel;
use crate::backends::cpu::launch::host_out;
use crate::backends::cpu::storage::{dispatch, Out};
use crate::backends::cpu::{CpuBackend, CpuBuffer};
use crate::backends::{Backend, Buffer};
use crate::ir::text::parse;
use crate::ir::*;

/// Random `f32`s in `[-3, 3)` from `seed`, with special values at fixed
/// strides (so every vector lane and the scalar tail meet some).
fn floats(n: usize, seed: u64) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let special = [
                (13, f32::NAN),
                (17, f32::INFINITY),
                (19, f32::NEG_INFINITY),
                (23, -0.0),
                (29, 0.0),
                (31, 1e-40),
                (37, 88.9),
                (41, -103.99),
                (43, 89.5),
                (47, -104.5),
            ];
            match special.iter().find(|(k, _)| i % k == k - 1) {
                Some(&(_, v)) => v,
                None => (philox::uniform(seed, 7, i as u64) * 6.0 - 3.0) as f32,
            }
        })
        .collect()
}

fn input_data(shape: &Shape, dtype: DType, seed: u64) -> HostData {
    let n = shape.numel();
    match dtype {
        DType::F32 => HostData::F32(floats(n, seed)),
        DType::Bool => HostData::Bool((0..n).map(|i| philox::uniform(seed, 3, i as u64) < 0.5).collect()),
        DType::F64 => HostData::F64(floats(n, seed).into_iter().map(f64::from).collect()),
        DType::F16 => HostData::F16(floats(n, seed).into_iter().map(half::f16::from_f32).collect()),
        DType::BF16 => HostData::BF16(floats(n, seed).into_iter().map(half::bf16::from_f32).collect()),
        // Integers index (a gather's rows, a label): 0 is in range for any.
        DType::I64 => HostData::I64(vec![0; n]),
        DType::I32 => HostData::I32(vec![0; n]),
        DType::U8 => HostData::U8(vec![0; n]),
    }
}

/// Runs `kernel` on `bufs`, returning its output and extra outputs.
pub(super) fn run(kernel: &FusedKernel, g: &Graph, fb: &FusedBody, bufs: &[CpuBuffer]) -> Vec<HostData> {
    let args: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
    let fresh = |id: NodeId| {
        let n = g.node(id);
        dispatch!(n.dtype, E => <E as Element>::into_host(vec![E::default(); n.shape.numel()]))
    };
    let mut extras: Vec<HostData> = fb.outputs()[1..].iter().map(|&o| fresh(o)).collect();
    let out = {
        let outs: Vec<Out<'_>> = extras.iter_mut().map(host_out).collect();
        let d = g.node(fb.output()).dtype;
        dispatch!(d, E => {
            let mut v = vec![E::default(); g.node(fb.output()).shape.numel()];
            kernel.run(&args, None, &mut v, outs).expect("runs");
            <E as Element>::into_host(v)
        })
    };
    std::iter::once(out).chain(extras).collect()
}

/// Compiles `src` (a body) both ways, runs both on the same inputs
/// (seeded by `seed`), and demands the same bits (any NaN matches any
/// NaN: which payload x86 propagates depends on operand order, which
/// neither path promises).
fn agree(src: &str, seed: u64, what: &str) {
    agree_as(src, seed, what, Codegen::All, 1, true);
}

/// [`agree`] with `codegen`, expecting the body generated whole (`whole`)
/// or as `kernels` segments.
fn agree_as(src: &str, seed: u64, what: &str, codegen: Codegen, kernels: usize, whole: bool) {
    if !codegen::available() {
        return; // a CPU without SSE4.1/FMA runs the interpreter only
    }
    let g = parse(src).unwrap_or_else(|e| panic!("{what}: {e}"));
    let fb = FusedBody::new(g.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let generated = FusedKernel::compile(&fb, fb.output(), codegen).unwrap();
    let interpreted = FusedKernel::compile(&fb, fb.output(), Codegen::Off).unwrap();
    assert_eq!(generated.is_generated(), whole, "{what}: the body is generated whole");
    assert_eq!(generated.generated_segments(), if whole { 0 } else { kernels }, "{what}: segments");
    assert!(!interpreted.is_generated() && interpreted.generated_segments() == 0);
    let bufs = inputs(&fb, seed);
    let got = run(&generated, fb.graph(), &fb, &bufs);
    assert_eq!(generated.generated_kernels(), kernels, "{what}: one set of modes each, compiled once");
    let want = run(&interpreted, fb.graph(), &fb, &bufs);
    same_bits(&got, &want, what);
}

/// Fresh inputs of a fused body (see [`input_data`]), operand `k` from
/// `seed + k`, uploaded as CPU buffers.
pub(super) fn inputs(fb: &FusedBody, seed: u64) -> Vec<CpuBuffer> {
    let be = CpuBackend::new();
    fb.input_nodes()
        .iter()
        .enumerate()
        .map(|(k, &i)| {
            let n = fb.graph().node(i);
            match be.upload(input_data(&n.shape, n.dtype, seed + k as u64), &n.shape).unwrap() {
                Buffer::Cpu(c) => c,
                #[allow(unreachable_patterns)]
                _ => unreachable!("the CPU backend makes CPU buffers"),
            }
        })
        .collect()
}

/// Generated outputs equal the interpreter's bit for bit (any NaN matching
/// any NaN): same dtypes, same lengths, same elements.
pub(super) fn same_bits(got: &[HostData], want: &[HostData], what: &str) {
    for (o, (a, b)) in got.iter().zip(want).enumerate() {
        let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
        assert_eq!((a.dtype(), x.len()), (b.dtype(), y.len()), "{what}: output {o}");
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            let same = p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan());
            assert!(same, "{what}: output {o} element {i}: generated {p:e}, interpreted {q:e}");
        }
    }
}

/// `D` replaced by the dims.
fn at(body: &str, dims: &str) -> String {
    body.replace("[D]", &format!("[{dims}]"))
}

const EVERY_OP: &str = "
%x: f32[D] = input 0
%y: f32[D] = input 1
%k: f32[D] = full 0.5
%a: f32[D] = mul %x, %k
%b: f32[D] = add %a, %y
%c: f32[D] = sub %b, %x
%d: f32[D] = div %c, %y
%e: f32[D] = exp %d
%f: f32[D] = sigmoid %x
%g: f32[D] = silu %y
%h: f32[D] = maximum %e, %f
%i: f32[D] = minimum %h, %g
%j: f32[D] = relu %i
%l: f32[D] = abs %y
%m: f32[D] = sqrt %l
%n: f32[D] = rsqrt %l
%o: f32[D] = recip %x
%p: f32[D] = neg %o
%q: f32[D] = add %m, %n
%r: f32[D] = add %q, %p
%s: f32[D] = maximum %j, %r
%t: f32[D] = minimum %x, %y
%u: f32[D] = add %s, %t
return %u
";

#[test]
fn every_op_matches_the_interpreter_at_odd_sizes() {
    // One element, shorter than a vector, a vector and a tail, a block and
    // a short last block, and a size that runs in parallel.
    for (i, dims) in ["1", "3", "7", "4099", "37,129", "301,257"].iter().enumerate() {
        agree(&at(EVERY_OP, dims), 10 + i as u64, &format!("every op [{dims}]"));
    }
}

#[test]
fn exp_edges_match_the_interpreter() {
    // exp over a sweep through overflow, underflow and the subnormals.
    let body = "%x: f32[4096] = input 0\n%e: f32[4096] = exp %x\n%s: f32[4096] = sigmoid %x\n\
                %l: f32[4096] = silu %x\n%a: f32[4096] = add %e, %s\n%b: f32[4096] = add %a, %l\nreturn %b\n";
    agree(body, 3, "exp edges (sprinkled)");
    if !codegen::available() {
        return;
    }
    let g = parse("%x: f32[2003] = input 0\n%e: f32[2003] = exp %x\nreturn %e\n").unwrap();
    let fb = FusedBody::new(g.clone()).unwrap();
    let k = FusedKernel::compile(&fb, fb.output(), Codegen::All).unwrap();
    let xs: Vec<f32> = (0..2003).map(|i| -110.0 + i as f32 * 0.1).collect();
    let be = CpuBackend::new();
    let b = match be.upload(HostData::F32(xs.clone()), &Shape(vec![2003])).unwrap() {
        Buffer::Cpu(c) => c,
        #[allow(unreachable_patterns)]
        _ => unreachable!("the CPU backend makes CPU buffers"),
    };
    let mut out = vec![0f32; 2003];
    k.run(&[Some(&b)], None, &mut out, Vec::new()).unwrap();
    for (x, y) in xs.iter().zip(&out) {
        assert_eq!(y.to_bits(), crate::ir::fast_math::exp_f32(*x).to_bits(), "exp({x})");
    }
}

#[test]
fn compares_selects_casts_and_bools_match() {
    let body = "
        %x: f32[D] = input 0
        %y: f32[D] = input 1
        %m: bool[D] = input 2
        %c: bool[D] = gt %x, %y
        %w: f32[D] = where %c, %x, %y
        %z: f32[D] = full 0.0
        %v: f32[D] = where %m, %w, %z
        %e: bool[D] = eq %x, %y
        %n: bool[D] = ne %x, %x
        %l: bool[D] = le %v, %y
        %g: bool[D] = ge %v, %x
        %t: bool[D] = lt %w, %z
        %o: bool[D] = where %n, %e, %l
        %p: bool[D] = where %o, %g, %t
        %pf: f32[D] = cast %p
        %b: bool[D] = cast %v
        %bf: f32[D] = cast %b
        %s: f32[D] = add %pf, %bf
        %r: f32[D] = add %s, %v
        return %r
    ";
    for (i, dims) in ["5", "33,31", "300,257"].iter().enumerate() {
        agree(&at(body, dims), 40 + i as u64, &format!("compares [{dims}]"));
    }
    // A bool output, with a tail.
    let mask = "%x: f32[D] = input 0\n%h: f32[D] = full 0.25\n%c: bool[D] = lt %x, %h\n\
                %n: bool[D] = ne %x, %x\n%o: bool[D] = where %n, %n, %c\nreturn %o\n";
    agree(&at(mask, "1031"), 50, "bool output");
}

#[test]
fn leaves_in_every_layout_match() {
    // A transposed input, a strided slice, an expanded column and row, a
    // scalar expanded (splat) and a reshape that must copy.
    let body = "
        %t: f32[129,37] = input 0
        %x: f32[37,129] = permute %t perm=[1,0]
        %w: f32[37,300] = input 1
        %s: f32[37,129] = slice %w dim=1 start=3 step=2 len=129
        %col: f32[37,1] = input 2
        %ce: f32[37,129] = expand %col
        %row: f32[129] = input 3
        %re: f32[37,129] = expand %row
        %one: f32[] = input 4
        %oe: f32[37,129] = expand %one
        %u: f32[129,37] = input 5
        %up: f32[37,129] = permute %u perm=[1,0]
        %uf: f32[4773] = reshape %up
        %ur: f32[37,129] = reshape %uf
        %a: f32[37,129] = add %x, %s
        %b: f32[37,129] = mul %a, %ce
        %c: f32[37,129] = sub %b, %re
        %d: f32[37,129] = div %c, %oe
        %e: f32[37,129] = add %d, %ur
        return %e
    ";
    agree(body, 60, "leaf views");
}

#[test]
fn matmul_epilogues_read_bias_rows_and_row_values() {
    // The product is flat, the bias a row for every row (cols mode), the
    // row scale one value per row (per-row mode): 70 columns, a tail of 2.
    let mm = "
        %x: f32[300,64] = input 0
        %w: f32[64,70] = input 1
        %b: f32[70] = input 2
        %r: f32[300,1] = input 3
        %m: f32[300,70] = matmul %x, %w
        %bb: f32[300,70] = expand %b
        %rb: f32[300,70] = expand %r
        %a: f32[300,70] = add %m, %bb
        %s: f32[300,70] = mul %a, %rb
        %y: f32[300,70] = relu %s
        return %y
    ";
    agree(mm, 70, "matmul bias relu");
}

#[test]
fn several_outputs_match() {
    // An AdamW-like update: the new moments and the new parameter.
    let adamw = "
        %p: f32[D] = input 0
        %g: f32[D] = input 1
        %m: f32[D] = input 2
        %v: f32[D] = input 3
        %b1: f32[D] = full 0.9
        %c1: f32[D] = full 0.1
        %b2: f32[D] = full 0.999
        %c2: f32[D] = full 0.001
        %lr: f32[D] = full 0.01
        %eps: f32[D] = full 1e-8
        %m1: f32[D] = mul %m, %b1
        %m2: f32[D] = mul %g, %c1
        %mn: f32[D] = add %m1, %m2
        %v1: f32[D] = mul %v, %b2
        %gg: f32[D] = mul %g, %g
        %v2: f32[D] = mul %gg, %c2
        %vn: f32[D] = add %v1, %v2
        %sq: f32[D] = sqrt %vn
        %de: f32[D] = add %sq, %eps
        %st: f32[D] = div %mn, %de
        %up: f32[D] = mul %st, %lr
        %pn: f32[D] = sub %p, %up
        return %pn, %mn, %vn
    ";
    for (i, dims) in ["10", "8191", "127,129"].iter().enumerate() {
        agree(&at(adamw, dims), 80 + i as u64, &format!("adamw [{dims}]"));
    }
}

/// Layer norm with its bias subtracted, and a softmax shifted by the row
/// minimum: the shapes of the two, which the hand-fused row kernels
/// (`fused/rows.rs`) do not take, so their elementwise runs are segments.
const LAYERNORM_LIKE: &str = "
%x: f32[D] = input 0
%g: f32[C] = input 1
%b: f32[C] = input 2
%mu: f32[R,1] = mean %x dims=[1] keepdim
%mub: f32[D] = expand %mu
%xc: f32[D] = sub %x, %mub
%sq: f32[D] = mul %xc, %xc
%var: f32[R,1] = mean %sq dims=[1] keepdim
%eps: f32[R,1] = full 0.00001
%ve: f32[R,1] = add %var, %eps
%rs: f32[R,1] = rsqrt %ve
%rsb: f32[D] = expand %rs
%n: f32[D] = mul %xc, %rsb
%gb: f32[D] = expand %g
%bb: f32[D] = expand %b
%sc: f32[D] = mul %n, %gb
%y: f32[D] = sub %sc, %bb
return %y
";

const SOFTMAX_LIKE: &str = "
%x: f32[D] = input 0
%m: f32[R,1] = min %x dims=[1] keepdim
%mb: f32[D] = expand %m
%d: f32[D] = sub %x, %mb
%e: f32[D] = exp %d
%s: f32[R,1] = sum %e dims=[1] keepdim
%sb: f32[D] = expand %s
%y: f32[D] = div %e, %sb
return %y
";

fn rows(body: &str, r: usize, c: usize) -> String {
    body.replace("[D]", &format!("[{r},{c}]"))
        .replace("[R,1]", &format!("[{r},1]"))
        .replace("[C]", &format!("[{c}]"))
}

#[test]
fn reductions_run_their_elementwise_runs_as_segments() {
    // Layer norm's shape: (x - mean, its square) and (scale, weight, bias)
    // are two segments between the interpreter's reductions; NaN and inf
    // rows too.
    for (i, (r, c)) in [(5, 3), (37, 129), (300, 257), (4, 1024)].into_iter().enumerate() {
        agree_as(
            &rows(LAYERNORM_LIKE, r, c),
            90 + i as u64,
            &format!("layer norm [{r},{c}]"),
            Codegen::Measured,
            2,
            false,
        );
    }
    // Softmax's shape: (x - min, exp) is a segment when exp is generated (`all`),
    // none by default (the division alone is one op: no run).
    for (i, (r, c)) in [(5, 3), (37, 129), (300, 257)].into_iter().enumerate() {
        agree_as(
            &rows(SOFTMAX_LIKE, r, c),
            95 + i as u64,
            &format!("softmax [{r},{c}]"),
            Codegen::All,
            1,
            false,
        );
    }
    let g = parse(&rows(SOFTMAX_LIKE, 4, 8)).unwrap();
    let fb = FusedBody::new(g).unwrap();
    assert_eq!(FusedKernel::compile(&fb, fb.output(), Codegen::Measured).unwrap().generated_segments(), 0);
}

#[test]
fn bodies_without_a_definition_stay_interpreted() {
    let cases = [
        ("%x: f32[9] = input 0\n%l: f32[9] = log %x\nreturn %l\n", "log"),
        ("%x: f32[9] = input 0\n%l: f32[9] = tanh %x\nreturn %l\n", "tanh"),
        ("%x: f64[9] = input 0\n%l: f64[9] = exp %x\nreturn %l\n", "f64"),
        ("%x: f32[9] = input 0\n%y: f32[9] = input 1\n%p: f32[9] = pow %x, %y\nreturn %p\n", "pow"),
        ("%x: f32[3,5] = input 0\n%s: f32[3,1] = sum %x dims=[1] keepdim\nreturn %s\n", "a reduction"),
        ("%x: f32[5,3] = input 0\n%p: f32[3,5] = permute %x perm=[1,0]\nreturn %p\n", "a leaf output"),
    ];
    for (src, what) in cases {
        let g = parse(src).unwrap();
        let fb = FusedBody::new(g.clone()).unwrap();
        let k = FusedKernel::compile(&fb, fb.output(), Codegen::All).unwrap();
        assert!(!k.is_generated(), "{what} is interpreted");
    }
    if !codegen::available() {
        return;
    }
    // exp is generated only when asked for every body (it measured faster
    // in the interpreter's 8-lane loop); the rest by default.
    let exp = parse("%x: f32[9] = input 0\n%e: f32[9] = sigmoid %x\nreturn %e\n").unwrap();
    let fb = FusedBody::new(exp).unwrap();
    assert!(!FusedKernel::compile(&fb, fb.output(), Codegen::Measured).unwrap().is_generated());
    assert!(FusedKernel::compile(&fb, fb.output(), Codegen::All).unwrap().is_generated());
    let add = parse("%x: f32[9] = input 0\n%e: f32[9] = add %x, %x\nreturn %e\n").unwrap();
    let fb = FusedBody::new(add).unwrap();
    assert!(FusedKernel::compile(&fb, fb.output(), Codegen::Measured).unwrap().is_generated());
    assert!(!FusedKernel::compile(&fb, fb.output(), Codegen::Off).unwrap().is_generated());
}

#[test]
fn malformed_bodies_are_refused_before_code_is_made() {
    let msg = |b: &Body, modes: &[Mode]| codegen::compile(b, modes).err().map(|e| e.to_string());
    let later = Body {
        args: vec![Ty::F32],
        nodes: vec![
            (Node::Arg(0), Ty::F32),
            (Node::Unary(UnaryOp::Neg, 2), Ty::F32),
            (Node::Arg(0), Ty::F32),
        ],
        outputs: vec![1],
    };
    assert_eq!(msg(&later, &[Mode::Flat]), Some("backend error: cpu codegen: neg reads a later node".into()));
    let arg = Body { args: vec![], nodes: vec![(Node::Arg(0), Ty::F32)], outputs: vec![0] };
    assert_eq!(msg(&arg, &[]), Some("backend error: cpu codegen: argument 0 out of range".into()));
    let typed = Body {
        args: vec![Ty::Bool],
        nodes: vec![(Node::Arg(0), Ty::Bool), (Node::Unary(UnaryOp::Exp, 0), Ty::F32)],
        outputs: vec![1],
    };
    assert_eq!(msg(&typed, &[Mode::Flat]), Some("backend error: cpu codegen: exp on F32".into()));
    let ok = Body { args: vec![Ty::F32], nodes: vec![(Node::Arg(0), Ty::F32)], outputs: vec![0] };
    assert_eq!(msg(&ok, &[]), Some("backend error: cpu codegen: 0 modes for 1 arguments".into()));
    let none = Body { args: vec![Ty::F32], nodes: vec![(Node::Arg(0), Ty::F32)], outputs: vec![] };
    assert_eq!(msg(&none, &[Mode::Flat]), Some("backend error: cpu codegen: no outputs".into()));
}

/// The Cranelift IR of `src`'s body, made for its first run on dense
/// inputs (the modes a plan's run would meet).
fn ir_of(src: &str) -> String {
    let g = parse(src).unwrap();
    let fb = FusedBody::new(g.clone()).unwrap();
    let k = FusedKernel::compile(&fb, fb.output(), Codegen::All).unwrap();
    let be = CpuBackend::new();
    let bufs: Vec<CpuBuffer> = fb
        .input_nodes()
        .iter()
        .map(|&i| {
            let n = fb.graph().node(i);
            match be.upload(input_data(&n.shape, n.dtype, 1), &n.shape).unwrap() {
                Buffer::Cpu(c) => c,
                #[allow(unreachable_patterns)]
                _ => unreachable!("the CPU backend makes CPU buffers"),
            }
        })
        .collect();
    run(&k, fb.graph(), &fb, &bufs);
    k.generated_ir().expect("the body is generated").unwrap().to_string()
}

fn snapshot(name: &str, src: &str) {
    if !codegen::available() {
        return;
    }
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../../../../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.set_description(src.trim());
    settings.bind(|| insta::assert_snapshot!(name, ir_of(src)));
}

#[test]
fn generated_ir_snapshots() {
    // A splat (the constant), two flat operands, relu's compare and select.
    snapshot(
        "cpu_codegen@axpy-relu",
        "%x: f32[64] = input 0\n%y: f32[64] = input 1\n%k: f32[64] = full 0.5\n\
         %a: f32[64] = mul %x, %k\n%b: f32[64] = add %a, %y\n%r: f32[64] = relu %b\nreturn %r\n",
    );
    // A matmul's epilogue: the product flat, a bias row (cols), a row scale (per row).
    snapshot(
        "cpu_codegen@matmul-bias-row-scale",
        "%x: f32[8,4] = input 0\n%w: f32[4,6] = input 1\n%b: f32[6] = input 2\n%r: f32[8,1] = input 3\n\
         %m: f32[8,6] = matmul %x, %w\n%bb: f32[8,6] = expand %b\n%rb: f32[8,6] = expand %r\n\
         %a: f32[8,6] = add %m, %bb\n%s: f32[8,6] = mul %a, %rb\nreturn %s\n",
    );
    // Bools: a mask read as bytes, a compare written as bytes, two outputs.
    snapshot(
        "cpu_codegen@where-mask",
        "%x: f32[16] = input 0\n%m: bool[16] = input 1\n%z: f32[16] = full 0.0\n\
         %c: bool[16] = gt %x, %z\n%w: f32[16] = where %m, %x, %z\nreturn %w, %c\n",
    );
    // exp: Cephes' reduction and polynomial, with fused multiply-adds.
    snapshot("cpu_codegen@exp", "%x: f32[16] = input 0\n%e: f32[16] = exp %x\nreturn %e\n");
}
