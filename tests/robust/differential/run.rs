//! Records a [`Program`] on a kiln [`Context`] through the public API
//! only, reads its outputs, and returns them as f64.

use super::program::{Bin, Cmp, Dt, Instr, Program, ReadMode, Red, Rhs, Source, Un};
use half::{bf16, f16};
use kiln::prelude::*;

pub fn dtype(dt: Dt) -> DType {
    match dt {
        Dt::F16 => DType::F16,
        Dt::Bf16 => DType::BF16,
        Dt::F32 => DType::F32,
        Dt::F64 => DType::F64,
        Dt::U8 => DType::U8,
        Dt::I32 => DType::I32,
        Dt::I64 => DType::I64,
        Dt::Bool => DType::Bool,
    }
}

/// An output as kiln computed it.
#[derive(Clone, Debug)]
pub struct Got {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub values: Vec<f64>,
}

fn upload(ctx: &Context, dt: Dt, data: &[f64], shape: &[usize]) -> Tensor {
    let shape = shape.to_vec();
    match dt {
        Dt::F16 => ctx.tensor(&data.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(), shape),
        Dt::Bf16 => ctx.tensor(&data.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(), shape),
        Dt::F32 => ctx.tensor(&data.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape),
        Dt::F64 => ctx.tensor(data, shape),
        Dt::U8 => ctx.tensor(&data.iter().map(|&v| v as u8).collect::<Vec<_>>(), shape),
        Dt::I32 => ctx.tensor(&data.iter().map(|&v| v as i32).collect::<Vec<_>>(), shape),
        Dt::I64 => ctx.tensor(&data.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape),
        Dt::Bool => ctx.tensor(&data.iter().map(|&v| v != 0.0).collect::<Vec<_>>(), shape),
    }
}

fn source(ctx: &Context, shape: &[usize], dt: Dt, src: &Source) -> Tensor {
    match *src {
        Source::Data(ref d) => upload(ctx, dt, d, shape),
        Source::Full(v) => match dt {
            Dt::Bool => ctx.full_dtype(shape.to_vec(), v != 0.0, dtype(dt)),
            d if d.is_int() => ctx.full_dtype(shape.to_vec(), v as i64, dtype(dt)),
            _ => ctx.full_dtype(shape.to_vec(), v, dtype(dt)),
        },
        Source::Arange { start, step } => {
            let n = shape[0] as f64;
            match dt {
                Dt::F16 => {
                    let end = start + (n - 0.5) * step;
                    ctx.arange(f16::from_f64(start), f16::from_f64(end), f16::from_f64(step))
                }
                Dt::Bf16 => {
                    let end = start + (n - 0.5) * step;
                    ctx.arange(bf16::from_f64(start), bf16::from_f64(end), bf16::from_f64(step))
                }
                Dt::F32 => ctx.arange(start as f32, (start + (n - 0.5) * step) as f32, step as f32),
                Dt::F64 => ctx.arange(start, start + (n - 0.5) * step, step),
                Dt::U8 => ctx.arange(start as u8, (start + n * step) as u8, step as u8),
                Dt::I32 => ctx.arange(start as i32, (start + n * step) as i32, step as i32),
                Dt::I64 => ctx.arange(start as i64, (start + n * step) as i64, step as i64),
                Dt::Bool => unreachable!("the generator makes no bool arange"),
            }
        }
        Source::Scalar(v) => match dt {
            Dt::F16 => ctx.scalar(f16::from_f64(v)),
            Dt::Bf16 => ctx.scalar(bf16::from_f64(v)),
            Dt::F32 => ctx.scalar(v as f32),
            Dt::F64 => ctx.scalar(v),
            Dt::U8 => ctx.scalar(v as u8),
            Dt::I32 => ctx.scalar(v as i32),
            Dt::I64 => ctx.scalar(v as i64),
            Dt::Bool => ctx.scalar(v != 0.0),
        },
    }
}

/// The other side of an op: a tensor or a Rust scalar of the kind the
/// tensor's dtype takes (f64 for floats, i64 for integers, bool).
enum Arg {
    T(Tensor),
    F(f64),
    I(i64),
    B(bool),
}

/// Evaluates `$e` with `$b` bound to the argument, whatever its type.
macro_rules! with_arg {
    ($arg:expr, $b:ident => $e:expr) => {
        match $arg {
            Arg::T($b) => $e,
            Arg::F($b) => $e,
            Arg::I($b) => $e,
            Arg::B($b) => $e,
        }
    };
}

fn rhs(vals: &[Tensor], r: &Rhs, dtype: DType) -> Arg {
    match *r {
        Rhs::Val(v) => Arg::T(vals[v].clone()),
        Rhs::Scalar(s) if dtype == DType::Bool => Arg::B(s != 0.0),
        Rhs::Scalar(s) if dtype.is_float() => Arg::F(s),
        Rhs::Scalar(s) => Arg::I(s as i64),
    }
}

fn unary(a: &Tensor, op: Un) -> Tensor {
    match op {
        Un::Neg => -a,
        Un::Abs => a.abs(),
        Un::Exp => a.exp(),
        Un::Log => a.log(),
        Un::Sqrt => a.sqrt(),
        Un::Rsqrt => a.rsqrt(),
        Un::Recip => a.recip(),
        Un::Sin => a.sin(),
        Un::Cos => a.cos(),
        Un::Tanh => a.tanh(),
        Un::Sigmoid => a.sigmoid(),
        Un::Relu => a.relu(),
        Un::Gelu => a.gelu(),
        Un::Silu => a.silu(),
    }
}

fn binary(a: &Tensor, op: Bin, b: Arg) -> Tensor {
    with_arg!(b, b => match op {
        Bin::Add => a + b,
        Bin::Sub => a - b,
        Bin::Mul => a * b,
        Bin::Div => a / b,
        Bin::Pow => a.pow(b),
        Bin::Maximum => a.maximum(b),
        Bin::Minimum => a.minimum(b),
    })
}

/// `c op a` with a Rust scalar `c` on the left (the operator impls).
fn reversed(c: f64, op: Bin, a: &Tensor) -> Tensor {
    let int = !a.dtype().is_float();
    match (op, int) {
        (Bin::Add, false) => c + a,
        (Bin::Sub, false) => c - a,
        (Bin::Mul, false) => c * a,
        (Bin::Div, false) => c / a,
        (Bin::Add, true) => c as i64 + a,
        (Bin::Sub, true) => c as i64 - a,
        (Bin::Mul, true) => c as i64 * a,
        (Bin::Div, true) => c as i64 / a,
        _ => unreachable!("only + - * / take a scalar on the left"),
    }
}

fn compare(a: &Tensor, op: Cmp, b: Arg) -> Tensor {
    with_arg!(b, b => match op {
        Cmp::Eq => a.eq(b),
        Cmp::Ne => a.ne(b),
        Cmp::Lt => a.lt(b),
        Cmp::Le => a.le(b),
        Cmp::Gt => a.gt(b),
        Cmp::Ge => a.ge(b),
    })
}

/// Records instruction `instr` given the tensors before it.
fn record(ctx: &Context, vals: &[Tensor], instr: &Instr) -> Result<Tensor> {
    let v = |i: &usize| &vals[*i];
    Ok(match instr {
        Instr::Source { shape, dt, src } => source(ctx, shape, *dt, src),
        Instr::Unary(op, a) => unary(v(a), *op),
        Instr::Binary { op, a, rhs: Rhs::Scalar(c), reversed: true } => reversed(*c, *op, v(a)),
        Instr::Binary { op, a, rhs: r, .. } => binary(v(a), *op, rhs(vals, r, v(a).dtype())),
        Instr::Compare(op, a, r) => compare(v(a), *op, rhs(vals, r, v(a).dtype())),
        Instr::Where(c, t, f) => {
            let dtype = match (t, f) {
                (Rhs::Val(x), _) | (_, Rhs::Val(x)) => v(x).dtype(),
                _ => unreachable!("the generator gives where a tensor branch"),
            };
            let c = v(c);
            with_arg!(rhs(vals, t, dtype), t => with_arg!(rhs(vals, f, dtype), f => c.where_cond(t, f)))
        }
        Instr::Cast(a, to) => v(a).cast(dtype(*to)),
        Instr::Reduce { op, a, dims, keepdim } => match op {
            Red::Sum => v(a).sum(dims, *keepdim),
            Red::Mean => v(a).mean(dims, *keepdim),
            Red::Max => v(a).max(dims, *keepdim),
            Red::Min => v(a).min(dims, *keepdim),
        },
        Instr::SumAll(a) => v(a).sum_all(),
        Instr::ArgMax { a, dim, keepdim } => v(a).argmax(*dim, *keepdim),
        Instr::Softmax(a, dim) => v(a).softmax(*dim),
        Instr::LogSoftmax(a, dim) => v(a).log_softmax(*dim),
        Instr::LayerNorm { a, weight, bias, eps } => v(a).layer_norm(v(weight), v(bias), *eps),
        Instr::MatMul(a, b) => v(a).matmul(v(b)),
        Instr::Reshape(a, s) => v(a).reshape(s.clone()),
        Instr::Flatten(a) => v(a).flatten(),
        Instr::Permute(a, p) => v(a).permute(p),
        Instr::Transpose(a, x, y) => v(a).transpose(*x, *y),
        Instr::T(a) => v(a).t(),
        Instr::Narrow { a, dim, start, len } => v(a).narrow(*dim, *start, *len),
        Instr::Slice { a, dim, start, end, step } => v(a).slice(*dim, *start, *end, *step),
        Instr::BroadcastTo(a, s) => v(a).broadcast_to(s.clone()),
        Instr::Squeeze(a, d) => v(a).squeeze(*d),
        Instr::Unsqueeze(a, d) => v(a).unsqueeze(*d),
        Instr::Cat(vs, d) => Tensor::cat(&vs.iter().map(v).collect::<Vec<_>>(), *d),
        Instr::Stack(vs, d) => Tensor::stack(&vs.iter().map(v).collect::<Vec<_>>(), *d),
        Instr::Conv2d { x, w, stride, padding, dilation, groups } => {
            v(x).conv2d(v(w), *stride, *padding, *dilation, *groups)
        }
        Instr::Pool2d { x, max: true, kernel, stride, padding } => {
            v(x).max_pool2d(*kernel, *stride, *padding)
        }
        Instr::Pool2d { x, max: false, kernel, stride, padding } => {
            v(x).avg_pool2d(*kernel, *stride, *padding)
        }
        Instr::Gather { a, dim, index } => v(a).gather(*dim, v(index)),
        Instr::IndexSelect { a, dim, index } => v(a).index_select(*dim, v(index)),
        Instr::Realize(a) => {
            v(a).realize()?;
            v(a).clone()
        }
    })
}

fn read(t: &Tensor) -> Result<Vec<f64>> {
    Ok(match t.dtype() {
        DType::F16 => t.to_vec::<f16>()?.into_iter().map(f16::to_f64).collect(),
        DType::BF16 => t.to_vec::<bf16>()?.into_iter().map(bf16::to_f64).collect(),
        DType::F32 => t.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => t.to_vec::<f64>()?,
        DType::U8 => t.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        DType::I32 => t.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => t.to_vec::<i64>()?.into_iter().map(|x| x as f64).collect(),
        DType::Bool => t.to_vec::<bool>()?.into_iter().map(|b| b as u8 as f64).collect(),
    })
}

/// Records every instruction of `p` on `ctx` (realizing where it says).
fn record_all(ctx: &Context, p: &Program) -> Result<Vec<Tensor>> {
    let mut vals: Vec<Tensor> = Vec::with_capacity(p.instrs.len());
    for instr in &p.instrs {
        let t = record(ctx, &vals, instr)?;
        vals.push(t);
    }
    Ok(vals)
}

/// The optimized graph of `p`'s outputs (`Context::explain`), for a report.
pub fn explain(ctx: &Context, p: &Program) -> Result<String> {
    let vals = record_all(ctx, p)?;
    ctx.explain(&p.outputs.iter().map(|&o| &vals[o]).collect::<Vec<_>>())
}

/// Records `p` on `ctx` and reads its outputs.
pub fn run(ctx: &Context, p: &Program) -> Result<Vec<Got>> {
    let vals = record_all(ctx, p)?;
    let outs: Vec<&Tensor> = p.outputs.iter().map(|&o| &vals[o]).collect();
    if p.read == ReadMode::Together {
        ctx.realize(&outs)?;
    }
    outs.iter().map(|t| Ok(Got { shape: t.shape().to_vec(), dtype: t.dtype(), values: read(t)? })).collect()
}
