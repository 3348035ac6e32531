//! Launch groups ([`crate::ir::LaunchGroup`]): the members' values are
//! placed as they come, their launches held until the last member, which
//! launches them all as multi-tensor kernels (`codegen::multi`). The
//! events the members record move to the last member's step, after the
//! launch that computes them; their waits stay where they are, on the
//! same stream before it.

use super::ops::{buffer_locs, operand};
use super::{Lowering, Value};
use crate::backends::cuda::codegen::body::Operand;
use crate::backends::cuda::codegen::{elementwise, multi};
use crate::backends::cuda::program::{Launch, Loc};
use crate::ir::{FusedKind, Graph, NodeId, Op};

/// A member whose value is placed but not computed yet.
pub(super) struct Held {
    body: Graph,
    operands: Vec<Operand>,
    in_place: bool,
    args: Vec<Loc>,
}

impl Lowering<'_> {
    /// Places member `id` of a launch group and holds its launch (`None`
    /// for an empty value, which launches nothing).
    pub(super) fn hold_member(&mut self, id: NodeId) -> Result<Option<Held>, String> {
        let node = self.plan.graph.node(id).clone();
        let Op::Fused(body) = &node.op else {
            return Err("a launch group member is not a fused node".into());
        };
        if *body.kind() != FusedKind::Elementwise {
            return Err("a launch group member is not elementwise".into());
        }
        let ops = self.operands(id)?;
        let dst = self.destination(id)?;
        self.values.insert(id, Value::dense(dst, node.shape.clone(), node.dtype));
        let extras = self.place_extras(id, body)?;
        if node.shape.numel() == 0 {
            return Ok(None);
        }
        let mut args = vec![dst];
        args.extend(extras);
        args.extend(buffer_locs(&ops));
        let in_place = self.in_place(id) || self.extras_of(id).iter().flatten().any(|&e| self.in_place(e));
        Ok(Some(Held {
            body: body.graph().clone(),
            operands: ops.iter().map(operand).collect(),
            in_place,
            args,
        }))
    }

    /// The launches of a group's held members: one multi-tensor kernel
    /// per run of members whose pointers fit the parameter space.
    pub(super) fn launch_group(&mut self, held: &[Held]) -> Result<(), String> {
        let pointers: Vec<usize> =
            held.iter().map(|h| multi::pointers(h.body.outputs().len(), &h.operands)).collect();
        for range in multi::chunks(&pointers) {
            let chunk = &held[range];
            let kernel = match chunk {
                [one] => self.add_kernel("fused_elementwise", |n| {
                    elementwise::generate(n, &one.body, &one.operands, one.in_place)
                })?,
                _ => {
                    let members: Vec<multi::Member<'_>> = chunk
                        .iter()
                        .map(|h| multi::Member {
                            g: &h.body,
                            operands: h.operands.clone(),
                            in_place: h.in_place,
                        })
                        .collect();
                    self.add_kernel("multi_tensor", |n| multi::generate(n, &members))?
                }
            };
            let args = chunk.iter().flat_map(|h| h.args.iter().copied()).collect();
            self.launches.push(Launch::Kernel { kernel, args });
        }
        Ok(())
    }
}
