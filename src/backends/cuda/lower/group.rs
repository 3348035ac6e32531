//! Launch groups ([`crate::ir::LaunchGroup`]): the members' values are
//! placed as they come, their launches held until the last member, which
//! launches them all as multi-tensor kernels (`codegen::multi` for
//! elementwise members, `codegen::columns` for column reductions). The
//! events the members record move to the last member's step, after the
//! launch that computes them; their waits stay where they are, on the
//! same stream before it. A column reduction the group kernel does not
//! take (`columns::Member::joins_group`) launches its own kernel in its
//! own step, which the memory plan allows (it planned every member as
//! running anywhere between the group's first and last step).

use super::ops::{buffer_locs, operand};
use super::{Lowering, Value};
use crate::backends::cuda::codegen::body::Operand;
use crate::backends::cuda::codegen::{columns, elementwise, multi};
use crate::backends::cuda::program::{Launch, Loc};
use crate::ir::{FusedKind, Graph, NodeId, Op};

/// A member whose value is placed but not computed yet.
pub(super) enum Held {
    Elementwise(Box<HeldBody>),
    /// A column reduction and its `out, in0`.
    Column(columns::Member, [Loc; 2]),
}

/// An elementwise member.
pub(super) struct HeldBody {
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
        let body = match &node.op {
            Op::Fused(body) if *body.kind() == FusedKind::Elementwise => body,
            Op::Reduce { op, dims, .. } => {
                let ops = self.operands(id)?;
                let x = &ops[0];
                let rows: usize = x.layout.shape.0[..dims.len()].iter().product();
                let cols: usize = x.layout.shape.0[dims.len()..].iter().product();
                let member = columns::Member { x: operand(x), op: *op, rows, cols, out_dtype: node.dtype };
                if node.shape.numel() == 0 || !member.joins_group() {
                    self.lower_node(id)?;
                    return Ok(None);
                }
                let dst = self.destination(id)?;
                self.values.insert(id, Value::dense(dst, node.shape.clone(), node.dtype));
                let [x_loc] = buffer_locs(&ops)[..] else {
                    return Err("a column reduction's operand is not one buffer".into());
                };
                return Ok(Some(Held::Column(member, [dst, x_loc])));
            }
            _ => return Err("a launch group member is neither elementwise nor a column reduction".into()),
        };
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
        Ok(Some(Held::Elementwise(Box::new(HeldBody {
            body: body.graph().clone(),
            operands: ops.iter().map(operand).collect(),
            in_place,
            args,
        }))))
    }

    /// The launches of a group's held members: multi-tensor kernels, each
    /// over a run of members whose pointers fit the parameter space.
    pub(super) fn launch_group(&mut self, held: &[Held]) -> Result<(), String> {
        let bodies: Vec<&HeldBody> = held
            .iter()
            .filter_map(|h| if let Held::Elementwise(b) = h { Some(&**b) } else { None })
            .collect();
        let sums: Vec<(&columns::Member, &[Loc; 2])> = held
            .iter()
            .filter_map(|h| if let Held::Column(m, l) = h { Some((m, l)) } else { None })
            .collect();
        self.launch_bodies(&bodies)?;
        self.launch_columns(&sums)
    }

    fn launch_bodies(&mut self, held: &[&HeldBody]) -> Result<(), String> {
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

    /// Column reductions: `out, ws, counts, in0` a member, each with a
    /// workspace and counters of its own, as its own kernel would have.
    fn launch_columns(&mut self, held: &[(&columns::Member, &[Loc; 2])]) -> Result<(), String> {
        for range in multi::chunks(&vec![4; held.len()]) {
            let chunk = &held[range];
            let mut args = Vec::new();
            for (m, [out, x]) in chunk {
                args.push(*out);
                let tiling = m.tiling();
                args.push(self.transient(tiling.workspace_bytes()));
                args.push(self.new_counters(tiling.counters()));
                args.push(*x);
            }
            let kernel = match chunk {
                [(m, _)] => self.add_kernel("reduce_columns", |n| {
                    Ok(columns::generate(n, &m.x, m.op, m.rows, m.cols, m.out_dtype))
                })?,
                _ => {
                    let members: Vec<&columns::Member> = chunk.iter().map(|(m, _)| *m).collect();
                    self.add_kernel("reduce_columns_group", |n| Ok(columns::generate_group(n, &members)))?
                }
            };
            self.launches.push(Launch::Kernel { kernel, args });
        }
        Ok(())
    }
}
