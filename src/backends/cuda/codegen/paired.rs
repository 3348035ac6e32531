//! Two elements a thread computes side by side, with their roundings to
//! a 16-bit float paired.
//!
//! An f16 or bf16 chain rounds after every op (`types::settle`), and each
//! rounding is a conversion, which issues at a quarter of float
//! arithmetic's rate (16 a cycle per multiprocessor on sm_80 and sm_90):
//! in a bf16 kernel the conversions, not memory, set the time.
//! `cvt.rn.bf16x2.f32` (and `f16x2`) rounds two floats in one
//! instruction, so where a thread computes several elements of one body
//! (an elementwise kernel's eight, a row kernel's columns), the generator
//! emits them two at a time, every statement twice, and a rounding of
//! both as one `kiln::rnd2_bf16(a, b, ra, rb)`. The values are the same
//! bits as two `kiln::rnd_bf16` calls (the emulator runs exactly those).
//!
//! Measured alone on an H200 (`benches/probes/layer_norm.py`): BERT-base's
//! residual add and layer norm over `[4096, 768]` bf16, 9.9 us with one
//! conversion a rounding, 8.2 paired, 7.9 with no rounding at all.

use super::body::Body;
use super::types;
use crate::ir::{DType, NodeId};

/// Whether any of `nodes` rounds its result to a 16-bit float (so that
/// computing elements in pairs pays).
pub(crate) fn rounds(body: &Body<'_>, nodes: &[NodeId]) -> bool {
    nodes
        .iter()
        .any(|&n| body.unsettled(n, &|o| format!("v{}", o.index())).is_ok_and(|(_, half)| half.is_some()))
}

/// The statements computing `id` for two elements, into `vars[0]` and
/// `vars[1]`, reading the operands of element `k` through `operands[k]`:
/// one paired rounding where `id` rounds to a 16-bit float, else one
/// statement an element.
pub(crate) fn statements(
    body: &Body<'_>,
    id: NodeId,
    vars: [&str; 2],
    operands: [&dyn Fn(NodeId) -> String; 2],
) -> Result<Vec<String>, String> {
    let (e0, half) = body.unsettled(id, operands[0])?;
    let (e1, _) = body.unsettled(id, operands[1])?;
    let ty = types::compute(body.g.node(id).dtype);
    let [a, b] = vars;
    Ok(match half {
        Some(d) => {
            let f = if d == DType::BF16 { "rnd2_bf16" } else { "rnd2_f16" };
            vec![format!("{ty} {a}, {b};"), format!("kiln::{f}({e0}, {e1}, {a}, {b});")]
        }
        None => vec![format!("const {ty} {a} = {e0};"), format!("const {ty} {b} = {e1};")],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::cuda::codegen::body::{Operand, Source};
    use crate::backends::cuda::codegen::index::Access;
    use crate::backends::Layout;
    use crate::ir::Shape;

    #[test]
    fn half_roundings_pair_and_wider_results_stay_two_statements() {
        let g = crate::ir::text::parse(
            "%x: bf16[8] = input 0\n%y: bf16[8] = input 1\n%s: bf16[8] = add %x, %y\n\
             %w: f32[8] = cast %s\n%e: f32[8] = exp %w\n%h: f16[8] = cast %e\nreturn %h\n",
        )
        .unwrap();
        let operand = || Operand {
            source: Source::Buffer,
            access: Access::strided(Layout::contiguous(Shape(vec![8]))),
            dtype: DType::BF16,
        };
        let body = Body::new(&g, &[operand(), operand()]).unwrap();
        let [x, y, s, w, e, h]: [NodeId; 6] = body.order.clone().try_into().unwrap();
        let lane = |k: usize| move |o: NodeId| format!("v{}_{k}", o.index());
        let (l0, l1) = (lane(0), lane(1));
        let emit = |n: NodeId| statements(&body, n, ["p", "q"], [&l0, &l1]).unwrap().join(" ");
        let (xi, yi) = (x.index(), y.index());
        assert_eq!(
            emit(s),
            format!("float p, q; kiln::rnd2_bf16((v{xi}_0 + v{yi}_0), (v{xi}_1 + v{yi}_1), p, q);")
        );
        assert_eq!(emit(w), format!("const float p = v{0}_0; const float q = v{0}_1;", s.index()));
        assert_eq!(
            emit(e),
            format!("const float p = expf(v{0}_0); const float q = expf(v{0}_1);", w.index())
        );
        assert_eq!(emit(h), format!("float p, q; kiln::rnd2_f16(v{0}_0, v{0}_1, p, q);", e.index()));
        assert!(rounds(&body, &[s]) && !rounds(&body, &[w, e]) && rounds(&body, &[h]));
        // One element at a time: the same value, rounded alone.
        let single = body.statement(s, "p", &l0).unwrap();
        assert_eq!(single, format!("const float p = kiln::rnd_bf16((v{xi}_0 + v{yi}_0));"));
    }
}
