//! The coordinator of a group of processes: rank 0 serves it on
//! `MASTER_ADDR:MASTER_PORT`, every rank (rank 0 too) connects to it.
//!
//! Forming the group: every rank says hello (its rank, the group's size,
//! its device, rank 0 also the NCCL unique id). The coordinator checks
//! that the ranks agree (one size, distinct ranks below it, one kind of
//! device, distinct CUDA devices on one host) and welcomes them all with
//! rank 0's payload, or refuses them all with what was wrong, naming the
//! ranks. A rank that is missing after the group's timeout fails the
//! forming the same way. Anything else that connects is dropped.
//!
//! Collectives (CPU ranks and emulated CUDA ranks; NCCL moves CUDA
//! ranks' data itself): the coordinator runs an in-process
//! [`Rendezvous`] of all the ranks. Each rank's connection has a reader
//! thread (frames in) and an exchanger thread that hands the rank's
//! operands to the rendezvous in the rank's order and writes the results
//! back. So matching, combining (in rank order: the same bits as in one
//! process), timeouts and breaking are `host.rs`'s, in one place.
//!
//! Health: a break anywhere (a rank's message, a mismatch, a timeout) is
//! sent to every rank. A connection that closes without a goodbye is a
//! rank that died (killed, crashed, or its host gone): the group breaks
//! at once, naming it. A rank that said goodbye has left: collectives
//! that still need it fail, naming it.
//!
//! Ownership: the threads hold the shared state (`Arc`); rank 0's link
//! owns the [`Coordinator`] and, leaving, [`Coordinator::finish`]es it:
//! it waits (at most the group's timeout) for the other ranks to leave,
//! so none loses a result still on its way, then closes every connection.

use super::host::Rendezvous;
use super::wire::{self, Msg};
use crate::ir::{Collective, HostData, Shape};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What rank 0 serves; see the module docs.
pub(crate) struct Coordinator {
    shared: Arc<Shared>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    rv: Arc<Rendezvous>,
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Connections of the formed group still open.
    open: Mutex<usize>,
    closed: Condvar,
}

/// One rank's connection.
struct Conn {
    rank: usize,
    /// How messages name the rank's process (`pid 4242 at 10.0.0.2`).
    who: String,
    send: Mutex<TcpStream>,
}

impl Conn {
    fn write(&self, msg: &Msg) {
        let mut s = self.send.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = wire::write(&mut *s, msg) {
            tracing::debug!(rank = self.rank, error = %e, "coordinator: writing to a rank");
        }
    }
}

/// A rank's hello, as the coordinator keeps it.
struct Hello {
    rank: usize,
    size: u64,
    kind: String,
    device: String,
    payload: Vec<u8>,
    who: String,
    host: std::net::IpAddr,
    stream: TcpStream,
}

/// A rank's operand on its way to the rendezvous, or its goodbye.
enum Work {
    Part { seq: u64, what: Collective, shape: Shape, data: HostData },
    Leave,
}

impl Coordinator {
    /// Starts serving a group of `size` on `listener` (on a thread of its
    /// own; rank 0 then connects to it like every rank).
    pub(crate) fn serve(
        listener: TcpListener,
        size: usize,
        timeout: Duration,
    ) -> std::io::Result<Coordinator> {
        let rv = Arc::new(Rendezvous::new(size, timeout));
        let shared = Arc::new(Shared {
            size,
            timeout,
            rv: rv.clone(),
            conns: Mutex::new(Vec::new()),
            open: Mutex::new(0),
            closed: Condvar::new(),
        });
        // Every break reaches every rank.
        let weak = Arc::downgrade(&shared);
        rv.on_break(Box::new(move || {
            if let Some(sh) = weak.upgrade() {
                let why = sh.rv.broken().unwrap_or_default();
                for c in sh.conns.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    c.write(&Msg::Break { why: why.clone() });
                }
            }
        }));
        listener.set_nonblocking(true)?;
        let sh = shared.clone();
        std::thread::Builder::new().name("kiln-coordinator".into()).spawn(move || form(&sh, listener))?;
        Ok(Coordinator { shared })
    }

    /// Rank 0 leaves: waits until every connection closed (at most the
    /// group's timeout), then breaks what is left and closes it all.
    pub(crate) fn finish(&self) {
        let sh = &self.shared;
        let deadline = Instant::now() + sh.timeout;
        let mut open = sh.open.lock().unwrap_or_else(|e| e.into_inner());
        while *open > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            open = sh.closed.wait_timeout(open, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        let left = *open;
        drop(open);
        if left > 0 {
            sh.rv.break_group(format!(
                "rank 0 left the group and its coordinator closed after waiting {:?} for {left} rank(s) to leave",
                sh.timeout
            ));
        }
        for c in sh.conns.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let s = c.send.lock().unwrap_or_else(|e| e.into_inner());
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Forms the group (see the module docs), then starts every rank's
/// threads. Runs on the coordinator's thread; returns when the group
/// formed or failed to.
fn form(sh: &Arc<Shared>, listener: TcpListener) {
    let deadline = Instant::now() + sh.timeout;
    let (tx, rx) = mpsc::channel::<(TcpStream, std::io::Result<Option<Msg>>)>();
    let mut hellos: Vec<Option<Hello>> = (0..sh.size).map(|_| None).collect();
    let mut refused: Option<String> = None;
    let refuse = |stream: &mut TcpStream, why: &str| {
        let _ = wire::write(stream, &Msg::Refused { why: why.to_string() });
    };
    loop {
        let now = Instant::now();
        let all_in = hellos.iter().all(Option::is_some);
        if (all_in && refused.is_none()) || now >= deadline {
            break;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let tx = tx.clone();
                let wait = deadline - now;
                // Each hello is read on a thread of its own, so a
                // connection that says nothing holds nobody up.
                let _ = std::thread::Builder::new().name("kiln-hello".into()).spawn(move || {
                    let mut stream = stream;
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(wait.max(Duration::from_millis(1))));
                    let msg = wire::read(&mut stream);
                    let _ = tx.send((stream, msg));
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!(error = %e, "coordinator: accepting a connection"),
        }
        let Ok((mut stream, msg)) = rx.recv_timeout(Duration::from_millis(5)) else { continue };
        let Ok(Some(Msg::Hello { rank, size, kind, device, pid, payload })) = msg else {
            tracing::warn!(peer = ?stream.peer_addr().ok(), "coordinator: dropped a connection that is not a kiln rank");
            continue;
        };
        let host = stream.peer_addr().map(|a| a.ip()).unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        let who = format!("pid {pid} at {host}");
        if let Some(why) = &refused {
            refuse(&mut stream, why);
            continue;
        }
        let rank = usize::try_from(rank).unwrap_or(usize::MAX);
        let hello = Hello { rank, size, kind, device, payload, who, host, stream };
        match check(&hellos, &hello, sh.size) {
            Ok(()) => {
                let slot = hello.rank;
                hellos[slot] = Some(hello);
            }
            Err(why) => {
                let mut hello = hello;
                refuse(&mut hello.stream, &why);
                for h in hellos.iter_mut().flatten() {
                    refuse(&mut h.stream, &why);
                }
                refused = Some(why);
            }
        }
    }
    drop(listener);
    if refused.is_some() {
        return;
    }
    let missing: Vec<usize> = (0..sh.size).filter(|&r| hellos[r].is_none()).collect();
    if !missing.is_empty() {
        let why = format!(
            "rank(s) {missing:?} did not join within {:?} (started with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE={}?)",
            sh.timeout, sh.size
        );
        for h in hellos.iter_mut().flatten() {
            refuse(&mut h.stream, &why);
        }
        return;
    }
    let hellos: Vec<Hello> = hellos.into_iter().flatten().collect();
    let payload = hellos[0].payload.clone();
    let mut started = Vec::new();
    for h in hellos {
        let Ok(send) = h.stream.try_clone() else {
            sh.rv.break_group(format!(
                "rank {} ({}): the coordinator could not use its connection",
                h.rank, h.who
            ));
            continue;
        };
        let _ = h.stream.set_read_timeout(None);
        let conn = Arc::new(Conn { rank: h.rank, who: h.who, send: Mutex::new(send) });
        sh.conns.lock().unwrap_or_else(|e| e.into_inner()).push(conn.clone());
        started.push((conn, h.stream));
    }
    *sh.open.lock().unwrap_or_else(|e| e.into_inner()) = started.len();
    for (conn, stream) in started {
        conn.write(&Msg::Welcome { payload: payload.clone() });
        let (tx, rx) = mpsc::channel::<Work>();
        let (sh1, c1, sh2, c2) = (sh.clone(), conn.clone(), sh.clone(), conn);
        let name = format!("kiln-coord-{}", c1.rank);
        let reader =
            std::thread::Builder::new().name(name.clone()).spawn(move || read_rank(&sh1, &c1, stream, tx));
        let exchanger = std::thread::Builder::new().name(name).spawn(move || exchange_rank(&sh2, &c2, rx));
        if reader.is_err() || exchanger.is_err() {
            sh.rv.break_group("the coordinator could not start a thread".into());
        }
    }
}

/// Whether `h` may join next to `hellos` (see the module docs).
fn check(hellos: &[Option<Hello>], h: &Hello, size: usize) -> Result<(), String> {
    let (rank, who) = (h.rank, &h.who);
    if h.size != size as u64 {
        return Err(format!(
            "rank {rank} ({who}) has WORLD_SIZE={} but rank 0 has WORLD_SIZE={size}",
            h.size
        ));
    }
    if rank >= size {
        return Err(format!(
            "rank {rank} ({who}) joined a group of {size}: ranks run from 0 to {}",
            size - 1
        ));
    }
    if let Some(other) = &hellos[rank] {
        return Err(format!("rank {rank} joined twice: {} and {who}", other.who));
    }
    for o in hellos.iter().flatten() {
        if o.kind != h.kind {
            return Err(format!(
                "a group's ranks must all be on one kind of device: rank {} ({}) is {} but rank {rank} ({who}) is {}",
                o.rank, o.who, o.device, h.device
            ));
        }
        if h.kind == "cuda" && o.host == h.host && o.device == h.device {
            return Err(format!(
                "ranks {} ({}) and {rank} ({who}) are both on {} of one host; each rank of a CUDA group needs a device of its own (NCCL's rule): open Context::cuda(local_rank)",
                o.rank, o.who, h.device
            ));
        }
    }
    Ok(())
}

/// Rank `conn.rank`'s frames, in (see the module docs).
fn read_rank(sh: &Shared, conn: &Conn, mut stream: TcpStream, work: mpsc::Sender<Work>) {
    let (rank, who) = (conn.rank, &conn.who);
    let mut expected = 0u64;
    let mut said_bye = false;
    loop {
        match wire::read(&mut stream) {
            Ok(Some(Msg::Part { seq, what, shape, data })) if seq == expected && !said_bye => {
                expected += 1;
                let _ = work.send(Work::Part { seq, what, shape, data });
            }
            Ok(Some(Msg::Break { why })) => sh.rv.break_group(why),
            Ok(Some(Msg::Bye)) => {
                said_bye = true;
                let _ = work.send(Work::Leave);
            }
            Ok(None) | Err(_) if said_bye => break,
            Ok(None) => {
                sh.rv.break_group(format!(
                    "rank {rank} ({who}) disconnected without leaving the group: its process died or was killed"
                ));
                break;
            }
            Err(e) => {
                sh.rv.break_group(format!("rank {rank} ({who}) lost its connection to the coordinator: {e}"));
                break;
            }
            Ok(Some(other)) => {
                sh.rv.break_group(format!(
                    "rank {rank} ({who}) broke the protocol: {} where its collective #{expected} or a goodbye was due",
                    describe(&other)
                ));
                break;
            }
        }
    }
    let mut open = sh.open.lock().unwrap_or_else(|e| e.into_inner());
    *open = open.saturating_sub(1);
    sh.closed.notify_all();
}

/// Hands rank `conn.rank`'s operands to the rendezvous, in its order,
/// and writes each result back.
fn exchange_rank(sh: &Shared, conn: &Conn, work: mpsc::Receiver<Work>) {
    for w in work {
        match w {
            Work::Part { seq, what, shape, data } => match sh.rv.exchange(conn.rank, what, &shape, data) {
                Ok(result) => {
                    let mut s = conn.send.lock().unwrap_or_else(|e| e.into_inner());
                    if let Err(e) = wire::write_result(&mut *s, seq, &result) {
                        tracing::debug!(rank = conn.rank, error = %e, "coordinator: sending a result");
                    }
                }
                // The group broke; the break reached every rank.
                Err(_) => return,
            },
            Work::Leave => sh.rv.leave(conn.rank),
        }
    }
}

fn describe(m: &Msg) -> String {
    match m {
        Msg::Hello { .. } => "a second hello".into(),
        Msg::Welcome { .. } | Msg::Refused { .. } | Msg::Result { .. } => "a coordinator's message".into(),
        Msg::Part { seq, .. } => format!("collective #{seq}"),
        Msg::Break { .. } | Msg::Bye => "a message after its goodbye".into(),
    }
}
