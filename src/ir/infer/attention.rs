//! The attention ops' operand checks (`attention`, `attention_stats`,
//! `attention_delta`, `attention_grad`): queries, keys, values (or the
//! output), their gradients and the mask, the statistics' dtype, and the
//! type of the log-sum-exp an attention writes as its extra output.
//! Apart from `infer.rs` because these ops share them and nothing else
//! does.

use crate::ir::{AttnMask, DType, Shape};

/// The sizes of an attention whose operands [`attention_operands`] checked.
pub(super) struct AttentionSizes {
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) sq: usize,
    pub(super) sk: usize,
    pub(super) d: usize,
    pub(super) dv: usize,
    pub(super) dtype: DType,
}

/// Checks the queries `q`, keys `k`, the `[b, h, sk | sq, dv]` operand
/// `v` (`what`: values, or the output for [`crate::ir::Op::AttentionStats`]) and the
/// mask of an attention op; gives its sizes.
pub(super) fn attention_operands(
    (q, dq): (&Shape, DType),
    (k, dk): (&Shape, DType),
    v: &Shape,
    dv: DType,
    what: &str,
    m: Option<(&Shape, DType)>,
    mask: AttnMask,
) -> Result<AttentionSizes, String> {
    for (name, dt) in [("keys", dk), (what, dv)] {
        if dt != dq {
            return Err(format!("attention {name} are {dt} but the queries are {dq}; cast one side first"));
        }
    }
    if !dq.is_float() {
        return Err(format!("attention needs float tensors, got {dq}; cast them first"));
    }
    if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return Err(format!(
            "attention takes [batch, heads, seq, dim] queries, keys and {what}, got {q}, {k} and {v}"
        ));
    }
    let (b, h, sq, d) = (q.0[0], q.0[1], q.0[2], q.0[3]);
    if k.0[..2] != q.0[..2] || v.0[..2] != q.0[..2] {
        return Err(format!("attention batch and head dims differ: queries {q}, keys {k}, {what} {v}"));
    }
    if k.0[3] != d {
        return Err(format!(
            "attention queries {q} and keys {k} have different head dims ({d} and {})",
            k.0[3]
        ));
    }
    let sk = k.0[2];
    // The values run along the keys; an output along the queries.
    let along = if what == "values" { sk } else { sq };
    if v.0[2] != along {
        return Err(if what == "values" {
            format!("attention keys {k} and values {v} have different lengths")
        } else {
            format!("attention {what} {v} have length {}, not the queries' {along}", v.0[2])
        });
    }
    if mask != AttnMask::None {
        let (m, dm) = m.ok_or_else(|| "attention lacks its mask operand".to_string())?;
        let want = Shape(vec![b, h, sq, sk]);
        if *m != want {
            return Err(format!("attention mask {m} must have shape {want} (broadcast it first)"));
        }
        match mask {
            AttnMask::Additive if dm != dq => {
                return Err(format!("an additive attention mask must be {dq} like the queries, got {dm}"))
            }
            AttnMask::Keep if dm != DType::Bool => {
                return Err(format!("a boolean attention mask must be bool, got {dm}"))
            }
            _ => {}
        }
    }
    Ok(AttentionSizes { b, h, sq, sk, d, dv: v.0[3], dtype: dq })
}

/// Checks that `x` (`xn`) and `y` (`yn`) are both `[b, h, sq, dv]` rows
/// of the attention's dtype.
pub(super) fn check_rows(
    a: &AttentionSizes,
    xn: &str,
    (x, dx): (&Shape, DType),
    yn: &str,
    (y, dy): (&Shape, DType),
) -> Result<(), String> {
    let want = Shape(vec![a.b, a.h, a.sq, a.dv]);
    for (name, s, dt) in [(xn, x, dx), (yn, y, dy)] {
        if *s != want || dt != a.dtype {
            return Err(format!("the attention {name} must be {} {want}, got {dt} {s}", a.dtype));
        }
    }
    Ok(())
}

/// The dtype of [`crate::ir::Op::AttentionStats`] for queries of `dtype`: the type
/// attention accumulates in (f64 for f64, f32 otherwise).
pub(super) fn attention_stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The type of an attention's extra output 1 (`extra %attention
/// output=1`): each query row's log-sum-exp, `[b, h, sq]` in the stats'
/// dtype, for queries `q` of `dtype`; `None` for queries that are not
/// `[b, h, sq, d]` floats.
pub(crate) fn attention_lse_type(q: &Shape, dtype: DType) -> Option<(Shape, DType)> {
    (q.rank() == 4 && dtype.is_float()).then(|| (Shape(q.0[..3].to_vec()), attention_stats_dtype(dtype)))
}

/// The type of `attention_delta o, g, lse`: `[b, h, sq, 2]` stats.
pub(super) fn attention_delta_type(
    o: (&Shape, DType),
    g: (&Shape, DType),
    lse: (&Shape, DType),
) -> Result<(Shape, DType), String> {
    let (os, dt) = o;
    if os.rank() != 4 || !dt.is_float() {
        return Err(format!("attention_delta takes a [batch, heads, seq, dim] float output, got {dt} {os}"));
    }
    if *g.0 != *os || g.1 != dt {
        return Err(format!("the attention output's gradient must be {dt} {os}, got {} {}", g.1, g.0));
    }
    let (want, sdt) = attention_lse_type(os, dt).ok_or("not an attention output")?;
    if *lse.0 != want || lse.1 != sdt {
        return Err(format!(
            "attention_delta takes the {sdt} {want} log-sum-exp its attention wrote, got {} {}",
            lse.1, lse.0
        ));
    }
    Ok((Shape(vec![os.0[0], os.0[1], os.0[2], 2]), sdt))
}
