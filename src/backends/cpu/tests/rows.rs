//! The hand-fused softmax and layer-norm row kernels (`fused/rows.rs`)
//! against the interpreter, bit for bit: rows of every tail length of the
//! 16-wide sums, special values (NaN, infinities, signed zeros,
//! subnormals, `exp`'s edges), plain random rows, an input computed in
//! place, a gathered (transposed) input, and an input of one value, which
//! the row kernels hand back to the interpreter. Plus which bodies they
//! take and which they must leave alone.

use super::philox;
use crate::backends::cpu::codegen::Codegen;
use crate::backends::cpu::fused::FusedKernel;
use crate::backends::cpu::{CpuBackend, CpuBuffer};
use crate::backends::{Backend, Buffer};
use crate::ir::text::parse;
use crate::ir::*;

const SOFTMAX: &str = "
%x: f32[R,C] = input 0
%m: f32[R,1] = max %x dims=[1] keepdim
%mb: f32[R,C] = expand %m
%d: f32[R,C] = sub %x, %mb
%e: f32[R,C] = exp %d
%s: f32[R,1] = sum %e dims=[1] keepdim
%sb: f32[R,C] = expand %s
%y: f32[R,C] = div %e, %sb
return %y
";

/// Layer norm up to the affine part; `AFFINE` variants append to it.
const NORM: &str = "
%x: f32[R,C] = input 0
%mu: f32[R,1] = mean %x dims=[1] keepdim
%mub: f32[R,C] = expand %mu
%xc: f32[R,C] = sub %x, %mub
%sq: f32[R,C] = mul %xc, %xc
%var: f32[R,1] = mean %sq dims=[1] keepdim
%eps: f32[R,1] = full 0.00001
%ve: f32[R,1] = add %eps, %var
%rs: f32[R,1] = rsqrt %ve
%rsb: f32[R,C] = expand %rs
%n: f32[R,C] = mul %rsb, %xc
";

/// Tails of [`NORM`]: none, a weight, a bias, both (operands in either
/// order), and a constant weight (one value for every element).
const AFFINE: [&str; 5] = [
    "return %n\n",
    "%g: f32[C] = input 1\n%gb: f32[R,C] = expand %g\n%y: f32[R,C] = mul %n, %gb\nreturn %y\n",
    "%b: f32[C] = input 1\n%bb: f32[R,C] = expand %b\n%y: f32[R,C] = add %bb, %n\nreturn %y\n",
    "%g: f32[C] = input 1\n%b: f32[C] = input 2\n%gb: f32[R,C] = expand %g\n%bb: f32[R,C] = expand %b\n\
     %sc: f32[R,C] = mul %gb, %n\n%y: f32[R,C] = add %sc, %bb\nreturn %y\n",
    "%g: f32[R,C] = full 1.5\n%b: f32[C] = input 1\n%bb: f32[R,C] = expand %b\n\
     %sc: f32[R,C] = mul %n, %g\n%y: f32[R,C] = add %sc, %bb\nreturn %y\n",
];

fn sized(body: &str, r: usize, c: usize) -> String {
    body.replace("[R,C]", &format!("[{r},{c}]"))
        .replace("[R,1]", &format!("[{r},1]"))
        .replace("[C]", &format!("[{c}]"))
        .replace("[C,R0]", &format!("[{c},{r}]"))
}

/// `n` values: random in `[-4, 4)` (scaled by `scale`), and with
/// `specials` one of NaN, the infinities, signed zeros, a subnormal and
/// values past `exp`'s edges at fixed strides.
fn floats(n: usize, seed: u64, scale: f32, specials: bool) -> Vec<f32> {
    let special = [
        (97, f32::NAN),
        (89, f32::INFINITY),
        (83, f32::NEG_INFINITY),
        (79, -0.0),
        (73, 0.0),
        (71, 1e-40),
        (67, 95.0),
    ];
    (0..n)
        .map(|i| match special.iter().find(|(k, _)| specials && i % k == k - 1) {
            Some(&(_, v)) => v,
            None => (philox::uniform(seed, 11, i as u64) * 8.0 - 4.0) as f32 * scale,
        })
        .collect()
}

fn upload(be: &CpuBackend, data: Vec<f32>, shape: &Shape) -> CpuBuffer {
    match be.upload(HostData::F32(data), shape).expect("uploads") {
        Buffer::Cpu(c) => c,
        #[allow(unreachable_patterns)]
        _ => unreachable!("the CPU backend makes CPU buffers"),
    }
}

fn compile(src: &str, codegen: Codegen) -> (FusedBody, FusedKernel) {
    let fb = FusedBody::new(parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"))).expect("a legal body");
    let k = FusedKernel::compile(&fb, fb.output(), codegen).expect("compiles");
    (fb, k)
}

/// Runs the body of `src` by the row kernel and by the interpreter on
/// the same inputs and demands the same bits (any NaN matching any NaN).
/// `in_place`: also runs the row kernel with operand 0 computed in place.
fn agree(src: &str, seed: u64, scale: f32, specials: bool, in_place: bool, what: &str) {
    let (fb, rows) = compile(src, Codegen::Measured);
    let (_, interp) = compile(src, Codegen::Off);
    assert!(rows.row_kernel_name().is_some(), "{what}: a row kernel runs the body");
    assert_eq!(interp.row_kernel_name(), None, "{what}: the interpreter runs the body");
    let be = CpuBackend::new();
    let data: Vec<Vec<f32>> = fb
        .input_nodes()
        .iter()
        .enumerate()
        .map(|(k, &i)| floats(fb.graph().node(i).shape.numel(), seed + k as u64, scale, specials))
        .collect();
    let bufs: Vec<CpuBuffer> = fb
        .input_nodes()
        .iter()
        .zip(&data)
        .map(|(&i, d)| upload(&be, d.clone(), &fb.graph().node(i).shape))
        .collect();
    let args: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
    let n = fb.graph().node(fb.output()).shape.numel();
    let (mut got, mut want) = (vec![0f32; n], vec![0f32; n]);
    rows.run(&args, None, &mut got, Vec::new()).expect("the row kernel runs");
    interp.run(&args, None, &mut want, Vec::new()).expect("the interpreter runs");
    let same = |a: &[f32], how: &str| {
        for (i, (p, q)) in a.iter().zip(&want).enumerate() {
            let ok = p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan());
            assert!(ok, "{what} ({how}): element {i}: row kernel {p:e}, interpreter {q:e}");
        }
    };
    same(&got, "out of place");
    if in_place && rows.can_run_in_place(0) {
        let mut over = data[0].clone();
        let mut args = args.clone();
        args[0] = None;
        rows.run(&args, Some(0), &mut over, Vec::new()).expect("runs in place");
        same(&over, "in place");
    }
}

#[test]
fn row_kernels_match_the_interpreter_bit_for_bit() {
    // Every tail of the 16-wide sums and 32-wide max, one row, two
    // columns, blocks of several rows and a short last block, a row longer
    // than a block, and enough work to run in parallel.
    let sizes = [(3, 2), (5, 7), (4, 16), (2, 31), (6, 33), (37, 1000), (1, 5000), (129, 1030), (64, 1024)];
    for (i, &(r, c)) in sizes.iter().enumerate() {
        let seed = 40 + 10 * i as u64;
        for (specials, scale) in [(false, 1.0), (true, 1.0), (false, 30.0)] {
            let what = format!("[{r},{c}] specials={specials} scale={scale}");
            agree(&sized(SOFTMAX, r, c), seed, scale, specials, true, &format!("softmax {what}"));
            for (k, tail) in AFFINE.iter().enumerate() {
                let body = sized(&format!("{NORM}{tail}"), r, c);
                agree(&body, seed + 1, scale, specials, true, &format!("layer norm {k} {what}"));
            }
        }
    }
}

#[test]
fn a_gathered_input_runs_the_row_kernel_and_one_value_the_interpreter() {
    // The input is a transposed view, gathered per block.
    let t = "%i: f32[C,R0] = input 0\n%x: f32[R,C] = permute %i perm=[1,0]\n";
    let soft = SOFTMAX.replace("%x: f32[R,C] = input 0\n", t);
    agree(&sized(&soft, 37, 129), 3, 1.0, true, false, "softmax of a transpose");
    let norm = format!("{}{}", NORM.replace("%x: f32[R,C] = input 0\n", t), AFFINE[3]);
    agree(&sized(&norm, 37, 129), 4, 1.0, false, false, "layer norm of a transpose");
    // One value everywhere: the row kernel declines and the interpreter
    // runs the block (same bits either way).
    let one = sized(&SOFTMAX.replace("input 0", "full 2.5"), 9, 40);
    let (_, rows) = compile(&one, Codegen::Measured);
    let (_, interp) = compile(&one, Codegen::Off);
    let (mut got, mut want) = (vec![0f32; 360], vec![1f32; 360]);
    rows.run(&[], None, &mut got, Vec::new()).expect("runs");
    interp.run(&[], None, &mut want, Vec::new()).expect("runs");
    assert_eq!(got, want);
    assert_eq!(got[0], 1.0 / 40.0);
}

#[test]
fn only_softmax_and_layer_norm_bodies_on_f32_rows_take_a_row_kernel() {
    let kernel = |src: &str| compile(src, Codegen::Measured).1.row_kernel_name();
    assert_eq!(kernel(&sized(SOFTMAX, 4, 8)), Some("softmax"));
    for tail in AFFINE {
        assert_eq!(kernel(&sized(&format!("{NORM}{tail}"), 4, 8)), Some("layer_norm"), "{tail}");
    }
    // The interpreter alone, when asked.
    assert_eq!(compile(&sized(SOFTMAX, 4, 8), Codegen::Off).1.row_kernel_name(), None);
    // Another dtype; one column (a row value is then the row itself).
    assert_eq!(kernel(&sized(SOFTMAX, 4, 8).replace("f32", "f64")), None);
    assert_eq!(kernel(&sized(SOFTMAX, 4, 1)), None);
    // One step more or different: the interpreter's business.
    let scaled = SOFTMAX.replace("return %y", "%k: f32[R,C] = full 2\n%z: f32[R,C] = mul %y, %k\nreturn %z");
    assert_eq!(kernel(&sized(&scaled, 4, 8)), None);
    let of_computed =
        SOFTMAX.replace("%m: f32[R,1] = max %x", "%a: f32[R,C] = abs %x\n%m: f32[R,1] = max %a");
    assert_eq!(kernel(&sized(&of_computed, 4, 8)), None);
    assert_eq!(kernel(&sized(&SOFTMAX.replace("exp %d", "tanh %d"), 4, 8)), None);
    assert_eq!(kernel(&sized(&SOFTMAX.replace("max %x", "min %x"), 4, 8)), None);
    let add_then_mul = "%g: f32[C] = input 1\n%gb: f32[R,C] = expand %g\n%a: f32[R,C] = add %n, %gb\n\
                        %y: f32[R,C] = mul %a, %gb\nreturn %y\n";
    assert_eq!(kernel(&sized(&format!("{NORM}{add_then_mul}"), 4, 8)), None);
    let computed_weight = "%g: f32[C] = input 1\n%gb: f32[R,C] = expand %g\n%h: f32[R,C] = exp %gb\n\
                           %y: f32[R,C] = mul %n, %h\nreturn %y\n";
    assert_eq!(kernel(&sized(&format!("{NORM}{computed_weight}"), 4, 8)), None);
    let var_of_x = NORM.replace("%var: f32[R,1] = mean %sq", "%var: f32[R,1] = mean %x");
    assert_eq!(kernel(&sized(&format!("{var_of_x}return %n\n"), 4, 8)), None);
}
