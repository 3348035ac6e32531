//! The action language of the interleaving test: what one seed does, the
//! f64 model of every value, and running the actions on a context.

use kiln::prelude::*;
use std::fmt;

/// Elements of every vector value.
pub const N: usize = 48;
/// Handles the actions hold across iterations.
pub const HELD: usize = 5;
/// Variables.
pub const VARS: usize = 2;

/// An operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    /// What handle `k` holds (fresh data when it holds nothing).
    Held(u8),
    /// Variable `k`'s current value.
    Var(u8),
    /// A new tensor made from host data of this seed.
    Fresh(u32),
}

/// A small program of two operands; every result lies in [-1, 1.4], so
/// values stay tame however long a chain gets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Prog {
    /// `tanh(a * 0.5 + b)`
    TanhAffine,
    /// `sigmoid(a - b)`
    SigmoidDiff,
    /// `exp(tanh(a)) * 0.5` (`b` unused)
    ExpTanh,
    /// `tanh(relu(a) * b)`
    ReluMul,
}

/// One step of a seed's run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// Handle `into` = `prog(a, b)`, recorded, not run.
    Record { prog: Prog, a: Src, b: Src, into: u8 },
    /// Runs handle `slot`'s plan and keeps its value.
    Realize { slot: u8 },
    /// Reads handle `slot`.
    Read { slot: u8 },
    /// Reads `(held[slot] * 2).sum_all()`: a second plan over the first's output.
    ReadDerived { slot: u8 },
    /// Lets go of handle `slot`.
    Drop { slot: u8 },
    /// Variable `var` = `prog(a, b)`.
    Assign { var: u8, prog: Prog, a: Src, b: Src },
    /// Reads `(var + with).sum_all()`.
    ReadVar { var: u8, with: Src },
    /// Reads variable `var` itself.
    ReadVarDirect { var: u8 },
    /// An unrelated read (collects dropped values).
    Collect,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5851_F42D_4C95_7F2D)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Host data of `seed`, in [-1, 1).
pub fn data(seed: u32) -> Vec<f32> {
    let mut r = Rng::new(seed as u64 + 0x1234);
    (0..N).map(|_| ((r.next() >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32).collect()
}

fn src(r: &mut Rng) -> Src {
    match r.below(8) {
        0..=4 => Src::Held(r.below(HELD as u64) as u8),
        5 | 6 => Src::Var(r.below(VARS as u64) as u8),
        _ => Src::Fresh(r.below(1000) as u32),
    }
}

fn prog(r: &mut Rng) -> Prog {
    [Prog::TanhAffine, Prog::SigmoidDiff, Prog::ExpTanh, Prog::ReluMul][r.below(4) as usize]
}

/// The actions of `iterations` iterations of seed `seed`: each records a
/// few programs over held values, variables and fresh data, realizes some,
/// reads some (directly and through a second plan), drops some, assigns a
/// variable and reads variables from other plans.
pub fn generate(seed: u64, iterations: usize) -> Vec<Action> {
    let mut r = Rng::new(seed);
    let mut out = Vec::new();
    let slot = |r: &mut Rng| r.below(HELD as u64) as u8;
    let var = |r: &mut Rng| r.below(VARS as u64) as u8;
    // Most values are realized right away and every assignment is read at
    // once, so a seed's plans come from a small set and each runs many
    // times; the rest stay lazy, so plans also read unrealized chains and
    // carry pending assignments.
    for _ in 0..iterations {
        for _ in 0..1 + r.below(2) {
            let into = slot(&mut r);
            out.push(Action::Record { prog: prog(&mut r), a: src(&mut r), b: src(&mut r), into });
            if r.below(4) != 0 {
                out.push(Action::Realize { slot: into });
            }
        }
        for _ in 0..r.below(3) {
            out.push(match r.below(3) {
                0 => Action::Read { slot: slot(&mut r) },
                _ => Action::ReadDerived { slot: slot(&mut r) },
            });
        }
        if r.below(2) == 0 {
            out.push(Action::Drop { slot: slot(&mut r) });
        }
        if r.below(3) != 0 {
            let v = var(&mut r);
            out.push(Action::Assign { var: v, prog: prog(&mut r), a: src(&mut r), b: src(&mut r) });
            out.push(match r.below(3) {
                0 => Action::ReadVarDirect { var: v },
                _ => Action::ReadVar { var: v, with: Src::Held(slot(&mut r)) },
            });
        }
        if r.below(2) == 0 {
            out.push(Action::ReadVar { var: var(&mut r), with: Src::Held(slot(&mut r)) });
        }
        if r.below(3) == 0 {
            out.push(Action::Collect);
        }
    }
    out
}

/// The f64 value of every handle and variable.
#[derive(Clone)]
struct Model {
    held: Vec<Option<Vec<f64>>>,
    vars: Vec<Vec<f64>>,
}

fn apply(p: Prog, a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(&a, &b)| match p {
            Prog::TanhAffine => (a * 0.5 + b).tanh(),
            Prog::SigmoidDiff => 1.0 / (1.0 + (b - a).exp()),
            Prog::ExpTanh => a.tanh().exp() * 0.5,
            Prog::ReluMul => (a.max(0.0) * b).tanh(),
        })
        .collect()
}

fn record(p: Prog, a: &Tensor, b: &Tensor) -> Tensor {
    match p {
        Prog::TanhAffine => (a * 0.5 + b).tanh(),
        Prog::SigmoidDiff => (a - b).sigmoid(),
        Prog::ExpTanh => a.tanh().exp() * 0.5,
        Prog::ReluMul => (a.relu() * b).tanh(),
    }
}

/// A value read that is not what the model says.
pub struct Mismatch {
    pub at: usize,
    pub action: Action,
    pub message: String,
}

/// One seed on one context: the handles and variables, beside the model.
struct Runner<'c> {
    ctx: &'c Context,
    held: Vec<Option<Tensor>>,
    vars: Vec<Variable>,
    model: Model,
}

impl Runner<'_> {
    /// An operand of a program. A handle not yet realized is realized
    /// first: a chain of lazy values as operands makes a new plan nearly
    /// every time, and the test needs plans that run many times (lazy
    /// values are still read, through plans of their own).
    fn operand(&self, s: Src) -> Result<(Tensor, Vec<f64>), String> {
        let fresh = |seed: u32| {
            let d = data(seed);
            (self.ctx.tensor(&d, [N]), d.iter().map(|&x| x as f64).collect())
        };
        Ok(match s {
            Src::Held(k) => match (&self.held[k as usize], &self.model.held[k as usize]) {
                (Some(t), Some(m)) => {
                    t.realize().map_err(|e| format!("error realizing an operand: {e}"))?;
                    (t.clone(), m.clone())
                }
                _ => fresh(10_000 + k as u32),
            },
            Src::Var(k) => ((*self.vars[k as usize]).clone(), self.model.vars[k as usize].clone()),
            Src::Fresh(seed) => fresh(seed),
        })
    }

    fn check(&self, what: &str, got: &[f32], want: &[f64], tol: f64) -> Result<(), String> {
        if got.len() != want.len() {
            return Err(format!("{what}: {} elements, want {}", got.len(), want.len()));
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            if !((g as f64) - w).abs().le(&(tol * (1.0 + w.abs()))) {
                return Err(format!("{what}[{i}] = {g}, want {w} (and {} more elements)", got.len() - 1));
            }
        }
        Ok(())
    }

    fn step(&mut self, a: Action) -> Result<(), String> {
        let e = |e: kiln::Error| format!("error: {e}");
        match a {
            Action::Record { prog, a, b, into } => {
                let ((ta, ma), (tb, mb)) = (self.operand(a)?, self.operand(b)?);
                self.held[into as usize] = Some(record(prog, &ta, &tb));
                self.model.held[into as usize] = Some(apply(prog, &ma, &mb));
            }
            Action::Realize { slot } => {
                if let Some(t) = &self.held[slot as usize] {
                    t.realize().map_err(e)?;
                }
            }
            Action::Read { slot } => {
                if let (Some(t), Some(m)) = (&self.held[slot as usize], &self.model.held[slot as usize]) {
                    self.check("held", &t.to_vec::<f32>().map_err(e)?, m, 1e-5)?;
                }
            }
            Action::ReadDerived { slot } => {
                if let (Some(t), Some(m)) = (&self.held[slot as usize], &self.model.held[slot as usize]) {
                    let got = (t * 2.0).sum_all().item::<f32>().map_err(e)?;
                    let want: f64 = m.iter().map(|x| 2.0 * x).sum();
                    self.check("(held * 2).sum_all()", &[got], &[want], 1e-5 * N as f64)?;
                }
            }
            Action::Drop { slot } => {
                self.held[slot as usize] = None;
                self.model.held[slot as usize] = None;
            }
            Action::Assign { var, prog, a, b } => {
                let ((ta, ma), (tb, mb)) = (self.operand(a)?, self.operand(b)?);
                self.vars[var as usize].assign(record(prog, &ta, &tb)).map_err(e)?;
                self.model.vars[var as usize] = apply(prog, &ma, &mb);
            }
            Action::ReadVar { var, with } => {
                let (tw, mw) = self.operand(with)?;
                let got = (&*self.vars[var as usize] + &tw).sum_all().item::<f32>().map_err(e)?;
                let want: f64 = self.model.vars[var as usize].iter().zip(&mw).map(|(v, w)| v + w).sum();
                self.check("(var + x).sum_all()", &[got], &[want], 1e-5 * N as f64)?;
            }
            Action::ReadVarDirect { var } => {
                let got = self.vars[var as usize].to_vec::<f32>().map_err(e)?;
                self.check("var", &got, &self.model.vars[var as usize], 1e-5)?;
            }
            Action::Collect => {
                let got = self.ctx.tensor(&[0.5f32], [1]).sum_all().item::<f32>().map_err(e)?;
                self.check("unrelated read", &[got], &[0.5], 0.0)?;
            }
        }
        Ok(())
    }
}

/// Runs `actions` on `ctx` (which must be fresh: variables are made
/// here), comparing every read with the model; the first mismatch stops.
pub fn run(ctx: &Context, actions: &[Action]) -> Result<(), Mismatch> {
    let vars = (0..VARS)
        .map(|k| {
            let init = data(20_000 + k as u32);
            ctx.variable(&format!("v{k}"), ctx.tensor(&init, [N])).map(|v| (v, init))
        })
        .collect::<kiln::Result<Vec<_>>>()
        .map_err(|e| Mismatch {
            at: 0,
            action: Action::Collect,
            message: format!("making variables: {e}"),
        })?;
    let model = Model {
        held: vec![None; HELD],
        vars: vars.iter().map(|(_, d)| d.iter().map(|&x| x as f64).collect()).collect(),
    };
    let mut r =
        Runner { ctx, held: vec![None; HELD], vars: vars.into_iter().map(|(v, _)| v).collect(), model };
    for (at, &action) in actions.iter().enumerate() {
        r.step(action).map_err(|message| Mismatch { at, action, message })?;
    }
    Ok(())
}
