//! A rank's connection to its group's coordinator (`coordinator.rs`), for
//! a rank of a group of processes: how its [`Rendezvous`] sends operands
//! and breaks, and hears results and breaks.
//!
//! Ownership: the link belongs to the rank's rendezvous (which the
//! rank's backend and plans share). Sending is serialized by the link's
//! send lock, which is also where a collective is numbered, so the
//! coordinator sees a rank's collectives in the rank's order. A reader
//! thread holds only a weak reference to the rendezvous: it delivers
//! results and breaks while the rank is alive and ends with the
//! connection.
//!
//! Leaving: dropping the link (with the rank's last context) says goodbye
//! and closes the connection; rank 0 first waits for the other ranks to
//! leave ([`Coordinator::finish`]). A connection that ends any other way
//! (rank 0's process died) breaks the rank's group, naming rank 0.

use super::coordinator::Coordinator;
use super::host::Rendezvous;
use super::wire::{self, Msg};
use crate::ir::{Collective, HostData, Shape};
use crate::{Error, Result};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// See the module docs.
pub(crate) struct Link {
    addr: String,
    send: Mutex<TcpStream>,
    leaving: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    /// Rank 0's: the coordinator it serves.
    coordinator: Option<Coordinator>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({}{})", self.addr, if self.coordinator.is_some() { ", coordinator" } else { "" })
    }
}

/// What a rank tells the coordinator about itself.
pub(crate) struct Hello {
    pub rank: usize,
    pub size: usize,
    /// The backend's name (`cpu`, `cuda`, `cuda-emulated`).
    pub kind: String,
    /// The device (`cpu`, `cuda:1`).
    pub device: String,
    /// Rank 0's NCCL unique id; empty otherwise.
    pub payload: Vec<u8>,
}

impl Link {
    /// Connects to the coordinator at `addr` (retrying until it listens,
    /// at most `timeout`), says hello and waits for the group to form.
    /// Returns the link and rank 0's payload.
    pub(crate) fn connect(
        addr: &str,
        hello: Hello,
        timeout: Duration,
        coordinator: Option<Coordinator>,
    ) -> std::result::Result<(Link, Vec<u8>), String> {
        let deadline = Instant::now() + timeout;
        let rank = hello.rank;
        let fail = |why: String| format!("rank {rank} could not join the group at {addr}: {why}");
        let mut stream = loop {
            let last = match addr.to_socket_addrs() {
                Ok(addrs) => {
                    let mut last = format!("{addr} resolves to no address");
                    let mut got = None;
                    for a in addrs {
                        let left =
                            deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                        match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(5))) {
                            Ok(s) => {
                                got = Some(s);
                                break;
                            }
                            Err(e) => last = e.to_string(),
                        }
                    }
                    match got {
                        Some(s) => break s,
                        None => last,
                    }
                }
                Err(e) => format!("resolving {addr}: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(fail(format!(
                    "nothing answered within {timeout:?} ({last}); is rank 0 running, with the same MASTER_ADDR and MASTER_PORT?"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = stream.set_nodelay(true);
        let io = |what: &str, e: std::io::Error| fail(format!("{what}: {e}"));
        wire::write(
            &mut stream,
            &Msg::Hello {
                rank: hello.rank as u64,
                size: hello.size as u64,
                kind: hello.kind,
                device: hello.device,
                pid: std::process::id(),
                payload: hello.payload,
            },
        )
        .map_err(|e| io("saying hello", e))?;
        let left = deadline.saturating_duration_since(Instant::now());
        // The coordinator answers by the same deadline; a margin for the
        // answer to travel.
        stream.set_read_timeout(Some(left + Duration::from_secs(5))).map_err(|e| io("waiting", e))?;
        let payload = match wire::read(&mut stream) {
            Ok(Some(Msg::Welcome { payload })) => payload,
            Ok(Some(Msg::Refused { why })) => return Err(fail(why)),
            Ok(Some(_)) => {
                return Err(fail("the coordinator answered with something else than a welcome".into()))
            }
            Ok(None) => {
                return Err(fail("the coordinator closed the connection before the group formed".into()))
            }
            Err(e) => return Err(io("waiting for the other ranks", e)),
        };
        stream.set_read_timeout(None).map_err(|e| io("after the welcome", e))?;
        let link = Link {
            addr: addr.to_string(),
            send: Mutex::new(stream),
            leaving: Arc::new(AtomicBool::new(false)),
            reader: Mutex::new(None),
            coordinator,
        };
        Ok((link, payload))
    }

    /// Starts delivering what the coordinator sends to `rv` (the
    /// rendezvous that owns this link).
    pub(crate) fn start(&self, rv: Weak<Rendezvous>) -> Result<()> {
        let stream = self.lock().try_clone().map_err(|e| Error::Runtime(format!("dist: {e}")))?;
        let (leaving, addr) = (self.leaving.clone(), self.addr.clone());
        let handle = std::thread::Builder::new()
            .name("kiln-link".into())
            .spawn(move || read_coordinator(stream, rv, leaving, addr))
            .map_err(|e| Error::Runtime(format!("dist: starting the link's reader: {e}")))?;
        *self.reader.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(())
    }

    /// Where the coordinator is.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Numbers this rank's next collective (`number`, under the send
    /// lock) and sends its operand.
    pub(crate) fn send_part(
        &self,
        number: impl FnOnce() -> Result<u64>,
        what: Collective,
        shape: &Shape,
        data: &HostData,
    ) -> Result<u64> {
        let mut s = self.lock();
        let seq = number()?;
        wire::write_part(&mut *s, seq, what, shape, data).map_err(|e| {
            Error::Runtime(format!(
                "{}: sending collective #{seq} to the coordinator at {}: {e}",
                what.mnemonic(),
                self.addr
            ))
        })?;
        Ok(seq)
    }

    /// Tells the coordinator the group broke here (it tells every rank).
    pub(crate) fn send_break(&self, why: &str) {
        if let Err(e) = wire::write(&mut *self.lock(), &Msg::Break { why: why.to_string() }) {
            tracing::warn!(error = %e, "dist: telling the coordinator the group broke");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TcpStream> {
        self.send.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::SeqCst);
        {
            let mut s = self.lock();
            let _ = wire::write(&mut *s, &Msg::Bye);
            let _ = s.shutdown(Shutdown::Write);
        }
        if let Some(c) = &self.coordinator {
            c.finish();
        }
        let _ = self.lock().shutdown(Shutdown::Both);
        if let Some(h) = self.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

/// The link's reader thread (see the module docs).
fn read_coordinator(mut stream: TcpStream, rv: Weak<Rendezvous>, leaving: Arc<AtomicBool>, addr: String) {
    loop {
        let msg = wire::read(&mut stream);
        let Some(rv) = rv.upgrade() else { return };
        match msg {
            Ok(Some(Msg::Result { seq, data })) => rv.deliver(seq, data),
            Ok(Some(Msg::Break { why })) => {
                rv.break_here(why);
            }
            _ if leaving.load(Ordering::SeqCst) => return,
            Ok(None) | Err(_) => {
                let how = match msg {
                    Err(e) => format!(": {e}"),
                    _ => String::new(),
                };
                rv.break_here(format!(
                    "lost the connection to the group's coordinator (rank 0, {addr}){how}: rank 0's process died or was killed"
                ));
                return;
            }
            Ok(Some(_)) => {
                rv.break_group(format!("the coordinator at {addr} sent a message out of turn"));
                return;
            }
        }
    }
}
