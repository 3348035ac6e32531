//! What the fuzz targets in `fuzz/` check, shared with the corpus replay
//! test (`fuzz_corpus.rs`): the targets include this file with `#[path]`,
//! so a corpus file means the same input, checked the same way, under
//! libFuzzer (nightly, sanitizers) and under `cargo test` (stable).
//!
//! - [`kir_roundtrip`]: bytes as `.kir` text. A graph `parse` accepts must
//!   pass `verify` (the parser's documented promise), and print → parse →
//!   print must give the same text.
//! - [`api`]: bytes decoded by `arbitrary` into a [`Program`] of public-API
//!   calls on `Context::cpu()`, then run. Any call may return an `Err` (or a
//!   failed tensor whose read does); none may panic or abort.
//!
//! Both return normally when the input is fine and panic (the fuzzer's
//! crash) when a promise is broken.

use arbitrary::{Arbitrary, Unstructured};
use half::{bf16, f16};
use kiln::ir::text::{parse, parse_test_file, print};
use kiln::ir::{verify, Graph};
use kiln::{Context, DType, Tensor, Variable};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// A tensor whose bytes exceed this is not read (it would be allocated):
/// the fuzzer runs under `-rss_limit_mb=4096` next to other builds, and
/// small tensors run thousands of programs a second.
const READ_LIMIT_BYTES: usize = 1 << 21;
/// Matrix products and convolutions above this many multiply-adds are not
/// run, for the same reason.
const WORK_LIMIT: usize = 1 << 24;
/// Longer programs are cut here (a program is recorded, not unrolled, so
/// depth is not what this fuzzer looks for; `tests/robust/deep.rs` is).
const MAX_STEPS: usize = 48;

/// Panic messages of bugs that are known and being fixed elsewhere, which
/// the api fuzzer tolerates so that it keeps looking for new ones. Only
/// tolerated in a program that recorded a shape whose byte size overflows
/// `usize` (issue 11's checked shape arithmetic turns those into
/// `Error::Shape` at record time; when that lands this list goes empty).
const KNOWN_OVERFLOW_PANICS: &[&str] =
    &["capacity overflow", "attempt to multiply with overflow", "attempt to add with overflow"];

// ---------------------------------------------------------------- .kir

/// Parses `data` as `.kir` text (and as a pass test file); a graph the
/// parser accepts must verify and print → parse → print identically.
pub fn kir_roundtrip(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else { return };
    if let Ok(test) = parse_test_file(src) {
        check_graph(&test.graph, src);
    }
    if let Ok(graph) = parse(src) {
        check_graph(&graph, src);
    }
}

/// Parsed planned graphs whose planning tables (schedule, streams, memory)
/// do not describe them: `parse` checks each line but not the tables, so
/// it returns graphs that `verify` then rejects (issue 11's dead fused node
/// is one case; a `!live` range that is not the node's step and last read
/// is another, which this fuzzer found in its first seconds). Tolerated so
/// the fuzzer keeps looking for other bugs; `true` for such a graph.
///
/// Goes (`KNOWN_PLAN_TABLES` false) once `parse` verifies what it returns.
fn known_plan_table_gap(graph: &Graph, error: &kiln::Error) -> bool {
    const RULES: [&str; 4] = ["schedule:", "streams:", "memory:", "stream and memory plans need"];
    let message = error.to_string();
    KNOWN_PLAN_TABLES && !graph.tables().is_empty() && RULES.iter().any(|r| message.contains(r))
}

/// See [`known_plan_table_gap`].
const KNOWN_PLAN_TABLES: bool = false;

/// The round-trip contract for one graph that came from `src` (parsed, or
/// optimized from an api program).
pub fn check_graph(graph: &Graph, src: &str) {
    if let Err(e) = verify(graph) {
        if known_plan_table_gap(graph, &e) {
            return;
        }
        panic!("verify rejects a graph that parse accepted: {e}\n--- input\n{src}");
    }
    let printed = print(graph);
    let again = match parse(&printed) {
        Ok(g) => g,
        Err(e) => panic!("the printed graph does not parse: {e}\n--- input\n{src}\n--- printed\n{printed}"),
    };
    if let Err(e) = verify(&again) {
        panic!("the reparsed graph does not verify: {e}\n--- printed\n{printed}");
    }
    let reprinted = print(&again);
    assert_eq!(printed, reprinted, "print → parse → print differs\n--- input\n{src}");
}

// ---------------------------------------------------------------- api

/// What running one program did: how many reads returned values and how
/// many returned errors (so the replay test can show it exercised kiln),
/// and the message of a tolerated known panic.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Reads (and gradient reads) that returned values.
    pub values: usize,
    /// Reads that returned a `kiln::Error`.
    pub errors: usize,
    /// A known panic (see [`KNOWN_OVERFLOW_PANICS`]) that ended the program.
    pub known_panic: Option<String>,
}

/// Decodes `data` into a [`Program`] (as `fuzz_target!` would) and runs it.
pub fn api(data: &[u8]) -> Outcome {
    match Program::arbitrary_take_rest(Unstructured::new(data)) {
        Ok(program) => run_program(&program),
        Err(_) => Outcome::default(),
    }
}

/// Runs `program` on a fresh CPU context. A known panic is caught and
/// returned in the outcome; any other panic propagates (under libFuzzer
/// its hook aborts: the crash).
pub fn run_program(program: &Program) -> Outcome {
    install_hook();
    OVERFLOWED.store(false, Ordering::SeqCst);
    let mut run = Run { ctx: None, slots: Vec::new(), vars: Vec::new(), outcome: Outcome::default() };
    let result = panic::catch_unwind(AssertUnwindSafe(|| run.all(program)));
    TOLERATE.store(false, Ordering::SeqCst);
    let mut outcome = std::mem::take(&mut run.outcome);
    if let Err(payload) = result {
        let message = payload_text(payload.as_ref());
        if !(OVERFLOWED.load(Ordering::SeqCst) && is_known(&message)) {
            // Printed by the hook already (under libFuzzer: aborted there).
            panic::resume_unwind(payload)
        }
        outcome.known_panic = Some(message);
    }
    outcome
}

/// A recorded sequence of public-API calls.
#[derive(Arbitrary, Debug)]
pub struct Program {
    seed: u8,
    fast_math: bool,
    streams: u8,
    passes: Passes,
    steps: Vec<Step>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Passes {
    Default,
    NoFusion,
    NoSimplify,
    NoMemory,
    NoViewFoldNoConstantFold,
    Unoptimized,
    Unknown,
}

impl Passes {
    fn toggles(self) -> &'static str {
        match self {
            Passes::Default => "",
            Passes::NoFusion => "-fusion",
            Passes::NoSimplify => "-simplify",
            Passes::NoMemory => "-memory",
            Passes::NoViewFoldNoConstantFold => "-view-fold,-constant-fold",
            Passes::Unoptimized => "-view-fold,-constant-fold,-cse,-simplify,-dce,-fusion",
            Passes::Unknown => "-no-such-pass",
        }
    }
}

/// A dimension, an index or a count: mostly small (three of the nine
/// variants, as `arbitrary` picks variants evenly), sometimes empty, huge
/// or `usize::MAX`.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dim {
    Small(u8),
    Small2(u8),
    Small3(u8),
    Zero,
    One,
    Byte(u8),
    Pow2(u8),
    Huge(u64),
    Max,
}

impl Dim {
    fn get(self) -> usize {
        match self {
            Dim::Small(x) | Dim::Small2(x) | Dim::Small3(x) => (x % 6) as usize,
            Dim::Zero => 0,
            Dim::One => 1,
            Dim::Byte(x) => x as usize,
            Dim::Pow2(x) => 1usize << (x % 64),
            Dim::Huge(x) => x as usize,
            Dim::Max => usize::MAX,
        }
    }
}

fn dims(ds: &[Dim]) -> Vec<usize> {
    ds.iter().take(6).map(|d| d.get()).collect()
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dt {
    F16,
    BF16,
    F32,
    F64,
    U8,
    I32,
    I64,
    Bool,
}

impl Dt {
    fn get(self) -> DType {
        match self {
            Dt::F16 => DType::F16,
            Dt::BF16 => DType::BF16,
            Dt::F32 => DType::F32,
            Dt::F64 => DType::F64,
            Dt::U8 => DType::U8,
            Dt::I32 => DType::I32,
            Dt::I64 => DType::I64,
            Dt::Bool => DType::Bool,
        }
    }
}

/// A Rust scalar of any element type, with the awkward values spelled out
/// so the fuzzer finds them often.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Sc {
    F32(f32),
    F64(f64),
    I32(i32),
    I64(i64),
    U8(u8),
    Bool(bool),
    F16(u16),
    BF16(u16),
    Small(i8),
    Nan,
    Inf,
    NegInf,
    NegZero,
    Huge,
    I64Min,
}

/// Calls `$body` with `$v` bound to the scalar as its own Rust type.
macro_rules! with_scalar {
    ($sc:expr, $v:ident => $body:expr) => {
        match $sc {
            Sc::F32(x) => {
                let $v = x;
                $body
            }
            Sc::F64(x) => {
                let $v = x;
                $body
            }
            Sc::I32(x) => {
                let $v = x;
                $body
            }
            Sc::I64(x) => {
                let $v = x;
                $body
            }
            Sc::U8(x) => {
                let $v = x;
                $body
            }
            Sc::Bool(x) => {
                let $v = x;
                $body
            }
            Sc::F16(x) => {
                let $v = f16::from_bits(x);
                $body
            }
            Sc::BF16(x) => {
                let $v = bf16::from_bits(x);
                $body
            }
            Sc::Small(x) => {
                let $v = x as f32;
                $body
            }
            Sc::Nan => {
                let $v = f32::NAN;
                $body
            }
            Sc::Inf => {
                let $v = f64::INFINITY;
                $body
            }
            Sc::NegInf => {
                let $v = f32::NEG_INFINITY;
                $body
            }
            Sc::NegZero => {
                let $v = -0.0f32;
                $body
            }
            Sc::Huge => {
                let $v = 1e300f64;
                $body
            }
            Sc::I64Min => {
                let $v = i64::MIN;
                $body
            }
        }
    };
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Unary {
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
    Detach,
    Flatten,
    T,
    SumAll,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
}

/// What a read asks for: the tensor's own element type, or a fixed one
/// (an error when it differs).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum ReadAs {
    Own,
    Item,
    F32,
    I64,
    Bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Name {
    W,
    B,
    Grad,
    Empty,
    Slash,
    Dots,
    Space,
}

impl Name {
    fn get(self) -> &'static str {
        match self {
            Name::W => "w",
            Name::B => "b",
            Name::Grad => "grad",
            Name::Empty => "",
            Name::Slash => "a/b",
            Name::Dots => "..",
            Name::Space => " w ",
        }
    }
}

/// One public-API call; tensor operands are indices into the tensors made
/// so far (taken modulo their count).
#[derive(Arbitrary, Debug)]
enum Step {
    Zeros(Vec<Dim>, Dt),
    Ones(Vec<Dim>, Dt),
    Full(Vec<Dim>, Sc, Dt),
    Rand(Vec<Dim>, Dt),
    Randn(Vec<Dim>, Dt),
    Arange(Sc, Sc, Sc),
    FromVec(Vec<Dim>, Dt),
    Scalar(Sc),
    Unary(u8, Unary),
    Binary(u8, u8, Binary),
    BinaryScalar(u8, Sc, Binary),
    ScalarLhs(Sc, u8, Binary),
    Where(u8, u8, u8),
    WhereScalar(u8, u8, Sc, bool),
    Cast(u8, Dt),
    Reduce(u8, Reduce, Vec<Dim>, bool),
    Argmax(u8, Dim, bool),
    Softmax(u8, Dim, bool),
    LayerNorm(u8, u8, u8, f64),
    Reshape(u8, Vec<Dim>),
    Permute(u8, Vec<Dim>),
    Transpose(u8, Dim, Dim),
    BroadcastTo(u8, Vec<Dim>),
    Narrow(u8, Dim, Dim, Dim),
    Slice(u8, Dim, Dim, Dim, Dim),
    Squeeze(u8, Dim),
    Unsqueeze(u8, Dim),
    Cat(Vec<u8>, Dim, bool),
    Gather(u8, Dim, u8),
    IndexSelect(u8, Dim, u8),
    MatMul(u8, u8),
    Conv2d(u8, u8, Dim, Dim, Dim, Dim),
    Pool(u8, bool, Dim, Dim, Dim),
    Variable(Name, u8),
    Assign(u8, u8),
    Backward(u8),
    PushScope(Name),
    PopScope(Name),
    Read(u8, ReadAs),
    Realize(Vec<u8>),
    Explain(Vec<u8>),
    Drop(u8),
    ZeroGrad,
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
        if own == Size::Overflow || inputs == Size::Overflow || unaddressable(t.shape(), t.dtype()) {
            OVERFLOWED.store(true, Ordering::SeqCst);
        }
        self.slots.push(Slot { size: own.max(inputs), t });
    }

    fn make(&mut self, shape: &[Dim], dt: Dt, f: impl FnOnce(&Context, Vec<usize>, DType) -> Tensor) {
        let (ctx, shape, dtype) = (self.ctx(), dims(shape), dt.get());
        let requested = size_of(&shape, dtype);
        if requested == Size::Overflow || unaddressable(&shape, dtype) {
            OVERFLOWED.store(true, Ordering::SeqCst);
        }
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

/// True when the shape is not addressable, the rule of issue 11's checked
/// shape arithmetic: the byte span of some suffix of its dims (a zero dim
/// counting as 1, as a contiguous stride does) exceeds `isize::MAX`. So
/// `[0, usize::MAX, 2]`, which holds nothing, counts: kiln's own stride
/// and offset products overflow on it until that check lands.
fn unaddressable(shape: &[usize], dtype: DType) -> bool {
    let limit = isize::MAX as usize;
    let span =
        shape.iter().rev().try_fold(dtype.size(), |a, &d| a.checked_mul(d.max(1)).filter(|&s| s <= limit));
    span.is_none()
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

// ------------------------------------------------------ known panics

/// Set while `run_program` runs.
static TOLERATE: AtomicBool = AtomicBool::new(false);
/// Set once the running program records a shape whose bytes overflow.
static OVERFLOWED: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Wraps the panic hook (libFuzzer's aborts the process) so that a known
/// panic, while tolerated, unwinds quietly to `run_program`'s
/// `catch_unwind` instead.
fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let tolerated = TOLERATE.load(Ordering::SeqCst) && OVERFLOWED.load(Ordering::SeqCst);
            if tolerated && is_known(&payload_text(info.payload())) {
                return;
            }
            previous(info)
        }));
    });
    TOLERATE.store(true, Ordering::SeqCst);
}

fn is_known(message: &str) -> bool {
    KNOWN_OVERFLOW_PANICS.iter().any(|k| message.contains(k))
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".into()
    }
}
