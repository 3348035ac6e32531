use super::*;
use crate::ir::text::{parse, print};

fn run(src: &str, low: Option<DType>) -> (String, PassCtx) {
    let mut g = parse(src).unwrap();
    let mut cx =
        PassCtx { options: PassOptions { autocast: low, ..PassOptions::default() }, ..PassCtx::default() };
    Autocast.run(&mut g, &mut cx).unwrap();
    crate::ir::verify(&g).unwrap();
    (print(&g), cx)
}

const LINEAR: &str = "%x: f32[4,3] = input 0\n\
                      %w: f32[3,2] = input 1\n\
                      %b: f32[2] = input 2\n\
                      %mm: f32[4,2] = matmul %x, %w\n\
                      %be: f32[4,2] = expand %b\n\
                      %y: f32[4,2] = add %mm, %be\n\
                      %r: f32[4,2] = relu %y\n\
                      %wt: f32[2,3] = permute %w perm=[1,0]\n\
                      %back: f32[4,3] = matmul %r, %wt\n\
                      %s: f32[] = sum %back dims=[0,1]\n\
                      return %s, %r\n";

#[test]
fn without_autocast_nothing_changes() {
    let (text, cx) = run(LINEAR, None);
    assert_eq!(text, print(&parse(LINEAR).unwrap()));
    assert!(cx.notes.is_empty());
}

#[test]
fn a_weight_read_twice_is_cast_once_and_outputs_keep_their_dtype() {
    let (text, cx) = run(LINEAR, Some(DType::BF16));
    // One cast of w, under the permute the backward product reads.
    assert_eq!(text.matches("cast %1").count(), 1, "{text}");
    assert!(text.contains("bf16[2,3] = permute"), "{text}");
    // relu is returned, so it and the bias add before it stay f32 (they
    // reach an output through following ops only); the product reading
    // relu casts it down once.
    assert!(text.contains("f32[4,2] = add"), "{text}");
    assert!(text.contains("f32[4,2] = relu"), "{text}");
    assert_eq!(text.matches("bf16[4,2] = cast").count(), 1, "{text}");
    let g = parse(&text).unwrap();
    let outs: Vec<DType> = g.outputs().iter().map(|&o| g.node(o).dtype).collect();
    assert_eq!(outs, [DType::F32, DType::F32]);
    assert!(cx.notes[0].starts_with("autocast bf16: products=bf16(matmul conv2d attention)"));
}

#[test]
fn other_types_are_refused() {
    let mut g = parse(LINEAR).unwrap();
    let mut cx = PassCtx {
        options: PassOptions { autocast: Some(DType::F64), ..PassOptions::default() },
        ..PassCtx::default()
    };
    let err = Autocast.run(&mut g, &mut cx).unwrap_err();
    assert_eq!(err.to_string(), "configuration error: autocast runs in bf16 or f16, not f64");
}

#[test]
fn settings_parse_and_print() {
    let o = PassOptions::from_settings(&["autocast=f16"]).unwrap();
    assert_eq!(o.autocast, Some(DType::F16));
    assert_eq!(o.to_string(), "streams=1 autocast=f16");
    let e = PassOptions::from_settings(&["autocast=f32"]).unwrap_err();
    assert!(e.to_string().contains("autocast runs in bf16 or f16, not `f32`"), "{e}");
}
