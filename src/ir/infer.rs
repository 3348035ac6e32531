//! Shape and dtype inference: the one place that says which operands an op
//! accepts and what it produces. The user API, the parser and the verifier
//! all call [`infer`], so they cannot disagree.

use super::{AttnLayout, AttnWrt, BinaryOp, Collective, DType, Op, ReduceOp, Shape};

mod attention;
pub(crate) use attention::attention_lse_type;
use attention::{attention_delta_type, attention_operands, attention_stats_dtype, check_rows};

/// The result type of `op` applied to operands of the given types, or a
/// message saying what is wrong. `Ok(None)` for source ops, whose type is
/// declared on the node.
pub fn infer(op: &Op, operands: &[(&Shape, DType)]) -> Result<Option<(Shape, DType)>, String> {
    let name = op.mnemonic();
    match op.arity() {
        Some(n) if operands.len() != n => {
            return Err(format!("{name} takes {n} operand(s), got {}", operands.len()))
        }
        None if operands.len() < 2 => {
            return Err(format!("{name} takes two or more operands, got {}", operands.len()))
        }
        _ => {}
    }
    let ty = |i: usize| (operands[i].0, operands[i].1);
    let ty_opt = |i: usize| operands.get(i).map(|o| (o.0, o.1));
    let out = match op {
        // An extra's type is its fused operand's body output, which the
        // verifier checks: the operand's type alone does not say it.
        Op::Input(_)
        | Op::Buffer(_)
        | Op::Full(_)
        | Op::Arange { .. }
        | Op::Random { .. }
        | Op::Extra { .. } => return Ok(None),
        Op::Reshape(target) => {
            let (s, d) = ty(0);
            if s.numel() != target.numel() {
                return Err(format!(
                    "cannot reshape {s} ({} elements) to {target} ({} elements)",
                    s.numel(),
                    target.numel()
                ));
            }
            (target.clone(), d)
        }
        Op::Permute(perm) => {
            let (s, d) = ty(0);
            let mut seen = vec![false; s.rank()];
            if perm.len() != s.rank()
                || perm.iter().any(|&p| p >= s.rank() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!(
                    "permutation {perm:?} is not a permutation of the {} dims of {s}",
                    s.rank()
                ));
            }
            (Shape(perm.iter().map(|&p| s.0[p]).collect()), d)
        }
        Op::Expand(target) => {
            let (s, d) = ty(0);
            if !s.broadcasts_to(target) {
                return Err(format!("cannot broadcast {s} to {target}"));
            }
            (target.clone(), d)
        }
        Op::Slice { dim, start, step, len } => {
            let (s, d) = ty(0);
            let size = *s.0.get(*dim).ok_or_else(|| format!("slice dim {dim} is out of range for {s}"))?;
            if *step == 0 {
                return Err("slice step must be at least 1".into());
            }
            let last = len.saturating_sub(1).checked_mul(*step).and_then(|x| x.checked_add(*start));
            if *len > 0 && last.is_none_or(|last| last >= size) {
                return Err(format!(
                    "slice of {len} element(s) from {start} with step {step} runs past the end of dim {dim} (size {size}) of {s}"
                ));
            }
            let mut out = s.clone();
            out.0[*dim] = *len;
            (out, d)
        }
        Op::Unary(u) => {
            let (s, d) = ty(0);
            if d == DType::Bool || (d.is_int() && !u.allows_int()) {
                return Err(format!(
                    "{} needs a float tensor, got {d}; cast it first (e.g. .cast(DType::F32))",
                    u.mnemonic()
                ));
            }
            (s.clone(), d)
        }
        Op::Binary(b) => {
            let (s, d) = same_type(name, operands)?;
            if d == DType::Bool && !matches!(b, BinaryOp::Maximum | BinaryOp::Minimum) {
                return Err(format!("{name} is not defined on bool; cast to a numeric dtype first"));
            }
            if b.float_only() && !d.is_float() {
                return Err(format!("{name} needs a float tensor, got {d}"));
            }
            (s, d)
        }
        Op::Compare(_) => (same_type(name, operands)?.0, DType::Bool),
        Op::Where => {
            let (cs, cd) = ty(0);
            if cd != DType::Bool {
                return Err(format!("where's condition must have dtype bool, got {cd}"));
            }
            let (s, d) = same_type(name, &operands[1..])?;
            if *cs != s {
                return Err(format!("where's condition has shape {cs} but the values have {s}"));
            }
            (s, d)
        }
        Op::Cast(to) => (ty(0).0.clone(), *to),
        Op::Reduce { op: r, dims, keepdim, into } => {
            let (s, d) = ty(0);
            if let Some(to) = *into {
                let wider = d.is_float() && to.is_float() && to.size() > d.size();
                if !matches!(r, ReduceOp::Sum | ReduceOp::Mean) || !wider {
                    return Err(format!(
                        "{name} into={to} of {d}: only a float sum or mean may return a wider float than it reads"
                    ));
                }
            }
            for w in dims.windows(2) {
                if w[0] >= w[1] {
                    return Err(format!("{name} dims {dims:?} must be sorted and distinct"));
                }
            }
            if let Some(&bad) = dims.iter().find(|&&x| x >= s.rank()) {
                return Err(format!("{name} dim {bad} is out of range for {s} (rank {})", s.rank()));
            }
            match r {
                ReduceOp::Mean if !d.is_float() => {
                    return Err(format!("mean needs a float tensor, got {d}; cast it first"))
                }
                ReduceOp::Sum if d == DType::Bool => {
                    return Err("sum is not defined on bool; cast to an integer dtype first".into())
                }
                ReduceOp::ArgMax if dims.len() != 1 => {
                    return Err(format!("argmax takes exactly one dim, got {dims:?}"))
                }
                _ => {}
            }
            if s.numel() == 0 && matches!(r, ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax) {
                return Err(format!("{name} of an empty tensor {s} has no value"));
            }
            let mut out = Vec::new();
            for (i, &n) in s.0.iter().enumerate() {
                if !dims.contains(&i) {
                    out.push(n);
                } else if *keepdim {
                    out.push(1);
                }
            }
            (Shape(out), if *r == ReduceOp::ArgMax { DType::I64 } else { into.unwrap_or(d) })
        }
        Op::MatMul => {
            let ((a, da), (b, db)) = (ty(0), ty(1));
            if da != db {
                return Err(mixed(name, da, db));
            }
            if da == DType::Bool {
                return Err("matmul is not defined on bool".into());
            }
            if a.rank() < 2 || a.rank() != b.rank() {
                return Err(format!("matmul needs operands of equal rank >= 2, got {a} and {b}"));
            }
            let r = a.rank();
            if a.0[..r - 2] != b.0[..r - 2] {
                return Err(format!("matmul batch dims differ: {a} and {b}"));
            }
            if a.0[r - 1] != b.0[r - 2] {
                return Err(format!(
                    "matmul of {a} and {b}: the inner dimensions {} and {} differ",
                    a.0[r - 1],
                    b.0[r - 2]
                ));
            }
            let mut out = a.0.clone();
            out[r - 1] = b.0[r - 1];
            (Shape(out), da)
        }
        Op::Conv2d { stride, padding, dilation, groups } => {
            let ((x, dx), (w, dw)) = (ty(0), ty(1));
            if dx != dw {
                return Err(mixed(name, dx, dw));
            }
            if !dx.is_float() {
                return Err(format!("conv2d needs a float tensor, got {dx}; cast it first"));
            }
            if x.rank() != 4 || w.rank() != 4 {
                return Err(format!("conv2d needs an NCHW input and an OIHW weight, got {x} and {w}"));
            }
            let g = *groups;
            if g == 0 || x.0[1] % g != 0 || w.0[0] % g != 0 || w.0[1].checked_mul(g) != Some(x.0[1]) {
                return Err(format!(
                    "conv2d with {g} group(s): input {x} has {} channels but weight {w} expects {} per group",
                    x.0[1], w.0[1]
                ));
            }
            if w.0[2] == 0 || w.0[3] == 0 {
                return Err(format!("conv2d weight {w} has an empty kernel"));
            }
            if stride.contains(&0) || dilation.contains(&0) {
                return Err("conv2d stride and dilation must be at least 1".into());
            }
            let h = window_out(x.0[2], w.0[2], stride[0], padding[0], dilation[0])
                .ok_or_else(|| format!("conv2d kernel {w} is larger than the padded input {x}"))?;
            let wd = window_out(x.0[3], w.0[3], stride[1], padding[1], dilation[1])
                .ok_or_else(|| format!("conv2d kernel {w} is larger than the padded input {x}"))?;
            (Shape(vec![x.0[0], w.0[0], h, wd]), dx)
        }
        Op::Pool2d { kernel, stride, padding, .. } => {
            let (x, d) = ty(0);
            (pool_out(name, x, d, *kernel, *stride, *padding)?, d)
        }
        Op::MaxPool2dGrad { kernel, stride, padding } => {
            let ((x, d), (g, dg)) = (ty(0), ty(1));
            if dg != d {
                return Err(mixed(name, d, dg));
            }
            let want = pool_out(name, x, d, *kernel, *stride, *padding)?;
            if *g != want {
                return Err(format!(
                    "{name} needs the gradient of the pooling's result {want} (of input {x}), got {g}"
                ));
            }
            (x.clone(), d)
        }
        Op::Gather { dim } => {
            let ((x, d), (idx, di)) = (ty(0), ty(1));
            index_dtype(name, di)?;
            if x.rank() != idx.rank() || *dim >= x.rank() {
                return Err(format!(
                    "gather needs input and index of one rank and dim < rank; got {x}, {idx}, dim {dim}"
                ));
            }
            for i in 0..x.rank() {
                if i != *dim && idx.0[i] > x.0[i] {
                    return Err(format!("gather index {idx} is larger than input {x} in dim {i}"));
                }
            }
            (idx.clone(), d)
        }
        Op::IndexSelect { dim } => {
            let ((x, d), (idx, di)) = (ty(0), ty(1));
            index_dtype(name, di)?;
            if idx.rank() != 1 {
                return Err(format!("index_select needs a 1-D index, got {idx}"));
            }
            if *dim >= x.rank() {
                return Err(format!("index_select dim {dim} is out of range for {x}"));
            }
            let mut out = x.clone();
            out.0[*dim] = idx.0[0];
            (out, d)
        }
        Op::IndexAdd { dim } => {
            let ((x, d), (idx, di), (src, ds)) = (ty(0), ty(1), ty(2));
            index_dtype(name, di)?;
            if ds != d {
                return Err(mixed(name, d, ds));
            }
            if d == DType::Bool {
                return Err("index_add is not defined on bool; cast to a numeric dtype first".into());
            }
            if idx.rank() != 1 {
                return Err(format!("index_add needs a 1-D index, got {idx}"));
            }
            if *dim >= x.rank() {
                return Err(format!("index_add dim {dim} is out of range for {x}"));
            }
            let mut want = x.clone();
            want.0[*dim] = idx.0[0];
            if *src != want {
                return Err(format!(
                    "index_add of source {src} into {x} along dim {dim} with {} indices: the source must be {want}",
                    idx.0[0]
                ));
            }
            (x.clone(), d)
        }
        Op::Assign => {
            let ((old, d), (value, dv)) = (ty(0), ty(1));
            if old != value || d != dv {
                return Err(format!("assign of a {dv}{value} value to a {d}{old} variable"));
            }
            (value.clone(), dv)
        }
        Op::WriteAt { dim } => {
            let ((x, d), (value, dv), (offset, doff)) = (ty(0), ty(1), ty(2));
            if dv != d {
                return Err(mixed(name, d, dv));
            }
            if !matches!(doff, DType::I64 | DType::I32) || offset.rank() != 0 {
                return Err(format!("write_at offset must be a 0-d i64 or i32 tensor, got {doff}{offset}"));
            }
            if *dim >= x.rank() {
                return Err(format!("write_at dim {dim} is out of range for {x}"));
            }
            let fits = value.rank() == x.rank()
                && value
                    .0
                    .iter()
                    .zip(&x.0)
                    .enumerate()
                    .all(|(i, (v, t))| if i == *dim { v <= t } else { v == t });
            if !fits {
                return Err(format!(
                    "write_at of {value} into {x} along dim {dim}: the value must have the target's shape except along dim {dim}, where it may be shorter"
                ));
            }
            (x.clone(), d)
        }
        Op::Attention { mask, layout, .. } => {
            let (q, k, v) = (ty(0), ty(1), ty(2));
            let a = attention_operands(q, k, v.0, v.1, "values", ty_opt(3), *mask)?;
            let dims = match layout {
                AttnLayout::Bhsd => vec![a.b, a.h, a.sq, a.dv],
                AttnLayout::Bshd => vec![a.b, a.sq, a.h, a.dv],
            };
            (Shape(dims), a.dtype)
        }
        Op::AttentionStats { mask, .. } => {
            let (q, k, o, g) = (ty(0), ty(1), ty(2), ty(3));
            // o and g stand where the values would, along the queries.
            let a = attention_operands(q, k, o.0, o.1, "outputs", ty_opt(4), *mask)?;
            check_rows(&a, "output", o, "output's gradient", g)?;
            (Shape(vec![a.b, a.h, a.sq, 2]), attention_stats_dtype(a.dtype))
        }
        Op::AttentionDelta => attention_delta_type(ty(0), ty(1), ty(2))?,
        Op::AttentionGrad { mask, wrt, .. } => {
            let (q, k, v, g, st) = (ty(0), ty(1), ty(2), ty(3), ty(4));
            let a = attention_operands(q, k, v.0, v.1, "values", ty_opt(5), *mask)?;
            let o = (&Shape(vec![a.b, a.h, a.sq, a.dv]), a.dtype);
            check_rows(&a, "output", o, "output's gradient", g)?;
            let want = Shape(vec![a.b, a.h, a.sq, 2]);
            let dt = attention_stats_dtype(a.dtype);
            if *st.0 != want || st.1 != dt {
                return Err(format!(
                    "attention_grad takes the {dt} {want} attention_stats of its attention, got {} {}",
                    st.1, st.0
                ));
            }
            match wrt {
                AttnWrt::Query => (q.0.clone(), a.dtype),
                AttnWrt::KeyValue | AttnWrt::KeyValueAndQuery => {
                    (Shape(vec![a.b, a.h, a.sk, a.d + a.dv]), a.dtype)
                }
                AttnWrt::QueryKeyValue if a.sq == a.sk && a.d == a.dv => {
                    (Shape(vec![a.b, a.sq, 3, a.h, a.d]), a.dtype)
                }
                AttnWrt::QueryKeyValue => {
                    return Err(format!(
                        "attention_grad wrt=qkv lays out queries, keys and values of one length and head size, got {} queries and {} keys, heads of {} and {}",
                        a.sq, a.sk, a.d, a.dv
                    ))
                }
            }
        }
        Op::Cat { dim } => {
            let (first, d) = ty(0);
            if *dim >= first.rank() {
                return Err(format!("cat dim {dim} is out of range for {first}"));
            }
            let mut total = 0;
            for (i, &(s, di)) in operands.iter().enumerate() {
                if di != d {
                    return Err(mixed(name, d, di));
                }
                let ok = s.rank() == first.rank()
                    && s.0.iter().zip(&first.0).enumerate().all(|(k, (a, b))| k == *dim || a == b);
                if !ok {
                    return Err(format!(
                        "cat along dim {dim}: operand {i} has shape {s}, operand 0 has {first}"
                    ));
                }
                total = usize::checked_add(total, s.0[*dim])
                    .ok_or_else(|| format!("cat along dim {dim}: the result is too large"))?;
            }
            let mut out = first.clone();
            out.0[*dim] = total;
            (out, d)
        }
        Op::Collective { what: c, .. } => {
            let (s, d) = ty(0);
            match c {
                Collective::AllReduce(ReduceOp::ArgMax) => {
                    return Err("all_reduce takes sum, mean, max or min, not argmax".into())
                }
                Collective::AllReduce(_) if d == DType::Bool => {
                    return Err(format!("{name} is not defined on bool; cast to a numeric dtype first"))
                }
                Collective::AllReduce(ReduceOp::Mean) if !d.is_float() => {
                    return Err(format!("all_reduce_mean needs a float dtype, got {d}; use all_reduce_sum"))
                }
                Collective::ReduceScatter { op: ReduceOp::Sum | ReduceOp::Mean, .. }
                | Collective::AllGather { .. }
                    if d == DType::Bool =>
                {
                    return Err(format!("{name} is not defined on bool; cast to a numeric dtype first"))
                }
                Collective::ReduceScatter { op: ReduceOp::Mean, .. } if !d.is_float() => {
                    return Err(format!(
                        "reduce_scatter_mean needs a float dtype, got {d}; use reduce_scatter_sum"
                    ))
                }
                Collective::ReduceScatter { op: ReduceOp::Sum | ReduceOp::Mean, ranks } => {
                    let rows = match s.0.first() {
                        Some(&rows) => rows,
                        None => return Err(format!("{name} splits dim 0, but the operand is a scalar")),
                    };
                    let n = *ranks as usize;
                    if n == 0 || rows % n != 0 {
                        return Err(format!(
                            "{name} splits dim 0 of {s} into {n} equal chunks (one per rank), but {rows} is not a multiple of {n}; pad it"
                        ));
                    }
                    let mut out = s.clone();
                    out.0[0] = rows / n;
                    return Ok(Some((out, d)));
                }
                Collective::ReduceScatter { op, .. } => {
                    return Err(format!("reduce_scatter takes sum or mean, not {}", op.mnemonic()))
                }
                Collective::AllGather { ranks } => {
                    let Some(&rows) = s.0.first() else {
                        return Err(format!("{name} joins along dim 0, but the operand is a scalar"));
                    };
                    let mut out = s.clone();
                    out.0[0] = rows
                        .checked_mul(*ranks as usize)
                        .ok_or_else(|| format!("{name} of {s}: the result is too large"))?;
                    return Ok(Some((out, d)));
                }
                _ => {}
            }
            (s.clone(), d)
        }
        Op::Fused(body) => {
            let g = body.graph();
            for (k, (&input, &(s, d))) in body.input_nodes().iter().zip(operands).enumerate() {
                let n = g.node(input);
                if n.shape != *s || n.dtype != d {
                    return Err(format!(
                        "operand {k} is {d}{s} but the body's input {k} is {}{}",
                        n.dtype, n.shape
                    ));
                }
            }
            let out = g.node(body.output());
            (out.shape.clone(), out.dtype)
        }
    };
    Ok(Some(out))
}

/// The result shape of a pooling (and the gradient shape its backward
/// takes): a float NCHW input, windows of at least 1, padding at most half
/// the window (so that every window holds an element of the input).
fn pool_out(
    name: &str,
    x: &Shape,
    d: DType,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Result<Shape, String> {
    if !d.is_float() {
        return Err(format!("{name} needs a float tensor, got {d}; cast it first"));
    }
    if x.rank() != 4 {
        return Err(format!("{name} needs an NCHW input, got {x}"));
    }
    if kernel.contains(&0) || stride.contains(&0) {
        return Err(format!("{name} kernel and stride must be at least 1"));
    }
    if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
        return Err(format!("{name} padding {padding:?} must be at most half the kernel {kernel:?}"));
    }
    let h = window_out(x.0[2], kernel[0], stride[0], padding[0], 1)
        .ok_or_else(|| format!("{name} window {kernel:?} is larger than the padded input {x}"))?;
    let w = window_out(x.0[3], kernel[1], stride[1], padding[1], 1)
        .ok_or_else(|| format!("{name} window {kernel:?} is larger than the padded input {x}"))?;
    Ok(Shape(vec![x.0[0], x.0[1], h, w]))
}

/// Output size of a sliding window, `None` if the window does not fit.
pub fn window_out(
    size: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    // Checked: sizes come from user input and parsed text; a zero kernel or
    // stride, or an overflow, is "does not fit", never a panic.
    let span = dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)?;
    let padded = padding.checked_mul(2)?.checked_add(size)?;
    (padded >= span && stride > 0).then(|| (padded - span) / stride + 1)
}

fn same_type(name: &str, operands: &[(&Shape, DType)]) -> Result<(Shape, DType), String> {
    let (s0, d0) = operands[0];
    for &(s, d) in &operands[1..] {
        if d != d0 {
            return Err(mixed(name, d0, d));
        }
        if s != s0 {
            return Err(format!(
                "{name} operands must have one shape (broadcast explicitly), got {s0} and {s}"
            ));
        }
    }
    Ok((s0.clone(), d0))
}

/// The message for mixed dtypes; it suggests the fix.
pub fn mixed(name: &str, a: DType, b: DType) -> String {
    format!(
        "{name} of {a} and {b}: dtypes must match; cast one side first (e.g. .cast(DType::{}))",
        variant(a)
    )
}

fn variant(d: DType) -> &'static str {
    match d {
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::U8 => "U8",
        DType::I32 => "I32",
        DType::I64 => "I64",
        DType::Bool => "Bool",
    }
}

fn index_dtype(name: &str, d: DType) -> Result<(), String> {
    if matches!(d, DType::I64 | DType::I32) {
        Ok(())
    } else {
        Err(format!("{name} index must have dtype i64 or i32, got {d}"))
    }
}
