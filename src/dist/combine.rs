//! What a collective computes from the ranks' operands, on the host (the
//! CPU transport, in one process or on a group's coordinator): the parts
//! combined in rank order, so every rank gets the same bits wherever it
//! runs.
//!
//! The result is what every rank shares: a reduce-scatter's is the whole
//! reduced tensor (each rank copies out its chunk, at
//! [`Collective::result_offset`]), an all-gather's the parts end to end.
//! The reduce-scatter's chunks are therefore the all-reduce's bits, which
//! is what lets a sharded optimizer match data parallelism exactly on the
//! CPU.

use crate::ir::{Collective, HostData, ReduceOp};
use crate::{Error, Result};

/// Every rank's result: the parts combined in rank order (so every rank
/// gets the same bits), or the root's part.
pub(crate) fn combine(what: Collective, mut parts: Vec<HostData>) -> Result<HostData> {
    let n = parts.len();
    let op = match what {
        Collective::Broadcast(root) => {
            let root = root as usize;
            if root >= n {
                return Err(Error::Runtime(format!("broadcast from rank {root} in a group of {n}")));
            }
            return Ok(parts.swap_remove(root));
        }
        Collective::AllReduce(op) | Collective::ReduceScatter { op, .. } => op,
        Collective::AllGather { .. } => return gather(parts),
    };
    // Floats accumulate in f64 and round once (for two ranks that is the
    // correctly rounded sum NCCL's ring computes); integers wrap.
    macro_rules! fold {
        ($variant:ident, $first:expr, $to:expr, $from:expr) => {{
            let mut acc: Vec<_> = $first.iter().map(|&x| $to(x)).collect();
            for p in &parts[1..] {
                let HostData::$variant(v) = p else {
                    return Err(Error::Backend("dist: ranks handed in different dtypes".into()));
                };
                for (a, &x) in acc.iter_mut().zip(v) {
                    *a = step(op, *a, $to(x));
                }
            }
            HostData::$variant(acc.into_iter().map(|a| $from(finish(op, a, n))).collect())
        }};
    }
    let first = parts.first().ok_or_else(|| Error::Backend("dist: a collective of no ranks".into()))?;
    Ok(match first {
        HostData::F16(v) => {
            fold!(F16, v, |x: half::f16| Acc::F(x.to_f64()), |a: Acc| half::f16::from_f64(a.f()))
        }
        HostData::BF16(v) => {
            fold!(BF16, v, |x: half::bf16| Acc::F(x.to_f64()), |a: Acc| half::bf16::from_f64(a.f()))
        }
        HostData::F32(v) => fold!(F32, v, |x: f32| Acc::F(x as f64), |a: Acc| a.f() as f32),
        HostData::F64(v) => fold!(F64, v, |x: f64| Acc::F(x), |a: Acc| a.f()),
        HostData::U8(v) => fold!(U8, v, |x: u8| Acc::I(x as i64), |a: Acc| a.i() as u8),
        HostData::I32(v) => fold!(I32, v, |x: i32| Acc::I(x as i64), |a: Acc| a.i() as i32),
        HostData::I64(v) => fold!(I64, v, |x: i64| Acc::I(x), |a: Acc| a.i()),
        HostData::Bool(_) => return Err(Error::Runtime(format!("{} of bool", what.mnemonic()))),
    })
}

/// The parts end to end, in rank order.
fn gather(parts: Vec<HostData>) -> Result<HostData> {
    let mut parts = parts.into_iter();
    let mut out = parts.next().ok_or_else(|| Error::Backend("dist: a collective of no ranks".into()))?;
    macro_rules! append {
        ($($variant:ident)*) => {
            for p in parts {
                match (&mut out, p) {
                    $((HostData::$variant(acc), HostData::$variant(v)) => acc.extend(v),)*
                    _ => return Err(Error::Backend("dist: ranks handed in different dtypes".into())),
                }
            }
        };
    }
    append!(F16 BF16 F32 F64 U8 I32 I64 Bool);
    Ok(out)
}

/// An accumulator: floats in f64, integers in wrapping i64.
#[derive(Clone, Copy)]
enum Acc {
    F(f64),
    I(i64),
}

impl Acc {
    fn f(self) -> f64 {
        match self {
            Acc::F(v) => v,
            Acc::I(v) => v as f64,
        }
    }
    fn i(self) -> i64 {
        match self {
            Acc::I(v) => v,
            Acc::F(v) => v as i64,
        }
    }
}

fn step(op: ReduceOp, a: Acc, x: Acc) -> Acc {
    match (a, x) {
        (Acc::F(a), Acc::F(x)) => Acc::F(match op {
            ReduceOp::Max if a.is_nan() || x.is_nan() => f64::NAN,
            ReduceOp::Min if a.is_nan() || x.is_nan() => f64::NAN,
            ReduceOp::Max => a.max(x),
            ReduceOp::Min => a.min(x),
            _ => a + x,
        }),
        (a, x) => Acc::I(match op {
            ReduceOp::Max => a.i().max(x.i()),
            ReduceOp::Min => a.i().min(x.i()),
            _ => a.i().wrapping_add(x.i()),
        }),
    }
}

fn finish(op: ReduceOp, a: Acc, n: usize) -> Acc {
    match (op, a) {
        (ReduceOp::Mean, Acc::F(v)) => Acc::F(v / n as f64),
        _ => a,
    }
}
