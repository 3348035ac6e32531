//! One process per rank, on localhost: a test spawns copies of this test
//! binary that run only itself (`--exact`) as ranks of a group
//! (`Group::from_env`), and compares what they computed with the same
//! ranks run as threads of one process, bit for bit. Failures too: a
//! killed rank fails every other rank with an error naming it, within
//! seconds (the group's timeout is 60 s, so no timeout does it).
//!
//! A child knows it is one from `KILN_TEST_RANK_OF` (the test it is a
//! rank of) and writes its results to `KILN_TEST_OUT`. Every wait on a
//! child has a deadline, after which every child is killed.

use super::{data_parallel_build, data_parallel_loss, on_ranks, values};
use kiln::dist::{DataParallel, Group, ProcessEnv};
use kiln::prelude::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "KILN_TEST_RANK_OF";
const OUT: &str = "KILN_TEST_OUT";

/// In a child process that is a rank of `test`: where to write results.
pub fn child_of(test: &str) -> Option<PathBuf> {
    (std::env::var(ROLE).ok()? == test).then(|| PathBuf::from(std::env::var(OUT).unwrap_or_default()))
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The ranks of one test, as processes.
pub struct Ranks {
    pub dir: PathBuf,
    pub children: Vec<Child>,
}

impl Ranks {
    /// Starts `n` copies of this binary running `test` (its full name)
    /// with torchrun's environment, or under `kiln-run` when `launcher`
    /// is given (its path). `env` is added to every child's.
    pub fn spawn(test: &str, n: usize, env: &[(&str, &str)], launcher: Option<&str>) -> Ranks {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let name = format!("kiln-procs-{}-{}-{nanos}", std::process::id(), test.replace("::", "-"));
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::env::current_exe().unwrap();
        let port = free_port().to_string();
        let args = [test, "--exact", "--nocapture", "--test-threads=1"];
        let mut children = Vec::new();
        let log = |name: &str| Stdio::from(std::fs::File::create(dir.join(name)).unwrap());
        let base = |cmd: &mut Command| {
            cmd.env(ROLE, test).env(OUT, &dir).env("KILN_DIST_TIMEOUT", "60");
            for (k, v) in env {
                cmd.env(k, v);
            }
        };
        match launcher {
            Some(kiln_run) => {
                let mut cmd = Command::new(kiln_run);
                cmd.args(["-n", &n.to_string(), "--grace", "20"]).arg(&exe).args(args);
                base(&mut cmd);
                cmd.stdout(log("launcher.out")).stderr(log("launcher.err"));
                children.push(cmd.spawn().unwrap());
            }
            None => {
                for r in 0..n {
                    let mut cmd = Command::new(&exe);
                    cmd.args(args)
                        .env("RANK", r.to_string())
                        .env("WORLD_SIZE", n.to_string())
                        .env("LOCAL_RANK", r.to_string())
                        .env("MASTER_ADDR", "127.0.0.1")
                        .env("MASTER_PORT", &port);
                    base(&mut cmd);
                    cmd.stdout(log(&format!("rank{r}.out"))).stderr(log(&format!("rank{r}.err")));
                    children.push(cmd.spawn().unwrap());
                }
            }
        }
        Ranks { dir, children }
    }

    /// Waits for child `k` (at most `limit`; then every child is killed
    /// and the test fails with their logs) and checks it succeeded.
    pub fn wait_ok(&mut self, k: usize, limit: Duration) {
        let t0 = Instant::now();
        loop {
            match self.children[k].try_wait().unwrap() {
                Some(s) if s.success() => return,
                Some(s) => self.fail(&format!("child {k} exited with {s}")),
                None if t0.elapsed() > limit => self.fail(&format!("child {k} still runs after {limit:?}")),
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Waits for child `k` to exit (at most `limit`; then every child is
    /// killed and the test fails with their logs), whatever its status.
    pub fn wait_any(&mut self, k: usize, limit: Duration) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            match self.children[k].try_wait().unwrap() {
                Some(s) => return s,
                None if t0.elapsed() > limit => self.fail(&format!("child {k} still runs after {limit:?}")),
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Spawns two ranks of test `test` (each runs the test's child branch),
    /// waits for both and returns the result they both wrote; fails with
    /// `why` and their logs when they wrote nothing or different things.
    pub fn two_agree(test: &str, why: &str) -> String {
        let mut ranks = Ranks::spawn(test, 2, &[], None);
        for r in 0..2 {
            ranks.wait_ok(r, Duration::from_secs(120));
        }
        let (a, b) = (ranks.result(0), ranks.result(1));
        if a != b || a.is_empty() {
            ranks.fail(why);
        }
        a
    }

    /// Kills every child and panics with `why` and every log.
    pub fn fail(&mut self, why: &str) -> ! {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let mut logs = String::new();
        let mut names: Vec<_> = std::fs::read_dir(&self.dir).unwrap().flatten().map(|e| e.path()).collect();
        names.sort();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            logs += &format!("--- {}\n{tail}\n", p.display());
        }
        panic!("{why}\n{logs}");
    }

    /// What rank `r` wrote with [`put`].
    pub fn result(&self, r: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("rank{r}.txt"))).unwrap_or_default()
    }

    /// Waits until rank `r` wrote `name` (at most `limit`).
    pub fn wait_for_file(&mut self, name: &str, limit: Duration) {
        let t0 = Instant::now();
        while !self.dir.join(name).exists() {
            if t0.elapsed() > limit {
                self.fail(&format!("no {name} after {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A child's result: written by rank `rank` for the parent.
pub fn put(dir: &Path, rank: usize, text: &str) {
    std::fs::write(dir.join(format!("rank{rank}.txt")), text).unwrap();
}

/// The bits of `v`, one line.
pub fn bits<T: Copy + Into<f64>>(v: &[T]) -> String {
    v.iter().map(|&x| format!("{:016x}", x.into().to_bits())).collect::<Vec<_>>().join(" ") + "\n"
}

/// The values [`bits`] wrote, a line each.
pub fn unbits(text: &str) -> Vec<Vec<f64>> {
    text.lines()
        .map(|l| l.split(' ').map(|h| f64::from_bits(u64::from_str_radix(h, 16).unwrap())).collect())
        .collect()
}

/// Sums, means and a broadcast across the group, in f32, bf16 and f64.
fn collectives(ctx: &Context, rank: usize) -> String {
    let x = ctx.tensor(&values(10 + rank as u64, 1000), [10, 100]);
    let mut out = String::new();
    out += &bits(&x.all_reduce_sum().to_vec::<f32>().unwrap());
    out += &bits(&x.all_reduce_mean().to_vec::<f32>().unwrap());
    out += &bits(&x.cast(DType::F64).all_reduce_sum().to_vec::<f64>().unwrap());
    let h = x.cast(DType::BF16).all_reduce_sum().cast(DType::F32);
    out += &bits(&h.to_vec::<f32>().unwrap());
    let b = ctx.tensor(&values(20 + rank as u64, 7), [7]).broadcast_from(1);
    out += &bits(&b.to_vec::<f32>().unwrap());
    out
}

#[test]
fn collectives_across_processes_equal_in_process_bit_for_bit() {
    const NAME: &str = "procs::collectives_across_processes_equal_in_process_bit_for_bit";
    if let Some(dir) = child_of(NAME) {
        let ctx = Context::cpu();
        let group = Group::from_env(&ctx).unwrap();
        assert_eq!((group.size(), group.contexts().len()), (2, 1));
        let rank = ctx.rank().unwrap();
        put(&dir, rank, &collectives(&ctx, rank));
        return;
    }
    let ctxs = [Context::cpu(), Context::cpu()];
    Group::new(&ctxs).unwrap();
    let want = on_ranks(&ctxs, |r, c| collectives(c, r));
    // Under kiln-run where it was built (cargo test builds it); a bundle
    // of the test binaries alone (tools/gpu-bundle) spawns the ranks itself.
    let launcher = env!("CARGO_BIN_EXE_kiln-run");
    let launcher = Path::new(launcher).exists().then_some(launcher);
    if launcher.is_none() {
        eprintln!("kiln-run is not at {}: the test starts the ranks itself", env!("CARGO_BIN_EXE_kiln-run"));
    }
    let mut ranks = Ranks::spawn(NAME, 2, &[], launcher);
    ranks.wait_ok(0, Duration::from_secs(60));
    for (r, want) in want.iter().enumerate() {
        if ranks.result(r) != *want {
            ranks.fail(&format!("rank {r}'s results differ from the in-process rank's"));
        }
    }
    assert_eq!(want[0], want[1], "every rank holds the same bits");
}

/// Batch `k` of 16 rows.
fn batch(host: &Context, k: u64) -> (Tensor, Tensor) {
    let x = values(k, 16 * 12);
    let y: Vec<i64> = (0..16).map(|i| ((i as u64 * 7 + k) % 5) as i64).collect();
    (host.tensor(&x, [16, 12]), host.tensor(&y, [16]))
}

/// Six AdamW steps; rank `r`'s losses, then its parameters.
fn train(dp: &mut DataParallel<kiln::optim::AdamW>) -> Vec<String> {
    let host = Context::cpu();
    let ranks = dp.group().ranks();
    let mut out = vec![String::new(); ranks.len()];
    for k in 0..6 {
        let (x, y) = batch(&host, k);
        for (o, l) in out.iter_mut().zip(dp.step(&[&x, &y]).unwrap()) {
            *o += &bits(&[l.item::<f32>().unwrap()]);
        }
    }
    for (o, r) in out.iter_mut().zip(ranks) {
        for p in dp.parameters(r) {
            *o += &bits(&p.tensor().to_vec::<f32>().unwrap());
        }
    }
    out
}

/// Plain torchrun environment (no launcher), each rank seeded apart.
#[test]
fn data_parallel_across_processes_equals_in_process_bit_for_bit() {
    const NAME: &str = "procs::data_parallel_across_processes_equals_in_process_bit_for_bit";
    if let Some(dir) = child_of(NAME) {
        let env = ProcessEnv::from_env().unwrap();
        let ctx = Context::cpu().with_seed(env.rank as u64 + 1);
        let group = Group::join(&ctx, &env).unwrap();
        let mut dp = DataParallel::with_group(&group, data_parallel_build, data_parallel_loss).unwrap();
        put(&dir, env.rank, &train(&mut dp)[0]);
        return;
    }
    let mut ranks = Ranks::spawn(NAME, 2, &[], None);
    let ctxs = [Context::cpu().with_seed(1), Context::cpu().with_seed(2)];
    let mut dp = DataParallel::new(&ctxs, data_parallel_build, data_parallel_loss).unwrap();
    let want = train(&mut dp);
    assert_eq!(want[0].lines().skip(6).collect::<Vec<_>>(), want[1].lines().skip(6).collect::<Vec<_>>());
    assert_ne!(want[0].lines().next(), want[1].lines().next(), "the ranks train on different shards");
    for r in 0..2 {
        ranks.wait_ok(r, Duration::from_secs(90));
    }
    for (r, want) in want.iter().enumerate() {
        if ranks.result(r) != *want {
            ranks.fail(&format!("rank {r}'s losses or parameters differ from the in-process rank's"));
        }
    }
}

/// Rank `victim` of `n` is killed (SIGKILL) while the others wait for it
/// in a collective; returns what each other rank's collective failed with,
/// and how long after the kill the last of them ended. With
/// `exit_ok_after_error`, a survivor that wrote its error may then exit
/// with a failure (NCCL's teardown after an abort can crash a process on
/// its way out: README, "Several devices"); the status is printed.
pub fn kill_one(name: &str, n: usize, victim: usize, exit_ok_after_error: bool) -> (Vec<String>, Duration) {
    let mut ranks = Ranks::spawn(name, n, &[], None);
    ranks.wait_for_file(&format!("ready{victim}"), Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(100));
    let pid = ranks.children[victim].id();
    ranks.children[victim].kill().unwrap();
    let t0 = Instant::now();
    let _ = ranks.children[victim].wait();
    let others: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
    for &r in &others {
        if !exit_ok_after_error {
            ranks.wait_ok(r, Duration::from_secs(30));
            continue;
        }
        match ranks.wait_any(r, Duration::from_secs(30)) {
            s if s.success() => {}
            s if !ranks.result(r).is_empty() => eprintln!("rank {r} wrote its error, then exited with {s}"),
            s => ranks.fail(&format!("rank {r} exited with {s} before writing its error")),
        }
    }
    let took = t0.elapsed();
    let errs: Vec<String> = others.iter().map(|&r| ranks.result(r)).collect();
    for e in &errs {
        if victim != 0 && !e.contains(&format!("rank {victim} (pid {pid} at 127.0.0.1)")) {
            ranks.fail(&format!("an error that does not name the killed rank: {e:?}"));
        }
    }
    (errs, took)
}

/// A rank's part of the killed-rank tests: one collective every rank
/// runs, then the victim says it is ready and waits to be killed, and the
/// others wait for it in a second collective, which must fail.
pub fn victim_or_survivor(ctx: &Context, dir: &Path, victim: usize) {
    let group = Group::from_env(ctx).unwrap();
    let rank = group.ranks().start;
    let x = ctx.ones([64]);
    assert_eq!(x.all_reduce_sum().to_vec::<f32>().unwrap()[0], group.size() as f32);
    if rank == victim {
        std::fs::write(dir.join(format!("ready{rank}")), "").unwrap();
        std::thread::sleep(Duration::from_secs(120));
        panic!("not killed");
    }
    let err = (x * 2.0).all_reduce_sum().to_vec::<f32>().unwrap_err();
    put(dir, rank, &err.to_string());
}

#[test]
fn a_killed_rank_fails_every_other_rank_naming_it() {
    const NAME: &str = "procs::a_killed_rank_fails_every_other_rank_naming_it";
    if let Some(dir) = child_of(NAME) {
        return victim_or_survivor(&Context::cpu(), &dir, 1);
    }
    let (errs, took) = kill_one(NAME, 3, 1, false);
    for e in &errs {
        assert!(e.contains("all_reduce_sum: the process group is broken: rank 1 (pid "), "{e}");
        assert!(e.contains("disconnected without leaving the group: its process died or was killed"), "{e}");
    }
    assert!(took < Duration::from_secs(20), "{took:?}: the group's timeout, not the death, ended the wait");
}

#[test]
fn a_killed_rank_0_fails_the_others_naming_it() {
    const NAME: &str = "procs::a_killed_rank_0_fails_the_others_naming_it";
    if let Some(dir) = child_of(NAME) {
        return victim_or_survivor(&Context::cpu(), &dir, 0);
    }
    let (errs, took) = kill_one(NAME, 2, 0, false);
    assert!(
        errs[0].contains("lost the connection to the group's coordinator (rank 0, 127.0.0.1:")
            && errs[0].contains("rank 0's process died or was killed"),
        "{}",
        errs[0]
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// The launcher: a rank that fails gives the others `--grace` to end,
/// then they are killed, and `kiln-run` exits with the failed rank's
/// status, naming it.
#[test]
fn kiln_run_ends_the_ranks_when_one_fails() {
    const NAME: &str = "procs::kiln_run_ends_the_ranks_when_one_fails";
    if child_of(NAME).is_some() {
        let env = ProcessEnv::from_env().unwrap();
        if env.rank == 1 {
            std::process::exit(7);
        }
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let launcher = env!("CARGO_BIN_EXE_kiln-run");
    if !Path::new(launcher).exists() {
        eprintln!("skipped: kiln-run is not at {launcher} (a bundle of test binaries)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-procs-launcher-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t0 = Instant::now();
    let mut launch = Command::new(launcher)
        .args(["-n", "2", "--grace", "1"])
        .arg(std::env::current_exe().unwrap())
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, NAME)
        .env(OUT, &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(dir.join("launcher.err")).unwrap()))
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = launch.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = launch.kill(); // its ranks die with their pipes or on their own within 60 s
            let _ = launch.wait();
            panic!("kiln-run still ran after 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t0.elapsed();
    let err = std::fs::read_to_string(dir.join("launcher.err")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(status.code(), Some(7), "{err}");
    assert!(err.contains("kiln-run: rank 1 failed (exit status: 7); the others have 1s to end"), "{err}");
    assert!(err.contains("kiln-run: killing rank 0, still running 1s after a rank failed"), "{err}");
    assert!(took < Duration::from_secs(30), "{took:?}");
}
