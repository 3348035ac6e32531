//! Collectives are effects: no pass merges, drops, reorders or folds
//! across them, whatever each rank's constants are (issue 33, defect 6).
//! A rank whose passes changed how many collectives it runs would pair
//! different rounds with the other ranks: a wrong sum on one, a timeout
//! on the other (a hang under NCCL). The groups here time out after a few
//! seconds, so a regression fails fast instead of waiting 60 s.

use super::on_ranks;
use super::splitmix::Rng;
use kiln::dist::Group;
use kiln::prelude::*;
use std::time::Duration;

fn group(n: usize) -> Vec<Context> {
    let ctxs: Vec<Context> = (0..n).map(|_| Context::cpu()).collect();
    Group::with_timeout(&ctxs, Duration::from_secs(5)).unwrap();
    ctxs
}

/// Issue 33's repro: CSE merged the two all-reduces on rank 1 (its
/// constants are equal there), so rank 1 ran one collective and rank 0
/// two: rank 1 got `[2,2,2,2]`, rank 0 timed out.
#[test]
fn equal_looking_all_reduces_on_one_rank_are_not_merged() {
    let ctxs = group(2);
    let got = on_ranks(&ctxs, |rank, ctx| {
        (ctx.full([4], rank as f32).all_reduce_sum() + ctx.full([4], 1.0f32).all_reduce_sum()).to_vec::<f32>()
    });
    for (rank, r) in got.into_iter().enumerate() {
        assert_eq!(r.unwrap(), vec![3.0; 4], "rank {rank}");
    }
}

/// A `where` on a rank's constant condition: constant folding picks one
/// branch per rank and DCE dropped the other branch's collective on that
/// rank only. The collective still runs on every rank.
#[test]
fn a_collective_in_a_branch_a_constant_where_drops_still_runs() {
    let ctxs = group(2);
    let got = on_ranks(&ctxs, |rank, ctx| {
        let cond = ctx.full_dtype([3], (rank == 0) as i64, DType::Bool);
        let reduced = ctx.full([3], rank as f32 + 1.0).all_reduce_sum();
        let picked = cond.where_cond(&reduced, -1.0);
        let after = ctx.full([3], 2.0f32).all_reduce_sum();
        (picked + after).to_vec::<f32>()
    });
    assert_eq!(got[0].as_ref().unwrap(), &vec![3.0 + 4.0; 3]);
    assert_eq!(got[1].as_ref().unwrap(), &vec![-1.0 + 4.0; 3]);
}

/// A rank whose run fails before its collective (a bad gather index
/// feeding the all-reduce) breaks the group at once: the other rank gets
/// an error naming it, not a timeout a minute later.
#[test]
fn a_rank_failing_before_its_collective_breaks_the_group_naming_it() {
    let ctxs: Vec<Context> = (0..2).map(|_| Context::cpu()).collect();
    Group::with_timeout(&ctxs, Duration::from_secs(30)).unwrap();
    let start = std::time::Instant::now();
    let got = on_ranks(&ctxs, |rank, ctx| {
        let table = ctx.tensor(&[1.0f32, 2.0, 3.0, 4.0], [4]);
        let index: Vec<i64> = if rank == 1 { vec![0, 99] } else { vec![0, 1] };
        table.gather(0, &ctx.tensor(&index, [2])).all_reduce_sum().to_vec::<f32>().unwrap_err().to_string()
    });
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert_eq!(
        got[0],
        "runtime error: all_reduce_sum: the process group is broken: rank 1 failed before its collective #0: runtime error: gather index 99 is out of range for dim 0 of size 4 (node %2)"
    );
}

/// The draws only this file needs.
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One step of a random program; operands index the values made so far.
#[derive(Clone, Debug)]
enum Step {
    /// `full(c[rank])`: a constant that differs per rank (often equal to
    /// another constant on some ranks only: equal-looking collectives).
    Const(Vec<f64>),
    Add(usize, usize),
    Mul(usize, usize),
    Sum(usize),
    Mean(usize),
    Broadcast(usize, usize),
    /// `where(full(cond[rank]), a, b)`: a constant condition per rank.
    Where(Vec<bool>, usize, usize),
    /// An all-reduce recorded and never read: it runs on no rank.
    Unread(usize),
}

fn program(rng: &mut Rng, ranks: usize) -> Vec<Step> {
    let mut steps = vec![Step::Const((0..ranks).map(|_| rng.below(3) as f64).collect())];
    let len = 4 + rng.below(9);
    while steps.len() < len {
        let n = steps.len();
        let (a, b) = (rng.below(n), rng.below(n));
        steps.push(match rng.below(9) {
            0 => Step::Const((0..ranks).map(|_| rng.below(3) as f64).collect()),
            1 => Step::Add(a, b),
            2 => Step::Mul(a, b),
            3 | 4 => Step::Sum(a),
            5 => Step::Mean(a),
            6 => Step::Broadcast(a, rng.below(ranks)),
            7 => Step::Where((0..ranks).map(|_| rng.below(2) == 1).collect(), a, b),
            _ => Step::Unread(a),
        });
    }
    steps
}

/// Every rank's value of every step, in f64 (an unread all-reduce has
/// none: it never runs).
fn reference(steps: &[Step], ranks: usize) -> Vec<Vec<f64>> {
    let mut v: Vec<Vec<f64>> = Vec::new();
    for s in steps {
        let sum = |a: usize, v: &[Vec<f64>]| v[a].iter().sum::<f64>();
        v.push(match s {
            Step::Const(c) => c.clone(),
            Step::Add(a, b) => (0..ranks).map(|r| v[*a][r] + v[*b][r]).collect(),
            Step::Mul(a, b) => (0..ranks).map(|r| v[*a][r] * v[*b][r]).collect(),
            Step::Sum(a) => vec![sum(*a, &v); ranks],
            Step::Mean(a) => vec![sum(*a, &v) / ranks as f64; ranks],
            Step::Broadcast(a, root) => vec![v[*a][*root]; ranks],
            Step::Where(c, a, b) => (0..ranks).map(|r| if c[r] { v[*a][r] } else { v[*b][r] }).collect(),
            Step::Unread(a) => v[*a].clone(),
        });
    }
    v
}

/// Records the program on one rank and reads its last value, then its
/// first all-reduce's (a second plan), as f32.
fn run(steps: &[Step], rank: usize, ctx: &Context) -> Result<Vec<Vec<f32>>> {
    let mut v: Vec<Tensor> = Vec::new();
    for s in steps {
        v.push(match s {
            Step::Const(c) => ctx.full([3], c[rank] as f32),
            Step::Add(a, b) => &v[*a] + &v[*b],
            Step::Mul(a, b) => &v[*a] * &v[*b],
            Step::Sum(a) => v[*a].all_reduce_sum(),
            Step::Mean(a) => v[*a].all_reduce_mean(),
            Step::Broadcast(a, root) => v[*a].broadcast_from(*root),
            Step::Where(c, a, b) => {
                ctx.full_dtype([3], c[rank] as i64, DType::Bool).where_cond(&v[*a], &v[*b])
            }
            Step::Unread(a) => {
                let _never_read = v[*a].all_reduce_sum();
                v[*a].clone()
            }
        });
    }
    let mut reads = vec![v.last().expect("a program has steps").to_vec::<f32>()?];
    if let Some(k) = steps.iter().position(|s| matches!(s, Step::Sum(_))) {
        reads.push(v[k].to_vec::<f32>()?);
    }
    Ok(reads)
}

/// The test class of issue 33's collectives defects: random programs on
/// 2–4 CPU ranks whose constants differ per rank (so each rank's passes
/// see a different graph: equal-looking collectives, a `where` on a
/// constant condition with collectives in its branches, all-reduces of
/// constants, collectives never read) complete on every rank with the
/// f64 reference's values.
#[test]
fn random_programs_with_per_rank_constants_complete_on_every_rank() {
    for case in 0..40u64 {
        let mut rng = Rng(case);
        let ranks = 2 + rng.below(3);
        let steps = program(&mut rng, ranks);
        let want = reference(&steps, ranks);
        let ctxs: Vec<Context> = (0..ranks).map(|_| Context::cpu()).collect();
        Group::with_timeout(&ctxs, Duration::from_secs(5)).unwrap();
        let got = on_ranks(&ctxs, |rank, ctx| run(&steps, rank, ctx));
        let first_sum = steps.iter().position(|s| matches!(s, Step::Sum(_)));
        for (rank, reads) in got.into_iter().enumerate() {
            let reads =
                reads.unwrap_or_else(|e| panic!("case {case}, rank {rank} of {ranks}: {e}\n{steps:?}"));
            let expected: Vec<f64> =
                std::iter::once(want.len() - 1).chain(first_sum).map(|k| want[k][rank]).collect();
            for (read, want) in reads.iter().zip(&expected) {
                for x in read {
                    assert!(
                        (*x as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "case {case}, rank {rank} of {ranks}: {x} but the reference is {want}\n{steps:?}"
                    );
                }
            }
        }
    }
}
