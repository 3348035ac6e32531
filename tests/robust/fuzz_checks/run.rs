//! The api fuzzer's interpreter: runs a [`Program`] on a fresh CPU
//! context, reading only what is small enough to run (see [`Size`]).

use super::program::*;
use super::{check_graph, Outcome, MAX_STEPS, READ_LIMIT_BYTES, WORK_LIMIT};
use half::{bf16, f16};
use kiln::{Context, DType, Tensor, Variable};

/// Runs `program` (see [`super::run_program`]).
pub(super) fn run(program: &Program) -> Outcome {
    let mut run = Run { ctx: None, slots: Vec::new(), vars: Vec::new(), outcome: Outcome::default() };
    run.all(program);
    run.outcome
}

/// How big a tensor's computation is, judged from its shape and the
/// shapes it was computed from. Ordered: the largest wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Size {
    /// Every tensor in its history fits [`READ_LIMIT_BYTES`]: read it.
    Small,
    /// Some shape in its history has a byte size that overflows `usize`:
    /// read it, since that must be an error, never an allocation.
    Overflow,
    /// Some shape in its history could be allocated but is large: never
    /// read it (it would run).
    Big,
}

fn size_of(shape: &[usize], dtype: DType) -> Size {
    match numel(shape).and_then(|n| n.checked_mul(dtype.size())) {
        None => Size::Overflow,
        Some(b) if b > READ_LIMIT_BYTES => Size::Big,
        Some(_) => Size::Small,
    }
}

struct Slot {
    t: Tensor,
    size: Size,
}

struct Run {
    ctx: Option<Context>,
    slots: Vec<Slot>,
    vars: Vec<Variable>,
    outcome: Outcome,
}

impl Run {
    fn all(&mut self, p: &Program) {
        let toggles = p.passes.toggles();
        let ctx = Context::cpu()
            .with_seed(p.seed as u64)
            .with_fast_math(p.fast_math)
            .with_streams((p.streams % 4) as u32)
            .with_passes(toggles);
        self.ctx = Some(ctx);
        for step in p.steps.iter().take(MAX_STEPS) {
            self.step(step);
        }
        // The program's results: its last tensors, read as their own type
        // (most programs hold no explicit read, and a tensor never read
        // never runs).
        let last: Vec<Tensor> =
            self.slots.iter().rev().take(3).filter(|s| s.size != Size::Big).map(|s| s.t.clone()).collect();
        for t in &last {
            count(&mut self.outcome, read(t, ReadAs::Own));
        }
        // Dropping tensors, variables and then the context is part of the
        // program (the drop paths walk the graph too).
        self.slots.clear();
        self.vars.clear();
        self.ctx = None;
    }

    fn ctx(&self) -> Context {
        self.ctx.clone().expect("the context lives while steps run")
    }

    fn get(&self, i: u8) -> Option<&Slot> {
        match self.slots.len() {
            0 => None,
            n => Some(&self.slots[i as usize % n]),
        }
    }

    /// Records `t`, made from `inputs`, with the size of its history.
    fn push(&mut self, t: Tensor, inputs: Size) {
        let own = size_of(t.shape(), t.dtype());
        self.slots.push(Slot { size: own.max(inputs), t });
    }

    fn make(&mut self, shape: &[Dim], dt: Dt, f: impl FnOnce(&Context, Vec<usize>, DType) -> Tensor) {
        let (ctx, shape, dtype) = (self.ctx(), dims(shape), dt.get());
        let requested = size_of(&shape, dtype);
        let t = f(&ctx, shape, dtype);
        self.push(t, requested);
    }

    fn unary(&mut self, a: u8, f: impl FnOnce(&Tensor) -> Tensor) {
        let Some(s) = self.get(a) else { return };
        let (t, size) = (f(&s.t), s.size);
        self.push(t, size);
    }

    fn binary(&mut self, a: u8, b: u8, f: impl FnOnce(&Tensor, &Tensor) -> Tensor) {
        let (Some(x), Some(y)) = (self.get(a), self.get(b)) else { return };
        let (t, size) = (f(&x.t, &y.t), x.size.max(y.size));
        self.push(t, size);
    }

    fn step(&mut self, step: &Step) {
        let ctx = self.ctx();
        match *step {
            Step::Zeros(ref s, dt) => self.make(s, dt, |c, s, d| c.zeros_dtype(s, d)),
            Step::Ones(ref s, dt) => self.make(s, dt, |c, s, d| c.ones_dtype(s, d)),
            Step::Full(ref s, v, dt) => self.make(s, dt, |c, s, d| with_scalar!(v, x => c.full_dtype(s, x, d))),
            Step::Rand(ref s, dt) => self.make(s, dt, |c, s, d| c.rand_dtype(s, d)),
            Step::Randn(ref s, dt) => self.make(s, dt, |c, s, d| c.randn_dtype(s, d)),
            Step::Arange(a, b, c) => {
                let t = arange(&ctx, a, b, c);
                self.push(t, Size::Small);
            }
            Step::FromVec(ref s, dt) => self.make(s, dt, from_vec),
            Step::Scalar(v) => self.push(with_scalar!(v, x => ctx.scalar(x)), Size::Small),
            Step::Unary(a, op) => self.unary(a, |t| unary(t, op)),
            Step::Binary(a, b, op) => self.binary(a, b, |x, y| binary(x, y.clone(), op)),
            Step::BinaryScalar(a, v, op) => self.unary(a, |t| with_scalar!(v, x => binary(t, x, op))),
            Step::ScalarLhs(v, a, op) => self.unary(a, |t| with_scalar!(v, x => scalar_lhs(x, t, op))),
            Step::Where(c, a, b) => {
                let (Some(c), Some(a), Some(b)) = (self.get(c), self.get(a), self.get(b)) else { return };
                let size = c.size.max(a.size).max(b.size);
                let t = c.t.where_cond(a.t.clone(), b.t.clone());
                self.push(t, size);
            }
            Step::WhereScalar(c, a, v, scalar_first) => self.binary(c, a, |c, a| {
                with_scalar!(v, x => if scalar_first { c.where_cond(x, a.clone()) } else { c.where_cond(a.clone(), x) })
            }),
            Step::Cast(a, dt) => self.unary(a, |t| t.cast(dt.get())),
            Step::Reduce(a, op, ref ds, keep) => {
                let ds = dims(ds);
                self.unary(a, |t| match op {
                    Reduce::Sum => t.sum(&ds, keep),
                    Reduce::Mean => t.mean(&ds, keep),
                    Reduce::Max => t.max(&ds, keep),
                    Reduce::Min => t.min(&ds, keep),
                })
            }
            Step::Argmax(a, d, keep) => self.unary(a, |t| t.argmax(d.get(), keep)),
            Step::Softmax(a, d, log) => {
                self.unary(a, |t| if log { t.log_softmax(d.get()) } else { t.softmax(d.get()) })
            }
            Step::LayerNorm(a, w, b, eps) => {
                let (Some(x), Some(w), Some(b)) = (self.get(a), self.get(w), self.get(b)) else { return };
                let size = x.size.max(w.size).max(b.size);
                let t = x.t.layer_norm(&w.t, &b.t, eps);
                self.push(t, size);
            }
            Step::Reshape(a, ref s) => self.unary(a, |t| t.reshape(dims(s))),
            Step::Permute(a, ref p) => self.unary(a, |t| t.permute(&dims(p))),
            Step::Transpose(a, x, y) => self.unary(a, |t| t.transpose(x.get(), y.get())),
            Step::BroadcastTo(a, ref s) => self.unary(a, |t| t.broadcast_to(dims(s))),
            Step::Narrow(a, d, s, l) => self.unary(a, |t| t.narrow(d.get(), s.get(), l.get())),
            Step::Slice(a, d, s, e, st) => self.unary(a, |t| t.slice(d.get(), s.get(), e.get(), st.get())),
            Step::Squeeze(a, d) => self.unary(a, |t| t.squeeze(d.get())),
            Step::Unsqueeze(a, d) => self.unary(a, |t| t.unsqueeze(d.get())),
            Step::Cat(ref xs, d, stack) => {
                let picked: Vec<&Slot> = xs.iter().take(6).filter_map(|&i| self.get(i)).collect();
                let size = picked.iter().map(|s| s.size).max().unwrap_or(Size::Small);
                let refs: Vec<&Tensor> = picked.iter().map(|s| &s.t).collect();
                let t = if stack { Tensor::stack(&refs, d.get()) } else { Tensor::cat(&refs, d.get()) };
                self.push(t, size);
            }
            Step::Gather(a, d, i) => self.binary(a, i, |x, i| x.gather(d.get(), i)),
            Step::IndexSelect(a, d, i) => self.binary(a, i, |x, i| x.index_select(d.get(), i)),
            Step::MatMul(a, b) => {
                let (Some(x), Some(y)) = (self.get(a), self.get(b)) else { return };
                let work = x.t.numel_checked().and_then(|n| n.checked_mul(*y.t.shape().last().unwrap_or(&1)));
                let size = x.size.max(y.size).max(work_size(work));
                let t = x.t.matmul(&y.t);
                self.push(t, size);
            }
            Step::Conv2d(a, w, stride, pad, dil, groups) => {
                let (Some(x), Some(k)) = (self.get(a), self.get(w)) else { return };
                let (x_t, k_t) = (x.t.clone(), k.t.clone());
                let inputs = x.size.max(k.size);
                let t = x_t.conv2d(&k_t, stride.get(), pad.get(), dil.get(), groups.get());
                // Each output element reads a window of the weight's size.
                let per = k_t.numel_checked().map(|n| n / k_t.shape().first().copied().unwrap_or(1).max(1));
                let work = t.numel_checked().zip(per).and_then(|(o, p)| o.checked_mul(p));
                self.push(t, inputs.max(work_size(work)));
            }
            Step::Pool(a, max, kernel, stride, pad) => {
                let k = kernel.get();
                self.unary(a, |t| {
                    if max {
                        t.max_pool2d(k, stride.get(), pad.get())
                    } else {
                        t.avg_pool2d(k, stride.get(), pad.get())
                    }
                });
                if let Some(last) = self.slots.last_mut() {
                    let work = last.t.numel_checked().and_then(|n| n.checked_mul(k)).and_then(|n| n.checked_mul(k));
                    last.size = last.size.max(work_size(work));
                }
            }
            Step::Variable(name, a) => {
                let Some(s) = self.get(a) else { return };
                if s.size == Size::Big {
                    return; // a variable's first read computes its value
                }
                let size = s.size;
                if let Ok(v) = ctx.variable(name.get(), &s.t) {
                    let t = v.tensor();
                    self.vars.push(v);
                    self.push(t, size);
                }
            }
            Step::Assign(v, a) => {
                let Some(s) = self.get(a) else { return };
                if s.size == Size::Big || self.vars.is_empty() {
                    return;
                }
                let _ = self.vars[v as usize % self.vars.len()].assign(&s.t);
            }
            Step::Backward(a) => {
                let Some(s) = self.get(a) else { return };
                if s.size == Size::Big {
                    return;
                }
                if let Ok(grads) = s.t.sum_all().backward() {
                    for (_, g) in grads.iter() {
                        count(&mut self.outcome, read(g, ReadAs::Own));
                    }
                }
            }
            Step::PushScope(name) => {
                let _ = ctx.push_scope(name.get());
            }
            Step::PopScope(name) => {
                let _ = ctx.pop_scope(name.get());
            }
            Step::Read(a, how) => {
                if let Some(s) = self.get(a) {
                    if s.size != Size::Big {
                        let ok = read(&s.t, how);
                        count(&mut self.outcome, ok);
                    }
                }
            }
            Step::Realize(ref xs) => {
                if let Some(ts) = self.readable(xs) {
                    let _ = ctx.realize(&ts.iter().collect::<Vec<_>>());
                }
            }
            Step::Explain(ref xs) => {
                if let Some(ts) = self.readable(xs) {
                    if let Ok(graph) = ctx.optimized_graph(&ts.iter().collect::<Vec<_>>()) {
                        check_graph(&graph, "(an optimized api program)");
                    }
                }
            }
            Step::Drop(a) => {
                if !self.slots.is_empty() {
                    let i = a as usize % self.slots.len();
                    self.slots.remove(i);
                }
            }
            Step::ZeroGrad => ctx.zero_grad(),
        }
    }

    /// The tensors at `xs`, if none of them is too big to run.
    fn readable(&self, xs: &[u8]) -> Option<Vec<Tensor>> {
        let picked: Vec<&Slot> = xs.iter().take(4).filter_map(|&i| self.get(i)).collect();
        if picked.iter().any(|s| s.size == Size::Big) {
            return None;
        }
        Some(picked.iter().map(|s| s.t.clone()).collect())
    }
}

fn work_size(work: Option<usize>) -> Size {
    match work {
        None => Size::Overflow,
        Some(w) if w > WORK_LIMIT => Size::Big,
        Some(_) => Size::Small,
    }
}

/// `numel` without the overflow: `None` when the product overflows.
trait NumelChecked {
    fn numel_checked(&self) -> Option<usize>;
}

impl NumelChecked for Tensor {
    fn numel_checked(&self) -> Option<usize> {
        numel(self.shape())
    }
}

/// The element count, `None` when it overflows; a zero dim makes it 0
/// whatever the others are (`[usize::MAX, 0]` holds nothing).
fn numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn arange(ctx: &Context, a: Sc, b: Sc, c: Sc) -> Tensor {
    // One element type for all three (arange is generic over one T): `a`'s.
    match a {
        Sc::I32(x) => ctx.arange(x, as_i64(b) as i32, as_i64(c) as i32),
        Sc::I64(x) => ctx.arange(x, as_i64(b), as_i64(c)),
        Sc::U8(x) => ctx.arange(x, as_i64(b) as u8, as_i64(c) as u8),
        Sc::F64(x) => ctx.arange(x, as_f64(b), as_f64(c)),
        Sc::F16(x) => ctx.arange(f16::from_bits(x), f16::from_f64(as_f64(b)), f16::from_f64(as_f64(c))),
        Sc::Bool(x) => ctx.arange(x, as_i64(b) != 0, as_i64(c) != 0),
        _ => ctx.arange(as_f64(a) as f32, as_f64(b) as f32, as_f64(c) as f32),
    }
}

fn as_f64(s: Sc) -> f64 {
    with_scalar!(s, x => kiln::Element::to_scalar(x).as_f64())
}

fn as_i64(s: Sc) -> i64 {
    with_scalar!(s, x => kiln::Element::to_scalar(x).as_i64())
}

/// `ctx.tensor` with data of the shape's size when that is small, and of
/// the wrong size (an error) otherwise.
fn from_vec(ctx: &Context, shape: Vec<usize>, dtype: DType) -> Tensor {
    let n = match size_of(&shape, dtype) {
        Size::Small => numel(&shape).unwrap_or(0),
        _ => 3,
    };
    let vals = (0..n).map(|i| ((i * 7919) % 23) as f64 - 11.0);
    match dtype {
        DType::F16 => ctx.tensor(&vals.map(f16::from_f64).collect::<Vec<_>>(), shape),
        DType::BF16 => ctx.tensor(&vals.map(bf16::from_f64).collect::<Vec<_>>(), shape),
        DType::F32 => ctx.tensor(&vals.map(|v| v as f32).collect::<Vec<_>>(), shape),
        DType::F64 => ctx.tensor(&vals.collect::<Vec<_>>(), shape),
        DType::U8 => ctx.tensor(&vals.map(|v| v as u8).collect::<Vec<_>>(), shape),
        DType::I32 => ctx.tensor(&vals.map(|v| v as i32).collect::<Vec<_>>(), shape),
        DType::I64 => ctx.tensor(&vals.map(|v| v as i64).collect::<Vec<_>>(), shape),
        DType::Bool => ctx.tensor(&vals.map(|v| v > 0.0).collect::<Vec<_>>(), shape),
    }
}

fn unary(t: &Tensor, op: Unary) -> Tensor {
    match op {
        Unary::Neg => -t,
        Unary::Abs => t.abs(),
        Unary::Exp => t.exp(),
        Unary::Log => t.log(),
        Unary::Sqrt => t.sqrt(),
        Unary::Rsqrt => t.rsqrt(),
        Unary::Recip => t.recip(),
        Unary::Sin => t.sin(),
        Unary::Cos => t.cos(),
        Unary::Tanh => t.tanh(),
        Unary::Sigmoid => t.sigmoid(),
        Unary::Relu => t.relu(),
        Unary::Gelu => t.gelu(),
        Unary::Silu => t.silu(),
        Unary::Detach => t.detach(),
        Unary::Flatten => t.flatten(),
        Unary::T => t.t(),
        Unary::SumAll => t.sum_all(),
    }
}

fn binary(t: &Tensor, rhs: impl kiln::IntoOperand, op: Binary) -> Tensor {
    match op {
        Binary::Add => t + rhs,
        Binary::Sub => t - rhs,
        Binary::Mul => t * rhs,
        Binary::Div => t / rhs,
        Binary::Pow => t.pow(rhs),
        Binary::Maximum => t.maximum(rhs),
        Binary::Minimum => t.minimum(rhs),
        Binary::Eq => t.eq(rhs),
        Binary::Ne => t.ne(rhs),
        Binary::Lt => t.lt(rhs),
        Binary::Le => t.le(rhs),
        Binary::Gt => t.gt(rhs),
        Binary::Ge => t.ge(rhs),
    }
}

/// `scalar op tensor` through the operator impls on Rust scalars (bool
/// has none: it goes the tensor-first way).
fn scalar_lhs<S: kiln::Element + ScalarLhs>(s: S, t: &Tensor, op: Binary) -> Tensor {
    s.apply(t, op)
}

trait ScalarLhs {
    fn apply(self, t: &Tensor, op: Binary) -> Tensor;
}

macro_rules! scalar_lhs_impl {
    ($($t:ty),*) => {$(
        impl ScalarLhs for $t {
            fn apply(self, t: &Tensor, op: Binary) -> Tensor {
                match op {
                    Binary::Add => self + t,
                    Binary::Sub => self - t,
                    Binary::Mul => self * t,
                    Binary::Div => self / t,
                    _ => binary(t, self, op),
                }
            }
        }
    )*};
}

scalar_lhs_impl!(f32, f64, i32, i64, u8, f16, bf16);

impl ScalarLhs for bool {
    fn apply(self, t: &Tensor, op: Binary) -> Tensor {
        binary(t, self, op)
    }
}

fn count(outcome: &mut Outcome, ok: bool) {
    if ok {
        outcome.values += 1;
    } else {
        outcome.errors += 1;
    }
}

/// Reads `t` as asked; a successful read must have `numel` elements.
/// Returns whether it succeeded.
fn read(t: &Tensor, how: ReadAs) -> bool {
    let n = match how {
        ReadAs::Own => match t.dtype() {
            DType::F16 => t.to_vec::<f16>().map(|v| v.len()),
            DType::BF16 => t.to_vec::<bf16>().map(|v| v.len()),
            DType::F32 => t.to_vec::<f32>().map(|v| v.len()),
            DType::F64 => t.to_vec::<f64>().map(|v| v.len()),
            DType::U8 => t.to_vec::<u8>().map(|v| v.len()),
            DType::I32 => t.to_vec::<i32>().map(|v| v.len()),
            DType::I64 => t.to_vec::<i64>().map(|v| v.len()),
            DType::Bool => t.to_vec::<bool>().map(|v| v.len()),
        },
        ReadAs::Item => t.item::<f32>().map(|_| 1),
        ReadAs::F32 => t.to_vec::<f32>().map(|v| v.len()),
        ReadAs::I64 => t.to_vec::<i64>().map(|v| v.len()),
        ReadAs::Bool => t.to_vec::<bool>().map(|v| v.len()),
    };
    if let Ok(n) = n {
        assert_eq!(Some(n), t.numel_checked(), "a read of {t:?} returned {n} elements");
    }
    n.is_ok()
}
