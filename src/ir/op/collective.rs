//! [`Collective`]: the cross-rank ops of [`super::Op::Collective`], apart
//! from `op.rs` because they carry their own shape rules (a reduce-scatter's
//! result is a rank's chunk) and nothing else shares them.

use super::ReduceOp;

/// A collective: the same op on every rank of a process group (see
/// `crate::dist`), each rank contributing its operand. Every rank's plan
/// issues its collectives in the same order; the k-th collective of one
/// rank meets the k-th of every other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// Every rank gets the elementwise sum (`Sum`) or mean (`Mean`) of all
    /// ranks' operands, summed in rank order, so every rank holds the same
    /// bits.
    AllReduce(ReduceOp),
    /// Every rank gets rank `root`'s operand.
    Broadcast(u32),
    /// The elementwise sum (`Sum`) or mean (`Mean`) of all ranks' operands,
    /// as [`Collective::AllReduce`], split along dim 0 into `ranks` equal
    /// chunks: rank `r` gets the `r`-th. `ranks` is the group's size,
    /// recorded in the op because the result's shape depends on it.
    ReduceScatter {
        /// `Sum` or `Mean`.
        op: ReduceOp,
        /// The group's size.
        ranks: u32,
    },
    /// Every rank gets all ranks' operands (equal shapes) concatenated
    /// along dim 0 in rank order; `ranks` is the group's size.
    AllGather {
        /// The group's size.
        ranks: u32,
    },
}

impl Collective {
    /// The text IR mnemonic (`all_reduce_sum`, `broadcast`).
    pub fn mnemonic(self) -> &'static str {
        match self {
            Collective::AllReduce(ReduceOp::Mean) => "all_reduce_mean",
            Collective::AllReduce(ReduceOp::Max) => "all_reduce_max",
            Collective::AllReduce(ReduceOp::Min) => "all_reduce_min",
            Collective::AllReduce(_) => "all_reduce_sum",
            Collective::Broadcast(_) => "broadcast",
            Collective::ReduceScatter { op: ReduceOp::Mean, .. } => "reduce_scatter_mean",
            Collective::ReduceScatter { .. } => "reduce_scatter_sum",
            Collective::AllGather { .. } => "all_gather",
        }
    }

    /// Elements of the result of an operand of `count` elements: a
    /// `ranks`-th for a reduce-scatter, `ranks` times as many for an
    /// all-gather, as many otherwise.
    pub fn result_count(self, count: usize) -> usize {
        match self {
            Collective::ReduceScatter { ranks, .. } => count / (ranks.max(1) as usize),
            Collective::AllGather { ranks } => count.saturating_mul(ranks as usize),
            _ => count,
        }
    }

    /// Where rank `rank`'s result starts in the combined result every
    /// rank shares (the whole reduced tensor for a reduce-scatter), in
    /// elements, for a result of `count` elements.
    pub fn result_offset(self, rank: usize, count: usize) -> usize {
        match self {
            Collective::ReduceScatter { .. } => rank * count,
            _ => 0,
        }
    }
}
