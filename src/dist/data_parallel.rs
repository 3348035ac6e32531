//! Data-parallel training: one replica of a model per rank, each step one
//! captured plan per device (forward, backward, bucketed all-reduce of the
//! gradients, optimizer update).
//!
//! The gradients are averaged by [`AverageGradients`], an optimizer that
//! wraps the user's: its step records, per bucket of gradients (last
//! parameters first, as backward produces them), `cat` of the flattened
//! gradients, one `all_reduce_mean`, and slices back, then the inner
//! optimizer's update reads the averages. Because it is all one graph, the
//! schedule pass issues each bucket's all-reduce as soon as its gradients
//! exist and the stream pass puts it on the collectives' stream, so it
//! runs while the earlier layers are still differentiated (PyTorch DDP
//! gets this from autograd hooks; here the compiler sees it).
//! [`DataParallel::with_reduce_dtype`] casts each bucket's pieces to a
//! narrower float before the all-reduce and back after (bf16 halves the
//! bytes of f32 gradients, as PyTorch's `bf16_compress_hook`).
//!
//! Ownership: each rank's replica (its [`TrainStep`]) lives on a thread
//! of its own for the [`DataParallel`]'s life (`rank_threads.rs`: started
//! by the constructor, joined by the drop), so a rank that blocks in a
//! collective never blocks another's recording or launching, and a step
//! costs a message per rank, not a thread's start. A step waits for
//! every rank's reply; a rank whose step panics returns an error naming
//! it. The batch's shards are handed to the ranks as tensor handles.

use super::rank_threads::{RankThreads, Task};
use super::Group;
use crate::ir::DType;
use crate::nn::Params;
use crate::optim::{Optimizer, TrainStep};
use crate::{Context, Error, Location, Result, Tensor, Variable};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// An optimizer that first averages every held gradient over the
/// context's process group, in buckets of about `bucket_bytes`, then
/// steps `inner`. See the [module docs](self).
pub struct AverageGradients<O> {
    inner: O,
    ctx: Context,
    params: Vec<Variable>,
    /// Shared with the [`DataParallel`] that owns this optimizer, which
    /// sets them from the caller's thread.
    settings: Arc<Averaging>,
}

/// How [`AverageGradients`] averages: read at each step, set by
/// [`DataParallel::with_bucket_bytes`] and
/// [`DataParallel::with_reduce_dtype`].
struct Averaging {
    bucket_bytes: AtomicUsize,
    /// The dtype float gradients travel in when it is narrower than theirs.
    reduce_dtype: Mutex<Option<DType>>,
}

impl<O: Optimizer> AverageGradients<O> {
    /// Averages the gradients of `params` (on `ctx`, a rank of a group)
    /// before `inner` steps.
    pub fn new(ctx: &Context, params: &impl Params, inner: O, bucket_bytes: usize) -> AverageGradients<O> {
        AverageGradients {
            inner,
            ctx: ctx.clone(),
            params: params.parameters(),
            settings: Arc::new(Averaging {
                bucket_bytes: AtomicUsize::new(bucket_bytes.max(1)),
                reduce_dtype: Mutex::new(None),
            }),
        }
    }

    /// The wrapped optimizer.
    pub fn inner(&mut self) -> &mut O {
        &mut self.inner
    }

    fn average(&self, location: Location) -> Result<()> {
        let held: Vec<(Variable, Tensor)> =
            self.params.iter().rev().filter_map(|p| self.ctx.grad(p).map(|g| (p.clone(), g))).collect();
        let bucket_bytes = self.settings.bucket_bytes.load(Ordering::Relaxed);
        let wire = self.settings.reduce_dtype.lock().map(|d| *d).unwrap_or(None);
        // The dtype a gradient of `dtype` travels in, if narrower.
        let narrow = |dtype: DType| wire.filter(|w| dtype.is_float() && w.size() < dtype.size());
        let send = |g: &Tensor| match narrow(g.dtype()) {
            Some(w) => g.cast(w),
            None => g.clone(),
        };
        let mut start = 0;
        while start < held.len() {
            let dtype = held[start].1.dtype();
            let mut end = start;
            let mut bytes = 0;
            while end < held.len() && held[end].1.dtype() == dtype && (end == start || bytes < bucket_bytes) {
                bytes += held[end].1.shape().iter().product::<usize>() * dtype.size();
                end += 1;
            }
            let bucket = &held[start..end];
            let receive = |t: Tensor| if narrow(dtype).is_some() { t.cast(dtype) } else { t };
            if let [(var, g)] = bucket {
                self.ctx.replace_grad(var, &receive(send(g).all_reduce_mean()), location)?;
            } else {
                let flat: Vec<Tensor> = bucket.iter().map(|(_, g)| send(&g.flatten())).collect();
                let mean = Tensor::cat(&flat.iter().collect::<Vec<_>>(), 0).all_reduce_mean();
                let mut offset = 0;
                for (var, g) in bucket {
                    let n: usize = g.shape().iter().product();
                    let back = receive(mean.narrow(0, offset, n).reshape(g.shape().to_vec()));
                    self.ctx.replace_grad(var, &back, location)?;
                    offset += n;
                }
            }
            start = end;
        }
        Ok(())
    }
}

impl<O: Optimizer> Optimizer for AverageGradients<O> {
    #[track_caller]
    fn step(&mut self) -> Result<()> {
        self.average(Location::caller())?;
        self.inner.step()
    }

    fn zero_grad(&self) -> Result<()> {
        self.inner.zero_grad()
    }

    fn lr(&self) -> f64 {
        self.inner.lr()
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.inner.set_lr(lr)
    }

    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.inner.backward(loss)
    }

    fn state_bytes(&self) -> Option<usize> {
        self.inner.state_bytes()
    }
}

type LossFn = Box<dyn FnMut(&[Tensor]) -> Result<Tensor> + Send>;

/// How a replica's gradients meet the other ranks'.
enum Synced<O> {
    /// All-reduced, then the user's optimizer steps
    /// ([`DataParallel::new`]).
    Averaged(AverageGradients<O>),
    /// The optimizer exchanges them itself ([`DataParallel::sharded`]:
    /// a [`super::ShardedOptimizer`] reduce-scatters them).
    Own(O),
}

impl<O: Optimizer> Synced<O> {
    fn get(&self) -> &dyn Optimizer {
        match self {
            Synced::Averaged(o) => o,
            Synced::Own(o) => o,
        }
    }

    fn get_mut(&mut self) -> &mut dyn Optimizer {
        match self {
            Synced::Averaged(o) => o,
            Synced::Own(o) => o,
        }
    }
}

impl<O: Optimizer> Optimizer for Synced<O> {
    #[track_caller]
    fn step(&mut self) -> Result<()> {
        match self {
            Synced::Averaged(o) => o.step(),
            Synced::Own(o) => o.step(),
        }
    }

    fn zero_grad(&self) -> Result<()> {
        self.get().zero_grad()
    }

    fn lr(&self) -> f64 {
        self.get().lr()
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.get_mut().set_lr(lr)
    }

    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        self.get_mut().backward(loss)
    }

    fn state_bytes(&self) -> Option<usize> {
        self.get().state_bytes()
    }
}

/// One rank's replica, owned by its rank thread.
type Replica<O> = TrainStep<Synced<O>, LossFn>;

/// A model trained on several devices at once: one replica per rank,
/// built by the same constructor, started from rank 0's parameters, each
/// step splitting the batch and averaging the gradients.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::dist::DataParallel;
/// use kiln::nn::{self, Linear, Module};
/// use kiln::optim::{Sgd, SgdConfig};
///
/// let ranks = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
/// let mut dp = DataParallel::new(&ranks, |ctx| {
///     let model = Linear::new(ctx, "fc", 3, 1)?;
///     let opt = Sgd::new(&model, SgdConfig { lr: 0.1, ..SgdConfig::default() })?;
///     Ok((model, opt))
/// }, |model, batch| nn::mse(&model.forward(&batch[0])?, &batch[1]))?;
/// let host = Context::cpu();
/// let (x, y) = (host.randn([8, 3]), host.randn([8, 1]));
/// let first = dp.step(&[&x, &y])?[0].item::<f32>()?;
/// for _ in 0..20 {
///     dp.step(&[&x, &y])?;
/// }
/// assert!(dp.step(&[&x, &y])?[0].item::<f32>()? < first);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct DataParallel<O> {
    group: Group,
    replicas: RankThreads<Replica<O>>,
    /// Each replica's averaging settings (its optimizer's).
    settings: Vec<Arc<Averaging>>,
    params: Vec<Vec<Variable>>,
}

impl<O: Optimizer + Send + 'static> DataParallel<O> {
    /// Makes `contexts` a [`Group`], builds a replica (model and optimizer)
    /// on each with `build`, and copies rank 0's parameters to every rank
    /// (a broadcast), so replicas start equal whatever their seeds. `loss`
    /// computes a replica's loss from its shard of a batch. Gradients are
    /// averaged in buckets of 4 MiB ([`DataParallel::with_bucket_bytes`]).
    #[track_caller]
    pub fn new<M, B, L>(contexts: &[Context], build: B, loss: L) -> Result<DataParallel<O>>
    where
        M: crate::nn::Module + 'static,
        B: Fn(&Context) -> Result<(M, O)>,
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    {
        DataParallel::with_group(&Group::new(contexts)?, build, loss)
    }

    /// [`DataParallel::new`] on a group already formed: a replica on each
    /// of this process's ranks ([`Group::contexts`]). Across processes
    /// ([`Group::from_env`]) that is one replica per process, and every
    /// process runs the same program: the broadcast and the gradients'
    /// averages meet across them.
    pub fn with_group<M, B, L>(group: &Group, build: B, loss: L) -> Result<DataParallel<O>>
    where
        M: crate::nn::Module + 'static,
        B: Fn(&Context) -> Result<(M, O)>,
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    {
        DataParallel::start(group, build, loss, true)
    }

    /// The replicas on `group`'s ranks of this process; their optimizers
    /// wrapped in [`AverageGradients`] if `average`, else stepping alone.
    fn start<M, B, L>(group: &Group, build: B, loss: L, average: bool) -> Result<DataParallel<O>>
    where
        M: crate::nn::Module + 'static,
        B: Fn(&Context) -> Result<(M, O)>,
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    {
        let group = group.clone();
        let loss = Arc::new(loss);
        let mut replicas = Vec::new();
        let mut settings = Vec::new();
        let mut params = Vec::new();
        for ctx in group.contexts() {
            let (model, opt) = build(ctx)?;
            let opt = if average {
                let opt = AverageGradients::new(ctx, &model, opt, 4 << 20);
                settings.push(opt.settings.clone());
                Synced::Averaged(opt)
            } else {
                Synced::Own(opt)
            };
            params.push(model.parameters());
            let loss = loss.clone();
            let f: LossFn = Box::new(move |batch: &[Tensor]| loss(&model, batch));
            replicas.push(TrainStep::new(ctx, opt, f));
        }
        let replicas = RankThreads::start(replicas, group.ranks().start)?;
        let dp = DataParallel { group, replicas, settings, params };
        dp.broadcast_parameters()?;
        Ok(dp)
    }

    /// Averages gradients in buckets of about `bytes` (at least one
    /// gradient each): smaller buckets start all-reducing sooner, larger
    /// ones make fewer calls. A [`DataParallel::sharded`]'s buckets are
    /// its optimizer's ([`super::ShardedOptimizer::new`]); this changes
    /// nothing there.
    pub fn with_bucket_bytes(self, bytes: usize) -> DataParallel<O> {
        for s in &self.settings {
            s.bucket_bytes.store(bytes.max(1), Ordering::Relaxed);
        }
        self
    }

    /// Averages each float gradient in `dtype` where that is narrower than
    /// the gradient's own: cast before its bucket's all-reduce, and back
    /// after (PyTorch DDP's `bf16_compress_hook`). With f32 gradients and
    /// `DType::BF16` the all-reduces move half the bytes, and the average
    /// has bf16's precision (about 3 significant digits) before the
    /// optimizer reads it. Off by default; the sharded optimizer's
    /// reduce-scatters are unchanged.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// # use kiln::dist::DataParallel;
    /// # use kiln::nn::{Linear, Module};
    /// # use kiln::optim::{Sgd, SgdConfig};
    /// let ranks = [Context::cpu(), Context::cpu()];
    /// let build = |ctx: &Context| -> Result<(Linear, Sgd)> {
    ///     let model = Linear::new(ctx, "fc", 4, 2)?;
    ///     let opt = Sgd::new(&model, SgdConfig { lr: 0.1, ..Default::default() })?;
    ///     Ok((model, opt))
    /// };
    /// let loss = |m: &Linear, b: &[Tensor]| {
    ///     let y = m.forward(&b[0])?;
    ///     Ok((&y * &y).sum_all())
    /// };
    /// let mut dp = DataParallel::new(&ranks, build, loss)?.with_reduce_dtype(DType::BF16)?;
    /// let x = Context::cpu().tensor(&[0.5f32; 16], [4, 4]);
    /// dp.step(&[&x])?;
    /// // Gradients are averaged in a float dtype (fresh contexts: a context
    /// // belongs to one group).
    /// let others = [Context::cpu(), Context::cpu()];
    /// assert!(DataParallel::new(&others, build, loss)?.with_reduce_dtype(DType::I32).is_err());
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn with_reduce_dtype(self, dtype: DType) -> Result<DataParallel<O>> {
        if !dtype.is_float() {
            return Err(Error::Shape {
                op: "with_reduce_dtype",
                message: format!("gradients are averaged in a float dtype, got {dtype}"),
                location: Location::caller(),
            });
        }
        for s in &self.settings {
            *s.reduce_dtype
                .lock()
                .map_err(|_| Error::Backend("data parallel: a rank thread panicked".into()))? = Some(dtype);
        }
        Ok(self)
    }

    /// Every rank takes rank 0's parameters, each on its rank thread (the
    /// broadcasts meet across ranks).
    fn broadcast_parameters(&self) -> Result<()> {
        let params = &self.params;
        let contexts = self.group.contexts();
        self.replicas.run(|k| {
            let (ps, ctx) = (params[k].clone(), contexts[k].clone());
            let task: Task<Replica<O>, ()> = Box::new(move |_| {
                for p in &ps {
                    p.assign(p.tensor().broadcast_from(0))?;
                }
                let ts: Vec<Tensor> = ps.iter().map(Variable::tensor).collect();
                ctx.realize(&ts.iter().collect::<Vec<_>>())
            });
            task
        })?;
        Ok(())
    }

    /// One step on `batch`: every tensor is split along dim 0 into equal
    /// shards, one per rank of the group (the batch must divide by the
    /// group's size), shard `k` is copied to rank `k`, and every rank of
    /// this process steps. Across processes every process passes the
    /// same whole batch and trains on its rank's shard. Returns this
    /// process's ranks' losses (each of its shard; computed without
    /// waiting).
    #[track_caller]
    pub fn step(&mut self, batch: &[&Tensor]) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let n = self.group.size();
        let ranks = self.group.ranks();
        let mut shards: Vec<Vec<Tensor>> = vec![Vec::new(); ranks.len()];
        for (i, t) in batch.iter().enumerate() {
            let rows = t.shape().first().copied().unwrap_or(0);
            if rows == 0 || rows % n != 0 {
                return Err(Error::Argument {
                    op: "DataParallel::step",
                    message: format!(
                        "batch tensor {i} has {rows} rows along dim 0, which does not split into {n} equal shards"
                    ),
                    location,
                });
            }
            for ((k, shard), ctx) in ranks.clone().zip(shards.iter_mut()).zip(self.group.contexts()) {
                shard.push(t.narrow(0, k * rows / n, rows / n).to(ctx));
            }
        }
        self.step_shards(&shards)
    }

    /// One step where this process's `k`-th rank trains on `shards[k]`
    /// (tensors on its own context, e.g. from a loader per rank). Returns
    /// each of those ranks' losses.
    #[track_caller]
    pub fn step_shards(&mut self, shards: &[Vec<Tensor>]) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let here = self.group.contexts().len();
        if shards.len() != here {
            return Err(Error::Argument {
                op: "DataParallel::step_shards",
                message: format!("{} shard(s) given for {here} rank(s) in this process", shards.len()),
                location,
            });
        }
        self.replicas.run(|k| {
            let shard = shards[k].clone();
            let task: Task<Replica<O>, Tensor> = Box::new(move |r| {
                let refs: Vec<&Tensor> = shard.iter().collect();
                r.call(&refs)
            });
            task
        })
    }

    /// The group the replicas are ranks of.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// Rank `rank`'s parameters, in the model's order (empty for a rank
    /// of another process).
    pub fn parameters(&self, rank: usize) -> &[Variable] {
        let k = rank.checked_sub(self.group.ranks().start);
        k.and_then(|k| self.params.get(k)).map_or(&[], Vec::as_slice)
    }

    /// Bytes of optimizer state of each of this process's ranks
    /// ([`Optimizer::state_bytes`]; `None` where the optimizer does not
    /// say): what a memory report compares between
    /// [`DataParallel::new`] and [`DataParallel::sharded`].
    pub fn optimizer_state_bytes(&self) -> Result<Vec<Option<usize>>> {
        self.replicas.run(|_| {
            let task: Task<Replica<O>, Option<usize>> = Box::new(move |r| Ok(r.optimizer().state_bytes()));
            task
        })
    }

    /// Sets every replica's learning rate.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        self.replicas.run(|_| {
            let task: Task<Replica<O>, ()> = Box::new(move |r| r.optimizer().set_lr(lr));
            task
        })?;
        Ok(())
    }
}

impl DataParallel<super::ShardedOptimizer> {
    /// ZeRO-1: [`DataParallel::new`] where each replica's optimizer is a
    /// [`super::ShardedOptimizer`] built by `build` (on the rank's context,
    /// already in the group): the gradients are reduce-scattered instead
    /// of all-reduced, each rank updates its shard of the parameters with
    /// its shard of the optimizer state, and the parameters are
    /// all-gathered. Same steps, same results (see
    /// [`super::ShardedOptimizer`]), `1/n` of the optimizer state per rank.
    #[track_caller]
    pub fn sharded<M, B, L>(contexts: &[Context], build: B, loss: L) -> Result<Self>
    where
        M: crate::nn::Module + 'static,
        B: Fn(&Context) -> Result<(M, super::ShardedOptimizer)>,
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    {
        DataParallel::start(&Group::new(contexts)?, build, loss, false)
    }

    /// [`DataParallel::sharded`] on a group already formed (across
    /// processes: [`Group::from_env`]), as [`DataParallel::with_group`].
    pub fn sharded_with_group<M, B, L>(group: &Group, build: B, loss: L) -> Result<Self>
    where
        M: crate::nn::Module + 'static,
        B: Fn(&Context) -> Result<(M, super::ShardedOptimizer)>,
        L: Fn(&M, &[Tensor]) -> Result<Tensor> + Send + Sync + 'static,
    {
        DataParallel::start(group, build, loss, false)
    }
}
