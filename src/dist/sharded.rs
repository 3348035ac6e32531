//! ZeRO-1: optimizer state sharded over the ranks of a group, DeepSpeed
//! style (flat shards, not parameters owned by ranks).
//!
//! The parameters are cut into buckets (last parameters first, as
//! backward produces their gradients; one dtype per bucket; about
//! `bucket_bytes` each), fixed when the optimizer is made. Each bucket is
//! a flat vector of its parameters end to end, padded with zeros to a
//! multiple of the group's size `n`, and rank `r` owns its `r`-th
//! `1/n`. A step records, per bucket:
//!
//! 1. the flattened gradients, `cat`, one `reduce_scatter_mean`: rank `r`
//!    gets the average gradient of its shard only (half an all-reduce's
//!    traffic);
//! 2. the rank's shard of the parameters (slices of the parameters that
//!    overlap it, nothing else copied), updated by the optimizer's
//!    arithmetic with moments that exist for that shard only;
//! 3. one `all_gather` of the updated shards, sliced back into every
//!    parameter (an assignment).
//!
//! So each rank keeps `1/n` of the moments (plus at most `n - 1` padding
//! elements per bucket), whatever the sizes of the parameters: one huge
//! embedding is cut like everything else, which per-parameter ownership
//! (PyTorch's `ZeroRedundancyOptimizer`) cannot balance.
//!
//! Why the update is not an inner [`Optimizer`]: an optimizer updates
//! variables, and the shard is a slice of several parameters, not a
//! variable. Making it one would keep a persistent copy of the shard on
//! every rank (what DeepSpeed's fp32 master partition is), a third more
//! state than the moments; instead the Adam family's arithmetic is shared
//! with [`crate::optim::AdamW`] as a rule that updates any tensor
//! (`optim::AdamRule`), and this file only decides which tensors.
//!
//! The results equal data parallelism's ([`super::DataParallel::new`] with
//! the same rule) bit for bit on the CPU: a reduce-scatter's chunk is the
//! all-reduce's bits (`combine.rs`) and the update is elementwise. On
//! CUDA, NCCL's reduce-scatter may sum in another order than its
//! all-reduce, so results agree within f32 rounding.

use crate::nn::{variable_at, Params};
use crate::optim::{check_lr, AdamConfig, AdamRule, Optimizer};
use crate::{Context, DType, Error, Location, Result, Tensor, Variable};

/// The update a [`ShardedOptimizer`] runs on each rank's shard.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ShardedRule {
    /// `torch.optim.Adam`'s update ([`crate::optim::Adam`]).
    Adam(AdamConfig),
    /// `torch.optim.AdamW`'s update ([`crate::optim::AdamW`]).
    AdamW(AdamConfig),
}

/// An optimizer whose state is sharded over the ranks of its parameters'
/// process group (ZeRO stage 1): each rank keeps the moments of a `1/n`
/// flat shard of the parameters, and a step reduce-scatters the
/// gradients, updates the shard and all-gathers the parameters. The
/// parameters end every step equal on every rank, and equal to what
/// [`super::DataParallel`] with the same rule computes. Train with it
/// through [`super::DataParallel::sharded`] (it does its own gradient
/// exchange, so it must not be wrapped in [`super::AverageGradients`]).
/// See the [module docs](self).
///
/// ```
/// use kiln::prelude::*;
/// use kiln::dist::{DataParallel, ShardedOptimizer};
/// use kiln::nn::{self, Linear, Module};
/// use kiln::optim::{AdamConfig, Optimizer};
///
/// let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
/// let mut zero = DataParallel::sharded(&ranks, |ctx| {
///     let model = Linear::new(ctx, "fc", 3, 1)?;
///     let opt = ShardedOptimizer::adamw(&model, AdamConfig { lr: 0.05, ..AdamConfig::adamw() })?;
///     Ok((model, opt))
/// }, |model, batch| nn::mse(&model.forward(&batch[0])?, &batch[1]))?;
/// let host = Context::cpu();
/// let (x, y) = (host.randn([8, 3]), host.randn([8, 1]));
/// let first = zero.step(&[&x, &y])?[0].item::<f32>()?;
/// for _ in 0..20 {
///     zero.step(&[&x, &y])?;
/// }
/// assert!(zero.step(&[&x, &y])?[0].item::<f32>()? < first);
/// // 4 parameters (3 weights, 1 bias): 2 per rank, two moments of f32 each,
/// // and the step count.
/// assert_eq!(zero.optimizer_state_bytes()?, vec![Some(2 * 2 * 4 + 8); 2]);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct ShardedOptimizer {
    ctx: Context,
    params: Vec<Variable>,
    rank: usize,
    ranks: usize,
    rule: AdamRule,
    step: Variable,
    buckets: Vec<Bucket>,
}

/// Parameters updated together through one reduce-scatter and one
/// all-gather.
struct Bucket {
    /// Indices into the parameters, in the bucket's order.
    members: Vec<usize>,
    /// Elements of the parameters, before padding.
    len: usize,
    /// Elements of each rank's shard (the padded length over the ranks).
    shard: usize,
    dtype: DType,
    exp_avg: Variable,
    exp_avg_sq: Variable,
}

impl ShardedOptimizer {
    /// AdamW on `params` (float variables of one context, a rank of a
    /// group), state sharded in buckets of about 4 MiB.
    #[track_caller]
    pub fn adamw(params: &impl Params, config: AdamConfig) -> Result<ShardedOptimizer> {
        ShardedOptimizer::build(params, ShardedRule::AdamW(config), 4 << 20, Location::caller())
    }

    /// Adam on `params`, as [`ShardedOptimizer::adamw`].
    #[track_caller]
    pub fn adam(params: &impl Params, config: AdamConfig) -> Result<ShardedOptimizer> {
        ShardedOptimizer::build(params, ShardedRule::Adam(config), 4 << 20, Location::caller())
    }

    /// `rule` on `params`, in buckets of about `bucket_bytes` (at least one
    /// parameter each): fewer, larger buckets make fewer collectives;
    /// smaller ones start reduce-scattering sooner in backward. Its state
    /// lives in the scope `zero/<adam|adamw>` below the current scope.
    #[track_caller]
    pub fn new(params: &impl Params, rule: ShardedRule, bucket_bytes: usize) -> Result<ShardedOptimizer> {
        ShardedOptimizer::build(params, rule, bucket_bytes, Location::caller())
    }

    fn build(
        params: &impl Params,
        rule: ShardedRule,
        bucket_bytes: usize,
        location: Location,
    ) -> Result<ShardedOptimizer> {
        const OP: &str = "ShardedOptimizer::new";
        let rule = match rule {
            ShardedRule::Adam(c) => AdamRule::new(c, false, OP, location)?,
            ShardedRule::AdamW(c) => AdamRule::new(c, true, OP, location)?,
        };
        let group = crate::optim::Group::new(params, OP, location)?;
        let (ctx, params) = (group.ctx, group.params);
        let (Some(rank), Some(ranks)) = (ctx.rank(), ctx.world_size()) else {
            return Err(Error::Argument {
                op: OP,
                message: format!(
                    "the parameters' context ({}) is in no process group; make the ranks a kiln::dist::Group first (DataParallel::sharded does)",
                    ctx.label()
                ),
                location,
            });
        };
        let scope = ["zero", rule.scope()];
        let step = variable_at(&ctx, &[scope[0], scope[1], "step"], &ctx.zeros_dtype([], DType::I64))?;
        let mut buckets = Vec::new();
        for (k, members) in bucket_members(&params, bucket_bytes).into_iter().enumerate() {
            let dtype = params[members[0]].dtype();
            let len: usize = members.iter().map(|&i| params[i].numel()).sum();
            let shard = len.div_ceil(ranks);
            let name = format!("bucket{k}");
            let zeros = ctx.zeros_dtype([shard], dtype);
            let exp_avg = variable_at(&ctx, &[scope[0], scope[1], "exp_avg", &name], &zeros)?;
            let exp_avg_sq = variable_at(&ctx, &[scope[0], scope[1], "exp_avg_sq", &name], &zeros)?;
            buckets.push(Bucket { members, len, shard, dtype, exp_avg, exp_avg_sq });
        }
        tracing::debug!(rank, ranks, buckets = buckets.len(), "sharded optimizer state");
        Ok(ShardedOptimizer { ctx, params, rank, ranks, rule, step, buckets })
    }

    /// This rank's shard of each bucket, in elements (equal on every rank).
    pub fn shard_lens(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.shard).collect()
    }

    fn step_at(&mut self, location: Location) -> Result<()> {
        let grads: Vec<Option<Tensor>> = self.params.iter().map(|p| self.ctx.grad(p)).collect();
        if grads.iter().all(Option::is_none) {
            return Ok(());
        }
        let Some(grads) = grads.iter().cloned().collect::<Option<Vec<Tensor>>>() else {
            let i = grads.iter().position(Option::is_none).unwrap_or(0);
            return Err(Error::Argument {
                op: "ShardedOptimizer::step",
                message: format!(
                    "parameter \"{}\" has no gradient but others do; a sharded optimizer updates each bucket's parameters together, so give it only the parameters that train",
                    self.params[i].name()
                ),
                location,
            });
        };
        let mut step = self.rule.begin(&self.ctx, &self.step)?;
        let (lo, ranks) = (self.rank, self.ranks);
        for b in &self.buckets {
            let pad = b.shard * ranks - b.len;
            let mut flat: Vec<Tensor> = Vec::new();
            for &i in &b.members {
                let g = grads[i].flatten();
                flat.push(if g.dtype() == b.dtype { g } else { g.cast(b.dtype) });
            }
            if pad > 0 {
                flat.push(self.ctx.zeros_dtype([pad], b.dtype));
            }
            let grad = Tensor::cat(&flat.iter().collect::<Vec<_>>(), 0).reduce_scatter_mean();
            let param = self.shard_of_parameters(b, lo * b.shard);
            let updated = step.update(&param, grad, &b.exp_avg, &b.exp_avg_sq)?;
            let all = updated.all_gather();
            let mut offset = 0;
            for &i in &b.members {
                let p = &self.params[i];
                let n = p.numel();
                p.assign(all.narrow(0, offset, n).reshape(p.shape().to_vec()))?;
                offset += n;
            }
        }
        Ok(())
    }

    /// Elements `start .. start + b.shard` of bucket `b`'s parameters end
    /// to end (zeros past their end): slices of the parameters that
    /// overlap it, so nothing but the shard is copied.
    fn shard_of_parameters(&self, b: &Bucket, start: usize) -> Tensor {
        let end = start + b.shard;
        let mut pieces: Vec<Tensor> = Vec::new();
        let mut offset = 0;
        for &i in &b.members {
            let p = &self.params[i];
            let n = p.numel();
            let (from, to) = (start.max(offset), end.min(offset + n));
            if from < to {
                pieces.push(p.tensor().flatten().narrow(0, from - offset, to - from));
            }
            offset += n;
        }
        let past = end - start.max(b.len).min(end);
        if past > 0 {
            pieces.push(self.ctx.zeros_dtype([past], b.dtype));
        }
        Tensor::cat(&pieces.iter().collect::<Vec<_>>(), 0)
    }
}

/// The parameters' indices in buckets: last parameters first, a new
/// bucket at each dtype change and once a bucket holds `bucket_bytes`.
fn bucket_members(params: &[Variable], bucket_bytes: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for i in (0..params.len()).rev() {
        let p = &params[i];
        let fits =
            buckets.last().is_some_and(|b| params[b[0]].dtype() == p.dtype() && bytes < bucket_bytes.max(1));
        if !fits {
            buckets.push(Vec::new());
            bytes = 0;
        }
        bytes += p.numel() * p.dtype().size();
        if let Some(b) = buckets.last_mut() {
            b.push(i);
        }
    }
    buckets
}

impl Optimizer for ShardedOptimizer {
    #[track_caller]
    fn step(&mut self) -> Result<()> {
        self.step_at(Location::caller())
    }

    #[track_caller]
    fn zero_grad(&self) -> Result<()> {
        crate::nn::zero_grad(&self.params)
    }

    fn lr(&self) -> f64 {
        self.rule.lr().get()
    }

    #[track_caller]
    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_lr(lr, "set_lr", Location::caller())?;
        self.rule.lr().set(lr);
        Ok(())
    }

    /// This rank's: the moments of its shard of every bucket, and the
    /// step count.
    fn state_bytes(&self) -> Option<usize> {
        let moments: usize = self.buckets.iter().map(|b| 2 * b.shard * b.dtype.size()).sum();
        Some(moments + DType::I64.size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_go_last_parameter_first_and_split_at_dtype_and_size() {
        let ctx = Context::cpu();
        let v = |name: &str, n: usize, d: DType| ctx.variable(name, ctx.zeros_dtype([n], d)).unwrap();
        let params = vec![
            v("a", 4, DType::F32),
            v("b", 4, DType::F32),
            v("c", 2, DType::F64),
            v("d", 100, DType::F32),
        ];
        assert_eq!(bucket_members(&params, 20), vec![vec![3], vec![2], vec![1, 0]]);
        assert_eq!(bucket_members(&params, 1 << 20), vec![vec![3], vec![2], vec![1, 0]]);
        assert_eq!(bucket_members(&params, 1), vec![vec![3], vec![2], vec![1], vec![0]]);
    }
}
