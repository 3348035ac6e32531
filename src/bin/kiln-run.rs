//! `kiln-run`: starts a program as the ranks of a group of processes, one
//! process per rank, with torchrun's environment (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), which
//! `kiln::dist::Group::from_env` reads.
//!
//! ```text
//! kiln-run -n N [--nnodes M --node-rank R] [--master-addr A] [--master-port P]
//!          [--grace S] [--no-prefix] prog [args...]
//! ```
//!
//! On one host, `-n N` is all it takes (the port is a free one). On M
//! hosts, run it on each with the same `--nnodes`, `--master-addr` (node
//! 0's host) and `--master-port`, and `--node-rank` 0 to M-1: node R's
//! processes are ranks `R*N..R*N+N`.
//!
//! Every line a rank prints is prefixed with `[rank k]` (`--no-prefix`
//! passes output through as it is). When a rank fails, the others get
//! `--grace` seconds (10) to fail by themselves (they see the group's
//! error naming the failed rank), then they are killed. The exit status
//! is the first failed rank's (0 when every rank succeeded).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: kiln-run -n N [--nnodes M --node-rank R] [--master-addr A] [--master-port P] [--grace S] [--no-prefix] prog [args...]";

struct Options {
    nproc: usize,
    nnodes: usize,
    node_rank: usize,
    master_addr: String,
    master_port: Option<u16>,
    grace: Duration,
    prefix: bool,
    program: String,
    args: Vec<String>,
}

fn main() {
    match parse(std::env::args().skip(1).collect()).and_then(|o| run(&o)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("kiln-run: {e}");
            std::process::exit(2);
        }
    }
}

fn parse(mut args: Vec<String>) -> Result<Options, String> {
    let mut o = Options {
        nproc: 0,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: None,
        grace: Duration::from_secs(10),
        prefix: true,
        program: String::new(),
        args: Vec::new(),
    };
    args.reverse();
    let number = |flag: &str, v: Option<String>| -> Result<usize, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        v.parse().map_err(|_| format!("{flag} {v:?} is not a whole number\n{USAGE}"))
    };
    while let Some(a) = args.pop() {
        match a.as_str() {
            "-n" | "--nproc-per-node" | "--nproc_per_node" => o.nproc = number(&a, args.pop())?,
            "--nnodes" => o.nnodes = number(&a, args.pop())?,
            "--node-rank" | "--node_rank" => o.node_rank = number(&a, args.pop())?,
            "--master-addr" | "--master_addr" => {
                o.master_addr = args.pop().ok_or_else(|| format!("{a} needs a value\n{USAGE}"))?
            }
            "--master-port" | "--master_port" => {
                let p = number(&a, args.pop())?;
                o.master_port = Some(
                    u16::try_from(p)
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or(format!("--master-port {p} is not a port"))?,
                );
            }
            "--grace" => o.grace = Duration::from_secs(number(&a, args.pop())? as u64),
            "--no-prefix" => o.prefix = false,
            "-h" | "--help" => return Err(USAGE.into()),
            "--" => {
                o.program = args.pop().unwrap_or_default();
                break;
            }
            flag if flag.starts_with('-') && o.program.is_empty() => {
                return Err(format!("unknown option {flag}\n{USAGE}"));
            }
            _ => {
                o.program = a;
                break;
            }
        }
    }
    args.reverse();
    o.args = args;
    if o.nproc == 0 || o.program.is_empty() {
        return Err(USAGE.into());
    }
    if o.nnodes == 0 || o.node_rank >= o.nnodes {
        return Err(format!("--node-rank {} of --nnodes {}: node ranks run from 0", o.node_rank, o.nnodes));
    }
    if o.nnodes > 1 && o.master_port.is_none() {
        return Err("several nodes need the same --master-port on every node".into());
    }
    Ok(o)
}

fn run(o: &Options) -> Result<i32, String> {
    let port = match o.master_port {
        Some(p) => p,
        // A port free now; rank 0 binds it a moment later.
        None => std::net::TcpListener::bind((o.master_addr.as_str(), 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("finding a free port on {}: {e}", o.master_addr))?
            .port(),
    };
    let world = o.nproc * o.nnodes;
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pumps = Vec::new();
    for local in 0..o.nproc {
        let rank = o.node_rank * o.nproc + local;
        let mut cmd = Command::new(&o.program);
        cmd.args(&o.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", o.nproc.to_string())
            .env("GROUP_RANK", o.node_rank.to_string())
            .env("MASTER_ADDR", &o.master_addr)
            .env("MASTER_PORT", port.to_string());
        if o.prefix {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("starting rank {rank} ({}): {e}", o.program));
            }
        };
        if let Some(out) = child.stdout.take() {
            pumps.push(pump(out, rank, false));
        }
        if let Some(err) = child.stderr.take() {
            pumps.push(pump(err, rank, true));
        }
        children.push((rank, child));
    }
    let mut first_failure: Option<(usize, ExitStatus, Instant)> = None;
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (i, (rank, child)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) => {
                    done[i] = true;
                    if !status.success() && first_failure.is_none() {
                        eprintln!(
                            "kiln-run: rank {rank} failed ({status}); the others have {:?} to end",
                            o.grace
                        );
                        first_failure = Some((*rank, status, Instant::now()));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[i] = true;
                    eprintln!("kiln-run: waiting for rank {rank}: {e}");
                }
            }
        }
        if let Some((_, _, at)) = first_failure {
            if at.elapsed() >= o.grace {
                for (i, (rank, child)) in children.iter_mut().enumerate() {
                    if !done[i] {
                        eprintln!(
                            "kiln-run: killing rank {rank}, still running {:?} after a rank failed",
                            o.grace
                        );
                        let _ = child.kill();
                        let _ = child.wait();
                        done[i] = true;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in pumps {
        let _ = p.join();
    }
    Ok(match first_failure {
        None => 0,
        Some((rank, status, _)) => {
            eprintln!("kiln-run: rank {rank} failed first ({status})");
            status.code().filter(|&c| c != 0).unwrap_or(1)
        }
    })
}

/// Copies a rank's output line by line, each prefixed with its rank.
fn pump(from: impl Read + Send + 'static, rank: usize, err: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut lines = BufReader::new(from);
        let mut line = Vec::new();
        while matches!(lines.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches('\n');
            let _ = if err {
                writeln!(std::io::stderr().lock(), "[rank {rank}] {text}")
            } else {
                writeln!(std::io::stdout().lock(), "[rank {rank}] {text}")
            };
            line.clear();
        }
    })
}

fn kill_all(children: &mut [(usize, Child)]) {
    for (_, c) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}
