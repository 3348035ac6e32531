//! The GEMM of a fused matmul body, one block of output rows at a time.
//!
//! The fused kernel multiplies one block of rows into a task-local buffer
//! and runs the epilogue on it right away, while the block is in cache;
//! the unfused matmul would write the whole product to memory and the
//! epilogue would read it back. `f32` and `f64` call `matrixmultiply`
//! (through [`GemmFloat`]) with the operands' own strides, so a transposed
//! weight needs no copy. Other dtypes run the unfused matmul kernel once
//! (widening `f16`/`bf16` to `f32` exactly as it does) and the epilogue
//! reads its result. The batched problem (bases, sizes, strides) is the
//! unfused kernel's [`Problem`]; this file adds the checks and the
//! row-block loop.
//!
//! Each output element is a dot product over `k` that `matrixmultiply`
//! computes the same way whatever block of rows it belongs to, so the
//! block size changes no result.

use super::super::layout::Layout;
use super::super::matmul::GemmFloat;
pub(crate) use super::super::matmul::Problem;
use crate::{Error, Result};

impl Problem {
    /// The problem of two layouts, after checking that their shapes
    /// multiply and their extents fit their storages (`a_len`, `b_len`
    /// elements): what makes the raw-pointer reads in [`Problem::rows`] safe.
    pub(crate) fn checked(a: &Layout, a_len: usize, b: &Layout, b_len: usize) -> Result<Problem> {
        let r = a.shape.rank();
        let ok = r >= 2
            && b.shape.rank() == r
            && a.shape.0[..r - 2] == b.shape.0[..r - 2]
            && a.shape.0[r - 1] == b.shape.0[r - 2]
            && a.extent() <= a_len
            && b.extent() <= b_len;
        if !ok {
            return Err(Error::Backend(format!("cpu: fused matmul of {} and {}", a.shape, b.shape)));
        }
        Problem::new(a, b)
    }

    /// Rows `r0 .. r0 + rows` of the product (rows counted across the
    /// batch, `batch * m` in all), row-major into `dst` (`rows * n`
    /// elements). Single-threaded: the caller runs blocks in parallel.
    pub(crate) fn rows<T: GemmFloat>(
        &self,
        a: &[T],
        b: &[T],
        r0: usize,
        rows: usize,
        dst: &mut [T],
    ) -> Result<()> {
        let (m, k, n) = (self.m, self.k, self.n);
        let total = self.a_base.len() * m;
        if dst.len() != rows * n || r0 + rows > total {
            return Err(Error::Backend("cpu: fused matmul block out of range".into()));
        }
        if rows == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            dst.fill(T::default());
            return Ok(());
        }
        // A stride of a dimension of size 1 is never multiplied by a
        // non-zero index; pin it to 0 so the `isize` casts cannot wrap.
        let st = |d: usize, s: usize| if d == 1 { 0 } else { s as isize };
        let mut r = r0;
        while r < r0 + rows {
            let (bi, i) = (r / m, r % m);
            let mr = (m - i).min(r0 + rows - r);
            let c = &mut dst[(r - r0) * n..(r - r0 + mr) * n];
            // SAFETY: `Problem::new` checked both layouts' extents against
            // their storages (the caller passes those storages), so every
            // element `base + i*rs + j*cs` of batch item `bi` with
            // i < m, j < k (A) or i < k, j < n (B) is inside its slice;
            // here A's rows are i..i+mr < m and k, n > 0, so the pointer
            // offsets stay in bounds and every read is one of those
            // elements. Strides may be 0 (expanded operands): matrixmultiply
            // only reads A and B. C is `c`, a dense mr x n block (row
            // stride n, column stride 1) of `dst`, which is `&mut` and so
            // disjoint from A and B.
            unsafe {
                T::gemm(
                    mr,
                    k,
                    n,
                    a.as_ptr().add(self.a_base[bi] + i * self.a_rs),
                    st(mr, self.a_rs),
                    st(k, self.a_cs),
                    b.as_ptr().add(self.b_base[bi]),
                    st(k, self.b_rs),
                    st(n, self.b_cs),
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                )
            }
            r += mr;
        }
        Ok(())
    }
}
