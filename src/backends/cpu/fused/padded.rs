//! A padded output ([`crate::ir::Padded`]) on the CPU: the unpadded body
//! runs into a buffer of its own, then each row is copied into the wider
//! output with the constant columns after it.
//!
//! The copy is what the `cat` the output replaces cost; a CPU training
//! step with a padded LM head is not where this backend's time goes, and
//! one path through every row kernel (interpreted, row-fused, generated)
//! keeps the bits of each. Writing the rows in place would need every
//! row path to take an output row stride.

use super::super::storage::{from_scalar, Elem, Out};
use super::super::CpuBuffer;
use super::FusedKernel;
use crate::ir::Padded;
use crate::{Error, Result};

impl FusedKernel {
    /// [`FusedKernel::run`] of a body whose output 0 is padded.
    pub(super) fn run_padded<T: Elem>(
        &self,
        pad: &Padded,
        args: &[Option<&CpuBuffer>],
        in_place: Option<usize>,
        out: &mut [T],
        extras: Vec<Out<'_>>,
        over: &[Option<usize>],
    ) -> Result<()> {
        let err = |m: String| Error::Backend(format!("cpu: fused {}: {m}", self.node));
        if in_place.is_some() || over.iter().any(Option::is_some) {
            return Err(err("a padded output is never computed in place".into()));
        }
        let rows = self.out_shape.numel() / pad.cols.max(1);
        if out.len() != rows * pad.width {
            return Err(err(format!(
                "the padded output has {} elements, not {} rows of {}",
                out.len(),
                rows,
                pad.width
            )));
        }
        // The unpadded rows' buffer is the kernel's, kept between runs.
        let reuse = self.unpadded.lock().ok().and_then(|mut b| b.take());
        let mut dense = reuse.and_then(T::from_host).unwrap_or_default();
        dense.resize(self.out_shape.numel(), T::default());
        self.run_dense(args, None, &mut dense, extras, &[])?;
        let fills: Vec<T> =
            (pad.cols..pad.width).map(|c| pad.fill_at(c).map_or(T::default(), from_scalar)).collect();
        if pad.cols == 0 {
            for row in out.chunks_exact_mut(pad.width) {
                row.copy_from_slice(&fills);
            }
            return Ok(());
        }
        for (row, value) in out.chunks_exact_mut(pad.width).zip(dense.chunks_exact(pad.cols)) {
            let (head, tail) = row.split_at_mut(pad.cols);
            head.copy_from_slice(value);
            tail.copy_from_slice(&fills);
        }
        if let Ok(mut slot) = self.unpadded.lock() {
            *slot = Some(T::into_host(dense));
        }
        Ok(())
    }
}
