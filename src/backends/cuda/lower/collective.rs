//! Collectives lower to one NCCL call each, on the step's stream (the
//! stream pass gives collectives a stream of their own): the operand made
//! dense if it is not, the result written dense at the step's location.
//! A constant operand is materialized first (NCCL reads memory).

use super::{Lowering, Storage, Value};
use crate::backends::cuda::program::{CollectiveCall, Launch, Loc};
use crate::ir::Collective;

impl Lowering<'_> {
    /// `what` of `x` into `dst`.
    pub(super) fn collective(&mut self, what: Collective, x: &Value, dst: Loc) -> Result<(), String> {
        let dense = match x.storage {
            Storage::Mem(_) if x.layout.is_contiguous() => x.clone(),
            _ => self.materialize(x)?,
        };
        let Storage::Mem(at) = dense.storage else {
            return Err(format!("{}: a constant operand was not materialized", what.mnemonic()));
        };
        let src = at.plus(dense.layout.offset as u64 * dense.dtype.size() as u64);
        self.launches.push(Launch::Collective(CollectiveCall {
            what,
            dtype: dense.dtype,
            count: dense.layout.shape.numel(),
            src,
            dst,
        }));
        Ok(())
    }
}
