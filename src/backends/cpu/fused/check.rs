//! What a call of a compiled fused kernel must pass: the output's type
//! and size, one operand per input of the body (or `None` for the one
//! computed in place and those extra outputs are written over), and the
//! extra outputs' types and sizes. A call that does not is refused with
//! an error naming the operand, before any element is read.

use super::super::storage::Out;
use super::super::CpuBuffer;
use super::{Class, FusedKernel};
use crate::ir::DType;
use crate::{Error, Result};

impl FusedKernel {
    /// Checks a call of [`FusedKernel::run`] (see the module docs): the
    /// output is `len` elements of `dtype`; operand `in_place` is read
    /// from the output, and extra output `e + 1` is written over operand
    /// `over[e]` where that is `Some`.
    pub(super) fn check_call(
        &self,
        (dtype, len): (DType, usize),
        args: &[Option<&CpuBuffer>],
        in_place: Option<usize>,
        extras: &[Out<'_>],
        over: &[Option<usize>],
    ) -> Result<()> {
        let err = |m: String| Error::Backend(format!("cpu: fused {}: {m}", self.node));
        if dtype != self.out_dtype || len != self.out_shape.numel() {
            return Err(err(format!(
                "the output is {}{} but {len} {dtype} elements were given",
                self.out_dtype, self.out_shape
            )));
        }
        if args.len() != self.inputs.len() {
            return Err(err(format!(
                "{} operand(s) given, the body reads {}",
                args.len(),
                self.inputs.len()
            )));
        }
        if over.len() > self.extras.len() {
            return Err(err(format!(
                "{} extra output(s) written over operands, the body has {}",
                over.len(),
                self.extras.len()
            )));
        }
        for (e, k) in over.iter().enumerate() {
            match k {
                Some(k) if in_place == Some(*k) || over[..e].contains(&Some(*k)) => {
                    return Err(err(format!("two outputs are written over operand {k}")))
                }
                Some(k) if !self.can_write_extra_over(e + 1, *k) => {
                    return Err(err(format!("output {} cannot be written over operand {k} (it is not read elementwise at that output's type)", e + 1)))
                }
                Some(k) if args.get(*k).is_none_or(|a| a.is_some()) => {
                    return Err(err(format!("output {} is written over operand {k}; pass None for it", e + 1)))
                }
                _ => {}
            }
        }
        for (k, (a, (s, d))) in args.iter().zip(&self.inputs).enumerate() {
            if over.contains(&Some(k)) {
                continue;
            }
            match (a, in_place == Some(k)) {
                (None, true) if !self.can_run_in_place(k) => {
                    return Err(err(format!("operand {k} cannot be computed in place (it is not read elementwise at the output's type)")))
                }
                (None, true) => {}
                (Some(_), true) => return Err(err(format!("operand {k} is computed in place; pass None for it"))),
                (None, false) => return Err(err(format!("operand {k} is missing"))),
                (Some(b), false) if b.shape() != s || b.dtype() != *d => {
                    return Err(err(format!("operand {k} is {}{} but the body reads {d}{s}", b.dtype(), b.shape())))
                }
                (Some(_), false) => {}
            }
        }
        if in_place.is_some_and(|k| k >= args.len()) {
            return Err(err("the in-place operand is out of range".into()));
        }
        if extras.len() != self.extras.len() {
            return Err(err(format!(
                "{} extra output(s) given, the body has {}",
                extras.len(),
                self.extras.len()
            )));
        }
        let elements = |class: Class| if class == Class::Full { self.rows * self.cols } else { self.rows };
        for (j, (e, &(_, d, class))) in extras.iter().zip(&self.extras).enumerate() {
            if e.dtype() != d || e.len() != elements(class) {
                return Err(err(format!(
                    "extra output {} is {d}, {} elements, but {} {} were given",
                    j + 1,
                    elements(class),
                    e.len(),
                    e.dtype()
                )));
            }
        }
        Ok(())
    }
}
