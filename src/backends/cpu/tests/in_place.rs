//! Fused kernels run in place: an operand read from the output, extra
//! outputs written over their operands (AdamW's moments), against fresh
//! outputs bit for bit; and the calls a kernel refuses.

use super::fused::{inputs_of, sized, FLOAT_BODY, SOFTMAX};
use crate::backends::cpu::codegen::Codegen;
use crate::backends::cpu::fused::FusedKernel;
use crate::backends::cpu::storage::Out;
use crate::backends::cpu::{CpuBackend, CpuBuffer};
use crate::backends::{Backend, Buffer};
use crate::ir::text::parse;
use crate::ir::*;

fn buffers(be: &CpuBackend, g: &Graph) -> Vec<CpuBuffer> {
    inputs_of(g)
        .into_iter()
        .zip(FusedBody::new(g.clone()).unwrap().input_nodes())
        .map(|(d, i)| match be.upload(d, &g.node(i).shape).unwrap() {
            Buffer::Cpu(c) => c,
            #[allow(unreachable_patterns)]
            _ => unreachable!("the CPU backend makes CPU buffers"),
        })
        .collect()
}

/// `run` in place on operand `k` gives what it gives out of place.
fn in_place_agrees(body: &str, k: usize, what: &str) {
    let g = parse(body).unwrap();
    let fb = FusedBody::new(g.clone()).unwrap();
    let kernel = FusedKernel::compile(&fb, fb.output(), Codegen::Measured).unwrap();
    assert!(kernel.can_run_in_place(k), "{what}: operand {k} qualifies");
    let be = CpuBackend::new();
    let bufs = buffers(&be, &g);
    let n = fb.graph().node(fb.output()).shape.numel();
    let mut want = vec![0f32; n];
    let args: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
    kernel.run(&args, None, &mut want, Vec::new()).unwrap();
    let mut got = bufs[k].view::<f32>().unwrap().data.to_vec();
    let mut args = args.clone();
    args[k] = None;
    kernel.run(&args, Some(k), &mut got, Vec::new()).unwrap();
    assert_eq!(got, want, "{what}");
}

#[test]
fn in_place_matches_out_of_place() {
    in_place_agrees(&sized(FLOAT_BODY, "f32", 300, 257), 0, "elementwise");
    in_place_agrees(&sized(SOFTMAX, "f32", 129, 1030).replace("[R,1]", "[129,1]"), 0, "softmax");
    let mm = "%x: f32[300,64] = input 0\n%w: f32[64,70] = input 1\n%res: f32[300,70] = input 2\n\
              %m: f32[300,70] = matmul %x, %w\n%z: f32[300,70] = add %m, %res\nreturn %z\n";
    in_place_agrees(mm, 2, "matmul residual");
    // An expanded operand, a matmul operand, another dtype: never in place.
    let g = parse(&sized(FLOAT_BODY, "f32", 37, 129)).unwrap();
    let kernel =
        FusedKernel::compile(&FusedBody::new(g.clone()).unwrap(), g.outputs()[0], Codegen::Measured).unwrap();
    assert!(!kernel.can_run_in_place(1));
    let be = CpuBackend::new();
    let bufs = buffers(&be, &g);
    let mut out = vec![0f32; 37 * 129];
    let e = kernel.run(&[Some(&bufs[0]), None], Some(1), &mut out, Vec::new()).err().map(|e| e.to_string());
    let want = format!(
        "backend error: cpu: fused {}: operand 1 cannot be computed in place \
         (it is not read elementwise at the output's type)",
        g.outputs()[0]
    );
    assert_eq!(e, Some(want));
    let mmg = parse(mm).unwrap();
    let mmk =
        FusedKernel::compile(&FusedBody::new(mmg.clone()).unwrap(), mmg.outputs()[0], Codegen::Measured)
            .unwrap();
    assert!(!mmk.can_run_in_place(0) && !mmk.can_run_in_place(1));
}

#[test]
fn bad_runs_are_errors() {
    let g = parse(&sized(FLOAT_BODY, "f32", 4, 3)).unwrap();
    let kernel =
        FusedKernel::compile(&FusedBody::new(g.clone()).unwrap(), g.outputs()[0], Codegen::Measured).unwrap();
    let be = CpuBackend::new();
    let bufs = buffers(&be, &g);
    let msg = |r: crate::Result<()>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let mut wrong = vec![0f64; 12];
    assert!(msg(kernel.run(&[Some(&bufs[0]), Some(&bufs[1])], None, &mut wrong, Vec::new()))
        .contains("output is f32[4,3]"));
    let mut out = vec![0f32; 12];
    assert!(msg(kernel.run(&[Some(&bufs[0])], None, &mut out, Vec::new()))
        .contains("1 operand(s) given, the body reads 2"));
    assert!(
        msg(kernel.run(&[Some(&bufs[0]), None], None, &mut out, Vec::new())).contains("operand 1 is missing")
    );
    assert!(msg(kernel.run(&[Some(&bufs[1]), Some(&bufs[1])], None, &mut out, Vec::new()))
        .contains("operand 0 is f32[3]"));
    assert!(msg(kernel.run(&[Some(&bufs[0]), Some(&bufs[1])], Some(0), &mut out, Vec::new()))
        .contains("pass None"));
}

/// An AdamW update: the parameter, and its two moments as extra outputs,
/// each of which the optimizer writes over the operand holding its old
/// value (`p` 0, `m` 2, `v` 3).
const ADAMW: &str = "
%p: f32[D] = input 0
%g: f32[D] = input 1
%m: f32[D] = input 2
%b1: f32[D] = full 0.9
%c1: f32[D] = full 0.1
%m1: f32[D] = mul %m, %b1
%m2: f32[D] = mul %g, %c1
%mn: f32[D] = add %m1, %m2
%v: f32[D] = input 3
%b2: f32[D] = full 0.999
%c2: f32[D] = full 0.001
%v1: f32[D] = mul %v, %b2
%gg: f32[D] = mul %g, %g
%v2: f32[D] = mul %gg, %c2
%vn: f32[D] = add %v1, %v2
%sq: f32[D] = sqrt %vn
%eps: f32[D] = full 1e-8
%de: f32[D] = add %sq, %eps
%st: f32[D] = div %mn, %de
%lr: f32[D] = full 0.01
%up: f32[D] = mul %st, %lr
%pn: f32[D] = sub %p, %up
return %pn, %mn, %vn
";

/// Extra outputs written over their operands (`run_over`), with or without
/// the value in place too, give what fresh outputs give, bit for bit: over
/// one block and one thread, over many blocks on several threads, and on
/// the interpreter as on generated code.
#[test]
fn extra_outputs_written_over_their_operands_match_fresh_ones() {
    for codegen in [Codegen::Measured, Codegen::Off] {
        for dims in ["10", "4097", "300,257"] {
            let g = parse(&ADAMW.replace("[D]", &format!("[{dims}]"))).unwrap();
            let fb = FusedBody::new(g.clone()).unwrap();
            let kernel = FusedKernel::compile(&fb, fb.output(), codegen).unwrap();
            let (p, m, v) = (0, 2, 3);
            assert!(kernel.can_run_in_place(p) && kernel.can_write_extra_over(1, m));
            assert!(kernel.can_write_extra_over(2, v) && !kernel.can_write_extra_over(0, m));
            let be = CpuBackend::new();
            let bufs = buffers(&be, &g);
            let n = fb.graph().node(fb.output()).shape.numel();
            let old = |k: usize| bufs[k].view::<f32>().unwrap().data.to_vec();
            let mut want = [vec![0f32; n], vec![0f32; n], vec![0f32; n]];
            {
                let [w0, w1, w2] = &mut want;
                let args: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
                let outs = vec![Out::new(w1.as_mut_slice()), Out::new(w2.as_mut_slice())];
                kernel.run(&args, None, w0, outs).unwrap();
            }
            for value_in_place in [false, true] {
                let what = format!("[{dims}], {codegen:?}, value in place {value_in_place}");
                let mut got = [if value_in_place { old(p) } else { vec![0f32; n] }, old(m), old(v)];
                let mut args: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
                args[m] = None;
                args[v] = None;
                let in_place = value_in_place.then(|| {
                    args[p] = None;
                    p
                });
                let [g0, g1, g2] = &mut got;
                let outs = vec![Out::new(g1.as_mut_slice()), Out::new(g2.as_mut_slice())];
                kernel.run_over(&args, in_place, g0, outs, &[Some(m), Some(v)]).unwrap();
                for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: output {j}");
                }
            }
        }
    }
    // The value written over an operand that only an extra output reads,
    // whose leaf comes after the value's step: it is read before the value
    // is written (the leaves of a block are read first).
    for codegen in [Codegen::Measured, Codegen::Off] {
        let g = parse(
            "%x: f32[300,257] = input 0\n%k: f32[300,257] = full 2.0\n%a: f32[300,257] = mul %x, %k\n\
             %y: f32[300,257] = input 1\n%b: f32[300,257] = add %y, %x\nreturn %a, %b\n",
        )
        .unwrap();
        let fb = FusedBody::new(g.clone()).unwrap();
        let kernel = FusedKernel::compile(&fb, fb.output(), codegen).unwrap();
        let be = CpuBackend::new();
        let bufs = buffers(&be, &g);
        let n = 300 * 257;
        let (mut want, mut want_b) = (vec![0f32; n], vec![0f32; n]);
        let args: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
        kernel.run(&args, None, &mut want, vec![Out::new(want_b.as_mut_slice())]).unwrap();
        let mut got = bufs[1].view::<f32>().unwrap().data.to_vec();
        let mut got_b = vec![0f32; n];
        let args = [Some(&bufs[0]), None];
        kernel.run_over(&args, Some(1), &mut got, vec![Out::new(got_b.as_mut_slice())], &[]).unwrap();
        assert!(got == want && got_b == want_b, "{codegen:?}: the value over the extra's operand");
    }
    // Misuse is an error, never a wrong read.
    let g = parse(&ADAMW.replace("[D]", "[10]")).unwrap();
    let fb = FusedBody::new(g.clone()).unwrap();
    let kernel = FusedKernel::compile(&fb, fb.output(), Codegen::Measured).unwrap();
    let be = CpuBackend::new();
    let bufs = buffers(&be, &g);
    let (mut a, mut b, mut c) = (vec![0f32; 10], vec![0f32; 10], vec![0f32; 10]);
    let mut run = |args: &[Option<&CpuBuffer>], in_place: Option<usize>, over: &[Option<usize>]| {
        let outs = vec![Out::new(b.as_mut_slice()), Out::new(c.as_mut_slice())];
        kernel.run_over(args, in_place, &mut a, outs, over).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let all: Vec<Option<&CpuBuffer>> = bufs.iter().map(Some).collect();
    assert!(run(&all, None, &[Some(2), None]).contains("output 1 is written over operand 2; pass None"));
    let no_m = [Some(&bufs[0]), Some(&bufs[1]), None, Some(&bufs[3])];
    assert!(run(&no_m, None, &[Some(2), Some(2)]).contains("two outputs are written over operand 2"));
    assert!(run(&no_m, Some(2), &[Some(2), None]).contains("two outputs are written over operand 2"));
    assert!(run(&no_m, None, &[None, None]).contains("operand 2 is missing"));
    assert!(run(&no_m, None, &[Some(2), None, None]).contains("3 extra output(s) written over operands"));
    // An operand read through a broadcast: never written over.
    let g = parse(
        "%x: f32[4,3] = input 0\n%b: f32[4,3] = input 1\n%c: f32[3] = input 2\n%cb: f32[4,3] = expand %c\n\
         %y: f32[4,3] = add %x, %cb\n%z: f32[4,3] = mul %b, %cb\nreturn %y, %z\n",
    )
    .unwrap();
    let fb = FusedBody::new(g.clone()).unwrap();
    let kernel = FusedKernel::compile(&fb, fb.output(), Codegen::Measured).unwrap();
    assert!(kernel.can_write_extra_over(1, 1) && kernel.can_write_extra_over(1, 0));
    assert!(!kernel.can_write_extra_over(1, 2) && !kernel.can_write_extra_over(0, 1));
    let bufs = buffers(&be, &g);
    let (mut y, mut z) = (vec![0f32; 12], vec![0f32; 12]);
    let e = kernel
        .run_over(
            &[Some(&bufs[0]), Some(&bufs[1]), None],
            None,
            &mut y,
            vec![Out::new(z.as_mut_slice())],
            &[Some(2)],
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("output 1 cannot be written over operand 2"), "{e}");
}
