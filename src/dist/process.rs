//! One process per rank: torchrun's environment ([`ProcessEnv`]) and
//! [`Group::join`] / [`Group::from_env`], which make a process's context
//! one rank of a group of processes.
//!
//! Rank 0 serves the group's coordinator on `MASTER_ADDR:MASTER_PORT`
//! (`coordinator.rs`); every rank connects to it (`link.rs`). The
//! coordinator hands out rank 0's NCCL unique id to CUDA ranks, which then
//! move their data with NCCL; CPU ranks (and emulated CUDA ranks) send
//! their collectives' operands through it. Either way it carries the
//! group's health: a rank that dies breaks the group on every rank, naming
//! it, and CUDA ranks abort their communicators.
//!
//! Several hosts are the same code with another `MASTER_ADDR`: rank 0
//! listens on every interface unless `MASTER_ADDR` is a loopback address.

use super::coordinator::Coordinator;
use super::host::Rendezvous;
use super::link::{Hello, Link};
use super::{Group, Joining};
use crate::{Context, Error, Location, Result};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// Where this process stands in a group of processes: what `torchrun`
/// (or `kiln-run`) sets in every process's environment.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessEnv {
    /// `RANK`: this process's rank, `0..world_size`.
    pub rank: usize,
    /// `WORLD_SIZE`: processes in the group.
    pub world_size: usize,
    /// `LOCAL_RANK`: this process's rank on its host, the CUDA device to
    /// open (`Context::cuda(env.local_rank)`); `RANK` where it is unset.
    pub local_rank: usize,
    /// `MASTER_ADDR`: rank 0's host (a name or an address).
    pub master_addr: String,
    /// `MASTER_PORT`: where rank 0 serves the group's coordinator.
    pub master_port: u16,
    /// `KILN_DIST_TIMEOUT` (seconds, 60 when unset): how long forming the
    /// group and each collective wait for the other ranks.
    pub timeout: Duration,
}

impl ProcessEnv {
    /// Reads this process's environment (see the fields). A missing or
    /// malformed variable is an [`Error::Argument`] naming it.
    #[track_caller]
    pub fn from_env() -> Result<ProcessEnv> {
        let location = Location::caller();
        ProcessEnv::parse(|name| std::env::var(name).ok(), location)
    }

    /// [`ProcessEnv::from_env`] over variables that `var` looks up (for a
    /// launcher, or a test).
    #[track_caller]
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<ProcessEnv> {
        ProcessEnv::parse(var, Location::caller())
    }

    fn parse(var: impl Fn(&str) -> Option<String>, location: Location) -> Result<ProcessEnv> {
        let fail = |message: String| Error::Argument { op: "ProcessEnv::from_env", message, location };
        let get = |name: &str| {
            var(name).ok_or_else(|| {
                fail(format!(
                    "{name} is not set; a process of a group needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun's environment, which kiln-run sets)"
                ))
            })
        };
        let number = |name: &str, text: &str| {
            text.trim().parse::<usize>().map_err(|_| fail(format!("{name}={text:?} is not a whole number")))
        };
        let rank = number("RANK", &get("RANK")?)?;
        let world_size = number("WORLD_SIZE", &get("WORLD_SIZE")?)?;
        if world_size == 0 {
            return Err(fail("WORLD_SIZE=0: a group needs at least one process".into()));
        }
        if rank >= world_size {
            return Err(fail(format!(
                "RANK={rank} but WORLD_SIZE={world_size}: ranks run from 0 to {}",
                world_size - 1
            )));
        }
        let local_rank = match var("LOCAL_RANK") {
            Some(t) => number("LOCAL_RANK", &t)?,
            None => rank,
        };
        let master_addr = get("MASTER_ADDR")?.trim().to_string();
        if master_addr.is_empty() {
            return Err(fail("MASTER_ADDR is empty; it names rank 0's host".into()));
        }
        let port = get("MASTER_PORT")?;
        let master_port = match port.trim().parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(fail(format!("MASTER_PORT={port:?} is not a port (1 to 65535)"))),
        };
        let timeout = match var("KILN_DIST_TIMEOUT") {
            None => Duration::from_secs(60),
            Some(t) => match t.trim().parse::<f64>() {
                Ok(s) if s > 0.0 && s.is_finite() && s < 1e9 => Duration::from_secs_f64(s),
                _ => return Err(fail(format!("KILN_DIST_TIMEOUT={t:?} is not a number of seconds above 0"))),
            },
        };
        Ok(ProcessEnv { rank, world_size, local_rank, master_addr, master_port, timeout })
    }

    /// `MASTER_ADDR:MASTER_PORT` (IPv6 addresses in brackets).
    pub fn master(&self) -> String {
        match self.master_addr.parse::<std::net::Ipv6Addr>() {
            Ok(v6) => format!("[{v6}]:{}", self.master_port),
            Err(_) => format!("{}:{}", self.master_addr, self.master_port),
        }
    }
}

impl Group {
    /// This process's context as rank `RANK` of a group of `WORLD_SIZE`
    /// processes, from torchrun's environment ([`ProcessEnv::from_env`]).
    /// See [`Group::join`].
    #[track_caller]
    pub fn from_env(ctx: &Context) -> Result<Group> {
        let location = Location::caller();
        let env = ProcessEnv::parse(|name| std::env::var(name).ok(), location)?;
        join(ctx, &env, location)
    }

    /// Makes `ctx` rank `env.rank` of a group of `env.world_size`
    /// processes; returns once every rank joined (at most `env.timeout`).
    /// Rank 0 serves the group at `MASTER_ADDR:MASTER_PORT`; every rank
    /// must use one kind of device, CUDA ranks each a device of its own.
    /// The group's [`contexts`](Group::contexts) are `[ctx]`, its
    /// [`size`](Group::size) the world size; collectives and
    /// [`DataParallel`](super::DataParallel) work as in one process.
    ///
    /// A rank leaves when its context's last handle is dropped; rank 0
    /// then waits (at most the timeout) for the others to leave. A rank
    /// that dies or is killed breaks the group: every other rank's
    /// collectives fail, naming it.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::dist::{Group, ProcessEnv};
    ///
    /// // Under `kiln-run -n 2 prog` (or torchrun) this is
    /// // `Group::from_env(&ctx)`; here, a group of one process.
    /// let port = free_port().to_string();
    /// let env = ProcessEnv::from_vars(|name| match name {
    ///     "RANK" => Some("0".into()),
    ///     "WORLD_SIZE" => Some("1".into()),
    ///     "MASTER_ADDR" => Some("127.0.0.1".into()),
    ///     "MASTER_PORT" => Some(port.clone()),
    ///     _ => None,
    /// })?;
    /// let ctx = Context::cpu();
    /// let group = Group::join(&ctx, &env)?;
    /// assert_eq!((ctx.rank(), group.size()), (Some(0), 1));
    /// let sum = ctx.full([2], 3.0f32).all_reduce_sum().to_vec::<f32>()?;
    /// assert_eq!(sum, vec![3.0, 3.0]);
    /// # fn free_port() -> u16 {
    /// #     std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    /// # }
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[track_caller]
    pub fn join(ctx: &Context, env: &ProcessEnv) -> Result<Group> {
        join(ctx, env, Location::caller())
    }
}

fn join(ctx: &Context, env: &ProcessEnv, location: Location) -> Result<Group> {
    let _span =
        tracing::info_span!("join", rank = env.rank, size = env.world_size, master = %env.master()).entered();
    let fail = |message: String| Error::Device { message, location };
    let (rank, size) = (env.rank, env.world_size);
    if size == 0 || rank >= size {
        return Err(fail(format!(
            "rank {rank} of a group of {size}: ranks run from 0 to {}",
            size.max(1) - 1
        )));
    }
    if let Some(m) = ctx.member() {
        return Err(fail(format!("{} is already rank {} of a group of {}", ctx.label(), m.rank, m.size)));
    }
    let kind = ctx.device().to_string();
    let device = ctx.label().split(' ').next().unwrap_or("?").to_string();
    let payload =
        if rank == 0 && kind == "cuda" { super::nccl_unique_id().map_err(fail)?.to_vec() } else { vec![] };
    let master = env.master();
    let coordinator = if rank == 0 {
        let listener = bind(env).map_err(|e| {
            fail(format!(
                "rank 0 could not serve the group on port {} ({e}); is another group or program using it? Pick another MASTER_PORT",
                env.master_port
            ))
        })?;
        Some(
            Coordinator::serve(listener, size, env.timeout)
                .map_err(|e| fail(format!("serving the group: {e}")))?,
        )
    } else {
        None
    };
    let hello = Hello { rank, size, kind: kind.clone(), device, payload };
    let (link, payload) = Link::connect(&master, hello, env.timeout, coordinator).map_err(fail)?;
    let host = Arc::new(Rendezvous::with_link(size, env.timeout, Some(link)));
    if let Some(link) = host.link() {
        link.start(Arc::downgrade(&host))?;
    }
    let nccl_id = if kind == "cuda" {
        let id: [u8; 128] = payload.as_slice().try_into().map_err(|_| {
            fail(format!("rank 0 handed out an NCCL id of {} bytes (128 expected)", payload.len()))
        })?;
        Some(id)
    } else {
        None
    };
    let joining = Joining { rank, size, host: host.clone(), nccl_id };
    join_watched(ctx, joining, &host, env.timeout)
        .map_err(|e| fail(format!("rank {rank} ({}) could not join: {e}", ctx.label())))?;
    tracing::info!(rank, size, master = %master, "joined a group of processes");
    Ok(Group { contexts: vec![ctx.clone()], first: rank, size })
}

/// A rank's join by its backend, watched: a CUDA rank's is NCCL's set-up
/// of its communicator (`ncclCommInitRank`), which waits for every rank
/// and has no timeout, so it runs on a thread of its own while this one
/// watches the group (every kind of rank goes this way; a CPU rank's join
/// returns at once). A rank
/// that dies in that window (the coordinator breaks the group) or never
/// comes (the timeout) is this rank's error instead of a hang; the thread
/// stuck in NCCL is left behind (no communicator exists yet to abort).
fn join_watched(ctx: &Context, joining: Joining, host: &Rendezvous, timeout: Duration) -> Result<()> {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let rank = joining.rank;
    let (tx, rx) = channel();
    let c = ctx.clone();
    std::thread::Builder::new()
        .name("kiln-nccl-init".into())
        .spawn(move || {
            let _ = tx.send(c.inner.backend.join_group(joining));
        })
        .map_err(|e| Error::Runtime(format!("starting the NCCL set-up's thread: {e}")))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(joined) => return joined,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Error::Backend("dist: the NCCL set-up's thread ended without an answer".into()))
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
        if let Some(why) = host.broken() {
            return Err(Error::Runtime(format!(
                "the group broke while NCCL set up this rank's communicator: {why}"
            )));
        }
        if std::time::Instant::now() >= deadline {
            let why = format!(
                "rank {rank} waited {timeout:?} for NCCL to set up its communicator; some rank never did"
            );
            host.break_group(why.clone());
            return Err(Error::Runtime(why));
        }
    }
}

/// Rank 0's listening socket: `MASTER_ADDR` itself where it is a loopback
/// address (nothing else can reach the group then), else every interface.
fn bind(env: &ProcessEnv) -> std::io::Result<TcpListener> {
    let port = env.master_port;
    let loopback = (env.master_addr.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.ip().is_loopback()));
    let addr = loopback.unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)));
    TcpListener::bind(addr)
}
