//! Forming a group of processes and what goes wrong in one: torchrun's
//! environment is checked variable by variable, ranks that disagree are
//! refused naming both, and collectives over the coordinator keep the
//! in-process rules (a mismatch names both ranks, a missing rank times
//! out, a rank that left fails what still needs it). The ranks here are
//! threads joining over TCP: the processes' path, without their start-up.

use kiln::dist::{Group, ProcessEnv};
use kiln::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

fn env(rank: usize, size: usize, port: u16, timeout: Duration) -> ProcessEnv {
    ProcessEnv {
        rank,
        world_size: size,
        local_rank: rank,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout,
    }
}

fn port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Every rank's `f(rank, ctx)` on a thread of its own, once it joined
/// (each join's error, or `f`'s result).
fn joined<T: Send>(envs: &[ProcessEnv], f: impl Fn(usize, Context) -> T + Sync) -> Vec<Result<T>> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = envs
            .iter()
            .map(|e| {
                s.spawn(move || {
                    let ctx = Context::cpu();
                    Group::join(&ctx, e).map(|_| f(e.rank, ctx))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn torchrun_environment_errors_name_the_variable() {
    let parse = |pairs: &[(&str, &str)]| {
        let vars: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ProcessEnv::from_vars(move |k| vars.get(k).cloned())
    };
    let good = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "10.0.0.7"), ("MASTER_PORT", "29500")];
    let e = parse(&good).unwrap();
    let want = ProcessEnv {
        rank: 1,
        world_size: 2,
        local_rank: 1,
        master_addr: "10.0.0.7".into(),
        master_port: 29500,
        timeout: Duration::from_secs(60),
    };
    assert_eq!(e, want);
    assert_eq!(e.master(), "10.0.0.7:29500");
    let with = |k: &str, v: Option<&str>| {
        let mut p: Vec<(&str, &str)> = good.iter().copied().filter(|(n, _)| *n != k).collect();
        if let Some(v) = v {
            p.push((k, v));
        }
        parse(&p)
    };
    let cases: [(&str, Option<&str>, &str); 9] = [
        ("RANK", None, "RANK is not set; a process of a group needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun's environment, which kiln-run sets)"),
        ("RANK", Some("one"), "RANK=\"one\" is not a whole number"),
        ("RANK", Some("2"), "RANK=2 but WORLD_SIZE=2: ranks run from 0 to 1"),
        ("WORLD_SIZE", Some("0"), "WORLD_SIZE=0: a group needs at least one process"),
        ("LOCAL_RANK", Some("-1"), "LOCAL_RANK=\"-1\" is not a whole number"),
        ("MASTER_ADDR", None, "MASTER_ADDR is not set"),
        ("MASTER_PORT", Some("70000"), "MASTER_PORT=\"70000\" is not a port (1 to 65535)"),
        ("MASTER_PORT", Some("0"), "MASTER_PORT=\"0\" is not a port (1 to 65535)"),
        ("KILN_DIST_TIMEOUT", Some("soon"), "KILN_DIST_TIMEOUT=\"soon\" is not a number of seconds above 0"),
    ];
    for (k, v, want) in cases {
        let err = with(k, v).unwrap_err();
        assert!(matches!(err, Error::Argument { op: "ProcessEnv::from_env", .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("invalid argument to ProcessEnv::from_env: {want}")),
            "{k}={v:?}: {text}"
        );
        assert!(text.contains("joining.rs"), "the caller's location: {text}");
    }
    let e = with("KILN_DIST_TIMEOUT", Some("2.5")).unwrap();
    assert_eq!((e.timeout, e.local_rank), (Duration::from_millis(2500), 1));
    assert_eq!(with("LOCAL_RANK", Some("0")).unwrap().local_rank, 0);
}

#[test]
fn ranks_that_disagree_are_refused_naming_both() {
    let t = Duration::from_secs(20);
    // Rank 1 thinks the group has 3 ranks.
    let p = port();
    let errs = joined(&[env(0, 2, p, t), env(1, 3, p, t)], |_, _| ());
    let pid = std::process::id();
    for e in &errs {
        let e = e.as_ref().unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "rank 1 (pid {pid} at 127.0.0.1) has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"
            )),
            "{e}"
        );
    }
    // Two ranks 1.
    let p = port();
    let errs = joined(&[env(0, 3, p, t), env(1, 3, p, t), env(1, 3, p, t)], |_, _| ());
    for e in &errs {
        let e = e.as_ref().unwrap_err().to_string();
        assert!(
            e.contains(&format!("rank 1 joined twice: pid {pid} at 127.0.0.1 and pid {pid} at 127.0.0.1")),
            "{e}"
        );
    }
    // A rank outside the group, before anything connects.
    let err = Group::join(&Context::cpu(), &env(2, 2, port(), t)).unwrap_err();
    assert!(matches!(err, Error::Device { .. }), "{err:?}");
    assert!(err.to_string().contains("rank 2 of a group of 2: ranks run from 0 to 1"), "{err}");
    // Rank 1 never comes.
    let err =
        Group::join(&Context::cpu(), &env(0, 2, port(), Duration::from_millis(300))).unwrap_err().to_string();
    assert!(err.contains("rank 0 could not join the group at 127.0.0.1:"), "{err}");
    assert!(err.contains("rank(s) [1] did not join within 300ms"), "{err}");
}

#[test]
fn collectives_through_the_coordinator_keep_the_in_process_rules() {
    let t = Duration::from_secs(20);
    // Different shapes: both ranks fail naming both.
    let p = port();
    let errs = joined(&[env(0, 2, p, t), env(1, 2, p, t)], |r, ctx| {
        ctx.zeros([2 + r]).all_reduce_sum().to_vec::<f32>().unwrap_err().to_string()
    });
    for e in errs {
        let e = e.unwrap();
        assert!(e.contains("collective #0 is all_reduce_sum f32["), "{e}");
        assert!(e.contains("on rank 0 but") || e.contains("on rank 1 but"), "{e}");
    }
    // Rank 1 never runs rank 0's collective: the coordinator times it out.
    let p = port();
    let short = Duration::from_millis(300);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let got = joined(&[env(0, 2, p, short), env(1, 2, p, short)], |r, ctx| {
        if r == 1 {
            let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
            return String::new();
        }
        let e = ctx.ones([3]).all_reduce_sum().to_vec::<f32>().unwrap_err().to_string();
        tx.send(()).unwrap();
        e
    });
    let e = got[0].as_ref().unwrap();
    assert!(
        e.contains("rank 0 waited 300ms in collective #0 (all_reduce_sum f32[3]) for rank(s) [1]"),
        "{e}"
    );
    // Rank 1 leaves at once: rank 0's collective fails naming it.
    let p = port();
    let got = joined(&[env(0, 2, p, t), env(1, 2, p, t)], |r, ctx| {
        if r == 1 {
            return String::new(); // its context drops: it leaves the group
        }
        ctx.ones([3]).all_reduce_sum().to_vec::<f32>().unwrap_err().to_string()
    });
    let e = got[0].as_ref().unwrap();
    assert!(e.contains("rank 1 left the group after its 0 collective(s), but collective #0 needs it"), "{e}");
}
