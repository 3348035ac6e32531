//! Several devices: process groups, collectives as graph ops, and
//! data-parallel training ([`DataParallel`], and ZeRO-1's sharded
//! optimizer state: [`DataParallel::sharded`], [`ShardedOptimizer`]).
//!
//! A [`Group`] makes contexts the ranks `0..n` of one process group. A
//! collective ([`Tensor::all_reduce_sum`], [`Tensor::all_reduce_mean`],
//! [`Tensor::broadcast_from`], [`Tensor::reduce_scatter_sum`],
//! [`Tensor::reduce_scatter_mean`], [`Tensor::all_gather`]) records an
//! [`Op::Collective`] node like any
//! other op, numbered in recording order (its `seq`). Passes see it as an
//! effect: whatever a rank's constants make of the rest of its graph, no
//! pass merges, drops, folds, fuses or reorders a collective, and the pass
//! manager checks after every pass that the graph still runs the recorded
//! collectives in recorded order (`passes/effects.rs`). The stream pass
//! puts every collective on a stream of its own so it overlaps the compute
//! after it, and each backend lowers it: NCCL on CUDA (one communicator
//! per device, the call enqueued on the planned stream and captured into
//! the CUDA graph with the rest of the plan), an in-process
//! [`Rendezvous`](host) on the CPU and the CUDA emulator, so the API and
//! its tests run in CI.
//!
//! ```
//! use kiln::prelude::*;
//! use kiln::dist::Group;
//!
//! let ranks = [Context::cpu(), Context::cpu()];
//! let group = Group::new(&ranks)?;
//! let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let handles: Vec<_> = group.contexts().iter().enumerate().map(|(r, ctx)| {
//!         s.spawn(move || ctx.full([3], r as f32 + 1.0).all_reduce_sum().to_vec::<f32>())
//!     }).collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_>>()
//! })?;
//! assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! # Ownership and waiting
//! - Every rank runs its own plans on its own thread. A collective blocks
//!   its rank's run (on the CPU) or orders its rank's streams (on CUDA)
//!   until every rank has reached it: the k-th collective of each rank
//!   meets the k-th of every other, so ranks must run the same programs.
//!   Two ranks driven from one thread one after the other never meet: the
//!   CPU transport gives up after [`Group::with_timeout`] (60 s by
//!   default) and the group is broken from then on (every later
//!   collective fails at once, naming the first failure). NCCL has no
//!   timeout; a CUDA rank's waits on runs with collectives have a
//!   watchdog of the same length, which breaks the group and aborts every
//!   rank's communicator (`ncclCommAbort`). Ranks must still run
//!   concurrently, which is why [`DataParallel`] runs one thread per rank.
//! - A rank whose run fails before it issued its collectives (a bad index
//!   feeding an all-reduce on the CPU), or a CUDA rank whose run with
//!   collectives fails at all, breaks the group at once: every rank's
//!   pending and later collectives fail with a message naming that rank
//!   and its error, instead of waiting for a partner that never comes.
//! - A rank's operand is copied into the exchange (CPU) or read in place by
//!   NCCL while its run is in flight; the run owns both buffers (the
//!   plan's arena) until it completes, as any other step's operands.
//! - Dropping a [`Group`] does not leave it: the contexts stay ranks until
//!   they are dropped (their plans hold the communicator).
//!
//! # Several processes, several hosts
//! A group's ranks may also be processes, one per device, as `torchrun`
//! starts them: each process reads its rank from the environment
//! ([`ProcessEnv`]: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`) and joins its one context with [`Group::from_env`] (or
//! [`Group::join`]). Rank 0 serves a small TCP coordinator at
//! `MASTER_ADDR:MASTER_PORT` that forms the group, hands out the NCCL
//! unique id, carries the CPU ranks' collectives (combined as in one
//! process, so the same bits) and the group's health: a rank that dies
//! breaks the group on every other rank with an error naming it (CUDA
//! ranks abort their communicators), and a collective waits at most the
//! group's timeout. `kiln-run -n N prog args` starts N processes with
//! that environment; another host is another `MASTER_ADDR`. Collectives,
//! plans, lowering and [`DataParallel`] do not change.
//!
//! ```no_run
//! // two.rs, run as `kiln-run -n 2 target/release/examples/two`
//! use kiln::prelude::*;
//! use kiln::dist::Group;
//!
//! let ctx = Context::cpu();
//! let group = Group::from_env(&ctx)?;
//! let rank = ctx.rank().unwrap_or(0) as f32;
//! let sum = ctx.full([3], rank + 1.0).all_reduce_sum().to_vec::<f32>()?;
//! assert_eq!(sum, vec![3.0; 3]); // 1 + 2 on both processes
//! assert_eq!(group.size(), 2);
//! # Ok::<(), kiln::Error>(())
//! ```

mod combine;
mod coordinator;
mod data_parallel;
pub(crate) mod host;
mod link;
mod ops;
mod process;
mod rank_threads;
mod sharded;
mod wire;

pub use data_parallel::{AverageGradients, DataParallel};
pub use process::ProcessEnv;
pub use sharded::{ShardedOptimizer, ShardedRule};

use crate::{Context, Error, Location, Result};
use std::sync::Arc;
use std::time::Duration;

/// What a backend is handed to become rank `rank` of a group of `size`.
#[derive(Clone, Debug)]
pub struct Joining {
    /// This rank.
    pub rank: usize,
    /// Ranks in the group.
    pub size: usize,
    /// The in-process meeting place (CPU and emulated ranks).
    pub(crate) host: Arc<host::Rendezvous>,
    /// NCCL's unique id for the group (CUDA ranks).
    pub nccl_id: Option<[u8; 128]>,
}

impl Joining {
    /// Rank 0 of a group of one: every collective is the identity. For
    /// running a plan that has collectives on a bare backend by itself
    /// (the pass tests do).
    pub fn solo() -> Joining {
        Joining {
            rank: 0,
            size: 1,
            host: Arc::new(host::Rendezvous::new(1, Duration::from_secs(1))),
            nccl_id: None,
        }
    }
}

/// A device the process can open, as [`devices`] lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// What [`Context::cuda`] takes (`None` for the CPU).
    pub ordinal: Option<usize>,
    /// The device in words (`cpu`, `cuda:1 NVIDIA H200 (sm_90)`).
    pub description: String,
}

/// The devices kiln can open here: the CPU, then every CUDA device the
/// driver reports (none in a build without the `cuda` feature, or where
/// the driver or a library is missing; why is logged at info level).
///
/// ```
/// let devices = kiln::dist::devices();
/// assert_eq!(devices[0].description, "cpu");
/// ```
pub fn devices() -> Vec<DeviceInfo> {
    #[cfg_attr(not(feature = "cuda-backend"), allow(unused_mut))]
    let mut out = vec![DeviceInfo { ordinal: None, description: "cpu".into() }];
    #[cfg(feature = "cuda-backend")]
    match crate::backends::cuda::device_names() {
        Ok(names) => out.extend(
            names.into_iter().enumerate().map(|(k, d)| DeviceInfo { ordinal: Some(k), description: d }),
        ),
        Err(why) => tracing::info!(reason = %why, "no CUDA devices listed"),
    }
    out
}

/// Contexts joined as the ranks of one process group: in one process
/// ([`Group::new`]) every rank's context (rank `k` is `contexts()[k]`),
/// across processes ([`Group::join`]) this process's one. See the
/// [module docs](self).
#[derive(Clone)]
pub struct Group {
    contexts: Vec<Context>,
    /// The rank of `contexts[0]`.
    first: usize,
    /// Ranks in the group, in every process.
    size: usize,
}

impl Group {
    /// Makes `contexts` ranks `0..n` of a new group, in order. They must be
    /// distinct, on one kind of device (all CPU, all CUDA, or all
    /// emulated), and in no group yet; CUDA contexts must be on distinct
    /// devices (NCCL's rule). On CUDA this loads NCCL (`libnccl.so.2`,
    /// found through `LD_LIBRARY_PATH` or `KILN_NCCL_LIBRARY`); a missing
    /// library is an [`Error::Device`] naming the files looked for.
    #[track_caller]
    pub fn new(contexts: &[Context]) -> Result<Group> {
        Group::with_timeout(contexts, Duration::from_secs(60))
    }

    /// [`Group::new`] where a CPU rank waits at most `timeout` for the
    /// others in a collective before the group breaks.
    #[track_caller]
    pub fn with_timeout(contexts: &[Context], timeout: Duration) -> Result<Group> {
        let location = Location::caller();
        let fail = |message: String| Error::Device { message, location };
        if contexts.is_empty() {
            return Err(fail("a process group needs at least one context".into()));
        }
        for (i, a) in contexts.iter().enumerate() {
            if let Some(j) = contexts[..i].iter().position(|b| b.same(a)) {
                return Err(fail(format!(
                    "contexts {j} and {i} are the same context; a rank needs a context of its own"
                )));
            }
            if let Some(m) = a.member() {
                return Err(fail(format!(
                    "context {i} ({}) is already rank {} of a group of {}",
                    a.label(),
                    m.rank,
                    m.size
                )));
            }
        }
        let kinds: Vec<&str> = contexts.iter().map(|c| c.device()).collect();
        if kinds.iter().any(|k| *k != kinds[0]) {
            return Err(fail(format!(
                "a group's contexts must all be on one kind of device, got {}",
                contexts.iter().map(|c| c.label()).collect::<Vec<_>>().join(", ")
            )));
        }
        if kinds[0] == "cuda" {
            let devices: Vec<String> = contexts.iter().map(|c| c.label()).collect();
            if let Some(message) = shared_device(&devices) {
                return Err(fail(message));
            }
        }
        let nccl_id = if kinds[0] == "cuda" { Some(nccl_unique_id().map_err(fail)?) } else { None };
        let size = contexts.len();
        let host = Arc::new(host::Rendezvous::new(size, timeout));
        let joinings: Vec<Joining> =
            (0..size).map(|rank| Joining { rank, size, host: host.clone(), nccl_id }).collect();
        // Every rank joins on a thread of its own: NCCL's init of one rank
        // waits for all the others (as it would in separate processes).
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = contexts
                .iter()
                .zip(joinings)
                .map(|(ctx, j)| s.spawn(move || ctx.inner.backend.join_group(j)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(Error::Backend("dist: a rank panicked joining".into())))
                })
                .collect()
        });
        for (rank, r) in results.into_iter().enumerate() {
            r.map_err(|e| fail(format!("rank {rank} ({}) could not join: {e}", contexts[rank].label())))?;
        }
        Ok(Group { contexts: contexts.to_vec(), first: 0, size })
    }

    /// This process's ranks' contexts, in rank order: every rank's for a
    /// group of one process, this process's one for a group of processes.
    pub fn contexts(&self) -> &[Context] {
        &self.contexts
    }

    /// The ranks of [`Group::contexts`]: `0..size` in one process, this
    /// process's rank across processes.
    pub fn ranks(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.contexts.len()
    }

    /// Ranks in the group (in every process).
    pub fn size(&self) -> usize {
        self.size
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<String> = self.contexts.iter().map(Context::label).collect();
        f.debug_struct("Group")
            .field("size", &self.size)
            .field("ranks", &self.ranks())
            .field("contexts", &labels)
            .finish()
    }
}

/// The error for two ranks on one device, given the ranks' labels
/// (`cuda:1 (context 4)`, see `Context::label`): NCCL runs one rank per
/// device, and two ranks of one device would wait for each other in one
/// stream order forever.
fn shared_device(labels: &[String]) -> Option<String> {
    let device = |l: &String| l.split(' ').next().unwrap_or_default().to_string();
    for (i, a) in labels.iter().enumerate() {
        if let Some(j) = labels[..i].iter().position(|b| device(b) == device(a)) {
            return Some(format!(
                "contexts {j} ({}) and {i} ({a}) are on the same device; each rank of a CUDA group needs a device of its own (NCCL's rule): open rank k with Context::cuda(k)",
                labels[j]
            ));
        }
    }
    None
}

#[cfg(feature = "cuda-backend")]
fn nccl_unique_id() -> std::result::Result<[u8; 128], String> {
    crate::backends::cuda::nccl::unique_id()
}

#[cfg(not(feature = "cuda-backend"))]
fn nccl_unique_id() -> std::result::Result<[u8; 128], String> {
    Err("this build of kiln has no CUDA backend".into())
}

impl Context {
    /// This context's rank in its process group (`None` outside one).
    pub fn rank(&self) -> Option<usize> {
        self.member().map(|m| m.rank)
    }

    /// Ranks in this context's process group (`None` outside one).
    pub fn world_size(&self) -> Option<usize> {
        self.member().map(|m| m.size)
    }

    pub(crate) fn member(&self) -> Option<Joining> {
        self.inner.backend.member()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_cuda_ranks_on_one_device_are_refused_naming_both() {
        let labels: Vec<String> =
            ["cuda:0 (context 1)", "cuda:1 (context 2)", "cuda:0 (context 3)"].map(String::from).to_vec();
        assert_eq!(
            super::shared_device(&labels).unwrap(),
            "contexts 0 (cuda:0 (context 1)) and 2 (cuda:0 (context 3)) are on the same device; each rank of a CUDA group needs a device of its own (NCCL's rule): open rank k with Context::cuda(k)"
        );
        assert_eq!(super::shared_device(&labels[..2]), None);
    }
}
