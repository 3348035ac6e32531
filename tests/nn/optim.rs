//! SGD, Adam and AdamW step for step against PyTorch's update formulas
//! written here in f64, on a quadratic loss whose gradient is known in
//! closed form, with a learning rate that changes every step (and no
//! recompile); gradient accumulation against one step on the whole batch.

use crate::{close, host};
use kiln::nn::{self, Linear, Module, Params};
use kiln::optim::{Accumulate, Adam, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

/// The learning rates of the five steps (a schedule: each is a runtime
/// value, so every step after the first runs the same plan).
const LRS: [f64; 5] = [0.1, 0.05, 0.2, 0.1, 0.03];

/// Two f64 parameters, `loss = Σ a·w²/2 + b·w` over both, so the gradient
/// is `a·w + b`; plus a third parameter the loss never reads.
struct Quadratic {
    ctx: Context,
    params: Vec<Variable>,
    unused: Variable,
    a: Vec<Vec<f64>>,
    b: Vec<Vec<f64>>,
}

impl Quadratic {
    fn new(seed: u64) -> Quadratic {
        let ctx = Context::cpu().with_seed(seed);
        let params: Vec<Variable> = [vec![2, 3], vec![4]]
            .into_iter()
            .enumerate()
            .map(|(i, s)| ctx.variable(&format!("w{i}"), ctx.randn_dtype(s, DType::F64)).unwrap())
            .collect();
        let unused = ctx.variable("unused", ctx.randn_dtype([3], DType::F64)).unwrap();
        let a =
            params.iter().map(|p| host(&(ctx.rand_dtype(p.shape().to_vec(), DType::F64) + 0.5))).collect();
        let b = params.iter().map(|p| host(&ctx.randn_dtype(p.shape().to_vec(), DType::F64))).collect();
        Quadratic { ctx, params, unused, a, b }
    }

    fn loss(&self) -> Tensor {
        let mut total = self.ctx.zeros_dtype([], DType::F64);
        for ((p, a), b) in self.params.iter().zip(&self.a).zip(&self.b) {
            let a = self.ctx.tensor(a, p.shape().to_vec());
            let b = self.ctx.tensor(b, p.shape().to_vec());
            total = total + (&a * &**p * &**p * 0.5 + &b * &**p).sum_all();
        }
        total
    }

    fn grad(&self, i: usize, w: &[f64]) -> Vec<f64> {
        w.iter().zip(&self.a[i]).zip(&self.b[i]).map(|((w, a), b)| a * w + b).collect()
    }

    fn values(&self) -> Vec<Vec<f64>> {
        let all: Vec<&Tensor> = self.params.iter().map(|p| &**p).collect();
        self.ctx.realize(&all).unwrap();
        self.params.iter().map(|p| host(p)).collect()
    }

    /// Runs `LRS.len()` steps of `opt`, calling `reference(step, lr, w, g)`
    /// for each parameter to advance the f64 copy, and compares after
    /// every step. Returns the compile counts after each step.
    fn check(
        &self,
        opt: &mut dyn Optimizer,
        mut reference: impl FnMut(usize, usize, f64, &mut [f64], &[f64]),
    ) {
        let mut want = self.values();
        let unused = host(&self.unused);
        let mut compiles = Vec::new();
        for (t, &lr) in LRS.iter().enumerate() {
            self.loss().backward().unwrap();
            opt.set_lr(lr).unwrap();
            assert_eq!(opt.lr(), lr);
            opt.step().unwrap();
            opt.zero_grad().unwrap();
            for (i, w) in want.iter_mut().enumerate() {
                let g = self.grad(i, w);
                reference(i, t + 1, lr, w, &g);
            }
            let got = self.values();
            for (g, w) in got.iter().zip(&want) {
                close(g, w, 1e-12, 1e-12);
            }
            compiles.push(self.ctx.stats().compiles);
        }
        assert_eq!(host(&self.unused), unused, "a parameter without a gradient is left alone");
        assert_eq!(compiles[1], compiles[LRS.len() - 1], "a new learning rate recompiled: {compiles:?}");
    }
}

#[test]
fn sgd_plain_momentum_nesterov_and_weight_decay() {
    for (momentum, nesterov, weight_decay) in
        [(0.0, false, 0.0), (0.9, false, 0.0), (0.8, true, 0.1), (0.5, false, 0.05)]
    {
        let q = Quadratic::new(21);
        let mut all = q.params.clone();
        all.push(q.unused.clone());
        let config = SgdConfig { lr: LRS[0], momentum, nesterov, weight_decay };
        let mut opt = Sgd::new(&all, config).unwrap();
        // torch.optim.SGD (dampening 0): the buffer starts as the first gradient.
        let mut bufs: Vec<Option<Vec<f64>>> = vec![None; 2];
        q.check(&mut opt, |i, _, lr, w, g| {
            let g: Vec<f64> = g.iter().zip(w.iter()).map(|(g, w)| g + weight_decay * w).collect();
            let d = if momentum > 0.0 {
                let b = match &bufs[i] {
                    None => g.clone(),
                    Some(b) => b.iter().zip(&g).map(|(b, g)| momentum * b + g).collect(),
                };
                bufs[i] = Some(b.clone());
                if nesterov {
                    g.iter().zip(&b).map(|(g, b)| g + momentum * b).collect()
                } else {
                    b
                }
            } else {
                g
            };
            w.iter_mut().zip(&d).for_each(|(w, d)| *w -= lr * d);
        });
    }
}

/// `torch.optim.Adam` / `AdamW` (amsgrad off), in PyTorch's own order of
/// operations: `step_size = lr / bc1`, `denom = √v / √bc2 + eps`.
fn adam_reference(c: AdamConfig, decoupled: bool) -> impl FnMut(usize, usize, f64, &mut [f64], &[f64]) {
    let mut m: Vec<Vec<f64>> = vec![Vec::new(); 2];
    let mut v: Vec<Vec<f64>> = vec![Vec::new(); 2];
    move |i, t, lr, w, g| {
        if m[i].is_empty() {
            m[i] = vec![0.0; w.len()];
            v[i] = vec![0.0; w.len()];
        }
        let (b1, b2) = c.betas;
        let bc1 = 1.0 - b1.powi(t as i32);
        let bc2 = 1.0 - b2.powi(t as i32);
        for k in 0..w.len() {
            let mut g = g[k];
            if decoupled {
                w[k] *= 1.0 - lr * c.weight_decay;
            } else {
                g += c.weight_decay * w[k];
            }
            m[i][k] = b1 * m[i][k] + (1.0 - b1) * g;
            v[i][k] = b2 * v[i][k] + (1.0 - b2) * g * g;
            let denom = v[i][k].sqrt() / bc2.sqrt() + c.eps;
            w[k] -= lr / bc1 * m[i][k] / denom;
        }
    }
}

#[test]
fn adam_with_an_l2_penalty_step_for_step() {
    for config in
        [AdamConfig::adam(), AdamConfig { betas: (0.8, 0.95), eps: 1e-3, weight_decay: 0.1, lr: 0.1 }]
    {
        let q = Quadratic::new(22);
        let mut opt = Adam::new(&q.params, config).unwrap();
        q.check(&mut opt, adam_reference(config, false));
    }
}

#[test]
fn adamw_with_decoupled_decay_step_for_step() {
    for config in
        [AdamConfig::adamw(), AdamConfig { betas: (0.5, 0.9), eps: 1e-2, weight_decay: 0.3, lr: 0.1 }]
    {
        let q = Quadratic::new(23);
        let mut opt = AdamW::new(&q.params, config).unwrap();
        q.check(&mut opt, adam_reference(config, true));
    }
}

#[test]
fn optimizer_state_lives_in_named_variables() {
    let q = Quadratic::new(24);
    let _adamw = AdamW::new(&q.params, AdamConfig::adamw()).unwrap();
    let _sgd = Sgd::new(&q.params, SgdConfig { momentum: 0.9, ..Default::default() }).unwrap();
    let mut names: Vec<String> = q.ctx.variables().iter().map(|v| v.name()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "adamw/exp_avg/w0",
            "adamw/exp_avg/w1",
            "adamw/exp_avg_sq/w0",
            "adamw/exp_avg_sq/w1",
            "adamw/step",
            "sgd/momentum/w0",
            "sgd/momentum/w1",
            "unused",
            "w0",
            "w1"
        ]
    );
}

/// 12 samples `x [12, 3]`, targets `[12, 2]`, the same on every context.
fn regression_data() -> (Vec<f32>, Vec<f32>) {
    let mut rng = kiln::data::Rng::new(77);
    let mut draw =
        |n: usize| (0..n).map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0).collect();
    (draw(36), draw(24))
}

/// A `Linear(3, 2)` trained with SGD (momentum) on the mean squared error:
/// either two updates each accumulated over three micro-batches of four
/// samples (optionally reading the loss after each), or two updates on
/// the whole batch of twelve. The mean of three equal-sized means is the
/// whole mean, so the weights must agree.
fn train_linear(micro: bool, read_each: bool) -> Vec<Vec<f64>> {
    let ctx = Context::cpu().with_seed(31);
    let fc = Linear::new(&ctx, "fc", 3, 2).unwrap();
    let mut opt = Sgd::new(&fc, SgdConfig { lr: 0.3, momentum: 0.9, ..Default::default() }).unwrap();
    let (x, y) = regression_data();
    let mut after = Vec::new();
    if micro {
        let mut acc = Accumulate::new(3).unwrap();
        for step in 0..6 {
            let j = step % 3;
            let xb = ctx.tensor(&x[j * 12..(j + 1) * 12], [4, 3]);
            let yb = ctx.tensor(&y[j * 8..(j + 1) * 8], [4, 2]);
            let loss = nn::mse(&fc.forward(&xb).unwrap(), &yb).unwrap();
            let update = acc.backward(&loss).unwrap();
            assert_eq!(update, j == 2);
            assert_eq!(acc.pending(), (j + 1) % 3);
            if update {
                opt.step().unwrap();
                opt.zero_grad().unwrap();
                after.push(fc.parameters().iter().map(|p| host(p)).collect::<Vec<_>>().concat());
            } else if read_each {
                loss.item::<f32>().unwrap();
            }
        }
    } else {
        for _ in 0..2 {
            let loss =
                nn::mse(&fc.forward(&ctx.tensor(&x, [12, 3])).unwrap(), &ctx.tensor(&y, [12, 2])).unwrap();
            loss.backward().unwrap();
            opt.step().unwrap();
            opt.zero_grad().unwrap();
            after.push(fc.parameters().iter().map(|p| host(p)).collect::<Vec<_>>().concat());
        }
    }
    after
}

#[test]
fn accumulating_three_micro_batches_is_one_step_on_all_of_them() {
    let whole = train_linear(false, false);
    assert_ne!(whole[0], whole[1], "the updates moved the weights");
    for read_each in [false, true] {
        let accumulated = train_linear(true, read_each);
        for (a, w) in accumulated.iter().zip(&whole) {
            close(a, w, 1e-6, 1e-5);
        }
    }
}

#[test]
fn one_update_per_k_with_k_one_is_a_plain_step() {
    let mut acc = Accumulate::new(1).unwrap();
    let ctx = Context::cpu();
    let w = ctx.variable("w", ctx.ones([2])).unwrap();
    assert!(acc.backward(&(&*w * 3.0).sum_all()).unwrap());
    assert_eq!(host(&ctx.grad(&w).unwrap()), [3.0, 3.0]);
}
