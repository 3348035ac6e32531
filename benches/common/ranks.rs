//! One process per GPU for the data-parallel benches: the bench starts
//! itself once per rank with torchrun's environment (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) and waits.

use kiln::{Error, Result};
use std::time::Instant;

/// Starts the running executable `gpus` times with `args` and `env`, as
/// the ranks of one group on this machine, and waits for them (at most
/// 300 s, then kills them); the first rank that fails is the error.
pub fn spawn_ranks(gpus: usize, args: &[&str], env: &[(&str, String)]) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Io(e.to_string()))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::Io(e.to_string()))?
        .port();
    let mut children = Vec::new();
    for r in 0..gpus {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", gpus.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        children.push(cmd.spawn().map_err(|e| Error::Io(format!("starting rank {r}: {e}")))?);
    }
    let t0 = Instant::now();
    let mut failed = None;
    for (r, c) in children.iter_mut().enumerate() {
        loop {
            match c.try_wait() {
                Ok(Some(s)) if s.success() => break,
                Ok(Some(s)) => {
                    failed.get_or_insert(format!("rank {r} exited with {s}"));
                    break;
                }
                Ok(None) if t0.elapsed().as_secs() < 300 => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                _ => {
                    let _ = c.kill();
                    failed.get_or_insert(format!("rank {r} still ran after 300 s"));
                    break;
                }
            }
        }
    }
    match failed {
        Some(why) => Err(Error::Runtime(format!("a process per GPU: {why}"))),
        None => Ok(()),
    }
}
