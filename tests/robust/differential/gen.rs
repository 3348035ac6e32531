//! The random program generator. Everything comes from one `u64` seed.
//!
//! It builds a program an op at a time, evaluating each new value with the
//! reference as it goes, so it knows every value's range and bound and
//! keeps the program well conditioned: an op whose result would be unknown
//! (log of a range reaching 0, an overflow), too large, or whose bound
//! would be too wide to say anything (see [`Gen::acceptable`]) is rolled
//! back and another is drawn. Domain-restricted ops first make their
//! operand positive (`abs() + c`) where they need to, as a user would.
//!
//! Inputs are fresh random values (normal, uniform, positive, or small
//! integers, which make exact ties for `argmax` and `eq`), never all zero,
//! each exact in its dtype; Rust scalars are dyadic numbers every dtype
//! holds exactly, so neither side rounds an input.

mod ops;

use super::array::numel;
use super::eval::{step, Model, Val};
use super::program::{Bin, Dt, Instr, Program, ReadMode, Rhs, Source, Un};

/// splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform on `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..hi` (exclusive; `lo < hi`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo) as u64) as usize
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len())]
    }

    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (1.0 - self.unit(), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An index of `weights`, drawn in proportion.
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u32 = weights.iter().sum();
        let mut r = (self.next_u64() % total as u64) as u32;
        for (i, &w) in weights.iter().enumerate() {
            if r < w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }
}

/// How large a program's tensors are. Most programs are small; some
/// cross the CPU backend's vector widths and matmul tiles (medium), a few
/// its fused block, parallel thresholds and GEMM cache blocks (large:
/// up to 40,000-element inputs, matmul dims up to 400).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Small,
    Medium,
    Large,
}

impl Size {
    /// The most elements a value may have.
    fn max_numel(self) -> usize {
        match self {
            Size::Small => 384,
            Size::Medium => 4096,
            Size::Large => 80_000,
        }
    }

    /// The most elements a source may have.
    fn max_source(self) -> usize {
        match self {
            Size::Small => 96,
            Size::Medium => 1024,
            Size::Large => 40_000,
        }
    }

    /// The largest dim of a tensor of rank `rank`.
    fn max_dim(self, rank: usize) -> usize {
        match self {
            Size::Small => 5,
            Size::Medium => 24,
            Size::Large => [40_000, 40_000, 400, 64, 24][rank.min(4)],
        }
    }
}

/// The most sources (inputs, constants, index tensors) a program may have.
const MAX_SOURCES: usize = 10;

/// Scalars the generator uses: dyadic, exact in every float dtype.
const FLOAT_SCALARS: [f64; 12] = [0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, -0.5, -1.0, -2.0, -0.25];

/// Input distributions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dist {
    Normal,
    Uniform,
    Positive,
    SmallInts,
}

pub struct Gen {
    rng: Rng,
    model: Model,
    base: Dt,
    size: Size,
    instrs: Vec<Instr>,
    vals: Vec<Val>,
}

/// The program of `seed`. Without `f64_base` the base float dtype is f32
/// (most seeds), f16 or bf16; with it, f64.
pub fn generate(seed: u64, f64_base: bool) -> Program {
    let mut rng = Rng::new(seed);
    let base = if f64_base {
        Dt::F64
    } else {
        [Dt::F32, Dt::F32, Dt::F32, Dt::F32, Dt::F16, Dt::Bf16][rng.range(0, 6)]
    };
    let size = [Size::Small, Size::Medium, Size::Large][rng.weighted(&[85, 12, 3])];
    let mut g = Gen { rng, model: Model::default(), base, size, instrs: Vec::new(), vals: Vec::new() };
    for _ in 0..g.rng.range(1, 4) {
        let shape = g.shape(size.max_source());
        let dist = g.dist();
        g.data_source(base, shape, dist).expect("a fresh input is acceptable");
    }
    let ops = g.rng.range(5, 31);
    let (mut made, mut tries) = (0, 0);
    while made < ops && tries < 40 * ops {
        tries += 1;
        let mark = g.instrs.len();
        if g.op().is_some() {
            made += 1;
        } else {
            g.instrs.truncate(mark);
            g.vals.truncate(mark);
        }
    }
    let outputs = g.outputs();
    let read = if g.rng.chance(0.5) { ReadMode::EachInTurn } else { ReadMode::Together };
    Program { seed, instrs: g.instrs, outputs, read }
}

/// `p` with each data source's values shuffled (the same values, so the
/// same domains and ranges, in new places): the same structure on new
/// data.
pub fn shuffled(p: &Program) -> Program {
    let mut rng = Rng::new(p.seed ^ 0xA5A5_A5A5_A5A5_A5A5);
    let mut out = p.clone();
    for instr in &mut out.instrs {
        if let Instr::Source { src: Source::Data(d), .. } = instr {
            for i in (1..d.len()).rev() {
                d.swap(i, rng.range(0, i + 1));
            }
        }
    }
    out
}

impl Gen {
    fn dt(&self, v: usize) -> Dt {
        self.vals[v].dt
    }

    fn shape_of(&self, v: usize) -> Vec<usize> {
        self.vals[v].arr.shape.clone()
    }

    fn sources(&self) -> usize {
        self.instrs.iter().filter(|i| matches!(i, Instr::Source { .. })).count()
    }

    /// Appends `instr` if its value is acceptable; its id.
    fn push(&mut self, instr: Instr) -> Option<usize> {
        let v = step(self.model, &self.vals, &instr);
        if !self.acceptable(&v) {
            return None;
        }
        self.instrs.push(instr);
        self.vals.push(v);
        Some(self.vals.len() - 1)
    }

    /// Whether a value keeps the program checkable: every element known,
    /// in range, and (for all but a few elements) a bound narrow against
    /// the value's scale; bools and integers mostly certain.
    fn acceptable(&self, v: &Val) -> bool {
        if v.arr.numel() > self.size.max_numel() {
            return false;
        }
        let vals = v.arr.values();
        if vals.iter().any(|x| !x.known()) {
            return false;
        }
        let loose = if v.dt.is_float() {
            let limit = if v.dt == Dt::F16 { 1e4 } else { 1e5 };
            if vals.iter().any(|x| x.mag() > limit) {
                return false;
            }
            let q = match v.dt {
                Dt::F16 => 0.05,
                Dt::Bf16 => 0.25,
                Dt::F32 => 1e-3,
                _ => 1e-9,
            };
            let scale = vals.iter().map(|x| x.mid.abs()).fold(0.0, f64::max);
            vals.iter().filter(|x| x.rad > q * (x.mid.abs() + 0.05 * scale)).count()
        } else {
            vals.iter().filter(|x| x.rad > 0.0).count()
        };
        loose * 5 <= vals.len()
    }

    /// A value among those `ok` accepts, most often the newest computed
    /// one (so that programs are deep chains, not wide sets of one-op
    /// branches).
    fn pick(&mut self, ok: impl Fn(&Val) -> bool) -> Option<usize> {
        let cands: Vec<usize> = (0..self.vals.len()).filter(|&i| ok(&self.vals[i])).collect();
        let newest = cands.iter().rev().find(|&&i| !matches!(self.instrs[i], Instr::Source { .. }));
        match newest {
            Some(&v) if self.rng.chance(0.6) => Some(v),
            _ if cands.is_empty() => None,
            _ => Some(self.rng.pick(&cands)),
        }
    }

    /// What the program reads: one to three of the computed values that
    /// nothing uses, those that need the most instructions first.
    fn outputs(&mut self) -> Vec<usize> {
        let n = self.instrs.len();
        let mut used = vec![false; n];
        for instr in &self.instrs {
            for v in instr.operands() {
                used[v] = true;
            }
        }
        let slice_len = |o: usize| {
            let mut need = vec![false; n];
            need[o] = true;
            for i in (0..=o).rev() {
                if need[i] {
                    for v in self.instrs[i].operands() {
                        need[v] = true;
                    }
                }
            }
            need.iter().filter(|&&x| x).count()
        };
        let mut sinks: Vec<(usize, usize)> = (0..n)
            .filter(|&i| !used[i] && !matches!(self.instrs[i], Instr::Source { .. }))
            .map(|i| (slice_len(i), i))
            .collect();
        sinks.sort_by(|a, b| b.cmp(a));
        let k = 1 + self.rng.chance(0.5) as usize + self.rng.chance(0.25) as usize;
        let mut outs: Vec<usize> = sinks.iter().take(k).map(|&(_, i)| i).collect();
        if outs.is_empty() {
            outs.push(n - 1);
        }
        outs
    }

    fn dist(&mut self) -> Dist {
        [Dist::Normal, Dist::Normal, Dist::Normal, Dist::Uniform, Dist::Positive, Dist::SmallInts]
            [self.rng.range(0, 6)]
    }

    /// A random shape of at most `max` elements: rank 0 to 4, dims from 1
    /// to the size class's largest (a fifth of them 1, half of the others
    /// small).
    fn shape(&mut self, max: usize) -> Vec<usize> {
        loop {
            let rank = [0, 1, 1, 2, 2, 2, 3, 3, 4][self.rng.range(0, 9)];
            let top = self.size.max_dim(rank);
            let s: Vec<usize> = (0..rank)
                .map(|_| match self.rng.range(0, 10) {
                    0 | 1 => 1,
                    2..=5 => self.rng.range(2, 6),
                    _ => self.rng.range(2, top + 1),
                })
                .collect();
            if numel(&s) <= max {
                return s;
            }
        }
    }

    fn data(&mut self, dt: Dt, n: usize, dist: Dist) -> Vec<f64> {
        let mut d: Vec<f64> = (0..n)
            .map(|_| match dt {
                Dt::Bool => self.rng.range(0, 2) as f64,
                Dt::U8 => self.rng.range(0, 40) as f64,
                Dt::I32 | Dt::I64 => self.rng.range(0, 41) as f64 - 20.0,
                _ => dt.round(match dist {
                    Dist::Normal => self.rng.normal(),
                    Dist::Uniform => 6.0 * self.rng.unit() - 3.0,
                    Dist::Positive => 0.25 + 2.75 * self.rng.unit(),
                    Dist::SmallInts => self.rng.range(0, 9) as f64 - 4.0,
                }),
            })
            .collect();
        if !d.is_empty() && d.iter().all(|&x| x == 0.0) {
            d[0] = 1.0;
        }
        d
    }

    fn data_source(&mut self, dt: Dt, shape: Vec<usize>, dist: Dist) -> Option<usize> {
        if self.sources() >= MAX_SOURCES {
            return None;
        }
        let data = self.data(dt, numel(&shape), dist);
        self.push(Instr::Source { shape, dt, src: Source::Data(data) })
    }

    /// An index tensor (i64 or i32) of `shape` with values below `bound`.
    fn index_source(&mut self, shape: Vec<usize>, bound: usize) -> Option<usize> {
        if self.sources() >= MAX_SOURCES {
            return None;
        }
        let dt = if self.rng.chance(0.7) { Dt::I64 } else { Dt::I32 };
        let data = (0..numel(&shape)).map(|_| self.rng.range(0, bound) as f64).collect();
        self.push(Instr::Source { shape, dt, src: Source::Data(data) })
    }

    /// A new operand of `dt` for `shape`: a random source whose shape
    /// broadcasts with it (the same, a suffix, dims set to 1, or one that
    /// `shape` broadcasts into), of distribution `dist`.
    fn partner(&mut self, dt: Dt, shape: &[usize], dist: Dist) -> Option<usize> {
        let s: Vec<usize> = match self.rng.range(0, 5) {
            0 | 1 => shape.to_vec(),
            2 => shape[self.rng.range(0, shape.len() + 1)..].to_vec(),
            3 => shape.iter().map(|&d| if self.rng.chance(0.5) { 1 } else { d }).collect(),
            _ => {
                let mut s: Vec<usize> = shape
                    .iter()
                    .map(|&d| if d == 1 && self.rng.chance(0.7) { self.rng.range(2, 4) } else { d })
                    .collect();
                if self.rng.chance(0.4) {
                    s.insert(0, self.rng.range(2, 4));
                }
                s
            }
        };
        if numel(&s) > self.size.max_source() {
            return None;
        }
        self.data_source(dt, s, dist)
    }

    /// A scalar of `dt`'s kind that the dtype holds exactly.
    fn scalar(&mut self, dt: Dt) -> f64 {
        match dt {
            Dt::U8 => self.rng.range(0, 6) as f64,
            Dt::I32 | Dt::I64 => self.rng.range(0, 9) as f64 - 4.0,
            Dt::Bool => self.rng.range(0, 2) as f64,
            _ => self.rng.pick(&FLOAT_SCALARS),
        }
    }

    /// `v`, made positive first (`abs() + c`) unless it already is.
    fn positive(&mut self, v: usize, margin: f64) -> Option<usize> {
        if self.vals[v].arr.values().iter().all(|x| x.lo() > margin) {
            return Some(v);
        }
        let a = self.push(Instr::Unary(Un::Abs, v))?;
        let c = self.rng.pick(&[0.25, 0.5, 1.0]);
        self.push(Instr::Binary { op: Bin::Add, a, rhs: Rhs::Scalar(c), reversed: false })
    }

    /// One op (with whatever operands it needs); `None` rolls it back.
    fn op(&mut self) -> Option<usize> {
        let weights = [
            14, // unary
            14, // binary
            8,  // scalar binary
            6,  // compare / where
            5,  // cast
            9,  // reductions
            3,  // argmax (and gather of it)
            4,  // softmax, log_softmax
            2,  // layer_norm
            7,  // matmul
            14, // views
            4,  // cat, stack
            4,  // gather, index_select
            3,  // constants
            1,  // realize
            4,  // conv2d, max_pool2d, avg_pool2d
        ];
        match self.rng.weighted(&weights) {
            0 => self.unary(),
            1 => self.binary(),
            2 => self.scalar_binary(),
            3 => self.compare_where(),
            4 => self.cast(),
            5 => self.reduce(),
            6 => self.argmax(),
            7 => self.softmax(),
            8 => self.layer_norm(),
            9 => self.matmul(),
            10 => self.view(),
            11 => self.cat(),
            12 => self.gather(),
            13 => self.constant(),
            15 => self.conv_pool(),
            _ => {
                let v = self.pick(|_| true)?;
                self.push(Instr::Realize(v))
            }
        }
    }
}
