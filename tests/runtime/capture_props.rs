//! Captured equals uncaptured, for anything a user changes between calls
//! (issue 33's first test class). Random step closures, each run twice on
//! fresh contexts with one seed: once through `ctx.capture` and once
//! called directly every iteration. Between calls the host does what a
//! training loop does: sets a learning rate or an EMA decay, sets a host
//! scalar the step reads, assigns or reads a variable outside the step.
//! The closures read and assign variables, read snapshots taken outside
//! (`detach`, unrealized reads), draw random numbers, open scopes, train
//! with an optimizer and update an EMA. The two runs are compared call by
//! call, and every variable at the end.
//!
//! `KILN_CAPTURE_PROPS_SEED=n` runs one program (the failure message names
//! its seed).

use super::splitmix::Rng;
use super::{data, devices};
use kiln::capture::HostScalar;
use kiln::nn::Ema;
use kiln::optim::{Adam, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;
use std::cell::RefCell;

/// The draws only this file needs.
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const VARS: usize = 3;
const CALLS: usize = 20;

/// An f32[4] value of the step.
#[derive(Clone, Debug)]
enum Expr {
    /// The variable as the step reads it (its value at each call).
    Var(usize),
    /// The call's argument.
    Arg,
    /// `w.detach()`, taken before the step was made.
    Snapshot(usize),
    /// `&*w * 1.5`, recorded before the step was made and never computed.
    Lazy(usize),
    /// `randn * 0.25`: fresh numbers every call.
    Random,
    /// The user's host scalar, read in the step.
    Host,
    Const(f32),
    Add(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Tanh(Box<Expr>),
}

#[derive(Clone, Debug)]
enum Action {
    /// `v = tanh(v / 2 + e)`.
    Assign(usize, Expr),
    /// The action inside a scope of this name.
    Scoped(String, Box<Action>),
    /// A loss of the parameters, its backward pass, the optimizer's step
    /// and `zero_grad`; the loss is a result.
    Train,
    /// `ema.update_from(params, decay)`.
    Ema,
    /// A result of the step.
    Output(Expr),
}

#[derive(Clone, Copy, Debug)]
enum Optim {
    Sgd,
    Adam,
    AdamW,
}

/// What the host does before a call.
#[derive(Clone, Debug)]
enum Between {
    SetLr(f64),
    SetDecay(f64),
    SetHost(f64),
    AssignOutside(usize),
    ReadOutside(usize),
    Nothing,
}

#[derive(Debug)]
struct Program {
    optim: Optim,
    actions: Vec<Action>,
    between: Vec<Between>,
}

fn expr(rng: &mut Rng, depth: u32) -> Expr {
    let leaf = depth == 0 || rng.below(3) == 0;
    if leaf {
        return match rng.below(7) {
            0 => Expr::Var(rng.below(VARS as u64) as usize),
            1 => Expr::Arg,
            2 => Expr::Snapshot(rng.below(VARS as u64) as usize),
            3 => Expr::Lazy(rng.below(VARS as u64) as usize),
            4 => Expr::Random,
            5 => Expr::Host,
            _ => Expr::Const((rng.uniform() * 2.0 - 1.0) as f32),
        };
    }
    let a = Box::new(expr(rng, depth - 1));
    match rng.below(3) {
        0 => Expr::Add(a, Box::new(expr(rng, depth - 1))),
        1 => Expr::Mul(a, Box::new(expr(rng, depth - 1))),
        _ => Expr::Tanh(a),
    }
}

fn action(rng: &mut Rng, trained: &mut bool, scopes: &mut u32) -> Action {
    match rng.below(8) {
        0..=2 => Action::Assign(rng.below(VARS as u64) as usize, expr(rng, 2)),
        3 if !*trained => {
            *trained = true;
            Action::Train
        }
        4 => Action::Ema,
        5 => {
            *scopes += 1;
            let inner = match rng.below(2) {
                0 => Action::Assign(rng.below(VARS as u64) as usize, expr(rng, 2)),
                _ => Action::Output(expr(rng, 2)),
            };
            Action::Scoped(format!("s{scopes}"), Box::new(inner))
        }
        _ => Action::Output(expr(rng, 2)),
    }
}

impl Program {
    fn random(seed: u64) -> Program {
        let mut rng = Rng(seed);
        let optim = [Optim::Sgd, Optim::Adam, Optim::AdamW][rng.below(3) as usize];
        let (mut trained, mut scopes) = (false, 0);
        let n = 2 + rng.below(4);
        let mut actions: Vec<Action> = (0..n).map(|_| action(&mut rng, &mut trained, &mut scopes)).collect();
        actions.push(Action::Output(expr(&mut rng, 2)));
        let between = (0..CALLS)
            .map(|_| match rng.below(6) {
                0 => Between::SetLr([0.0, 0.01, 0.05, 0.2][rng.below(4) as usize]),
                1 => Between::SetDecay(rng.uniform()),
                2 => Between::SetHost(rng.uniform() * 2.0 - 1.0),
                3 => Between::AssignOutside(rng.below(VARS as u64) as usize),
                4 => Between::ReadOutside(rng.below(VARS as u64) as usize),
                _ => Between::Nothing,
            })
            .collect();
        Program { optim, actions, between }
    }
}

/// One run's context and what the step closes over.
struct Env {
    ctx: Context,
    vars: Vec<Variable>,
    params: Vec<Variable>,
    opt: RefCell<Box<dyn Optimizer>>,
    ema: Ema,
    decay: HostScalar,
    host: HostScalar,
    snapshots: Vec<Tensor>,
    lazies: Vec<Tensor>,
}

impl Env {
    fn new(make: fn() -> Context, optim: Optim) -> Result<Env> {
        let ctx = make().with_seed(11);
        let vars = (0..VARS)
            .map(|i| ctx.variable(&format!("v{i}"), ctx.tensor(&data(4, 1 + i as u64), [4])))
            .collect::<Result<Vec<_>>>()?;
        let params = (0..2)
            .map(|i| ctx.variable(&format!("p{i}"), ctx.tensor(&data(4, 10 + i as u64), [4])))
            .collect::<Result<Vec<_>>>()?;
        let opt: Box<dyn Optimizer> = match optim {
            Optim::Sgd => Box::new(Sgd::new(
                &params,
                SgdConfig { lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.01 },
            )?),
            Optim::Adam => Box::new(Adam::new(&params, AdamConfig { lr: 0.05, ..AdamConfig::default() })?),
            Optim::AdamW => Box::new(AdamW::new(
                &params,
                AdamConfig { lr: 0.05, weight_decay: 0.1, ..AdamConfig::adamw() },
            )?),
        };
        let ema = Ema::new(&params)?;
        let snapshots = vars.iter().map(|v| v.detach()).collect();
        let lazies = vars.iter().map(|v| &**v * 1.5).collect();
        let (decay, host) = (HostScalar::new(0.9), HostScalar::new(0.5));
        Ok(Env { ctx, vars, params, opt: RefCell::new(opt), ema, decay, host, snapshots, lazies })
    }

    fn eval(&self, e: &Expr, arg: &Tensor) -> Tensor {
        match e {
            Expr::Var(i) => self.vars[*i].tensor(),
            Expr::Arg => arg.clone(),
            Expr::Snapshot(i) => self.snapshots[*i].clone(),
            Expr::Lazy(i) => self.lazies[*i].clone(),
            Expr::Random => self.ctx.randn([4]) * 0.25,
            Expr::Host => self.ctx.zeros([4]) + &self.host.tensor(&self.ctx, DType::F32),
            Expr::Const(c) => self.ctx.full([4], *c),
            Expr::Add(a, b) => self.eval(a, arg) + self.eval(b, arg),
            Expr::Mul(a, b) => self.eval(a, arg) * self.eval(b, arg),
            Expr::Tanh(a) => self.eval(a, arg).tanh(),
        }
    }

    fn act(&self, a: &Action, arg: &Tensor, out: &mut Vec<Tensor>) -> Result<()> {
        match a {
            Action::Assign(i, e) => {
                let v = &self.vars[*i];
                v.assign((&**v * 0.5 + self.eval(e, arg)).tanh())
            }
            Action::Scoped(name, inner) => self.ctx.scope(name, |_| self.act(inner, arg, out)),
            Action::Train => {
                let (p0, p1) = (&self.params[0], &self.params[1]);
                let loss = (&**p0 * arg).sum_all()
                    + (&**p1 * &**p1).sum_all() * 0.5
                    + (&**p0 * &self.vars[0].detach()).sum_all();
                let mut opt = self.opt.borrow_mut();
                opt.backward(&loss)?;
                opt.step()?;
                opt.zero_grad()?;
                out.push(loss.reshape([1]));
                Ok(())
            }
            Action::Ema => self.ema.update_from(&self.params, &self.decay),
            Action::Output(e) => {
                out.push(self.eval(e, arg));
                Ok(())
            }
        }
    }

    /// The step's body: what the closure records.
    fn body(&self, actions: &[Action], arg: &Tensor) -> Result<Vec<Tensor>> {
        let mut out = Vec::new();
        for a in actions {
            self.act(a, arg, &mut out)?;
        }
        Ok(out)
    }

    /// What the host does before a call; a read returns what it read.
    fn between(&self, b: &Between) -> Result<Option<Vec<f32>>> {
        match b {
            Between::SetLr(lr) => self.opt.borrow_mut().set_lr(*lr)?,
            Between::SetDecay(d) => self.decay.set(*d),
            Between::SetHost(x) => self.host.set(*x),
            Between::AssignOutside(i) => self.vars[*i].assign(&*self.vars[*i] * 0.75 + 0.1)?,
            Between::ReadOutside(i) => return self.vars[*i].to_vec::<f32>().map(Some),
            Between::Nothing => {}
        }
        Ok(None)
    }

    /// Every f32 variable by name, at the end.
    fn finals(&self) -> Result<Vec<(String, Vec<f32>)>> {
        let mut out = Vec::new();
        for name in self.ctx.workspace().names() {
            let v = self.ctx.get_variable(name)?;
            if v.dtype() == DType::F32 {
                out.push((name.to_string(), v.to_vec::<f32>()?));
            }
        }
        Ok(out)
    }
}

/// Everything a run read, in order: results and outside reads per call,
/// then every variable.
type Trace = (Vec<Vec<f32>>, Vec<(String, Vec<f32>)>);

fn run(make: fn() -> Context, p: &Program, captured: bool) -> Result<Trace> {
    let env = Env::new(make, p.optim)?;
    let mut reads = Vec::new();
    let args: Vec<Tensor> = (0..CALLS).map(|k| env.ctx.tensor(&data(4, 100 + k as u64), [4])).collect();
    let mut step = env.ctx.capture(|a: &[Tensor]| env.body(&p.actions, &a[0]));
    for (k, arg) in args.iter().enumerate() {
        reads.extend(env.between(&p.between[k])?);
        let out = if captured {
            step.call(&[arg])?
        } else {
            let out = env.body(&p.actions, arg)?;
            env.ctx.realize(&out.iter().collect::<Vec<_>>())?;
            out
        };
        for t in &out {
            reads.push(t.to_vec::<f32>()?);
        }
    }
    if captured {
        assert_eq!(step.captures(), 1, "one signature, one recording");
    }
    drop(step);
    Ok((reads, env.finals()?))
}

fn compare(what: &str, captured: &[f32], uncaptured: &[f32]) {
    assert_eq!(captured.len(), uncaptured.len(), "{what}: lengths");
    for (c, u) in captured.iter().zip(uncaptured) {
        assert!(
            (c - u).abs() <= 1e-5 * u.abs().max(1.0),
            "{what}: captured {captured:?}, uncaptured {uncaptured:?}"
        );
    }
}

#[test]
fn captured_steps_equal_the_uncaptured_closure_for_random_programs() -> Result<()> {
    let only: Option<u64> = std::env::var("KILN_CAPTURE_PROPS_SEED").ok().and_then(|s| s.parse().ok());
    for (name, make) in devices() {
        // The emulator interprets every kernel (seconds per program on
        // CI's 2 cores) and a GPU compiles each plan with NVRTC: fewer
        // programs there.
        let programs = match name {
            "cpu" => 32,
            "cuda" => 8,
            _ => 2,
        };
        let seeds: Vec<u64> = match only {
            Some(s) => vec![s],
            None => (0..programs).map(|k| 1000 + k).collect(),
        };
        for seed in seeds {
            let p = Program::random(seed);
            let what = format!("{name}, seed {seed} (KILN_CAPTURE_PROPS_SEED={seed}), program {p:?}");
            let captured =
                run(make, &p, true).map_err(|e| Error::Runtime(format!("{what}: captured: {e}")))?;
            let uncaptured =
                run(make, &p, false).map_err(|e| Error::Runtime(format!("{what}: uncaptured: {e}")))?;
            assert_eq!(captured.0.len(), uncaptured.0.len(), "{what}: reads");
            for (k, (c, u)) in captured.0.iter().zip(&uncaptured.0).enumerate() {
                compare(&format!("{what}: read {k}"), c, u);
            }
            assert_eq!(
                captured.1.iter().map(|v| &v.0).collect::<Vec<_>>(),
                uncaptured.1.iter().map(|v| &v.0).collect::<Vec<_>>()
            );
            for (c, u) in captured.1.iter().zip(&uncaptured.1) {
                compare(&format!("{what}: variable {}", c.0), &c.1, &u.1);
            }
        }
    }
    Ok(())
}
