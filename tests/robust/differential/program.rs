//! A random program: what the generator makes, the reference evaluates and
//! the kiln runner records through the public API. Values are numbered in
//! the order instructions make them (`%0, %1, ...`); every instruction
//! makes exactly one value, sources included.
//!
//! The program prints as one line per value in a Rust-like notation that
//! maps one to one onto kiln calls (`%3 = %1.softmax(1)`), with input data
//! in full, so a failure report is a program a person can replay by hand.

pub use super::dt::Dt;
use std::fmt;

/// Where a source's values come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// `ctx.tensor(&data, shape)`: host data, row-major, each value exact in
    /// the dtype.
    Data(Vec<f64>),
    /// `ctx.full_dtype(shape, value, dtype)`: a constant of the graph.
    Full(f64),
    /// `ctx.arange(start, end, step)`, 1-D; `end` is chosen so that the
    /// length is the shape's.
    Arange { start: f64, step: f64 },
    /// `ctx.scalar(value)`: a rank-0 tensor made from host data.
    Scalar(f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Un {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Recip,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    Silu,
}

impl Un {
    pub const ALL: [Un; 14] = [
        Un::Neg,
        Un::Abs,
        Un::Exp,
        Un::Log,
        Un::Sqrt,
        Un::Rsqrt,
        Un::Recip,
        Un::Sin,
        Un::Cos,
        Un::Tanh,
        Un::Sigmoid,
        Un::Relu,
        Un::Gelu,
        Un::Silu,
    ];

    /// Defined on integers too.
    pub fn allows_int(self) -> bool {
        matches!(self, Un::Neg | Un::Abs | Un::Relu)
    }

    pub fn name(self) -> &'static str {
        match self {
            Un::Neg => "neg",
            Un::Abs => "abs",
            Un::Exp => "exp",
            Un::Log => "log",
            Un::Sqrt => "sqrt",
            Un::Rsqrt => "rsqrt",
            Un::Recip => "recip",
            Un::Sin => "sin",
            Un::Cos => "cos",
            Un::Tanh => "tanh",
            Un::Sigmoid => "sigmoid",
            Un::Relu => "relu",
            Un::Gelu => "gelu",
            Un::Silu => "silu",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
}

impl Bin {
    pub fn name(self) -> &'static str {
        match self {
            Bin::Add => "add",
            Bin::Sub => "sub",
            Bin::Mul => "mul",
            Bin::Div => "div",
            Bin::Pow => "pow",
            Bin::Maximum => "maximum",
            Bin::Minimum => "minimum",
        }
    }

    /// The Rust operator, for the ops that have one.
    pub fn operator(self) -> Option<&'static str> {
        match self {
            Bin::Add => Some("+"),
            Bin::Sub => Some("-"),
            Bin::Mul => Some("*"),
            Bin::Div => Some("/"),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    pub const ALL: [Cmp; 6] = [Cmp::Eq, Cmp::Ne, Cmp::Lt, Cmp::Le, Cmp::Gt, Cmp::Ge];

    pub fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Red {
    Sum,
    Mean,
    Max,
    Min,
}

impl Red {
    pub fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Mean => "mean",
            Red::Max => "max",
            Red::Min => "min",
        }
    }
}

/// The other side of a binary op, a comparison or a `where` branch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rhs {
    Val(usize),
    /// A Rust scalar (exact in the tensor's dtype).
    Scalar(f64),
}

#[derive(Clone, Debug)]
pub enum Instr {
    Source {
        shape: Vec<usize>,
        dt: Dt,
        src: Source,
    },
    Unary(Un, usize),
    /// `a op rhs`, or `rhs op a` when `reversed` (a scalar on the left,
    /// through the Rust operator).
    Binary {
        op: Bin,
        a: usize,
        rhs: Rhs,
        reversed: bool,
    },
    Compare(Cmp, usize, Rhs),
    Where(usize, Rhs, Rhs),
    Cast(usize, Dt),
    Reduce {
        op: Red,
        a: usize,
        dims: Vec<usize>,
        keepdim: bool,
    },
    SumAll(usize),
    ArgMax {
        a: usize,
        dim: usize,
        keepdim: bool,
    },
    Softmax(usize, usize),
    LogSoftmax(usize, usize),
    LayerNorm {
        a: usize,
        weight: usize,
        bias: usize,
        eps: f64,
    },
    MatMul(usize, usize),
    Reshape(usize, Vec<usize>),
    Flatten(usize),
    Permute(usize, Vec<usize>),
    Transpose(usize, usize, usize),
    T(usize),
    Narrow {
        a: usize,
        dim: usize,
        start: usize,
        len: usize,
    },
    Slice {
        a: usize,
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    },
    BroadcastTo(usize, Vec<usize>),
    Squeeze(usize, usize),
    Unsqueeze(usize, usize),
    Cat(Vec<usize>, usize),
    Stack(Vec<usize>, usize),
    /// `x.conv2d(&w, stride, padding, dilation, groups)`: NCHW input,
    /// OIHW weight.
    Conv2d {
        x: usize,
        w: usize,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    },
    /// `x.max_pool2d(kernel, stride, padding)` or `avg_pool2d`.
    Pool2d {
        x: usize,
        max: bool,
        kernel: usize,
        stride: usize,
        padding: usize,
    },
    Gather {
        a: usize,
        dim: usize,
        index: usize,
    },
    IndexSelect {
        a: usize,
        dim: usize,
        index: usize,
    },
    /// `a.realize()`: computes it now; the value is `a`'s.
    Realize(usize),
}

impl Instr {
    /// The values this instruction reads.
    pub fn operands(&self) -> Vec<usize> {
        let rhs = |r: &Rhs| match r {
            Rhs::Val(v) => Some(*v),
            Rhs::Scalar(_) => None,
        };
        match self {
            Instr::Source { .. } => vec![],
            Instr::Unary(_, a)
            | Instr::Cast(a, _)
            | Instr::SumAll(a)
            | Instr::Softmax(a, _)
            | Instr::LogSoftmax(a, _)
            | Instr::Reshape(a, _)
            | Instr::Flatten(a)
            | Instr::Permute(a, _)
            | Instr::Transpose(a, _, _)
            | Instr::T(a)
            | Instr::BroadcastTo(a, _)
            | Instr::Squeeze(a, _)
            | Instr::Unsqueeze(a, _)
            | Instr::Realize(a) => vec![*a],
            Instr::Reduce { a, .. }
            | Instr::ArgMax { a, .. }
            | Instr::Narrow { a, .. }
            | Instr::Slice { a, .. } => vec![*a],
            Instr::Pool2d { x, .. } => vec![*x],
            Instr::Conv2d { x, w, .. } => vec![*x, *w],
            Instr::Binary { a, rhs: r, .. } | Instr::Compare(_, a, r) => {
                std::iter::once(*a).chain(rhs(r)).collect()
            }
            Instr::Where(c, t, f) => std::iter::once(*c).chain(rhs(t)).chain(rhs(f)).collect(),
            Instr::LayerNorm { a, weight, bias, .. } => vec![*a, *weight, *bias],
            Instr::MatMul(a, b) => vec![*a, *b],
            Instr::Cat(vs, _) | Instr::Stack(vs, _) => vs.clone(),
            Instr::Gather { a, index, .. } | Instr::IndexSelect { a, index, .. } => vec![*a, *index],
        }
    }

    /// The same instruction reading `map[v]` for each operand `v`.
    pub fn renumbered(&self, map: &[usize]) -> Instr {
        let m = |v: &usize| map[*v];
        let r = |x: &Rhs| match x {
            Rhs::Val(v) => Rhs::Val(map[*v]),
            s => *s,
        };
        let mut out = self.clone();
        match &mut out {
            Instr::Source { .. } => {}
            Instr::Unary(_, a)
            | Instr::Cast(a, _)
            | Instr::SumAll(a)
            | Instr::Softmax(a, _)
            | Instr::LogSoftmax(a, _)
            | Instr::Reshape(a, _)
            | Instr::Flatten(a)
            | Instr::Permute(a, _)
            | Instr::Transpose(a, _, _)
            | Instr::T(a)
            | Instr::BroadcastTo(a, _)
            | Instr::Squeeze(a, _)
            | Instr::Unsqueeze(a, _)
            | Instr::Realize(a)
            | Instr::Reduce { a, .. }
            | Instr::ArgMax { a, .. }
            | Instr::Narrow { a, .. }
            | Instr::Slice { a, .. } => *a = m(a),
            Instr::Pool2d { x, .. } => *x = m(x),
            Instr::Conv2d { x, w, .. } => {
                *x = m(x);
                *w = m(w);
            }
            Instr::Binary { a, rhs, .. } | Instr::Compare(_, a, rhs) => {
                *a = m(a);
                *rhs = r(rhs);
            }
            Instr::Where(c, t, f) => {
                *c = m(c);
                *t = r(t);
                *f = r(f);
            }
            Instr::LayerNorm { a, weight, bias, .. } => {
                *a = m(a);
                *weight = m(weight);
                *bias = m(bias);
            }
            Instr::MatMul(a, b) => {
                *a = m(a);
                *b = m(b);
            }
            Instr::Cat(vs, _) | Instr::Stack(vs, _) => vs.iter_mut().for_each(|v| *v = map[*v]),
            Instr::Gather { a, index, .. } | Instr::IndexSelect { a, index, .. } => {
                *a = m(a);
                *index = m(index);
            }
        }
        out
    }
}

/// How the runner reads the outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// `to_vec` on each output in turn (each read compiles what is left).
    EachInTurn,
    /// `ctx.realize(&outputs)` first (one plan with several outputs), then
    /// `to_vec` on each.
    Together,
}

#[derive(Clone, Debug)]
pub struct Program {
    pub seed: u64,
    pub instrs: Vec<Instr>,
    pub outputs: Vec<usize>,
    pub read: ReadMode,
}

impl Program {
    /// The program restricted to what `outputs` need, renumbered densely.
    pub fn sliced(&self, outputs: &[usize]) -> Program {
        let mut needed = vec![false; self.instrs.len()];
        for &o in outputs {
            needed[o] = true;
        }
        for i in (0..self.instrs.len()).rev() {
            if needed[i] {
                for v in self.instrs[i].operands() {
                    needed[v] = true;
                }
            }
        }
        let mut map = vec![usize::MAX; self.instrs.len()];
        let mut instrs = Vec::new();
        for (i, instr) in self.instrs.iter().enumerate() {
            if needed[i] {
                map[i] = instrs.len();
                instrs.push(instr.renumbered(&map));
            }
        }
        Program {
            seed: self.seed,
            instrs,
            outputs: outputs.iter().map(|&o| map[o]).collect(),
            read: self.read,
        }
    }
}

fn fmt_num(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

fn fmt_rhs(r: &Rhs) -> String {
    match r {
        Rhs::Val(v) => format!("&%{v}"),
        Rhs::Scalar(s) => fmt_num(*s),
    }
}

impl fmt::Display for Instr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Instr::Source { shape, dt, src } => match src {
                Source::Data(d) => {
                    // Large inputs print their start (the seed replays them).
                    let vals: Vec<String> = d.iter().take(48).map(|v| fmt_num(*v)).collect();
                    let more =
                        if d.len() > 48 { format!(", ... {} more", d.len() - 48) } else { String::new() };
                    write!(f, "ctx.tensor::<{}>(&[{}{more}], {shape:?})", dt.name(), vals.join(", "))
                }
                Source::Full(v) => write!(f, "ctx.full_dtype({shape:?}, {}, {})", fmt_num(*v), dt.name()),
                Source::Arange { start, step } => {
                    let n = shape[0] as f64;
                    let end = if dt.is_float() { start + (n - 0.5) * step } else { start + n * step };
                    write!(
                        f,
                        "ctx.arange::<{}>({}, {}, {})",
                        dt.name(),
                        fmt_num(*start),
                        fmt_num(end),
                        fmt_num(*step)
                    )
                }
                Source::Scalar(v) => write!(f, "ctx.scalar::<{}>({})", dt.name(), fmt_num(*v)),
            },
            Instr::Unary(u, a) => write!(f, "%{a}.{}()", u.name()),
            Instr::Binary { op, a, rhs, reversed } => match (op.operator(), reversed) {
                (Some(o), true) => write!(f, "{} {o} &%{a}", fmt_rhs(rhs)),
                (Some(o), false) => write!(f, "&%{a} {o} {}", fmt_rhs(rhs)),
                (None, _) => write!(f, "%{a}.{}({})", op.name(), fmt_rhs(rhs)),
            },
            Instr::Compare(c, a, r) => write!(f, "%{a}.{}({})", c.name(), fmt_rhs(r)),
            Instr::Where(c, t, e) => write!(f, "%{c}.where_cond({}, {})", fmt_rhs(t), fmt_rhs(e)),
            Instr::Cast(a, dt) => write!(f, "%{a}.cast({})", dt.name()),
            Instr::Reduce { op, a, dims, keepdim } => write!(f, "%{a}.{}(&{dims:?}, {keepdim})", op.name()),
            Instr::SumAll(a) => write!(f, "%{a}.sum_all()"),
            Instr::ArgMax { a, dim, keepdim } => write!(f, "%{a}.argmax({dim}, {keepdim})"),
            Instr::Softmax(a, d) => write!(f, "%{a}.softmax({d})"),
            Instr::LogSoftmax(a, d) => write!(f, "%{a}.log_softmax({d})"),
            Instr::LayerNorm { a, weight, bias, eps } => {
                write!(f, "%{a}.layer_norm(&%{weight}, &%{bias}, {})", fmt_num(*eps))
            }
            Instr::MatMul(a, b) => write!(f, "%{a}.matmul(&%{b})"),
            Instr::Reshape(a, s) => write!(f, "%{a}.reshape({s:?})"),
            Instr::Flatten(a) => write!(f, "%{a}.flatten()"),
            Instr::Permute(a, p) => write!(f, "%{a}.permute(&{p:?})"),
            Instr::Transpose(a, x, y) => write!(f, "%{a}.transpose({x}, {y})"),
            Instr::T(a) => write!(f, "%{a}.t()"),
            Instr::Narrow { a, dim, start, len } => write!(f, "%{a}.narrow({dim}, {start}, {len})"),
            Instr::Slice { a, dim, start, end, step } => {
                write!(f, "%{a}.slice({dim}, {start}, {end}, {step})")
            }
            Instr::BroadcastTo(a, s) => write!(f, "%{a}.broadcast_to({s:?})"),
            Instr::Squeeze(a, d) => write!(f, "%{a}.squeeze({d})"),
            Instr::Unsqueeze(a, d) => write!(f, "%{a}.unsqueeze({d})"),
            Instr::Cat(vs, d) | Instr::Stack(vs, d) => {
                let name = if matches!(self, Instr::Cat(..)) { "cat" } else { "stack" };
                let list: Vec<String> = vs.iter().map(|v| format!("&%{v}")).collect();
                write!(f, "Tensor::{name}(&[{}], {d})", list.join(", "))
            }
            Instr::Conv2d { x, w, stride, padding, dilation, groups } => {
                write!(f, "%{x}.conv2d(&%{w}, {stride}, {padding}, {dilation}, {groups})")
            }
            Instr::Pool2d { x, max, kernel, stride, padding } => {
                let kind = if *max { "max" } else { "avg" };
                write!(f, "%{x}.{kind}_pool2d({kernel}, {stride}, {padding})")
            }
            Instr::Gather { a, dim, index } => write!(f, "%{a}.gather({dim}, &%{index})"),
            Instr::IndexSelect { a, dim, index } => write!(f, "%{a}.index_select({dim}, &%{index})"),
            Instr::Realize(a) => write!(f, "%{a}.realize()"),
        }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, instr) in self.instrs.iter().enumerate() {
            writeln!(f, "    %{i} = {instr}")?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| format!("%{o}")).collect();
        write!(f, "    read {} ({:?})", outs.join(", "), self.read)
    }
}
